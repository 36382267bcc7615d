"""OCI images made at test time (no registry here): one directory tree packed as the single layer
of an OCI image layout tarball, as `ctr image import` reads it. Used by tests/shim (an image run
through the shim) and tests/cri, bench P11 (the busybox image and the pod sandbox image)."""
import hashlib
import io
import json
import tarfile


def oci_archive(path, root, ref, cmd=("/bin/sh",), entrypoint=None, env=("PATH=/bin",)):
    """Writes the tarball `path`: an OCI image layout whose index names one manifest `ref`
    (annotation org.opencontainers.image.ref.name, what `ctr image import --base-name` matches),
    its one uncompressed layer the tree `root` (owners and modes as on disk), its config
    amd64/linux with `cmd`, `entrypoint` (None: unset) and `env` (lists of strings)."""
    blobs = {}

    def blob(data):
        h = hashlib.sha256(data).hexdigest()
        blobs[h] = data
        return {"digest": "sha256:" + h, "size": len(data)}

    lb = io.BytesIO()
    with tarfile.open(fileobj=lb, mode="w") as t:
        t.add(root, arcname=".")
    layer = lb.getvalue()
    conf = {"Env": list(env), "Cmd": list(cmd)}
    if entrypoint is not None:
        conf["Entrypoint"] = list(entrypoint)
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": conf,
                         "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]}}).encode()
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "config": dict(blob(config), mediaType="application/vnd.oci.image.config.v1+json"),
                           "layers": [dict(blob(layer), mediaType="application/vnd.oci.image.layer.v1.tar")]}).encode()
    index = json.dumps({"schemaVersion": 2, "manifests": [
        dict(blob(manifest), mediaType="application/vnd.oci.image.manifest.v1+json",
             annotations={"org.opencontainers.image.ref.name": ref})]}).encode()
    with tarfile.open(path, "w") as t:
        def add(name, data):
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            t.addfile(ti, io.BytesIO(data))
        add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        add("index.json", index)
        for h, data in blobs.items():
            add(f"blobs/sha256/{h}", data)
