#!/usr/bin/env bash
# Assemble a guest initramfs (cpio "newc", every entry owned by 0:0) for `neshost run`:
#   /init and /sbin/init      the init (nesinit, static)
#   userland                  Debian's busybox-static with all its applet links, or --rootfs DIR
#   /dev/console (c 5 1)      without it PID 1 starts with no stdout (docs/facts.md)
#   /lib/modules/<release>/…  the kernel's virtio modules (decompressed if .ko.xz/.ko.zst/.ko.gz)
#   /etc/nesinit/modules      their absolute paths, one per line, in dependency order (a module
#                             after everything it depends on), read by nesinit at boot
#   /etc/nesinit/modules.d/M  the same for one root module M and its dependencies: what nesinit
#                             loads for `nesinit.modules=M,...` (neshost names only what the VM uses)
# Needs no root: the device node is written straight into the archive, not with mknod.
#
# Usage: scripts/mkinitrd.sh -o OUT [--init PATH] [--rootfs DIR] [--modules-dir DIR]
#                            [--modules "NAME…"] [--gzip]
#   --init PATH        the init binary (default: build/nesinit/nesinit; installed as
#                      nesinit-mkinitrd: the init installed in <prefix>/lib/nesinit)
#   --rootfs DIR       pack DIR as the userland instead of busybox (the init is still added)
#   --modules-dir DIR  lib/modules/<release> of the guest kernel (default: .cache/kernel/modules,
#                      from scripts/fetch-kernel.sh)
#   --modules LIST     root modules to include with their dependencies (default below; "" = none)
#   --gzip             compress the archive with gzip (default: uncompressed, the fastest to unpack
#                      under TCG)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)

# virtio over PCI (q35) and MMIO (microvm), the virtio-serial console port that carries the
# channel, vsock (the production transport), virtio-blk, and virtiofs (with fuse, its dependency)
# for shares and a host directory as root, virtio-net for the NIC (boot.network). No 9p in the
# cloud flavour.
default_modules="virtio_pci virtio_mmio virtio_console vmw_vsock_virtio_transport virtio_blk virtiofs virtio_net"

out= init=$top/build/nesinit/nesinit rootfs= moddir=$top/.cache/kernel/modules
roots=$default_modules gzip=0
# Installed as <prefix>/bin/nesinit-mkinitrd (meson install, the nesinit package).
[[ -e $init || ! -x $top/lib/nesinit/nesinit ]] || init=$top/lib/nesinit/nesinit
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
while (($#)); do
  case $1 in
    -o|--output) out=${2:?}; shift 2 ;;
    --init) init=${2:?}; shift 2 ;;
    --rootfs) rootfs=${2:?}; shift 2 ;;
    --modules-dir) moddir=${2:?}; shift 2 ;;
    --modules) roots=${2-}; shift 2 ;;
    --gzip) gzip=1; shift ;;
    -h|--help) usage ;;
    *) echo "mkinitrd: unknown argument '$1'" >&2; usage ;;
  esac
done
[[ -n $out ]] || { echo "mkinitrd: -o OUT is required" >&2; usage; }
[[ -f $init && -x $init ]] || { echo "mkinitrd: --init: '$init' is not an executable file" >&2; exit 1; }
[[ -z $rootfs || -d $rootfs ]] || { echo "mkinitrd: --rootfs: '$rootfs' is not a directory" >&2; exit 1; }
if [[ -n $roots ]]; then
  [[ -d $moddir ]] || { echo "mkinitrd: --modules-dir: '$moddir' missing (run scripts/fetch-kernel.sh)" >&2; exit 1; }
  moddir=$(cd "$moddir" && pwd -P)
fi

stage=$(mktemp -d "${TMPDIR:-/tmp}/nes-mkinitrd.XXXXXX")
trap 'rm -rf "$stage"' EXIT
root=$stage/root
mkdir -p "$root"

# ---- userland ----
if [[ -n $rootfs ]]; then
  cp -a "$rootfs/." "$root/"
else
  bb=$(command -v busybox || true)
  [[ -n $bb ]] && file -L "$bb" | grep -q 'statically linked' ||
    { echo "mkinitrd: needs a static busybox (Debian package busybox-static)" >&2; exit 1; }
  mkdir -p "$root/bin"
  cp "$bb" "$root/bin/busybox"
  # One link per applet at the path busybox itself names (bin/sh, usr/bin/awk, sbin/…).
  while read -r applet; do
    [[ $applet == bin/busybox ]] && continue
    mkdir -p "$root/$(dirname "$applet")"
    ln -sf /bin/busybox "$root/$applet"
  done < <("$bb" --list-full)
  mkdir -p "$root/etc"
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' > "$root/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' > "$root/etc/group"
fi
mkdir -p "$root"/{dev,proc,sys,run,tmp,root,sbin,etc/nesinit}
chmod 1777 "$root/tmp"
chmod 0700 "$root/root"
install -m 0755 "$init" "$root/init"
# A build-tree init carries symbols; the guest does not need them.
if file -L "$init" | grep -q ELF; then strip -s "$root/init" 2>/dev/null || true; fi
rm -f "$root/sbin/init"
ln "$root/init" "$root/sbin/init"  # one file, two names (cpio keeps the hard link)

