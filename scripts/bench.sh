#!/usr/bin/env bash
# Benchmarks side by side with tini, catatonit, dumb-init (not part of the tests): P1-P4 by
# bench/bench.cpp, P5 by bench/host_bench.cpp, P6 by bench/stdio_bench.cpp and, inside a VM,
# bench/vm_stdio_bench.py, P8 (shares over virtiofs vs the packed initramfs, in real TCG microVMs)
# by bench/p8_shares.py, P7 (the init's share of a VM boot against a busybox /init floor) by
# bench/p7_boot.py, P9 (a task through containerd: ours vs runc's shim) by
# bench/p9_containerd.py, P10 (the VM's network: TCP guest -> host through passt and slirp against
# the data channel, connect set-up; in a network namespace of its own) by bench/p10_network.py,
# P12 (`neshost run -- /bin/true` end to end, each boot-time step against the configuration before
# it) by bench/p12_start.py, P11 (a pod's start through containerd's CRI and the host memory per
# pod, ours (one VM per pod) against containerd's runc runtime) by bench/p11_cri.py, P13 (a detached VM's
# monitor SIGKILLed -> a replacement monitor has the lifecycle channel back, sandbox and VM) by
# bench/p13_adopt.py, P14 (data channel resume: a host's death to output flowing again) by
# tests/host/data_resume_e2e.py --bench, P16 (an idle VM's host memory, each memory lever: TCG's
# translation buffer, the guest's RAM size) by bench/p16_vm_memory.py, and side by side with gVisor
# (`runsc do`, ptrace platform: P12 cold and warm start, P16 an idle sandbox's host PSS, P8 a 256 MiB
# file read inside) by bench/p18_runsc.py, P15's pull row (`neshost pull`
# from a registry on 127.0.0.1 against `skopeo copy` of the same image) by bench/p15_pull.py, P19 (an
# image's block root built, EROFS against ext4, and its cached case) by bench/p19_block_root.py.
# Each bench's rows replace its figures' rows in bench/results/latest.md (one row per figure, with
# the date, load and commit it was measured at), the replaced rows appended to
# bench/results/history.md (scripts/bench-results.py), right after that bench: a run cut short
# keeps what it measured. Prints latest.md at the end.
# Usage: scripts/bench.sh [--iterations N] [--storm N]   (defaults 200, 10000; needs root)
# On a busy machine, P1 alone with every contender under SCHED_FIFO (other load then preempts none
# of them, alike): chrt -f 10 build/bench/bench --p1-only [--iterations N]; NESINIT_BASE=OTHER_INIT
# adds a second build of the init (say, main's) to the same rotation.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
scripts/setup.sh build
ninja -C build bench/bench bench/storm bench/floor_init bench/host_bench bench/stdio_bench bench/block_root_tool nesinit/nesinit host/cli/neshost host/vm/initrd.cpio \
  host/shim/containerd-shim-nesinit-v2 tests/vm/vm_net_probe tests/cri/api_pb2.py
latest=bench/results/latest.md history=bench/results/history.md
mkdir -p bench/results
commit=$(git rev-parse --short HEAD)$(git diff --quiet HEAD 2>/dev/null || echo +dirty)
# record CMD...: runs one bench (its rows on stdout), then merges them into latest.md with the UTC
# time it started, the 1-minute load average before and after it, and the commit.
record() {
  local date load rows
  date=$(date -u '+%Y-%m-%d %H:%M')
  load=$(cut -d' ' -f1 /proc/loadavg)
  rows=$("$@")
  load+=-$(cut -d' ' -f1 /proc/loadavg)
  python3 scripts/bench-results.py "$latest" "$history" --date "$date" --load "$load" --commit "$commit" <<<"$rows"
}
record env NESINIT_BIN=build/nesinit/nesinit NES_STORM_BIN=build/bench/storm build/bench/bench "$@"
record build/bench/host_bench 1000
record env NESINIT_BIN=build/nesinit/nesinit build/bench/stdio_bench 256 3
record python3 bench/vm_stdio_bench.py build/host/cli/neshost build/host/vm/initrd.cpio .cache/kernel/lean/vmlinux 40 3
record python3 bench/p8_shares.py build/host/cli/neshost
record env P7_MODULES= python3 bench/p7_boot.py build/nesinit/nesinit .cache/kernel/lean/vmlinux 7  # the default kernel
record python3 bench/p9_containerd.py build/host/shim/containerd-shim-nesinit-v2 build/host/cli/neshost build/host/vm/initrd.cpio
record python3 bench/p10_network.py build/host/cli/neshost build/tests/vm/vm_net_probe
record python3 bench/p12_start.py build/host/cli/neshost
record python3 bench/p13_adopt.py build/host/cli/neshost build/nesinit/nesinit 10 3
record python3 bench/p16_vm_memory.py build/host/cli/neshost 5
record python3 bench/p18_runsc.py build/host/cli/neshost 5
record python3 bench/p15_pull.py build/host/cli/neshost 5
record python3 bench/p19_block_root.py build/bench/block_root_tool 3
record python3 tests/host/data_resume_e2e.py build/host/cli/neshost build/nesinit/nesinit --bench 10
record /usr/bin/python3 bench/p11_cri.py build/tests/cri 7 --nesinit build/host/shim/containerd-shim-nesinit-v2 build/host/cli/neshost \
  build/host/vm/initrd.cpio  # Debian's python3: python3-grpcio
cat "$latest"
