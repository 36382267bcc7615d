#!/usr/bin/env python3
"""microVM tests of `neshost run` (meson suite `vm`): a real QEMU (TCG), the Debian cloud kernel
and nesinit as PID 1. Usage: vm_test.py CASE. Each case boots one VM and judges by what the host
recorded (STATE/VM/outcome.json) and neshost's exit status, never by QEMU's exit status. After
every case: neshost left no descendant behind (this runner is a subreaper, so anything neshost
left would be reparented here) and no socket or temp dir (neshost's TMPDIR must be empty).

The net_* cases (issue 26) each run in a network namespace of their own (tests/support/netns.py):
a VM with a NIC never runs in the machine's namespace.

Env: NESHOST (the binary), NESHOST_INITRD (default initramfs), VM_STATIC_PROBE (static program
for --rootfs), VM_NET_PROBE (the guest side of net_udp), NES_SOURCE_ROOT (for the kernel release).
"""
import ctypes
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from throttled_reader import ThrottledReader  # noqa: E402
from procs import alive, processes  # noqa: E402
import netns  # noqa: E402

PR_SET_CHILD_SUBREAPER = 36
NESHOST = os.environ["NESHOST"]
SRC = os.environ.get("NES_SOURCE_ROOT", ".")
BOUND = 120  # seconds: the most any one neshost may take before the case fails


