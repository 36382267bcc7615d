#!/usr/bin/env python3
"""Re-adoption end to end in sandbox mode (docs/host.md "Re-adoption"): a detached VM's VMM (here
`unshare` with the real init as PID 1 of a fresh pid + mount namespace, its channel a Unix socket)
outlives its SIGKILLed monitor; the next neshost command (wait, inspect, ps, stop, ...) starts a
replacement monitor (`neshost monitor`), which takes the session over through the resume path and
records the outcome once.

Cases: a workload writing numbered lines, the monitor killed mid-stream, `wait` re-adopts and gets
the real exit; killed twice in one run; the workload exiting while no monitor lives (its outcome
re-sent to the replacement); three commands racing start exactly one replacement; an
orphaned VM stopped (`neshost stop` adopts, then stops); the monitor and the VMM both killed
reconciles as failed (as before). Figures: time from the monitor's SIGKILL to the replacement
having the lifecycle channel back (the guest's resumed `ready`), printed, never asserted.

This process is a child subreaper: every monitor, replacement and VMM comes back to us; after each
case every descendant must have exited (reaped, bounded), the runtime dir ($TMPDIR) be empty and no
control socket be left. No sleeps: workloads block on FIFOs the test opens, files are awaited with
inotify, commands block on their own events.
Exit 77 (meson: skipped) when the init or namespaces are unavailable.
usage: adopt_test.py NESHOST_BIN NESINIT_BIN [CASE...]
"""
import calendar
import ctypes
import json
import os
import re
import select
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import check, finish, need_sandbox, skip  # noqa: E402

NESHOST, NESINIT = sys.argv[1], sys.argv[2]
need_sandbox(NESINIT)
libc = ctypes.CDLL(None, use_errno=True)
PR_SET_CHILD_SUBREAPER = 36
if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
    skip("prctl(PR_SET_CHILD_SUBREAPER) failed")
IN_MODIFY, IN_CLOSE_WRITE, IN_MOVED_TO, IN_CREATE = 0x2, 0x8, 0x80, 0x100
figures = []


def on_alarm(sig, frame):
    raise InterruptedError()


signal.signal(signal.SIGALRM, on_alarm)


def bounded(fn, what, secs=30):
    """fn() with a SIGALRM bound (blocking FIFO opens have no timeout of their own)."""
    signal.alarm(secs)
    try:
        return fn()
    except InterruptedError:
        check(False, "%s: not done within %d s" % (what, secs))
        return None
    finally:
        signal.alarm(0)


