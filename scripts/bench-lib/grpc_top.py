r"""Where the rules' instructions go (scripts/bench-grpc), per call, from the worker thread's
callgrind dumps of tollgate with the 3 rules (RULES), without rules (NONE), with the rules and
the quota headers off (QUIET) and with the IETF ones only (IETF), N calls each. Prints
tab-separated lines: `diff\tINSTRUCTIONS\tFUNCTION`, the 10 functions whose self count grew most
from no rules to the rules; `incl\tNONE\tRULES\tIETF\tQUIET\tFUNCTION`, the inclusive counts of
the HPACK encoder, the admission and the quota headers.

    grpc_top.py RULES NONE QUIET IETF N
"""
import sys

from callgrind import load

(rules, rules_i), (none, none_i), (quiet, quiet_i), (ietf, ietf_i) = (load(a) for a in sys.argv[1:5])
n = int(sys.argv[5])
diff = {f: rules[f] - none[f] for f in set(rules) | set(none)}
for f, v in sorted(diff.items(), key=lambda kv: -kv[1])[:10]: print("diff\t%+.0f\t%s" % (v / n, f))
for f in ("h2::hpack::encoder::Encoder::encode", "tollgate::request::admission::admit",
          "tollgate::limits::headers::apply"):
    print("incl\t%s\t%s" % ("\t".join("%.0f" % ((c[f] + i[f]) / n) for c, i in
        ((none, none_i), (rules, rules_i), (ietf, ietf_i), (quiet, quiet_i))), f))