class Failure(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Failure(what)


class Proc:
    """A child process whose stdout/stderr are collected by threads, with bounded waits."""

    def __init__(self, argv, env, stdin=None, stdout=None):
        """stdout: an fd of the caller's (e.g. a throttled reader's pipe) instead of collecting it."""
        self.p = subprocess.Popen(argv, stdin=stdin, stdout=subprocess.PIPE if stdout is None else stdout,
                                  stderr=subprocess.PIPE, env=env)
        self.out, self.err = b"", b""
        self.cv = threading.Condition()
        self.threads = [threading.Thread(target=self._pump, args=(self.p.stderr, "err"))]
        if stdout is None:
            self.threads.append(threading.Thread(target=self._pump, args=(self.p.stdout, "out")))
        for t in self.threads:
            t.start()

    def _pump(self, f, name):
        while True:
            b = f.read1(65536)
            with self.cv:
                if b:
                    setattr(self, name, getattr(self, name) + b)
                self.cv.notify_all()
            if not b:
                return

    def wait_text(self, stream, text, bound=BOUND):
        """Waits until `text` appeared on stream ('out'/'err'); False at the bound or on exit."""
        deadline = time.monotonic() + bound
        with self.cv:
            while text.encode() not in getattr(self, stream):
                left = deadline - time.monotonic()
                if left <= 0 or (self.p.poll() is not None and all(not t.is_alive() for t in self.threads)):
                    return text.encode() in getattr(self, stream)
                self.cv.wait(min(left, 0.5))
            return True

    def finish(self, bound=BOUND):
        try:
            rc = self.p.wait(timeout=bound)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
            raise Failure(f"neshost still running after {bound} s; stderr:\n{self.err.decode(errors='replace')}")
        for t in self.threads:
            t.join()
        return rc


class Case:
    """One VM run in a private temp dir: state dir + neshost's TMPDIR (must end empty)."""

    def __init__(self):
        self.tmp = tempfile.mkdtemp(prefix="nesvmt.", dir="/tmp")
        self.state = os.path.join(self.tmp, "state")
        self.rt = os.path.join(self.tmp, "rt")
        os.mkdir(self.rt)
        # XDG_RUNTIME_DIR: the KVM probe's verdict is cached there, so never on this machine's /run.
        # NESHOST_NETWORK: no NIC unless a case passes --network (inside a namespace it made).
        self.env = dict(os.environ, TMPDIR=self.rt, XDG_RUNTIME_DIR=self.tmp,
                        NESHOST_NETWORK=os.environ.get("NESHOST_NETWORK", "none"))
        self.procs = []
        self.readers = []  # (ThrottledReader, its pipe's read end)
        self.detached = []  # VM ids started with run -d: removed (rm -f) by close() if still up

    def start(self, *args, vm="t", accel="tcg", stdin=None):
        # A generous ready deadline: CI runs these next to heavy suites on 2 cores (correctness,
        # not speed, is under test here).
        p = Proc([NESHOST, "run", "--accel", accel, "--ready-timeout", "100", "--state", self.state,
                  "--vm", vm, *args], self.env, stdin=stdin)
        self.procs.append(p)
        return p

    def slow_pipe(self, rate, pause_at=None, keep=False):
        """A pipe whose read end a ThrottledReader (started) takes at `rate` bytes/s: returns
        (reader, write end); the caller hands the write end to a child and closes its own copy."""
        r, w = os.pipe()
        rd = ThrottledReader(r, rate, pause_at=pause_at, keep=keep).start()
        self.readers.append((rd, r))
        return rd, w

    def popen_slow(self, argv, rate, pause_at=None, keep=False):
        """`argv` (a neshost command) with its stdout read by a ThrottledReader at `rate` bytes/s;
        its stderr collected. Returns (Proc, reader)."""
        rd, w = self.slow_pipe(rate, pause_at=pause_at, keep=keep)
        try:
            p = Proc(argv, self.env, stdout=w)
        finally:
            os.close(w)
        self.procs.append(p)
        return p, rd

    def start_slow(self, rate, *args, vm="t", pause_at=None, keep=False):
        """`neshost run ARGS` with its stdout read by a ThrottledReader at `rate` bytes/s."""
        return self.popen_slow([NESHOST, "run", "--accel", "tcg", "--ready-timeout", "100", "--state",
                                self.state, "--vm", vm, *args], rate, pause_at=pause_at, keep=keep)

    def detach(self, vm, *args):
        """`neshost run -d --vm VM ARGS`: returns the monitor's pid (reparented to this
        subreaper once the creator exits; the caller reaps it after stop/wait)."""
        self.detached.append(vm)
        rc, out, err = self.neshost("run", "-d", "--accel", "tcg", "--ready-timeout", "100", "--state",
                                    self.state, "--vm", vm, *args)
        check(rc == 0 and out.strip() == vm, f"run -d {vm}: {rc} {out!r} {err!r}")
        rc, out, _ = self.neshost("inspect", "--state", self.state, vm)
        pid = json.loads(out).get("monitor_pid") if rc == 0 else None
        check(pid, f"inspect {vm}: no monitor pid: {out!r}")
        return pid

    def run(self, *args, **kw):
        p = self.start(*args, **kw)
        rc = p.finish()
        return rc, p.out.decode(errors="replace"), p.err.decode(errors="replace")

    def neshost(self, *args):
        r = subprocess.run([NESHOST, *args], capture_output=True, env=self.env, timeout=BOUND)
        return r.returncode, r.stdout.decode(), r.stderr.decode()

    def record(self, vm="t"):
        with open(os.path.join(self.state, vm, "outcome.json")) as f:
            return json.load(f)

    def close(self, ok):
        # What a failed case left up (monitor, QEMU, daemons) ends: each VM it started with run -d,
        # and any other VM its state dir holds (a case may start one with c.neshost("run", "-d")).
        left = list(self.detached)
        if not ok and os.path.isdir(self.state):
            left += [d for d in sorted(os.listdir(self.state)) if not d.startswith(".") and d not in left]
        for vm in left if not ok else []:
            if os.path.isdir(os.path.join(self.state, vm)):
                subprocess.run([NESHOST, "rm", "-f", "--state", self.state, vm], capture_output=True,
                               env=self.env, timeout=BOUND)
        for p in self.procs:
            if p.p.poll() is None:
                p.p.kill()
                p.p.wait()
        for rd, fd in self.readers:  # every writer is gone: each reader is at EOF or stops now
            rd.resume()
            if not rd.join(10):
                rd.stop()
            os.close(fd)
        if not ok:  # reap what the kills above ended (QEMU reparented here among them), bounded
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                try:
                    if os.waitpid(-1, os.WNOHANG)[0] == 0:
                        time.sleep(0.05)
                except ChildProcessError:
                    break
        if ok:
            left = os.listdir(self.rt)
            check(left == [], f"neshost left files in its TMPDIR: {left}")
            orphans = []
            while True:  # every descendant neshost left behind was reparented to us
                try:
                    pid, st = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    orphans.append("a live descendant")
                    break
                orphans.append(f"pid {pid}")
            check(not orphans, f"processes left behind (e.g. QEMU): {orphans}")
        shutil.rmtree(self.tmp, ignore_errors=True)


def all_children_reaped():
    """Reaps every exited child (descendants reparented to this subreaper among them): True once
    none is left, False while one still runs (a condition for poll())."""
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return False
        except ChildProcessError:
            return True


def lines(s):
    return [l for l in s.split("\n") if l != ""]


def kernel_release(cloud=False):
    """The default kernel's `uname -r` (the lean kernel scripts/build-kernel.sh builds), or with
    cloud=True the fallback's (Debian's cloud kernel, scripts/fetch-kernel.sh)."""
    rel = ".cache/kernel/release" if cloud else ".cache/kernel/lean/release"
    with open(os.path.join(SRC, rel)) as f:
        return f.read().strip()


# ---- cases ----

def case_exit7(c):
    """README command 1's workload; --accel auto (the KVM probe must fall back here)."""
    rc, out, err = c.run("--", "/bin/sh", "-c", "echo hello from the guest; uname -r; exit 7", accel="auto")
    check(rc == 7, f"exit status {rc}, want 7; stderr:\n{err}")
    check(lines(out) == ["hello from the guest", kernel_release()], f"stdout {out!r}")
    r = c.record()
    check((r["outcome"], r["exit_code"], r["signal"], r["exit_status"]) == ("exited", 7, None, 7), f"record {r}")


def case_bzimage(c):
    """The fallback: --kernel .cache/kernel/vmlinuz, Debian's cloud kernel as its compressed
    bzImage, boots with the default initramfs (the init loads its modules; the lean default has
    them built in)."""
    rc, out, err = c.run("--kernel", os.path.join(SRC, ".cache/kernel/vmlinuz"), "--", "/bin/sh", "-c",
                         "uname -r; test -e /proc/modules && grep -c '^virtio_console ' /proc/modules; exit 3")
    check(rc == 3, f"exit status {rc}, want 3; stderr:\n{err}")
    check(lines(out) == [kernel_release(cloud=True), "1"], f"stdout {out!r}")


def case_pause(c):
    """stats (docker stats --no-stream): the guest's CPU time, memory of a 256 MiB guest, processes,
    the VMM's resident memory and CPU time; refused while paused. pause/unpause (docker's): the
    monitor stops the VM's vCPUs through QMP. The workload prints
    the guest's uptime 10 times a second. While paused: ps and inspect say paused, the output stops
    (the test holds the pause 1.5 s, measured: this is what is asserted on, not a synchronisation),
    exec is refused, a second pause is refused. After unpause the output goes on and the guest's
    clock gained less than a third of the hold (it stood still). SIGTERM sent while paused waits for unpause, then ends the workload (143). A second VM:
    SIGKILL to a paused VM resumes it first (137, said in monitor.log). A third: `stop` resumes a
    paused VM and shuts it down in order (its workload's TERM trap runs)."""
    loop = "while :; do cat /proc/uptime; sleep 0.1; done"
    rc, out, err = c.neshost("run", "-d", "--accel", "tcg", "--ready-timeout", "100", "--state", c.state,
                             "--vm", "p", "--", "sh", "-c", loop)
    check(rc == 0, f"run -d: {rc} {err!r}")

    def uptimes():
        _, log, _ = c.neshost("logs", "--state", c.state, "p")
        return [float(l.split()[0]) for l in log.splitlines() if l.strip()]

    def grows(before):
        return poll(lambda: (lambda u: u if len(u) > len(before) else None)(uptimes()), "the output goes on")

    def monitor_pid(vm):
        with open(os.path.join(c.state, vm, "monitor.json")) as f:
            return json.load(f)["pid"]

    def mlog(vm):
        with open(os.path.join(c.state, vm, "monitor.log")) as f:
            return f.read()

    def status(vm):
        _, out, _ = c.neshost("ps", "-a", "--state", c.state)
        row = [l.split() for l in lines(out)[1:] if l.split() and l.split()[0] == vm]
        return row[0][2] if row else None

    poll(lambda: len(uptimes()) >= 3, "the workload prints")
    # stats: the guest's CPU time, memory and processes (its init's totals), the VMM's cost here.
    rc, out, err = c.neshost("stats", "--state", c.state, "p")
    f = lines(out)[1].split() if rc == 0 and len(lines(out)) == 2 else []
    # VM CPU USED / LIMIT MEM% PIDS VMM-RSS VMM-CPU
    check(len(f) == 9 and f[0] == "p" and f[1].endswith("s") and float(f[1][:-1]) > 0 and f[3] == "/"
          and f[4].endswith("MiB") and 200 < float(f[4][:-3]) <= 256 and int(f[6]) >= 2
          and f[7][-3:] in ("MiB", "GiB") and float(f[8][:-1]) > 0, f"stats: {rc} {out!r} {err!r}")
    stats_line = lines(out)[1]
    rc, out, err = c.neshost("pause", "--state", c.state, "p")
    check((rc, out) == (0, "p\n"), f"pause: {rc} {out!r} {err!r}")
    check(status("p") == "paused", "ps says paused")
    _, out, _ = c.neshost("inspect", "--state", c.state, "p")
    st = json.loads(out)
    check(st.get("status") == "running" and st.get("paused") is True, f"inspect: {st}")
    rc, _, err = c.neshost("exec", "--state", c.state, "p", "true")
    check(rc != 0 and "cannot exec in a paused VM" in err, f"exec while paused: {rc} {err!r}")
    rc, _, err = c.neshost("pause", "--state", c.state, "p")
    check(rc == 1 and "already paused" in err, f"pause twice: {rc} {err!r}")
    rc, _, err = c.neshost("stats", "--state", c.state, "p")
    check(rc == 1 and "paused" in err, f"stats while paused: {rc} {err!r}")
    before = uptimes()
    t0 = time.monotonic()
    time.sleep(1.5)  # the hold being measured
    held = time.monotonic() - t0
    check(uptimes() == before, "no output while paused")
    rc, out, err = c.neshost("unpause", "--state", c.state, "p")
    check((rc, out) == (0, "p\n"), f"unpause: {rc} {out!r} {err!r}")
    after = grows(before)
    gained = after[len(before)] - before[-1]
    check(0 < gained < held / 3, f"the guest's clock stood still: it gained {gained:.2f} s over a {held:.2f} s hold")
    check(status("p") == "running", "ps after unpause")

    # A signal other than SIGKILL waits for unpause, as a frozen cgroup's does.
    rc, _, err = c.neshost("pause", "--state", c.state, "p")
    check(rc == 0, f"pause again: {rc} {err!r}")
    rc, _, err = c.neshost("kill", "-s", "TERM", "--state", c.state, "p")
    check(rc == 0, f"kill -s TERM while paused: {rc} {err!r}")
    check(status("p") == "paused", "the SIGTERM waits")
    rc, out, err = c.neshost("unpause", "--state", c.state, "p")
    check(rc == 0, f"unpause: {rc} {out!r} {err!r}")
    rc, out, _ = c.neshost("wait", "--state", c.state, "p")
    check(rc == 143, f"the SIGTERM sent while paused ends the workload once resumed: {rc} {out!r}")
    rc, _, err = c.neshost("unpause", "--state", c.state, "p")
    check(rc == 1, f"unpause of an ended VM: {rc} {err!r}")
    check(not os.path.exists(os.path.join(c.state, "p", "paused")), "no marker once the VM ended")

    # SIGKILL to a paused VM: resumed first, then killed (137).
    rc, _, err = c.neshost("run", "-d", "--accel", "tcg", "--ready-timeout", "100", "--state", c.state,
                           "--vm", "q", "--", "sleep", "1000")
    check(rc == 0, f"run -d q: {rc} {err!r}")
    rc, _, err = c.neshost("pause", "--state", c.state, "q")
    check(rc == 0, f"pause q: {rc} {err!r}")
    rc, _, err = c.neshost("kill", "--state", c.state, "q")
    check(rc == 0, f"kill (SIGKILL) of a paused VM: {rc} {err!r}")
    rc, out, _ = c.neshost("wait", "--state", c.state, "q")
    check(rc == 137 and "resumed for SIGKILL" in mlog("q"), f"wait q: {rc} {out!r}; {mlog('q')[-600:]!r}")

    # stop of a paused VM: resumed, then the ordered shutdown (its TERM trap runs).
    rc, _, err = c.neshost("run", "-d", "--accel", "tcg", "--ready-timeout", "100", "--state", c.state, "--vm", "r",
                           "--", "sh", "-c", "trap 'echo got-term; exit 3' TERM; echo up; while :; do sleep 0.1; done")
    check(rc == 0, f"run -d r: {rc} {err!r}")
    poll(lambda: c.neshost("logs", "--state", c.state, "r")[1] == "up\n", "r runs its trap")
    rc, _, err = c.neshost("pause", "--state", c.state, "r")
    check(rc == 0, f"pause r: {rc} {err!r}")
    rc, out, err = c.neshost("stop", "--state", c.state, "r")
    check(rc == 0, f"stop of a paused VM: {rc} {out!r} {err!r}")
    _, log, _ = c.neshost("logs", "--state", c.state, "r")
    check(status("r") == "stopped" and log == "up\ngot-term\n", f"stopped in order: {status('r')} {log!r}")
    for vm in ("p", "q", "r"):
        try:
            os.waitpid(monitor_pid(vm), 0)  # reparented to us (the subreaper)
        except ChildProcessError:
            pass
    print(f"stats: {stats_line}")
    print(f"pause: output and the guest's clock stood still for {held:.2f} s (clock +{gained:.2f} s); "
          f"SIGTERM waited for unpause (143); SIGKILL "
          f"resumed and killed (137); stop resumed and stopped in order")


def case_detached(c):
    """run -d in a real VM: the creator returns with the VM id; a fresh ps, kill and wait agree;
    the monitor (reparented to this subreaper) exits once QEMU is down."""
    rc, out, err = c.neshost("run", "-d", "--accel", "tcg", "--ready-timeout", "100", "--state", c.state,
                             "--vm", "d", "--", "/bin/sleep", "1000")
    check(rc == 0 and out.strip() == "d", f"run -d: {rc} {out!r} {err!r}")
    rc, out, _ = c.neshost("ps", "--state", c.state)
    check(rc == 0 and lines(out)[1].split()[:3] == ["d", "1", "running"], f"ps: {out!r}")
    rc, out, _ = c.neshost("inspect", "--state", c.state, "d")
    st = json.loads(out) if rc == 0 else {}
    check(st.get("status") == "running" and st.get("monitor_alive") is True, f"inspect: {st}")
    rc, _, err = c.neshost("kill", "--state", c.state, "d")  # SIGKILL, as docker kill
    check(rc == 0, f"kill: {rc} {err!r}")
    rc, out, _ = c.neshost("wait", "--state", c.state, "d")
    check(rc == 137, f"wait: {rc} {out!r}")
    pid = st.get("monitor_pid")
    # docker's `wait X && rm X`: an ended VM whose monitor is still powering it off is removable.
    rc, out, _ = c.neshost("run", "-d", "--accel", "tcg", "--ready-timeout", "100", "--state", c.state,
                           "--vm", "d2", "--", "/bin/sh", "-c", "echo $(hostname); exit 4")
    check(rc == 0, f"run -d d2: {rc}")
    _, out, _ = c.neshost("inspect", "--state", c.state, "d2")
    pid2 = json.loads(out).get("monitor_pid") if out else None
    rc, _, _ = c.neshost("wait", "--state", c.state, "d2")
    _, log, _ = c.neshost("logs", "--state", c.state, "d2")
    check(log == "d2\n", f"the default hostname is the VM id, as docker's: {log!r}")
    rc2, out, err = c.neshost("rm", "--state", c.state, "d2")
    check((rc, rc2, out) == (4, 0, "d2\n"), f"wait then rm: {rc} {rc2} {out!r} {err!r}")
    if pid2:
        os.waitpid(pid2, 0)  # reparented to us (the subreaper); rm saw it exit
    if pid:
        os.waitpid(pid, 0)  # bounded by the meson timeout; it must exit on its own
    rc, out, _ = c.neshost("ps", "-a", "--state", c.state)
    check(lines(out)[1].split()[:4] == ["d", "1", "exited", "(137)"], f"ps -a: {out!r}")
    # rm -f of a running `-d --rm` VM: its monitor removes the VM as it ends, racing rm's own
    # removal; either way rm says the id and succeeds, and nothing is left.
    rc, out, err = c.neshost("run", "-d", "--rm", "--accel", "tcg", "--ready-timeout", "100", "--state", c.state,
                             "--vm", "d3", "--", "/bin/sleep", "1000")
    check(rc == 0, f"run -d --rm d3: {rc} {err!r}")
    _, out, _ = c.neshost("inspect", "--state", c.state, "d3")
    pid3 = json.loads(out).get("monitor_pid") if out else None
    rc, out, err = c.neshost("rm", "-f", "--state", c.state, "d3")
    check((rc, out) == (0, "d3\n") and not os.path.exists(os.path.join(c.state, "d3")),
          f"rm -f of a -d --rm VM: {rc} {out!r} {err!r}")
    if pid3:
        os.waitpid(pid3, 0)


def case_kill9(c):
    rc, out, err = c.run("--", "/bin/sh", "-c", "kill -9 $$")
    r = c.record()
    check((r["outcome"], r["exit_code"], r["signal"], r["exit_status"]) == ("signalled", None, 9, 137), f"record {r}")
    check(rc == 137, f"exit status {rc}, want 137; stderr:\n{err}")


def case_not_found(c):
    rc, out, err = c.run("--", "/nonexistent")
    r = c.record()
    check((r["outcome"], r["exit_status"]) == ("start_failed", 127), f"record {r}")
    check(rc == 127, f"exit status {rc}, want 127")
    check("start_failed" in err and "/nonexistent" in err, f"stderr does not say why: {err!r}")


def case_ignores_stop(c):
    """SIGTERM to neshost -> ordered shutdown; the workload ignores SIGTERM -> SIGKILL after grace."""
    p = c.start("--grace", "1", "--", "/bin/sh", "-c", "trap '' TERM; echo armed; exec sleep 100")
    check(p.wait_text("out", "armed\n"), f"workload never started; stderr:\n{p.err.decode()}")
    p.p.send_signal(signal.SIGTERM)
    rc = p.finish()
    r = c.record()
    check((r["outcome"], r["signal"], r["exit_status"]) == ("signalled", 9, 137), f"record {r}")
    check(rc == 137, f"exit status {rc}, want 137")


def case_keep_stop(c):
    os.makedirs(c.state)  # `neshost wait` needs the state dir; the run may not have made it yet
    p = c.start("--on-exit", "keep", "--", "/bin/sh", "-c", "echo kept; exit 3", vm="k")
    rc, out, _ = c.neshost("wait", "--state", c.state, "--timeout", str(BOUND), "k")
    check(rc == 3, f"neshost wait gave {rc}, want 3")
    check(p.wait_text("err", "neshost stop --state"), f"no stop hint; stderr:\n{p.err.decode()}")
    check(p.p.poll() is None, "neshost run exited although --on-exit keep")
    rc, out, err = c.neshost("stop", "--state", c.state, "k")
    check(rc == 0, f"neshost stop gave {rc}: {err}")
    rc = p.finish()
    check(rc == 3, f"neshost run gave {rc}, want 3")
    check(lines(p.out.decode()) == ["kept"], f"stdout {p.out!r}")
    r = c.record("k")
    check((r["outcome"], r["exit_code"]) == ("exited", 3), f"record {r}")
    rc, _, err = c.neshost("stop", "--state", c.state, "k")
    check(rc == 1, f"stopping a stopped VM gave {rc}: {err}")


def case_timeout(c):
    rc, out, err = c.run("--timeout", "2", "--", "sleep", "100")
    r = c.record()
    check((r["outcome"], r["exit_status"]) == ("timeout", 124), f"record {r}")
    check(rc == 124, f"exit status {rc}, want 124")


def case_s8(c):
    """S8: orphans are reaped; the workload counts zombies and must see 0."""
    w = ('for i in 1 2 3 4 5; do sh -c "sh -c \\"sleep 1\\" &" & wait; done; sleep 3; '
         'grep -l "^State:.*Z" /proc/[0-9]*/status | wc -l')
    rc, out, err = c.run("--", "/bin/sh", "-c", w)
    check(rc == 0, f"exit status {rc}, want 0; stderr:\n{err}")
    check(lines(out) == ["0"], f"stdout {out!r}")
    r = c.record()
    check((r["outcome"], r["exit_code"]) == ("exited", 0), f"record {r}")


def case_s11(c):
    """S11: the exit code survives the ordered shutdown."""
    rc, out, err = c.run("--", "false")
    r = c.record()
    check((r["outcome"], r["exit_code"], r["exit_status"]) == ("exited", 1, 1), f"record {r}")
    check(rc == 1, f"exit status {rc}, want 1")


def case_rootfs(c):
    """--rootfs DIR --rootfs-mode initramfs, DIR holding only a static program: packed with
    nesinit, no busybox."""
    root = os.path.join(c.tmp, "rootfs")
    os.mkdir(root)
    shutil.copy(os.environ["VM_STATIC_PROBE"], os.path.join(root, "probe"))
    rc, out, err = c.run("--rootfs", root, "--rootfs-mode", "initramfs", "--hostname", "vmtest", "--",
                         "/probe", "hello")
    check(lines(out) == ["static probe: hello pid1=no hostname=vmtest"], f"stdout {out!r}; stderr:\n{err}")
    check(rc == 5, f"exit status {rc}, want 5")
    r = c.record()
    check((r["outcome"], r["exit_code"]) == ("exited", 5), f"record {r}")


def case_neshost_killed(c):
    """neshost SIGKILLed while the guest runs (no cleanup code runs): QEMU and the share's
    virtiofsd die with it (PR_SET_PDEATHSIG), and no socket or temp dir is left (removed once the
    guest was up)."""
    share = os.path.join(c.tmp, "share")
    os.mkdir(share)
    p = c.start("--console", "-v", f"{share}:/data", "--", "sleep", "100")
    check(p.wait_text("err", " ready protocol_version"), f"guest never ready; stderr:\n{p.err.decode()}")
    p.p.kill()
    p.finish()
    # QEMU was reparented to this subreaper; it must already be dying of SIGKILL. Reap it (bounded:
    # a QEMU that survived would keep this wait open until the meson timeout fails the case).
    reaped = []
    while True:
        try:
            pid, st = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        reaped.append((pid, os.WTERMSIG(st) if os.WIFSIGNALED(st) else None))
    # QEMU and virtiofsd killed; virtiofsd's sandboxed child ends once its parent has gone.
    check(len(reaped) == 3 and sum(sig == signal.SIGKILL for _, sig in reaped) >= 2,
          f"reaped after neshost's death: {reaped}")
    # Its socket and temp dir were removed as soon as QEMU had connected: close() checks TMPDIR.


def case_shares(c):
    """Two shares at once, one rw and one :ro. Host -> guest and guest -> host; :ro is EROFS in the
    guest, and still EROFS after the guest remounts it rw (virtiofsd --readonly, the host side);
    a symlink in a share is resolved in the guest, never to the host's file it names. A share's
    file copied to stdout arrives byte-exact over the data channel (all 256 byte values, no final
    newline), next to the share's own traffic."""
    a, b = os.path.join(c.tmp, "a"), os.path.join(c.tmp, "b")
    os.mkdir(a)
    os.mkdir(b)
    every = bytes(range(256)) * 64
    with open(os.path.join(b, "bytes"), "wb") as f:
        f.write(every)
    with open(os.path.join(a, "in.txt"), "w") as f:
        f.write("from the host\n")
    with open(os.path.join(b, "ro.txt"), "w") as f:
        f.write("read only\n")
    secret = os.path.join(c.tmp, "host-only")
    with open(secret, "w") as f:
        f.write("host secret\n")
    os.symlink(secret, os.path.join(a, "out-of-tree"))
    w = ("cat /b/bytes; cat /b/bytes >&2; cat /a/in.txt /b/ro.txt; echo from the guest > /a/out.txt; "
         "echo x 2>/dev/null > /b/new || echo ro-guest-refused; "
         "mount -o remount,rw /b && (echo x 2>/dev/null > /b/new2 || echo ro-host-refused); "
         "cat /a/out-of-tree 2>/dev/null || echo symlink-stays-in-guest; exit 6")
    p = c.start("-v", f"{a}:/a", "--volume", f"{b}:/b:ro", "--", "/bin/sh", "-c", w)
    rc = p.finish()
    check(rc == 6, f"exit status {rc}, want 6; stderr:\n{p.err.decode(errors='replace')}")
    check(p.out.startswith(every) and p.err == every, f"stdout/stderr not byte-exact: {len(p.out)} {len(p.err)} bytes")
    out = p.out[len(every):].decode(errors="replace")
    check(lines(out) == ["from the host", "read only", "ro-guest-refused", "ro-host-refused",
                         "symlink-stays-in-guest"], f"stdout {out!r}")
    with open(os.path.join(a, "out.txt")) as f:
        check(f.read() == "from the guest\n", "the guest's file is not on the host")
    check(sorted(os.listdir(b)) == ["bytes", "ro.txt"], f"the :ro share was written: {os.listdir(b)}")
    check(os.path.exists(os.path.join(c.state, "t", "virtiofsd-nes.v0.log")), "no virtiofsd log")


def case_file_volumes(c):
    """Single host files as volumes (docker's file binds; CRI binds /etc/hosts and
    /dev/termination-log so): read in the guest, a rw one written through to the host, a :ro one
    EROFS; only the files are visible in the guest, not their host directory's other entries; the
    staging binds never reach the host's mount table."""
    hosts, term = os.path.join(c.tmp, "hosts"), os.path.join(c.tmp, "term")
    with open(hosts, "w") as f:
        f.write("10.0.0.1 db\n")
    open(term, "w").close()
    with open(os.path.join(c.tmp, "sibling"), "w") as f:
        f.write("not shared\n")
    w = ("cat /etc/hosts; echo bye > /dev/termination-log; "
         "(echo x >> /etc/hosts) 2>/dev/null || echo ro-refused; ls /run/nesinit/files; "
         "cat /run/nesinit/files/sibling 2>/dev/null || echo no-sibling; exit 4")
    p = c.start("-v", f"{hosts}:/etc/hosts:ro", "-v", f"{term}:/dev/termination-log", "--",
                "/bin/sh", "-c", w)
    rc = p.finish()
    check(rc == 4, f"exit status {rc}, want 4; stderr:\n{p.err.decode(errors='replace')}")
    out = p.out.decode(errors="replace")
    check(lines(out) == ["10.0.0.1 db", "ro-refused", "0", "1", "no-sibling"], f"stdout {out!r}")
    with open(term) as f:
        check(f.read() == "bye\n", "the guest's write did not reach the host file")
    with open(hosts) as f:
        check(f.read() == "10.0.0.1 db\n", "the :ro file was written")
    with open("/proc/self/mountinfo") as f:
        check(c.tmp not in f.read(), "a staging bind reached the host's mount table")


def case_share_daemon_dies(c):
    """virtiofsd killed while the guest runs: neshost says which share, shuts the VM down in
    order, the outcome is recorded, and no process is left."""
    import re
    d = os.path.join(c.tmp, "d")
    os.mkdir(d)
    p = c.start("--console", "--grace", "1", "-v", f"{d}:/d", "--", "/bin/sh", "-c",
                "echo armed > /d/armed && echo share-done; exec sleep 100")
    # Kill virtiofsd only once the workload is done with the share: a FUSE request in flight when
    # its daemon dies never completes, and its task cannot be killed (a flush at close is not
    # interruptible), so the guest could never report the workload's end: that is not what this
    # case tests. `share-done` is printed after the redirection's close returned.
    check(p.wait_text("out", "share-done\n"), f"workload never wrote the share; stderr:\n{p.err.decode()[-3000:]}")
    check(os.path.exists(os.path.join(d, "armed")), "the share's file is on the host")
    m = re.search(rb"virtiofsd pid (\d+) serves", p.err)
    check(m is not None, "no virtiofsd pid on stderr")
    os.kill(int(m.group(1)), signal.SIGKILL)
    rc = p.finish()
    # virtiofsd's sandboxed child lost its parent and ended (its death signal); it was reparented
    # to this subreaper. Reap it; nothing may still be alive.
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        check(pid != 0, "a descendant of neshost is still alive")
    err = p.err.decode(errors="replace")
    check("share 'nes.v0'" in err and "virtiofsd killed by signal 9 while the guest ran; shutting the VM down" in err,
          f"no message naming the share; stderr tail:\n{err[-3000:]}")
    r = c.record()
    check((r["outcome"], r["signal"], r["exit_status"]) == ("signalled", 15, 143), f"record {r}")
    check(rc == 143, f"exit status {rc}, want 143")


def case_share_bulk(c):
    """A 64 MiB file read in the guest has the host's SHA-256; `find` over 10 000 small files
    counts all of them."""
    import hashlib
    d = os.path.join(c.tmp, "bulk")
    os.makedirs(os.path.join(d, "many"))
    blob = os.urandom(64 << 20)
    with open(os.path.join(d, "big"), "wb") as f:
        f.write(blob)
    want = hashlib.sha256(blob).hexdigest()
    del blob
    for i in range(100):
        sub = os.path.join(d, "many", f"d{i:02}")
        os.mkdir(sub)
        for j in range(100):
            with open(os.path.join(sub, f"f{j:02}"), "w") as f:
                f.write(str(j))
    rc, out, err = c.run("--mem", "320", "-v", f"{d}:/bulk:ro", "--", "/bin/sh", "-c",
                         "sha256sum /bulk/big; find /bulk/many -type f | wc -l")
    check(rc == 0, f"exit status {rc}; stderr:\n{err}")
    got = lines(out)
    check(len(got) == 2 and got[0].split()[0] == want, f"sha256 {got[:1]}, want {want}")
    check(got[1].strip() == "10000", f"find counted {got[1:]}")


def case_rootfs_virtiofs(c):
    """--rootfs DIR over virtiofs (the default): DIR is `/` for a shell script and the static
    probe it runs; /proc, /dev, /tmp are the guest's own (not DIR's), the init still PID 1; a file
    the workload writes lands in DIR; a -v share is mounted inside that root."""
    root = os.path.join(c.tmp, "rootfs")
    os.makedirs(os.path.join(root, "bin"))
    shutil.copy("/bin/busybox", os.path.join(root, "bin", "busybox"))
    for applet in ("sh", "cat", "mount", "grep", "ls"):
        os.symlink("busybox", os.path.join(root, "bin", applet))
    shutil.copy(os.environ["VM_STATIC_PROBE"], os.path.join(root, "probe"))
    with open(os.path.join(root, "run.sh"), "w") as f:
        f.write("#!/bin/sh\n/probe script\necho probe=$?\n"
                "cat /proc/1/comm\n"
                "mount | grep -E ' on / | on /tmp ' | cut -d' ' -f1-5\n"
                "echo scratch > /tmp/scratch; echo kept > /written; ls /dev/console\n"
                "cat /data/in.txt; echo to-stderr >&2\nexit 4\n")
    os.chmod(os.path.join(root, "run.sh"), 0o755)
    data = os.path.join(c.tmp, "data")
    os.mkdir(data)
    with open(os.path.join(data, "in.txt"), "w") as f:
        f.write("share in root\n")
    rc, out, err = c.run("--rootfs", root, "-v", f"{data}:/data:ro", "--hostname", "vmtest", "--", "/run.sh")
    check(rc == 4, f"exit status {rc}, want 4; stderr:\n{err}")
    check(err == "to-stderr\n", f"stderr {err!r}")
    check(lines(out) == ["static probe: script pid1=no hostname=vmtest", "probe=5", "init",
                         "nes.root on / type virtiofs", "tmpfs on /tmp type tmpfs", "/dev/console",
                         "share in root"],
          f"stdout {out!r}")
    with open(os.path.join(root, "written")) as f:
        check(f.read() == "kept\n", "the workload's file is not in DIR")
    check(os.listdir(os.path.join(root, "tmp")) == [], "/tmp was DIR's, not a private tmpfs")


def case_rootfs_read_only(c):
    """issue 44: --rootfs DIR --read-only on a plain root (bin/ and an empty etc/) runs, as docker's
    --read-only runs any image: the mount points (/dev, /proc, /sys, /run, /tmp, a -v share's)
    are made in memory under an overlay sealed read-only before the workload starts; every write
    to / fails; DIR is left exactly as it was."""
    root = os.path.join(c.tmp, "rootfs")
    os.makedirs(os.path.join(root, "bin"))
    os.makedirs(os.path.join(root, "etc"))
    shutil.copy("/bin/busybox", os.path.join(root, "bin", "busybox"))
    for applet in ("sh", "cat", "mount", "grep", "touch", "cut"):
        os.symlink("busybox", os.path.join(root, "bin", applet))
    data = os.path.join(c.tmp, "data")
    os.mkdir(data)
    with open(os.path.join(data, "in.txt"), "w") as f:
        f.write("share in a read-only root\n")
    rc, out, err = c.run("--rootfs", root, "--read-only", "-v", f"{data}:/data:ro", "--", "/bin/sh", "-c",
                         "touch /written 2>/dev/null; echo touch=$?; cat /data/in.txt; "
                         "echo scratch > /tmp/s && echo tmp=ok; cat /proc/1/comm; "
                         "mount | grep ' on / ' | cut -d' ' -f1-6 | cut -d, -f1; exit 3")
    check(rc == 3, f"exit status {rc}, want 3; stderr:\n{err}")
    check(lines(out) == ["touch=1", "share in a read-only root", "tmp=ok", "init",
                         "overlay on / type overlay (ro"], f"stdout {out!r}")
    check(sorted(os.listdir(root)) == ["bin", "etc"], f"DIR was written: {sorted(os.listdir(root))}")
    check(os.listdir(os.path.join(root, "etc")) == [], "DIR's etc/ was written")


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def case_rootfs_block(c):
    """issue 47: --rootfs FILE --rootfs-mode block, an EROFS image of a busybox root, in two VMs at
    once (one read-write with a 4 MiB upper, one --read-only): the writer's writes, renames and a
    deletion of an image file (a whiteout) land in its upper, a write past the upper's cap is ENOSPC
    and the VM ends normally; the read-only VM has no writable root and still sees the deleted
    file; the image file is byte for byte unchanged. A missing file or a directory is refused (125)
    before anything starts."""
    root = os.path.join(c.tmp, "rootfs")
    for d in ("bin", "etc", "srv/dir"):
        os.makedirs(os.path.join(root, d))
    shutil.copy("/bin/busybox", os.path.join(root, "bin", "busybox"))
    for applet in ("sh", "cat", "mount", "grep", "touch", "cut", "ls", "mv", "rm", "dd", "tail"):
        os.symlink("busybox", os.path.join(root, "bin", applet))
    for name, text in (("keep.txt", "kept\n"), ("gone.txt", "image file\n")):
        with open(os.path.join(root, "etc", name), "w") as f:
            f.write(text)
    image = os.path.join(c.tmp, "root.erofs")
    subprocess.run(["mkfs.erofs", "--quiet", image, root], check=True, capture_output=True, timeout=BOUND)
    before = sha256_file(image)
    rw = c.start("--rootfs", image, "--rootfs-mode", "block", "--upper-size", "4", "--", "/bin/sh", "-c",
                 "echo new > /new.txt && mv /etc/keep.txt /etc/moved.txt && rm /etc/gone.txt && "
                 "rm -r /srv/dir && echo changed; [ -e /etc/gone.txt ] || echo gone-absent; "
                 "[ -e /etc/keep.txt ] || echo keep-absent; [ -e /srv/dir ] || echo dir-absent; cat /new.txt /etc/moved.txt; "
                 "mount | grep ' on / ' | cut -d' ' -f1-5; "
                 "dd if=/dev/zero of=/big bs=1M count=16 2>&1 | grep -o 'No space left on device'; "
                 "echo after-enospc; exit 5", vm="rw")
    ro = c.start("--rootfs", image, "--rootfs-mode", "block", "--read-only", "--", "/bin/sh", "-c",
                 "touch /written 2>/dev/null; echo touch=$?; cat /etc/gone.txt; echo tmp > /tmp/t && echo tmp=ok; "
                 "mount | grep ' on / ' | cut -d' ' -f1-6 | cut -d, -f1; exit 3", vm="ro")
    rc_rw, rc_ro = rw.finish(), ro.finish()
    out_rw, err_rw = rw.out.decode(errors="replace"), rw.err.decode(errors="replace")
    out_ro, err_ro = ro.out.decode(errors="replace"), ro.err.decode(errors="replace")
    check(rc_rw == 5, f"rw: exit status {rc_rw}, want 5; stderr:\n{err_rw}")
    check(lines(out_rw) == ["changed", "gone-absent", "keep-absent", "dir-absent", "new", "kept", "overlay on / type overlay",
                            "No space left on device", "after-enospc"], f"rw: stdout {out_rw!r}")
    check(rc_ro == 3, f"ro: exit status {rc_ro}, want 3; stderr:\n{err_ro}")
    check(lines(out_ro) == ["touch=1", "image file", "tmp=ok", "overlay on / type overlay (ro"], f"ro: stdout {out_ro!r}")
    check(sha256_file(image) == before, "the image file was written")
    # Refused before anything starts: a missing image file, a directory, a file of neither kind.
    junk = os.path.join(c.tmp, "junk.img")
    with open(junk, "wb") as f:
        f.write(b"\0" * 4096)
    for bad, word in ((os.path.join(c.tmp, "missing.erofs"), "No such file"), (root, "not a regular file"),
                      (junk, "neither an EROFS nor an ext4")):
        rc, out, err = c.run("--rootfs", bad, "--rootfs-mode", "block", "--", "/bin/true", vm="bad")
        check(rc == 125 and "--rootfs" in err and word in err, f"--rootfs {bad}: rc {rc}, stderr {err!r}")
        check(not os.path.exists(os.path.join(c.state, "bad", "monitor.json")), f"--rootfs {bad}: a VM was started")


def case_debian(c):
    """A real Debian userland (debootstrap --variant=minbase, cached under .cache/) as --rootfs:
    its own dpkg counts the same packages the host counts in that tree."""
    r = subprocess.run([os.path.join(SRC, "scripts/mkdebroot.sh")], capture_output=True, timeout=900)
    check(r.returncode == 0, f"mkdebroot.sh failed: {r.stderr.decode(errors='replace')[-2000:]}")
    root = r.stdout.decode().strip().splitlines()[-1]
    q = subprocess.run(["dpkg-query", f"--admindir={root}/var/lib/dpkg", "-W", "-f", "${Package}\n"],
                       capture_output=True, timeout=60)
    want = len(lines(q.stdout.decode()))
    check(q.returncode == 0 and want > 50, f"host-side dpkg-query: {q.returncode} {want}")
    rc, out, err = c.run("--rootfs", root, "--", "/bin/sh", "-c",
                         "dpkg-query -W -f '${Package}\\n' | wc -l; . /etc/os-release; echo $ID; exit 9")
    check(rc == 9, f"exit status {rc}, want 9; stderr:\n{err}")
    check(lines(out) == [str(want), "debian"], f"stdout {out!r}, want {want} packages and debian")


def case_usage(c):
    """Bad command lines: exit 125 naming the flag; nothing boots."""
    for args, needle in [(["--mem", "10", "--", "true"], "--mem"),
                         (["--accel", "hvf", "--", "true"], "--accel"),
                         (["--initrd", "/x", "--rootfs", "/y", "--", "true"], "--rootfs"),
                         (["--user", "root", "--", "true"], "--user"),
                         (["-e", "=NOVALUE", "--", "true"], "--env"),
                         (["--on-exit", "later", "--", "true"], "--on-exit"),
                         ([], "ARGV")]:
        rc, out, err = c.neshost("run", *args)
        check(rc == 125 and needle in err, f"run {args}: rc {rc}, stderr {err!r}")
    rc, _, err = c.neshost("stop", "--bogus", "vm0")
    check(rc == 125 and "--bogus" in err, f"stop with an unknown flag: {rc} {err!r}")
    rc, _, err = c.neshost("stop", "--state", c.state, "nosuchvm")
    check(rc == 1 and "no running VM" in err, f"stop of an unknown VM: {rc} {err!r}")
    rc, _, err = c.neshost("run", "--kernel", "/nonexistent/vmlinuz", "--", "true")
    check(rc == 125 and "/nonexistent/vmlinuz" in err, f"missing kernel: {rc} {err!r}")
    # Shares: refused before anything starts.
    d = os.path.join(c.tmp, "d")
    os.mkdir(d)
    f = os.path.join(c.tmp, "f")
    open(f, "w").close()
    fifo = os.path.join(c.tmp, "fifo")
    os.mkfifo(fifo)
    for vol, needle in [(f"{c.tmp}/missing:/w", "does not exist"),
                        (f"{fifo}:/w", "neither a directory nor a regular file"), (f"{f}:/dev", "/dev"),
                        (f"{d}:w", "absolute"), (f"{d}:/proc", "/proc"), (f"{d}:/sys/x", "/sys"),
                        (f"{d}:/", "must not be /"), (f"{d}:/w:rox", "ro or rw"), (d, "HOST:GUEST")]:
        rc, _, err = c.neshost("run", "-v", vol, "--", "true")
        check(rc == 125 and "--volume" in err and needle in err, f"-v {vol}: rc {rc}, stderr {err!r}")
    rc, _, err = c.neshost("run", "-v", f"{d}:/a", "--volume", f"{d}:/a:ro", "--", "true")
    check(rc == 125 and "twice" in err, f"one GUEST twice: rc {rc}, stderr {err!r}")
    rc, _, err = c.neshost("run", "--rootfs", f, "--", "true")
    check(rc == 125 and "--rootfs" in err, f"--rootfs FILE: rc {rc}, stderr {err!r}")
    rc, _, err = c.neshost("run", "--rootfs", d, "--rootfs-mode", "9p", "--", "true")
    check(rc == 125 and "--rootfs-mode" in err, f"--rootfs-mode 9p: rc {rc}, stderr {err!r}")
    # A virtiofsd that cannot start: 125, naming the share and carrying the daemon's own words.
    fake = os.path.join(c.tmp, "fake-virtiofsd")
    with open(fake, "w") as fh:
        fh.write("#!/bin/sh\necho 'fake virtiofsd: cannot serve this' >&2\nexit 1\n")
    os.chmod(fake, 0o755)
    r = subprocess.run([NESHOST, "run", "--accel", "tcg", "--state", c.state, "-v", f"{d}:/w", "--", "true"],
                       capture_output=True, env=dict(c.env, NESHOST_VIRTIOFSD=fake), timeout=BOUND)
    err = r.stderr.decode()
    check(r.returncode == 125 and f"({d})" in err and "cannot serve this" in err,
          f"failing virtiofsd: rc {r.returncode}, stderr {err!r}")


def case_stdio(c):
    """stdout and stderr apart and byte-exact (all 256 byte values, a last line without newline),
    then `neshost logs` gives the same bytes back from workload.log after the VM is gone."""
    every = "".join("\\%03o" % i for i in range(256))
    w = 'printf "$0"; printf "err line\\n" >&2; printf "no newline"; exit 4'
    p = c.start("--", "/bin/sh", "-c", w, every)
    rc = p.finish()
    want = bytes(range(256)) + b"no newline"
    check(rc == 4, f"exit status {rc}, want 4; stderr:\n{p.err.decode(errors='replace')}")
    check(p.out == want, f"stdout {p.out!r}")
    check(p.err == b"err line\n", f"stderr {p.err!r}")
    r = subprocess.run([NESHOST, "logs", "--state", c.state, "t"], capture_output=True, env=c.env, timeout=BOUND)
    check(r.returncode == 0 and r.stdout == want and r.stderr == b"err line\n",
          f"logs: rc {r.returncode} stdout {r.stdout!r} stderr {r.stderr!r}")
    r = subprocess.run([NESHOST, "logs", "--state", c.state, "--timestamps", "--tail", "1", "t"],
                       capture_output=True, env=c.env, timeout=BOUND)
    # The log's last line is stdout's last (from the byte after \n, 0x0a, to the end: one
    # timestamp, then its bytes), or stderr's one line: the two streams are separate pipes, so
    # which of them the init read last is not fixed.
    last_out = (r.stdout.endswith(b"\xffno newline") and r.stdout[4:5] == b"-" and r.stdout[29:32] == b"Z \x0b"
                and r.stderr == b"")
    last_err = (r.stdout == b"" and r.stderr.endswith(b"Z err line\n") and r.stderr[4:5] == b"-"
                and len(r.stderr) == 31 + len(b"err line\n"))
    check(r.returncode == 0 and (last_out or last_err), f"logs --timestamps --tail 1: {r.stdout!r} {r.stderr!r}")


def case_stdin(c):
    """-i forwards stdin and its EOF; without -i the workload's stdin is /dev/null (cat ends at
    once although neshost's own stdin stays open)."""
    p = c.start("-i", "--", "sh", "-c", "read x; echo got:$x; cat; echo end", stdin=subprocess.PIPE)
    p.p.stdin.write(b"abc\nrest\n")
    p.p.stdin.close()
    rc = p.finish()
    check(rc == 0 and p.out == b"got:abc\nrest\nend\n", f"-i: rc {rc} stdout {p.out!r}; stderr:\n{p.err.decode()}")
    p = c.start("--", "cat", stdin=subprocess.PIPE, vm="n")  # never written, never closed
    rc = p.finish()
    p.p.stdin.close()
    check(rc == 0 and p.out == b"", f"without -i: rc {rc} stdout {p.out!r}")


def case_bulk(c):
    """S12 in the VM (smaller): 8 MiB of random bytes on stdout, then exit 7: no deadlock, and the
    SHA-256 of what neshost printed equals the guest's: every byte the init wrote to its port
    reached the host before power-off (the host's close of the data channel is the receipt the
    init waits for; bytes still in QEMU's queues would die with the VM)."""
    import hashlib
    w = ("dd if=/dev/urandom of=/tmp/f bs=1048576 count=8 2>/dev/null; sha256sum /tmp/f >&2; "
         "cat /tmp/f; exit 7")
    rc, _, err = 0, None, None
    p = c.start("--mem", "192", "--", "sh", "-c", w)
    rc = p.finish()
    check(rc == 7, f"exit status {rc}, want 7; stderr:\n{p.err.decode(errors='replace')}")
    check(len(p.out) == 8 << 20, f"got {len(p.out)} bytes, want {8 << 20}")
    guest = p.err.decode().split()[0]
    check(hashlib.sha256(p.out).hexdigest() == guest, f"sha256 differs: guest {guest}")


# ---- issue 24: a slow reader costs time, never bytes (docs/protocol.md "The receipt") ----

MB = 1000 * 1000
# What each case below moves: the guest's random bytes, their SHA-256 on stderr (a line of its
# own), then the bytes on stdout, then a status of its own.
BULK = ("dd if=/dev/urandom of=/tmp/f bs=65536 count={count} 2>/dev/null; sha256sum /tmp/f >&2; "
        "cat /tmp/f; exit {code}")


def bulk(kib, code):
    return BULK.format(count=kib // 64, code=code)


def guest_sha(err, what):
    """The guest's `sha256sum /tmp/f` line among a command's stderr."""
    for l in lines(err.decode(errors="replace")):
        f = l.split()
        if len(f) == 2 and f[1] == "/tmp/f" and len(f[0]) == 64:
            return f[0]
    raise Failure(f"{what}: no sha256sum line from the guest on stderr: {err.decode(errors='replace')[-2000:]!r}")


def check_slow(what, rd, rc, want_rc, kib, err):
    """Every byte the guest wrote, in order (its SHA-256), at the reader's pace; the status."""
    check(rd.join(BOUND), f"{what}: the reader is still reading {BOUND} s after the command ended")
    check(rd.error is None, f"{what}: reading failed: {rd.error}")
    want = kib << 10
    sha = guest_sha(err, what)
    check(rd.count == want and rd.hexdigest() == sha and rc == want_rc,
          f"{what}: the reader got {rd.count} of {want} bytes (lost {want - rd.count}), sha256 "
          f"{'equal' if rd.hexdigest() == sha else 'differs'}; exit status {rc}, want {want_rc}; "
          f"stderr:\n{err.decode(errors='replace')[-3000:]}")
    print(f"{what}: {rd.count} bytes in {rd.seconds():.1f} s of reading ({rd.rate / 1000:.0f} kB/s)")


def slow_run(c, kib, rate):
    p, rd = c.start_slow(rate, "--mem", "192", "--", "sh", "-c", bulk(kib, 7))
    rc = p.finish()
    check_slow(f"neshost run | {rate} B/s reader", rd, rc, 7, kib, p.err)
    r = c.record()
    check((r["outcome"], r["exit_code"]) == ("exited", 7), f"record {r}")


def case_slow_reader(c):
    """Issue 24: 8 MiB through `neshost run` into a reader that takes 1 MB/s (the issue's own
    command line): all of it, SHA-256 equal to the guest's, exit 7. The workload is done in about
    a second and the guest then holds the rest for ~7 s behind the reader's backpressure; before
    the fix the init gave up after 1 s without progress (neshost pauses its reads from a full
    1 MiB queue until half of it drained) and ~3.4 MB of the 8.4 never arrived, with exit 7."""
    slow_run(c, 8 << 10, MB)


def case_slow_reader_64k(c):
    """Issue 24 at a crawl: 1.5 MiB into a reader that takes 64 KiB/s (~24 s): every byte, exit 7.
    1.5, not 1: 1 MiB fits in what the host side buffers (neshost's 1 MiB queue for its stdout and
    the pipe), so the guest would hold nothing and the case would pass before the fix too; with
    1.5 MiB the guest holds the rest while neshost's queue drains at 64 KiB/s (8 s from full to
    half, when neshost reads on), far past the old 1 s without progress."""
    slow_run(c, 1536, 64 << 10)


def case_slow_exec(c):
    """Issue 24 for `neshost exec`: 4 MiB from an exec'd process into a 1 MB/s reader while the VM
    runs detached: every byte, SHA-256 equal, exec's own status (5); then stop and rm."""
    pid = c.detach("x", "--mem", "160", "--", "sleep", "1000")
    p, rd = c.popen_slow([NESHOST, "exec", "--state", c.state, "x", "--", "sh", "-c", bulk(4 << 10, 5)], MB)
    rc = p.finish()
    check_slow("neshost exec | 1 MB/s reader", rd, rc, 5, 4 << 10, p.err)
    rc, _, err = c.neshost("stop", "--state", c.state, "x")
    check(rc == 0, f"stop: {rc} {err!r}")
    os.waitpid(pid, 0)  # reparented to us; stop waited for it to exit
    rc, out, err = c.neshost("rm", "--state", c.state, "x")
    check(rc == 0 and out == "x\n", f"rm: {rc} {out!r} {err!r}")


def case_slow_logs(c):
    """Issue 24 for `neshost logs -f`: a detached VM's 8 MiB (binary, as logs prints it
    byte-exact) followed into a 1 MB/s reader: every byte, SHA-256 equal; `neshost wait` says 7."""
    pid = c.detach("l", "--mem", "192", "--", "sh", "-c", bulk(8 << 10, 7))
    p, rd = c.popen_slow([NESHOST, "logs", "-f", "--state", c.state, "l"], MB)
    rc, out, err = c.neshost("wait", "--state", c.state, "l")
    check(rc == 7 and out.strip() == "7", f"wait: {rc} {out!r} {err!r}")
    lrc = p.finish()
    check_slow("neshost logs -f | 1 MB/s reader", rd, lrc, 0, 8 << 10, p.err)
    os.waitpid(pid, 0)  # the monitor ends once the guest is off


def seq_bytes(n):
    """What busybox `seq 1 n` prints."""
    return "".join(f"{i}\n" for i in range(1, n + 1)).encode()


def common_prefix(a, b):
    """Length of the longest common prefix of bytes a and b (by bisection of slices)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def qemu_of(p):
    """Pids of the QEMU processes that neshost process `p` started (its children)."""
    return [q.pid for q in processes() if q.ppid == p.p.pid and "qemu-system" in q.cmd]


def poll(cond, what, bound=BOUND):
    """Polls a state (never a timing guess) until `cond()` is true, bounded; returns its value."""
    deadline = time.monotonic() + bound
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise Failure(f"{what}: not after {bound} s")
        time.sleep(0.1)


def case_drain_stopped(c):
    """A deliberate loss is counted exactly. The workload writes `seq 1 2000000` (14 888 897
    bytes, SIGTERM ignored), far more than everything between it and the reader; the reader takes
    900 000 bytes and pauses, so the workload blocks in write(2). `neshost stop` ends it: SIGTERM
    (ignored), the grace, SIGKILL; at the host's stop deadline the host closes the data channel
    before the eofs (it gives up on the output on purpose), the guest counts what never reached
    the host (output_end) and powers off; then the reader reads on to EOF. Then: neshost run
    exits 125 and names stdout and a byte count N on stderr; the reader's bytes are a prefix of the
    stream, and what they and N add up to (what the workload wrote, by the guest's account) is
    what workload.log holds plus the loss its gap line and the record (inspect) count."""
    import re
    n = 2000000
    want = seq_bytes(n)
    total = len(want)
    k = 900000
    p, rd = c.start_slow(4 * MB, "--mem", "160", "--", "sh", "-c", f"trap '' TERM; seq 1 {n}; exit 7",
                         pause_at=k, keep=True)
    check(rd.wait_paused(BOUND), f"the reader never got {k} bytes: {rd.count}; stderr:\n{p.err.decode()[-3000:]}")

    def ended_early(what):
        # What a host that gives up on its reader does: the run ends while the reader is paused.
        rd.resume()
        rc = p.finish()
        rd.join(BOUND)
        return Failure(f"{what}: neshost run ended with its reader paused at {k} bytes: exit {rc}; the "
                       f"reader then got {rd.count} of {total} bytes (lost {total - rd.count}), a prefix: "
                       f"{want.startswith(bytes(rd.data))}; stderr:\n{p.err.decode(errors='replace')[-3000:]}")

    if p.p.poll() is not None:
        raise ended_early("before the stop")
    qemus = qemu_of(p)
    check(qemus, "no QEMU under neshost run")
    # The workload ignores SIGTERM, so it ends only by writing all of its stream: the stop closes
    # the data channel (the host gives up on the output on purpose), the init discards the rest,
    # counted, and the workload finishes within its grace; -t 30 keeps the CLI's escalation out
    # of the way.
    stop = Proc([NESHOST, "stop", "-t", "30", "--state", c.state, "t"], c.env)
    c.procs.append(stop)
    # The host ended the drain on purpose: the data channel is closed and the guest powered off
    # (whatever neshost run still holds for its stdout is its to write or to count).
    poll(lambda: p.p.poll() is not None or not any(alive(q) for q in qemus), "the guest off after the stop")
    check(rd.count == k, f"the reader read while paused: {rd.count}")
    rd.resume()
    rc = p.finish()
    src = stop.finish()
    check(rd.join(BOUND) and rd.error is None, f"the reader: {rd.error}")
    got = bytes(rd.data)
    err = p.err.decode(errors="replace")
    check(src == 0, f"neshost stop: {src} {stop.err.decode(errors='replace')!r}")
    check(want.startswith(got), f"the reader's {len(got)} bytes are not a prefix of the stream")
    check(rc == 125, f"exit status {rc}, want 125 (output lost); the reader got {len(got)} of {total}; "
                     f"stderr:\n{err[-3000:]}")
    # The CLI's line: stdout and the exact count of bytes that never reached our stdout. The
    # workload ended by the stop (SIGKILL after its grace: it ignores SIGTERM) wrote an amount no
    # one outside the guest knows; the guest's account says it, so every other count must agree
    # with what the reader got plus that loss.
    m = re.search(r"(\d+) bytes of stdout lost", err)
    check(m is not None, f"no stderr line names a loss of stdout: {[l for l in err.splitlines() if 'stdout' in l]}")
    n_lost = int(m.group(1))
    written = len(got) + n_lost
    check(n_lost > 0 and written <= total, f"{len(got)} read + {n_lost} lost = {written}: not within the stream ({total})")
    # The record: a `lost` entry counting what never reached the host (its log).
    rcode, out, ierr = c.neshost("inspect", "--state", c.state, "t")
    check(rcode == 0, f"inspect: {rcode} {ierr!r}")
    st = json.loads(out)
    check("lost" in st and "stdout" in json.dumps(st["lost"]), f"inspect: no loss of stdout recorded: {st}")
    r = subprocess.run([NESHOST, "logs", "--state", c.state, "t"], capture_output=True, env=c.env, timeout=BOUND)
    logged = common_prefix(r.stdout, want)
    check(logged == len(got), f"workload.log holds {logged} bytes of the stream, the reader got {len(got)}")
    lost_ints = [int(x) for x in re.findall(r"\b(\d+)\b", json.dumps(st["lost"]))]
    check(written - logged in lost_ints, f"the record's loss {st['lost']} does not count {written - logged}")
    # workload.log's gap: a line that is not the stream's own (a CRI line of stdout whose content is
    # digits: all `seq` prints) naming stdout and how many of its bytes are missing there.
    with open(os.path.join(c.state, "t", "workload.log"), "rb") as f:
        log = f.read().decode(errors="replace")
    gap = []
    for l in log.splitlines():
        mm = re.match(r"^\S+ (stdout|stderr) [PF]\S* ?(.*)$", l)
        if mm and mm.group(1) == "stdout" and mm.group(2).isdigit():
            continue
        if "stdout" in l:
            gap.append(mm.group(2) if mm else l)
    gap_ints = [int(x) for l in gap for x in re.findall(r"\b(\d+)\b", l)]
    check(written - logged in gap_ints, f"workload.log has no gap line counting {written - logged} bytes of stdout: {gap[:5]}")
    print(f"drain_stopped: {written} written (the guest's account), {len(got)} read, {n_lost} counted lost "
          f"by neshost run, the record and workload.log")


def case_tty(c):
    """-it under a real pseudo-terminal: the workload's tty is a /dev/pts, `stty size` is ours, a
    resize reaches it, ^C ends `sleep` with 130, our terminal's settings are restored."""
    import fcntl
    import pty
    import struct
    import termios
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 33, 97, 0, 0))
    before = termios.tcgetattr(slave)
    argv = [NESHOST, "run", "--accel", "tcg", "--ready-timeout", "100", "--state", c.state, "--vm",
            "t", "-it", "--", "sh", "-c", "tty; stty size; echo ready; read x; stty size; exec sleep 100"]

    def child_setup():
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    p = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=c.env,
                         preexec_fn=child_setup, close_fds=True)
    seen = b""
    deadline = time.monotonic() + BOUND

    def read_until(needle):
        nonlocal seen
        import select
        while needle not in seen:
            left = deadline - time.monotonic()
            check(left > 0 and p.poll() is None, f"waiting for {needle!r}; seen {seen!r}")
            r, _, _ = select.select([master], [], [], min(left, 1.0))
            if r:
                try:
                    seen += os.read(master, 65536)
                except OSError:
                    break
    try:
        read_until(b"ready")
        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))  # SIGWINCH
        # The resize travels as a frame; the guest applies it before our "go" arrives (same channel,
        # in order).
        os.write(master, b"go\r")
        read_until(b"40 120")
        os.write(master, b"\x03")  # ^C: the guest's line discipline makes it SIGINT
        rc = p.wait(timeout=BOUND)
        import select
        while select.select([master], [], [], 0)[0]:  # what is left (our slave fd keeps it open)
            try:
                r = os.read(master, 65536)
            except OSError:
                break
            if not r:
                break
            seen += r
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    text = seen.decode(errors="replace")
    check(rc == 130, f"exit status {rc}, want 130; terminal:\n{text}")
    check("/dev/pts/" in text, f"tty: {text!r}")
    check("33 97" in text, f"stty size: {text!r}")
    after = termios.tcgetattr(slave)
    check(after == before, "the terminal's settings were not restored")
    os.close(master)
    os.close(slave)


