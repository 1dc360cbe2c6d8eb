"""The report of scripts/bench-cost, from its results in DIR (cg, tput, lat, top): prints the
tables, the targets of issue 9 and where the instructions go; with WRITE=1, writes
bench/cost.svg and the cost section of BENCHMARKS.md (scripts/bench-lib/section.py).

    cost_report.py DIR WRITE DATE COMMIT REQUESTS WARMUP ROUNDS DURATION CONNECTIONS LAT_ROUNDS LAT_DURATION RATE
"""

import collections, html, statistics, sys

from section import write_section

d, write, date, commit = sys.argv[1], sys.argv[2] == "1", sys.argv[3], sys.argv[4]
requests, warmup, rounds, duration, conns, lat_rounds, lat_duration, rate = (int(a) for a in sys.argv[5:13])
KEYS = ["pass", "none", "rules", "nginx"]
LABEL = {"pass": "Pingora passthrough (`examples/passthrough.rs`)", "none": "tollgate, no rules",
         "rules": "tollgate, 3 rules, 25 tenants", "nginx": "nginx `proxy_pass` + `limit_req`"}
SHORT = {"pass": "passthrough", "none": "tollgate, no rules", "rules": "tollgate, 3 rules", "nginx": "nginx limit_req",
         "noid": "tollgate, no rules, no request ids",
         "quiet": "tollgate, 3 rules, quota headers off", "consts": "tollgate, no rules, five constant headers", "trace0": "tollgate, 3 rules, traces at sample 0", "trace1": "tollgate, 3 rules, traces at sample 1"}
def kv(line):
    return {a: b for a, b in (w.split("=", 1) for w in line.split()[1:] if "=" in w)}
cg, tp, lat = collections.defaultdict(list), collections.defaultdict(list), collections.defaultdict(list)
for line in open(d + "/cg"): cg[line.split()[0]].append(kv(line))
for line in open(d + "/tput"): tp[line.split()[0]].append(kv(line))
for line in open(d + "/lat"): lat[line.split()[0]].append(kv(line))
ipr = {k: [int(r["worker"]) / requests for r in v] for k, v in cg.items()}
ipr_all = {k: [int(r["all"]) / requests for r in v] for k, v in cg.items()}
spread = {k: (max(v) - min(v)) / min(v) for k, v in ipr.items()}
I = {k: statistics.mean(v) for k, v in ipr.items()}
IA = {k: statistics.mean(v) for k, v in ipr_all.items()}
rps = {k: statistics.median(float(r["rps"]) for r in v) for k, v in tp.items()}
cpu = {k: statistics.median(int(r["cpu_us"]) / (float(r["rps"]) * duration) for r in v) for k, v in tp.items()}
bad = sum(int(r["errors"]) + int(r["non2xx"]) for v in list(tp.values()) + list(lat.values()) for r in v)
L = {k: {p: statistics.mean(float(r[p]) for r in v) for p in ("p50_us", "p99_us", "p999_us", "rps")} for k, v in lat.items()}
def k_(x): return "%.1fK" % (x / 1000)
out = []
out.append("| proxy (one worker thread) | req/s, median of %d | ratio | CPU us/request | instructions/request (worker thread) | ratio | whole process |" % rounds)
out.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
for k in KEYS:
    ins = "%s (runs: %s)" % (k_(I[k]), ", ".join(k_(x) for x in ipr[k])) if len(ipr[k]) > 1 else k_(I[k])
    out.append("| %s | %.0f | %.3f | %.1f | %s | %.3f | %s |" % (LABEL[k], rps[k], rps[k] / rps["pass"], cpu[k], ins, I[k] / I["pass"], k_(IA[k])))
if "trace0" in I and "trace1" in I:
    out.append("")
    out.append("OpenTelemetry traces (`tracing:`), the 3 rules, under callgrind only:")
    out.append("")
    out.append("| `sample` | instructions/request (worker thread) | ratio to the 3 rules without traces | whole process (the exporter's thread included) |")
    out.append("| --- | ---: | ---: | ---: |")
    for k, s in (("trace0", "0"), ("trace1", "1")):
        out.append("| %s | %s | %.3f | %s |" % (s, k_(I[k]), I[k] / I["rules"], k_(IA[k])))
if "noid" in I:
    out.append("")
    out.append("Request ids (`x-request-id`, on by default), no rules, under callgrind only: with")
    out.append("`server.request_id: false` %s (runs: %s), %.3f of the figure with them, %.3f of the passthrough." % (
        k_(I["noid"]), ", ".join(k_(x) for x in ipr["noid"]), I["noid"] / I["none"], I["noid"] / I["pass"]))