# ---- modules, in dependency order ----
# Debian's package ships no modules.dep (depmod runs at install), so read each module's own
# `depends=` from its .modinfo section (what modinfo(8) prints) and order depth-first.
declare -A path_of=() placed=() deps_of=() rel_of=()
order=()
if [[ -n $roots ]]; then
  release=$(basename "$moddir")
  while IFS= read -r -d '' f; do
    n=$(basename "$f"); n=${n%%.ko*}; n=${n//-/_}
    path_of[$n]=$f
  done < <(find "$moddir" -name '*.ko' -o -name '*.ko.xz' -o -name '*.ko.zst' -o -name '*.ko.gz' | tr '\n' '\0')
  unpack() {  # unpack SRC DEST: a plain .ko at DEST
    case $1 in
      *.ko) cp "$1" "$2" ;;
      *.ko.xz) xz -dc "$1" > "$2" ;;
      *.ko.zst) zstd -qdc "$1" > "$2" ;;
      *.ko.gz) gzip -dc "$1" > "$2" ;;
    esac
  }
  modinfo_depends() {  # the comma-separated depends= of a plain .ko
    objcopy -O binary --only-section=.modinfo "$1" "$stage/modinfo" &&
      tr '\0' '\n' < "$stage/modinfo" | sed -n 's/^depends=//p'
  }
  visit() {  # visit NAME: place its dependencies, then itself
    local n=${1//-/_} src rel dst d
    [[ -n ${placed[$n]:-} ]] && return 0
    src=${path_of[$n]:-}
    [[ -n $src ]] || { echo "mkinitrd: module '$n' not found under $moddir" >&2; exit 1; }
    placed[$n]=1
    rel=${src#"$moddir"/}; rel=${rel%.xz}; rel=${rel%.zst}; rel=${rel%.gz}
    dst=$root/lib/modules/$release/$rel
    mkdir -p "$(dirname "$dst")"
    unpack "$src" "$dst"
    rel_of[$n]=/lib/modules/$release/$rel
    local IFS=,
    deps_of[$n]=$(modinfo_depends "$dst")
    for d in ${deps_of[$n]}; do [[ -n $d ]] && visit "$d"; done
    order+=("${rel_of[$n]}")
  }
  for m in $roots; do visit "$m"; done
  printf '%s\n' "${order[@]}" > "$root/etc/nesinit/modules"
  # Each root's group: its dependencies first, then itself (the same walk, its own `seen`).
  mkdir -p "$root/etc/nesinit/modules.d"
  group() {  # group NAME: print the paths of NAME's closure, in load order
    local n=${1//-/_} d
    [[ -n ${seen[$n]:-} ]] && return 0
    seen[$n]=1
    local IFS=,
    for d in ${deps_of[$n]}; do [[ -n $d ]] && group "$d"; done
    echo "${rel_of[$n]}"
  }
  for m in $roots; do
    declare -A seen=()
    group "$m" > "$root/etc/nesinit/modules.d/${m//-/_}"
    unset seen
  done
else
  : > "$root/etc/nesinit/modules"
fi

# ---- the archive ----
# newc header for one entry: magic, ino, mode, uid, gid, nlink, mtime, filesize, devmajor,
# devminor, rdevmajor, rdevminor, namesize, check; name NUL-terminated, padded to 4 bytes.
newc_entry() {  # newc_entry NAME MODE RDEVMAJOR RDEVMINOR INO
  local name=$1 namesize=$((${#1} + 1)) pad
  printf '070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X' \
    "$5" "$2" 0 0 1 0 0 0 0 "$3" "$4" "$namesize" 0
  printf '%s\0' "$name"
  pad=$(( (4 - (110 + namesize) % 4) % 4 ))
  ((pad)) && head -c "$pad" /dev/zero
  return 0
}
tmp_out=$stage/initrd.cpio
(cd "$root" && find . -mindepth 1 | LC_ALL=C sort | sed 's|^\./||' |
  cpio -o -H newc -R 0:0 --reproducible --quiet) > "$tmp_out"
# A second archive with the device node; the kernel unpacks concatenated archives in order.
{ newc_entry dev/console $((0020000 | 0600)) 5 1 $((0x7fff0001)); newc_entry 'TRAILER!!!' 0 0 0 0; } >> "$tmp_out"
if ((gzip)); then gzip -9n < "$tmp_out" > "$tmp_out.gz" && mv "$tmp_out.gz" "$tmp_out"; fi
mkdir -p "$(dirname "$out")"
mv "$tmp_out" "$out.tmp.$$" && mv "$out.tmp.$$" "$out"
echo "mkinitrd: $out ($(stat -c %s "$out") bytes; modules: ${#order[@]})" >&2
