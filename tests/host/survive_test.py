#!/usr/bin/env python3
"""Channel survival, the fault matrix: the real init (PID 1 of a fresh pid + mount namespace,
explicit --channel=unix:PATH) serves a workload for `neshost serve --reconnect`; the host is
SIGKILLed at each boundary and `neshost serve --resume` on the same state dir takes over.
Asserted per case: the workload was never signalled by the loss, exactly one record, the right
status. With the window 0: today's behaviour (the loss SIGTERMs the workload). Also refused: a
resume of another generation, and a host that stalls past the guest's ack timeout before it dies
(the guest keeps its outcome and redials). No sleeps: every step waits for a line one of the processes
prints, bounded. Every process is reaped, the temp dir removed.
usage: survive_test.py NESHOST_BIN NESINIT_BIN
"""
import contextlib
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import check, finish, need_sandbox, skip  # noqa: E402

NESHOST, NESINIT = sys.argv[1], sys.argv[2]
figures = []

need_sandbox(NESINIT)


class Lines:
    """Every line a pipe gives, read by a thread (the writer never blocks on us)."""

    def __init__(self, pipe, name):
        self.name, self.all, self.q = name, [], queue.Queue()
        self.t = threading.Thread(target=self._run, args=(pipe,), daemon=True)
        self.t.start()

    def _run(self, pipe):
        for line in pipe:
            self.q.put(line.rstrip("\n"))
        self.q.put(None)

    def wait(self, pred, timeout=30):
        """The first new line for which pred holds; None on EOF or after `timeout` s."""
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

    def rest(self, timeout=30):
        self.wait(lambda l: False, timeout)
        return self.all


def event(kind):
    return lambda l: len(l.split(" ")) > 1 and l.split(" ")[1] == kind


class Case:
    """One VM: a workload that blocks on a FIFO until released, and records a SIGTERM."""

    def __init__(self, tmp, reconnect):
        self.tmp = tmp
        self.sock = os.path.join(tmp, "run", "vm.sock")
        self.state = os.path.join(tmp, "state")
        self.fifo = os.path.join(tmp, "go")
        self.mark = os.path.join(tmp, "signalled")
        os.mkfifo(self.fifo)
        script = 'trap "echo TERM >> %s; exit 143" TERM; read x < %s; exit 7' % (self.mark, self.fifo)
        self.desc = os.path.join(tmp, "desc.json")
        with open(self.desc, "w") as f:
            json.dump({"type": "boot", "exec": {"argv": ["/bin/sh", "-c", script], "env": {"PATH": "/usr/bin:/bin"},
                                                "uid": 0, "gid": 0},
                       "geometry": {"width": 1, "height": 1, "fps": 1}, "on_exit": {"terminal": True}}, f)
        self.reconnect = reconnect
        self.procs = []
        self.init = None

    def serve(self, *extra, resume=False, generation=1, env=None):
        argv = [NESHOST, "serve", "--listen", "unix:" + self.sock, "--state", self.state, "--vm", "real",
                "--generation", str(generation), "--ready-timeout", "20", "--stop-timeout", "10"]
        if resume:
            argv += ["--resume"]
        else:
            argv += ["--descriptor", self.desc] + (["--reconnect", str(self.reconnect)] if self.reconnect else [])
        p = subprocess.Popen(argv + list(extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=dict(os.environ, **(env or {})))
        self.procs.append(p)
        out = Lines(p.stdout, "serve")
        threading.Thread(target=p.stderr.read, daemon=True).start()
        check(out.wait(event("listening")) is not None, "serve%s listens" % (" --resume" if resume else ""))
        return p, out

    def start_init(self):
        self.init = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", NESINIT,
                                      "--channel=unix:" + self.sock, "--log=info", "--grace-ms=2000",
                                      "--ack-timeout-ms=3000"],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True)
        self.procs.append(self.init)
        self.log = Lines(self.init.stderr, "init")

    def release(self):
        """Let the workload exit 7: a blocking open of its FIFO returns once the workload opened
        it for reading (in a thread, bounded: on timeout our own reader unblocks it)."""
        done = []

        def opener():
            fd = os.open(self.fifo, os.O_WRONLY)
            os.write(fd, b"go\n")
            os.close(fd)
            done.append(True)

        t = threading.Thread(target=opener, daemon=True)
        t.start()
        t.join(20)
        if not done:
            check(False, "the workload opened its FIFO")
            os.close(os.open(self.fifo, os.O_RDONLY | os.O_NONBLOCK))
            t.join(5)

    def record(self):
        r = subprocess.run([NESHOST, "inspect", "--state", self.state, "real"], capture_output=True, text=True,
                           timeout=30)
        return json.loads(r.stdout) if r.returncode == 0 else {}

    def record_bytes(self):
        try:
            with open(os.path.join(self.state, "real", "outcome.json"), "rb") as f:
                return f.read()
        except OSError:
            return None

    def signalled(self):
        """The init sent the workload its SIGTERM (its log says so; the trap's marker too, when
        the shell got to run it)."""
        if self.init.poll() is None:
            self.init.wait(timeout=30)
        lines = self.log.rest(10)
        return os.path.exists(self.mark) or any(l.startswith("nesinit: term-workload:") for l in lines)

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()


