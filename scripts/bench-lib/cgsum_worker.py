"""Sums the callgrind dump of one run (scripts/bench-tokens; run with --separate-threads=yes, so
one file PREFIX.1-NN per thread): the instructions of the threads that ran pingora_proxy code,
whose files it appends to PREFIX.worker.

    cgsum_worker.py PREFIX    prints the sum
"""

import glob, sys
prefix = sys.argv[1]
worker = 0
for f in sorted(glob.glob(prefix + ".1-*")):
    text = open(f, errors="replace").read()
    if "pingora_proxy::" in text:
        worker += next(int(l.split()[1]) for l in text.splitlines() if l.startswith("summary:"))
        open(prefix + ".worker", "a").write(f + "\n")
print(worker)
