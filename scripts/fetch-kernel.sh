#!/usr/bin/env bash
# Fetch the guest kernel: Debian's cloud flavour (docs/facts.md "A real microVM"), downloaded with
# `apt-get download` and unpacked with `dpkg-deb -x` — never installed on this machine.
#
# Result (idempotent; a second run does nothing unless the metapackage now points elsewhere):
#   .cache/kernel/<release>/            the unpacked package (boot/vmlinuz-<release>, lib/modules/<release>/)
#   .cache/kernel/release               the kernel release, e.g. 6.1.0-57-cloud-amd64
#   .cache/kernel/package               package name and version, e.g. linux-image-6.1.0-57-cloud-amd64 6.1.192-3
#   .cache/kernel/vmlinuz               symlink to the kernel image (bzImage)
#   .cache/kernel/vmlinux               symlink to <release>/boot/vmlinux-<release>: the same kernel
#                                       decompressed, an ELF QEMU starts at its PVH entry point:
#                                       no decompression in the guest (docs/vm.md "Boot time")
#   .cache/kernel/modules               symlink to lib/modules/<release>
# Prints the kernel image path (vmlinuz) on stdout. Usage: scripts/fetch-kernel.sh [--offline]
#   --offline: never touch the network; fail (exit 1) if nothing was fetched before.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
dest=$top/.cache/kernel
meta=linux-image-cloud-amd64
offline=0
[[ ${1:-} == --offline ]] && offline=1

have_current() {
  [[ -s $dest/release ]] || return 1
  local rel; rel=$(<"$dest/release")
  [[ -f $dest/$rel/boot/vmlinuz-$rel && -d $dest/$rel/lib/modules/$rel ]]
}

# Which versioned image package the metapackage depends on (e.g. linux-image-6.1.0-57-cloud-amd64).
image_pkg() {
  apt-cache depends "$meta" 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}'
}

# The bzImage's payload, decompressed (what the kernel's scripts/extract-vmlinux does): try each
# compressor's magic bytes in the file until one yields an ELF with a PVH entry (Xen ELF note
# 0x12, XEN_ELFNOTE_PHYS32_ENTRY). Written next to vmlinuz once; vmlinux is the symlink to it.
extract_vmlinux() {  # extract_vmlinux RELEASE
  local rel=$1 img out magic tool off
  img=$dest/$rel/boot/vmlinuz-$rel out=$dest/$rel/boot/vmlinux-$rel
  if [[ ! -s $out ]]; then
    for magic in 'lz4:\x02\x21\x4c\x18' 'zstd:\x28\xb5\x2f\xfd' 'xz:\xfd\x37\x7a\x58\x5a\x00' 'gzip:\x1f\x8b\x08'; do
      tool=${magic%%:*}
      command -v "$tool" >/dev/null || continue
      for off in $(LC_ALL=C grep -obUaP "${magic#*:}" "$img" | cut -d: -f1); do
        tail -c +$((off + 1)) "$img" | "$tool" -dc > "$out.tmp" 2>/dev/null || true
        if readelf -n "$out.tmp" 2>/dev/null | grep -q 'Xen.*0x00000012'; then
          mv "$out.tmp" "$out"
          break 2
        fi
      done
    done
    rm -f "$out.tmp"
    [[ -s $out ]] || { echo "fetch-kernel: no PVH ELF kernel found inside $img" >&2; return 1; }
  fi
  ln -sfn "$rel/boot/vmlinux-$rel" "$dest/vmlinux"
}

if ((offline)); then
  have_current || { echo "fetch-kernel: no kernel in $dest (run without --offline)" >&2; exit 1; }
  extract_vmlinux "$(<"$dest/release")"
  echo "$dest/vmlinuz"; exit 0
fi

pkg=$(image_pkg || true)
if [[ -z $pkg ]]; then
  # Fresh machine: package lists not there yet.
  apt-get update -qq >&2
  pkg=$(image_pkg || true)
fi
[[ -n $pkg ]] || { echo "fetch-kernel: apt knows no dependency of $meta" >&2; exit 1; }
rel=${pkg#linux-image-}

if have_current && [[ $(<"$dest/release") == "$rel" ]]; then
  extract_vmlinux "$rel"
  echo "$dest/vmlinuz"; exit 0
fi

mkdir -p "$dest"
work=$(mktemp -d "$dest/.fetch.XXXXXX")
trap 'rm -rf "$work"' EXIT
# apt-get download writes into the current directory. As root it warns that the download runs
# unsandboxed (the _apt user cannot write here); that is expected.
(cd "$work" && apt-get download -qq "$pkg" 2> >(grep -v 'unsandboxed as root' >&2))
deb=$(ls "$work"/*.deb)
ver=$(dpkg-deb -f "$deb" Version)
dpkg-deb -x "$deb" "$work/root"
[[ -f $work/root/boot/vmlinuz-$rel ]] || { echo "fetch-kernel: $deb has no boot/vmlinuz-$rel" >&2; exit 1; }
rm -rf "${dest:?}/$rel"
mv "$work/root" "$dest/$rel"
ln -sfn "$rel/boot/vmlinuz-$rel" "$dest/vmlinuz"
ln -sfn "$rel/lib/modules/$rel" "$dest/modules"
extract_vmlinux "$rel"
echo "$pkg $ver" > "$dest/package"
echo "$rel" > "$dest/release.tmp" && mv "$dest/release.tmp" "$dest/release"
echo "fetch-kernel: $pkg $ver -> $dest/$rel" >&2
echo "$dest/vmlinuz"