@contextlib.contextmanager
def case(reconnect):
    """A Case in a fresh temp dir; every process it started is reaped and the dir removed."""
    with tempfile.TemporaryDirectory(prefix="nesi-surv-") as tmp:
        c = Case(tmp, reconnect=reconnect)
        try:
            yield c
        finally:
            c.close()


def kill(p):
    p.send_signal(signal.SIGKILL)
    p.wait()


def fault(boundary, name):
    """SIGKILL the first host at `boundary`, take over with --resume; the matrix row."""
    with case(reconnect=20) as c:
        s1, out1 = c.serve(*(["--on-exit", "keep"] if boundary == "recorded" else []))
        c.start_init()
        before = None
        if boundary == "boot":
            check(c.log.wait(lambda l: l.startswith("nesinit: boot: ")) is not None, name + ": boot reached the init")
        elif boundary == "started":
            check(out1.wait(event("started")) is not None, name + ": started")
        else:
            check(out1.wait(event("started")) is not None, name + ": started")
            c.release()
            check(out1.wait(event(boundary)) is not None, name + ": " + boundary)
        kill(s1)
        if boundary == "recorded":
            before = c.record_bytes()
            check(before is not None, name + ": the record is on disk before the kill")
        t0 = time.monotonic()
        s2, out2 = c.serve(resume=True)
        check(out2.wait(event("resumed")) is not None, name + ": the guest resumed")
        figures.append((name, (time.monotonic() - t0) * 1000))
        if boundary in ("boot", "started"):
            c.release()
        lines = out2.rest(60)
        rc = s2.wait(timeout=60)
        rec = c.record()
        check(rc == 7, "%s: resumed serve exit %s, want 7\n%s" % (name, rc, "\n".join(lines)))
        check(rec.get("outcome") == "exited" and rec.get("exit_code") == 7 and rec.get("generation") == 1,
              "%s: record %r" % (name, rec))
        check(not c.signalled(), name + ": the workload was not signalled by the loss")
        if before is not None:
            check(c.record_bytes() == before, name + ": the first record stands unchanged")
        check(any(event("shutdown_sent")(l) for l in lines), name + ": the resumed host acknowledged")
        check(c.init.wait(timeout=30) is not None, name + ": the init powered off")


def before_boot():
    """(a) The host is lost after `ready`, before `boot` (a scripted host that reads `ready` and
    closes): nothing was booted, so there is nothing to survive — the init powers off, and the
    host that takes over records that no session came back (125), once."""
    with case(reconnect=20) as c:
        os.makedirs(os.path.dirname(c.sock), mode=0o700)
        ls = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        ls.bind(c.sock)
        ls.listen(1)
        ls.settimeout(30)
        c.start_init()
        conn, _ = ls.accept()
        conn.settimeout(30)
        got = b""
        while b"\n" not in got:
            chunk = conn.recv(4096)
            if not chunk:
                break
            got += chunk
        check(b'"ready"' in got, "(a): the guest said ready: %r" % got)
        conn.close()
        ls.close()
        os.unlink(c.sock)
        check(c.init.wait(timeout=30) is not None, "(a): the init powered off (no boot, nothing to survive)")
        s2, out2 = c.serve("--ready-timeout", "2", resume=True)
        lines = out2.rest(30)
        rc = s2.wait(timeout=30)
        rec = c.record()
        check(rc == 125 and rec.get("exit_status") == 125 and rec.get("generation") == 1,
              "(a): one record, 125: rc %s %r\n%s" % (rc, rec, "\n".join(lines)))
        check(not c.signalled(), "(a): no workload ran")


