#!/usr/bin/env bash
# Provide the Kubernetes CRI API definition (`api.proto`, package runtime.v1) for the CRI test
# client (tests/cri/) and bench P11: Debian 12 does not package it; Debian 13's
# golang-github-kubernetes-cri-api-dev does. Fetched with `apt-get download` through a private
# source list (scripts/debian-unpack.sh) and unpacked with `dpkg-deb -x`: never installed, never
# committed. The Python stubs are generated from it at build time (tests/cri/gen-stubs.sh).
#
# Result (idempotent: a second run only checks the file):
#   .cache/cri-api/api.proto   the proto (a copy of the unpacked one)
#   .cache/cri-api/root/       the unpacked package
#   .cache/cri-api/source      one line: where it came from and its version
# Prints the proto's path. Usage: scripts/fetch-cri-api.sh [--offline]
#   --offline: never touch the network; fail (exit 1) if the proto is not there.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
dest=$top/.cache/cri-api
proto=$dest/api.proto
offline=0
[[ ${1:-} == --offline ]] && offline=1
# shellcheck source=scripts/debian-unpack.sh
. "$top/scripts/debian-unpack.sh"

# The package's proto: its runtime.v1 API (not the older v1alpha2).
find_proto() { find "$dest/root" -path '*/cri-api/pkg/apis/runtime/v1/api.proto' -print -quit 2>/dev/null; }
ok() { [[ -s $proto ]] && grep -q '^package runtime.v1;' "$proto"; }

if ok; then echo "$proto"; exit 0; fi
if [[ -z $(find_proto) ]]; then
  ((offline)) && { echo "fetch-cri-api: no $proto (run without --offline)" >&2; exit 1; }
  debian_unpack "$dest" trixie golang-github-kubernetes-cri-api-dev
fi
src=$(find_proto)
[[ -n $src ]] || { echo "fetch-cri-api: the package has no cri-api/pkg/apis/runtime/v1/api.proto" >&2; exit 1; }
cp "$src" "$proto.tmp" && mv "$proto.tmp" "$proto"
ok || { echo "fetch-cri-api: $src is not package runtime.v1" >&2; exit 1; }
echo "debian trixie ($(paste -sd' ' "$dest/packages")): ${src#"$dest/root"}" > "$dest/source"
echo "fetch-cri-api: $(cat "$dest/source") -> $proto" >&2
echo "$proto"
