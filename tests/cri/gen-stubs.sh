#!/bin/sh
# Generate the Python protobuf module of the Kubernetes CRI API (package runtime.v1) for the CRI
# test client (tests/cri/cri_client.py) and bench P11, from the api.proto scripts/fetch-cri-api.sh
# unpacked from Debian 13's golang-github-kubernetes-cri-api-dev. Its gogoproto import and
# file-level gogoproto options only steer Go's code generator: they are stripped here (staged in
# OUTDIR, the source untouched) so protoc needs no gogo.proto. The gRPC calls are made by
# cri_client.py itself (grpc's generic unary calls), so no grpc plugin is needed.
# Writes OUTDIR/api_pb2.py. Usage: gen-stubs.sh PROTOC API_PROTO OUTDIR
set -eu
protoc=$1 proto=$2
[ -f "$proto" ] || { echo "gen-stubs.sh: $proto missing (scripts/fetch-cri-api.sh fetches it)" >&2; exit 1; }
grep -q '^package runtime.v1;' "$proto" || { echo "gen-stubs.sh: $proto is not package runtime.v1" >&2; exit 1; }
mkdir -p "$3"
out=$(cd "$3" && pwd)
stage=$out/cri-stage
rm -rf "$stage"
mkdir -p "$stage"
sed -e '/^import "github.com\/gogo\/protobuf\/gogoproto\/gogo.proto";/d' \
    -e '/^option (gogoproto\.[a-z_]*) *= *[a-z]*;/d' "$proto" > "$stage/api.proto"
if grep -n 'gogoproto' "$stage/api.proto" >&2; then
  echo "gen-stubs.sh: gogoproto left in $proto beyond the import and file options (above)" >&2
  exit 1
fi
"$protoc" -I"$stage" --python_out="$out" "$stage/api.proto"
rm -rf "$stage"
