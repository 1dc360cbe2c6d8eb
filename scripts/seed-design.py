#!/usr/bin/env python3
"""The seed's own design, beside scripts/bench-fleet's seed scenario: each second, each of 3
gateway instances sends each of 25 tenants' local count (13, about a third of a tenant's 40 a
second) as one INCRBY of the window's key and one EXPIRE, pipelined on its own connection (one
round trip per instance per second). A connection each, kept open, as a gateway would: a
`redis-cli` started every second also sends COMMAND DOCS (about 0.6 ms of Redis's time each,
ten times the INCRBY and EXPIRE it carries), which is not the seed design's cost.

  seed-design.py PORT SECONDS
"""
import socket
import sys
import time

INSTANCES, TENANTS, COUNT, WINDOW_S = 3, 25, 13, 10


def resp(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = str(a).encode()
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


def main():
    port, seconds = int(sys.argv[1]), float(sys.argv[2])
    conns = [socket.create_connection(("127.0.0.1", port)) for _ in range(INSTANCES)]
    for s in conns:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    end = time.time() + seconds
    tick = time.time()
    while tick < end:
        w = int(time.time()) // WINDOW_S
        for s in conns:
            batch = b"".join(
                resp("INCRBY", f"seed:{{t{t}}}:{w}", COUNT) + resp("EXPIRE", f"seed:{{t{t}}}:{w}", WINDOW_S)
                for t in range(1, TENANTS + 1)
            )
            s.sendall(batch)
            read_replies(s, 2 * TENANTS)
        tick += 1
        time.sleep(max(0.0, tick - time.time()))


if __name__ == "__main__":
    main()
