#!/usr/bin/env python3
"""The per-request design Tollgate's fleet sync is measured against (Envoy's rate limit
service): for every request, one INCRBY and one PEXPIRE on the window's key, pipelined
together, one round trip per request. Replays the load of the Redis cost benchmark (bench/
cost.lua: tenants at random, one request in 20 on the hot partition) against a redis-server,
from one connection per gateway instance taking turns.

  incr-baseline.py PORT REQUESTS TENANTS [INSTANCES]
"""
import random
import socket
import sys
import time


def resp(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


def read_replies(sock, buf, n):
    """Read n simple replies (integers here); returns the rest of the buffer."""
    while buf.count(b"\r\n") < n:
        chunk = sock.recv(65536)
        if not chunk:
            raise SystemExit("redis closed the connection")
        buf += chunk
    for _ in range(n):
        line, buf = buf.split(b"\r\n", 1)
        if line.startswith(b"-"):
            raise SystemExit(line.decode())
    return buf


def main():
    port, requests, tenants = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    instances = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    rnd = random.Random(1)
    conns = [socket.create_connection(("127.0.0.1", port)) for _ in range(instances)]
    bufs = [b""] * instances
    for s in conns:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    period = 60_000
    for i in range(requests):
        now = int(time.time() * 1000)
        start = now - now % period
        if rnd.randrange(20) == 0:
            key = f"base:{{global}}:hot:{start}:{start + period}"
        else:
            key = f"base:{{t{rnd.randrange(tenants) + 1}}}:api:{start}:{start + period}"
        c = i % instances
        conns[c].sendall(resp("INCRBY", key, 1) + resp("PEXPIRE", key, period + 10_000))
        bufs[c] = read_replies(conns[c], bufs[c], 2)


if __name__ == "__main__":
    main()
