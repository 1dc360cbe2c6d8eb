"""The report of scripts/bench-grpc, from its results in DIR (cg, tput, conns, top): prints the
table, the target of issue 39 and where the rules' instructions go, and fails when a call of the
rounds did not reach the server; with WRITE=1, writes the grpc section of BENCHMARKS.md
(scripts/bench-lib/section.py).

    grpc_report.py DIR WRITE DATE COMMIT REQUESTS CLIENTS STREAMS ROUNDS CG_REQUESTS CG_WARMUP WARMUP NGINX_VERSION NCPU LOAD_START LOAD_END
"""

import collections, statistics, sys

from section import write_section

d, write, date, commit = sys.argv[1], sys.argv[2] == "1", sys.argv[3], sys.argv[4]
requests, clients, streams, rounds, cg_requests, cg_warmup, warmup = (int(a) for a in sys.argv[5:12])
ngv, ncpu, load_start, load_end = sys.argv[12:16]
KEYS = ["direct", "none", "rules", "nginx"]
LABEL = {"direct": "direct to the server", "none": "tollgate, no rules", "rules": "tollgate, 3 rules",
         "quiet": "tollgate, 3 rules, quota headers off",
         "ietf": "tollgate, 3 rules, IETF quota headers only", "nginx": "nginx `grpc_pass`, `keepalive 32`"}
def kv(words): return {a: b for a, b in (w.split("=", 1) for w in words if "=" in w)}
cg, tp, conns = collections.defaultdict(list), collections.defaultdict(list), {}
for line in open(d + "/cg"): cg[line.split()[0]].append(kv(line.split()[1:]))
for line in open(d + "/tput"): tp[line.split()[0]].append(kv(line.split()[1:]))
for line in open(d + "/conns"): conns[line.split()[0]] = kv(line.split()[1:])
ipr = {k: [int(r["worker"]) / cg_requests for r in v] for k, v in cg.items()}
I = {k: statistics.mean(v) for k, v in ipr.items()}
spread = {k: (max(v) - min(v)) / min(v) for k, v in ipr.items() if len(v) > 1}
rps = {k: statistics.median(float(r["rps"]) for r in v) for k, v in tp.items()}
cpu = {k: statistics.median(int(r["cpu_us"]) / requests for r in v) for k, v in tp.items()}
def c(k, f, since="b_"): return int(conns[k][f]) - int(conns[k][since + f])
calls_ok = all(c(k, "calls") == rounds * requests for k in KEYS)
def k_(x): return "%.1fK" % (x / 1000)
def ins(k):
    if k not in I: return "-"
    return k_(I[k]) + (" (runs: %s)" % ", ".join(k_(x) for x in ipr[k]) if len(ipr[k]) > 1 else "")
out = ["| target | req/s, median of %d | rounds | proxy CPU us/request | instructions/request (worker thread) | connections to the server in the rounds: carried calls / most open at once / opened | opened by the warm-up |" % rounds,
       "| --- | ---: | --- | ---: | ---: | --- | ---: |"]
for k in KEYS:
    out.append("| %s | %.0f | %s | %s | %s | %d / %d / %d | %d |" % (
        LABEL[k], rps[k], ", ".join("%.0f" % float(r["rps"]) for r in tp[k]),
        "%.1f" % cpu[k] if k != "direct" else "(server: %.1f)" % cpu[k], ins(k),
        int(conns[k]["used"]), int(conns[k]["peak"]), c(k, "accepted"),
        int(conns[k]["b_accepted"]) - int(conns[k]["c_accepted"])))
    if k == "rules":
        for q in ("ietf", "quiet"):
            if q in I: out.append("| %s | | | | %s | | |" % (LABEL[q], ins(q)))
table = "\n".join(out)
ratio = I["rules"] / I["none"]
ok = ratio <= 1.10
quiet = I["quiet"] / I["none"] if "quiet" in I else None
ietf = I["ietf"] / I["none"] if "ietf" in I else None
top = [l.rstrip("\n").split("\t") for l in open(d + "/top")]
print("\n" + table + "\n")
print("%s 3 rules <= 1.10x the instructions per request without rules: %.3f" % ("PASS" if ok else "FAIL", ratio))
if ietf: print("     3 rules with the IETF quota headers only: %.3fx" % ietf)
if quiet: print("     3 rules with the quota headers off: %.3fx" % quiet)
for k, s in spread.items():
    print("%s repeatability (%s): runs differ by %.2f%%" % ("PASS" if s <= 0.01 else "FAIL", LABEL[k], 100 * s))
print("every call of the rounds reached the server: %s" % ("yes" if calls_ok else "NO"))
print("largest increases of self instructions per request, 3 rules vs no rules:")
for t in top:
    if t[0] == "diff": print("%8s  %s" % (t[1], t[2][:140]))