if "quiet" in I and "consts" in I:
    out.append("")
    out.append("The rules' cost over no rules in two halves (issue 44), under callgrind only:")
    out.append("")
    out.append("| tollgate | instructions/request (worker thread) | over no rules | ratio to no rules |")
    out.append("| --- | ---: | ---: | ---: |")
    for k, what in (("rules", "3 rules, quota headers on (the default)"),
                    ("quiet", "3 rules, quota headers off (`headers: { x_ratelimit: false, ietf: false }`): the rules alone"),
                    ("consts", "no rules, the route setting five constant headers of the same names and values as the quota headers of an answer of the 3 rules (`response_headers`, made once at load): those headers alone, through the route's rewrites")):
        out.append("| %s | %s (runs: %s) | %+.1fK | %.3f |" % (what, k_(I[k]), ", ".join(k_(x) for x in ipr[k]), (I[k] - I["none"]) / 1000, I[k] / I["none"]))
table = "\n".join(out)
targets = [
    ("tollgate with the 3 rules <= 1.05x passthrough instructions", I["rules"] / I["pass"], I["rules"] / I["pass"] <= 1.05),
    ("tollgate without rules <= 1.02x passthrough instructions", I["none"] / I["pass"], I["none"] / I["pass"] <= 1.02),
    ("tollgate (3 rules) throughput >= 0.95 of passthrough", rps["rules"] / rps["pass"], rps["rules"] / rps["pass"] >= 0.95),
    ("tollgate (no rules) throughput >= 0.95 of passthrough", rps["none"] / rps["pass"], rps["none"] / rps["pass"] >= 0.95),
]
targets44 = [("tollgate with the 3 rules <= 1.03x tollgate without rules, instructions", I["rules"] / I["none"], I["rules"] / I["none"] <= 1.03)]
if "consts" in I:
    targets44.append(("five constant headers <= 1.03x tollgate without rules, instructions", I["consts"] / I["none"], I["consts"] / I["none"] <= 1.03))
lt = ["| proxy | offered req/s | achieved req/s | p50 | p99 | p99.9 |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
for k in ("pass", "rules"):
    lt.append("| %s | %d | %.0f | %.0f us | %.0f us | %.0f us |" % (LABEL[k], rate, L[k]["rps"], L[k]["p50_us"], L[k]["p99_us"], L[k]["p999_us"]))
lt.append("| difference (tollgate - passthrough) | | | %+.0f us | %+.0f us | %+.0f us |" % tuple(L["rules"][p] - L["pass"][p] for p in ("p50_us", "p99_us", "p999_us")))
top = [l.rstrip("\n").split("\t") for l in open(d + "/top")]

print("\n" + table + "\n")
for name, v, ok in targets + targets44: print("%s %s: %.3f" % ("PASS" if ok else "FAIL", name, v))
for k, s in spread.items():
    print("%s repeatability (%s): runs differ by %.2f%%" % ("PASS" if s <= 0.01 else "FAIL", SHORT[k], 100 * s))
print("\n" + "\n".join(lt))
print("\ntop 10 functions by self instructions per request, tollgate with 3 rules (worker thread):")
for kind, v, f in top:
    if kind == "self": print("%8s  %s" % (v, f[:140]))
print("tollgate's own functions, inclusive instructions per request:")
for kind, v, f in top:
    if kind == "incl": print("%8s  %s" % (v, f[:140]))
print("largest increases of self instructions per request, tollgate with 3 rules vs passthrough:")
for kind, v, f in top:
    if kind == "diff": print("%8s  %s" % (v, f[:140]))
if bad: print("WARNING: %d errors or non-2xx answers under wrk" % bad)
if not write: sys.exit(0)

# bench/cost.svg: two bar charts side by side.
W, H, PW = 900, 280, 430
svg = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">' % (W, H, W, H),
       '<rect width="100%" height="100%" fill="white"/>']
COL = {"pass": "#7f7f7f", "none": "#4e79a7", "rules": "#f28e2b", "nginx": "#59a14f"}
def chart(x0, title, vals, fmt):
    svg.append('<text x="%d" y="20" font-size="14" font-weight="bold">%s</text>' % (x0, html.escape(title)))
    top_v = max(vals.values()) * 1.15
    lx, bw = x0 + 130, PW - 130 - 110
    for i, k in enumerate(vals):
        y = 40 + i * 48
        w = bw * vals[k] / top_v
        svg.append('<text x="%d" y="%d" text-anchor="end">%s</text>' % (lx - 6, y + 20, html.escape(SHORT[k])))
        svg.append('<rect x="%d" y="%d" width="%.1f" height="30" fill="%s"/>' % (lx, y + 4, w, COL[k]))
        svg.append('<text x="%.1f" y="%d">%s</text>' % (lx + w + 4, y + 24, fmt(k, vals[k])))
    svg.append('<line x1="%d" y1="38" x2="%d" y2="%d" stroke="black"/>' % (lx, lx, 40 + len(vals) * 48))
