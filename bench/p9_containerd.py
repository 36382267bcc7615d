#!/usr/bin/env python3
"""P9: a task's start -> exit through containerd, `/bin/true` by `ctr run --rm`, with
containerd-shim-nesinit-v2 (each task a microVM) against Debian's runc shim (a container on the
host's kernel), on one private containerd in one invocation, contenders alternating, medians
(scripts/bench.sh runs it; not a test). Warm contenders restore each task's VM from
one snapshot (`neshost snapshot create`; the shim's io.nesinit.snapshot annotation). A third contender, `neshost run /bin/true` alone, shows
where the time goes: the microVM's own cycle (boot, ready, workload, power-off) against what
containerd and the shim add around it. Prints markdown rows for bench/results/latest.md.

Usage: p9_containerd.py SHIM NESHOST INITRD [RUNS]   (default 5; needs root)
The daemon is private (own root, state, sockets and config, CRI disabled) and runs in a private
mount namespace; it is stopped and its directory removed at the end.
"""
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

BOUND = 300  # seconds: the most one run may take


def userland(root):
    os.makedirs(os.path.join(root, "bin"))
    shutil.copy("/bin/busybox", os.path.join(root, "bin", "busybox"))
    for a in ("sh", "true"):
        os.symlink("busybox", os.path.join(root, "bin", a))


def timed(argv, env):
    t0 = time.monotonic()
    r = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=BOUND)
    dt = time.monotonic() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {r.returncode}: {r.stderr.decode(errors='replace')[-2000:]}")
    return dt


def main():
    if len(sys.argv) < 4 or os.geteuid() != 0:
        print(__doc__, file=sys.stderr)
        return 2
    shim, nh, initrd = (os.path.abspath(a) for a in sys.argv[1:4])
    runs = int(sys.argv[4]) if len(sys.argv) > 4 else 5
    tmp = tempfile.mkdtemp(prefix="nes-p9.")
    daemon = None
    try:
        bindir = os.path.join(tmp, "bin")
        os.mkdir(bindir)
        os.symlink(shim, os.path.join(bindir, "containerd-shim-nesinit-v2"))
        sock = os.path.join(tmp, "c.sock")
        cfg = os.path.join(tmp, "config.toml")
        with open(cfg, "w") as f:
            f.write(f'version = 2\nroot = "{tmp}/root"\nstate = "{tmp}/state"\n'
                    f'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
                    f'[grpc]\n  address = "{sock}"\n[ttrpc]\n  address = "{sock}.ttrpc"\n')
        env = dict(os.environ, PATH=bindir + ":" + os.environ.get("PATH", "/usr/bin:/bin"), NESHOST=nh,
                   NESHOST_INITRD=initrd, TMPDIR=tmp, NESHOST_NETWORK="none")  # no NIC on this machine's net
        log = open(os.path.join(tmp, "containerd.log"), "wb")
        daemon = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "containerd", "--config", cfg],
                                  stdout=log, stderr=log, env=env)
        log.close()
        ctr = ["ctr", "--address", sock]
        deadline = time.monotonic() + 30
        while subprocess.run(ctr + ["version"], env=env, capture_output=True).returncode != 0:
            if time.monotonic() > deadline or daemon.poll() is not None:
                raise RuntimeError("containerd did not answer within 30 s")
            time.sleep(0.05)
        root = os.path.join(tmp, "rootfs")
        userland(root)
        # Warm: one snapshot (neshost snapshot create), each task's VM restored from it
        # (the io.nesinit.snapshot annotation: `neshost run --snapshot DIR`).
        nh_state = os.path.join(tmp, "nh-state")
        r = subprocess.run([nh, "snapshot", "create", "--state", nh_state, "--accel", "tcg", "warm"], env=env,
                           capture_output=True, timeout=BOUND)
        if r.returncode != 0:
            raise RuntimeError(f"snapshot create: {r.stderr.decode(errors='replace')}")
        snap = os.path.join(nh_state, ".snapshots", "warm")
        contenders = {
            "warm": lambda i: ctr + ["run", "--rm", "--runtime", "io.containerd.nesinit.v2", "--annotation",
                                     f"io.nesinit.snapshot={snap}", "--rootfs", root, f"w{i}", "/bin/true"],
            "neshost-warm": lambda i: [nh, "run", "--snapshot", snap, "--network", "none", "--state", nh_state,
                                       "--on-exit", "remove", "--rootfs", root, "--", "/bin/true"],
            "nesinit": lambda i: ctr + ["run", "--rm", "--runtime", "io.containerd.nesinit.v2", "--rootfs", root,
                                        f"n{i}", "/bin/true"],
            "runc": lambda i: ctr + ["run", "--rm", "--runtime", "io.containerd.runc.v2", "--rootfs", root,
                                     f"r{i}", "/bin/true"],
            "neshost": lambda i: [nh, "run", "--accel", "tcg", "--network", "none", "--state", nh_state,
                                  "--on-exit", "remove", "--rootfs", root, "--", "/bin/true"],
        }
        times = {k: [] for k in contenders}
        order = list(contenders)
        for i in range(runs):
            for k in order[i % len(order):] + order[:i % len(order)]:  # rotate who goes first
                times[k].append(timed(contenders[k](i), env))
        med = {k: statistics.median(v) for k, v in times.items()}
        spread = {k: f"{min(v):.2f}-{max(v):.2f} s" for k, v in times.items()}
        load = os.getloadavg()[0]
        n, r, h = med["nesinit"], med["runc"], med["neshost"]
        print(f"| P9 `ctr run --rm` `/bin/true`, task start → exit through containerd 1.6 (median of {runs}, "
              f"order rotated; {spread['nesinit']}, load {load:.1f}) | s | {n:.2f} | Debian's runc shim "
              f"({spread['runc']}) | {r:.3f} | {n / r:.1f} |")
        print(f"| P9 where the time goes: the same microVM by `neshost run --rootfs` alone ({spread['neshost']}); "
              f"containerd + shim add {n - h:.2f} s | s | {n:.2f} | `neshost run` alone | {h:.2f} | {n / h:.2f} |")
        w, hw = med["warm"], med["neshost-warm"]
        print(f"| P9 warm: the same, each task's VM restored from a snapshot (annotation io.nesinit.snapshot; "
              f"{spread['warm']}) | s | {w:.2f} | Debian's runc shim | {r:.3f} | {w / r:.1f} |")
        print(f"| P9 warm, where the time goes: `neshost run --snapshot --rootfs` alone ({spread['neshost-warm']}); "
              f"containerd + shim add {w - hw:.2f} s | s | {w:.2f} | `neshost run --snapshot` alone | {hw:.2f} | {w / hw:.2f} |")
    finally:
        if daemon and daemon.poll() is None:
            daemon.terminate()
            try:
                daemon.wait(timeout=20)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
