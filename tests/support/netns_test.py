#!/usr/bin/env python3
"""netns.py checked on its own (meson test vm-netns-harness): the re-executed test runs in a namespace
that is not its parent's, with lo up and the veth pair's address and default route; the machine's
namespace gets no such interface; the child's exit status is the test's. NetnsHolder makes a
namespace beside it (lo up), fails a command with its exit status, and is reaped."""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netns  # noqa: E402

if len(sys.argv) == 1:  # the outer run: in the machine's namespace
    here = os.readlink("/proc/self/ns/net")
    r = subprocess.run([sys.executable, __file__, "inner", here], capture_output=True, text=True, timeout=60)
    veths = subprocess.run(["ip", "-o", "link", "show", netns.VETH], capture_output=True, text=True)
    ok = r.returncode == 7 and "inner ok" in r.stdout and veths.returncode != 0
    print(r.stdout + r.stderr + ("ok netns" if ok else f"FAIL netns: exit {r.returncode}, machine veth {veths.stdout!r}"))
    sys.exit(0 if ok else 1)

netns.isolate()
ns = os.readlink("/proc/self/ns/net")
addrs = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
route = subprocess.run(["ip", "route", "show", "default"], capture_output=True, text=True).stdout
checks = {"not the machine's namespace": ns != sys.argv[2],
          "lo up with 127.0.0.1": "lo    inet 127.0.0.1/8" in addrs,
          "the veth's address": f"{netns.VETH}    inet {netns.VETH_ADDR}" in addrs,
          "the default route": f"default via {netns.VETH_GATEWAY} dev {netns.VETH}" in route}
# NetnsHolder: a namespace of its own beside this one, lo up, its holder reaped on close().
h = netns.NetnsHolder(bound=30)
try:
    checks["the holder's namespace is another"] = os.readlink(h.path) != ns
    checks["the holder's lo is up"] = "UP" in h.sh("ip -o link show lo").split("<")[1].split(">")[0]
    try:
        h.sh("exit 3")
        checks["a failing command raises"] = False
    except RuntimeError as e:
        checks["a failing command raises"] = ": 3 " in str(e)
finally:
    h.close()
checks["the holder reaped"] = h.p.returncode is not None
bad = [k for k, v in checks.items() if not v]
print("inner ok" if not bad else f"inner FAIL {bad}: {addrs} {route}")
sys.exit(7 if not bad else 1)
