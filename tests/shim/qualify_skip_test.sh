#!/bin/sh
# shim-qualify (qualify.sh) run without root is meson's skip (exit 77, with the reason), as each
# containerd case is, not a usage error (issue 44: it exited 2). Run as root, it drops to
# nobody (setpriv) for the check.
#   qualify_skip_test.sh QUALIFY_SH BUILD
[ "$(id -u)" = 0 ] || { echo "SKIP: needs root to run the check as another user"; exit 77; }
out=$(setpriv --reuid=65534 --regid=65534 --clear-groups "$1" "$2" 2>&1)
rc=$?
if [ "$rc" != 77 ] || [ "$out" != "SKIP: needs root (containerd)" ]; then
  echo "FAIL: qualify.sh as nobody: exit $rc, want 77; output: $out"
  exit 1
fi
echo "PASS: qualify.sh as nobody: exit 77, '$out'"
