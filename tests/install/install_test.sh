#!/usr/bin/env bash
# The project as a dependency, from its installed files only:
#  1. a native host-side-only configuration (-Dguest=false) `meson install`ed with DESTDIR into a
#     temp root, the init from the cross build `meson install`ed likewise; the file list checked
#     (public headers only, SONAME, neshost.pc, nesinit and nesinit-mkinitrd), and every header of
#     host/, protocol/ and base/ either installed or on host/meson.build's or base/meson.build's
#     internal list;
#  2. every installed header compiles alone (one TU each) with `pkg-config --cflags neshost`;
#  3. examples/embed built against that root (PKG_CONFIG_PATH + PKG_CONFIG_SYSROOT_DIR; no include
#     path into the source tree), its harness test run, then the daemon run against the real
#     static init, twice, as PID 1 of fresh pid + mount namespaces with an explicit --channel;
#  4. with --packages: the Debian packages built with dpkg-buildpackage -b (reusing step 1's host
#     build and the cross build's tested init), unpacked into a scratch root with dpkg -x, their
#     development files checked identical to step 1's, `neshost --version` and the example (step
#     3's binary, now on the packaged libneshost.so.0 and the packaged init) run from them.
# Usage: install_test.sh SOURCE_ROOT CROSS_BUILD_DIR [--packages]. Every process it starts is
# waited for and its temp dir removed, whatever fails.
# NES_HOST_BUILD: the host-side-only build directory, kept and reused if given (tests/install/
# meson.build passes build/install-host), else a temp one. NES_INTERNAL_HEADERS: the headers not
# installed on purpose, relative to host/ ("vm/" for a directory; base/'s as "base/NAME").
set -euo pipefail
src=$(cd "$1" && pwd) cross=$(cd "$2" && pwd) packages=${3:-}
tmp=$(mktemp -d /tmp/nes-install-XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
step() { echo "== $* ($(date +%T))"; }
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)

# ---- 1. meson install, both configurations ----
step "host-only configuration, meson install"
host=${NES_HOST_BUILD:-$tmp/host}
# Debian's build flags (hardening), as dh_auto_configure would pass them: step 4 reuses this build.
# Without -g: the test's packages have no -dbgsym (step 4), so debug info would only be stripped
# again, and it is a third of the compile time (debian/rules on its own keeps Debian's -g).
[[ -f $host/build.ninja ]] || (export DEB_BUILD_MAINT_OPTIONS=hardening=+all \
  DEB_CXXFLAGS_MAINT_STRIP=-g DEB_CFLAGS_MAINT_STRIP=-g; eval "$(dpkg-buildflags --export=sh)"
  meson setup "$host" "$src" \
  -Dguest=false --prefix=/usr --libdir="lib/$multiarch") >"$tmp/setup.log" 2>&1 ||
  { cat "$tmp/setup.log"; fail "meson setup -Dguest=false"; }
ninja -C "$host" >"$tmp/ninja.log" 2>&1 || { tail -50 "$tmp/ninja.log"; fail "ninja (host-only)"; }
root=$tmp/root
DESTDIR=$root meson install -C "$host" --no-rebuild --quiet
step "cross configuration (the init), meson install"
DESTDIR=$tmp/initroot meson install -C "$cross" --no-rebuild --quiet
initprefix=$(meson introspect "$cross" --buildoptions | python3 -c \
  'import json,sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"]=="prefix"))')
init=$tmp/initroot$initprefix/lib/nesinit/nesinit
[[ -x $init ]] || fail "no installed init at $initprefix/lib/nesinit/nesinit"
[[ -x $tmp/initroot$initprefix/bin/nesinit-mkinitrd ]] || fail "no installed nesinit-mkinitrd"
file -b "$init" | grep -q "statically linked" || fail "installed init is not static: $(file -b "$init")"

(cd "$root" && find . -type f -o -type l | sort) >"$tmp/files"
echo "installed (host side):"; sed 's/^/  /' "$tmp/files"
lib=usr/lib/$multiarch
for f in usr/bin/neshost "$lib/libneshost.a" "$lib/libneshost.so" "$lib/libneshost.so.0" \
         "$lib/pkgconfig/neshost.pc" usr/include/nes/host/lib/host.hpp usr/include/nes/host/testing.hpp \
         usr/include/nes/protocol/messages.hpp usr/include/nes/host/result.hpp usr/include/nes/base/result.hpp; do
  grep -qx "./$f" "$tmp/files" || fail "not installed: /$f"
