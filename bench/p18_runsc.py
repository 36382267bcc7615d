#!/usr/bin/env python3
"""P12/P8/P16 side by side with gVisor (`runsc`, the no-KVM sandbox a user would pick), in one
invocation (scripts/bench.sh runs it; not a test). Prints markdown rows for bench/results/latest.md.

- start: `neshost run --accel tcg --network none -- /bin/true` cold and warm (`run --snapshot`, a
  snapshot made once first), against `runsc --platform=ptrace --network=none do /bin/true` (over
  the host's root, as root, no KVM), process start to exit on the host clock; alternating order
  between rounds, medians, each with its per-round range;
- idle memory: one idle `neshost run -d ... -- sleep 1000` (PSS of its QEMU and monitor, read once
  `run -d` returned: the guest is up) against one idle `runsc do sleep 1000` (PSS of every process
  of its tree: runsc, its gofer, its sandbox and the sandbox's ptrace stubs; read once the tree has
  its `sleep` stub and its PSS held still for 1 s);
- a 256 MiB file read (cat to /dev/null, timed by /proc/uptime on each side of it, inside): ours
  from a virtiofs share (`-v DIR:/share:ro`), runsc's through its gofer; the file read once on the
  host first (page cache), a fresh VM/sandbox each.
Every runsc uses a private --root in a temp dir; everything started is ended and removed.
Usage: p18_runsc.py NESHOST [ROUNDS]   (default 5)
"""
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "support"))
sys.path.insert(0, HERE)
from procs import pss_kib, vm_pids  # noqa: E402
from p12_start import neshost_env  # noqa: E402

RUNSC = ["runsc", "--platform=ptrace", "--network=none"]


def timed(argv, env=None):
    t0 = time.monotonic()
    p = subprocess.run(argv, env=env, capture_output=True, timeout=300)
    secs = time.monotonic() - t0
    if p.returncode != 0:
        raise SystemExit(f"p18: {argv[:3]} exit {p.returncode}: {p.stderr.decode()[-2000:]}")
    return secs, p.stdout.decode(errors="replace") + p.stderr.decode(errors="replace")


