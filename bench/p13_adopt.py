#!/usr/bin/env python3
"""P13: re-adoption (docs/host.md "Re-adoption"): the time from a detached VM's monitor being
SIGKILLed to a replacement monitor having the lifecycle channel back (the guest's resumed
`ready`: the replacement's "the guest resumed its session" line in monitor.log), when a command
(`neshost inspect`) runs right after the kill, against the adoption's own part: until the
replacement has taken the generation over (monitor.json names it; the command returns only once
the guest has resumed with it). The rest is the guest's redial: the init's backoff (at most 500 ms
apart) in the sandbox, QEMU's 1 s chardev redial period in a VM.
Modes: `sandbox` (the init as PID 1 of a pid + mount namespace, its channel a Unix socket;
needs root) and `vm` (a TCG microVM; slower, so fewer rounds). Not a test (scripts/bench.sh
runs it); medians, with the range. Prints rows of bench/results/latest.md's table.
Usage: p13_adopt.py NESHOST NESINIT [ROUNDS] [VM_ROUNDS]   (defaults 10, 3; VM_ROUNDS 0: no VM)
"""
import ctypes
import json
import os
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

NESHOST, NESINIT = sys.argv[1], sys.argv[2]
ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 10
VM_ROUNDS = int(sys.argv[4]) if len(sys.argv) > 4 else 3
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: every monitor and VMM comes back to us


def await_text(directory, path, text, timeout=60):
    """inotify on `directory` until `path` contains `text` (or text(contents) holds, if callable);
    the monotonic time it was seen."""
    fd = libc.inotify_init1(os.O_CLOEXEC | os.O_NONBLOCK)
    libc.inotify_add_watch(fd, directory.encode(), 0x2 | 0x8 | 0x80 | 0x100)
    try:
        end = time.monotonic() + timeout
        while True:
            try:
                with open(path, errors="replace") as f:
                    got = f.read()
                    if (text(got) if callable(text) else text in got):
                        return time.monotonic()
            except FileNotFoundError:
                pass
            left = end - time.monotonic()
            if left <= 0:
                raise RuntimeError("%s: no %r within %d s" % (path, text, timeout))
            select.select([fd], [], [], left)
            try:
                os.read(fd, 65536)
            except BlockingIOError:
                pass
    finally:
        os.close(fd)


def reap_all():
    try:
        while True:
            os.waitpid(-1, 0)
    except ChildProcessError:
        pass


def one(mode):
    tmp = tempfile.mkdtemp(prefix="nesp13-")
    state, rt = os.path.join(tmp, "state"), os.path.join(tmp, "rt")
    os.makedirs(rt)
    env = dict(os.environ, TMPDIR=rt, NESHOST_NESINIT=NESINIT, NESHOST_NETWORK="none",
               XDG_RUNTIME_DIR=tmp)
    nh = lambda *a: subprocess.run([NESHOST, *a], capture_output=True, text=True, env=env, timeout=300)
    try:
        flags = ["--sandbox"] if mode == "sandbox" else ["--accel", "tcg", "--ready-timeout", "100"]
        work = "trap 'exit 0' USR1; while :; do sleep 1; done"
        r = nh("run", "-d", *flags, "--state", state, "--vm", "b", "--", "/bin/sh", "-c", work)
        if r.returncode != 0:
            raise RuntimeError("run -d: %r" % r.stderr)
        vmdir = os.path.join(state, "b")
        with open(os.path.join(vmdir, "monitor.json")) as f:
            pid = json.load(f)["pid"]
        os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        os.waitpid(pid, 0)  # reparented to us: the kill has landed once it is reaped
        insp = subprocess.Popen([NESHOST, "inspect", "--state", state, "b"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env)
        # The replacement has taken the generation over: monitor.json names another process.
        t1 = await_text(vmdir, os.path.join(vmdir, "monitor.json"),
                        lambda t: t.strip() and json.loads(t)["pid"] != pid)
        t2 = await_text(vmdir, os.path.join(vmdir, "monitor.log"), "the guest resumed its session")
        out, err = insp.communicate(timeout=60)
        if json.loads(out).get("monitor_alive") is not True:
            raise RuntimeError("not adopted: %r %r" % (out, err))
        nh("kill", "--state", state, "-s", "USR1", "b")
        nh("wait", "--state", state, "b")
        return t1 - t0, t2 - t0
    finally:
        reap_all()
        shutil.rmtree(tmp, ignore_errors=True)


def row(name, samples):
    """One bench/results/latest.md row: the total against the command's own share of it."""
    cmd = [1000 * a for a, _ in samples]
    tot = [1000 * b for _, b in samples]
    load = os.getloadavg()[0]
    return ("| P13 %s: a detached VM's monitor SIGKILLed -> a replacement has the lifecycle channel back (the "
            "guest's resumed `ready`), `neshost inspect` run right after the kill (median of %d; %s, load %.1f; "
            "%.0f-%.0f) | ms | %.0f | the adoption's own part: until the replacement has taken the generation over (monitor.json "
            "names it), the rest being the guest's redial (%.0f-%.0f) | %.0f | %.2f |" %
            (name, len(samples), time.strftime("%Y-%m-%d %H:%M"), load, min(tot), max(tot), statistics.median(tot),
             min(cmd), max(cmd), statistics.median(cmd), statistics.median(tot) / statistics.median(cmd)))


print(row("sandbox", [one("sandbox") for _ in range(ROUNDS)]), flush=True)
if VM_ROUNDS > 0:
    print(row("VM (TCG; QEMU's chardev redials every 1 s)", [one("vm") for _ in range(VM_ROUNDS)]), flush=True)
