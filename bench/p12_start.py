#!/usr/bin/env python3
"""P12: `neshost run -- /bin/true` end to end (process start to exit, host clock), cold boot under
TCG, each boot-time step side by side in one invocation (scripts/bench.sh runs it; not a test).
Prints markdown rows for bench/results/latest.md.

Configurations, alternating order between rounds, each a fresh VM (`--network none` unless
named; state and runtime dirs in a private temp dir):
  cloud      the configuration before the lean kernel: q35 + Debian's cloud kernel, decompressed
             (--kernel .cache/kernel/vmlinux), crypto self-tests off, the channel's modules loaded,
             without the TCG boot words (NESHOST_TCG_BOOT_WORDS=0)
  lean       today's default: the lean kernel scripts/build-kernel.sh builds (everything built
             in, no module loaded), the same initramfs (it carries the cloud kernel's modules for
             the fallback), the TCG boot words `nolapic_timer noreplace-smp`
  lean-plain lean without the TCG boot words (NESHOST_TCG_BOOT_WORDS=0): the kernel calibrates its
             local APIC timer against the PIT for 100 ms and patches a 1-vCPU kernel's SMP lock
             prefixes to their UP form at every boot (the default before)
  lean-up    lean-plain + `noreplace-smp` alone: what each word saves
  lean-slim  + an initramfs without modules (mkinitrd --modules ""): what carrying them costs
  cmdline    lean + Firecracker's kind of command line (tsc_early_khz, lpj, no_timer_check,
             i8042 probing off, pci=lastbus=0, mitigations=off): kept only if it pays
  lean+nic   today's default network (`--network user`: passt started, a NIC), run in a network
             namespace of its own (tests/support/netns.py)
  warm       a warm start: the lean default restored from a snapshot (`neshost snapshot create`,
             made once before the rounds; `run --snapshot`)
  warm+share warm with a share (-v: its RAM a private shared copy, the share plugged in)
  warm+nic   warm with the default network (the NIC plugged in after the restore)
Medians over rounds, each row with its per-round range; ratios against `cloud`.
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

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLOUD = ["--kernel", os.path.join(TOP, ".cache", "kernel", "vmlinux")]
SNAP = SHARE = ""  # main() makes them


def khz():
    with open("/proc/cpuinfo") as f:
        for l in f:
            if l.startswith("cpu MHz"):
                return int(float(l.split(":")[1]) * 1000)
    return 0


TUNED = (f"tsc_early_khz={khz()} lpj={khz() * 4} tsc=reliable no_timer_check i8042.noaux i8042.nomux i8042.nopnp "
         "i8042.dumbkbd pci=lastbus=0 mitigations=off")


PLAIN = {"NESHOST_TCG_BOOT_WORDS": "0"}


def configs(slim_initrd):
    return [  # name, environment (NESHOST_APPEND, ...), --network, more flags
        ("cloud", PLAIN, "none", CLOUD),
        ("lean", {}, "none", []),
        ("lean-plain", PLAIN, "none", []),
        ("lean-up", dict(PLAIN, NESHOST_APPEND="noreplace-smp"), "none", []),
        ("lean-slim", {}, "none", ["--initrd", slim_initrd]),
        ("cmdline", {"NESHOST_APPEND": TUNED}, "none", []),
        ("lean+nic", {}, "user", []),
        ("warm", {}, "none", ["--snapshot", SNAP]),
        ("warm+share", {}, "none", ["--snapshot", SNAP, "-v", f"{SHARE}:/share"]),
        ("warm+nic", {}, "user", ["--snapshot", SNAP]),
    ]


def neshost_env(tmp, more_env=None):
    """The environment of a neshost the bench runs: ours with TMPDIR and XDG_RUNTIME_DIR `tmp`, without
    the variables that change a VM's boot or NIC (NESHOST_NETWORK, NESHOST_APPEND,
    NESHOST_TCG_BOOT_WORDS: a stray one would change every row), then `more_env`."""
    env = dict(os.environ, TMPDIR=tmp, XDG_RUNTIME_DIR=tmp)
    for k in ("NESHOST_NETWORK", "NESHOST_APPEND", "NESHOST_TCG_BOOT_WORDS"):
        env.pop(k, None)
    env.update(more_env or {})
    return env


def one_run(nh, more_env, network, flags):
    tmp = tempfile.mkdtemp(prefix="nes-p12.")
    try:
        env = neshost_env(tmp, more_env)
        t0 = time.monotonic()
        p = subprocess.run([nh, "run", "--accel", "tcg", "--state", os.path.join(tmp, "state"), "--network",
                            network, *flags, "--", "/bin/true"], env=env, capture_output=True, timeout=300)
        secs = time.monotonic() - t0
        if p.returncode != 0:
            raise SystemExit(f"p12: exit {p.returncode} ({more_env!r}, {network}): {p.stderr.decode()[-2000:]}")
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
    work = tempfile.mkdtemp(prefix="nes-p12-initrd.")
    global SNAP, SHARE
    SNAP = os.path.join(work, "snap")
    SHARE = os.path.join(work, "share")
    os.mkdir(SHARE)
    try:
        # The snapshot every warm round restores (its own state dir; a directory path for --snapshot),
        # made in the environment the rounds run in (neshost_env: no stray boot words or network).
        subprocess.run([nh, "snapshot", "create", "--accel", "tcg", "--state", work, "warm"], check=True,
                       env=neshost_env(work), capture_output=True, timeout=300)
        os.rename(os.path.join(work, ".snapshots", "warm"), SNAP)
        slim = os.path.join(work, "initrd-slim.cpio")
        subprocess.run([os.path.join(TOP, "scripts", "mkinitrd.sh"), "--modules", "", "-o", slim], check=True,
                       capture_output=True, timeout=120)
        cfgs = configs(slim)
        res = {name: [] for name, *_ in cfgs}
        for r in range(rounds):
            for name, more_env, network, flags in (cfgs if r % 2 == 0 else cfgs[::-1]):
                res[name].append(one_run(nh, more_env, network, flags))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {n: statistics.median(xs) for n, xs in res.items()}
    rng = {n: f"{min(xs):.2f}-{max(xs):.2f}" for n, xs in res.items()}
    base = med["cloud"]
    what = (f"`neshost run --network none -- /bin/true`, process start to exit (TCG, q35; median of {rounds}, "
            "alternating)")
    rows = [
        f"| P12 {what}, today's default: the lean kernel ({rng['lean']}) | s | {med['lean']:.2f} | q35 + Debian's "
        f"cloud kernel, the default before ({rng['cloud']}) | {base:.2f} | {med['lean'] / base:.2f} |",
        f"| P12 step: an initramfs without the cloud kernel's modules ({rng['lean-slim']}) | s | "
        f"{med['lean-slim']:.2f} | the lean default | {med['lean']:.2f} | {med['lean-slim'] / med['lean']:.2f} |",
        f"| P12 step: `noreplace-smp` (a 1-vCPU kernel keeps its SMP lock prefixes: no patching them to UP at "
        f"boot; {rng['lean-up']}) | s | {med['lean-up']:.2f} | the lean kernel without the TCG boot words, the "
        f"default before ({rng['lean-plain']}) | {med['lean-plain']:.2f} | {med['lean-up'] / med['lean-plain']:.2f} |",
        f"| P12 step: + `nolapic_timer` (the HPET ticks: no 100 ms APIC timer calibration; today's default, "
        f"{rng['lean']}) | s | {med['lean']:.2f} | the previous step | {med['lean-up']:.2f} | "
        f"{med['lean'] / med['lean-up']:.2f} |",
        f"| P12 step: a tuned command line (TSC given, no timer check, i8042 and PCI probing off, "
        f"mitigations=off; {rng['cmdline']}) | s | {med['cmdline']:.2f} | the lean default | {med['lean']:.2f} | "
        f"{med['cmdline'] / med['lean']:.2f} |",
        f"| P12 the default network's cost: `--network user` (passt, a NIC; {rng['lean+nic']}) | s | "
        f"{med['lean+nic']:.2f} | `--network none` | {med['lean']:.2f} | {med['lean+nic'] / med['lean']:.2f} |",
        f"| P12 warm: restored from a snapshot (`run --snapshot`; {rng['warm']}) | s | {med['warm']:.2f} | "
        f"the cold lean default | {med['lean']:.2f} | {med['warm'] / med['lean']:.2f} |",
        f"| P12 warm with a share (`-v`: a private shared copy of the RAM, the share plugged in; {rng['warm+share']}) "
        f"| s | {med['warm+share']:.2f} | warm | {med['warm']:.2f} | {med['warm+share'] / med['warm']:.2f} |",
        f"| P12 warm with the default network (`--network user`: the NIC plugged in; {rng['warm+nic']}) | s | "
        f"{med['warm+nic']:.2f} | warm | {med['warm']:.2f} | {med['warm+nic'] / med['warm']:.2f} |",
    ]
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
