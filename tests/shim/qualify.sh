#!/usr/bin/env bash
# The shim's qualification matrix (issue 29): every case of containerd_test.py, PASSES times in a
# row (default 3) against one private containerd, with the artifacts' SHA-256s, each case's result
# and duration, and an audit after every case and pass (tasks, containers, bundles, shim sockets,
# processes, mounts, runtime dirs, cgroups). As root, after `ninja -C BUILD`; `meson test`
# runs it as shim-qualify (suite shim-qualify, 3 passes).
#   tests/shim/qualify.sh [BUILD] [PASSES]
set -euo pipefail
build=$(cd "${1:-build}" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
export NESHOST=$build/host/cli/neshost NESHOST_SHIM=$build/host/shim/containerd-shim-nesinit-v2 \
  NESHOST_INITRD=$build/host/vm/initrd.cpio NESHOST_NETWORK=none
exec /usr/bin/python3 "$here/containerd_test.py" --qualify "${2:-3}"
