#!/usr/bin/env bash
# Provide virtiofsd, the vhost-user file system daemon behind `neshost run -v` and `--rootfs`.
#
# The Rust virtiofsd (1.x) is required: it has --readonly (a read-only share is enforced on the
# host side too) and is the maintained one. QEMU's legacy C virtiofsd (QEMU <= 7.2, e.g. Debian
# 12's /usr/lib/qemu/virtiofsd, "virtiofsd version 7.2.x") has no read-only mode and was removed
# upstream in QEMU 8.0, so it is not used.
#  - The system's, when one is installed (Debian 13+, Ubuntu: /usr/libexec/virtiofsd,
#    /usr/lib/qemu/virtiofsd) and is the Rust one.
#  - Else Debian 13's (trixie) package and the libraries it needs from trixie, fetched with
#    `apt-get download` through a private source list (the system's apt sources, lists and cache
#    stay untouched), unpacked with `dpkg-deb -x` and run through trixie's own dynamic loader:
#    virtiofsd 1.13 needs glibc 2.39, newer than Debian 12's.
#
# Result (idempotent: a second run only re-checks the wrapper):
#   .cache/virtiofsd/virtiofsd   an executable wrapper that execs the chosen daemon with "$@"
#   .cache/virtiofsd/root/       the unpacked trixie packages (only when fetched)
#   .cache/virtiofsd/source      one line: where it came from and its version
# Prints the wrapper's path. Usage: scripts/fetch-virtiofsd.sh [--offline]
#   --offline: never touch the network; fail (exit 1) if no daemon is available.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
dest=$top/.cache/virtiofsd
wrapper=$dest/virtiofsd
offline=0
[[ ${1:-} == --offline ]] && offline=1
pkgs=(virtiofsd libc6 libseccomp2 libcap-ng0 libgcc-s1)
suite=trixie
# shellcheck source=scripts/debian-unpack.sh
. "$top/scripts/debian-unpack.sh"

# "virtiofsd 1.13.2" (Rust) vs "virtiofsd version 7.2.22 (...)" (QEMU's C one).
is_rust_virtiofsd() { "$@" --version 2>/dev/null | head -1 | grep -Eq '^virtiofsd [0-9]+\.[0-9]+'; }

# 1. The system's Rust virtiofsd.
for sys in /usr/libexec/virtiofsd /usr/lib/qemu/virtiofsd; do
  if [[ -x $sys ]] && is_rust_virtiofsd "$sys"; then
    ver=$("$sys" --version | head -1)
    write_wrapper "$wrapper" "exec $sys \"\$@\"" "system $sys: $ver"
    echo "$wrapper"; exit 0
  fi
done

# 2. Debian 13's, unpacked under .cache/virtiofsd/root.
root=$dest/root
lib=$root/usr/lib/x86_64-linux-gnu
fetched_ok() {
  [[ -x $root/usr/libexec/virtiofsd && -x $lib/ld-linux-x86-64.so.2 ]] &&
    is_rust_virtiofsd "$lib/ld-linux-x86-64.so.2" --library-path "$lib" "$root/usr/libexec/virtiofsd"
}
install_wrapper() {
  local ver
  ver=$("$lib/ld-linux-x86-64.so.2" --library-path "$lib" "$root/usr/libexec/virtiofsd" --version | head -1)
  # --argv0: ps and virtiofsd's own messages say "virtiofsd", not the loader's name.
  write_wrapper "$wrapper" "exec \"$lib/ld-linux-x86-64.so.2\" --argv0 virtiofsd --library-path \"$lib\" \"$root/usr/libexec/virtiofsd\" \"\$@\"" \
    "debian $suite ($(paste -sd' ' "$dest/packages" 2>/dev/null)): $ver"
}
if fetched_ok; then
  install_wrapper
  echo "$wrapper"; exit 0
fi
((offline)) && { echo "fetch-virtiofsd: no virtiofsd in $dest (run without --offline)" >&2; exit 1; }

debian_unpack "$dest" "$suite" "${pkgs[@]}"
fetched_ok || { echo "fetch-virtiofsd: the unpacked virtiofsd does not run" >&2; exit 1; }
install_wrapper
echo "fetch-virtiofsd: $(cat "$dest/source") -> $wrapper" >&2
echo "$wrapper"
