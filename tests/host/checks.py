"""What the Python end-to-end tests share: counted checks that never stop a test early, skipping
(exit 77: meson's "skipped"), the probe for what the namespace sandbox needs, and the closing line
with the counts (exit 1 on any failure)."""
import os
import shutil
import subprocess
import sys

failures = []
count = 0


def check(cond, what):
    """Counts one check; a failure is printed at once and remembered."""
    global count
    count += 1
    if not cond:
        failures.append(what)
        print("FAIL:", what, flush=True)


def skip(why):
    print("SKIP:", why)
    sys.exit(77)


def need_sandbox(nesinit):
    """Skip unless the init exists and this machine can make pid + mount namespaces."""
    if not os.access(nesinit, os.X_OK):
        skip("no init at %s" % nesinit)
    if shutil.which("unshare") is None:
        skip("no unshare")
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, timeout=30)
    if probe.returncode != 0:
        skip("cannot create pid+mount namespaces: %r" % probe.stderr)


def finish():
    print("%d checks, %d failed" % (count, len(failures)))
    sys.exit(1 if failures else 0)
