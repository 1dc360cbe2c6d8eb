#!/usr/bin/env python3
"""The seed's own design, beside scripts/bench-fleet's seed scenario: each second, each of 3
gateway instances sends each of 25 tenants' local count (13, about a third of a tenant's 40 a
second) as one INCRBY of the window's key and one EXPIRE, pipelined on its own connection (one
round trip per instance per second). A connection each, kept open, as a gateway would: a
`redis-cli` started every second also sends COMMAND DOCS (about 0.6 ms of Redis's time each,
ten times the INCRBY and EXPIRE it carries), which is not the seed design's cost.

What one call costs Redis (docs/fleet.md, "Redis cost"), the same commands sent two more ways
(run beside a load on a redis-server of its own, and read INFO commandstats after):

  pipe: the seed design (the default);
  each: one tenant's INCRBY + EXPIRE a round trip;
  eval: one EVAL of a two-line script doing the same a round trip;
  lease: what an exact design of plain commands would send instead (fleet.md, "Redis cost"):
    at each 10 s window's start, per instance, every tenant's lease of its even part
    (INCRBY of the window's leased total by 67, PEXPIRE), pipelined; 5 s in, as each tenant's
    part runs out, one round trip each: its count (INCRBY, EXPIRE) and an ask for more
    (INCRBY of the leased total by 1, which answers that the window is full).
  bitfield: the same, as the exact plain lease fleet.md proposes would send it: each ask a
    SET NX of the lease key (its base, set by the window's first ask), a COPY of it under the
    ask's own name (what a lost reply granted can be known after), and one BITFIELD that reads the leased
    total and adds the ask, saturating at the threshold (the grant: the difference); counts
    by INCRBY at each second while the window fills; every round in MULTI ... EXEC with its
    mark (ZADD, ZREMRANGEBYSCORE, PEXPIRE), as the gateway's rounds with plain increments are.

  seed-design.py PORT SECONDS [pipe|each|eval|lease|bitfield]
"""
import socket
import sys
import time

SCRIPT = "redis.call('INCRBY', KEYS[1], ARGV[1]) return redis.call('EXPIRE', KEYS[1], 10)"


def resp(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


def read_replies(sock, n):
    buf = b""
    while buf.count(b"\r\n") < n:
        chunk = sock.recv(65536)
        if not chunk:
            raise SystemExit("redis closed the connection")
        buf += chunk
    if any(line.startswith(b"-") for line in buf.split(b"\r\n")):
        raise SystemExit(buf.decode())


def lease(c, keys, phase):
    """One instance's second of the `lease` mode (see above)."""
    if phase == 0:
        c.sendall(
            b"".join(resp("INCRBY", k + ":l", 67) + resp("PEXPIRE", k + ":l", 20000) for k in keys)
        )
        read_replies(c, 50)
    elif phase == 5:
        for k in keys:
            c.sendall(resp("INCRBY", k, 67) + resp("EXPIRE", k, 20) + resp("INCRBY", k + ":l", 1))
            read_replies(c, 3)
            time.sleep(0.0005)


# a window's lease key holds BASE + what is leased, as a 20-bit unsigned field: a BITFIELD
# INCRBY that saturates stops at the threshold (200)
BASE = (1 << 20) - 1 - 200
BASE_BYTES = (BASE << 4).to_bytes(3, "big")


def marked(inst, seq, cmds):
    """A round: its commands in MULTI ... EXEC with its mark, as the gateway sends them."""
    marks = f"seed:rounds:{inst}"
    now = int(time.time() * 1000)
    body = [resp("MULTI"), resp("ZADD", marks, now, seq)] + cmds
    body += [resp("ZREMRANGEBYSCORE", marks, "-inf", now - 60000), resp("PEXPIRE", marks, 60000)]
    body.append(resp("EXEC"))
    return b"".join(body), len(body)


def ask(k, inst, seq, units, end_ms):
    """One exact plain ask: the lease key's base once, its snapshot, the saturating add."""
    lk = k + ":l"
    return [
        resp("SET", lk, BASE_BYTES, "NX", "PXAT", end_ms),
        resp("COPY", lk, f"{lk}:{inst}:{seq}"),
        resp("BITFIELD", lk, "GET", "u20", 0, "OVERFLOW", "SAT", "INCRBY", "u20", 0, units),
    ]


def bitfield(c, inst, keys, phase, seq):
    """One instance's second of the `bitfield` mode (see above)."""
    end_ms = (int(time.time()) // 10 * 10 + 20) * 1000
    if phase == 0:
        cmds = [x for k in keys for x in ask(k, inst, seq, 67, end_ms)]
    elif phase < 5:
        cmds = [resp("INCRBY", k, 13) for k in keys]
    elif phase == 5:
        for k in keys:
            seq += 1
            cmds = [resp("INCRBY", k, 15)] + ask(k, inst, seq, 1, end_ms)
            body, n = marked(inst, seq, cmds)
            c.sendall(body)
            read_replies(c, n + 4)
            time.sleep(0.0005)
        return seq
    else:
        return seq
    if phase == 1:
        cmds += [resp("PEXPIREAT", k, end_ms) for k in keys]
    body, n = marked(inst, seq, cmds)
    c.sendall(body)
    read_replies(c, n + len(keys))
    return seq + 1


def main():
    port, seconds = int(sys.argv[1]), float(sys.argv[2])
    mode = sys.argv[3] if len(sys.argv) > 3 else "pipe"
    if mode not in ("pipe", "each", "eval", "lease", "bitfield"):
        raise SystemExit(f"unknown mode {mode!r}: pipe, each, eval, lease or bitfield")
    seqs = [1, 1, 1]
    conns = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
    for c in conns:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    end = time.time() + seconds
    tick = time.time()
    while tick < end:
        w = int(time.time()) // 10
        keys = [f"seed:{{t{t}}}:{w}" for t in range(1, 26)]
        phase = int(time.time()) % 10
        for i, c in enumerate(conns):
            if mode == "bitfield":
                seqs[i] = bitfield(c, i, keys, phase, seqs[i])
                continue
            if mode == "lease":
                lease(c, keys, phase)
                continue
            if mode == "pipe":
                c.sendall(b"".join(resp("INCRBY", k, 13) + resp("EXPIRE", k, 10) for k in keys))
                read_replies(c, 50)
                continue
            for k in keys:
                if mode == "each":
                    c.sendall(resp("INCRBY", k, 13) + resp("EXPIRE", k, 10))
                    read_replies(c, 2)
                else:
                    c.sendall(resp("EVAL", SCRIPT, 1, k, 13))
                    read_replies(c, 1)
                time.sleep(0.0005)  # apart, as separate rounds' calls are
        tick += 1
        time.sleep(max(0.0, tick - time.time()))


if __name__ == "__main__":
    main()
