"""The report of scripts/bench-tokens, from its callgrind results (CG: one line per way of naming
the tenant, `KEY worker=… per_request=… secs=…`): prints the table and the verdict; with
WRITE=1, writes the tokens section of BENCHMARKS.md (scripts/bench-lib/section.py).

    tokens_report.py CG WRITE DAY REV REQUESTS WARMUP LOAD
"""

import re, sys

from section import write_section

cg, write, day, rev, requests, warmup, load = sys.argv[1:8]
per = {}
for line in open(cg):
    k = line.split()[0]
    per[k] = int(re.search(r"per_request=(\d+)", line).group(1))
base = per["key"]
label = {
    "key": "API key (stored as it is)",
    "digest": "API key stored as its SHA-256 digest",
    "rs256-cached": "RS256 token (2048-bit key), cached",
    "rs256-uncached": "RS256 token, a new one each request",
    "es256-cached": "ES256 token (P-256), cached",
    "es256-uncached": "ES256 token, a new one each request",
}
rows = ["| tenant from | instructions/request | vs the API key |", "| --- | ---: | ---: |"]
for k in ("key", "digest", "rs256-cached", "es256-cached", "rs256-uncached", "es256-uncached"):
    rows.append("| %s | %.1fK | %.3fx |" % (label[k], per[k] / 1000, per[k] / base))
worst = max(per["rs256-cached"], per["es256-cached"]) / base
verdict = "%s a cached token <= 1.05x the API key: %.3f" % ("PASS" if worst <= 1.05 else "FAIL", worst)
table = "\n".join(rows)
print("\n" + table + "\n\n" + verdict)
if write != "1":
    sys.exit(0)
section = """<!-- tokens:begin -->
## Tenants from tokens (issue 40)

`scripts/bench-tokens` (part of `make bench`), %(day)s, %(rev)s, load before the run %(load)s.
The gateway (one worker thread, one route, no rules) under `valgrind --tool=callgrind`, a
sequential client on one keep-alive connection: %(warmup)s requests of warm-up, then %(requests)s
counted, each naming the tenant in one of these ways. The tokens are minted by PyJWT
(tests/jwt/mint.py); a cached one is the same token every request (verified once, then found by
a hash of the token), an uncached one a token never seen before (its signature checked).

%(table)s

%(verdict)s.
<!-- tokens:end -->""" % dict(day=day, rev=rev, load=load, warmup=warmup, requests=requests,
                              table=table, verdict=verdict)
write_section("tokens", section)
print("\nwrote BENCHMARKS.md (tokens section)")
