#!/usr/bin/env python3
"""`neshost load`, `images`, `tag`, `image inspect`, `rmi`, `image prune` end to end, and skopeo
and umoci reading and writing our store (meson suite `image`).

Usage: store_cli_test.py NESHOST

Images made here from real files (busybox). `skopeo copy oci:SRC:t docker-archive:…` and
`oci-archive:…` make the archives `load` takes; skopeo copies out of our store and into it, umoci
lists and unpacks it. Every bad input exits 125 naming what failed with the store unchanged.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "host"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import check, finish, skip  # noqa: E402
import layout  # noqa: E402

NESHOST = None
STATE = None


def nh(*args, stdin=None, input_=None):
    return subprocess.run([NESHOST, *args, "--state", STATE] if args[0] != "image" else
                          [NESHOST, args[0], args[1], "--state", STATE, *args[2:]],
                          stdin=stdin, input=input_, capture_output=True, timeout=120)


def skopeo(*args):
    return subprocess.run(["skopeo", "--insecure-policy", *args], capture_output=True, text=True, timeout=120)


def store_snapshot():
    out = {}
    root = os.path.join(STATE, ".images")
    for d, dirs, files in os.walk(root):
        for n in files:
            if n.endswith("lock"):
                continue
            p = os.path.join(d, n)
            with open(p, "rb") as f:
                out[os.path.relpath(p, root)] = f.read()
    return out


def blobs():
    return set(os.listdir(os.path.join(STATE, ".images/blobs/sha256")))


def main():
    global NESHOST, STATE
    NESHOST = sys.argv[1]
    for prog in ("skopeo", "umoci", "tar"):
        if shutil.which(prog) is None:
            skip(f"no {prog}")
    busybox = shutil.which("busybox")
    if busybox is None:
        skip("no busybox")
    tmp = tempfile.mkdtemp(prefix="image-cli-")
    try:
        STATE = os.path.join(tmp, "state")
        os.makedirs(STATE)
        run(tmp, os.path.realpath(busybox))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    finish()


def layout_name(ref):
    return ref if ref.startswith("localhost") else "docker.io/library/" + ref


def flip_largest_blob(archive):
    """`archive` (an OCI archive) again with one byte of its largest blob changed."""
    import io
    import tarfile
    out = io.BytesIO()
    with tarfile.open(archive) as src, tarfile.open(fileobj=out, mode="w") as dst:
        members = src.getmembers()
        big = max((m for m in members if m.isfile() and m.name.startswith("blobs/")), key=lambda m: m.size)
        for m in members:
            data = src.extractfile(m).read() if m.isfile() else None
            if m is big:
                data = bytearray(data)
                data[len(data) // 2] ^= 0xff
                data = bytes(data)
            dst.addfile(m, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


def busybox_root(root, busybox):
    os.makedirs(os.path.join(root, "bin"))
    os.makedirs(os.path.join(root, "etc"))
    shutil.copy(busybox, os.path.join(root, "bin/busybox"))
    os.symlink("busybox", os.path.join(root, "bin/sh"))
    with open(os.path.join(root, "etc/passwd"), "w") as f:
        f.write("root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\n")


def run(tmp, busybox):
    root = os.path.join(tmp, "root")
    busybox_root(root, busybox)
    extra = os.path.join(tmp, "extra")
    os.makedirs(os.path.join(extra, "srv"))
    with open(os.path.join(extra, "srv/hello"), "w") as f:
        f.write("hello\n")
    src = os.path.join(tmp, "src")
    cfg = {"Env": ["PATH=/bin", "GREETING=hi"], "Entrypoint": ["/bin/sh", "-c"], "Cmd": ["echo $GREETING"],
           "WorkingDir": "/srv", "User": "app", "Labels": {"made.by": "store_cli_test"}}
    layout.write_layout(src, "t", [(layout.tar_tree(root), "gzip"), (layout.tar_tree(extra), "tar")], config=cfg)
    layout.write_layout(src, "other", [(layout.tar_tree(extra), "gzip")], config={"Cmd": ["/x"]})

    # --- load: docker-archive from a file, oci-archive from stdin
    darch = os.path.join(tmp, "d.tar")
    r = skopeo("copy", "-q", f"oci:{src}:t", f"docker-archive:{darch}:busybox:latest")
    check(r.returncode == 0, f"skopeo docker-archive: {r.stderr}")
    r = nh("load", "-i", darch)
    check(r.returncode == 0 and r.stdout.decode() == "Loaded image: busybox:latest\n", f"load docker-archive: {r.stdout!r} {r.stderr!r}")
    oarch = os.path.join(tmp, "o.tar")
    r = skopeo("copy", "-q", f"oci:{src}:t", f"oci-archive:{oarch}:localhost:5000/team/app:v1")
    check(r.returncode == 0, f"skopeo oci-archive: {r.stderr}")
    with open(oarch, "rb") as f:
        r = nh("load", stdin=f)
    check(r.returncode == 0 and r.stdout.decode() == "Loaded image: localhost:5000/team/app:v1\n", f"load oci-archive from stdin: {r.stdout!r} {r.stderr!r}")

    # --- images
    r = nh("images")
    lines = r.stdout.decode().splitlines()
    check(r.returncode == 0 and lines and lines[0].split() == ["REPOSITORY", "TAG", "IMAGE", "ID", "CREATED", "SIZE"], f"images header: {lines[:1]}")
    rows = {tuple(ln.split()[:2]): ln.split() for ln in lines[1:]}
    check(("busybox", "latest") in rows and ("localhost:5000/team/app", "v1") in rows, f"images rows: {lines}")
    ids = nh("images", "-q").stdout.decode().split()
    check(len(ids) == 1 and len(ids[0]) == 12, f"images -q: one image (both archives hold the same config): {ids}")
    if ("busybox", "latest") in rows:
        check(rows[("busybox", "latest")][2] == ids[0], "IMAGE ID is the config digest's first 12")

    # --- inspect, tag
    r = nh("image", "inspect", "busybox")
    try:
        doc = json.loads(r.stdout)
    except ValueError:
        doc = None
    check(r.returncode == 0 and isinstance(doc, list) and len(doc) == 1, f"image inspect: {r.stdout[:200]!r} {r.stderr!r}")
    if doc:
        d = doc[0]
        check(d["Id"].startswith("sha256:" + ids[0]), "inspect Id")
        check(d["Config"]["Entrypoint"] == ["/bin/sh", "-c"] and d["Config"]["Cmd"] == ["echo $GREETING"], f"inspect Config: {d['Config']}")
        check(d["Config"]["User"] == "app" and d["Config"]["WorkingDir"] == "/srv", "inspect User/WorkingDir")
        check(len(d["RootFS"]["Layers"]) == 2, "inspect RootFS")
        check(sorted(d["RepoTags"]) == ["busybox:latest", "localhost:5000/team/app:v1"], f"inspect RepoTags: {d['RepoTags']}")
    r = nh("tag", "busybox", "mybox:2")
    check(r.returncode == 0, f"tag: {r.stderr}")
    r = nh("image", "inspect", "mybox:2")
    check(r.returncode == 0 and json.loads(r.stdout)[0]["Id"].startswith("sha256:" + ids[0]), "the new tag names the image")

    # --- skopeo and umoci read our store
    out = os.path.join(tmp, "out")
    r = skopeo("copy", "-q", f"oci:{STATE}/.images:docker.io/library/mybox:2", f"oci:{out}:copied")
    check(r.returncode == 0, f"skopeo copy out of our store: {r.stderr}")
    r = skopeo("inspect", f"oci:{STATE}/.images:localhost:5000/team/app:v1")
    check(r.returncode == 0 and json.loads(r.stdout or "{}").get("Layers", []) != [], f"skopeo inspect our store: {r.stderr}")
    r = subprocess.run(["umoci", "ls", "--layout", f"{STATE}/.images"], capture_output=True, text=True, timeout=60)
    check(r.returncode == 0 and "docker.io/library/busybox:latest" in r.stdout.split(), f"umoci ls our store: {r.stdout!r} {r.stderr}")
    bundle = os.path.join(tmp, "bundle")
    r = subprocess.run(["umoci", "unpack", "--image", f"{STATE}/.images:docker.io/library/busybox:latest", bundle],
                       capture_output=True, text=True, timeout=60)
    check(r.returncode == 0 and os.path.exists(os.path.join(bundle, "rootfs/srv/hello")), f"umoci unpack from our store: {r.stderr}")
    # ... and skopeo writes it: an image copied in is ours to list
    r = skopeo("copy", "-q", f"oci:{src}:other", f"oci:{STATE}/.images:docker.io/library/other:1")
    check(r.returncode == 0, f"skopeo copy into our store: {r.stderr}")
    r = nh("images")
    check(any(ln.split()[:2] == ["other", "1"] for ln in r.stdout.decode().splitlines()), f"images lists skopeo's copy: {r.stdout!r}")

    # --- bad inputs: 125, naming what failed, the store unchanged
    with open(darch, "rb") as f:
        good = f.read()
    bad = {}
    bad["truncated.tar"] = (good[: len(good) // 2 + 100], "corrupt or truncated")  # not on a 512-byte boundary
    bad["garbage.tar"] = (os.urandom(4096), "")
    bad["empty.tar"] = (b"", "neither a docker save archive")
    # a layer's bytes changed inside a docker archive: its digest no longer matches the config's diff_id
    tampered = bytearray(good)
    idx = tampered.find(b"hello\n")
    if idx > 0:
        tampered[idx:idx + 6] = b"HELLO\n"
    bad["tampered.tar"] = (bytes(tampered), "diff_id")
    bad["tampered-oci.tar"] = (flip_largest_blob(oarch), "hash")
    # manifest.json naming a bad reference
    badref = os.path.join(tmp, "badref.tar")
    r = skopeo("copy", "-q", f"oci:{src}:t", f"docker-archive:{badref}:ok:latest")
    with open(badref, "rb") as f:
        data = f.read()
    bad["badref.tar"] = (data.replace(b'ok:latest"', b'Ok:latest"'), "Ok:latest': invalid reference format: repository name must be lowercase")
    for name, (data, says) in bad.items():
        p = os.path.join(tmp, name)
        with open(p, "wb") as f:
            f.write(data)
        before = store_snapshot()
        r = nh("load", "-i", p)
        err = r.stderr.decode(errors="replace")
        check(r.returncode == 125, f"load {name}: exit {r.returncode}: {err}")
        check(err.startswith("neshost load: ") and says in err, f"load {name}: says {says!r}: {err.strip()}")
        check(store_snapshot() == before, f"load {name}: the store unchanged")
    before = store_snapshot()
    r = nh("load", "-i", os.path.join(tmp, "missing.tar"))
    check(r.returncode == 125 and "missing.tar" in r.stderr.decode(), f"load of a missing file: {r.stderr!r}")
    r = nh("tag", "busybox", "Bad:Tag")
    check(r.returncode == 125 and "TARGET" in r.stderr.decode(), f"tag to a bad reference: usage: {r.stderr!r}")
    r = nh("rmi", "nosuch:1")
    check(r.returncode == 125 and "no such image: nosuch:1" in r.stderr.decode(), f"rmi of an unknown image: {r.stderr!r}")
    r = nh("image", "inspect", "nosuch")
    check(r.returncode == 125 and "no such image: nosuch" in r.stderr.decode(), f"inspect of an unknown image: {r.stderr!r}")
    check(store_snapshot() == before, "tag/rmi/inspect errors: the store unchanged")

    # --- rmi: refused while a VM uses the image, naming it; by ID needs -f with several tags
    full_id = json.loads(nh("image", "inspect", "busybox").stdout)[0]["Id"]
    vm = os.path.join(STATE, "web")
    os.makedirs(vm)
    with open(os.path.join(vm, "image.json"), "w") as f:
        json.dump({"ref": "docker.io/library/busybox:latest", "config": full_id}, f)
    before = store_snapshot()
    r = nh("rmi", "-f", ids[0])
    check(r.returncode == 125 and "used by VM web" in r.stderr.decode(), f"rmi while VM web uses it: {r.stderr!r}")
    check(store_snapshot() == before, "refused rmi: the store unchanged")
    r = nh("rmi", "mybox:2")  # one of several tags: untagged, the image stays (VM or not)
    check(r.returncode == 0 and r.stdout.decode() == "Untagged: mybox:2\n", f"rmi of one tag: {r.stdout!r} {r.stderr!r}")
    shutil.rmtree(vm)
    r = nh("rmi", ids[0])
    check(r.returncode == 125 and "must be forced" in r.stderr.decode(), f"rmi by ID with two tags: {r.stderr!r}")
    n_before = len(blobs())
    r = nh("rmi", "-f", ids[0])
    out_ = r.stdout.decode()
    check(r.returncode == 0 and "Untagged: busybox:latest" in out_ and f"Deleted: {full_id}" in out_, f"rmi -f by ID: {out_!r} {r.stderr!r}")
    left = blobs()
    check(len(left) < n_before and full_id[7:] not in left, f"rmi removed the blobs ({n_before} -> {len(left)})")
    r = nh("images", "-q")
    check(r.stdout.decode().split() != [] and ids[0] not in r.stdout.decode(), f"images after rmi: {r.stdout!r}")

    # --- two processes at once: two loads of images sharing blobs, and a tag, never corrupt it
    procs = [subprocess.Popen([NESHOST, "load", "-q", "-i", a, "--state", STATE], stderr=subprocess.PIPE)
             for a in (darch, oarch, darch)]
    procs.append(subprocess.Popen([NESHOST, "tag", "other:1", "again:1", "--state", STATE], stderr=subprocess.PIPE))
    rcs = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
    check(all(rc == 0 for rc, _ in rcs), f"concurrent loads and a tag: {rcs}")
    names = {tuple(ln.split()[:2]) for ln in nh("images").stdout.decode().splitlines()[1:]}
    check({("busybox", "latest"), ("localhost:5000/team/app", "v1"), ("again", "1"), ("other", "1")} <= names,
          f"every name after the race: {names}")
    for ref in ("busybox:latest", "localhost:5000/team/app:v1"):
        r = skopeo("inspect", f"oci:{STATE}/.images:{layout_name(ref)}")
        check(r.returncode == 0, f"skopeo reads {ref} after the race: {r.stderr}")
    check(not [f for f in os.listdir(os.path.join(STATE, ".images/ingest")) if not f.endswith(".lock")],
          "nothing left in ingest/")
    nh("rmi", "again:1")
    nh("rmi", "-f", ids[0])

    # --- an untagged image (an OCI archive without a name), and prune
    noname = os.path.join(tmp, "noname.tar")
    r = skopeo("copy", "-q", f"oci:{src}:t", f"oci-archive:{noname}")
    r = nh("load", "-i", noname)
    check(r.returncode == 0 and r.stdout.decode().startswith("Loaded image ID: sha256:"), f"load of an unnamed image: {r.stdout!r} {r.stderr!r}")
    r = nh("images")
    check(any(ln.split()[:2] == ["<none>", "<none>"] for ln in r.stdout.decode().splitlines()), f"images shows <none>: {r.stdout!r}")
    r = nh("image", "prune", "-f")
    check(r.returncode == 0 and "deleted: sha256:" in r.stdout.decode(), f"image prune: {r.stdout!r} {r.stderr!r}")
    r = nh("images")
    check(not any(ln.startswith("<none>") for ln in r.stdout.decode().splitlines()), f"prune removed the untagged image: {r.stdout!r}")
    r = nh("image", "prune", "-a")
    check(r.returncode == 0 and nh("images", "-q").stdout == b"", "prune -a empties the store")
    check(blobs() == set(), f"no blob left: {sorted(blobs())[:3]}")


if __name__ == "__main__":
    main()
