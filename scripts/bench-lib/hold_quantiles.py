"""The hold times of a run (scripts/bench-under-limit): the `tollgate_fleet_hold_seconds`
histograms of every instance's /metrics, summed, as "p50 p99 max" in ms, each the upper bound of
the bucket the quantile falls in ("-" when no request was held).

    hold_quantiles.py METRICS_FILE...
"""

import re, sys

buckets = {}
count = 0.0
for path in sys.argv[1:]:
    for line in open(path, errors="replace"):
        m = re.match(r'tollgate_fleet_hold_seconds_bucket\{le="([^"]+)"\} (\S+)', line)
        if m:
            le = float("inf") if m.group(1) == "+Inf" else float(m.group(1))
            buckets[le] = buckets.get(le, 0.0) + float(m.group(2))
        elif line.startswith("tollgate_fleet_hold_seconds_count "):
            count += float(line.split()[1])


def bound(q):
    """The upper bound (ms) of the bucket holding quantile q of the observations."""
    for le in sorted(buckets):
        if buckets[le] >= q * count:
            return "inf" if le == float("inf") else "%g" % (le * 1000)
    return "-"


if count == 0:
    print("- - -")
else:
    # max: the first bucket holding every observation
    print(bound(0.5), bound(0.99), bound(1.0))
