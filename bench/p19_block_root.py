#!/usr/bin/env python3
"""P19 (block root build, issue 47): an image's read-only root file built from its unpacked root,
the Debian 12 minbase tree (scripts/mkdebroot.sh) as the store's roots/CONFIG/rootfs, with
`ensure_block_root` (bench/block_root_tool: mkfs, fsync, SHA-256, rename, record) as EROFS
(`mkfs.erofs`, the default) against ext4 (`mke2fs -d`), alternating, in the same invocation;
then the cached case (no rehash) once. virtiofs shares the tree itself (nothing to build).
Not a test (scripts/bench.sh runs it); medians, with the range. Prints rows of
bench/results/latest.md's table.
Usage: p19_block_root.py BLOCK_ROOT_TOOL [ROUNDS]   (default 3)
"""
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TOOL = sys.argv[1]
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
CONFIG = "b" * 64


def build(state, fs):
    r = subprocess.run([TOOL, state, CONFIG, fs], capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError("block_root_tool %s: %s" % (fs, r.stderr[-2000:]))
    path, digest, size, secs = r.stdout.split()
    return path, int(size), float(secs)


def main():
    tree = subprocess.run([os.path.join(HERE, "..", "scripts", "mkdebroot.sh")], capture_output=True, text=True,
                          check=True, timeout=1800).stdout.strip()
    tree_bytes = int(subprocess.run(["du", "-sb", tree], capture_output=True, text=True, check=True).stdout.split()[0])
    tmp = tempfile.mkdtemp(prefix="nesp19-")
    try:
        roots = os.path.join(tmp, ".images", "roots", CONFIG)
        os.makedirs(roots)
        # A hard-linked copy: the same files, no 170 MB written per run.
        subprocess.run(["cp", "-al", tree, os.path.join(roots, "rootfs")], check=True)
        times = {"erofs": [], "ext4": []}
        sizes, used = {}, {}
        for i in range(ROUNDS):
            order = ["erofs", "ext4"] if i % 2 == 0 else ["ext4", "erofs"]
            for fs in order:
                for leftover in (os.path.join(roots, "root." + fs), os.path.join(roots, "root.%s.json" % fs)):
                    if os.path.exists(leftover):
                        os.unlink(leftover)
                path, size, secs = build(tmp, fs)
                times[fs].append(secs)
                sizes[fs] = size
                used[fs] = os.stat(path).st_blocks * 512
        _, _, cached = build(tmp, "erofs")
        load = os.getloadavg()[0]
        me, mx = statistics.median(times["erofs"]), statistics.median(times["ext4"])
        print("| P19 block root build of the Debian 12 minbase root (%d bytes), `ensure_block_root` EROFS "
              "(mkfs.erofs, hash, record; median of %d, %.1f-%.1f; load %.1f) | s | %.2f | ext4 (`mke2fs -d`), "
              "alternating (%.1f-%.1f) | %.2f | %.2f |" %
              (tree_bytes, ROUNDS, min(times["erofs"]), max(times["erofs"]), load, me, min(times["ext4"]),
               max(times["ext4"]), mx, me / mx), flush=True)
        print("| P19 block root file size, EROFS (uncompressed; blocks used %d) | MB | %.1f | ext4 (sparse; "
              "blocks used %d) | %.1f | %.2f |" %
              (used["erofs"], sizes["erofs"] / 1e6, used["ext4"], sizes["ext4"] / 1e6, sizes["erofs"] / sizes["ext4"]),
              flush=True)
        print("| P19 block root cached: `ensure_block_root` of a built, unchanged EROFS root (no rehash) | ms | %.2f "
              "| its build | %.0f | %.5f |" % (1000 * cached, 1000 * me, cached / me), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


main()