def case_unread_stdout(c):
    """`--timeout 4 --grace 2 -- yes` with stdout a pipe nobody reads: 124 in bounded time, no QEMU
    left (the close() check), the outcome recorded."""
    p = subprocess.Popen([NESHOST, "run", "--accel", "tcg", "--ready-timeout", "100", "--state",
                          c.state, "--vm", "t", "--timeout", "4", "--grace", "2", "--", "yes"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=c.env)
    try:
        rc = p.wait(timeout=BOUND)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        raise Failure("neshost hung with an unread stdout")
    finally:
        p.stdout.close()
    check(rc == 124, f"exit status {rc}, want 124")
    r = c.record()
    check((r["outcome"], r["exit_status"]) == ("timeout", 124), f"record {r}")


def case_survive(c):
    """Channel survival through a real VMM: QEMU started outside the listener's process (as an
    embedder's VMM is), its virtio-serial chardev with reconnect=1; `neshost serve --reconnect`
    is SIGKILLed while the workload runs, `serve --resume` takes over on the same path and state
    dir, the guest redials through QEMU's reconnecting chardev and the outcome is recorded once."""
    sock = os.path.join(c.tmp, "vm.sock")
    desc = os.path.join(c.tmp, "desc.json")
    with open(desc, "w") as f:
        json.dump({"exec": {"argv": ["/bin/sh", "-c", "sleep 4; exit 7"], "env": {"PATH": "/bin"}, "uid": 0, "gid": 0},
                   "geometry": {"width": 1, "height": 1, "fps": 1}, "on_exit": {"terminal": True}}, f)

    def serve(*extra):
        p = Proc([NESHOST, "serve", "--listen", "unix:" + sock, "--state", c.state, "--vm", "s",
                  "--ready-timeout", "100", *extra], c.env)
        c.procs.append(p)
        check(p.wait_text("out", " listening "), "serve listens")
        return p

    s1 = serve("--descriptor", desc, "--reconnect", "60")
    qemu = Proc(["qemu-system-x86_64", "-M", "q35", "-accel", "tcg", "-m", "256", "-smp", "1", "-no-reboot",
                 "-nodefaults", "-no-user-config", "-display", "none",
                 "-kernel", os.path.join(SRC, ".cache/kernel/vmlinuz"), "-initrd", os.environ["NESHOST_INITRD"],
                 "-append", "console=ttyS0 quiet loglevel=0 panic=-1 nesinit.channel=virtio-port:nes.0",
                 "-chardev", "stdio,id=con0,signal=off", "-serial", "chardev:con0",
                 "-device", "virtio-serial-pci,id=vser0",
                 "-chardev", "socket,id=nes0,server=off,reconnect=1,path=" + sock,
                 "-device", "virtserialport,bus=vser0.0,chardev=nes0,name=nes.0"], c.env, stdin=subprocess.DEVNULL)
    c.procs.append(qemu)
    check(s1.wait_text("out", " started"), "the first host saw started")
    s1.p.kill()
    s1.finish()
    t0 = time.monotonic()
    s2 = serve("--resume", "--generation", "1")
    check(s2.wait_text("out", " resumed "), "the guest resumed through QEMU's reconnecting chardev")
    resumed_ms = (time.monotonic() - t0) * 1000
    rc = s2.finish()
    out = s2.out.decode(errors="replace")
    check(rc == 7, f"resumed serve: exit {rc}, want 7\n{out}")
    r = c.record("s")
    check((r["outcome"], r["exit_code"], r["generation"]) == ("exited", 7, 1), f"record {r}")
    try:
        qemu.p.wait(timeout=BOUND)  # the guest powered off after the ack
    except subprocess.TimeoutExpired:
        raise Failure("QEMU still running after the ack")
    qemu.finish()
    console = qemu.out.decode(errors="replace")
    check("nesinit: channel: redialled" in console, "the init's console says it redialled:\n" + console[-3000:])
    check("nesinit: term-workload" not in console, "the workload was not signalled")
    print(f"survive: {resumed_ms:.0f} ms from starting the new host to the resumed session")


def case_adopt(c):
    """issue 28: a detached VM's QEMU and its share's virtiofsd outlive its SIGKILLed monitor (no
    PR_SET_PDEATHSIG, its chardevs redial); `neshost wait` starts a replacement monitor, which takes the session over
    through the resume path; `neshost kill` reaches the workload through it; the exit (7) is
    recorded once. Then QEMU SIGKILLed under a live monitor: a failed outcome with a reason, no hang."""
    work = ("trap 'exit 7' USR1; i=1; while [ $i -le 5 ]; do echo line $i; i=$((i+1)); done; "
            "while :; do sleep 1; done")
    share = os.path.join(c.tmp, "share")
    os.mkdir(share)
    pid = c.detach("a", "-v", f"{share}:/data", "--", "/bin/sh", "-c", "echo in-share > /data/f; " + work)
    with open(os.path.join(c.state, "a", "vmm.json")) as f:
        vmm = json.load(f)
    qemu = vmm["vmm"]["pid"]
    daemons = [d["process"]["pid"] for d in vmm["daemons"]]
    check([d["name"] for d in vmm["daemons"]] == ["virtiofsd nes.v0"], f"vmm.json names the share's daemon: {vmm}")
    check(qemu in [q.pid for q in processes() if "qemu-system" in q.cmd], f"vmm.json names QEMU: {vmm}")
    poll(lambda: c.neshost("logs", "--state", c.state, "a")[1].count("line ") == 5, "lines 1-5 logged")
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)  # the monitor was reparented to us (the subreaper)
    t0 = time.monotonic()
    check(os.path.exists(f"/proc/{qemu}") and open(f"/proc/{qemu}/stat").read().rsplit(")", 1)[1].split()[0] != "Z",
          "QEMU outlives its monitor")
    w = Proc([NESHOST, "wait", "--state", c.state, "a"], c.env)
    c.procs.append(w)
    log = os.path.join(c.state, "a", "monitor.log")
    poll(lambda: "the guest resumed its session" in open(log).read(), "the replacement has the channel back")
    resumed_ms = (time.monotonic() - t0) * 1000
    with open(os.path.join(c.state, "a", "monitor.json")) as f:
        new = json.load(f)
    check(new["pid"] != pid and new["generation"] == 1, f"a replacement of generation 1: {new}")
    rc, _, err = c.neshost("kill", "--state", c.state, "-s", "USR1", "a")
    check(rc == 0, f"kill through the replacement: {rc} {err!r}")
    rc = w.finish()
    check(rc == 7 and w.out.decode().strip() == "7", f"wait re-adopts and gets 7: {rc} {w.err.decode()!r}")
    r = c.record("a")
    check((r["outcome"], r["exit_code"], r["generation"]) == ("exited", 7, 1), f"record {r}")
    check(open(log).read().count("taken over from the monitor gone") == 1, "one replacement")
    os.waitpid(new["pid"], 0)  # the replacement (reparented to us) exits once QEMU is down
    os.waitpid(qemu, 0)  # QEMU too was reparented to us when its monitor died
    for d in daemons:  # and virtiofsd, which the replacement ended by its identity
        os.waitpid(d, 0)
    with open(os.path.join(share, "f")) as f:
        check(f.read() == "in-share\n", "the share served the guest")
    _, logs, _ = c.neshost("logs", "--state", c.state, "a")
    seen = [l for l in logs.splitlines() if l.startswith("line ")]
    check(seen == [f"line {i}" for i in range(1, 6)], f"lines 1-5 once each: {seen}")
    # QEMU killed while its monitor lives: failed, with a reason; the monitor does not hang.
    pid = c.detach("q", "--", "/bin/sleep", "1000")
    with open(os.path.join(c.state, "q", "vmm.json")) as f:
        os.kill(json.load(f)["vmm"]["pid"], signal.SIGKILL)
    rc, out, err = c.neshost("wait", "--state", c.state, "q")
    r = c.record("q")
    check(rc == 125 and r["outcome"] not in ("exited", "signalled") and r["reason"],
          f"QEMU killed: a failed outcome with a reason: {rc} {r}")
    os.waitpid(pid, 0)
    print(f"adopt: {resumed_ms:.0f} ms from the monitor's SIGKILL to the replacement's resumed session")