def await_file(directory, path, pred, timeout=30):
    """Waits (inotify on `directory`, bounded) until pred(contents of path) holds; returns it."""
    fd = libc.inotify_init1(os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        libc.inotify_add_watch(fd, directory.encode(), IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE)
        end = time.monotonic() + timeout
        while True:
            try:
                with open(path, errors="replace") as f:
                    text = f.read()
            except FileNotFoundError:
                text = None
            if text is not None and pred(text):
                return text
            left = end - time.monotonic()
            if left <= 0:
                return None
            select.select([fd], [], [], left)
            try:
                os.read(fd, 65536)
            except BlockingIOError:
                pass
    finally:
        os.close(fd)


def alive(pid):
    """The process runs (not a zombie)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


class Case:
    """One temp dir: state dir, runtime dir ($TMPDIR of neshost), FIFOs. Cleaned up by finish()."""

    def __init__(self, name):
        self.name = name
        self.tmp = tempfile.mkdtemp(prefix="nesa-")
        self.state = os.path.join(self.tmp, "state")
        self.rt = os.path.join(self.tmp, "rt")
        os.makedirs(self.rt)
        self.env = dict(os.environ, TMPDIR=self.rt, NESHOST_NESINIT=NESINIT)
        self.procs = []

    def nh(self, *args, timeout=60):
        r = subprocess.run([NESHOST] + list(args), capture_output=True, text=True, timeout=timeout, env=self.env)
        return r.returncode, r.stdout, r.stderr

    def spawn(self, *args):
        p = subprocess.Popen([NESHOST] + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=self.env)
        self.procs.append(p)
        return p

    def run_d(self, vm, *argv):
        return self.nh("run", "-d", "--sandbox", "--state", self.state, "--vm", vm, "--grace", "2",
                       "--ready-timeout", "20", "--", *argv)

    def fifo(self, name):
        p = os.path.join(self.tmp, name)
        os.mkfifo(p)
        return p

    def release(self, fifo, data=b"go\n"):
        def w():
            with open(fifo, "wb") as f:
                f.write(data)
        return bounded(w, "release " + fifo)

    def vm_file(self, vm, name):
        return os.path.join(self.state, vm, name)

    def monitor_json(self, vm):
        with open(self.vm_file(vm, "monitor.json")) as f:
            return json.load(f)

    def vmm_json(self, vm):
        with open(self.vm_file(vm, "vmm.json")) as f:
            return json.load(f)

    def inspect(self, vm):
        rc, out, err = self.nh("inspect", "--state", self.state, vm)
        return (json.loads(out) if rc == 0 else {"rc": rc}), err

    def log_lines(self, vm):
        rc, out, _ = self.nh("logs", "--state", self.state, vm)
        return out.splitlines() if rc == 0 else None

    def await_log(self, vm, line):
        """workload.log holds `line` (CRI format: the payload after 3 fields)."""
        return await_file(os.path.join(self.state, vm), self.vm_file(vm, "workload.log"),
                          lambda t: any(l.split(" ", 3)[-1] == line for l in t.splitlines()))

    def kill_monitor(self, vm):
        """SIGKILL to the VM's current monitor (read from monitor.json, no neshost command: that
        would adopt it). Returns the time of the kill."""
        pid = self.monitor_json(vm)["pid"]
        os.kill(pid, signal.SIGKILL)
        t = time.monotonic()
        # Reaped (every monitor comes back to this subreaper): wait(2) reports a thread-group
        # leader only once all its threads are gone, so its fds (sockets, adopt.lock) are closed.
        # Its leader shows as a zombie earlier, while other threads still exit: what a command
        # racing with the kill meets (the product copes: a replacement waits for adopt.lock).
        try:
            bounded(lambda: os.waitpid(pid, 0), "monitor %d exits" % pid, 10)
        except ChildProcessError:
            bounded(lambda: [None for _ in iter(lambda: alive(pid), False)], "monitor %d exits" % pid, 10)
        return t

    def finish(self):
        """Every descendant exited and reaped (bounded), no runtime dir or socket left; remove all.
        A VM a failed case left running (a workload blocked on a FIFO) is ended through its state
        dir first (`rm -f`: adopted if orphaned, then stopped), never by a broad kill."""
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.communicate()
        for vm in (os.listdir(self.state) if os.path.isdir(self.state) else []):
            st, _ = self.inspect(vm)
            if st.get("status") == "running":
                check(False, "%s: VM %s still running at the end: ended with rm -f" % (self.name, vm))
                self.nh("rm", "-f", "--state", self.state, vm)
        signal.alarm(60)
        try:
            while True:
                os.waitpid(-1, 0)
        except ChildProcessError:
            pass
        except InterruptedError:
            check(False, "%s: a descendant did not exit within 60 s" % self.name)
        finally:
            signal.alarm(0)
        check(os.listdir(self.rt) == [], "%s: runtime dir left: %s" % (self.name, os.listdir(self.rt)))
        for vm in (os.listdir(self.state) if os.path.isdir(self.state) else []):
            check(not os.path.exists(os.path.join(self.state, vm, "control.sock")),
                  "%s: control socket of %s left" % (self.name, vm))
        shutil.rmtree(self.tmp, ignore_errors=True)


def numbered(go1, go2, code):
    """A workload: lines 1..5, waits for go1, lines 6..10, waits for go2, exits `code`."""
    return ["/bin/sh", "-c", "i=1; while [ $i -le 5 ]; do echo line $i; i=$((i+1)); done; read x < %s; "
            "while [ $i -le 10 ]; do echo line $i; i=$((i+1)); done; read x < %s; exit %d" % (go1, go2, code)]


def taken_over(c, vm):
    with open(c.vm_file(vm, "monitor.log")) as f:
        return f.read().count("taken over from the monitor gone")


def exit_ok(rc, out, err, code):
    """wait's answer for a workload that exited `code`: exactly that code (output written while no
    monitor served the VM is resumed: nothing lost, so no 125)."""
    return (rc, out.strip()) == (code, str(code))


def check_lines_once(c, vm, must):
    """Every line of the workload at most once; those in `must` present."""
    lines = c.log_lines(vm) or []
    seen = [l for l in lines if l.startswith("line ")]
    check(len(seen) == len(set(seen)), "%s: a line twice in the log: %s" % (c.name, seen))
    missing = [n for n in must if "line %d" % n not in seen]
    check(not missing, "%s: lines %s in the log: %s" % (c.name, missing, seen))
    if missing or len(seen) != len(set(seen)):
        # What the failure needs to be understood: the raw log, its positions, the monitors' words.
        for name in ("workload.log", "workload.log.pos", "monitor.log", "console.log"):
            try:
                with open(c.vm_file(vm, name), errors="replace") as f:
                    sys.stderr.write("--- %s:\n%s\n" % (name, f.read()[-6000:]))
            except OSError as e:
                sys.stderr.write("--- %s: %s\n" % (name, e))
    return seen


def resumed_after(c, vm, t0, nth):
    """Waits for the nth 'resumed its session' line in monitor.log; the seconds since t0."""
    got = await_file(os.path.join(c.state, vm), c.vm_file(vm, "monitor.log"),
                     lambda t: t.count("the guest resumed its session") >= nth)
    check(got is not None, "%s: the guest resumed its session with the replacement (#%d)" % (c.name, nth))
    return time.monotonic() - t0 if got else None


def case_kill_then_wait():
    """The monitor SIGKILLed mid-stream: the VM runs on, `wait` re-adopts and gets the exit (7)."""
    c = Case("wait")
    try:
        go1, go2 = c.fifo("go1"), c.fifo("go2")
        rc, out, err = c.run_d("w", *numbered(go1, go2, 7))
        check(rc == 0 and out.strip() == "w", "run -d: %d %r %r" % (rc, out, err))
        check(c.await_log("w", "line 5") is not None, "lines 1-5 in the log before the kill")
        vmm = c.vmm_json("w")
        check(vmm.get("vmm") and vmm.get("sandbox") is True and vmm.get("reconnect_ms") == 300000,
              "vmm.json names the VMM, sandbox, the window: %s" % vmm)
        vmm_pid = vmm["vmm"]["pid"]
        old = c.monitor_json("w")["pid"]
        t0 = c.kill_monitor("w")
        check(alive(vmm_pid), "the VMM outlives its monitor")
        # The workload is alive and reading (the FIFO has a reader): it goes on with lines 6-10.
        c.release(go1)
        w = c.spawn("wait", "--state", c.state, "w")
        secs = resumed_after(c, "w", t0, 1)
        if secs is not None:
            figures.append(secs)
        new = c.monitor_json("w")
        check(new["pid"] != old and alive(new["pid"]) and new["generation"] == 1,
              "a replacement monitor of the same generation: %s (old %d)" % (new, old))
        st, _ = c.inspect("w")
        check(st.get("status") == "running" and st.get("monitor_alive") is True and st.get("vmm_pid") == vmm_pid,
              "running under the replacement: %s" % st)
        c.release(go2)
        out, err = w.communicate(timeout=60)
        check(exit_ok(w.returncode, out, err, 7), "wait re-adopts and gets 7: %d %r %r" % (w.returncode, out, err))
        check("adopted by a new monitor" in err or "taken over" in err or err == "",
              "wait says it adopted the VM: %r" % err)
        st, _ = c.inspect("w")
        check((st.get("status"), st.get("outcome"), st.get("exit_code"), st.get("generation")) ==
              ("exited", "exited", 7, 1), "inspect: %s" % st)
        check(taken_over(c, "w") == 1, "exactly one replacement")
        seen = check_lines_once(c, "w", range(1, 11))
        check(len(seen) == 10, "%s: lines 1-10 once each: %s" % (c.name, seen))
        check(not alive(vmm_pid), "the VMM is gone at the end")
    finally:
        c.finish()


def case_killed_twice():
    """The monitor killed, adopted (by inspect), the replacement killed too, adopted again (by kill)."""
    c = Case("twice")
    try:
        go1, go2 = c.fifo("go1"), c.fifo("go2")
        rc, _, err = c.run_d("t", *numbered(go1, go2, 3))
        check(rc == 0, "run -d: %r" % err)
        check(c.await_log("t", "line 5") is not None, "lines 1-5 logged")
        t0 = c.kill_monitor("t")
        st, err = c.inspect("t")
        check(st.get("status") == "running" and st.get("monitor_alive") is True, "inspect adopts: %s %r" % (st, err))
        secs = resumed_after(c, "t", t0, 1)
        if secs is not None:
            figures.append(secs)
        c.release(go1)
        t0 = c.kill_monitor("t")
        # `kill` adopts it first and returns only once the guest has resumed with the replacement,
        # so the signal (a harmless CONT) finds a booted session.
        rc, _, err = c.nh("kill", "--state", c.state, "-s", "CONT", "t")
        check(rc == 0, "kill right after the monitor's death: %d %r" % (rc, err))
        w = c.spawn("wait", "--state", c.state, "t")
        secs = resumed_after(c, "t", t0, 2)
        if secs is not None:
            figures.append(secs)
        c.release(go2)
        out, err = w.communicate(timeout=60)
        check(exit_ok(w.returncode, out, err, 3), "wait after the second kill: %d %r %r" % (w.returncode, out, err))
        check(taken_over(c, "t") == 2, "two replacements, one per kill")
        check(len(check_lines_once(c, "t", range(1, 11))) == 10, "lines 1-10 once each across two kills")
        st, _ = c.inspect("t")
        check((st.get("status"), st.get("exit_code"), st.get("generation")) == ("exited", 3, 1),
              "exited 3, recorded once: %s" % st)
    finally:
        c.finish()


def case_exit_while_unmonitored():
    """The workload exits while no monitor lives: the guest keeps its outcome (unacknowledged),
    re-sends it to the replacement after its resumed `ready`; recorded once, the real status (9)."""
    c = Case("unmonitored")
    try:
        go = c.fifo("go")
        rc, _, err = c.run_d("u", "/bin/sh", "-c", "echo before; read x < %s; exit 9" % go)
        check(rc == 0, "run -d: %r" % err)
        check(c.await_log("u", "before") is not None, "its first line logged")
        c.kill_monitor("u")
        c.release(go)  # it exits now, with nobody to tell
        check(not os.path.exists(c.vm_file("u", "outcome.json")), "nothing recorded without a monitor")
        rc, out, err = c.nh("wait", "--state", c.state, "u")
        check(exit_ok(rc, out, err, 9), "wait: the outcome re-sent to the replacement: %d %r %r" % (rc, out, err))
        st, _ = c.inspect("u")
        check((st.get("status"), st.get("exit_code"), st.get("generation")) == ("exited", 9, 1), "inspect: %s" % st)
        with open(c.vm_file("u", "monitor.log")) as f:
            log = f.read()
        check("outcome_pending=true" in log or "started=true" in log, "resumed with its outcome pending: %r" % log[-600:])
    finally:
        c.finish()


def case_race_then_stop():
    """Three commands find the VM orphaned at once: exactly one replacement; then `stop` ends it."""
    c = Case("race")
    try:
        go = c.fifo("go")
        rc, _, err = c.run_d("r", "/bin/sh", "-c", "echo up; read x < %s; exit 0" % go)
        check(rc == 0, "run -d: %r" % err)
        vmm_pid = c.vmm_json("r")["vmm"]["pid"]
        c.kill_monitor("r")
        ps = [c.spawn("ps", "--state", c.state), c.spawn("inspect", "--state", c.state, "r"),
              c.spawn("ps", "--state", c.state)]
        for p in ps:
            out, err = p.communicate(timeout=60)
            check(p.returncode == 0, "racing command: %d %r" % (p.returncode, err))
            if "STATUS" in out:
                row = [l.split() for l in out.splitlines()[1:] if l.split()[:1] == ["r"]]
                check(row and row[0][2] == "running", "ps shows it running: %r" % out)
        check(taken_over(c, "r") == 1, "exactly one replacement monitor")
        with open(c.vm_file("r", "monitor.log")) as f:
            log = f.read()
        losers = log.count("another replacement monitor") + log.count("nothing to take over")
        print("race: 3 commands at once, 1 replacement took over, %d stood down (the rest found it adopted)" % losers, flush=True)
        rc, _, err = c.nh("stop", "--state", c.state, "-t", "5", "r")
        check(rc == 0, "stop of the adopted VM: %d %r" % (rc, err))
        st, _ = c.inspect("r")
        check(st.get("status") == "stopped", "stopped: %s" % st)
        check(not alive(vmm_pid), "the VMM is gone after stop")
    finally:
        c.finish()


def case_monitor_and_vmm_killed():
    """Both the monitor and its VMM SIGKILLed: failed as before (nothing to adopt), no hang."""
    c = Case("both")
    try:
        go = c.fifo("go")
        rc, _, err = c.run_d("b", "/bin/sh", "-c", "read x < %s; exit 0" % go)
        check(rc == 0, "run -d: %r" % err)
        vmm_pid = c.vmm_json("b")["vmm"]["pid"]
        c.kill_monitor("b")
        os.kill(vmm_pid, signal.SIGKILL)
        bounded(lambda: [None for _ in iter(lambda: alive(vmm_pid), False)], "VMM exits", 10)
        rc, out, err = c.nh("wait", "--state", c.state, "--timeout", "30", "b")
        check(rc == 125 and "without recording an outcome" in err, "wait: %d %r %r" % (rc, out, err))
        st, _ = c.inspect("b")
        check(st.get("status") == "failed" and st.get("vmm_alive") is False, "failed: %s" % st)
        rc, _, err = c.nh("rm", "--state", c.state, "b")
        check(rc == 0, "rm: %d %r" % (rc, err))
    finally:
        c.finish()


def case_vmm_killed_monitor_alive():
    """The VMM SIGKILLed while its monitor lives: a failed outcome with a reason, no hang."""
    c = Case("vmm")
    try:
        go = c.fifo("go")
        rc, _, err = c.run_d("q", "/bin/sh", "-c", "read x < %s; exit 0" % go)
        check(rc == 0, "run -d: %r" % err)
        os.kill(c.vmm_json("q")["vmm"]["pid"], signal.SIGKILL)
        rc, out, err = c.nh("wait", "--state", c.state, "--timeout", "60", "q")
        st, _ = c.inspect("q")
        check(rc == 125 and st.get("status") == "failed" and st.get("outcome") is not None and st.get("reason"),
              "failed with a recorded reason: %d %s" % (rc, st))
    finally:
        c.finish()


def boottime_ns():
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME)


def wait_json(c, vm, *extra):
    """`wait --format json` of `vm`: (rc, object or None, stderr)."""
    rc, out, err = c.nh("wait", "--state", c.state, "--format", "json", *extra, vm)
    try:
        return rc, json.loads(out), err
    except ValueError:
        return rc, None, err


def case_timeout_pending():
    """Kill point: the monitor SIGKILLed with --timeout pending. The replacement re-arms the deadline
    the first monitor recorded in vmm.json (never a fresh one): the workload, blocked for good, ends
    at it with 124 / outcome timeout, and the record's started_at is the VM's start as vmm.json
    recorded it, not the replacement's time. Lost: nothing."""
    c = Case("timeout")
    try:
        never = c.fifo("never")  # nobody ever writes it: only the limit ends the workload
        rc, _, err = c.nh("run", "-d", "--sandbox", "--state", c.state, "--vm", "to", "--grace", "2",
                          "--ready-timeout", "20", "--timeout", "12", "--", "/bin/sh", "-c",
                          "echo up; read x < %s; exit 0" % never)
        check(rc == 0, "run -d --timeout: %d %r" % (rc, err))
        check(c.await_log("to", "up") is not None, "the workload started")
        vmm = c.vmm_json("to")
        check(vmm.get("timeout_ms") == 12000 and vmm.get("deadline_boottime_ns") and vmm.get("started_at"),
              "vmm.json records the VM's start, the limit and its deadline: %s" % vmm)
        c.kill_monitor("to")
        killed_at = boottime_ns()
        # The precondition of this kill point: the deadline was still ahead when the monitor died.
        check(vmm.get("deadline_boottime_ns", 0) > killed_at,
              "the monitor was killed before its deadline (%s > %d)" % (vmm.get("deadline_boottime_ns"), killed_at))
        kill_wall = time.time()
        rc, st, err = wait_json(c, "to", "--timeout", "60")
        check(rc == 124 and st and st.get("outcome") == "timeout" and st.get("exit_status") == 124,
              "the replacement ends it at the recorded deadline: 124, timeout: %d %s %r" % (rc, st, err))
        check(st and st.get("started_at") == vmm.get("started_at"),
              "the record's started_at is the VM's start (vmm.json %s), not the replacement's: %s"
              % (vmm.get("started_at"), st and st.get("started_at")))
        if st and st.get("started_at"):
            started = calendar.timegm(time.strptime(st["started_at"][:19], "%Y-%m-%dT%H:%M:%S"))  # UTC
            check(started < kill_wall, "started_at precedes the monitor's kill")
        with open(c.vm_file("to", "monitor.log")) as f:
            log = f.read()
        m = re.search(r"its --timeout \(12000 ms\) goes on: (\d+) ms left", log)
        check(m is not None, "the replacement says it re-armed the limit: %r" % log[-800:])
        # What is left of the recorded deadline, not a fresh limit: the replacement took over after
        # the kill, so at most what was left then.
        left_at_kill_ms = (vmm.get("deadline_boottime_ns", 0) - killed_at) // 1000000
        check(m is not None and int(m.group(1)) <= left_at_kill_ms < 12000,
              "the recorded deadline re-armed, not a new one: %s ms left, %d at the kill"
              % (m and m.group(1), left_at_kill_ms))
        check(taken_over(c, "to") == 1, "one replacement")
    finally:
        c.finish()