def window_zero():
    """--reconnect 0: the loss is today's EOF — the workload gets its SIGTERM, the init powers off."""
    with case(reconnect=0) as c:
        s1, out1 = c.serve()
        c.start_init()
        check(out1.wait(event("started")) is not None, "window 0: started")
        kill(s1)
        check(c.init.wait(timeout=30) is not None, "window 0: the init shut down on EOF")
        check(c.signalled(), "window 0: the workload got SIGTERM from the loss")
        check(c.record_bytes() is None, "window 0: no record (the only host was killed)")


def stale_generation():
    """A host of generation 2 refuses the guest's resume of generation 1; the window then ends."""
    with case(reconnect=2) as c:
        s1, out1 = c.serve()
        c.start_init()
        check(out1.wait(event("started")) is not None, "stale: started")
        kill(s1)
        s2, out2 = c.serve("--ready-timeout", "8", resume=True, generation=2)
        line = out2.wait(event("resume_refused"))
        check(line is not None and "generation 1" in line, "stale: generation 1 refused: %r" % line)
        check(c.init.wait(timeout=30) is not None, "stale: the init shut down after its window")
        check(c.signalled(), "stale: past the window, today's shutdown (SIGTERM)")
        lines = out2.rest(30)
        s2.wait(timeout=30)
        rec = c.record()
        check(rec.get("generation") == 2 and rec.get("exit_status") == 125,
              "stale: generation 2 recorded as a host failure: %r\n%s" % (rec, "\n".join(lines)))


def stalled_host():
    """(f) The host stalls past the guest's ack timeout, then dies: its record write stops (the
    test-only NESHOST_TEST_RECORD_STOP stops the whole process there, before the record is
    durable), so the outcome is sent, never acknowledged, and no loss is seen. The guest must not
    power off at its ack timeout (a host taking over would then record `no_ready` 125 for a
    workload that exited 7): within its window it treats the missing ack as a lost channel and
    redials. The stalled host is SIGKILLed; `serve --resume` gets the outcome and records 7, once."""
    name = "(f) host stalled past the ack timeout, then SIGKILLed"
    with case(reconnect=20) as c:
        s1, out1 = c.serve(env={"NESHOST_TEST_RECORD_STOP": "temp_written"})
        c.start_init()
        check(out1.wait(event("started")) is not None, name + ": started")
        c.release()
        check(out1.wait(event("outcome")) is not None, name + ": the first host has the outcome")
        # The record write stopped the first host: the guest's ack timeout (3 s) passes.
        line = c.log.wait(lambda l: "no acknowledgement within 3000 ms" in l, timeout=60)
        check(line is not None, name + ": the guest's ack timed out")
        line = c.log.wait(lambda l: l.startswith("nesinit: channel: warning: lost; redialling"), timeout=30)
        check(line is not None, name + ": the ack timeout was taken as a lost channel (redialling), not a power-off")
        check(c.init.poll() is None, name + ": the init is still up")
        kill(s1)
        check(c.record_bytes() is None, name + ": nothing durable from the stalled host")
        s2, out2 = c.serve(resume=True)
        check(out2.wait(event("resumed")) is not None, name + ": the guest resumed with the new host")
        lines = out2.rest(60)
        rc = s2.wait(timeout=60)
        rec = c.record()
        check(rc == 7, "%s: resumed serve exit %s, want 7\n%s" % (name, rc, "\n".join(lines)))
        check(rec.get("outcome") == "exited" and rec.get("exit_code") == 7 and rec.get("generation") == 1,
              "%s: record %r" % (name, rec))
        check(sum(1 for l in lines if event("recorded")(l)) == 1, name + ": recorded once")
        check(not any(event("already_recorded")(l) for l in lines), name + ": no earlier record to defer to")
        check(any(event("shutdown_sent")(l) for l in lines), name + ": the new host acknowledged")
        check(not c.signalled(), name + ": the workload was not signalled")
        check(c.init.wait(timeout=30) is not None, name + ": the init powered off after the ack")


def main():
    stalled_host()
    before_boot()
    for boundary, name in (("boot", "(b) after boot"), ("started", "(c) after started"),
                           ("outcome", "(d) after workload_exited, record not yet durable"),
                           ("recorded", "(e) after the record, before the ack")):
        fault(boundary, name)
    window_zero()
    stale_generation()


main()
for name, ms in figures:
    print("resume %-55s %.0f ms from starting the new host to `resumed`" % (name, ms))
finish()
