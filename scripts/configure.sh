#!/usr/bin/env bash
# Configure build directory $1 (default: build) with the zig musl cross file; extra args go to
# `meson setup`. Idempotent: an existing directory is reconfigured only if options are given.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-build}; shift || true
cd "$top"
mkdir -p .cache
# meson 1.0.1 has no @DIRNAME@ in machine files: generate the [constants] it needs.
printf "[constants]\ntop = '%s'\n" "$top" > .cache/cross-constants.ini
if [[ ! -f $dir/build.ninja ]]; then
  rm -rf "$dir"
  meson setup "$dir" --cross-file .cache/cross-constants.ini --cross-file scripts/zig/cross.ini "$@"
elif (($#)); then
  meson configure "$dir" "$@"
fi
