#!/usr/bin/env python3
"""The unpacker (host/image/unpack.hpp) against `umoci unpack` of the same image, and every bad
entry refused with the store unchanged (meson suite `image`; root: devices, owners, xattrs).

Usage: unpack_test.py UNPACK_TOOL

The image, made here from real files: three layers (tar+gzip, tar+zstd, tar) over a busybox
root, with a whiteout of a file and of a directory, an opaque directory, hard links, symlinks, a
character and a block device, a fifo, a setuid binary, a setcap binary (security.capability),
owners other than root, fixed mtimes, a directory replaced by a file. It goes into our store by
`skopeo copy oci:… oci:STATE/.images:…` (skopeo writing our layout), then both unpack it; the two
roots must agree on every path's type, mode, owner, link target, size, content hash, xattrs,
device number and mtime, and on the hard-link groups.
"""
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import io
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "host"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import check, finish, skip  # noqa: E402
import layout  # noqa: E402

T = 1700000000  # every mtime the layers carry


def put(root, rel, data=b"", mode=0o644, uid=0, gid=0):
    p = os.path.join(root, rel)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, "wb") as f:
        f.write(data)
    os.chown(p, uid, gid)
    os.chmod(p, mode)
    return p


def settle(root):
    """Fixed mtimes on every path (symlinks themselves too), deepest first."""
    for d, dirs, files in os.walk(root, topdown=False):
        for n in files + dirs:
            os.utime(os.path.join(d, n), ns=(T * 10**9 + 123, T * 10**9 + 456), follow_symlinks=False)
    os.utime(root, (T, T))


def layer1(root, busybox):
    shutil.copy(busybox, put(root, "bin/busybox", mode=0o755))
    os.chmod(os.path.join(root, "bin/busybox"), 0o755)
    os.symlink("busybox", os.path.join(root, "bin/sh"))
    os.symlink("/bin/busybox", os.path.join(root, "bin/abs-ls"))
    put(root, "bin/suid", b"#!/bin/sh\n", 0o4755)
    put(root, "etc/passwd", b"root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\n")
    put(root, "etc/group", b"root:x:0:\nstaff:x:1000:\n")
    put(root, "etc/gone", b"whited out by layer 2\n")
    put(root, "etc/subdir/a", b"a\n")
    put(root, "etc/subdir/deeper/b", b"b\n")
    put(root, "opq/old1", b"hidden by the opaque dir\n")
    put(root, "opq/sub/old2", b"hidden too\n")
    put(root, "data/file", b"v1\n", 0o640, 1000, 1000)
    put(root, "data/hard1", b"linked\n", 0o600, 1000, 1000)
    os.link(os.path.join(root, "data/hard1"), os.path.join(root, "data/hard2"))
    put(root, "data/dirtofile/x", b"x\n")
    os.makedirs(os.path.join(root, "dev"))
    os.mknod(os.path.join(root, "dev/mychr"), 0o620 | 0o020000, os.makedev(1, 3))
    os.mknod(os.path.join(root, "dev/myblk"), 0o660 | 0o060000, os.makedev(7, 0))
    os.mkfifo(os.path.join(root, "dev/fifo"), 0o600)
    os.makedirs(os.path.join(root, "home/app"))
    os.chown(os.path.join(root, "home/app"), 1000, 1000)
    os.chmod(os.path.join(root, "home/app"), 0o750)
    settle(root)


def layer2(root, busybox):
    put(root, "etc/.wh.gone")
    put(root, "etc/.wh.subdir")
    os.makedirs(os.path.join(root, "opq"))
    put(root, "opq/.wh..wh..opq")
    put(root, "opq/new", b"the opaque dir's own\n")
    shutil.copy(busybox, put(root, "bin/ping", mode=0o755))
    os.chmod(os.path.join(root, "bin/ping"), 0o755)
    subprocess.run(["setcap", "cap_net_raw+ep", os.path.join(root, "bin/ping")], check=True)
    put(root, "data/file", b"v2: replaced\n", 0o600, 1000, 1000)
    os.symlink("file", os.path.join(root, "data/link"))
    settle(root)


def layer3(root):
    put(root, "data/dirtofile", b"now a file\n")
    put(root, "lib/x", b"x" * 100000)
    os.link(os.path.join(root, "lib/x"), os.path.join(root, "lib/x2"))
    settle(root)


