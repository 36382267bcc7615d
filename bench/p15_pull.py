#!/usr/bin/env python3
"""P15 (pull and unpack rows): `neshost pull` of a Debian 12 minbase image (scripts/mkdebroot.sh,
one tar+gzip layer) from a registry on this machine (tests/support/registry.py: Debian's
docker-registry on 127.0.0.1, TLS from a test CA, token auth) into an empty store, against
`skopeo copy docker://… oci:DIR` of the same image into an empty directory, alternating, in the
same invocation. Both ask the token server anonymously and verify every blob; neshost also makes
each blob durable (fsync of the file, its writeback started as it streams, and one of the blob
directory), skopeo does not fsync: like with like would favour us more. Neither unpacks: the
unpack is the second row, the image of the last pull round unpacked by UNPACK_TOOL
(tests/image/unpack_tool: host/image/unpack.hpp's unpack_image, the code `run IMAGE` uses) against
`umoci unpack --image DIR:12 BUNDLE` of skopeo's copy, alternating; umoci also writes its bundle's
config.json and an mtree manifest of the root (what `umoci unpack` is; `umoci raw unpack`, the root
alone, is the third row's peer). Not a test (scripts/bench.sh runs it); medians, with the range.
Prints rows of bench/results/latest.md's table.
Usage: p15_pull.py NESHOST [ROUNDS [UNPACK_TOOL [UNPACK_ROUNDS]]]   (defaults 5, none, 3)
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
UNPACK_TOOL = sys.argv[3] if len(sys.argv) > 3 else None
UNPACK_ROUNDS = int(sys.argv[4]) if len(sys.argv) > 4 else 3


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
            if i + 1 < ROUNDS:  # the last round's store and copy are the unpack rows' input
                shutil.rmtree(state, ignore_errors=True)
                shutil.rmtree(dest, ignore_errors=True)
        mo, ms = statistics.median(ours), statistics.median(skopeo)
        load = os.getloadavg()[0]
        print("| P15 pull: `neshost pull` of a Debian 12 minbase image (one tar+gzip layer, %.1f MB) from a local "
              "registry (TLS, anonymous token) into an empty store (median of %d; %s, load %.1f; %.0f-%.0f) | ms | %.0f "
              "| `skopeo copy docker://… oci:DIR` of the same, alternating (%.0f-%.0f) | %.0f | %.2f |" %
              (len(layer[0]) / 1e6, ROUNDS, time.strftime("%Y-%m-%d %H:%M"), load, min(ours), max(ours), mo,
               min(skopeo), max(skopeo), ms, mo / ms), flush=True)
        if UNPACK_TOOL:
            unpack_rows(tmp, state, ref, dest)


def unpack_rows(tmp, state, ref, oci):
    """Our unpack of REF from the store under STATE vs umoci's (bundle, and raw root) of OCI:12."""
    roots = os.path.join(state, ".images", "roots")
    ours, umoci, raw = [], [], []
    for i in range(UNPACK_ROUNDS):
        bundle, rawroot = os.path.join(tmp, "bundle%d" % i), os.path.join(tmp, "raw%d" % i)
        trio = [("ours", [UNPACK_TOOL, state, ref]),
                ("umoci", ["umoci", "unpack", "--image", oci + ":12", bundle]),
                ("raw", ["umoci", "raw", "unpack", "--image", oci + ":12", rawroot])]
        if i % 2:
            trio.reverse()
        for who, cmd in trio:
            {"ours": ours, "umoci": umoci, "raw": raw}[who].append(1000 * timed(cmd))
        for d in [bundle, rawroot] + [os.path.join(roots, e) for e in os.listdir(roots)]:
            shutil.rmtree(d, ignore_errors=True)  # untimed; the next round starts cold again
    mo = statistics.median(ours)
    load = os.getloadavg()[0]
    for peer, xs in (("`umoci unpack --image DIR:12 BUNDLE` of skopeo's copy (its root, config.json and mtree)",
                      umoci),
                     ("`umoci raw unpack --image DIR:12 ROOT` of skopeo's copy (the root alone)", raw)):
        m = statistics.median(xs)
        print("| P15 unpack: the Debian 12 minbase image's layer unpacked from the store into a root "
              "(tests/image/unpack_tool, `run IMAGE`'s unpack_image; median of %d; %s, load %.1f; %.0f-%.0f) | ms "
              "| %.0f | %s, alternating (%.0f-%.0f) | %.0f | %.2f |" %
              (UNPACK_ROUNDS, time.strftime("%Y-%m-%d %H:%M"), load, min(ours), max(ours), mo, peer, min(xs),
               max(xs), m, mo / m), flush=True)


main()
