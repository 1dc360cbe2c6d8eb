"""Outside test suites against a real gateway (`make conformance`; issue 21).

Starts the release build of tollgate with a TLS listener (HTTP/2 by ALPN), a plain listener
with h2c, `max_body_bytes: 1000`, rules with a sub-second tier and a 15-digit threshold, the
example upstream and the WebSocket echo upstream, then runs, each against that gateway:

- sslyze with Mozilla's "intermediate" profile on the TLS listener (must be compliant);
- promtool `check metrics` on /metrics (no problem reported);
- h2load over h2 (TLS) and h2c, every request with a body: no failure, no 4xx, no 5xx;
- a WebSocket echo (the `websockets` package) through a tunnel of more than max_body_bytes;
- every RateLimit and RateLimit-Policy value seen (allowed and denied answers, every rule)
  through http_sfv, the Structured Field parser of RFC 9651, with Integer q, w, r and t.

Prints one line per suite and a closing `N passed, N failed`; exits 1 if any failed. The
raw-socket smuggling table is `tests/smuggling.rs` (run by `make conformance` after this).
"""

import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request

from harness import REL, eventually, finish, free_port, record, spawn_listening, stop






def get(url, headers=None):
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def make_certificates(dir_):
    """A CA of the run's own and a localhost certificate it signs (sslyze's Mozilla check
    validates the chain: it is given the CA)."""
    def run(*args):
        subprocess.run(list(args), check=True, capture_output=True, cwd=dir_)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run("openssl", "req", "-x509", *ec, "-days", "30", "-subj", "/CN=Tollgate conformance CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign", "-keyout", "ca.key", "-out", "ca.pem")
    run("openssl", "req", *ec, "-subj", "/CN=localhost", "-keyout", "gw.key", "-out", "gw.csr")
    with open(os.path.join(dir_, "ext.cnf"), "w") as f:
        f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
                "keyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n")
    run("openssl", "x509", "-req", "-in", "gw.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "30", "-extfile", "ext.cnf", "-out", "gw.pem")


def check_sslyze(venv_bin, tls_port, dir_):
    out = subprocess.run(
        [os.path.join(venv_bin, "sslyze"), "--certinfo_ca_file", os.path.join(dir_, "ca.pem"),
         "--mozilla_config=intermediate", f"localhost:{tls_port}"],
        capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    compliant = out.returncode == 0 and "OK - Compliant" in text
    problems = [l.strip() for l in text.splitlines() if l.strip().startswith("* ")
                and ":" in l and "Cipher Suites" not in l][:8]
    record("sslyze mozilla intermediate", compliant,
           "compliant" if compliant else f"exit {out.returncode}: {problems or text[-800:]}")


def check_promtool(admin):
    _, _, body = get(f"http://{admin}/metrics")
    out = subprocess.run(["promtool", "check", "metrics"], input=body,
                         capture_output=True, timeout=60)
    text = (out.stdout + out.stderr).decode()
    record("promtool check metrics", out.returncode == 0 and not text.strip(),
           f"{len(body)} bytes of metrics" + (f"; {text.strip()}" if text.strip() else ""))


def check_h2load(addr, tls_port, dir_):
    body = os.path.join(dir_, "body")
    with open(body, "wb") as f:
        f.write(b"x" * 512)
    for name, url in (("h2 (TLS)", f"https://127.0.0.1:{tls_port}/v1/upload"),
                      ("h2c", f"http://{addr}/v1/upload")):
        out = subprocess.run(
            ["h2load", "-n", "4000", "-c", "8", "-m", "8", "-d", body,
             "-H", "x-org-id: conformance", url],
            capture_output=True, text=True, timeout=300)
        m = re.search(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, "
                      r"(\d+) failed, (\d+) errored", out.stdout)
        s = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", out.stdout)
        ok = bool(m and s) and m.group(4) == "4000" and s.group(1) == "4000" \
            and s.group(3) == "0" and s.group(4) == "0"
        detail = (f"{m.group(4)}/{m.group(1)} succeeded, {s.group(1)} 2xx, {s.group(3)} 4xx, "
                  f"{s.group(4)} 5xx" if m and s else out.stdout[-600:] + out.stderr[-300:])
        tput = re.search(r"finished in [^,]+, ([\d.]+) req/s", out.stdout)
        if tput:
            detail += f", {tput.group(1)} req/s"
        record(f"h2load {name} with request bodies", ok, detail)


async def websocket_echo(addr):
    import websockets
    async with websockets.connect(f"ws://{addr}/ws/echo", max_size=None) as ws:
        first = await ws.recv()
        sent = 0
        for i in range(50):
            msg = f"{i:04d}" + "m" * 996
            await ws.send(msg)
            back = await ws.recv()
            assert back == "echo: " + msg, (i, back[:40])
            sent += len(msg)
        big = os.urandom(1 << 20)
        await ws.send(big)
        assert await ws.recv() == big
        sent += len(big)
        await ws.ping()
        await ws.close(code=1000)
        return first, sent


def check_websocket(addr):
    try:
        first, sent = asyncio.run(websocket_echo(addr))
        record("websockets echo through a tunnel past max_body_bytes", True,
               f"{sent} bytes echoed (max_body_bytes 1000), first message {first!r}")
    except Exception as e:  # noqa: BLE001 - any failure is the suite's verdict
        record("websockets echo through a tunnel past max_body_bytes", False, repr(e))


def check_structured_fields(addr):
    import http_sfv
    seen = []
    for path, n in (("/v1/sub", 6), ("/v1/huge", 2), ("/v1/sliding", 5), ("/v1/bucket", 5)):
        for _ in range(n):
            status, headers, _ = get(f"http://{addr}{path}", {"x-org-id": "sf"})
            low = {k.lower(): v for k, v in headers.items()}
            for name in ("ratelimit-policy", "ratelimit"):
                if name in low:
                    seen.append((status, name, low[name]))
    bad = []
    statuses = set()
    for status, name, value in seen:
        statuses.add(status)
        try:
            lst = http_sfv.List()
            lst.parse(value.encode())
            for member in lst:
                for key, val in member.params.items():
                    if key in ("q", "w", "r", "t") and (
                            not isinstance(val, int) or isinstance(val, bool)):
                        bad.append(f"{name}: {value!r}: {key} is not an Integer")
        except Exception as e:  # noqa: BLE001
            bad.append(f"{name}: {value!r}: {e}")
    ok = not bad and len(seen) > 20 and 429 in statuses and 200 in statuses
    record("http_sfv on every RateLimit value", ok,
           f"{len(seen)} values from 200 and 429 answers parsed" if ok else f"{bad[:5]} {statuses}")


CONFIG = """server:
  listen:
    - "{plain}"
    - addr: "127.0.0.1:{tls}"
      tls: {{ cert: gw.pem, key: gw.key }}
  admin: "{admin}"
  h2c: true
  threads: 2
  max_body_bytes: 1000
upstreams:
  app:
    servers: ["{up}"]
  ws:
    servers: ["{ws}"]
routes:
  - id: ws
    path: /ws/**
    upstream: ws
  - id: all
    path: /**
    upstream: app
tenant:
  from:
    - header: x-org-id
      trusted: true
limits:
  - id: sub
    pathPattern: /v1/sub
    tiers: [{{ period: 500ms, threshold: 3 }}, {{ period: 1h, threshold: 1000 }}]
  - id: huge
    pathPattern: /v1/huge
    tiers: [{{ period: 1h, threshold: 999999999999999 }}]
  - id: sliding
    pathPattern: /v1/sliding
    algorithm: sliding_window
    tiers: [{{ period: 10, threshold: 3 }}]
  - id: bucket
    pathPattern: /v1/bucket
    algorithm: token_bucket
    tiers: [{{ period: 10, threshold: 3 }}]
  - id: uploads
    pathPattern: /v1/upload
    tiers: [{{ period: 1, threshold: 1000000 }}]
"""


def main():
    venv_bin = sys.argv[1]
    dir_ = tempfile.mkdtemp(prefix="tollgate-conformance-")
    procs = []
    try:
        make_certificates(dir_)
        up, up_addr = spawn_listening([os.path.join(REL, "examples", "upstream"), "127.0.0.1:0"])
        procs.append(up)
        ws, ws_addr = spawn_listening([os.path.join(REL, "examples", "ws_echo"), "127.0.0.1:0"])
        procs.append(ws)
        plain, tls, admin = (f"127.0.0.1:{free_port()}", free_port(), f"127.0.0.1:{free_port()}")
        cfg = os.path.join(dir_, "gateway.yaml")
        with open(cfg, "w") as f:
            f.write(CONFIG.format(plain=plain, tls=tls, admin=admin, up=up_addr, ws=ws_addr))
        log = open(os.path.join(dir_, "gateway.log"), "w")
        gw = subprocess.Popen([os.path.join(REL, "tollgate"), "-c", cfg], stderr=log,
                              stdout=subprocess.DEVNULL)
        procs.append(gw)
        if not eventually(lambda: get(f"http://{admin}/readyz")[0] == 200):
            print(open(os.path.join(dir_, "gateway.log")).read())
            record("gateway starts", False, "not ready in 20 s")
            return
        check_sslyze(venv_bin, tls, dir_)
        check_h2load(plain, tls, dir_)
        check_websocket(plain)
        check_structured_fields(plain)
        check_promtool(admin)
        errors = [l for l in open(os.path.join(dir_, "gateway.log")) if " ERROR " in l
                  and "handshake" not in l]
        record("no error logged by the gateway", not errors, f"{len(errors)} error lines"
               + (f": {errors[:3]}" if errors else ""))
    finally:
        stop(procs)
        shutil.rmtree(dir_, ignore_errors=True)
    finish("conformance")


if __name__ == "__main__":
    main()