def bad_layer(kind):
    """One uncompressed layer tar with one bad entry (written with Python's tarfile, which keeps
    names as given: GNU tar would strip them)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        def add(name, data=b"", type_=tarfile.REGTYPE, linkname=""):
            ti = tarfile.TarInfo(name)
            ti.type = type_
            ti.linkname = linkname
            ti.size = len(data) if type_ == tarfile.REGTYPE else 0
            ti.mode = 0o755 if type_ == tarfile.DIRTYPE else 0o644
            t.addfile(ti, io.BytesIO(data) if type_ == tarfile.REGTYPE else None)
        add("ok", b"fine\n")
        if kind == "dotdot":
            add("../evil", b"escaped\n")
        elif kind == "deep-dotdot":
            add("a/../../evil", b"escaped\n")
        elif kind == "absolute":
            add("/evil", b"escaped\n")
        elif kind == "symlink-parent":
            add("esc", type_=tarfile.SYMTYPE, linkname="../../../../../../../..")
            add("esc/evil", b"escaped\n")
        elif kind == "abs-symlink-parent":
            add("esc", type_=tarfile.SYMTYPE, linkname="/")
            add("esc/tmp/evil", b"escaped\n")
        elif kind == "hardlink-out":
            add("stolen", type_=tarfile.LNKTYPE, linkname="../../../../etc/hostname")
        elif kind == "truncated":
            pass
    data = buf.getvalue()
    if kind == "truncated":
        data = data[:700]  # a header and part of the data, no end blocks
    return data


def snapshot(d):
    out = {}
    for dd, dirs, files in os.walk(d):
        for n in files + dirs:
            p = os.path.join(dd, n)
            rel = os.path.relpath(p, d)
            if n.endswith("lock"):
                continue
            st = os.lstat(p)
            out[rel] = (st.st_mode, None if os.path.isdir(p) else st.st_size, None if os.path.isdir(p) else st.st_mtime_ns)
    return out


def main():
    tool = sys.argv[1]
    if os.geteuid() != 0:
        skip("needs root (devices, owners, security.capability)")
    for prog in ("umoci", "skopeo", "setcap", "zstd", "tar"):
        if shutil.which(prog) is None:
            skip(f"no {prog}")
    busybox = shutil.which("busybox")
    if busybox is None:
        skip("no busybox")
    busybox = os.path.realpath(busybox)
    tmp = tempfile.mkdtemp(prefix="image-unpack-")
    try:
        run(tool, tmp, busybox)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    finish()


def skopeo_in(src_layout, ref, state, name):
    r = subprocess.run(["skopeo", "--insecure-policy", "copy", "-q", f"oci:{src_layout}:{ref}",
                        f"oci:{state}/.images:{name}"], capture_output=True, text=True, timeout=120)
    check(r.returncode == 0, f"skopeo copy into our store: {r.stderr}")


def run(tool, tmp, busybox):
    trees = {}
    for i in (1, 2, 3):
        trees[i] = os.path.join(tmp, f"l{i}")
        os.makedirs(trees[i])
    layer1(trees[1], busybox)
    layer2(trees[2], busybox)
    layer3(trees[3])
    raws = [layout.tar_tree(trees[1]), layout.tar_tree(trees[2]), layout.tar_tree(trees[3])]
    src = os.path.join(tmp, "src")
    # umoci 0.4.7 reads no zstd layer: its image is gzip, gzip, tar; ours also unpacks the same
    # layers as gzip, zstd, tar (another config, so another cached root) and must get the same root
    layout.write_layout(src, "t", [(raws[0], "gzip"), (raws[1], "gzip"), (raws[2], "tar")])
    layout.write_layout(src, "tz", [(raws[0], "gzip"), (raws[1], "zstd"), (raws[2], "tar")],
                        config={"Env": ["PATH=/bin"], "Labels": {"layers": "zstd"}})

    # umoci's root
    bundle = os.path.join(tmp, "bundle")
    t0 = time.monotonic()
    r = subprocess.run(["umoci", "unpack", "--image", f"{src}:t", bundle], capture_output=True, text=True, timeout=120)
    t_umoci = time.monotonic() - t0
    check(r.returncode == 0, f"umoci unpack: {r.stderr}")

    # ours, from our store (skopeo wrote it there)
    state = os.path.join(tmp, "state")
    os.makedirs(state)
    subprocess.run([tool, state, "docker.io/library/none:x"], capture_output=True)  # makes the store
    skopeo_in(src, "t", state, "docker.io/library/t:1")
    t0 = time.monotonic()
    r = subprocess.run([tool, state, "docker.io/library/t:1"], capture_output=True, text=True, timeout=120)
    t_ours = time.monotonic() - t0
    check(r.returncode == 0, f"unpack_tool: {r.stderr}")
    ours = r.stdout.strip()
    print(f"unpack: {r.stderr.strip()}; wall: ours {t_ours:.3f} s, umoci {t_umoci:.3f} s")
    check(ours.endswith("/rootfs") and os.path.isdir(ours), f"our root at {ours!r}")
    a, ga = layout.tree(os.path.join(bundle, "rootfs"))
    b, gb = layout.tree(ours)
    lines = layout.diff(a, b)
    for ln in lines[:30]:
        print("  differs (umoci != ours):", ln)
    check(not lines, f"the roots differ in {len(lines)} paths")
    check(ga == gb, f"hard-link groups: umoci {ga} ours {gb}")
    # what the image says, spelled out (so the comparison cannot pass on two empty trees)
    check("etc/gone" not in b and "etc/subdir" not in b, "whiteouts of a file and of a directory")
    check("opq/old1" not in b and "opq/sub" not in b and "opq/new" in b, "the opaque directory")
    check(("data/hard1", "data/hard2") in gb and ("lib/x", "lib/x2") in gb, f"hard links: {gb}")
    check(dict(b["bin/ping"][6]).get("security.capability") is not None, "bin/ping's security.capability")
    check(b["bin/suid"][0] == oct(0o104755), f"setuid kept: {b['bin/suid'][0]}")
    check(b["data/file"][1:3] == (1000, 1000) and b["data/file"][0] == oct(0o100600), f"data/file: {b['data/file']}")
    check(b["dev/mychr"][7] == os.makedev(1, 3) and b["dev/myblk"][7] == os.makedev(7, 0), "devices")
    check(b["data/dirtofile"][4] == len(b"now a file\n"), "a directory replaced by a file")
    check(b["bin/abs-ls"][3] == "/bin/busybox", "an absolute symlink kept as given")
    check(b["data/file"][8] == T * 10**9 + 456, "mtime with nanoseconds")
    skopeo_in(src, "tz", state, "docker.io/library/t:zstd")
    r = subprocess.run([tool, state, "docker.io/library/t:zstd"], capture_output=True, text=True, timeout=120)
    check(r.returncode == 0 and r.stdout.strip() != ours, f"unpack of the zstd variant: {r.stderr}")
    if r.returncode == 0:
        c, gc = layout.tree(r.stdout.strip())
        check(not layout.diff(b, c) and gc == gb, f"the zstd variant's root: {layout.diff(b, c)[:5]}")
    # cached: a second unpack returns the same root at once
    r2 = subprocess.run([tool, state, "docker.io/library/t:1"], capture_output=True, text=True, timeout=60)
    check(r2.returncode == 0 and r2.stdout.strip() == ours, "a second unpack returns the cached root")

    # bad entries: each refused, naming the entry; nothing written outside, the store unchanged
    outside = os.path.dirname(os.path.dirname(ours))  # STATE/.images/roots
    for kind, says in [("dotdot", "entry '../evil': '..'"), ("deep-dotdot", "entry 'a/../../evil': '..'"),
                       ("absolute", "entry '/evil': absolute"),
                       ("symlink-parent", "entry 'esc/evil': its parent directory leaves the image root"),
                       ("abs-symlink-parent", "entry 'esc/tmp/evil': its parent directory leaves the image root"),
                       ("hardlink-out", "entry 'stolen': hard link target '../../../../etc/hostname': '..'"),
                       ("truncated", "entry 'ok': corrupt or truncated archive")]:
        bad_src = os.path.join(tmp, "bad-" + kind)
        layout.write_layout(bad_src, "b", [(bad_layer(kind), "tar")])
        skopeo_in(bad_src, "b", state, f"docker.io/library/bad:{kind}")
        before = snapshot(os.path.join(state, ".images"))
        r = subprocess.run([tool, state, f"docker.io/library/bad:{kind}"], capture_output=True, text=True, timeout=60)
        check(r.returncode == 125, f"{kind}: exit {r.returncode}")
        check(says in r.stderr, f"{kind}: error says {says!r}: {r.stderr.strip()}")
        check(snapshot(os.path.join(state, ".images")) == before, f"{kind}: the store unchanged")
        for p in (os.path.join(tmp, "evil"), os.path.join(state, "evil"), os.path.join(outside, "evil"),
                  "/evil", "/tmp/evil", os.path.join(state, ".images", "evil")):
            check(not os.path.exists(p), f"{kind}: nothing at {p}")


if __name__ == "__main__":
    main()
