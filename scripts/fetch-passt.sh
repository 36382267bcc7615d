#!/usr/bin/env bash
# Provide passt, the user-mode network behind `neshost run --network user` (the default).
#
# passt must be at least 0.0~git20260728 (host/vm/passt.hpp kPasstMinVersion): older ones lose
# guest-bound TCP data under QEMU 7.2 (docs/network.md has the measurements; Debian 12's
# 0.0~git20230309 stalls, Debian 13's 0.0~git20250503 cuts downloads short).
#  - The system's, when it is new enough.
#  - Else Debian 13's backport (trixie-backports) and trixie's glibc, fetched with `apt-get
#    download` through a private source list (scripts/debian-unpack.sh), unpacked with
#    `dpkg-deb -x` and run through trixie's own dynamic loader: passt needs glibc 2.38.
#
# Result (idempotent: a second run only re-checks the wrapper):
#   .cache/passt/passt     an executable wrapper that execs the chosen passt with "$@"
#   .cache/passt/root/     the unpacked packages (only when fetched)
#   .cache/passt/source    one line: where it came from and its version
# Prints the wrapper's path. Usage: scripts/fetch-passt.sh [--offline]
#   --offline: never touch the network; fail (exit 1) if no passt is available.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
dest=$top/.cache/passt
wrapper=$dest/passt
offline=0
[[ ${1:-} == --offline ]] && offline=1
min=20260728
# shellcheck source=scripts/debian-unpack.sh
. "$top/scripts/debian-unpack.sh"

# "passt 0.0~git20260728.f8df3f1-1~bpo13+1" (Debian) or "passt 2026_07_28.f8df3f1" (upstream):
# the snapshot date as YYYYMMDD, or nothing.
version_date() { "$@" --version 2>/dev/null | head -1 | grep -oE '(20[2-9][0-9])(_?)[01][0-9]\2[0-3][0-9]' | head -1 | tr -d _; }
good() { local d; d=$(version_date "$@"); [[ -n $d && $d -ge $min ]]; }

# 1. The system's, if new enough.
if sys=$(command -v passt) && good "$sys"; then
  write_wrapper "$wrapper" "exec $sys \"\$@\"" "system $sys: $("$sys" --version | head -1)"
  echo "$wrapper"; exit 0
fi

# 2. trixie-backports', unpacked under .cache/passt/root.
root=$dest/root
lib=$root/usr/lib/x86_64-linux-gnu
loader=$lib/ld-linux-x86-64.so.2
fetched_ok() { [[ -x $root/usr/bin/passt && -x $loader ]] && good "$loader" --library-path "$lib" "$root/usr/bin/passt"; }
install_wrapper() {
  local ver
  ver=$("$loader" --library-path "$lib" "$root/usr/bin/passt" --version 2>/dev/null | head -1)
  # On a CPU with AVX2, passt re-executes itself as its AVX2 build unless the path of its
  # executable (/proc/self/exe: here the loader's) names one: a link to the loader named so lets
  # the wrapper start the AVX2 build directly, without the failing re-exec and its complaint.
  ln -f "$loader" "$lib/ld-linux-x86-64.avx2"
  write_wrapper "$wrapper" "l=\"$loader\" b=passt
grep -qw avx2 /proc/cpuinfo && l=\"$lib/ld-linux-x86-64.avx2\" b=passt.avx2
exec \"\$l\" --argv0 passt --library-path \"$lib\" \"$root/usr/bin/\$b\" \"\$@\"" \
    "debian trixie-backports ($(paste -sd' ' "$dest/packages" 2>/dev/null)): $ver"
}
if fetched_ok; then
  install_wrapper
  echo "$wrapper"; exit 0
fi
((offline)) && { echo "fetch-passt: no passt >= $min in $dest (run without --offline)" >&2; exit 1; }

debian_unpack "$dest" "trixie trixie-backports" passt/trixie-backports libc6/trixie
fetched_ok || { echo "fetch-passt: the unpacked passt does not run or is older than $min" >&2; exit 1; }
install_wrapper
echo "fetch-passt: $(cat "$dest/source") -> $wrapper" >&2
echo "$wrapper"
