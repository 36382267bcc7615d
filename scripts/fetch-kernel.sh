#!/usr/bin/env bash
# Fetch the guest kernel: Debian's cloud flavour (docs/facts.md "A real microVM"), downloaded with
# `apt-get download` and unpacked with `dpkg-deb -x` — never installed on this machine.
#
# Result (idempotent; a second run does nothing unless the metapackage now points elsewhere):
#   .cache/kernel/<release>/            the unpacked package (boot/vmlinuz-<release>, lib/modules/<release>/)
#   .cache/kernel/release               the kernel release, e.g. 6.1.0-57-cloud-amd64
#   .cache/kernel/package               package name and version, e.g. linux-image-6.1.0-57-cloud-amd64 6.1.192-3
#   .cache/kernel/vmlinuz               symlink to the kernel image
#   .cache/kernel/modules               symlink to lib/modules/<release>
# Prints the kernel image path on stdout. Usage: scripts/fetch-kernel.sh [--offline]
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

if ((offline)); then
  have_current || { echo "fetch-kernel: no kernel in $dest (run without --offline)" >&2; exit 1; }
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
echo "$pkg $ver" > "$dest/package"
echo "$rel" > "$dest/release.tmp" && mv "$dest/release.tmp" "$dest/release"
echo "fetch-kernel: $pkg $ver -> $dest/$rel" >&2
echo "$dest/vmlinuz"