chart(10, "requests/s, one worker (median of %d x %d s)" % (rounds, duration), {k: rps[k] for k in KEYS},
      lambda k, v: "%.0f (%.2f)" % (v, v / rps["pass"]))
chart(10 + PW + 40, "instructions per request (callgrind)", {k: I[k] for k in KEYS},
      lambda k, v: "%s (%.2f)" % (k_(v), v / I["pass"]))
svg.append('<text x="10" y="%d" fill="#555">%s, %s: ratios to the Pingora passthrough in brackets</text>' % (H - 12, date, html.escape(commit)))
svg.append("</svg>")
open("bench/cost.svg", "w").write("\n".join(svg) + "\n")

sec = """<!-- cost:begin -->
## Cost per request against a bare Pingora passthrough

Written by `scripts/bench-cost` on %(date)s; `git describe --always --dirty`: %(commit)s.

One nginx worker serves a static 200 (`ok`, 3 bytes) as the upstream. Four proxies, each with
one worker thread, in front of it: the bare Pingora 0.9 passthrough of
`examples/passthrough.rs` (only `upstream_peer`, same features and release profile), tollgate
with no rules, tollgate with 3 rules that every request matches and that never deny
(`get-product`: GET `/v1/organizations/*/product/*`, tiers 1 s and 60 s; `org-wide`:
`/v1/organizations/**`, 10 s; `everyone`: `/**`, `per: global`, 10 s), and nginx with
`proxy_pass` and `limit_req` keyed by `$http_x_org_id` (a rate that never denies). Requests go to
`/v1/organizations/<tenant>/product/42` with `x-org-id` rotating over 25 tenants; tollgate adds
its quota headers (the default).

- **Instructions per request** (deterministic): each proxy under `valgrind --tool=callgrind`,
  one keep-alive connection, one request at a time: %(warmup)d requests of warm-up,
  `callgrind_control -z`, %(requests)d requests, `callgrind_control -d`. The figure is the
  worker thread's user-space instructions divided by %(requests)d (the thread running
  `pingora_proxy`: accept, both HTTP sides, the rate-limit decision); *whole process* adds
  every other thread (pingora's timer thread, tollgate's reload and health-check tickers). Those
  tick by the clock, not per request, and run slow under valgrind, so they would overstate the
  per-request cost at real rates. Each proxy runs twice (fresh processes); the runs must agree
  within 1%%.
- **Throughput**: `wrk -t1 -c%(conns)d`, %(rounds)d rounds of %(duration)d s per proxy in rotated
  order, median; the proxy pinned to one core, wrk and the upstream to the other. *CPU
  us/request* is the proxy's user + system time from `/proc` over the same rounds (median).
- **Latency** at %(rate)d req/s, half the passthrough's median: wrk paced by a Lua schedule
  (one slot per request, 1 ms timer granularity, so requests leave in small bursts), %(lat_rounds)d
  alternating rounds of %(lat_duration)d s, mean of the rounds' percentiles.

%(table)s

Targets of issue 9:

%(targets)s

Target of issue 44 (and what the headers alone cost against it):

%(targets44)s

Latency at a fixed rate:

%(lt)s

Where the instructions go (tollgate with the 3 rules, worker thread, per request), the 10
functions with the most self instructions, tollgate's own functions by inclusive count (callees
included, direct recursion skipped), and the functions whose self count grew most against the
passthrough's first run:

| self instructions/request | function |
| ---: | --- |
%(top_self)s

| inclusive instructions/request | tollgate function |
| ---: | --- |
%(top_incl)s

| self instructions/request, 3 rules minus passthrough | function |
| ---: | --- |
%(top_diff)s

![requests per second and instructions per request, per proxy](bench/cost.svg)
<!-- cost:end -->""" % dict(
    date=date, commit=commit, warmup=warmup, requests=requests, conns=conns, rounds=rounds, duration=duration,
    rate=rate, lat_rounds=lat_rounds, lat_duration=lat_duration, table=table, lt="\n".join(lt),
    targets="\n".join("- %s %s: %.3f" % ("PASS" if ok else "FAIL", n, v) for n, v, ok in targets)
        + "\n- repeatability: " + ", ".join("%s %.2f%%" % (SHORT[k], 100 * s) for k, s in spread.items()),
    targets44="\n".join("- %s %s: %.3f" % ("PASS" if ok else "FAIL", n, v) for n, v, ok in targets44),
    top_self="\n".join("| %s | `%s` |" % (v, f.replace("|", "\\|")[:160]) for kind, v, f in top if kind == "self"),
    top_diff="\n".join("| %s | `%s` |" % (v, f.replace("|", "\\|")[:160]) for kind, v, f in top if kind == "diff"),
    top_incl="\n".join("| %s | `%s` |" % (v, f.replace("|", "\\|")[:160]) for kind, v, f in top if kind == "incl"))
write_section("cost", sec)
print("\nwrote BENCHMARKS.md (cost section) and bench/cost.svg")
