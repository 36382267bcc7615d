#!/usr/bin/env python3
"""`neshost run IMAGE [COMMAND...]` in a real microVM (TCG; meson suite `image`): the image's
Entrypoint, Cmd, Env, WorkingDir and User by docker's rules and their flags (--entrypoint, args,
-e, -w, -u), the writable layer in the VM's state dir (the image untouched), --read-only, --rm,
rmi refused while a VM uses the image, an image not in the store.

Usage: run_test.py NESHOST   (env as tests/vm: NESHOST_INITRD, NESHOST_NETWORK=none)
"""
import glob
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


def main():
    global NESHOST
    NESHOST = sys.argv[1]
    if os.geteuid() != 0:
        skip("needs root (virtiofsd, overlayfs)")
    for prog in ("skopeo", "tar", "busybox"):
        if shutil.which(prog) is None:
            skip(f"no {prog}")
    tmp = tempfile.mkdtemp(prefix="image-run-")
    try:
        run(tmp)
    finally:
        for vm in ("a1", "a2", "a3", "a4"):
            subprocess.run([NESHOST, "rm", "-f", "--state", os.path.join(tmp, "state"), vm], capture_output=True, timeout=60)
        shutil.rmtree(tmp, ignore_errors=True)
    finish()


def run(tmp):
    root = os.path.join(tmp, "root")
    for d in ("bin", "etc", "srv"):
        os.makedirs(os.path.join(root, d))
    shutil.copy(os.path.realpath(shutil.which("busybox")), os.path.join(root, "bin/busybox"))
    for applet in ("sh", "id", "echo", "cat"):
        os.symlink("busybox", os.path.join(root, "bin", applet))
    with open(os.path.join(root, "etc/passwd"), "w") as f:
        f.write("root:x:0:0:root:/root:/bin/sh\napp:x:1000:1001::/srv:/bin/sh\n")
    with open(os.path.join(root, "etc/group"), "w") as f:
        f.write("root:x:0:\napp:x:1001:\nstaff:x:50:app\n")
    with open(os.path.join(root, "etc/debian_version"), "w") as f:
        f.write("12.99\n")
    os.chown(os.path.join(root, "srv"), 1000, 1001)
    src = os.path.join(tmp, "src")
    cfg = {"Env": ["PATH=/bin", "GREETING=hi"], "Entrypoint": ["/bin/sh", "-c"],
           "Cmd": ['echo "$GREETING $(id -u):$(id -g):$(id -G) $(pwd)"; cat /etc/debian_version; echo written > /srv/out'],
           "WorkingDir": "/srv", "User": "app"}
    layout.write_layout(src, "t", [(layout.tar_tree(root), "gzip")], config=cfg)
    state = os.path.join(tmp, "state")
    os.makedirs(state)
    subprocess.run([NESHOST, "images", "--state", state], capture_output=True, timeout=60)  # makes the store
    r = subprocess.run(["skopeo", "--insecure-policy", "copy", "-q", f"oci:{src}:t",
                        f"oci:{state}/.images:docker.io/library/app:1"], capture_output=True, text=True, timeout=120)
    check(r.returncode == 0, f"skopeo into the store: {r.stderr}")
    env = dict(os.environ, TMPDIR=tmp, XDG_RUNTIME_DIR=tmp, NESHOST_NETWORK="none")

    def nh_run(vm, *args):
        return subprocess.run([NESHOST, "run", "--accel", "tcg", "--ready-timeout", "100", "--state", state,
                               "--vm", vm, *args], capture_output=True, text=True, timeout=170, env=env)

    # the image's own Entrypoint, Cmd, Env, WorkingDir and User; its write lands in the VM's layer
    r = nh_run("a1", "app:1")
    check(r.returncode == 0, f"run app:1: exit {r.returncode}: {r.stderr[-2000:]}")
    check(r.stdout == "hi 1000:1001:1001 50 /srv\n12.99\n", f"run app:1 stdout: {r.stdout!r}")
    uppers = glob.glob(os.path.join(state, "a1", "rootfs.*", "upper", "srv", "out"))
    check(len(uppers) == 1 and open(uppers[0]).read() == "written\n", f"the write is in a1's layer: {uppers}")
    roots = glob.glob(os.path.join(state, ".images", "roots", "*", "rootfs"))
    check(len(roots) == 1 and not os.path.exists(os.path.join(roots[0], "srv/out")), "the image's root untouched")
    with open(os.path.join(state, "a1", "image.json")) as f:
        check(json.load(f)["ref"] == "docker.io/library/app:1", "image.json names the image")

    # COMMAND replaces Cmd; -e, -w, -u over the image's; --rm leaves no state dir
    r = nh_run("a2", "--rm", "-e", "GREETING=yo", "-w", "/", "-u", "0:0", "app:1", 'echo "$GREETING $(id -u):$(id -g) $(pwd)"')
    check(r.returncode == 0 and r.stdout == "yo 0:0 /\n", f"run with COMMAND, -e, -w, -u: {r.stdout!r} {r.stderr[-1500:]}")
    check(not os.path.exists(os.path.join(state, "a2")), "--rm removed the VM's state and layer")

    # --entrypoint replaces Entrypoint and drops Cmd; --read-only: the root refuses writes
    # (and -u with names, resolved in the image's /etc/passwd and /etc/group)
    r = nh_run("a3", "--rm", "--read-only", "-u", "root:staff", "--entrypoint", "/bin/sh", "app:1", "-c",
               "echo ep $(id -u):$(id -g); echo x > /srv/f || echo refused")
    check(r.returncode == 0 and r.stdout == "ep 0:50\nrefused\n", f"--entrypoint, --read-only, -u root:staff: {r.stdout!r} {r.stderr[-1500:]}")
    r = nh_run("a5", "-u", "ghost", "app:1")
    check(r.returncode == 125 and "unable to find user ghost" in r.stderr, f"-u ghost: {r.returncode} {r.stderr!r}")
    check(not os.path.exists(os.path.join(state, "a5")), "nothing left by the refused run")

    # rmi refused while a1 (kept: no --rm) uses the image; an image not in the store
    r = subprocess.run([NESHOST, "rmi", "--state", state, "app:1"], capture_output=True, text=True, timeout=60)
    check(r.returncode == 125 and "used by VM a1" in r.stderr, f"rmi while a1 uses it: {r.stderr!r}")
    # (--pull never: the default would ask docker.io, and no test reaches a host off this machine)
    r = nh_run("a4", "--pull", "never", "busybox:9.9")
    check(r.returncode == 125 and "not in the store" in r.stderr and "neshost pull busybox:9.9" in r.stderr,
          f"run of an absent image: {r.returncode} {r.stderr!r}")
    check(not os.path.exists(os.path.join(state, "a4")), "nothing left for the absent image")
    empty = os.path.join(tmp, "empty-state")
    r = subprocess.run([NESHOST, "run", "--state", empty, "--vm", "a6", "--pull", "never", "busybox:9.9"], capture_output=True, text=True,
                       timeout=60, env=env)
    check(r.returncode == 125 and "not in the store" in r.stderr, f"absent image, no store at all: {r.stderr!r}")
    check(not os.path.exists(os.path.join(empty, ".images")), "no store made by a run")


if __name__ == "__main__":
    main()
