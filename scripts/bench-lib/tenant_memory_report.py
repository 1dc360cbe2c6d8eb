"""The report of scripts/bench-tenant-memory, from target/bench-tenant-memory.txt (one line per
run: mode tenants requests tracked rss_before_kb rss_after_kb bytes_per_tenant redis_keys
redis_used_memory): prints the tenant-memory section; with WRITE=1, writes
bench/tenant-memory.svg and the section to BENCHMARKS.md (scripts/bench-lib/section.py).

    tenant_memory_report.py WRITE DAY REV LIMIT_BYTES
"""

import os
import sys

from section import write_section

write, day, rev, limit = sys.argv[1:]
conns = int(os.environ.get("CONNS", "512"))
rows = [l.split() for l in open("target/bench-tenant-memory.txt") if l.strip()]
def marginal(m, n, c, a):
    prev = [r for r in rows if r[0] == m and int(r[1]) < int(n)]
    if not prev:
        return "-"
    p = max(prev, key=lambda r: int(r[1]))
    return f"{round((int(a) - int(p[5])) * 1024 / max(1, int(c) - int(p[3]))):,} B"
table = "\n".join(
    f"| {int(n):,} | {'Redis sync' if m == 'redis' else 'local only'} | {int(s):,} | {int(c):,} | "
    f"{int(b) // 1024} MB | {int(a) // 1024} MB | {int(p):,} B | {marginal(m, n, c, a)} |"
    for m, n, s, c, b, a, p, *_ in rows)
redis_table = "\n".join(
    f"| {int(r[1]):,} | {int(r[7]):,} | {int(r[8]) / 1048576:.1f} MB | {round(int(r[8]) / max(1, int(r[1]))):,} B |"
    for r in rows if r[0] == "redis")
sec = f"""<!-- tenant-memory:begin -->
## Memory per tenant

Written by `scripts/bench-tenant-memory` on {day}, commit {rev}.

One release gateway (`threads: 2`), one rule of two tiers (100 per minute and 5,000 per hour)
per tenant, wrk sending `x-org-id`s 1..N in turn over {conns} connections (with Redis, each
tenant's first request in a window waits for a sync round: until 2026-12-07 up to 50 ms, and
16 connections reached only a few thousand tenants; since, about a round trip); with Redis, `sync_interval: 1s`. Resident
memory before (after the same run with one tenant) and after; per tenant is the difference
over the counters tracked; each further tenant is the growth from the row above (what one
more tenant costs, without the allocator's and the sync's fixed part, which dominates at
1,000). The check fails above {int(limit):,} bytes per tenant at the largest count.

| tenants | mode | requests | counters tracked | RSS before | RSS after | per tenant | each further tenant |
| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |
{table}

Redis itself, after the runs with sync (`INFO memory`, `DBSIZE`; an empty server uses about
0.9 MB):

| tenants | keys | used_memory | per tenant |
| ---: | ---: | ---: | ---: |
{redis_table}

![bytes per tenant](bench/tenant-memory.svg)
<!-- tenant-memory:end -->"""
print(sec)
# bench/tenant-memory.svg: bytes per tenant, local and Redis side by side, with the 1 KB line
W, H, top, base = 560, 300, 40, 250
peak = max([int(limit)] + [int(r[6]) for r in rows]) * 1.15
y = lambda v: base - (base - top) * v / peak
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">',
       '<rect width="100%" height="100%" fill="white"/>',
       '<text x="10" y="20" font-size="14" font-weight="bold">Resident memory per tenant (bytes), two-tier rule</text>']
sizes = sorted({int(r[1]) for r in rows})
for i, n in enumerate(sizes):
    x0 = 70 + i * 160
    for j, (mode, col) in enumerate((("local", "#4c78a8"), ("redis", "#e45756"))):
        v = next((int(r[6]) for r in rows if r[0] == mode and int(r[1]) == n), None)
        if v is None:
            continue
        x = x0 + j * 55
        svg.append(f'<rect x="{x}" y="{y(max(v, 0)):.1f}" width="50" height="{base - y(max(v, 0)):.1f}" fill="{col}"/>')
        svg.append(f'<text x="{x + 25}" y="{y(max(v, 0)) - 4:.1f}" text-anchor="middle">{v}</text>')
    svg.append(f'<text x="{x0 + 52}" y="{base + 16}" text-anchor="middle">{n:,} tenants</text>')
svg.append(f'<line x1="60" x2="{W - 10}" y1="{y(int(limit)):.1f}" y2="{y(int(limit)):.1f}" stroke="black" stroke-dasharray="4 3"/>')
svg.append(f'<text x="{W - 12}" y="{y(int(limit)) - 4:.1f}" text-anchor="end">{int(limit):,} B</text>')
svg.append(f'<rect x="70" y="{H - 24}" width="10" height="10" fill="#4c78a8"/><text x="84" y="{H - 15}">local only</text>')
svg.append(f'<rect x="170" y="{H - 24}" width="10" height="10" fill="#e45756"/><text x="184" y="{H - 15}">Redis sync</text>')
svg.append(f'<text x="{W - 10}" y="{H - 15}" text-anchor="end" fill="#555">{day}, {rev}</text>')
svg.append('</svg>')
if write == "1":
    open("bench/tenant-memory.svg", "w").write("\n".join(svg) + "\n")
    write_section("tenant-memory", sec)
