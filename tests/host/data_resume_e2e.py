#!/usr/bin/env python3
"""Data channel resume over real processes: the real init (PID 1 of a fresh pid + mount namespace,
explicit --channel and --data-channel Unix sockets) serves a workload for `neshost serve
--reconnect --data-listen`; the host is SIGKILLed while output flows and `neshost serve --resume`
on the same state dir takes over. Asserted: workload.log holds every byte exactly once (numbered
lines; a 64 MiB random stream compared by SHA-256; stdin fed from a file and echoed back across a
kill: no byte twice, none lost), the outcome recorded once, and no gap reported. No sleeps: every
step waits for a line a process prints or for the log to grow, bounded. Every process is reaped,
the temp dir removed.
usage: data_resume_e2e.py NESHOST_BIN NESINIT_BIN [--bench N]
  --bench N: instead of the tests, time N host kills (SIGKILL -> the replacement's first new
  byte in workload.log) and print a Markdown row with the median (bench P14, scripts/bench.sh).
"""
import contextlib
import hashlib
import json
import os
import queue
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import check, finish, need_sandbox  # noqa: E402

NESHOST, NESINIT = sys.argv[1], sys.argv[2]
BENCH = int(sys.argv[sys.argv.index("--bench") + 1]) if "--bench" in sys.argv else 0

need_sandbox(NESINIT)


class Lines:
    """Every line a pipe gives, read by a thread (the writer never blocks on us)."""

    def __init__(self, pipe):
        self.all, self.q = [], queue.Queue()
        threading.Thread(target=self._run, args=(pipe,), daemon=True).start()

    def _run(self, pipe):
        for line in pipe:
            self.q.put(line.rstrip("\n"))
        self.q.put(None)

    def wait(self, pred, timeout=60):
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return None
            try:
                line = self.q.get(timeout=left)
            except queue.Empty:
                return None
            if line is None:
                self.q.put(None)
                return None
            self.all.append(line)
            if pred(line):
                return line

    def rest(self, timeout=60):
        self.wait(lambda l: False, timeout)
        return self.all


def event(kind):
    return lambda l: len(l.split(" ")) > 1 and l.split(" ")[1] == kind


def read_log(path):
    """workload.log (and rotated files, oldest first) back to each stream's bytes; gap records."""
    out, err, gaps = bytearray(), bytearray(), []
    files = [path]
    i = 1
    while os.path.exists("%s.%d" % (path, i)):
        files.insert(0, "%s.%d" % (path, i))
        i += 1
    for f in files:
        with open(f, "rb") as fh:
            data = fh.read()
        for rec in data.split(b"\n")[:-1]:
            parts = rec.split(b" ", 3)
            content = parts[3] if len(parts) > 3 else b""
            if content.startswith(b"[neshost: "):
                gaps.append(content.decode(errors="replace"))
                continue
            dst = out if parts[1] == b"stdout" else err
            dst += content
            if parts[2].split(b":")[0] == b"F":
                dst += b"\n"
    return bytes(out), bytes(err), gaps


