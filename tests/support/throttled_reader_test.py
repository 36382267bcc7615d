#!/usr/bin/env python3
"""The throttled reader the issue-24 cases rely on (tests/support/throttled_reader.py): it counts
and hashes every byte, pauses after exactly K bytes until resumed, ends at a pty's EIO, and takes
no more than its rate allows (a lower bound on time, which no load can break). No VM; a second."""
import hashlib
import os
import pty
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from throttled_reader import ThrottledReader  # noqa: E402


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)


def pipe_paced_and_paused():
    data = os.urandom(384 << 10)
    r, w = os.pipe()

    def write():
        os.write(w, data)
        os.close(w)
    t = threading.Thread(target=write)
    t.start()
    rate, k = 1 << 20, 100003
    t0 = time.monotonic()
    rd = ThrottledReader(r, rate, pause_at=k, keep=True).start()
    check(rd.wait_paused(30), f"never paused: {rd.count}")
    check(rd.count == k and bytes(rd.data) == data[:k], f"paused at {rd.count}, want exactly {k}")
    rd.resume()
    check(rd.join(30), "not at EOF after 30 s")
    elapsed = time.monotonic() - t0
    t.join()
    os.close(r)
    check(rd.eof and rd.error is None, f"eof {rd.eof} error {rd.error}")
    check(rd.count == len(data) and rd.hexdigest() == hashlib.sha256(data).hexdigest(), "bytes differ")
    # Tokens start at one burst and accrue at `rate` (none while paused): no faster than that.
    floor = (len(data) - rd.burst) / rate
    check(elapsed >= floor, f"{len(data)} bytes in {elapsed:.3f} s: faster than {rate} B/s allows ({floor:.3f} s)")


def pty_eof():
    master, slave = pty.openpty()
    os.write(slave, b"x" * 1000)
    os.close(slave)
    rd = ThrottledReader(master, 64 << 10).start()
    check(rd.join(30) and rd.eof and rd.error is None, f"pty: eof {rd.eof} error {rd.error}")
    os.close(master)
    check(rd.count == 1000, f"pty: {rd.count} bytes, want 1000")


def as_program():
    data = os.urandom(100000)
    prog = os.path.join(os.path.dirname(os.path.abspath(__file__)), "throttled_reader.py")
    r = subprocess.run([sys.executable, prog, "256k"], input=data, capture_output=True, timeout=60)
    check(r.returncode == 0 and r.stdout.decode().split() == [str(len(data)), hashlib.sha256(data).hexdigest()],
          f"as a program: {r.returncode} {r.stdout!r} {r.stderr!r}")


pipe_paced_and_paused()
pty_eof()
as_program()
print("ok throttled_reader")