def case_wait_json():
    """`wait --format json` tells exit(137) from SIGKILL (plain `wait` prints 137 for both)."""
    c = Case("waitjson")
    try:
        rc, _, err = c.run_d("code", "/bin/sh", "-c", "exit 137")
        check(rc == 0, "run -d (exit 137): %r" % err)
        rc, _, err = c.run_d("sig", "/bin/sh", "-c", "kill -KILL $$")
        check(rc == 0, "run -d (SIGKILL): %r" % err)
        for vm in ("code", "sig"):
            rc, out, err = c.nh("wait", "--state", c.state, vm)
            check((rc, out.strip()) == (137, "137"), "plain wait %s prints the status: %d %r %r" % (vm, rc, out, err))
        rc, st, err = wait_json(c, "code")
        check(rc == 137 and st and (st["status"], st["outcome"], st["exit_code"], st["signal"], st["exit_status"]) ==
              ("exited", "exited", 137, None, 137), "wait --format json, exit 137: %d %s %r" % (rc, st, err))
        rc, st, err = wait_json(c, "sig")
        check(rc == 137 and st and (st["status"], st["outcome"], st["exit_code"], st["signal"], st["exit_status"]) ==
              ("exited", "signalled", None, 9, 137), "wait --format json, SIGKILL: %d %s %r" % (rc, st, err))
        check(st and st.get("vm") == "sig" and st.get("generation") == 1 and st.get("started_at") and st.get("reason"),
              "the record's vm, generation, times and reason: %s" % st)
        rc, out, err = c.nh("wait", "--state", c.state, "--format", "yaml", "sig")
        check(rc == 125 and "--format" in err, "wait --format yaml is a usage error: %d %r" % (rc, err))
    finally:
        c.finish()