def case_adopt_duties(c):
    """issue 44's kill points in a real VM: the monitor SIGKILLed with --timeout pending and a share
    served; `inspect` adopts; the replacement says the limit goes on from the recorded deadline
    (lost: nothing). Then the share's virtiofsd SIGKILLed after the adoption: the replacement
    notices (it watches the recorded daemons by identity) and ends the VM in order as the first
    monitor would, the cause recorded first: stopped, 143, the reason naming the share (lost:
    nothing: the workload was stopped, as it is when the first monitor sees its virtiofsd die)."""
    share = os.path.join(c.tmp, "share")
    os.mkdir(share)
    pid = c.detach("d", "--timeout", "900", "--grace", "1", "-v", f"{share}:/d", "--", "/bin/sh", "-c",
                   "echo armed > /d/armed && echo share-done; exec sleep 1000")
    vmm_path = os.path.join(c.state, "d", "vmm.json")
    poll(lambda: "share-done" in c.neshost("logs", "--state", c.state, "d")[1], "the workload is done with the share")
    with open(vmm_path) as f:
        vmm = json.load(f)
    check(vmm.get("timeout_ms") == 900000 and vmm.get("deadline_boottime_ns") and vmm.get("started_at"),
          f"vmm.json records the limit, its deadline and the VM's start: {vmm}")
    qemu = vmm["vmm"]["pid"]
    daemons = [d["process"]["pid"] for d in vmm["daemons"]]
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    rc, out, err = c.neshost("inspect", "--state", c.state, "d")
    st = json.loads(out) if rc == 0 else {}
    check(st.get("status") == "running" and st.get("monitor_alive") and st.get("monitor_pid") != pid,
          f"inspect adopts it: {rc} {out!r} {err!r}")
    log = os.path.join(c.state, "d", "monitor.log")
    poll(lambda: "the guest resumed its session" in open(log).read(), "the replacement has the channel back")
    check("its --timeout (900000 ms) goes on" in open(log).read(), "the replacement re-armed the limit")
    os.kill(daemons[0], signal.SIGKILL)
    rc, out, err = c.neshost("wait", "--state", c.state, "--format", "json", "d")
    w = json.loads(out) if out.strip() else {}
    check(rc == 143 and (w.get("outcome"), w.get("signal"), w.get("status")) == ("signalled", 15, "stopped"),
          f"the replacement ended it in order: {rc} {w} {err!r}\n{open(log).read()[-3000:]}")
    check("stopped by its monitor" in w.get("reason", "") and "share 'nes.v0': virtiofsd" in w.get("reason", ""),
          f"the cause is recorded: {w.get('reason')!r}")
    check(w.get("started_at") == vmm["started_at"], f"started_at is the VM's start: {w.get('started_at')} {vmm}")
    os.waitpid(st["monitor_pid"], 0)  # the replacement exits once QEMU is down (reparented to us)
    os.waitpid(qemu, 0)
    for d in daemons:
        os.waitpid(d, 0)
    # virtiofsd's sandboxed child lost its parent and ends (its death signal), reparented to us.
    poll(all_children_reaped, "every process of the VM ended")


