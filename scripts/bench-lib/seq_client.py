"""A sequential HTTP/1.1 client for the callgrind benchmarks: one keep-alive connection, one
request at a time, exact counts. Sends WARMUP requests, has callgrind zero its counters
(`callgrind_control -z PID`), sends N requests, has it dump (`-d`), and prints the seconds the N
took. Each request is `GET PATH` with the header NAME: VALUE, the values taken in turn from the
file VALUES (one per line; the warm-up takes them from the end of the file, so that the N
requests' values are the file's first N: with distinct values, none of them seen before).

    seq_client.py PORT PATH NAME VALUES WARMUP N PID
"""

import socket
import subprocess
import sys
import time

port, path, name, values_file = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
warmup, n, pid = int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
values = [l.strip() for l in open(values_file) if l.strip()]
# No readiness probes: a refused connect never reaches the proxy, so every run's process history
# is the same (start-up, then this one connection).
for attempt in range(1200):
    try:
        s = socket.create_connection(("127.0.0.1", port))
        break
    except ConnectionRefusedError:
        time.sleep(0.05)
else:
    sys.exit("nothing listens on port %d" % port)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
buf = b""


def request(value):
    global buf
    s.sendall(b"GET %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n%s: %s\r\n\r\n"
              % (path.encode(), port, name.encode(), value.encode()))
    while b"\r\n\r\n" not in buf:
        d = s.recv(65536)
        if not d:
            sys.exit("connection closed by the proxy")
        buf += d
    head, _, buf = buf.partition(b"\r\n\r\n")
    status, cl = int(head.split(b" ", 2)[1]), 0
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            cl = int(v)
    while len(buf) < cl:
        d = s.recv(65536)
        if not d:
            sys.exit("connection closed by the proxy")
        buf += d
    buf = buf[cl:]
    if status != 200:
        sys.exit("status %d: %s" % (status, head.decode(errors="replace")))


def control(flag):
    out = subprocess.run(["callgrind_control", flag, str(pid)], capture_output=True, text=True)
    if out.returncode != 0 or "OK" not in out.stdout:
        sys.exit("callgrind_control %s: %s%s" % (flag, out.stdout, out.stderr))


for i in range(warmup):
    request(values[len(values) - 1 - (i % len(values))])
time.sleep(0.2)
control("-z")
t0 = time.time()
for i in range(n):
    request(values[i % len(values)])
t1 = time.time()
time.sleep(0.2)
control("-d")
print("%.2f" % (t1 - t0))