def reap_killed(pid, what):
    """Waits for our (subreaped) child `pid`; True iff SIGKILL ended it."""
    got = bounded(lambda: os.waitpid(pid, 0), what, 30)
    return bool(got) and os.WIFSIGNALED(got[1]) and os.WTERMSIG(got[1]) == signal.SIGKILL


def case_removal_cut_short():
    """Kill points: a monitor SIGKILLed in the middle of its removal (fault point remove:partial,
    after the first file went). `--on-exit remove`: its intent (`removing`: scratch 1) is on disk,
    `ps` finishes it (the scratch files go, the record stays). `--rm`: the intent (all 1) is on disk,
    `rm` finishes it (the directory goes, rm says the id). Lost: nothing (the removal completes)."""
    c = Case("removal")
    try:
        env = dict(c.env, NESHOST_FAULT="remove:partial")
        for vm, flags in (("scr", ["--on-exit", "remove"]), ("all", ["--rm"])):
            go = c.fifo("go-" + vm)  # the monitor's pid is read before the workload ends
            r = subprocess.run([NESHOST, "run", "-d", "--sandbox", "--state", c.state, "--vm", vm, "--grace", "2",
                                "--ready-timeout", "20"] + flags +
                               ["--", "/bin/sh", "-c", "echo out; read x < %s; exit 3" % go],
                               capture_output=True, text=True, timeout=60, env=env)
            check(r.returncode == 0, "run -d %s: %d %r" % (flags, r.returncode, r.stderr))
            pid = c.monitor_json(vm)["pid"] if os.path.exists(c.vm_file(vm, "monitor.json")) else None
            check(pid is not None, "%s: the monitor is recorded" % vm)
            if pid is None:
                continue
            c.release(go)
            check(reap_killed(pid, "%s's monitor ends" % vm), "%s: the monitor died at the fault point" % vm)
            with open(c.vm_file(vm, "removing")) as f:
                check(f.read() == ("scratch 1\n" if vm == "scr" else "all 1\n"), "%s: its intent is on disk" % vm)
        # Uncut: --on-exit remove leaves the record and no intent.
        rc, _, err = c.nh("run", "-d", "--sandbox", "--state", c.state, "--vm", "clean", "--grace", "2",
                          "--ready-timeout", "20", "--on-exit", "remove", "--", "/bin/sh", "-c", "echo out; exit 5")
        check(rc == 0, "run -d --on-exit remove: %r" % err)
        rc, out, _ = c.nh("wait", "--state", c.state, "clean")
        pid = c.monitor_json("clean")["pid"]
        try:
            bounded(lambda: os.waitpid(pid, 0), "the monitor of 'clean' ends", 30)
        except ChildProcessError:
            pass
        now = sorted(os.listdir(os.path.join(c.state, "clean")))
        check(rc == 5 and "removing" not in now and "workload.log" not in now and "console.log" not in now and
              "outcome.json" in now, "--on-exit remove, uncut: %d %s" % (rc, now))
        # --rm: half done; rm finishes it (and what its monitor left: the runtime dir).
        check(os.path.isdir(os.path.join(c.state, "all")), "the --rm removal was cut short")
        rc, out, err = c.nh("rm", "--state", c.state, "all")
        check((rc, out.strip()) == (0, "all"), "rm finishes it and says the id: %d %r %r" % (rc, out, err))
        check(not os.path.exists(os.path.join(c.state, "all")), "the directory is gone")
        # --on-exit remove: half done; ps finishes it, the record stays.
        left = sorted(os.listdir(os.path.join(c.state, "scr")))
        rc, out, err = c.nh("ps", "-a", "--state", c.state)
        check(rc == 0 and "scr" in out and "exited" in out, "ps -a after the cut removal: %d %r %r" % (rc, out, err))
        now = sorted(os.listdir(os.path.join(c.state, "scr")))
        check("removing" not in now and "workload.log" not in now and "console.log" not in now and
              "outcome.json" in now, "ps finished the scratch removal: before %s, after %s" % (left, now))
        rc, st, err = wait_json(c, "scr")
        check(rc == 3 and st and st.get("exit_code") == 3, "its record stays: %d %s" % (rc, st))
    finally:
        c.finish()


