#!/usr/bin/env bash
# README command 1: the main job. Installs what is missing for it alone (scripts/setup.sh --main:
# Debian packages, zig, simdjson, the guest kernels; the lean kernel's build beside the rest; not
# what only the tests need, which scripts/test.sh adds), builds neshost, nesinit and the guest
# initramfs (a build/ made here leaves the containerd shim out: -Dcontainerd=false), then boots a
# QEMU microVM with nesinit as PID 1 and runs one workload in it. Set-up and build output goes to
# stderr; stdout is the workload's. Exits with the workload's exit status (7).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
scripts/setup.sh --main build >&2
ninja -C build host/cli/neshost nesinit/nesinit host/vm/initrd.cpio >&2
exec build/host/cli/neshost run --network none -- /bin/sh -c 'echo hello from the guest; uname -r; exit 7'
