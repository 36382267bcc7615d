#!/usr/bin/env bash
# Fetch simdjson's single-header amalgamation (simdjson.h + simdjson.cpp) from Debian's *source*
# package, matching the installed libsimdjson-dev, into .cache/simdjson-amalgamation/ (ignored
# by git). Debian's binary package ships no simdjson.cpp and no static library, and the static musl
# init must compile simdjson itself. The system's apt configuration is not changed: a private
# deb-src list is derived from the system's own sources. Idempotent.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
out="$top/.cache/simdjson-amalgamation"
[[ -s "$out/simdjson.h" && -s "$out/simdjson.cpp" ]] && exit 0

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/src"

# deb-src entries derived from the system's deb entries (deb822 and one-line formats).
: > "$work/sources.list"
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
  [[ -f $f ]] && sed -n 's/^deb \(.*\)/deb-src \1/p' "$f" >> "$work/sources.list"
done
mkdir -p "$work/parts"
for f in /etc/apt/sources.list.d/*.sources; do
  [[ -f $f ]] && sed 's/^Types:.*/Types: deb-src/' "$f" > "$work/parts/$(basename "$f")"
done

opts=(-o "Dir::Etc::SourceList=$work/sources.list" -o "Dir::Etc::SourceParts=$work/parts"
      -o "Dir::State::Lists=$work/lists" -o "Debug::NoLocking=1" -o "APT::Sandbox::User=root")
apt-get "${opts[@]}" -qq update
ver=$(dpkg-query -W -f='${source:Version}' libsimdjson-dev 2>/dev/null || true)
pkg=simdjson${ver:+=$ver}
(cd "$work/src" && apt-get "${opts[@]}" -qq source --download-only "$pkg")
orig=$(ls "$work/src"/simdjson_*.orig.tar.* | head -1)
tar -C "$work/src" -xf "$orig" --wildcards '*/singleheader/simdjson.h' '*/singleheader/simdjson.cpp'
mkdir -p "$out"
cp "$work"/src/*/singleheader/simdjson.h "$work"/src/*/singleheader/simdjson.cpp "$out/"
echo "simdjson amalgamation ($(basename "$orig")) -> $out"