def case_exec_attached():
    """Kill point: the monitor SIGKILLed with a `neshost exec` client attached. The client cannot be
    taken over (its process's stdio went to the monitor gone as its own fds): it ends at once, 125,
    saying its monitor died and that the process's further output and exit status are not known.
    Lost: that process's output after the kill (the client says so; not a count: the guest holds
    it, no host process has its destination). The workload itself loses nothing."""
    c = Case("exec")
    try:
        go, go_x = c.fifo("go"), c.fifo("gox")
        rc, _, err = c.run_d("x", "/bin/sh", "-c", "echo up; read x < %s; exit 4" % go)
        check(rc == 0, "run -d: %r" % err)
        check(c.await_log("x", "up") is not None, "the workload started")
        p = c.spawn("exec", "--state", c.state, "x", "--", "/bin/sh", "-c", "echo attached; read y < %s" % go_x)
        line = bounded(lambda: p.stdout.readline(), "the exec'd process's first line")
        check(line == "attached\n", "the exec client is attached: %r" % line)
        old = c.monitor_json("x")["pid"]
        c.kill_monitor("x")
        out, err = p.communicate(timeout=30)
        check(p.returncode == 125 and ("its monitor (pid %d) died while the process ran" % old) in err
              and "not known" in err, "the exec client ends, saying why: %d %r" % (p.returncode, err))
        c.release(go_x)  # the exec'd process, still in the guest, ends
        c.release(go)
        rc, out, err = c.nh("wait", "--state", c.state, "x")
        check(exit_ok(rc, out, err, 4), "the workload, adopted, ends as it would have: %d %r %r" % (rc, out, err))
    finally:
        c.finish()


