#!/usr/bin/env python3
"""P8: shares over virtiofs against the packed initramfs, side by side in one invocation
(scripts/bench.sh runs it; not a test). Prints markdown rows for bench/results/latest.md.

  read: one VM boots a packed initramfs holding a FILE_MIB file (tmpfs) with the same file also
        shared read-only over virtiofs, and reads both with `cat > /dev/null`, timed in the guest
        (busybox `time`, 10 ms resolution). Cold: the virtiofs read is the guest's first.
  exec: a ROOTFS_MIB userland (busybox + incompressible filler) run with `--rootfs` over virtiofs
        and with `--rootfs-mode initramfs` (copied, packed, loaded into RAM): wall time from
        `neshost run` to the workload's first line on stdout, median of RUNS.
Usage: p8_shares.py NESHOST [FILE_MIB [ROOTFS_MIB [RUNS]]]   (defaults 256, 100, 3)
"""
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def userland(root):
    os.makedirs(os.path.join(root, "bin"))
    shutil.copy("/bin/busybox", os.path.join(root, "bin", "busybox"))
    for a in ("sh", "cat", "echo", "time"):
        os.symlink("busybox", os.path.join(root, "bin", a))


def filler(path, mib):
    with open(path, "wb") as f:
        for _ in range(mib):
            f.write(os.urandom(1 << 20))


def neshost(nh, tmp, *args):
    env = dict(os.environ, TMPDIR=os.path.join(tmp, "rt"))
    os.makedirs(env["TMPDIR"], exist_ok=True)
    return [nh, "run", "--accel", "tcg", "--network", "none", "--ready-timeout", "300", "--state", os.path.join(tmp, "state"),
            "--on-exit", "remove", *args], env


def seconds(text, label):
    m = re.search(label + r".*?real\s+(\d+)m\s*([\d.]+)s", text, re.S)
    if not m:
        raise SystemExit(f"p8: no timing for {label} in:\n{text[-2000:]}")
    return int(m.group(1)) * 60 + float(m.group(2))


def read_rows(nh, tmp, mib):
    root = os.path.join(tmp, "readroot")
    userland(root)
    filler(os.path.join(root, "big"), mib)
    w = ("echo T-initramfs >&2; time cat /big > /dev/null; "
         "echo T-virtiofs >&2; time cat /share/big > /dev/null")
    argv, env = neshost(nh, tmp, "--mem", str(2 * mib + 512), "--rootfs", root, "--rootfs-mode", "initramfs",
                        "-v", f"{root}:/share:ro", "--", "/bin/sh", "-c", w)
    r = subprocess.run(argv, env=env, capture_output=True, timeout=900)
    out = r.stdout.decode(errors="replace") + r.stderr.decode(errors="replace")
    if r.returncode != 0:
        raise SystemExit(f"p8 read run failed ({r.returncode}):\n{out[-2000:]}")
    ti, tv = seconds(out, "T-initramfs"), seconds(out, "T-virtiofs")
    vi, vv = mib / max(ti, 0.01), mib / max(tv, 0.01)
    shutil.rmtree(root)
    return [f"| P8 read {mib} MiB in the guest (cold), virtiofs share | MiB/s | {vv:.0f} | "
            f"same file in the initramfs (tmpfs) | {vi:.0f} | {vv / vi:.2f} |"]


def time_to_exec(argv, env):
    t0 = time.monotonic()
    p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    line = p.stdout.readline()
    t = time.monotonic() - t0
    p.stdout.read()
    rc = p.wait(timeout=600)
    if rc != 0 or not line.startswith(b"up"):
        raise SystemExit(f"p8 exec run failed: rc {rc}, first line {line!r}")
    return t


def exec_rows(nh, tmp, mib, runs):
    root = os.path.join(tmp, "execroot")
    userland(root)
    os.mkdir(os.path.join(root, "data"))
    for i in range(mib):
        filler(os.path.join(root, "data", f"f{i:03}"), 1)
    res = {}
    for mode in ("virtiofs", "initramfs"):
        ts = []
        for _ in range(runs):
            argv, env = neshost(nh, tmp, "--mem", str(mib * 3 + 256), "--rootfs", root, "--rootfs-mode", mode,
                                "--", "/bin/echo", "up")
            ts.append(time_to_exec(argv, env))
        res[mode] = statistics.median(ts)
    shutil.rmtree(root)
    v, i = res["virtiofs"], res["initramfs"]
    return [f"| P8 `neshost run` → workload's first line, {mib} MiB --rootfs (median of {runs}), virtiofs | s | "
            f"{v:.2f} | packed initramfs | {i:.2f} | {v / i:.2f} |"]


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    nh = sys.argv[1]
    mib = int(sys.argv[2]) if len(sys.argv) > 2 else 256
    rmib = int(sys.argv[3]) if len(sys.argv) > 3 else 100
    runs = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    tmp = tempfile.mkdtemp(prefix="nes-p8.")
    try:
        rows = read_rows(nh, tmp, mib) + exec_rows(nh, tmp, rmib, runs)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