def case_netns_adopt(c):
    """issue 44's kill points in netns mode: a detached VM's monitor SIGKILLed; `stop` adopts and
    ends it; the replacement tears down the tap and the redirects the monitor gone made (recorded
    in vmm.json): A is as it was. Then the monitor and QEMU both killed: `ps` tears them down.
    Lost: nothing."""
    a, b = enter_netns_pair()
    try:
        a_before = wire_netns_pair(a, b)
        pid = c.detach("n", "--network", f"netns:{a.path}", "--", "/bin/sh", "-c", "echo up; exec sleep 1000")
        with open(os.path.join(c.state, "n", "vmm.json")) as f:
            vmm = json.load(f)
        check(vmm.get("netns", {}).get("interface") == "eth0" and vmm["netns"].get("tap", "").startswith("nes"),
              f"vmm.json records the attachment: {vmm}")
        tap = [l for l in a.sh("ip -o link show").split("\n") if ": nes" in l]
        check(len(tap) == 1, f"one tap in A while the VM runs: {tap}")
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        rc, _, err = c.neshost("stop", "--state", c.state, "n")
        check(rc == 0, f"stop adopts and ends it: {rc} {err!r}")
        rc, out, err = c.neshost("inspect", "--state", c.state, "n")
        new = json.loads(out).get("monitor_pid") if rc == 0 else None
        if new:
            os.waitpid(new, 0)  # the replacement: tears down once the VM has ended, then exits
        os.waitpid(vmm["vmm"]["pid"], 0)
        left = a.sh("ip -o link show; tc qdisc show dev eth0")
        check(": nes" not in left and "ingress" not in left, f"A after the VM: {left!r}\n"
              f"{open(os.path.join(c.state, 'n', 'monitor.log')).read()[-2000:]}")
        a_after = a.sh("ip -4 -o addr show dev eth0; ip link show dev eth0; ip route; tc qdisc show dev eth0")
        check(a_after == a_before, f"eth0 changed: {a_before!r} -> {a_after!r}")
        # The monitor and its QEMU both SIGKILLed: nobody is left to end the VM; the next command
        # (ps) finds it failed and tears down what its monitor made (the namespace's path lives).
        pid = c.detach("m", "--network", f"netns:{a.path}", "--", "/bin/sh", "-c", "echo up; exec sleep 1000")
        with open(os.path.join(c.state, "m", "vmm.json")) as f:
            qemu = json.load(f)["vmm"]["pid"]
        check(": nes" in a.sh("ip -o link show"), "a tap in A while the second VM runs")
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.kill(qemu, signal.SIGKILL)
        os.waitpid(qemu, 0)
        rc, out, err = c.neshost("ps", "-a", "--state", c.state)
        check(rc == 0 and "failed" in out, f"ps: the VM failed: {rc} {out!r} {err!r}")
        left = a.sh("ip -o link show; tc qdisc show dev eth0")
        check(": nes" not in left and "ingress" not in left, f"A after the monitor and QEMU were killed: {left!r}")
        check(a.sh("ip -4 -o addr show dev eth0; ip link show dev eth0; ip route; tc qdisc show dev eth0") == a_before,
              "eth0 as it was")
    finally:
        a.close()
        b.close()