print("inclusive instructions per request: no rules, 3 rules, IETF headers only, quota headers off:")
for t in top:
    if t[0] == "incl": print("%8s %8s %8s %8s  %s" % tuple(t[1:]))
if not calls_ok: sys.exit("some calls did not reach the server")
if not write: sys.exit(0)
sec = """<!-- grpc:begin -->
## gRPC (issue 39)

Written by `scripts/bench-grpc` on %(date)s; `git describe --always --dirty`: %(commit)s.

Unary gRPC over h2c on this %(ncpu)s-core machine. The server is `examples/grpc_upstream.rs`
(the `h2` crate, one thread): it answers each call with its message back and the trailer
`grpc-status: 0`. Four targets, each with its own server: the client direct to the server;
tollgate (release, `threads: 1`, `server.h2c`, a pool with `protocol: h2c` and the default
`max_streams_per_connection: 100`, tenant from `x-org-id`, quota headers on) without rules
and with 3 rules that every call matches and that never deny (`per-ip`: `/**`, `per: ip`,
fixed window of 60 s; `tenant-echo`: `/bench.Echo/*`, per tenant, sliding window of 10 s;
`unary-method`: `/bench.Echo/Unary`, `per: global`, token bucket of 1 s); nginx %(ngv)s, one
worker, `grpc_pass grpc://` to an `upstream {}` with `keepalive 32`. Before the load, one
call through each target with curl over h2c (and grpcio when `target/test-venv` exists) must
answer 200, the message and `grpc-status: 0`.

- **Requests per second**: `h2load -n %(requests)d -c %(clients)d -m %(streams)d -t 1`, a POST to
  `/bench.Echo/Unary` of one 10-byte message (15 bytes with its prefix), `content-type:
  application/grpc`, `te: trailers`; %(warmup)d calls of warm-up the same way, then %(rounds)d
  rounds per target in rotated order, median; every answer 2xx (no 429) and every call of the
  rounds counted by the server. The proxy (direct: the server) is pinned to one core, h2load and
  the servers to the other. *Proxy CPU us/request* is the proxy's user + system time from
  `/proc` over each round (median). The machine's load average (1, 5, 15 min) was %(load_start)s
  at the start and %(load_end)s at the end: other work on it shows in req/s, not in the
  instruction counts.
- **Instructions per request**: tollgate and nginx under `valgrind --tool=callgrind`, `h2load
  -c 1 -m 1` (one call at a time on one connection, h2load's connection set up and closed
  within the count): %(cg_warmup)d calls of warm-up, `callgrind_control -z`, %(cg)d calls,
  `callgrind_control -d`; the worker thread's instructions (the one running `pingora_proxy`)
  divided by %(cg)d. Tollgate without rules and with the 3 rules run twice each (fresh
  processes; the runs must agree within 1%%); the rules with the IETF quota headers only
  (`RateLimit`, `RateLimit-Policy`) and with none run once.
- **Connections to the server**, counted by the server: over the measured rounds, those that
  carried at least one call, the most open at once and those opened; and those opened by the
  warm-up (tollgate's pool then held the one connection of the check).

%(table)s

Target of issue 39: %(verdict)s 3 rules cost %(ratio).3fx the instructions per request of the
same gateway without rules (at most 1.10x).%(quiet)s

Where the rules' instructions go: the functions whose self instructions per call grew most
from no rules to 3 rules (worker thread, first runs):

| self instructions/request, 3 rules minus no rules | function |
| ---: | --- |
%(top)s

Inclusive instructions per call (callees included, direct recursion skipped) of the HPACK
encoder (every header block tollgate writes: the answer's headers and trailers to the client,
the request's headers to the server), the admission (the decision) and the quota headers:

| function | no rules | 3 rules | 3 rules, IETF headers only | 3 rules, quota headers off |
| --- | ---: | ---: | ---: | ---: |
%(incl)s
<!-- grpc:end -->""" % dict(
    date=date, commit=commit, ncpu=ncpu, load_start=load_start, load_end=load_end, ngv=ngv, requests=requests, clients=clients, streams=streams,
    rounds=rounds, warmup=warmup, cg_warmup=cg_warmup, cg=cg_requests, table=table, ratio=ratio,
    verdict="met," if ok else "not met,",
    quiet=("\nThe same 3 rules with the IETF quota headers only (`x_ratelimit: false`): %.3fx" % ietf if ietf else "")
        + ("\nand with the quota headers off: %.3fx." % quiet if quiet else ""),
    top="\n".join("| %s | `%s` |" % (t[1], t[2].replace("|", "\\|")[:160]) for t in top if t[0] == "diff"),
    incl="\n".join("| `%s` | %s | %s | %s | %s |" % (t[5], t[1], t[2], t[3], t[4]) for t in top if t[0] == "incl"))
write_section("grpc", sec)
print("\nwrote BENCHMARKS.md (grpc section)")
