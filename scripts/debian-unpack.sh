# Sourced by scripts/fetch-virtiofsd.sh and scripts/fetch-passt.sh: newer Debian packages than
# Debian 12 carries, unpacked under .cache/ (never installed) and run through the unpacked glibc's
# own dynamic loader. The system's apt sources, lists, cache and dpkg status stay untouched.

# debian_unpack DEST "SUITE..." PKG...: downloads PKG... (apt's names; PKG/SUITE picks a suite,
# e.g. passt/trixie-backports) from deb.debian.org's SUITEs through a private source list,
# unpacks them (dpkg-deb -x) into DEST/root (replacing it only once all are unpacked) and writes
# one "package=version" line each to DEST/packages. Fails (set -e) on any download error.
debian_unpack() {
  local dest=$1 suites=$2 work deb s
  shift 2
  mkdir -p "$dest"
  work=$(mktemp -d "$dest/.fetch.XXXXXX")
  # Removed however the script ends (a failed download exits through set -e).
  # shellcheck disable=SC2064  # $work is fixed now
  trap "rm -rf '$work'" EXIT
  mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/debs"
  for s in $suites; do
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $s main"
  done > "$work/sources.list"
  local opts=(-o "Dir::Etc::SourceList=$work/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
              -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache" -o "Debug::NoLocking=1"
              -o "APT::Sandbox::User=root")
  apt-get "${opts[@]}" -qq update
  (cd "$work/debs" && apt-get "${opts[@]}" -qq download "$@")
  for deb in "$work"/debs/*.deb; do
    dpkg-deb -x "$deb" "$work/root"
    dpkg-deb -W --showformat='${Package}=${Version}\n' "$deb" >> "$work/packages"
  done
  rm -rf "$dest/root"
  mv "$work/root" "$dest/root"
  mv "$work/packages" "$dest/packages"
  rm -rf "$work"
}

# write_wrapper WRAPPER BODY-LINE SOURCE-LINE: an executable sh script running BODY-LINE, and
# SOURCE-LINE (where the program came from) in WRAPPER's directory's `source`. Rewritten only when
# it would change (a .cache copied from another checkout names other paths).
write_wrapper() {
  local wrapper=$1 text
  text=$(printf '#!/bin/sh\n# Written by scripts/%s: %s\n%s' "$(basename "$0")" "$3" "$2")
  [[ -x $wrapper && $(<"$wrapper") == "$text" ]] && return 0
  mkdir -p "$(dirname "$wrapper")"
  printf '%s\n' "$text" > "$wrapper.tmp"
  chmod 0755 "$wrapper.tmp"
  mv "$wrapper.tmp" "$wrapper"
  echo "$3" > "$(dirname "$wrapper")/source"
}