def case_adopt_stream(c):
    """issue 28 in a real VM: 64 MiB of random bytes and then 2000 numbered lines on stdout, the
    monitor SIGKILLed twice while it streams (after the first and after the second 16 MiB were
    written into the init's pipe; what the guest's replay ring, virtio and the monitor held then
    was in flight). Each time `neshost kill -s USR1` finds the monitor dead, starts a replacement
    (which resumes the data channel from workload.log's positions) and, through it, lets the
    workload go on. workload.log, rotated at 16 MiB across both replacements, gives back exactly
    the guest's bytes (SHA-256 equal to the guest's own), every line once, nothing dropped; the
    exit (7) recorded once."""
    import hashlib
    gate = ("while [ -z \"$go\" ]; do sleep 0.05; done; go=")  # USR1 (neshost kill) sets $go
    work = ("go=; trap 'go=1' USR1; dd if=/dev/urandom of=/tmp/f bs=1048576 count=64 2>/dev/null; "
            "sha256sum /tmp/f >&2; head -c 16777216 /tmp/f; echo mark1 >&2; " + gate + "; "
            "tail -c +16777217 /tmp/f | head -c 16777216; echo mark2 >&2; " + gate + "; "
            "tail -c +33554433 /tmp/f; rm /tmp/f; i=1; while [ $i -le 2000 ]; do echo line $i; i=$((i+1)); done; "
            "exit 7")
    pid = c.detach("s", "--mem", "384", "--log-max-size", "16m", "--log-max-files", "10", "--",
                   "/bin/sh", "-c", work)
    wlog = os.path.join(c.state, "s", "workload.log")
    mjson = os.path.join(c.state, "s", "monitor.json")

    def marked(m):  # in the live log or one rotated since (the mark may be followed by 16 MiB)
        def found():
            d = os.path.dirname(wlog)
            return any(f" {m}\n".encode() in open(os.path.join(d, n), "rb").read()
                       for n in os.listdir(d) if n.startswith("workload.log") and not n.endswith(".pos"))
        return found

    monitors = [pid]
    for n, mark in ((1, "mark1"), (2, "mark2")):
        poll(marked(mark), f"the workload wrote {mark} (its {n * 16} MiB are on their way)")
        with open(mjson) as f:
            cur = json.load(f)["pid"]
        check(cur == monitors[-1], f"monitor.json names the live monitor {monitors[-1]}: {cur}")
        os.kill(cur, signal.SIGKILL)
        os.waitpid(cur, 0)  # reparented to us (the subreaper)
        rc, _, err = c.neshost("kill", "--state", c.state, "-s", "USR1", "s")
        check(rc == 0, f"kill #{n} through a replacement: {rc} {err!r}")
        with open(mjson) as f:
            new = json.load(f)
        check(new["pid"] not in monitors and new["generation"] == 1, f"replacement #{n}: {new} after {monitors}")
        monitors.append(new["pid"])
    rc, out, err = c.neshost("wait", "--state", c.state, "s")
    check(rc == 7 and out.strip() == "7", f"wait: {rc} {out!r} {err!r}")
    os.waitpid(monitors[-1], 0)
    with open(os.path.join(c.state, "s", "vmm.json")) as f:
        os.waitpid(json.load(f)["vmm"]["pid"], 0)  # QEMU, reparented to us with its first monitor
    r = subprocess.run([NESHOST, "logs", "--state", c.state, "s"], capture_output=True, env=c.env, timeout=BOUND)
    check(r.returncode == 0, f"logs: {r.returncode} {r.stderr[-2000:]!r}")
    out, err = r.stdout, r.stderr.decode(errors="replace")
    body, tail = out[:64 << 20], out[64 << 20:]
    sha = guest_sha(r.stderr, "adopt_stream")
    lost = [l for l in lines(err) if "dropped" in l or "lost" in l]
    want_tail = "".join(f"line {i}\n" for i in range(1, 2001)).encode()
    check(len(out) == (64 << 20) + len(want_tail) and hashlib.sha256(body).hexdigest() == sha and tail == want_tail,
          f"stdout: {len(out)} bytes, want {(64 << 20) + len(want_tail)}; sha256 "
          f"{'equal' if hashlib.sha256(body).hexdigest() == sha else 'differs'}; lines "
          f"{'exact' if tail == want_tail else repr(tail[:200])}; gaps said: {lost}")
    check(not lost and [l for l in lines(err) if l.startswith("mark")] == ["mark1", "mark2"],
          f"stderr: the marks once each, no gap: {err[-2000:]!r}")
    rec = c.record("s")
    check((rec["outcome"], rec["exit_code"], rec["generation"]) == ("exited", 7, 1), f"record {rec}")
    with open(os.path.join(c.state, "s", "monitor.log")) as f:
        mlog = f.read()
    check(mlog.count("taken over from the monitor gone") == 2, "two replacements, one per kill")
    rotated = sorted(n for n in os.listdir(os.path.join(c.state, "s")) if n.startswith("workload.log."))
    print(f"adopt_stream: {len(out)} bytes exact across 2 monitor kills; log files {rotated}")


def case_adopt_stdin(c):
    """issue 28: stdin with -i across a SIGKILLed monitor, its source a FIFO as containerd's is. A
    foreground `neshost run --vmm-outlives -i` (the shim's way) feeds 9.9 MB of numbered lines from
    the FIFO to `cat`, which echoes it; the test holds a reader of its own that never reads (as the shim
    does), so the writer waits instead of failing while no monitor lives. The monitor is SIGKILLed
    while the first half is still being written, `neshost wait` starts a replacement, which
    reopens the FIFO (vmm.json's stdin) and sends again from stdin.spool what the dead monitor had
    taken from the FIFO and the guest never received (the monitor splices the FIFO into the spool:
    nothing is taken from it without being kept). workload.log holds every byte written, once, in
    order; exit 5. Before the spool, a kill that landed inside the monitor's read(2) lost that
    read's 64 KiB uncounted (CI, 2026-12-06). The echo of a saturated stdin across a takeover is
    what deadlocked before the init acknowledged stdin as the workload takes it (docs/host.md
    "Re-adoption", docs/protocol.md "Acks")."""
    import hashlib
    fifo = os.path.join(c.tmp, "stdin")
    os.mkfifo(fifo)
    hold = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # the shim's never-read reader
    w = os.open(fifo, os.O_WRONLY)
    src = b"".join(b"in %d\n" % i for i in range(1, 1000001))  # 9.9 MB
    half = src.index(b"in 500001\n")  # far more than the ~1 MiB the buffers on the way hold
    try:
        rd = os.open(fifo, os.O_RDONLY)
        try:
            # 1M echoed lines are ~53 MB of CRI records: room for all of them (12 x 16 MiB).
            p = Proc([NESHOST, "run", "--vmm-outlives", "-i", "--accel", "tcg", "--ready-timeout", "100",
                      "--log-max-size", "16m", "--log-max-files", "12", "--state",
                      c.state, "--vm", "i", "--", "sh", "-c", "echo reading; cat; exit 5"], c.env, stdin=rd)
        finally:
            os.close(rd)
        c.procs.append(p)
        first = threading.Thread(target=_write_all, args=(w, src[:half]))
        first.start()
        check(p.wait_text("out", "reading\n"), "the workload reads its stdin")
        spool = os.path.join(c.state, "i", "stdin.spool")
        poll(lambda: os.path.exists(spool) and os.path.getsize(spool) >= 1 << 20,
             "the monitor took 1 MiB of stdin from the FIFO")
        with open(os.path.join(c.state, "i", "vmm.json")) as f:
            vmm = json.load(f)
        check(vmm.get("stdin") == {"kind": "fifo", "path": fifo, "offset": 0}, f"vmm.json names the FIFO: {vmm}")
        os.kill(p.p.pid, signal.SIGKILL)
        p.p.wait()
        check(first.is_alive(), "the monitor was killed while the first half was still being written")
        wt = Proc([NESHOST, "wait", "--state", c.state, "i"], c.env)  # starts the replacement
        c.procs.append(wt)
        first.join(BOUND)
        check(not first.is_alive(), "the first half written (the FIFO kept a reader while no monitor lived)")
        _write_all(w, src[half:])
        os.close(w)
        w = -1
        rc = wt.finish()
        check(rc == 5 and wt.out.decode().strip() == "5", f"wait re-adopts and gets 5: {rc} {wt.err.decode()!r}")
        with open(os.path.join(c.state, "i", "monitor.json")) as f:
            os.waitpid(json.load(f)["pid"], 0)  # the replacement, reparented to us (the subreaper)
    finally:
        if w >= 0:
            os.close(w)
        os.close(hold)
    with open(os.path.join(c.state, "i", "vmm.json")) as f:
        os.waitpid(json.load(f)["vmm"]["pid"], 0)  # QEMU, reparented to us with its first monitor
    with open(os.path.join(c.state, "i", "monitor.log")) as f:
        mlog = f.read()
    said = [l for l in mlog.splitlines() if "stdin continues at byte" in l]
    check(len(said) == 1, f"the replacement says where stdin continues, once: {mlog[-3000:]!r}")
    lost = int(said[0].split(" bytes lost")[0].rsplit(" ", 1)[1])
    again = int(said[0].split(" bytes the monitor gone took from")[0].rsplit(" ", 1)[1])
    at = int(said[0].split(" at byte ")[1].split(":")[0])
    check(lost == 0, f"nothing the dead monitor took is lost: {said[0]!r}")
    r = subprocess.run([NESHOST, "logs", "--state", c.state, "i"], capture_output=True, env=c.env, timeout=BOUND)
    want = b"reading\n" + src
    got = r.stdout
    if got != want:
        at_diff = next((i for i in range(min(len(got), len(want))) if got[i] != want[i]), min(len(got), len(want)))
        print(f"adopt_stdin: first difference at byte {at_diff}: got {got[at_diff:at_diff + 40]!r}, want "
              f"{want[at_diff:at_diff + 40]!r}; monitor.log: {mlog[-3000:]}", file=sys.stderr)
        d = os.path.join(c.state, "i")
        for n in sorted(os.listdir(d)):
            fp = os.path.join(d, n)
            head = open(fp, "rb").read(300) if n.startswith("workload") else b""
            print(f"  {n} {os.path.getsize(fp)} {head!r}", file=sys.stderr)
    check(got == want,
          f"the workload echoed the {len(src)} bytes written (taken over at byte {at}): got {len(got)} bytes "
          f"(SHA-256 {hashlib.sha256(got).hexdigest()}), want {len(want)} ({hashlib.sha256(want).hexdigest()})")
    rec = c.record("i")
    check((rec["outcome"], rec["exit_code"]) == ("exited", 5), f"record {rec}")
    print(f"adopt_stdin: {len(src)} bytes written, the monitor killed at guest byte {at}; {again} bytes it had "
          f"taken went again from stdin.spool; all echoed back exactly, once")


def _write_all(fd, b):
    """Blocking writes of all of b to fd (a FIFO)."""
    v = memoryview(b)
    while v:
        v = v[os.write(fd, v[:65536]):]


CLONE_NEWNET = 0x40000000


class NetnsHolder(netns.NetnsHolder):
    """tests/support/netns.py's holder, failing the case as check() does."""
    error = Failure


def enter_netns_pair():
    """This runner into a network namespace of its own (lo up, nothing else), then two namespaces
    A and B held open (NetnsHolder): (a, b). The caller ends them (finally)."""
    libc = ctypes.CDLL(None, use_errno=True)
    outer = os.readlink("/proc/self/ns/net")
    check(libc.unshare(CLONE_NEWNET) == 0, f"unshare(CLONE_NEWNET): errno {ctypes.get_errno()}")
    check(os.readlink("/proc/self/ns/net") != outer, "still in the machine's namespace")
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True, timeout=BOUND)
    return NetnsHolder(), NetnsHolder()


def wire_netns_pair(a, b):
    """A's eth0 10.99.0.2/24 (default via 10.99.0.1), its veth peer in B with 10.99.0.1/24.
    Returns A's addresses, link, routes and qdiscs as `ip`/`tc` show them (to compare after)."""
    a.sh(f"ip link add eth0 address 02:00:00:99:00:02 mtu 1400 type veth peer name peer0 netns {b.p.pid}")
    a.sh("ip addr add 10.99.0.2/24 dev eth0 && ip link set eth0 up && ip route add default via 10.99.0.1")
    b.sh("ip addr add 10.99.0.1/24 dev peer0 && ip link set peer0 up")
    return a.sh("ip -4 -o addr show dev eth0; ip link show dev eth0; ip route; tc qdisc show dev eth0")


def case_netns(c):
    """--network netns:PATH (the CNI model) in a real VM. The whole case runs in a network namespace
    of its own (lo up, nothing else); namespace A holds eth0 10.99.0.2/24 (default via 10.99.0.1),
    the veth peer is in namespace B with 10.99.0.1/24. The guest takes eth0 over: it holds
    10.99.0.2 (its `ip addr`), reaches B (nc to B's listener) and B reaches its httpd at
    10.99.0.2. After the VM: the tap and the qdiscs are gone from A, eth0 is as it was."""
    a, b = enter_netns_pair()
    try:
        a_before = wire_netns_pair(a, b)
        # B's listener: what the guest sends it says the guest reached B, after its httpd is up.
        listener = Proc(["nsenter", f"--net={b.path}", "busybox", "nc", "-l", "-p", "9090"], c.env)
        c.procs.append(listener)
        p = c.start("--network", f"netns:{a.path}", "--",
                    "/bin/sh", "-c", "ip -4 addr show dev eth0; ip -4 route; cat /sys/class/net/eth0/mtu; "
                    "echo netns-page > /tmp/index.html; httpd -p 8080 -h /tmp && "
                    "echo from-guest | nc 10.99.0.1 9090; exec sleep 1000")
        check(listener.wait_text("out", "from-guest"), f"the guest did not reach B; neshost stderr:\n{p.err.decode()}")
        got = b.sh("printf 'GET /index.html HTTP/1.0\\r\\n\\r\\n' | busybox nc 10.99.0.2 8080")
        check("200 OK" in got and "netns-page" in got, f"B fetching the guest's page: {got!r}")
        out = p.out.decode(errors="replace")
        check("inet 10.99.0.2/24" in out, f"the guest's address: {out!r}")
        check("default via 10.99.0.1 dev eth0" in out, f"the guest's default route: {out!r}")
        check("\n1400\n" in out, f"the guest's MTU: {out!r}")
        tap = [l for l in a.sh("ip -o link show").split("\n") if ": nes" in l]
        check(len(tap) == 1, f"one tap in A while the VM runs: {tap}")
        rc, _, err = c.neshost("stop", "--state", c.state, "t")
        check(rc == 0, f"stop: {rc} {err!r}")
        rc = p.finish()
        check(rc == 143, f"neshost run exit status {rc}, want 143 (SIGTERM); stderr:\n{p.err.decode()}")
        left = a.sh("ip -o link show; tc qdisc show dev eth0")
        check(": nes" not in left and "ingress" not in left, f"A after the VM: {left!r}")
        a_after = a.sh("ip -4 -o addr show dev eth0; ip link show dev eth0; ip route; tc qdisc show dev eth0")
        check(a_after == a_before, f"eth0 changed: {a_before!r} -> {a_after!r}")
        # Not a network namespace: 125, nothing started.
        rc, _, err = c.neshost("run", "--state", c.state, "--vm", "bad", "--network", "netns:/proc/self/ns/mnt",
                               "--", "true")
        check(rc == 125 and "not a network namespace (a mnt namespace)" in err, f"netns:/proc/self/ns/mnt: {rc} {err!r}")
        # A namespace without a usable interface: 125 naming what it found.
        rc, _, err = c.neshost("run", "--state", c.state, "--vm", "bad", "--network", f"netns:{b.path}x", "--", "true")
        check(rc == 125 and "not a network namespace" in err, f"a missing path: {rc} {err!r}")
        e = NetnsHolder()
        try:
            rc, _, err = c.neshost("run", "--state", c.state, "--vm", "bad", "--network", f"netns:{e.path}", "--", "true")
            check(rc == 125 and "no interface to take over" in err and "lo (loopback)" in err, f"empty netns: {rc} {err!r}")
        finally:
            e.close()
        check(not os.path.exists(os.path.join(c.state, "bad")), "a refused run left state behind")
    finally:
        a.close()
        b.close()


