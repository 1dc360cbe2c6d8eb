"""The report of scripts/bench-memory: prints the memory section; with WRITE=1, writes it to
BENCHMARKS.md (scripts/bench-lib/section.py).

    memory_report.py WRITE DAY REV TENANTS CAP SENT RSS_START RSS_AFTER RSS_SWEPT LIMIT_MB COUNTERS_AFTER COUNTERS_SWEPT
"""

import sys

from section import write_section

write, day, rev, tenants, cap, sent, start, after, swept, limit, c_after, c_swept = sys.argv[1:]
sec = f"""<!-- memory:begin -->
## Memory under a million tenant ids

Written by `scripts/bench-memory` on {day}, commit {rev}.

The release gateway (`threads: 2`, `max_counters_per_rule: {int(cap):,}`) with one rule of
100 per second per tenant, and wrk sending {int(sent):,} requests whose `x-org-id` counts up to
{int(tenants):,} distinct ids. Resident memory of the gateway process:

| | at start | after the load | after the sweeper ran |
| --- | ---: | ---: | ---: |
| resident memory | {start} MB | {after} MB | {swept} MB |
| counters tracked | 0 | {int(c_after):,} | {int(c_swept):,} |

The counters of a rule are capped at `max_counters_per_rule` (the oldest are evicted), so
memory stays bounded whatever the number of ids; the sweeper then drops the counters of
windows that ended, and the allocator keeps the freed pages for the next ones (the resident
size does not shrink). The check fails above {limit} MB.
<!-- memory:end -->"""
print(sec)
if write == "1":
    write_section("memory", sec)
