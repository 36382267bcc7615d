#!/usr/bin/env bash
# README command 1: the main job. Installs what is missing (scripts/setup.sh: Debian packages,
# zig, simdjson, the guest kernel), builds neshost, nesinit and the guest initramfs, then boots a
# QEMU microVM with nesinit as PID 1 and runs one workload in it. Set-up and build output goes to
# stderr; stdout is the workload's. Exits with the workload's exit status (7).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
scripts/setup.sh build >&2
ninja -C build host/cli/neshost nesinit/nesinit host/vm/initrd.cpio >&2
exec build/host/cli/neshost run --network none -- /bin/sh -c 'echo hello from the guest; uname -r; exit 7'
