#!/usr/bin/env python3
"""Boot-phase timings of `neshost run` (not a test: a measuring tool for docs/vm.md).

Usage: tests/vm/measure.py NESHOST [RUNS]   (uses --accel tcg --console; prints medians)

Every line neshost writes (console on stdout, events on stderr) is stamped with this process's
monotonic clock on arrival. Guest-side figures come from the guest's own clocks: the kernel's
printk time of "Run /init as init process" (init start) and /proc/uptime read by the workload as
its first and last act. The guest time of `ready` is the printk time of init start plus the gap
between the arrival of that line and of the init's "send: ready" line (both cross the same serial
line, so the transport delay cancels).
"""
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

WORKLOAD = "read a b < /proc/uptime; echo T0=$a; true; read a b < /proc/uptime; echo T1=$a"


def one(neshost):
    state = tempfile.mkdtemp(prefix="nesmeasure.")
    t_start = time.monotonic()
    p = subprocess.Popen([neshost, "run", "--accel", "tcg", "--console", "--network", "none", "--state", state, "--",
                          "/bin/sh", "-c", WORKLOAD], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stamped = []
    lock = threading.Lock()

    def pump(f):
        for line in f:
            t = time.monotonic()
            with lock:
                stamped.append((t, line.decode(errors="replace").rstrip("\n")))

    th = [threading.Thread(target=pump, args=(s,)) for s in (p.stdout, p.stderr)]
    for t in th:
        t.start()
    rc = p.wait(timeout=120)
    t_end = time.monotonic()
    for t in th:
        t.join()
    subprocess.run(["rm", "-rf", state])
    stamped.sort()

    def at(pattern):
        for t, l in stamped:
            if re.search(pattern, l):
                return t, l
        raise SystemExit(f"no line matching {pattern!r}")

    h_started, _ = at(r"neshost: \S+ vm_started")
    h_ready, _ = at(r"neshost: \S+ ready protocol_version")
    h_runinit, l_runinit = at(r"Run /init as init process")
    g_init = float(re.search(r"\[\s*([0-9.]+)\]", l_runinit).group(1))
    h_sendready, _ = at(r"nesinit: send: ready")
    _, l_t0 = at(r"^T0=")
    h_t1, l_t1 = at(r"^T1=")
    h_qemu_exit, _ = at(r"neshost: qemu exited")
    g_ready = g_init + (h_sendready - h_runinit)
    g_exec = float(l_t0[3:])
    return {
        "exit status": rc,
        "QEMU start -> ready (host)": h_ready - h_started,
        "init start -> ready (guest)": g_ready - g_init,
        "ready -> workload exec (guest)": g_exec - g_ready,
        "workload exit -> QEMU exit (host)": h_qemu_exit - h_t1,
        "kernel start -> init start (guest)": g_init,
        "neshost total (host)": t_end - t_start,
    }


def main():
    neshost = sys.argv[1]
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    results = [one(neshost) for _ in range(runs)]
    for k in results[0]:
        vals = [r[k] for r in results]
        if k == "exit status":
            print(f"{k:38} {vals}")
        else:
            print(f"{k:38} median {statistics.median(vals) * 1000:7.0f} ms"
                  f"   (min {min(vals) * 1000:.0f}, max {max(vals) * 1000:.0f}, n={len(vals)})")


if __name__ == "__main__":
    main()