# ---- issue 26: the VM's network. Each net_* case runs in a network namespace made for it
# (tests/support/netns.py, see main()): lo, a dead-end veth pair and a default route through it,
# so passt starts and nothing leaves the machine. The host's servers listen on 127.0.0.1 there.

class HostServer:
    """A TCP server on 127.0.0.1 (an ephemeral port, `port`) in the case's namespace: one thread
    accepts and calls handler(conn) per connection, appending its value (or the OSError) to
    `results`. A context manager: leaving it stops the thread and closes the socket."""

    def __init__(self, handler):
        import socket
        self.s = socket.socket()
        self.s.bind(("127.0.0.1", 0))
        self.s.listen(16)
        self.port = self.s.getsockname()[1]
        self.handler, self.results = handler, []
        self.t = threading.Thread(target=self._serve)
        self.t.start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.s.accept()
            except OSError:  # shut down by close()
                return
            with conn:
                conn.settimeout(BOUND)
                try:
                    self.results.append(self.handler(conn))
                except OSError as e:
                    self.results.append(e)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        import socket
        try:
            self.s.shutdown(socket.SHUT_RDWR)  # wakes the accept (Linux: EINVAL)
        except OSError:
            pass
        self.t.join(BOUND)
        self.s.close()


def recv_all(conn):
    data = b""
    while True:
        b = conn.recv(1 << 16)
        if not b:
            return data
        data += b


def http_serve(body):
    """A HostServer handler: reads a request's head, answers 200 with `body`, returns the head."""
    def handler(conn):
        head = b""
        while b"\r\n\r\n" not in head:
            b = conn.recv(4096)
            if not b:
                break
            head += b
        conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        return head
    return handler


def http_get(port, path="/"):
    """GET http://127.0.0.1:port/path (HTTP/1.0); the body of a 200, else None (refused, reset,
    closed early, or no answer in 4 s: passt accepts for a guest port nobody listens on yet and
    then holds the connection, where slirp closes it; the caller polls)."""
    import socket
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=4) as s:
            s.sendall(b"GET %s HTTP/1.0\r\n\r\n" % path.encode())
            data = recv_all(s)
    except OSError:
        return None
    head, sep, body = data.partition(b"\r\n\r\n")
    return body if sep and head.split(b"\r\n")[0].split(b" ")[1:2] == [b"200"] else None


def free_port(kind="tcp"):
    """A port nothing in this namespace holds (the case's own namespace: no one else takes it)."""
    import socket
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM if kind == "tcp" else socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def guest_fetch(host, port):
    """The guest's HTTP GET with busybox nc (its wget crashes in these guests), then nc's status
    (0: the host's FIN arrived after the answer). Bounded by `timeout 8` (143 then)."""
    return f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | timeout 8 nc -w 5 {host} {port}; r=$?; echo; echo nc=$r"


def case_net_host_gateway(c):
    """The default network (user: passt) with --add-host hostsvc:host-gateway: the guest reaches a
    server on the host's 127.0.0.1 by that name (10.0.2.2) and gets its file, then the host's FIN;
    without it the same address is closed (passt --no-map-gw) and the server never sees a
    connection."""
    body = b"served from the host's loopback %d\n" % os.getpid()
    with HostServer(http_serve(body)) as srv:
        rc, out, err = c.run("--add-host", "hostsvc:host-gateway", "--", "/bin/sh", "-c",
                             "ls /sys/class/net; " + guest_fetch("hostsvc", srv.port))
        check(rc == 0, f"exit status {rc}; stderr:\n{err[-3000:]}")
        check(lines(out)[:2] == ["eth0", "lo"], f"the guest's interfaces: {out!r}")
        check(out.encode().find(b"\r\n\r\n" + body) >= 0 and "nc=0" in out,
              f"the guest's fetch: {out!r}")
        check(len(srv.results) == 1 and srv.results[0].startswith(b"GET / HTTP/1.0"), f"the server saw {srv.results}")
        rc, out, err = c.run("--", "/bin/sh", "-c", guest_fetch("10.0.2.2", srv.port), vm="closed")
        check(rc == 0, f"exit status {rc}; stderr:\n{err[-3000:]}")
        check(body.decode() not in out and "nc=0" not in out, f"the host's loopback was reachable: {out!r}")
        check(len(srv.results) == 1, f"the server saw a connection without --add-host: {srv.results}")


def publish_check(c, *net):
    """-p 127.0.0.1:P:8080 with busybox httpd in the guest: the host fetches the page (polled
    until the guest serves, bounded), `neshost port` lists the mapping, SIGTERM ends the run."""
    page = b"a page from the guest %d\n" % os.getpid()
    port = free_port()
    p = c.start(*net, "-p", f"127.0.0.1:{port}:8080", "--", "/bin/sh", "-c",
                "mkdir /www && printf '%s' > /www/index.html && exec httpd -f -p 8080 -h /www" % page.decode().replace("\n", "\\n"))

    def fetched():
        if p.p.poll() is not None:
            raise Failure(f"neshost run ended ({p.p.returncode}) before the page was served; stderr:\n"
                          f"{p.err.decode(errors='replace')[-3000:]}")
        return http_get(port, "/index.html")

    got = poll(fetched, f"the page on 127.0.0.1:{port}")
    check(got == page, f"the page: {got!r}, want {page!r}")
    rc, out, err = c.neshost("port", "--state", c.state, "t")
    check(rc == 0 and lines(out) == [f"8080/tcp -> 127.0.0.1:{port}"], f"neshost port: {rc} {out!r} {err!r}")
    p.p.send_signal(signal.SIGTERM)
    rc = p.finish()
    check(rc == 143, f"exit status {rc} after SIGTERM, want 143")


def case_net_publish(c):
    """The publish check in the default mode (user: passt)."""
    publish_check(c)


def case_net_slirp(c):
    """--network slirp (QEMU's libslirp): the host's loopback is open at 10.0.2.2 without
    --add-host (the documented difference from user mode: docs/network.md), 8 MiB from it arrive
    whole; then the publish check."""
    import hashlib
    blob = os.urandom(8 << 20)
    body = b"served from the host's loopback %d\n" % os.getpid()
    with HostServer(http_serve(body)) as web, HostServer(lambda conn: conn.sendall(blob) or len(blob)) as bulk:
        rc, out, err = c.run("--network", "slirp", "--mem", "320", "--", "/bin/sh", "-c",
                             guest_fetch("10.0.2.2", web.port) + f"; nc 10.0.2.2 {bulk.port} > /tmp/f; "
                             "echo \"bulk=$? $(wc -c < /tmp/f) $(sha256sum < /tmp/f)\"", vm="s")
        check(rc == 0, f"exit status {rc}; stderr:\n{err[-3000:]}")
        check(out.encode().find(b"\r\n\r\n" + body) >= 0, f"the guest's fetch through 10.0.2.2: {out!r}")
        got = [l.split()[:3] for l in lines(out) if l.startswith("bulk=")]
        check(got == [["bulk=0", str(8 << 20), hashlib.sha256(blob).hexdigest()]], f"the download: {got}")
    publish_check(c, "--network", "slirp")


def probe_dir(c):
    """A directory holding the static net_probe, to share into the guest at /probe."""
    d = os.path.join(c.tmp, "probe")
    os.mkdir(d)
    shutil.copy(os.environ["VM_NET_PROBE"], os.path.join(d, "net_probe"))
    return d


def case_net_udp(c):
    """-p ADDR:P:5353/udp with a UDP echo in the guest (net_probe: busybox nc has no -u): the
    host's datagram comes back; "quit" ends the echo and the run (0). ADDR is the namespace's own
    address (the veth's), as a client on another machine would reach a published port: passt
    (0.0~git20230309) under --no-map-gw forwards a datagram from a loopback client with source
    127.0.0.1, which the guest drops, so `-p 127.0.0.1:P:5353/udp` answers nothing in `user` mode
    unless host-gateway is asked for (TCP maps a loopback source to the gateway either way)."""
    import socket
    addr = netns.VETH_ADDR.split("/")[0]
    port = free_port("udp")
    p = c.start("-p", f"{addr}:{port}:5353/udp", "-v", f"{probe_dir(c)}:/probe:ro", "--",
                "/probe/net_probe", "udp-echo", "5353")
    check(p.wait_text("out", "udp-echo 5353\n"), f"the echo never bound; stderr:\n{p.err.decode(errors='replace')[-3000:]}")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((addr, 0))
        s.connect((addr, port))
        s.settimeout(1)

        def ask(msg):  # a datagram may be lost (the guest's ARP, passt's flow set-up): resent by poll
            s.send(msg)
            try:
                return s.recv(65536)
            except OSError:
                return None

        msg = b"datagram %d" % os.getpid()
        got = poll(lambda: ask(msg), "an answer to the host's datagram")
        check(got == msg, f"echo: {got!r}, want {msg!r}")
        check(poll(lambda: ask(b"quit"), "the echo's bye") == b"bye", "quit")
    rc, out, err = c.neshost("port", "--state", c.state, "t")
    check(rc == 0 and f"5353/udp -> {addr}:{port}" in out, f"neshost port: {rc} {out!r} {err!r}")
    rc = p.finish()
    check(rc == 0, f"exit status {rc}; stderr:\n{p.err.decode(errors='replace')[-3000:]}")


def case_net_none(c):
    """--network none: loopback only (no NIC in /sys/class/net)."""
    rc, out, err = c.run("--network", "none", "--", "ls", "/sys/class/net")
    check(rc == 0, f"exit status {rc}; stderr:\n{err[-3000:]}")
    check(lines(out) == ["lo"], f"the guest's interfaces: {out!r}")


def case_net_passt_dies(c):
    """issue 44: passt dies mid-run under a replacement monitor (the kill point "monitor killed,
    then passt"): the replacement watches the passt the monitor gone recorded and ends the VM in
    order, the cause recorded (passt is not restarted: docs/host.md "Re-adoption" says why):
    stopped, 143, the reason naming passt. Lost: the guest's network, said and recorded."""
    pid = c.detach("p", "--grace", "1", "--", "/bin/sh", "-c", "echo up; exec sleep 1000")
    with open(os.path.join(c.state, "p", "vmm.json")) as f:
        vmm = json.load(f)
    passt = [d["process"]["pid"] for d in vmm["daemons"] if d["name"] == "passt"]
    check(len(passt) == 1, f"vmm.json records passt: {vmm}")
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    rc, out, err = c.neshost("inspect", "--state", c.state, "p")
    st = json.loads(out) if rc == 0 else {}
    check(st.get("status") == "running" and st.get("monitor_alive"), f"inspect adopts it: {rc} {out!r} {err!r}")
    log = os.path.join(c.state, "p", "monitor.log")
    poll(lambda: "the guest resumed its session" in open(log).read(), "the replacement has the channel back")
    os.kill(passt[0], signal.SIGKILL)
    rc, out, err = c.neshost("wait", "--state", c.state, "--format", "json", "p")
    w = json.loads(out) if out.strip() else {}
    check(rc == 143 and (w.get("outcome"), w.get("signal"), w.get("status")) == ("signalled", 15, "stopped"),
          f"the replacement ended it in order: {rc} {w} {err!r}\n{open(log).read()[-3000:]}")
    check("stopped by its monitor" in w.get("reason", "") and "passt" in w.get("reason", "") and
          "lost its network" in w.get("reason", ""), f"the cause is recorded: {w.get('reason')!r}")
    os.waitpid(st["monitor_pid"], 0)
    os.waitpid(vmm["vmm"]["pid"], 0)
    poll(all_children_reaped, "every process of the VM ended")


def case_net_bulk(c):
    """32 MiB of random bytes guest -> host over TCP (nc to host-gateway): the host's SHA-256 of
    what it received equals the guest's sha256sum of the bytes it sent."""
    import hashlib

    def digest(conn):
        h, n = hashlib.sha256(), 0
        while True:
            b = conn.recv(1 << 20)
            if not b:
                return n, h.hexdigest()
            h.update(b)
            n += len(b)

    with HostServer(digest) as srv:
        rc, out, err = c.run("--mem", "320", "--add-host", "hostsvc:host-gateway", "--", "/bin/sh", "-c",
                             "dd if=/dev/urandom of=/tmp/blob bs=65536 count=512 2>/dev/null && sha256sum /tmp/blob && "
                             f"nc hostsvc {srv.port} < /tmp/blob; echo nc=$?")
        check(rc == 0, f"exit status {rc}; stderr:\n{err[-3000:]}")
    got = lines(out)
    check(len(got) == 2 and got[1] == "nc=0", f"stdout {out!r}")
    check(srv.results == [(32 << 20, got[0].split()[0])], f"the host got {srv.results}, the guest sent {got[0]}")


def case_net_download(c):
    """8 MiB of random bytes host -> guest over TCP in the default mode (user: passt), three times
    in one VM (the guest's nc from a server on the host's 127.0.0.1 through host-gateway, into a
    file): each arrives whole, the guest's sha256sum equal to the host's. The bar a passt must
    pass (docs/network.md: passt before 0.0~git20260728 loses such downloads under QEMU 7.2)."""
    import hashlib
    blob = os.urandom(8 << 20)
    want = hashlib.sha256(blob).hexdigest()

    def send(conn):
        conn.sendall(blob)
        return len(blob)

    with HostServer(send) as srv:
        rc, out, err = c.run("--mem", "320", "--add-host", "hostsvc:host-gateway", "--", "/bin/sh", "-c",
                             f"for i in 1 2 3; do nc hostsvc {srv.port} > /tmp/f; echo \"nc=$? $(wc -c < /tmp/f) "
                             "$(sha256sum < /tmp/f)\"; done")
        check(rc == 0, f"exit status {rc}; stderr:\n{err[-3000:]}")
    got = [l.split()[:3] for l in lines(out)]
    check(got == [["nc=0", str(8 << 20), want]] * 3, f"the guest got {got}, want 3 x {8 << 20} bytes {want}")
    check(srv.results == [8 << 20] * 3, f"the host sent {srv.results}")


