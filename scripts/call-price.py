#!/usr/bin/env python3
"""What one call costs Redis, three ways, on a redis-server of its own (run it beside a load,
e.g. scripts/bench-fleet's seed scenario, and read INFO commandstats after): each second, on 3
connections, 25 tenants' INCRBY + EXPIRE

  pipe: pipelined, 50 commands a round trip (the seed design, scripts/seed-design.py);
  each: one tenant's INCRBY + EXPIRE a round trip;
  eval: one EVAL of a two-line script doing the same a round trip.

  call-price.py PORT SECONDS pipe|each|eval
"""
import socket
import sys
import time

SCRIPT = "redis.call('INCRBY', KEYS[1], ARGV[1]) return redis.call('EXPIRE', KEYS[1], 10)"


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


def main():
    port, seconds, mode = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    conns = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
    for c in conns:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    end = time.time() + seconds
    tick = time.time()
    while tick < end:
        w = int(time.time()) // 10
        keys = [f"price:{{t{t}}}:{w}" for t in range(1, 26)]
        for c in conns:
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
