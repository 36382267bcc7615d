#!/usr/bin/env bash
# Provide containerd 1.7 (Debian 13's), beside Debian 12's 1.6 (the system's, from apt): the
# CRI suite (tests/cri, `cri-nesinit-*-c17`) and one pass of `shim-qualify` (tests/shim) also run
# against it, so the shim is qualified against both (docs/containerd.md "Qualified against").
#  - Debian 13's (trixie) `containerd` package, fetched with `apt-get download` through a private
#    source list (scripts/debian-unpack.sh) and unpacked with `dpkg-deb -x`, never installed.
#  - No loader of its own: its binaries (containerd, ctr, containerd-shim-runc-v2) are Go
#    programs linked against libc.so.6 alone and need GLIBC_2.34 at most (`objdump -T`), which
#    Debian 12's 2.36 has; they run as they are.
#
# Result (idempotent: a second run only checks the binaries):
#   .cache/containerd17/bin/   containerd, ctr, containerd-shim-runc-v2 (links into root/):
#                              a directory to put first on PATH
#   .cache/containerd17/root/  the unpacked package
#   .cache/containerd17/source one line: where it came from and `containerd --version`
# Prints the bin directory. Usage: scripts/fetch-containerd.sh [--offline]
#   --offline: never touch the network; fail (exit 1) if it is not there.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
dest=$top/.cache/containerd17
bin=$dest/bin
offline=0
[[ ${1:-} == --offline ]] && offline=1
# shellcheck source=scripts/debian-unpack.sh
. "$top/scripts/debian-unpack.sh"

progs=(containerd ctr containerd-shim-runc-v2)
# "containerd github.com/containerd/containerd 1.7.24~ds1 1.7.24~ds1-6+deb13u1"
is_17() { "$dest/root/usr/bin/containerd" --version 2>/dev/null | grep -Eq ' v?1\.7\.'; }
linked() {
  local p
  for p in "${progs[@]}"; do [[ -x $bin/$p ]] || return 1; done
}

if ! is_17; then
  ((offline)) && { echo "fetch-containerd: no containerd 1.7 in $dest (run without --offline)" >&2; exit 1; }
  debian_unpack "$dest" trixie containerd/trixie
  is_17 || { echo "fetch-containerd: the unpacked containerd does not run or is not 1.7" >&2; exit 1; }
fi
if ! linked; then
  mkdir -p "$bin"
  for p in "${progs[@]}"; do ln -sfn "../root/usr/bin/$p" "$bin/$p"; done
fi
echo "debian trixie ($(paste -sd' ' "$dest/packages")): $("$dest/root/usr/bin/containerd" --version)" > "$dest/source"
echo "$bin"
