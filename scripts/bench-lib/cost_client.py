"""The sequential client of scripts/bench-cost under callgrind: one keep-alive connection, one
request at a time, exact counts. Each request is GET /v1/organizations/tenant-I/product/42 with
`x-org-id: tenant-I`, I rotating over 25 tenants. Sends WARMUP requests, has callgrind zero its
counters (`callgrind_control -z PID`), sends N requests, has it dump (`-d`), and prints the
seconds the N took. Any answer but 200 fails.

    cost_client.py PORT WARMUP N PID
"""

import socket, subprocess, sys, time
port, warmup, n, pid = (int(a) for a in sys.argv[1:5])
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
buf, i = b"", 0
def request():
    global buf, i
    t = "tenant-%d" % (i % 25)
    i += 1
    s.sendall(b"GET /v1/organizations/%s/product/42 HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nx-org-id: %s\r\n\r\n"
              % (t.encode(), port, t.encode()))
    while b"\r\n\r\n" not in buf:
        d = s.recv(65536)
        if not d: sys.exit("connection closed by the proxy")
        buf += d
    head, _, buf = buf.partition(b"\r\n\r\n")
    status, cl = int(head.split(b" ", 2)[1]), 0
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length": cl = int(v)
    while len(buf) < cl:
        d = s.recv(65536)
        if not d: sys.exit("connection closed by the proxy")
        buf += d
    buf = buf[cl:]
    if status != 200: sys.exit("status %d" % status)
def control(flag):
    out = subprocess.run(["callgrind_control", flag, str(pid)], capture_output=True, text=True)
    if out.returncode != 0 or "OK" not in out.stdout: sys.exit("callgrind_control %s: %s%s" % (flag, out.stdout, out.stderr))
for _ in range(warmup): request()
time.sleep(0.2)
control("-z")
t0 = time.time()
for _ in range(n): request()
t1 = time.time()
time.sleep(0.2)
control("-d")
print("%.2f" % (t1 - t0))
