"""The report of scripts/bench-edge, from its h2load results (RESULTS: one line per round, `KEY
round=R rps=… succeeded=… 2xx=… mean=…`): prints the edge section; with WRITE=1, writes it to
BENCHMARKS.md (scripts/bench-lib/section.py).

    edge_report.py RESULTS WRITE DAY REV REQUESTS CLIENTS STREAMS ROUNDS
"""

import statistics, sys

from section import write_section

path, write, day, rev, n, c, m, rounds = sys.argv[1:]
rows = {}
for line in open(path):
    f = dict(kv.split("=", 1) for kv in line.split()[1:])
    rows.setdefault(line.split()[0], []).append(f)
def med(k, field):
    return statistics.median(float(x[field]) for x in rows[k])
t, g = med("tollgate", "rps"), med("nginx", "rps")
table = [
    "| proxy (one worker) | req/s, median | rounds | 2xx of each round | mean time per request |",
    "| --- | ---: | --- | --- | --- |",
]
for k, label in (("tollgate", "tollgate, TLS + HTTP/2, the 3 rules"), ("nginx", "nginx `ssl http2`, `proxy_pass` + `limit_req`")):
    table.append("| %s | %.0f | %s | %s | %s |" % (label, med(k, "rps"),
        ", ".join("%.0f" % float(x["rps"]) for x in rows[k]),
        ", ".join(x["2xx"] for x in rows[k]), ", ".join(x["mean"] for x in rows[k])))
sec = f"""<!-- edge:begin -->
## HTTP/2 over TLS: tollgate next to nginx

Written by `scripts/bench-edge` on {day}, commit {rev}.

The same self-signed P-256 certificate and the same nginx static upstream for both; each proxy
has one worker and is pinned to its own core, h2load and the upstream to the other.
`h2load -n {n} -c {c} -m {m} -t 1` over TLS with ALPN h2, `x-org-id` set, a path every rule of
tollgate matches (no rule denies), {rounds} alternating rounds.

""" + "\n".join(table) + f"""

tollgate reaches {t / g:.2f} of nginx's requests per second over HTTP/2.
<!-- edge:end -->"""
print(sec)
if write == "1":
    write_section("edge", sec)
    print("\nwrote BENCHMARKS.md (edge section)")
