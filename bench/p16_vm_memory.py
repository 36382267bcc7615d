#!/usr/bin/env python3
"""P16: host memory of one idle VM, each memory lever side by side in one invocation (scripts/bench.sh
runs it; not a test). Prints markdown rows for bench/results/latest.md.

Each round starts, per configuration, one idle `neshost run -d --network none --accel tcg -- sleep
1000` in a private state dir, reads the PSS (/proc/PID/smaps_rollup) of its QEMU and its monitor once
the run has returned (the guest is up: `run -d` returns after `started`), and the PSS of QEMU's two
largest anonymous mappings (guest RAM; TCG's code buffer, the one mapped rwx); then the same
configuration in the foreground with a workload of 300 fork/execs, end to end (host clock: what a
smaller translation buffer costs in re-translation); then `rm -f` of the VM by its state dir.
Configurations, the order rotated every round:
  tb-default  TCG's translation buffer at QEMU's default (1 GiB; NESHOST_TCG_TB_MIB=0)
  tb-16       today's default: 16 MiB (`-accel tcg,tb-size=16`)
  tb-8        8 MiB
  mem-128     tb-16 with --mem 128 (the guest's struct pages and hash tables scale with its RAM)
Medians over rounds, each with its per-round range; ratios against tb-default.
Usage: p16_vm_memory.py NESHOST [ROUNDS]   (default 5)
"""
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "support"))
from procs import pss_kib, vm_pids  # noqa: E402

CONFIGS = [("tb-default", {"NESHOST_TCG_TB_MIB": "0"}, []),
           ("tb-16", {"NESHOST_TCG_TB_MIB": "16"}, []),
           ("tb-8", {"NESHOST_TCG_TB_MIB": "8"}, []),
           ("mem-128", {"NESHOST_TCG_TB_MIB": "16"}, ["--mem", "128"])]
WORKLOAD = "i=0; while [ $i -lt 300 ]; do /bin/true; i=$((i+1)); done"


def anon_maps(pid):
    """{'ram': KiB, 'tb': KiB}: PSS of the largest rw-p anonymous mapping (guest RAM without shares)
    and of the largest rwxp one (TCG's code buffer)."""
    best = {"ram": (0, 0), "tb": (0, 0)}  # (mapping size, pss)
    cur = None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            p = line.split()
            if "-" in p[0] and not p[0].endswith(":") and len(p) >= 5:
                a, b = (int(x, 16) for x in p[0].split("-"))
                anon = len(p) == 5
                cur = ("tb" if p[1] == "rwxp" else "ram" if p[1] == "rw-p" else None, b - a) if anon else None
            elif p[0] == "Pss:" and cur and cur[0] and cur[1] > best[cur[0]][0]:
                best[cur[0]] = (cur[1], int(p[1]))
    return {k: v[1] for k, v in best.items()}


def one(neshost, env, extra):
    """(qemu PSS, monitor PSS, ram PSS, tb PSS, workload run s) of one configuration."""
    state = tempfile.mkdtemp(prefix="nes-p16-")
    vm = None
    try:
        args = [neshost, "run", "--state", state, "--network", "none", "--accel", "tcg"] + extra
        r = subprocess.run(args[:2] + ["-d"] + args[2:] + ["--", "sleep", "1000"], env=env,
                           capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            raise RuntimeError(f"run -d failed: {r.stderr.strip()}")
        vm = r.stdout.split()[-1]
        qemu, monitor = vm_pids(state, vm)
        q, m, maps = pss_kib(qemu), pss_kib(monitor), anon_maps(qemu)
        subprocess.run([neshost, "rm", "-f", "--state", state, vm], capture_output=True, timeout=120)
        vm = None
        t0 = time.monotonic()
        w = subprocess.run(args[:2] + ["--rm"] + args[2:] + ["--", "/bin/sh", "-c", WORKLOAD], env=env,
                           capture_output=True, text=True, timeout=600)
        t = time.monotonic() - t0
        if w.returncode != 0:
            raise RuntimeError(f"workload run failed: {w.stderr.strip()}")
        return q, m, maps["ram"], maps["tb"], t
    finally:
        if vm:
            subprocess.run([neshost, "rm", "-f", "--state", state, vm], capture_output=True, timeout=120)
        shutil.rmtree(state, ignore_errors=True)


def main():
    neshost = os.path.abspath(sys.argv[1])
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    res = {name: [] for name, _, _ in CONFIGS}
    failed = {}
    for r in range(rounds):
        for k in range(len(CONFIGS)):
            name, env_add, extra = CONFIGS[(k + r) % len(CONFIGS)]
            try:
                res[name].append(one(neshost, dict(os.environ, **env_add), extra))
            except RuntimeError as e:  # counted and named in the rows, never silent
                failed.setdefault(name, []).append(str(e))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    stamp = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    med = lambda name, i: statistics.median(x[i] for x in res[name])
    rng = lambda name, i, f: f"{f.format(min(x[i] for x in res[name]))}-{f.format(max(x[i] for x in res[name]))}"
    base = "tb-default"
    for name, errs in failed.items():
        print(f"| P16 {name}: {len(errs)} of {rounds} round(s) failed, left out of the medians: {errs[0][:200]} | | | | | |")
    if not res[base]:
        return
    for name, _, _ in CONFIGS:
        if not res[name]:
            continue
        note = (f"{stamp}, commit {commit}, median of {len(res[name])}, rotated; QEMU {rng(name, 0, '{:.0f}')} KiB; guest RAM "
                f"touched {med(name, 2) / 1024:.1f} MiB, TCG code buffer {med(name, 3) / 1024:.1f} MiB, monitor "
                f"{med(name, 1) / 1024:.1f} MiB")
        print(f"| P16 idle VM's QEMU PSS, `run -d --network none -- sleep 1000`, {name} ({note}) | MiB | "
              f"{med(name, 0) / 1024:.1f} | {base} | {med(base, 0) / 1024:.1f} | {med(name, 0) / med(base, 0):.2f} |")
    for name, _, _ in CONFIGS:
        if not res[name]:
            continue
        print(f"| P16 `run --rm -- sh -c '300 × /bin/true'` end to end, {name} (the same rounds; "
              f"{rng(name, 4, '{:.2f}')} s) | s | {med(name, 4):.2f} | {base} | {med(base, 4):.2f} | "
              f"{med(name, 4) / med(base, 4):.2f} |")


if __name__ == "__main__":
    main()