def ours(nh, flags, cmd):
    tmp = tempfile.mkdtemp(prefix="nes-p18.")
    try:
        return timed([nh, "run", "--accel", "tcg", "--network", "none", "--state", os.path.join(tmp, "state"),
                      *flags, "--", *cmd], neshost_env(tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def gvisor(cmd):
    root = tempfile.mkdtemp(prefix="nes-p18-runsc.")
    try:
        return timed(["runsc", "--root", root, *RUNSC[1:], "do", *cmd])
    finally:
        shutil.rmtree(root, ignore_errors=True)


def tree(pid):
    """pid and all its descendants (from /proc/*/stat)."""
    kids = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                kids.setdefault(ppid, []).append(int(d))
            except (OSError, IndexError, ValueError):
                pass
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


def comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def idle_ours(nh):
    """KiB: PSS of an idle VM's QEMU + monitor."""
    tmp = tempfile.mkdtemp(prefix="nes-p18.")
    state, vm, env = os.path.join(tmp, "state"), None, neshost_env(tmp)
    try:
        r = subprocess.run([nh, "run", "-d", "--accel", "tcg", "--network", "none", "--state", state, "--",
                            "sleep", "1000"], env=env, capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            raise SystemExit(f"p18: run -d failed: {r.stderr.strip()}")
        vm = r.stdout.split()[-1]
        qemu, monitor = vm_pids(state, vm)
        return pss_kib(qemu) + pss_kib(monitor)
    finally:
        if vm:
            subprocess.run([nh, "rm", "-f", "--state", state, vm], env=env, capture_output=True, timeout=120)
        shutil.rmtree(tmp, ignore_errors=True)


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace").split("\0")
    except OSError:
        return []


def idle_runsc():
    """(KiB, processes): PSS of an idle `runsc do sleep 1000`'s whole process tree (runsc, its gofer,
    its sandbox and the sandbox's ptrace stubs, all named `exe`), once it has 4 or more processes and
    its PSS held within 64 KiB for 1 s."""
    root = tempfile.mkdtemp(prefix="nes-p18-runsc.")
    p = subprocess.Popen(["runsc", "--root", root, *RUNSC[1:], "do", "sleep", "1000"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    do_roots = set()  # `runsc do` keeps its container in a root of its own, /tmp/runsc-doN
    try:
        deadline, last, still = time.monotonic() + 120, -1, 0
        while time.monotonic() < deadline:
            pids = tree(p.pid)
            do_roots |= {a.split("=", 1)[1] for x in pids for a in cmdline(x) if a.startswith("--root=/tmp/runsc-do")}
            kib = sum(pss_kib(x) for x in pids)
            still = still + 1 if len(pids) >= 4 and abs(kib - last) <= 64 else 0
            if still >= 5:
                return kib, len(pids)
            last = kib
            time.sleep(0.2)
        raise SystemExit("p18: runsc's sleep did not settle in 120 s")
    finally:
        p.terminate()  # runsc do passes it to the sandbox and removes its container
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            for x in tree(p.pid)[::-1]:  # ours: the tree of the runsc this bench started
                try:
                    os.kill(x, 9)
                except OSError:
                    pass
            p.wait()
        for d in do_roots | {root}:
            shutil.rmtree(d, ignore_errors=True)


READ = "cat /proc/uptime; cat {} > /dev/null; cat /proc/uptime"


def read_rate(out, mib):
    ups = [float(l.split()[0]) for l in out.splitlines() if len(l.split()) == 2 and l.split()[0].replace(".", "").isdigit()]
    if len(ups) < 2:
        raise SystemExit(f"p18: no uptimes in:\n{out[-1000:]}")
    return mib / max(ups[-1] - ups[0], 0.01)


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    nh = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    work = tempfile.mkdtemp(prefix="nes-p18-work.")
    try:
        subprocess.run([nh, "snapshot", "create", "--accel", "tcg", "--state", work, "warm"], check=True,
                       env=neshost_env(work), capture_output=True, timeout=300)
        snap = os.path.join(work, ".snapshots", "warm")
        res = {"cold": [], "warm": [], "runsc": []}
        runs = [("cold", lambda: ours(nh, [], ["/bin/true"])[0]),
                ("warm", lambda: ours(nh, ["--snapshot", snap], ["/bin/true"])[0]),
                ("runsc", lambda: gvisor(["/bin/true"])[0])]
        for r in range(rounds):
            for name, f in (runs if r % 2 == 0 else runs[::-1]):
                res[name].append(f())
        ours_kib = idle_ours(nh)
        runsc_kib, nproc = idle_runsc()
        mib = 256
        big = os.path.join(work, "share", "big")
        os.mkdir(os.path.dirname(big))
        with open(big, "wb") as f:
            for _ in range(mib):
                f.write(os.urandom(1 << 20))
        subprocess.run(["cat", big], stdout=subprocess.DEVNULL, check=True)  # page cache
        v_ours = read_rate(ours(nh, ["--mem", "512", "-v", f"{os.path.dirname(big)}:/share:ro"],
                                ["/bin/sh", "-c", READ.format("/share/big")])[1], mib)
        v_runsc = read_rate(gvisor(["/bin/sh", "-c", READ.format(big)])[1], mib)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {n: statistics.median(xs) for n, xs in res.items()}
    rng = {n: f"{min(xs):.2f}-{max(xs):.2f}" for n, xs in res.items()}
    peer = f"`runsc --platform=ptrace --network=none do /bin/true` (gVisor, Debian 12's; {rng['runsc']})"
    rows = [
        f"| P12 vs gVisor: cold `neshost run --accel tcg --network none -- /bin/true`, process start to exit "
        f"(median of {rounds}, alternating; {rng['cold']}) | s | {med['cold']:.2f} | {peer} | {med['runsc']:.2f} | "
        f"{med['cold'] / med['runsc']:.2f} |",
        f"| P12 vs gVisor: warm, `run --snapshot` (same rounds; {rng['warm']}) | s | {med['warm']:.2f} | {peer} | "
        f"{med['runsc']:.2f} | {med['warm'] / med['runsc']:.2f} |",
        f"| P16 vs gVisor: host PSS of one idle sandbox, `run -d --network none -- sleep 1000` (QEMU + monitor, "
        f"TCG) | MiB | {ours_kib / 1024:.1f} | an idle `runsc --platform=ptrace --network=none do sleep 1000` "
        f"(its {nproc} processes) | {runsc_kib / 1024:.1f} | {ours_kib / runsc_kib:.2f} |",
        f"| P8 vs gVisor: read a {mib} MiB host file (page cache) inside, `cat` to /dev/null timed by "
        f"/proc/uptime, virtiofs share (TCG) | MiB/s | {v_ours:.0f} | the same file through runsc's gofer | "
        f"{v_runsc:.0f} | {v_ours / v_runsc:.2f} |",
    ]
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
