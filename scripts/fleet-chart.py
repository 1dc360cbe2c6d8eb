#!/usr/bin/env python3
"""Helpers of scripts/bench-fleet (python3 stdlib only).

  fleet-chart.py sample OUT RULE ADMIN...     every 100 ms until SIGTERM, append to OUT one line
                                              "t_ms allowed_0 rounds_0 allowed_1 rounds_1 ..."
                                              (allowed decisions of RULE, sync rounds) per admin
  fleet-chart.py svg SAMPLES THRESHOLD LOAD_START_MS LOAD_END_MS OUT.svg
                                              chart of admitted requests per instance over the run
"""
import os
import signal
import sys
import time
import urllib.request


def metric(text, name, labels):
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        rest = line[len(name):]
        if not (rest.startswith("{") or rest.startswith(" ")):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels):
            try:
                total += float(line.rsplit(" ", 1)[1])
            except ValueError:
                pass
    return total


def sample(out, rule, admins):
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    tick = time.monotonic()
    with open(out, "a") as f:
        while not stop:
            t_ms = int(time.time() * 1000)
            cols = [str(t_ms)]
            for a in admins:
                try:
                    with urllib.request.urlopen(f"http://{a}/metrics", timeout=1) as r:
                        text = r.read().decode()
                    cols.append(str(int(metric(text, "tollgate_ratelimit_decisions_total",
                                               [("rule", rule), ("decision", "allowed")]))))
                    cols.append(str(int(metric(text, "tollgate_redis_sync_total", []))))
                except OSError:
                    cols += ["nan", "nan"]
            f.write(" ".join(cols) + "\n")
            f.flush()
            tick += 0.1
            time.sleep(max(0.0, tick - time.monotonic()))


def svg(samples, threshold, load_start, load_end, out):
    rows = []
    for line in open(samples):
        parts = line.split()
        if "nan" in parts:
            continue
        rows.append([int(float(x)) for x in parts])
    if not rows:
        sys.exit("no samples")
    n = (len(rows[0]) - 1) // 2
    base = rows[0]
    # admitted since the first sample (taken just before the load), per instance
    t = [(r[0] - load_start) / 1000 for r in rows]
    per = [[r[1 + 2 * i] - base[1 + 2 * i] for r in rows] for i in range(n)]
    fleet = [sum(p[j] for p in per) for j in range(len(rows))]
    rounds = [[r[2 + 2 * i] for r in rows] for i in range(n)]

    W, H, L, R, T, B = 820, 420, 70, 215, 40, 60
    pw, ph = W - L - R, H - T - B
    x0, x1 = min(t[0], 0.0), max(t[-1], (load_end - load_start) / 1000)
    ymax = max(max(fleet), threshold) * 1.15
    X = lambda v: L + (v - x0) / (x1 - x0) * pw
    Y = lambda v: T + ph - v / ymax * ph
    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b"]
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
         f'font-family="sans-serif" font-size="12">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="{L}" y="22" font-size="14">Admitted requests per instance, threshold '
         f'{threshold}, load on {n} instances, sampled every 100 ms</text>']
    # load period
    o.append(f'<rect x="{X(0):.1f}" y="{T}" width="{X((load_end - load_start) / 1000) - X(0):.1f}" '
             f'height="{ph}" fill="#f2f2f2"/>')
    # axes and grid
    step = 10 ** max(0, len(str(int(ymax))) - 1)
    if ymax / step < 4:
        step //= 2 or 1
    v = 0
    while v <= ymax:
        o.append(f'<line x1="{L}" x2="{L + pw}" y1="{Y(v):.1f}" y2="{Y(v):.1f}" stroke="#ddd"/>')
        o.append(f'<text x="{L - 6}" y="{Y(v) + 4:.1f}" text-anchor="end">{v}</text>')
        v += step
    s = int(x0)
    while s <= x1:
        o.append(f'<line x1="{X(s):.1f}" x2="{X(s):.1f}" y1="{T + ph}" y2="{T + ph + 5}" stroke="#333"/>')
        o.append(f'<text x="{X(s):.1f}" y="{T + ph + 18}" text-anchor="middle">{s}</text>')
        s += 1
    o.append(f'<line x1="{L}" x2="{L}" y1="{T}" y2="{T + ph}" stroke="#333"/>')
    o.append(f'<line x1="{L}" x2="{L + pw}" y1="{T + ph}" y2="{T + ph}" stroke="#333"/>')
    o.append(f'<text x="{L + pw / 2}" y="{H - 22}" text-anchor="middle">seconds since the load '
             f'started (grey: wrk running; ticks: sync rounds of each instance)</text>')
    # threshold and 2% band
    o.append(f'<rect x="{L}" y="{Y(threshold * 1.02):.1f}" width="{pw}" '
             f'height="{Y(threshold * 0.98) - Y(threshold * 1.02):.1f}" fill="#d62728" opacity="0.12"/>')
    o.append(f'<line x1="{L}" x2="{L + pw}" y1="{Y(threshold):.1f}" y2="{Y(threshold):.1f}" '
             f'stroke="#d62728" stroke-dasharray="6 4"/>')

    def path(vals, color, width):
        pts = " ".join(f"{X(a):.1f},{Y(b):.1f}" for a, b in zip(t, vals))
        return f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="{width}"/>'

    o.append(path(fleet, "#000", 2.5))
    for i in range(n):
        o.append(path(per[i], colors[i % len(colors)], 1.8))
        # a tick where the instance's round counter went up
        yb = T + ph - 4 - 6 * i
        for j in range(1, len(rows)):
            if rounds[i][j] > rounds[i][j - 1]:
                o.append(f'<line x1="{X(t[j]):.1f}" x2="{X(t[j]):.1f}" y1="{yb}" y2="{yb - 5}" '
                         f'stroke="{colors[i % len(colors)]}"/>')
    # legend
    lx, ly = L + pw + 15, T + 10
    items = [("fleet total", "#000")] + [(f"instance {i}", colors[i % len(colors)]) for i in range(n)]
    items.append((f"threshold {threshold} ± 2%", "#d62728"))
    for k, (name, color) in enumerate(items):
        y = ly + 20 * k
        o.append(f'<line x1="{lx}" x2="{lx + 20}" y1="{y}" y2="{y}" stroke="{color}" stroke-width="2"/>')
        o.append(f'<text x="{lx + 26}" y="{y + 4}">{name}</text>')
    o.append(f'<text x="{lx}" y="{ly + 20 * len(items) + 10}">final: {fleet[-1]} '
             f'({fleet[-1] / threshold:.3f} x T)</text>')
    o.append("</svg>")
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        f.write("\n".join(o) + "\n")


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "sample":
        sample(args[0], args[1], args[2:])
    elif cmd == "svg":
        svg(args[0], int(args[1]), int(args[2]), int(args[3]), args[4])
    else:
        sys.exit(__doc__)