done
! grep -E 'cli\.hpp|/vm/|support\.hpp|harness\.hpp|nesproto' "$tmp/files" || fail "internals installed"
# Each header of host/, protocol/ and base/ is public (installed) or deliberately internal, never both.
internal=" ${NES_INTERNAL_HEADERS:-} "
for h in $(cd "$src" && ls host/*.hpp host/*/*.hpp protocol/*.hpp base/*.hpp); do
  rel=${h#host/} inst=./usr/include/nes/$h is_int=0
  [[ $internal == *" $rel "* || $internal == *" ${rel%%/*}/ "* ]] && is_int=1
  if grep -qx "$inst" "$tmp/files"; then
    ((is_int == 0)) || fail "$h is installed and on the internal list"
  else
    ((is_int == 1)) || fail "$h is neither installed nor on host/meson.build's internal list"
  fi
done
# The old <nes/host/NAME.hpp> paths, forwarding headers for one release (host/lib/compat/).
for h in $(cd "$src" && ls host/lib/compat/*.hpp); do
  grep -qx "./usr/include/nes/host/${h##*/}" "$tmp/files" || fail "forwarding header not installed: nes/host/${h##*/}"
done
soname=$(readelf -d "$root/$lib/libneshost.so" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
[[ $soname == libneshost.so.0 ]] || fail "SONAME is '$soname', want libneshost.so.0"
"$root/usr/bin/neshost" --version | grep -q . || fail "installed neshost --version"

# ---- 2. every installed header alone ----
export PKG_CONFIG_PATH=$root/$lib/pkgconfig PKG_CONFIG_SYSROOT_DIR=$root
cflags=$(pkg-config --cflags neshost)
step "each installed header alone (cflags: $cflags)"
hdrs=$(cd "$root/usr/include" && find nes -name '*.hpp' | sort)
n=0
for h in $hdrs; do
  echo "#include <$h>" >"$tmp/h$n.cpp"
  n=$((n + 1))
done
# shellcheck disable=SC2086
printf '%s\n' "$tmp"/h*.cpp | xargs -P 2 -I{} sh -c \
  'g++ -std=c++20 -Wall -Wextra -Werror -fsyntax-only '"$cflags"' {} || { echo "header TU failed: $(cat {})"; exit 255; }' ||
  fail "an installed header does not compile alone"
echo "  $n headers compile alone"

# ---- 3. the embedding example against the installed library ----
exdir=$tmp/ex
build_example() {  # $1: pkg-config root
  local libdir=$1/$lib
  step "examples/embed built against the meson-installed library"
  PKG_CONFIG_PATH=$libdir/pkgconfig PKG_CONFIG_SYSROOT_DIR=$1 \
    meson setup "$exdir" "$src/examples/embed" >"$tmp/ex-setup.log" 2>&1 ||
    { cat "$tmp/ex-setup.log"; fail "meson setup examples/embed"; }
  ninja -C "$exdir" >"$tmp/ex-ninja.log" 2>&1 || { cat "$tmp/ex-ninja.log"; fail "build examples/embed"; }
  # Nothing but the example's own directory may come from the source tree.
  if python3 - "$exdir/compile_commands.json" "$src" <<'PY'
import json, os, shlex, sys
src, ok = sys.argv[2], sys.argv[2] + "/examples/embed"
bad = []
for c in json.load(open(sys.argv[1])):
    args = shlex.split(c["command"])
    for i, a in enumerate(args):
        d = a[2:] if a.startswith("-I") and len(a) > 2 else args[i + 1] if a in ("-I", "-isystem") else None
        if d is None:
            continue
        d = os.path.normpath(os.path.join(c["directory"], d))
        if (d == src or d.startswith(src + "/")) and not (d == ok or d.startswith(ok + "/")):
            bad.append(d)
bad and print("\n".join(bad)); sys.exit(0 if bad else 1)
PY
  then fail "examples/embed compiled with an include path into the source tree"; fi
  readelf -d "$exdir/nes-embed" | grep -q 'NEEDED.*libneshost.so.0' || fail "nes-embed does not use libneshost.so.0"
}

run_example() {  # $1: root whose libneshost.so.0 the example runs on, $2: init binary, $3: label
  local libdir=$1/$lib
  step "examples/embed on $3"
  LD_LIBRARY_PATH=$libdir "$exdir/daemon_test" >"$tmp/daemon_test.log" 2>&1 ||
    { cat "$tmp/daemon_test.log"; fail "examples/embed daemon_test ($3)"; }
  sed 's/^/  daemon_test: /' "$tmp/daemon_test.log"

  # The daemon and two real inits, each PID 1 of its own pid + mount namespace.
  local vms=$tmp/vms-$3 out=$tmp/daemon-$3.out
  mkfifo "$tmp/fifo-$3"
  LD_LIBRARY_PATH=$libdir "$exdir/nes-embed" "$vms" "$tmp/state-$3" a,b -- \
    /bin/sh -c 'case $NES_VM in a) exit 3 ;; *) kill -9 $$ ;; esac' >"$tmp/fifo-$3" 2>&1 &
  local daemon=$!
  pids+=("$daemon")
  exec {rd}<"$tmp/fifo-$3"
  local line n=0
  while ((n < 2)) && IFS= read -r -t 30 line <&"$rd"; do
    echo "  nes-embed: $line"
    [[ $line == listening* ]] && n=$((n + 1))
  done
  ((n == 2)) || fail "nes-embed did not listen ($3)"
  local inits=()
  for vm in a b; do
    unshare --pid --fork --mount-proc --kill-child "$2" --channel="unix:$vms/$vm.vsock_7000" \
      --log=quiet >"$tmp/init-$vm-$3.log" 2>&1 &
    inits+=($!)
    pids+=($!)
  done
  cat <&"$rd" >"$out" &
  local cat_pid=$!
  pids+=("$cat_pid")
  local st=0
  wait "$daemon" || st=$?
  for p in "${inits[@]}"; do wait "$p" || true; done
  wait "$cat_pid" || true
  exec {rd}<&-
  sed 's/^/  nes-embed: /' "$out"
  grep -qx "a exited 3" "$out" || { cat "$tmp"/init-*-"$3".log; fail "VM a: want 'a exited 3' ($3)"; }
  grep -qx "b signalled 137" "$out" || { cat "$tmp"/init-*-"$3".log; fail "VM b: want 'b signalled 137' ($3)"; }
  ((st == 1)) || fail "nes-embed exit status $st, want 1 (two non-zero outcomes) ($3)"
}
build_example "$root"
run_example "$root" "$init" "meson-install"

# ---- 4. the Debian packages ----
if [[ $packages == --packages ]]; then
  step "dpkg-buildpackage -b"
  # A copy of the tracked tree (the packages build from a clean source), with the set-up that
  # scripts/setup.sh made (zig in node_modules, simdjson's amalgamation in .cache) linked in.
  pkgsrc=$tmp/pkg/nesinit
  mkdir -p "$pkgsrc"
  git -C "$src" ls-files -z | (cd "$src" && cpio -0pdm --quiet "$pkgsrc")
  ln -s "$src/node_modules" "$pkgsrc/node_modules"
  mkdir -p "$pkgsrc/.cache"
  cp -a "$src/.cache/simdjson-amalgamation" "$pkgsrc/.cache/"
  start=$(date +%s)
  # No -dbgsym packages (their stripping is most of the cost) and no dh_auto_test (scripts/test.sh is it).
  (cd "$pkgsrc" && DEB_BUILD_OPTIONS="noautodbgsym nocheck" NES_HOST_BUILD=$host NES_INIT_BUILD=$cross \
     dpkg-buildpackage -b -us -uc --no-pre-clean >"$tmp/dpkg.log" 2>&1) ||
    { tail -60 "$tmp/dpkg.log"; fail "dpkg-buildpackage -b"; }
  echo "  built in $(($(date +%s) - start)) s:"
  (cd "$tmp/pkg" && for d in *.deb; do echo "  $d $(stat -c %s "$d") bytes"; done)
  # NES_KEEP_DEBS=DIR: keep the packages (e.g. for lintian, which this test does not run).
  [[ -z ${NES_KEEP_DEBS:-} ]] || cp "$tmp"/pkg/*.deb "$tmp"/pkg/*.changes "$NES_KEEP_DEBS"/
  sroot=$tmp/scratch
  for d in "$tmp"/pkg/*.deb; do dpkg -x "$d" "$sroot"; done
  for want in usr/lib/nesinit/nesinit usr/bin/nesinit-mkinitrd usr/bin/neshost usr/bin/containerd-shim-nesinit-v2 \
              "usr/lib/$multiarch/libneshost.so.0" usr/include/nes/host/host.hpp; do
    [[ -e $sroot/$want ]] || fail "not in the packages: /$want"
  done
  "$sroot/usr/bin/neshost" --version || fail "packaged neshost --version"
  # The development files are step 1's (headers and .pc byte for byte, the static library's
  # members; dh_strip rewrites the archive itself), what the example was built against, so the
  # example needs no second build: step 3's binary runs on the packaged library, with step 1's
  # copy removed so that nothing else can be loaded (its RUNPATH may name that root).
  diff -r "$root/usr/include" "$sroot/usr/include" || fail "packaged headers differ from meson install's"
  cmp "$root/$lib/pkgconfig/neshost.pc" "$sroot/$lib/pkgconfig/neshost.pc" ||
    fail "packaged neshost.pc differs from meson install's"
  [[ $(ar t "$root/$lib/libneshost.a") == "$(ar t "$sroot/$lib/libneshost.a")" ]] ||
    fail "packaged libneshost.a has other members than meson install's"
  rm -f "$root/$lib"/libneshost.so*
  run_example "$sroot" "$sroot/usr/lib/nesinit/nesinit" "debs"
fi
echo "ok"