class Case:
    def __init__(self, tmp, script, stdin_file=None):
        self.tmp = tmp
        self.sock = os.path.join(tmp, "run", "vm.sock")
        self.data = os.path.join(tmp, "run", "data.sock")
        self.state = os.path.join(tmp, "state")
        self.log = os.path.join(self.state, "real", "workload.log")
        self.stdin_file = stdin_file
        self.desc = os.path.join(tmp, "desc.json")
        with open(self.desc, "w") as f:
            json.dump({"type": "boot", "exec": {"argv": ["/bin/sh", "-c", script],
                                                "env": {"PATH": "/usr/bin:/bin"}, "uid": 0, "gid": 0},
                       "geometry": {"width": 1, "height": 1, "fps": 1}, "on_exit": {"terminal": True},
                       "stdio": {"stdin": stdin_file is not None}}, f)
        self.procs = []
        self.init = None

    def serve(self, resume=False):
        argv = [NESHOST, "serve", "--listen", "unix:" + self.sock, "--state", self.state, "--vm", "real",
                "--generation", "1", "--ready-timeout", "30", "--stop-timeout", "20",
                "--data-listen", "unix:" + self.data, "--descriptor", self.desc,
                "--log-max-size", str(1 << 30)]
        argv += ["--resume"] if resume else ["--reconnect", "30"]
        if self.stdin_file:
            argv += ["--stdin", self.stdin_file]
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.procs.append(p)
        out = Lines(p.stdout)
        threading.Thread(target=p.stderr.read, daemon=True).start()
        check(out.wait(event("listening")) is not None, "serve%s listens" % (" --resume" if resume else ""))
        return p, out

    def start_init(self):
        self.init = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", NESINIT,
                                      "--channel=unix:" + self.sock, "--data-channel=unix:" + self.data,
                                      "--log=info", "--grace-ms=2000", "--ack-timeout-ms=3000"],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True)
        self.procs.append(self.init)
        self.ilog = Lines(self.init.stderr)

    def log_size(self):
        try:
            return os.path.getsize(self.log)
        except OSError:
            return 0

    def wait_log(self, size, timeout=60):
        """The log grew past `size` bytes (a condition, polled; bounded)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.log_size() >= size:
                return True
            time.sleep(0.005)
        return False

    def record(self):
        r = subprocess.run([NESHOST, "inspect", "--state", self.state, "real"], capture_output=True, text=True,
                           timeout=30)
        return json.loads(r.stdout) if r.returncode == 0 else {}

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()


@contextlib.contextmanager
def case(script, stdin_file=None, tmp_prefix="nesi-dres-"):
    with tempfile.TemporaryDirectory(prefix=tmp_prefix) as tmp:
        c = Case(tmp, script, stdin_file)
        try:
            yield c
        finally:
            c.close()


def kill(p):
    p.send_signal(signal.SIGKILL)
    p.wait()


def across_kills(name, script, expect_out, kill_at, stdin_file=None, kills=1):
    """Serve, SIGKILL the host each time the log passes the next of `kill_at` bytes, resume;
    then the log must hold expect_out exactly once, with no gap, and the outcome 0 recorded once."""
    with case(script, stdin_file) as c:
        s, out = c.serve()
        c.start_init()
        check(out.wait(event("data_connected")) is not None, name + ": the data channel connected")
        for k in range(kills):
            check(c.wait_log(kill_at[k]), "%s: the log reached %d bytes before kill %d" % (name, kill_at[k], k + 1))
            kill(s)
            s, out = c.serve(resume=True)
            # Both channels come back, in either order.
            seen = set()
            out.wait(lambda l: (seen.add(l.split(" ")[1]) if len(l.split(" ")) > 1 else None) or
                     {"resumed", "data_resumed"} <= seen)
            check({"resumed", "data_resumed"} <= seen, "%s: the guest resumed both channels after kill %d" % (name, k + 1))
        lines = out.rest(120)
        rc = s.wait(timeout=120)
        check(rc == 0, "%s: resumed serve exit %s, want 0\n%s" % (name, rc, "\n".join(lines[-30:])))
        got, err, gaps = read_log(c.log)
        check(gaps == [], "%s: no gap recorded: %r" % (name, gaps[:3]))
        check(len(got) == len(expect_out), "%s: %d bytes of stdout in the log, want %d" % (name, len(got), len(expect_out)))
        check(hashlib.sha256(got).hexdigest() == hashlib.sha256(expect_out).hexdigest(),
              name + ": stdout in the log is byte-exact (SHA-256)")
        rec = c.record()
        check(rec.get("outcome") == "exited" and rec.get("exit_code") == 0, "%s: record %r" % (name, rec))
        check(not any("output_lost" in l or "output_truncated" in l for l in lines),
              name + ": nothing lost or truncated")
        return got


def numbered(n):
    return "".join("line %d\n" % i for i in range(1, n + 1)).encode()


# Bench: time from a host's death to output flowing again, median of BENCH.
if BENCH:
    times = []
    with case("while :; do echo tick; done") as c:
        s, out = c.serve()
        c.start_init()
        check(out.wait(event("data_connected")) is not None, "bench: connected")
        for k in range(BENCH):
            c.wait_log(c.log_size() + 4096)
            kill(s)
            t0 = time.monotonic()
            s, out = c.serve(resume=True)
            size = c.log_size()
            check(c.wait_log(size + 1, timeout=60), "bench: output flows again after kill %d" % (k + 1))
            times.append((time.monotonic() - t0) * 1000)
        s.send_signal(signal.SIGTERM)
        s.wait(timeout=60)
    print("| P14 data channel resume: a host SIGKILLed while the workload writes -> its replacement "
          "(`serve --resume`) logging the workload's output again, sandbox (median of %d; min %.0f, max %.0f; "
          "%s, load %.1f) | ms | %.0f | - | - | - |" %
          (len(times), min(times), max(times), time.strftime("%Y-%m-%d %H:%M"), os.getloadavg()[0],
           statistics.median(times)))
    sys.exit(0)


# 1. Numbered lines, the host killed while the workload writes.
N = 400000  # about 5.3 MB: more than the ring, the buffer and the pipe hold together
got = across_kills("numbered lines", "seq -f 'line %%.0f' 1 %d" % N, numbered(N), [1 << 20])
lines = got.decode().splitlines()
check(lines == ["line %d" % i for i in range(1, N + 1)], "numbered lines: each exactly once, in order")

# 2. The same, the host killed twice in one run.
across_kills("numbered lines, two kills", "seq -f 'line %%.0f' 1 %d" % N, numbered(N), [1 << 20, 3 << 20], kills=2)

# 3. 64 MiB of random bytes, SHA-256 across a kill.
with tempfile.NamedTemporaryFile(prefix="nesi-dres-64m-", delete=False) as f:
    blob = os.urandom(64 << 20)
    f.write(blob)
    big = f.name
try:
    os.chmod(big, 0o644)
    across_kills("64 MiB", "cat " + big, blob, [16 << 20])
finally:
    os.unlink(big)

# 4. stdin fed from a file, echoed by `cat`, across a kill: none twice, none lost.
with tempfile.NamedTemporaryFile(prefix="nesi-dres-in-", delete=False) as f:
    src = numbered(300000)
    f.write(src)
    inp = f.name
try:
    across_kills("stdin echoed", "cat", src, [1 << 20], stdin_file=inp)
finally:
    os.unlink(inp)

finish()
