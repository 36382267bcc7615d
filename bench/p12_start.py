#!/usr/bin/env python3
"""P12: `neshost run -- /bin/true` end to end (process start to exit, host clock), cold boot under
TCG, each boot-time step side by side in one invocation (scripts/bench.sh runs it; not a test).
Prints markdown rows for bench/results/latest.md.

Configurations, alternating order between rounds, each a fresh VM (`--network none` unless
named; state and runtime dirs in a private temp dir):
  before     the configuration before these steps: Debian's compressed bzImage (--kernel
             .cache/kernel/vmlinuz), kernel crypto self-tests on, every module of the initramfs
             loaded, restored through NESHOST_APPEND (the last word wins):
             `cryptomgr.notests=0 nesinit.modules=<all seven roots>`
  notests    + the kernel skips its crypto self-tests (cryptomgr.notests), every module loaded
  modules    + the init loads only the channel's modules (nesinit.modules=virtio_pci,
             virtio_console)
  now        + the decompressed kernel (.cache/kernel/vmlinux, started at its PVH entry: no
             decompression in the guest): today's default
  now+nic    today's default network (`--network user`: passt started, a NIC, virtio_net),
             run in a network namespace of its own (tests/support/netns.py)
Medians over rounds, each row with its per-round range; ratios against `before`.
Usage: p12_start.py NESHOST [ROUNDS]   (default 10)
"""
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "support"))
import netns  # noqa: E402

ALL_MODULES = ("virtio_pci,virtio_mmio,virtio_console,vmw_vsock_virtio_transport,virtio_blk,virtiofs,"
               "virtio_net")
TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BZIMAGE = ["--kernel", os.path.join(TOP, ".cache", "kernel", "vmlinuz")]
CONFIGS = [  # name, NESHOST_APPEND, --network, more flags
    ("before", f"cryptomgr.notests=0 nesinit.modules={ALL_MODULES}", "none", BZIMAGE),
    ("notests", f"nesinit.modules={ALL_MODULES}", "none", BZIMAGE),
    ("modules", "", "none", BZIMAGE),
    ("now", "", "none", []),
    ("now+nic", "", "user", []),
]


def one_run(nh, append, network, flags):
    tmp = tempfile.mkdtemp(prefix="nes-p12.")
    try:
        env = dict(os.environ, TMPDIR=tmp, XDG_RUNTIME_DIR=tmp, NESHOST_APPEND=append)
        env.pop("NESHOST_NETWORK", None)
        t0 = time.monotonic()
        p = subprocess.run([nh, "run", "--accel", "tcg", "--state", os.path.join(tmp, "state"), "--network",
                            network, *flags, "--", "/bin/true"], env=env, capture_output=True, timeout=300)
        secs = time.monotonic() - t0
        if p.returncode != 0:
            raise SystemExit(f"p12: exit {p.returncode} ({append!r}, {network}): {p.stderr.decode()[-2000:]}")
        return secs
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    netns.isolate()  # passt needs a namespace with a default route; nothing leaves the machine
    nh = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    res = {name: [] for name, *_ in CONFIGS}
    for r in range(rounds):
        order = CONFIGS if r % 2 == 0 else CONFIGS[::-1]
        for name, append, network, flags in order:
            res[name].append(one_run(nh, append, network, flags))
    med = {n: statistics.median(xs) for n, xs in res.items()}
    rng = {n: f"{min(xs):.2f}-{max(xs):.2f}" for n, xs in res.items()}
    base = med["before"]
    what = f"`neshost run --network none -- /bin/true`, process start to exit (TCG, q35, Debian's cloud kernel 6.1; median of {rounds}, alternating)"
    rows = [
        f"| P12 {what}, today's default ({rng['now']}) | s | {med['now']:.2f} | the configuration before "
        f"(the bzImage, crypto self-tests, every module; {rng['before']}) | {base:.2f} | {med['now'] / base:.2f} |",
        f"| P12 step: the kernel skips its crypto self-tests (cryptomgr.notests; {rng['notests']}) | s | "
        f"{med['notests']:.2f} | before | {base:.2f} | {med['notests'] / base:.2f} |",
        f"| P12 step: + only the channel's modules (nesinit.modules; {rng['modules']}) | s | {med['modules']:.2f} | "
        f"the previous step | {med['notests']:.2f} | {med['modules'] / med['notests']:.2f} |",
        f"| P12 step: + the decompressed kernel (vmlinux at its PVH entry; {rng['now']}) | s | {med['now']:.2f} | "
        f"the previous step (the bzImage) | {med['modules']:.2f} | {med['now'] / med['modules']:.2f} |",
        f"| P12 the default network's cost: `--network user` (passt, a NIC, virtio_net; {rng['now+nic']}) | s | "
        f"{med['now+nic']:.2f} | `--network none` | {med['now']:.2f} | {med['now+nic'] / med['now']:.2f} |",
    ]
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
