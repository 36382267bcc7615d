#!/usr/bin/env python3
"""P15 (pull row): `neshost pull` of a Debian 12 minbase image (scripts/mkdebroot.sh, one tar+gzip
layer) from a registry on this machine (tests/support/registry.py: Debian's docker-registry on
127.0.0.1, TLS from a test CA, token auth) into an empty store, against `skopeo copy docker://…
oci:DIR` of the same image into an empty directory, alternating, in the same invocation. Both
ask the token server anonymously, verify every blob and write it durably (neshost fsyncs each;
skopeo writes the layout). Not a test (scripts/bench.sh runs it); medians, with the range.
Prints one row of bench/results/latest.md's table.
Usage: p15_pull.py NESHOST [ROUNDS]   (default 5)
"""
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "support"))
import registry as R  # noqa: E402

NESHOST = sys.argv[1]
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 5


def timed(cmd):
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    t = time.monotonic() - t0
    if r.returncode != 0:
        raise RuntimeError("%s: %s" % (cmd[:2], r.stderr[-2000:]))
    return t


def main():
    root = subprocess.run([os.path.join(HERE, "..", "scripts", "mkdebroot.sh")], capture_output=True, text=True,
                          check=True, timeout=1800).stdout.strip()
    with R.TempDir("nesp15-") as tmp, R.Registry(tmp) as reg:
        lay = R.Layout(os.path.join(tmp, "lay"))
        layer = R.tar_layer(root)
        desc = lay.image([layer], cmd=("/bin/bash",))
        lay.tag(desc, "12")
        reg.push(lay.d, "12", "debian:12")
        ref = "%s/debian:12" % reg.host
        ours, skopeo = [], []
        for i in range(ROUNDS):
            state, dest = os.path.join(tmp, "state%d" % i), os.path.join(tmp, "oci%d" % i)
            pair = [("ours", [NESHOST, "pull", "-q", "--cert-dir", reg.ca_dir, "--state", state, ref]),
                    ("skopeo", ["skopeo", "copy", "--quiet", "--src-cert-dir", reg.ca_dir, "docker://" + ref,
                                "oci:%s:12" % dest])]
            if i % 2:
                pair.reverse()  # alternate who goes first
            for who, cmd in pair:
                (ours if who == "ours" else skopeo).append(1000 * timed(cmd))
            shutil.rmtree(state, ignore_errors=True)
            shutil.rmtree(dest, ignore_errors=True)
        mo, ms = statistics.median(ours), statistics.median(skopeo)
        load = os.getloadavg()[0]
        print("| P15 pull: `neshost pull` of a Debian 12 minbase image (one tar+gzip layer, %.1f MB) from a local "
              "registry (TLS, anonymous token) into an empty store (median of %d; %s, load %.1f; %.0f-%.0f) | ms | %.0f "
              "| `skopeo copy docker://… oci:DIR` of the same, alternating (%.0f-%.0f) | %.0f | %.2f |" %
              (len(layer[0]) / 1e6, ROUNDS, time.strftime("%Y-%m-%d %H:%M"), load, min(ours), max(ours), mo,
               min(skopeo), max(skopeo), ms, mo / ms), flush=True)


main()
