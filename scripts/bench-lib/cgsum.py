"""Sums the callgrind dump of one run (scripts/bench-cost, scripts/bench-grpc; run with
--separate-threads=yes, so one file PREFIX.1-NN per thread): all threads, and the threads that
ran pingora_proxy code (KEY nginx: all threads), whose files it appends to PREFIX.worker.

    cgsum.py PREFIX KEY       prints "all=A worker=W worker_threads=T" (instructions)
"""

import glob, sys
prefix, key = sys.argv[1], sys.argv[2]
total = worker = nthreads = 0
for f in sorted(glob.glob(prefix + ".1-*")):
    text = open(f, errors="replace").read()
    ir = next(int(l.split()[1]) for l in text.splitlines() if l.startswith("summary:"))
    total += ir
    if key == "nginx" or "pingora_proxy::" in text:
        worker += ir; nthreads += 1
        open(prefix + ".worker", "a").write(f + "\n")
print("all=%d worker=%d worker_threads=%d" % (total, worker, nthreads))