# The kill-point table (docs/host.md "Re-adoption"): where a monitor dies -> what is lost.
KILL_POINTS = [
    ("monitor SIGKILLed mid-stream (wait, twice)", "nothing: every line once"),
    ("monitor SIGKILLed, the workload exits meanwhile (unmonitored)", "nothing: the outcome re-sent"),
    ("monitor SIGKILLed with --timeout pending (timeout)", "nothing: the deadline re-armed, 124 at it, "
                                                           "started_at the VM's"),
    ("monitor SIGKILLed with an exec attached (exec)", "the exec'd process's further output and status: "
                                                       "the client says so, exit 125"),
    ("monitor SIGKILLed mid-removal, --on-exit remove / --rm (removal)", "nothing: the next command finishes it"),
    ("monitor and VMM SIGKILLed (both)", "the outcome: failed 125, with the reason"),
]

CASES = {"wait": case_kill_then_wait, "twice": case_killed_twice, "unmonitored": case_exit_while_unmonitored,
         "race": case_race_then_stop, "both": case_monitor_and_vmm_killed, "vmm": case_vmm_killed_monitor_alive,
         "timeout": case_timeout_pending, "waitjson": case_wait_json, "removal": case_removal_cut_short,
         "exec": case_exec_attached}
# Extra arguments name the cases to run (development); meson runs them all.
for name in (sys.argv[3:] or list(CASES)):
    CASES[name]()
for point, lost in KILL_POINTS:
    print("kill point: %s -> lost: %s" % (point, lost), flush=True)
if figures:
    print("monitor SIGKILL -> lifecycle channel back with a replacement (s): median %.3f, min %.3f, max %.3f, n=%d"
          % (statistics.median(figures), min(figures), max(figures), len(figures)), flush=True)
finish()