def case_net_dns(c):
    """/etc/resolv.conf, /etc/hosts and /etc/hostname as the init writes them: the user-mode
    default (nameserver 10.0.2.3); then --dns/--dns-search/--dns-option, two --add-host entries
    (an IP and host-gateway) and -h."""
    rc, out, err = c.run("--", "cat", "/etc/resolv.conf", vm="d1")
    check(rc == 0, f"exit status {rc}; stderr:\n{err[-3000:]}")
    conf = [l for l in lines(out) if not l.startswith("#")]
    check(conf == ["nameserver 10.0.2.3"], f"default resolv.conf: {out!r}")
    rc, out, err = c.run("--dns", "192.0.2.53", "--dns-search", "example.test", "--dns-option", "ndots:2",
                         "--add-host", "db:10.1.2.3", "--add-host", "hostsvc:host-gateway", "-h", "webhost",
                         "--", "/bin/sh", "-c",
                         "cat /etc/resolv.conf; echo ---; cat /etc/hosts; echo ---; cat /etc/hostname; hostname",
                         vm="d2")
    check(rc == 0, f"exit status {rc}; stderr:\n{err[-3000:]}")
    parts = out.split("---\n")
    check(len(parts) == 3, f"stdout {out!r}")
    resolv, hosts, name = ([l.split() for l in lines(p) if not l.startswith("#")] for p in parts)
    check(sorted(resolv) == sorted([["nameserver", "192.0.2.53"], ["search", "example.test"], ["options", "ndots:2"]]),
          f"resolv.conf with --dns: {parts[0]!r}")
    check(["10.1.2.3", "db"] in hosts and ["10.0.2.2", "hostsvc"] in hosts, f"/etc/hosts: {parts[1]!r}")
    check(any(h[0] == "10.0.2.15" and "webhost" in h[1:] for h in hosts), f"/etc/hosts names the guest: {parts[1]!r}")
    check(name == [["webhost"], ["webhost"]], f"/etc/hostname, hostname: {parts[2]!r}")


def case_net_bad(c):
    """Each bad network input: exit 125, a message naming the flag, no QEMU (nor passt) started
    (stand-ins first in PATH record any start; passt's answers `--version`, the check before a
    start, as a passt new enough), nothing in the state dir."""
    import socket
    fake = os.path.join(c.tmp, "fakebin")
    os.mkdir(fake)
    started = os.path.join(c.tmp, "started")
    for prog in ("qemu-system-x86_64", "passt", "virtiofsd"):
        with open(os.path.join(fake, prog), "w") as f:
            f.write("#!/bin/sh\n" + ("[ \"$1\" = --version ] && echo 'passt 2026_07_28.0' && exit 0\n" if prog == "passt" else "")
                    + f"echo \"$0\" >> {started}\nexit 1\n")
        os.chmod(os.path.join(fake, prog), 0o755)
    env = dict(c.env, PATH=fake + ":" + os.environ["PATH"], NESHOST_VIRTIOFSD=os.path.join(fake, "virtiofsd"),
               NESHOST_PASST=os.path.join(fake, "passt"))
    regular = os.path.join(c.tmp, "regular")
    open(regular, "w").close()
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen(1)
    busy = held.getsockname()[1]
    free = free_port()
    bad = [(["-p", "0:8080"], ["--publish", "0"]),
           (["-p", "70000:8080"], ["--publish", "70000"]),
           (["-p", "127.0.0.1:x:8080"], ["--publish"]),
           (["-p", "8080:80/sctp"], ["--publish"]),
           (["--publish", f"127.0.0.1:{busy}:8080"], ["--publish", str(busy)]),
           (["--network", "none", "-p", f"127.0.0.1:{free}:8080"], ["--publish", "none"]),
           (["--network", "bogus"], ["--network", "bogus"]),
           (["--network", f"netns:{regular}"], ["--network", "netns"])]
    try:
        fails = []
        for args, names in bad:
            r = subprocess.run([NESHOST, "run", "--accel", "tcg", "--state", c.state, "--vm", "b", *args, "--",
                                "true"], capture_output=True, env=env, timeout=BOUND)
            err = r.stderr.decode(errors="replace")
            left = os.listdir(c.state) if os.path.isdir(c.state) else []
            if r.returncode != 125 or not all(n in err for n in names) or left or os.path.exists(started):
                fails.append(f"{args}: exit {r.returncode}, stderr {err.strip()!r} (want {names}), state dir "
                             f"{left}, started: {open(started).read().split() if os.path.exists(started) else []}")
            if os.path.exists(started):
                os.unlink(started)
    finally:
        held.close()
    check(not fails, "bad input not refused as it should be:\n  " + "\n  ".join(fails))


# ---- snapshots (issue 30: warm starts; docs/vm.md "Snapshots") ----

def make_snapshot(c, name="base", *args):
    """`neshost snapshot create NAME` in the case's state dir; returns its directory."""
    rc, out, err = c.neshost("snapshot", "create", "--state", c.state, "--accel", "tcg", "--ready-timeout", "100",
                             *args, name)
    check(rc == 0 and out.strip() == name, f"snapshot create {name}: {rc} {out!r} {err!r}")
    d = os.path.join(c.state, ".snapshots", name)
    check(sorted(os.listdir(d)) == ["ram", "snapshot.json", "state.qemu"], f"snapshot dir: {os.listdir(d)}")
    for f in ("ram", "state.qemu"):
        check(os.stat(os.path.join(d, f)).st_mode & 0o077 == 0, f"{f} (the guest's memory) is not private")
    return d


def case_snapshot(c):
    """Create one snapshot, restore it twice at once: each restore is its own VM (its own id and
    record, its own exit code), the guests' boot ids differ (the CRNG reseeded from the host's
    entropy), each guest's clock is the host's now (not the saved moment's), and the init took
    its descriptor as if freshly booted (its argv, env and cwd)."""
    make_snapshot(c)
    rc, out, _ = c.neshost("snapshot", "ls", "--state", c.state)
    check(rc == 0 and lines(out)[1].split()[0] == "base", f"snapshot ls: {out!r}")
    # Not a synchronisation: the saved guest clock must fall measurably behind the host's, or a
    # restore that never sets it would pass the clock check below.
    time.sleep(4)
    w = "cat /proc/sys/kernel/random/boot_id; head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'; echo; date +%s; pwd; echo $X; exit $CODE"
    # The guest's clock is read between these two host moments: at least `before` (a restore
    # that kept the saved clock reads 4 s less, minus
    # its own run time since the restore) and at most the moment its run ended, whatever
    # the load (a bound on the gap between them would be a bound on wall time).
    before = int(time.time())
    ps = [c.start("--snapshot", "base", "-e", f"CODE={code}", "-e", f"X=x{code}", "-w", "/tmp", "--",
                  "/bin/sh", "-c", w, vm=vm) for vm, code in (("a", 3), ("b", 4))]
    res = []
    for p, want in zip(ps, (3, 4)):
        rc = p.finish()
        now = time.time()
        out = lines(p.out.decode(errors="replace"))
        check(rc == want, f"restore: exit {rc}, want {want}; stderr:\n{p.err.decode(errors='replace')}")
        check(len(out) == 5 and out[3:] == ["/tmp", f"x{want}"], f"restore's stdout {out!r}")
        check(before - 1 <= int(out[2]) <= now + 1,
              f"the guest's clock {out[2]} is not the host's: read between {before} and {now:.0f}")
        res.append(out)
    check(res[0][0] != res[1][0], f"two restores share a boot id: {res[0][0]}")
    check(res[0][1] != res[1][1], f"two restores' /dev/urandom gave the same bytes: {res[0][1]}")
    for vm, want in (("a", 3), ("b", 4)):
        r = c.record(vm)
        check((r["outcome"], r["exit_code"]) == ("exited", want), f"record {vm}: {r}")
        # The init reseeded the CRNG from the descriptor's entropy before anything ran (the
        # boot ids above would differ anyway once the guest's own interrupts feed it).
        with open(os.path.join(c.state, vm, "console.log"), errors="replace") as f:
            con = f.read()
        check("seed: 32 bytes of entropy added, CRNG reseeded" in con, f"{vm}: no reseed in the console:\n{con[-2000:]}")
    rc, out, err = c.neshost("snapshot", "rm", "--state", c.state, "base")
    check(rc == 0 and not os.path.exists(os.path.join(c.state, ".snapshots", "base")), f"snapshot rm: {rc} {err!r}")


def case_snapshot_bad(c):
    """Bad snapshots and restores: each a clear error naming what is wrong, exit 125, nothing
    started or left (no VM state, no process: Case.close checks for descendants)."""
    d = make_snapshot(c)
    def refused(*args, want, env=None, code=125, started=False):
        p = Proc([NESHOST, "run", "--state", c.state, "--vm", "x", *args, "--", "/bin/true"], env or c.env)
        rc = p.finish()
        err = p.err.decode(errors="replace")
        check(rc == code and want in err, f"run {args}: exit {rc}, want {code} and {want!r}; stderr:\n{err}")
        if not started:  # refused before anything started: no VM at all
            check(not os.path.exists(os.path.join(c.state, "x")), f"run {args} left a VM behind")
            return
        # QEMU started and refused the state: the VM is recorded as ended before `ready` (its
        # QEMU reaped: Case.close finds no descendant), and goes with `neshost rm`.
        r = c.record("x")
        check((r["exit_status"], r["reason"]) == (125, "VM exited before `ready`"), f"record {r}")
        rc, _, err = c.neshost("rm", "--state", c.state, "x")
        check(rc == 0, f"rm x: {rc} {err!r}")
    refused("--snapshot", "none", want=f"no snapshot at {c.state}/.snapshots/none (snapshot.json missing); "
            f"`neshost snapshot ls --state {c.state}` lists the snapshots there")
    refused("--snapshot", "base", "--mem", "512", want=f"--snapshot base: made with memory (--mem, MiB) 256; this run "
            f"has 512 (make it again: neshost snapshot rm --state {c.state} base; neshost snapshot create --state "
            f"{c.state} --mem 512 base)")
    refused("--snapshot", "base", "--cpus", "2", want="vCPUs (--cpus) 1; this run has 2")
    refused("--snapshot", "base", "--kernel", "/nonexistent", want="--kernel cannot be used with --snapshot")
    refused("--snapshot", "base", "--grace", "2", want="--grace cannot be used with --snapshot")
    refused("--snapshot", "base", "--rootfs-mode", "initramfs", want="--rootfs-mode initramfs cannot be used with "
            "--snapshot")
    # A snapshot's directory given: its refusals name it as given; inside STATE/.snapshots it is
    # made again there; any other directory is removed, made and moved there.
    refused("--snapshot", d, "--mem", "512", want=f"--snapshot {d}: made with memory (--mem, MiB) 256")
    moved = os.path.join(c.tmp, "moved")
    shutil.copytree(d, moved)
    refused("--snapshot", moved + "/", "--cpus", "2", want=f"(make it again: rm -r {moved}; neshost snapshot create "
            f"--state S --cpus 2 moved; mv S/.snapshots/moved {moved}, S being any state directory)")
    shutil.rmtree(moved)
    # A create that fails (its boot cut short) leaves no snapshot, no temporary dir, no process.
    rc, out, err = c.neshost("snapshot", "create", "--state", c.state, "--accel", "tcg", "--ready-timeout", "0.01", "late")
    check(rc == 125 and "not in time" in err, f"snapshot create late: {rc} {out!r} {err!r}")
    check(sorted(os.listdir(os.path.join(c.state, ".snapshots"))) == ["base"],
          f"a failed create left: {os.listdir(os.path.join(c.state, '.snapshots'))}")
    other = os.path.join(c.tmp, "other.cpio")  # another init build: the initramfs differs
    shutil.copyfile(os.environ["NESHOST_INITRD"], other)
    with open(other, "ab") as f:
        f.write(b"\0" * 512)
    refused("--snapshot", "base", want="another init build (initramfs): ", env=dict(c.env, NESHOST_INITRD=other))
    def alter(name, at):  # one byte changed in place
        with open(os.path.join(d, name), "r+b") as f:
            f.seek(at)
            b = f.read(1)
            f.seek(at)
            f.write(bytes([b[0] ^ 1]))
    alter("ram", 1 << 20)
    refused("--snapshot", "base", want="--snapshot base: corrupt: ram: ")
    alter("ram", 1 << 20)  # back as it was: a touched, identical file is the snapshot's again
    state = os.path.join(d, "state.qemu")
    # A state QEMU cannot load, its metadata made to vouch for it: QEMU refuses it after it
    # started, and the run still ends 125 with QEMU gone.
    meta_file = os.path.join(d, "snapshot.json")
    with open(meta_file) as f:
        meta_text = f.read()
    good = open(state, "rb").read()
    with open(state, "wb") as f:
        f.write(b"\0" * len(good))
    meta = json.loads(meta_text)
    st = os.stat(state)
    meta["state"].update(bytes=st.st_size, mtime_ns=st.st_mtime_ns, sha256=hashlib.sha256(b"\0" * len(good)).hexdigest())
    with open(meta_file, "w") as f:
        json.dump(meta, f)
    refused("--snapshot", "base", want="Not a migration stream", started=True)
    with open(state, "wb") as f:
        f.write(good)
    with open(meta_file, "w") as f:
        f.write(meta_text)
    alter("state.qemu", 1000)
    refused("--snapshot", "base", want="--snapshot base: corrupt: state.qemu: ")
    os.truncate(state, 4096)
    refused("--snapshot", "base", want="has 4096 bytes; made with")
    os.unlink(state)
    refused("--snapshot", "base", want="state.qemu: No such file or directory")
    with open(os.path.join(d, "snapshot.json"), "w") as f:
        f.write('{"format":1,"name":"base"}')
    refused("--snapshot", "base", want="snapshot.json: format: 1 (this neshost reads format 2) (make it again: ")
    with open(os.path.join(d, "snapshot.json"), "w") as f:
        f.write('{"format":2,"name":"base"}')
    refused("--snapshot", "base", want="snapshot.json: created: missing or not a string")
    with open(os.path.join(d, "snapshot.json"), "w") as f:
        f.write(meta_text[:200])  # cut short
    refused("--snapshot", "base", want="snapshot.json: not valid JSON (")
    rc, _, err = c.neshost("snapshot", "create", "--state", c.state, "../x")
    check(rc == 125 and "snapshot name" in err, f"snapshot create ../x: {rc} {err!r}")


def case_snapshot_share(c):
    """A restore with a share: the share is plugged in after the load (the snapshot has none)
    and the guest reads and writes it."""
    make_snapshot(c)
    a = os.path.join(c.tmp, "a")
    os.mkdir(a)
    with open(os.path.join(a, "in.txt"), "w") as f:
        f.write("from the host\n")
    rc, out, err = c.run("--snapshot", "base", "-v", f"{a}:/a", "--", "/bin/sh", "-c",
                         "cat /a/in.txt; echo from the guest > /a/out.txt; exit 5")
    check(rc == 5, f"exit status {rc}, want 5; stderr:\n{err}")
    check(lines(out) == ["from the host"], f"stdout {out!r}")
    with open(os.path.join(a, "out.txt")) as f:
        check(f.read() == "from the guest\n", "the guest's file is not on the host")


def case_net_snapshot_publish(c):
    """A restore with the default network (passt) and -p: the NIC is plugged in after the load
    and the host fetches the guest's page through the published port."""
    make_snapshot(c)
    publish_check(c, "--snapshot", "base")


CASES = {n[5:]: f for n, f in globals().items() if n.startswith("case_")}


def main():
    if len(sys.argv) != 2 or sys.argv[1] not in CASES:
        print(f"usage: vm_test.py {{{','.join(CASES)}}}", file=sys.stderr)
        return 2
    if sys.argv[1].startswith("net_"):
        netns.isolate()  # re-runs this case in a network namespace of its own (returns there)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print("prctl(PR_SET_CHILD_SUBREAPER) failed", file=sys.stderr)
        return 1
    c = Case()
    if sys.argv[1].startswith("net_"):  # in a namespace of its own: the real default (user: passt)
        c.env.pop("NESHOST_NETWORK", None)
    ok = False
    try:
        CASES[sys.argv[1]](c)
        ok = True
    except Failure as e:
        print(f"FAIL {sys.argv[1]}: {e}", file=sys.stderr)
        for p in c.procs:
            sys.stderr.write(p.err.decode(errors="replace")[-4000:])
    finally:
        try:
            c.close(ok)
        except Failure as e:
            print(f"FAIL {sys.argv[1]} (cleanup): {e}", file=sys.stderr)
            ok = False
    print(f"{'ok' if ok else 'FAIL'} {sys.argv[1]}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
