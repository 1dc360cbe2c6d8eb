"""The latency the Redis sync adds (scripts/bench-fleet): the p95 and p99 of the wrk RESULT
lines with Redis (REDIS) minus those without (LOCAL), each the mean over the instances.

    fleet_latency.py LOCAL REDIS
"""

import sys
def mean(f, k):
    vals = [int(w.split("=")[1]) for line in open(f) for w in line.split()[1:] if w.startswith(k + "=")]
    return sum(vals) / len(vals) / 1000
for k in ("p95_us", "p99_us"):
    print(f"latency added by the sync, {k[:3]}: {mean(sys.argv[2], k) - mean(sys.argv[1], k):+.2f} ms")
