#!/usr/bin/env bash
# A minimal Debian userland for `neshost run --rootfs` tests: `debootstrap --variant=minbase` of the
# host's own release (Debian 12 "bookworm" by default) into .cache/debian-minbase-<suite>/.
# Built only when missing (a finished tree carries .cache/debian-minbase-<suite>/.complete), into a
# temporary directory renamed into place, so an interrupted build is never taken for a finished one.
# Prints the tree's path. Usage: scripts/mkdebroot.sh [SUITE]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
suite=${1:-bookworm}
mirror=http://deb.debian.org/debian
dest=$top/.cache/debian-minbase-$suite
if [[ -f $dest/.complete ]]; then echo "$dest"; exit 0; fi
command -v debootstrap >/dev/null || { echo "mkdebroot: needs debootstrap (scripts/setup.sh installs it)" >&2; exit 1; }
mkdir -p "$top/.cache"
work=$(mktemp -d "$top/.cache/.debroot.XXXXXX")
trap 'rm -rf "$work"' EXIT
start=$(date +%s)
# Its log goes to stderr only on failure (debootstrap is chatty).
if ! debootstrap --variant=minbase "$suite" "$work/root" "$mirror" > "$work/log" 2>&1; then
  tail -n 30 "$work/log" >&2
  echo "mkdebroot: debootstrap failed (full log above, last lines)" >&2
  exit 1
fi
# apt's downloaded .debs are not part of a userland.
rm -rf "$work/root/var/cache/apt/archives/"*.deb
echo "debootstrap --variant=minbase $suite: $(( $(date +%s) - start )) s" > "$work/root/.complete"
rm -rf "$dest"
mv "$work/root" "$dest"
echo "mkdebroot: $(cat "$dest/.complete") -> $dest ($(du -sm "$dest" | cut -f1) MiB)" >&2
echo "$dest"
