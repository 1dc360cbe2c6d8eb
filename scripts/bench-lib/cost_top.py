r"""Where the instructions go (scripts/bench-cost), per request, from the worker thread's
callgrind dump of tollgate with the 3 rules (RULES) and of the passthrough (PASS), N requests
each. Prints tab-separated lines `KIND\tINSTRUCTIONS\tFUNCTION`: KIND `self`, the 10 functions
with the most self instructions; `diff`, the 10 whose self count grew most against the
passthrough; `incl`, tollgate's own 10 with the most inclusive instructions.

    cost_top.py RULES PASS N
"""
import sys

from callgrind import load

selfc, inclc = load(sys.argv[1])
base, _ = load(sys.argv[2])
n = int(sys.argv[3])
for f, v in selfc.most_common(10): print("self\t%.0f\t%s" % (v / n, f))
diff = {f: selfc[f] - base[f] for f in set(selfc) | set(base)}
for f, v in sorted(diff.items(), key=lambda kv: -kv[1])[:10]: print("diff\t%+.0f\t%s" % (v / n, f))
# inclusive: self + calls to other functions (direct recursion skipped), tollgate's own code
ours = [(selfc[f] + inclc[f], f) for f in set(selfc) | set(inclc) if f.startswith(("tollgate::", "<tollgate::"))]
for v, f in sorted(ours, reverse=True)[:10]: print("incl\t%.0f\t%s" % (v / n, f))
