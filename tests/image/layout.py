"""Images made at test time for tests/image (no registry): layers packed by GNU tar from real
directory trees (so xattrs, devices, hard links, owners and mtimes are what the kernel made),
compressed with gzip or zstd, written into an OCI image layout directory as umoci and skopeo
read it. Also the tree comparison the unpack test uses (what `umoci unpack` made vs ours)."""
import gzip
import hashlib
import json
import os
import shutil
import stat
import subprocess

MT_LAYER = {"tar": "application/vnd.oci.image.layer.v1.tar",
            "gzip": "application/vnd.oci.image.layer.v1.tar+gzip",
            "zstd": "application/vnd.oci.image.layer.v1.tar+zstd"}


def tar_tree(root):
    """The uncompressed tar of directory `root` (GNU tar, PAX with xattrs, sorted, numeric owners)."""
    return subprocess.run(["tar", "--xattrs", "--xattrs-include=*", "--numeric-owner", "--sort=name",
                           "--format=posix", "-C", root, "-cf", "-", "."],
                          check=True, capture_output=True).stdout


def compress(data, how):
    if how == "tar":
        return data
    if how == "gzip":
        return gzip.compress(data, mtime=0)
    return subprocess.run(["zstd", "-q", "-c"], input=data, check=True, capture_output=True).stdout


def write_layout(layout, ref, layers, config=None):
    """Writes (or adds to) the OCI layout dir `layout`: one image named `ref` whose layers are
    `layers`, a list of (uncompressed tar bytes, "tar"|"gzip"|"zstd"), base first; `config`: the
    image config's "config" object. Returns the manifest's digest."""
    os.makedirs(os.path.join(layout, "blobs/sha256"), exist_ok=True)

    def blob(data, media_type):
        h = hashlib.sha256(data).hexdigest()
        with open(os.path.join(layout, "blobs/sha256", h), "wb") as f:
            f.write(data)
        return {"mediaType": media_type, "digest": "sha256:" + h, "size": len(data)}

    descs, diff_ids = [], []
    for raw, how in layers:
        diff_ids.append("sha256:" + hashlib.sha256(raw).hexdigest())
        descs.append(blob(compress(raw, how), MT_LAYER[how]))
    cfg = {"architecture": "amd64", "os": "linux", "created": "2026-12-07T10:00:00Z",
           "config": config if config is not None else {"Env": ["PATH=/bin"], "Cmd": ["/bin/sh"]},
           "rootfs": {"type": "layers", "diff_ids": diff_ids}, "history": []}
    cdesc = blob(json.dumps(cfg).encode(), "application/vnd.oci.image.config.v1+json")
    man = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
           "config": cdesc, "layers": descs}
    mdesc = blob(json.dumps(man).encode(), "application/vnd.oci.image.manifest.v1+json")
    with open(os.path.join(layout, "oci-layout"), "w") as f:
        f.write('{"imageLayoutVersion":"1.0.0"}')
    ipath = os.path.join(layout, "index.json")
    index = {"schemaVersion": 2, "manifests": []}
    if os.path.exists(ipath):
        with open(ipath) as f:
            index = json.load(f)
    index["manifests"] = [m for m in index["manifests"]
                          if m.get("annotations", {}).get("org.opencontainers.image.ref.name") != ref]
    index["manifests"].append(dict(mdesc, annotations={"org.opencontainers.image.ref.name": ref}))
    with open(ipath, "w") as f:
        json.dump(index, f)
    return mdesc["digest"]


def tree(root, mtimes_of_dirs=True):
    """Every path under `root` -> a tuple of what the unpack must reproduce: type and mode, owner,
    link target, size, content hash, xattrs, device number, mtime; plus the hard-link groups."""
    out, inodes = {}, {}
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            p = os.path.join(d, n)
            rel = os.path.relpath(p, root)
            st = os.lstat(p)
            link = os.readlink(p) if stat.S_ISLNK(st.st_mode) else None
            digest = None
            if stat.S_ISREG(st.st_mode):
                with open(p, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
            xattrs = {}
            if not stat.S_ISLNK(st.st_mode):
                for x in os.listxattr(p, follow_symlinks=False):
                    xattrs[x] = os.getxattr(p, x, follow_symlinks=False)
            mtime = st.st_mtime_ns if (mtimes_of_dirs or not stat.S_ISDIR(st.st_mode)) else None
            size = st.st_size if not stat.S_ISDIR(st.st_mode) else None
            rdev = st.st_rdev if (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)) else None
            out[rel] = (oct(st.st_mode), st.st_uid, st.st_gid, link, size, digest, tuple(sorted(xattrs.items())), rdev, mtime)
            if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                inodes.setdefault(st.st_ino, []).append(rel)
    groups = sorted(tuple(sorted(g)) for g in inodes.values())
    return out, groups


def diff(a, b):
    """Lines naming each path that differs between two tree() results."""
    lines = []
    for k in sorted(set(a) | set(b)):
        if a.get(k) != b.get(k):
            lines.append(f"{k}: {a.get(k)} != {b.get(k)}")
    return lines


def rmtree(p):
    shutil.rmtree(p, ignore_errors=True)
