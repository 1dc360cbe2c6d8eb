"""What the outside suites of `make conformance` share (scripts/conformance.py and
scripts/attacks.py): where the release build is, free ports, waiting for a condition, the
verdicts, and stopping what a suite started."""

import os
import signal
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REL = os.path.join(ROOT, "target", "release")
RESULTS = []


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def spawn_listening(cmd):
    """Start an example server that prints `listening on ADDR`; returns it and ADDR."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline().strip()
    assert line.startswith("listening on "), line
    return p, line[len("listening on "):]


def eventually(cond, timeout=20.0):
    end = time.time() + timeout
    while time.time() < end:
        try:
            if cond():
                return True
        except OSError:
            pass
        time.sleep(0.05)
    return False


def record(name, ok, detail):
    RESULTS.append((name, bool(ok)))
    print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)


def stop(procs):
    """SIGINT to each process, then SIGKILL to those still there after 5 s."""
    for p in procs:
        p.send_signal(signal.SIGINT)
    for p in procs:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()


def finish(suite):
    """Print `suite: N passed, N failed` and exit 1 if any failed."""
    passed = sum(1 for _, ok in RESULTS if ok)
    failed = len(RESULTS) - passed
    print(f"{suite}: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
