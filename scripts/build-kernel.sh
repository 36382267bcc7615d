#!/usr/bin/env bash
# The lean guest kernel, the default of `neshost run` and every VM test: Debian's own source
# (package linux-source-6.1), configured as `make allnoconfig` + kernel/nesinit.config (all a VM of
# ours uses is built in: no modules, no initramfs decompression), built once per machine and cached:
#   .cache/kernel/lean/<key>/vmlinux   the ELF QEMU starts at its PVH entry (-kernel)
#   .cache/kernel/lean/<key>/config    the whole .config it was built from
#   .cache/kernel/lean/<key>/release   its `uname -r`
#   .cache/kernel/lean/vmlinux         symlink to the current <key>/vmlinux (release likewise)
# Other keys' kernels and dead build dirs are pruned at each run (below).
# <key>: the first 16 hex digits of the SHA-256 of the source package's version, the fragment and
# this script: a new source, config or recipe builds anew; nothing else does. Debian's cloud
# kernel (scripts/fetch-kernel.sh) stays the fallback (`neshost run --kernel .cache/kernel/vmlinux`).
# Prints the vmlinux path. Needs root only for apt (scripts/setup.sh installs the packages).
# Usage: scripts/build-kernel.sh [--jobs N]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
jobs=$(nproc)
[[ ${1-} == --jobs ]] && jobs=${2:?}
tarball=/usr/src/linux-source-6.1.tar.xz
frag=$top/kernel/nesinit.config
[[ -f $tarball ]] || { echo "build-kernel: $tarball missing (apt-get install linux-source-6.1)" >&2; exit 1; }
version=$(dpkg-query -W -f='${Version}' linux-source-6.1)
key=$( { echo "$version"; cat "$frag" "$0"; } | sha256sum | cut -c1-16)
dest=$top/.cache/kernel/lean
out=$dest/$key
mkdir -p "$dest"
# One build per key at a time: a second set-up (another worktree sharing this cache, a second
# shell) waits here for the first and then finds its vmlinux, instead of building it again.
exec 9>"$dest/.lock"
flock 9
if [[ ! -f $out/vmlinux ]]; then
  work=$(mktemp -d "$dest/build.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  start=$SECONDS
  tar -xJf "$tarball" -C "$work"
  src=$work/linux-source-6.1
  # allnoconfig with the fragment's values forced (KCONFIG_ALLCONFIG), then every value checked:
  # a symbol Kconfig dropped (a missing dependency) is a build error here, not a guest surprise.
  KCONFIG_ALLCONFIG=$frag make -s -C "$src" allnoconfig >/dev/null
  bad=0
  while IFS='=' read -r k v; do
    if [[ $v == n ]]; then grep -q "^$k=" "$src/.config" && { echo "build-kernel: $k is set, wanted n" >&2; bad=1; }
    else grep -qxF "$k=$v" "$src/.config" || { echo "build-kernel: $k=$v did not take" >&2; bad=1; }; fi
  done < <(grep -E '^CONFIG_[A-Z0-9_]+=' "$frag")
  ((bad == 0)) || exit 1
  echo "build-kernel: building $(make -s -C "$src" kernelrelease) ($jobs jobs)" >&2
  make -s -C "$src" -j"$jobs" vmlinux >"$work/build.log" 2>&1 || { tail -40 "$work/build.log" >&2; exit 1; }
  mkdir -p "$out.tmp"
  cp "$src/vmlinux" "$out.tmp/vmlinux"
  cp "$src/.config" "$out.tmp/config"
  make -s -C "$src" kernelrelease > "$out.tmp/release"
  rm -rf "$out"
  mv "$out.tmp" "$out"
  echo "build-kernel: built in $((SECONDS - start)) s" >&2
fi
ln -sfn "$key/vmlinux" "$dest/vmlinux"
ln -sfn "$key/release" "$dest/release"
# Pruned: kernels of other keys (an older source, config or recipe: nothing points at them now;
# a QEMU started from one has it loaded already) and build dirs of a build killed over 6 hours
# ago (a build running now is younger); each kernel is ~14 MB, each dead build dir ~1.3 GB.
for old in "$dest"/[0-9a-f]*; do
  [[ -d $old && $(basename "$old") =~ ^[0-9a-f]{16}(\.tmp)?$ && $(basename "$old") != "$key" ]] || continue
  rm -rf "$old" && echo "build-kernel: pruned $(basename "$old")" >&2
done
find "$dest" -maxdepth 1 -name 'build.*' -type d -mmin +360 -exec rm -rf {} + 2>/dev/null || true
echo "$dest/vmlinux"
