#!/usr/bin/env python3
"""P17: N idle VMs at once on one host (issue 49's scale row; not a test, and not run by
scripts/bench.sh: N=50 takes the whole machine, run it by hand on a quiet one).

Starts N `neshost run -d --accel tcg --network none -- sleep 100000` in parallel in one private
state dir (TMPDIR/XDG_RUNTIME_DIR private too), checks every one reached running (`run -d` returns
after the workload's `started`; `neshost ps` lists it), times `neshost ps` with all N, runs `neshost
stats` for each, reads the host PSS per VM (QEMU and its monitor, from vmm.json/monitor.json) at 1,
10 and N VMs running (the first 1 and 10 started, then all), then `rm -f` of all and checks nothing
is left: no process naming the private dir (QEMU, virtiofsd, passt, monitor), no mount under it, no
VM directory, lock or record in the state dir.
Usage: p17_scale.py NESHOST [N]   (default 50)
"""
import concurrent.futures
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "support"))
from procs import pss_kib, vm_pids  # noqa: E402


def procs_naming(path):
    """pids whose command line names `path` (ours: the private dir is in every VM's argv)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit() and int(d) != os.getpid():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    if path.encode() in f.read():
                        out.append(int(d))
            except OSError:
                pass
    return out


def mounts_under(path):
    with open("/proc/self/mountinfo") as f:
        return [l.split()[4] for l in f if l.split()[4].startswith(path)]


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    nh, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 50
    tmp = tempfile.mkdtemp(prefix="nes-p17.")
    state = os.path.join(tmp, "state")
    env = dict(os.environ, TMPDIR=tmp, XDG_RUNTIME_DIR=tmp)
    for k in ("NESHOST_NETWORK", "NESHOST_APPEND", "NESHOST_TCG_BOOT_WORDS"):
        env.pop(k, None)
    vms, fails = [], []

    def nes(*args, timeout=600):
        return subprocess.run([nh, *args], env=env, capture_output=True, text=True, timeout=timeout)

    def start(_):
        r = nes("run", "-d", "--accel", "tcg", "--network", "none", "--state", state, "--", "sleep", "100000")
        return r.stdout.split()[-1] if r.returncode == 0 and r.stdout.split() else f"FAILED {r.returncode}: {r.stderr.strip()}"

    def pss_per_vm(ids):
        per = []
        for vm in ids:
            q, m = vm_pids(state, vm)
            per.append((pss_kib(q) + pss_kib(m)) / 1024)
        return statistics.median(per)

    pss = {}
    try:
        t0 = time.monotonic()
        # The first VM, then up to 10, then the rest: PSS read at each step with that many running.
        for upto in sorted({1, min(10, n), n}):
            with concurrent.futures.ThreadPoolExecutor(max_workers=upto - len(vms) or 1) as ex:
                got = list(ex.map(start, range(upto - len(vms))))
            fails += [g for g in got if g.startswith("FAILED")]
            vms += [g for g in got if not g.startswith("FAILED")]
            if fails:
                raise SystemExit(f"p17: {len(fails)} of {upto} failed to start: {fails[0]}")
            pss[upto] = pss_per_vm(vms)
        start_s = time.monotonic() - t0
        t1 = time.monotonic()
        r = nes("ps", "--state", state)
        ps_s = time.monotonic() - t1
        listed = [l.split()[0] for l in r.stdout.splitlines()[1:] if l.strip()]
        running = [l for l in r.stdout.splitlines()[1:] if "running" in l]
        if r.returncode != 0 or sorted(listed) != sorted(vms) or len(running) != n:
            raise SystemExit(f"p17: ps lists {len(listed)} ({len(running)} running) of {n}:\n{r.stdout}{r.stderr}")
        stats_bad = [vm for vm in vms if nes("stats", "--state", state, vm, timeout=120).returncode != 0]
        if stats_bad:
            raise SystemExit(f"p17: stats failed for {stats_bad}")
    finally:
        ids = vms + [d for d in (os.listdir(state) if os.path.isdir(state) else []) if d.startswith("vm-") and d not in vms]
        for vm in ids[len(vms):]:  # a VM whose start failed: its console's last lines, for the record
            try:
                with open(os.path.join(state, vm, "console.log"), errors="replace") as f:
                    print(f"p17: {vm} console.log ends:\n" + "".join(f.readlines()[-15:]), file=sys.stderr)
            except OSError:
                pass
        if ids:
            nes("rm", "-f", "--state", state, *ids, timeout=900)
        left = {"processes": procs_naming(tmp), "mounts": mounts_under(tmp),
                "state entries": [e for e in (os.listdir(state) if os.path.isdir(state) else []) if not e.startswith(".snap")]}
        for pid in left["processes"]:  # ours only: they name our private dir; counted as left, then ended
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        shutil.rmtree(tmp, ignore_errors=True)
    leftovers = "; ".join(f"{k}: {v}" for k, v in left.items() if v) or "nothing"
    print(f"| P17 {n} idle VMs at once (`run -d --accel tcg --network none -- sleep`, started in parallel; all "
          f"running; started in {start_s:.1f} s; every `stats` answered; left after `rm -f`: {leftovers}) | s | "
          f"{ps_s:.2f} | `neshost ps` with all {n} (goal) | 1.0 | {ps_s:.2f} |")
    for k in sorted(pss):
        print(f"| P17 host PSS per idle VM (QEMU + monitor, median), {k} VM(s) running | MiB | {pss[k]:.1f} | "
              f"the same with 1 VM | {pss[1]:.1f} | {pss[k] / pss[1]:.2f} |")
    return 0 if leftovers == "nothing" else 1


if __name__ == "__main__":
    sys.exit(main())
