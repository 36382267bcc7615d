#!/usr/bin/env bash
# Inspect the built init: fully static (no PT_INTERP, no DT_NEEDED), no glibc symbol versions and
# no GNU ABI-tag note (musl), `--version` runs in an empty chroot holding only the binary; print
# its stripped size, which must not exceed MAX_BYTES when given (the size budget: docs/protocol.md
# "Size"). Usage: check-init-binary.sh PATH [musl|glibc] [MAX_BYTES]
set -euo pipefail
bin=$1 libc=${2:-musl} max=${3:-}
fail() { echo "FAIL: $*"; exit 1; }
readelf -lW "$bin" | grep -q 'INTERP' && fail "has PT_INTERP (dynamically linked)"
readelf -dW "$bin" | grep -q 'NEEDED' && fail "has DT_NEEDED entries"
if [[ $libc == musl ]]; then
  readelf -VW "$bin" | grep -q 'GLIBC_' && fail "has GLIBC_ symbol versions"
  readelf -nW "$bin" | grep -q 'NT_GNU_ABI_TAG' && fail "has a GNU ABI-tag note (glibc)"
fi
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
strip -o "$root/nesinit" "$bin"
out=$(chroot "$root" /nesinit --version) || fail "--version failed in an empty chroot"
[[ $out == nesinit\ * ]] || fail "unexpected --version output: $out"
echo "chroot --version: $out"
size=$(stat -c %s "$root/nesinit")
echo "stripped size: $size bytes ($libc)"
if [[ -n $max ]] && (( size > max )); then
  fail "stripped size $size bytes is over the budget of $max bytes (docs/protocol.md \"Size\": find what grew, e.g. nm --size-sort -S)"
fi
echo "unstripped size: $(stat -c %s "$bin") bytes"
