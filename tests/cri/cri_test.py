#!/usr/bin/env python3
"""CRI conformance through containerd's CRI plugin (meson suite `cri`), with our own CRI client
(cri_client.py) against a private containerd (cri_harness.py: own root, state, sockets and config;
in a network namespace and a mount namespace of this test's own; CNI from Debian's plugins; images
built here). Parameterised by the RuntimeClass handler, so the same cases run against
containerd's runc runtime (`runc`, proving the harness) and ours (`nesinit`,
io.containerd.nesinit.v2: one VM per pod, issue 27).

Usage: cri_test.py CASE HANDLER   (CASE in CASES; HANDLER runc | nesinit)
Env: CRI_STUBS_DIR (the generated api_pb2.py); for `nesinit` also NESHOST_SHIM, NESHOST,
NESHOST_INITRD. Needs root. Ends with every pod removed, the daemon stopped, everything it started
reaped and its directory removed; what is left is a failure.
"""
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cri_harness as h  # noqa: E402
from cri_harness import Failure, check, until  # noqa: E402
from cri_client import CriError, parse_cri_log  # noqa: E402

HTTP_PORT = 8000
# The pod's resources as the kubelet (>= 1.23) sums them (containerd annotates the sandbox with
# them): 64 MiB and one CPU's quota; ours sizes the pod's VM as 256 + 64 MiB, 1 + 1 vCPUs.
POD_MEMORY, POD_CPU_QUOTA, POD_CPU_PERIOD = 64 << 20, 100000, 100000


def pod_config(d, name, hostname):
    """A PodSandboxConfig as the kubelet sends one: metadata, hostname, a log directory (made
    here, as the kubelet makes it), the daemon's cgroup parent, pod network and IPC namespaces, a
    pid namespace per container (Kubernetes' default)."""
    pb = d.cri.pb
    uid = str(uuid.uuid4())
    logdir = os.path.join(d.pods_dir, f"nescri_{name}_{uid}")
    os.makedirs(logdir)
    return pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=name, uid=uid, namespace="nescri", attempt=0),
        hostname=hostname, log_directory=logdir, labels={"nesinit.test": "cri"},
        linux=pb.LinuxPodSandboxConfig(cgroup_parent=d.cgroup_parent, security_context=pb.LinuxSandboxSecurityContext(
            namespace_options=pb.NamespaceOption(network=pb.POD, pid=pb.CONTAINER, ipc=pb.POD)),
            resources=pb.LinuxContainerResources(memory_limit_in_bytes=POD_MEMORY, cpu_quota=POD_CPU_QUOTA,
                                                 cpu_period=POD_CPU_PERIOD)))


def container_config(d, name, script, resources=None):
    """A ContainerConfig for the busybox image running `sh -c SCRIPT`, its log at NAME.log; the
    pod's network and IPC, a pid namespace of its own (what the kubelet sends by default);
    `resources` its LinuxContainerResources (its limits), if any."""
    pb = d.cri.pb
    return pb.ContainerConfig(metadata=pb.ContainerMetadata(name=name, attempt=0),
                              image=pb.ImageSpec(image=h.BUSYBOX_IMAGE), command=["/bin/sh", "-c", script],
                              log_path=f"{name}.log", linux=pb.LinuxContainerConfig(
                                  resources=resources,
                                  security_context=pb.LinuxContainerSecurityContext(namespace_options=pb.NamespaceOption(
                                      network=pb.POD, pid=pb.CONTAINER, ipc=pb.POD))))


def state_name(d, c):
    return d.cri.pb.ContainerState.Name(c.state)


def http_get(ip, port, path):
    """GET http://IP:PORT/PATH from this test's namespace; the body, or None if not reachable
    yet (refused, reset, or no answer within 2 s)."""
    try:
        with socket.create_connection((ip, port), timeout=2) as s:
            s.sendall(f"GET {path} HTTP/1.0\r\nHost: {ip}\r\n\r\n".encode())
            got = b""
            while len(got) < 65536:
                b = s.recv(4096)
                if not b:
                    break
                got += b
    except OSError:
        return None
    head, _, body = got.decode(errors="replace").partition("\r\n\r\n")
    return body if " 200 " in head.split("\r\n")[0] else None


def case_multi(d, handler):
    """critest's "Multiple Containers [Conformance]", as this project states it (issue 27): a pod
    (RunPodSandbox, handler HANDLER) with busybox httpd and a busybox sh; the pod's IP (CNI's, in
    our subnet) serves the page to this test's namespace; the second container fetches it over
    `localhost` and exits 3 while the first runs on (ContainerStatus: its exit code; its log at
    log_path in the CRI format, stdout and stderr apart); ExecSync into the first returns its
    output and exit code and sees the pod's hostname; StopContainer ends the first through its
    SIGTERM trap (exit 42); StopPodSandbox + RemovePodSandbox leave nothing (audit)."""
    pb = d.cri.pb
    cfg = pod_config(d, "multi", "multi-pod")
    pod = d.cri.RunPodSandbox(config=cfg, runtime_handler=handler).pod_sandbox_id
    st = d.cri.PodSandboxStatus(pod_sandbox_id=pod).status
    check(st.state == pb.SANDBOX_READY, f"pod state {pb.PodSandboxState.Name(st.state)}")
    ip = st.network.ip
    check(ip.startswith(h.POD_SUBNET.rsplit(".", 1)[0] + "."), f"pod IP {ip!r} not in {h.POD_SUBNET}")

    httpd = d.cri.CreateContainer(pod_sandbox_id=pod, sandbox_config=cfg, config=container_config(
        d, "httpd", f"trap 'echo stopping; exit 42' TERM; echo serving; httpd -f -p {HTTP_PORT} -h /www & wait; "
                    "echo httpd-ended $?")).container_id
    d.cri.StartContainer(container_id=httpd)
    # The pod's IP reachable from this test's namespace (the CNI bridge's side): the page served.
    body = until(lambda: http_get(ip, HTTP_PORT, "/index.html"), f"http://{ip}:{HTTP_PORT}/ from the test")
    check(body == h.PAGE + "\n", f"the page through the pod IP: {body!r}")

    client = d.cri.CreateContainer(pod_sandbox_id=pod, sandbox_config=cfg, config=container_config(
        d, "client", f"wget -q -O - http://localhost:{HTTP_PORT}/index.html && echo fetched-over-localhost; "
                     "echo to-stderr >&2; exit 3")).container_id
    d.cri.StartContainer(container_id=client)
    cs = until(lambda: (lambda s: s if s.state == pb.CONTAINER_EXITED else None)(
        d.cri.ContainerStatus(container_id=client).status), "the client container exited")
    check(cs.exit_code == 3, f"client: exit code {cs.exit_code}, want 3 (reason {cs.reason!r}, {cs.message!r})")
    check(cs.log_path == os.path.join(cfg.log_directory, "client.log"), f"client log_path {cs.log_path!r}")
    # Its end is not the pod's: httpd runs on, the pod is READY.
    hs = d.cri.ContainerStatus(container_id=httpd).status
    check(hs.state == pb.CONTAINER_RUNNING, f"httpd after the client's exit: {state_name(d, hs)}")
    check(d.cri.PodSandboxStatus(pod_sandbox_id=pod).status.state == pb.SANDBOX_READY, "pod not READY")

    # The log, in the CRI format, each stream's lines in order (the two streams are copied apart).
    with open(cs.log_path) as f:
        raw = f.read()
    try:
        recs = parse_cri_log(raw)
    except ValueError as e:
        raise Failure(f"client log: {e}; {raw!r}")
    out = [t for s, t in recs if s == "stdout"]
    err = [t for s, t in recs if s == "stderr"]
    check(out == [h.PAGE, "fetched-over-localhost"] and err == ["to-stderr"],
          f"client log: stdout {out}, stderr {err}; raw {raw!r}")

    # ExecSync into httpd: output, stderr and exit code; the pod's hostname.
    r = d.cri.ExecSync(container_id=httpd, cmd=["/bin/sh", "-c", "echo exec-out; hostname; echo exec-err >&2; exit 4"],
                       timeout=60)
    check((r.exit_code, r.stdout, r.stderr) == (4, b"exec-out\nmulti-pod\n", b"exec-err\n"),
          f"ExecSync: exit {r.exit_code}, stdout {r.stdout!r}, stderr {r.stderr!r}")
    names = sorted(c.metadata.name for c in d.cri.ListContainers(filter=pb.ContainerFilter(pod_sandbox_id=pod)).containers)
    check(names == ["client", "httpd"], f"ListContainers: {names}")
    # Each container in a pid namespace of its own (Kubernetes' default): its PID 1 its own sh.
    r = d.cri.ExecSync(container_id=httpd, cmd=["/bin/cat", "/proc/1/cmdline"], timeout=60)
    check(r.exit_code == 0 and r.stdout.startswith(b"/bin/sh\0-c\0trap "), f"httpd's PID 1: {r.stdout!r} {r.stderr!r}")
    if handler == h.NESINIT_HANDLER:
        # One VM per pod: one shim and one QEMU serve the sandbox and both containers.
        shims = [p for p, cmd in h.descendants() if "containerd-shim-nesinit-v2" in cmd.split(" ")[0]]
        qemus = [(p, cmd) for p, cmd in h.descendants() if cmd.startswith("qemu-system")]
        check(len(shims) == 1 and len(qemus) == 1, f"the pod's shims {shims} and QEMUs {qemus}: want one of each")
        qemu = qemus[0][1].split(" ")
        size = (qemu[qemu.index("-m") + 1], qemu[qemu.index("-smp") + 1])
        check(size == ("320", "2"), f"the pod VM's -m and -smp: {size}, want 320 (256 + 64 MiB) and 2 (1 + 1)")

    d.cri.StopContainer(container_id=httpd, timeout=30)
    hs = d.cri.ContainerStatus(container_id=httpd).status
    check(hs.state == pb.CONTAINER_EXITED and hs.exit_code == 42,
          f"httpd after StopContainer: {state_name(d, hs)} exit {hs.exit_code}, want EXITED 42 (its TERM trap)")
    with open(hs.log_path) as f:
        hlog = [t for s, t in parse_cri_log(f.read()) if s == "stdout"]
    check(hlog == ["serving", "stopping"], f"httpd log: {hlog}")

    # The audit sees a live pod's every kind of trace (so its empty answer below means something).
    live = d.audit()
    kinds = ("pod ", "container ", "ctr tasks", "process ", "mount ", "pod netns ", "veth ", "IP reserved ",
             "shim socket ")
    if handler == h.RUNC_HANDLER:
        kinds += ("cgroup ",)  # runc's per-container cgroups; ours makes none (docs/containerd.md "Pods")
    missing = [k for k in kinds if not any(x.startswith(k) for x in live)]
    check(not missing, f"the audit of a live pod lacks {missing}: {live}")

    d.cri.StopPodSandbox(pod_sandbox_id=pod)
    check(d.cri.PodSandboxStatus(pod_sandbox_id=pod).status.state == pb.SANDBOX_NOTREADY, "pod READY after Stop")
    d.cri.RemovePodSandbox(pod_sandbox_id=pod)
    try:
        d.cri.PodSandboxStatus(pod_sandbox_id=pod)
        raise Failure("PodSandboxStatus of a removed pod answered")
    except CriError as e:
        check(e.code.name == "NOT_FOUND", f"PodSandboxStatus of a removed pod: {e}")
    # Nothing left: the containers' processes, the shim, its socket, the rootfs and netns mounts,
    # the veth, the IP (bounded: a shim exits after its last task's delete).
    try:
        until(lambda: not d.audit(), "nothing left after RemovePodSandbox", bound=30)
    except Failure:
        raise Failure(f"left after RemovePodSandbox: {d.audit()}{d.tail()}")


def atomic_dir(path, files, mode, ts):
    """A volume directory as the kubelet's AtomicWriter writes a projected, ConfigMap or Secret
    volume: the files in `..TS`, `..data` -> `..TS` swapped in by an atomic rename of
    `..data_tmp`, each name a symlink `NAME` -> `..data/NAME`; the previous `..TS` removed. Called
    again with new contents and another TS, it is the kubelet's rotation of the volume."""
    os.makedirs(path, exist_ok=True)
    old = os.readlink(os.path.join(path, "..data")) if os.path.islink(os.path.join(path, "..data")) else None
    new = f"..{ts}"
    os.mkdir(os.path.join(path, new), 0o755)
    for name, text in files.items():
        fp = os.path.join(path, new, name)
        with open(fp, "w") as f:
            f.write(text)
        os.chmod(fp, mode)
    os.symlink(new, os.path.join(path, "..data_tmp"))
    os.rename(os.path.join(path, "..data_tmp"), os.path.join(path, "..data"))
    for name in files:
        if not os.path.islink(os.path.join(path, name)):
            os.symlink(os.path.join("..data", name), os.path.join(path, name))
    if old:
        shutil.rmtree(os.path.join(path, old))


def mount_flags(text, dst):
    """`ro` or `rw` of the mount at `dst` in a /proc/mounts text (the last one there), or None."""
    got = None
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 4 and f[1] == dst:
            got = f[3].split(",")[0]
    return got


def case_mounts(d, handler):
    """A pod's volumes as a kubelet sends them (issue 48), in one pod: the service-account token
    (a projected volume in the AtomicWriter's `..data` layout), a ConfigMap, a Secret (0400), an
    emptyDir shared by two containers, a Memory emptyDir (the kubelet's tmpfs on the host), a
    read-only hostPath, the kubelet's /etc/hosts and /dev/termination-log files. Every mount is
    where the spec says, ro or rw as it says, with its files' modes; the shared emptyDir is
    shared both ways and with the host; a write to the read-only hostPath fails; the second
    container's termination message is in the host file the kubelet reads; the token rotated on
    the host (the `..data` rename) is read rotated in the container; (ours) a mount the VM cannot
    give (a unix socket) fails CreateContainer naming the container and the field, the pod and its
    running container untouched. Ends with nothing left (audit)."""
    pb = d.cri.pb
    cfg = pod_config(d, "vols", "vols-pod")
    uid = cfg.metadata.uid
    kub = os.path.join(d.tmp, "kubelet", "pods", uid)
    vol = lambda kind, name: os.path.join(kub, "volumes", f"kubernetes.io~{kind}", name)  # noqa: E731
    sa, cm, sec = vol("projected", "kube-api-access-x7k2p"), vol("configmap", "cfg"), vol("secret", "sec")
    shared, mem = vol("empty-dir", "shared"), vol("empty-dir", "mem")
    atomic_dir(sa, {"token": "token-1", "ca.crt": "ca", "namespace": "nescri"}, 0o644, "2026_12_07_22_00_00.1")
    atomic_dir(cm, {"app.conf": "mode=blue"}, 0o644, "2026_12_07_22_00_00.2")
    atomic_dir(sec, {"password": "s3cret"}, 0o400, "2026_12_07_22_00_00.3")
    for p in (shared, mem):
        os.makedirs(p)
        os.chmod(p, 0o777)
    # The Memory emptyDir: the kubelet's tmpfs on the host, here in the daemon's mount namespace.
    subprocess.run(["nsenter", "-t", str(d.proc.pid), "-m", "mount", "-n", "-t", "tmpfs", "-o", "size=16m,mode=1777",
                    "nescri-mem", mem], check=True, timeout=h.BOUND)
    hostpath = os.path.join(d.tmp, "hostpath")
    os.makedirs(hostpath)
    with open(os.path.join(hostpath, "hello"), "w") as f:
        f.write("from-the-host")
    os.makedirs(os.path.join(kub, "containers", "app"))
    os.makedirs(os.path.join(kub, "containers", "side"))
    term_a, term_b = os.path.join(kub, "containers", "app", "a1b2"), os.path.join(kub, "containers", "side", "c3d4")
    etc_hosts = os.path.join(kub, "etc-hosts")
    for p in (term_a, term_b, etc_hosts):
        open(p, "w").close()
        os.chmod(p, 0o666)
    M = pb.Mount
    common = [M(container_path="/etc/hosts", host_path=etc_hosts),
              M(container_path="/dev/termination-log", host_path=term_a),
              M(container_path="/shared", host_path=shared)]
    app_mounts = common + [
        M(container_path="/var/run/secrets/kubernetes.io/serviceaccount", host_path=sa, readonly=True),
        M(container_path="/etc/config", host_path=cm, readonly=True),
        M(container_path="/etc/secret", host_path=sec, readonly=True),
        M(container_path="/cache", host_path=mem),
        M(container_path="/host", host_path=hostpath, readonly=True)]

    def cfg_with(name, script, mounts):
        c = container_config(d, name, script)
        c.mounts.extend(mounts)
        return c

    pod = d.cri.RunPodSandbox(config=cfg, runtime_handler=handler).pod_sandbox_id
    app = d.cri.CreateContainer(pod_sandbox_id=pod, sandbox_config=cfg, config=cfg_with(
        "app", "trap 'exit 0' TERM; echo up; sleep 100000 & wait", app_mounts)).container_id
    d.cri.StartContainer(container_id=app)

    def sh(script, want_rc=0):
        r = d.cri.ExecSync(container_id=app, cmd=["/bin/sh", "-c", script], timeout=60)
        if want_rc is not None:
            check(r.exit_code == want_rc, f"ExecSync {script!r}: exit {r.exit_code}, want {want_rc}; {r.stdout!r} {r.stderr!r}")
        return r.stdout.decode()

    mounts = sh("cat /proc/mounts")
    want = {"/var/run/secrets/kubernetes.io/serviceaccount": "ro", "/etc/config": "ro", "/etc/secret": "ro",
            "/shared": "rw", "/cache": "rw", "/host": "ro", "/dev/termination-log": "rw"}
    got = {k: mount_flags(mounts, k) for k in want}
    check(got == want, f"the mounts' flags in the container: {got}, want {want}\n{mounts}")
    got = sh("cat /var/run/secrets/kubernetes.io/serviceaccount/token; echo; cat /etc/config/app.conf; echo; "
             "cat /etc/secret/password; echo; cat /host/hello").split("\n")
    check(got == ["token-1", "mode=blue", "s3cret", "from-the-host"], f"the volumes' contents: {got}")
    # The kubelet's layout, as it wrote it (symlinks through `..data`), and the files' modes.
    ls = sh("ls -lna /var/run/secrets/kubernetes.io/serviceaccount/")
    check("..data -> ..2026_12_07_22_00_00.1" in ls and "token -> ..data/token" in ls, f"the token dir: {ls}")
    modes = [l.split()[0] for l in sh("ls -lnL /etc/secret/password /etc/config/app.conf; ls -lnd /cache /shared")
             .splitlines()]
    check(modes == ["-rw-r--r--", "-r--------", "drwxrwxrwt", "drwxrwxrwx"], f"modes (config, secret, /cache, /shared): {modes}")
    # Read-write volumes reach the host; the read-only hostPath refuses a write.
    sh("echo from-app > /shared/from-app && echo in-memory > /cache/m")
    with open(os.path.join(shared, "from-app")) as f:
        check(f.read() == "from-app\n", "the shared emptyDir's file on the host")
    with open(d.daemon_root(os.path.join(mem, "m"))) as f:
        check(f.read() == "in-memory\n", "the Memory emptyDir's file in the kubelet's tmpfs")
    sh("echo x > /host/nope", want_rc=None)
    check(not os.path.exists(os.path.join(hostpath, "nope")), "a write through the read-only hostPath reached the host")

    # A second container shares the emptyDir both ways and leaves a termination message.
    side_mounts = [M(container_path="/etc/hosts", host_path=etc_hosts),
                   M(container_path="/dev/termination-log", host_path=term_b),
                   M(container_path="/shared", host_path=shared)]
    side = d.cri.CreateContainer(pod_sandbox_id=pod, sandbox_config=cfg, config=cfg_with(
        "side", "cat /shared/from-app && echo from-side > /shared/from-side && "
                "printf 'side finished: ok' > /dev/termination-log", side_mounts)).container_id
    d.cri.StartContainer(container_id=side)
    cs = until(lambda: (lambda s: s if s.state == pb.CONTAINER_EXITED else None)(
        d.cri.ContainerStatus(container_id=side).status), "the side container exited")
    check(cs.exit_code == 0, f"side: exit {cs.exit_code} ({cs.reason!r} {cs.message!r})")
    with open(cs.log_path) as f:
        out = [t for s_, t in parse_cri_log(f.read()) if s_ == "stdout"]
    check(out == ["from-app"], f"side read {out} from the shared emptyDir")
    check(sh("cat /shared/from-side") == "from-side\n", "app reads side's file")
    with open(term_b) as f:
        check(f.read() == "side finished: ok", "the termination message in the kubelet's file")

    # The kubelet rotates the token: a new `..TS`, `..data` renamed over; the container reads the new one.
    atomic_dir(sa, {"token": "token-2", "ca.crt": "ca", "namespace": "nescri"}, 0o644, "2026_12_07_23_00_00.4")
    until(lambda: sh("cat /var/run/secrets/kubernetes.io/serviceaccount/token") == "token-2",
          "the rotated token read in the container", bound=30, step=0.2)

    if handler == h.NESINIT_HANDLER:
        # A mount the VM cannot give (a unix socket: no connection crosses a VM): refused naming
        # the container and the field; the pod and its running container untouched.
        sock_path = os.path.join(kub, "agent.sock")
        srv = socket.socket(socket.AF_UNIX)
        srv.bind(sock_path)
        bad = None
        try:
            # CRI's CreateContainer only records the container; the task (the shim's Create, which
            # refuses) is made at StartContainer.
            bad = d.cri.CreateContainer(pod_sandbox_id=pod, sandbox_config=cfg, config=cfg_with(
                "bad", "true", [M(container_path="/run/agent.sock", host_path=sock_path)])).container_id
            d.cri.StartContainer(container_id=bad)
            raise Failure("StartContainer with a socket mount succeeded")
        except CriError as e:
            msg = str(e)
            check("container '" in msg and "mounts[" in msg and ".source" in msg, f"the refusal names no container and field: {msg}")
        finally:
            srv.close()
            if bad is not None:
                d.cri.RemoveContainer(container_id=bad)
        check(d.cri.ContainerStatus(container_id=app).status.state == pb.CONTAINER_RUNNING, "app after the refusal")
        check(sh("echo alive") == "alive\n", "ExecSync into app after the refusal")
        check(d.cri.PodSandboxStatus(pod_sandbox_id=pod).status.state == pb.SANDBOX_READY, "pod after the refusal")

    d.cri.StopContainer(container_id=app, timeout=30)
    d.cri.StopPodSandbox(pod_sandbox_id=pod)
    d.cri.RemovePodSandbox(pod_sandbox_id=pod)
    subprocess.run(["nsenter", "-t", str(d.proc.pid), "-m", "umount", "-n", mem], check=True, timeout=h.BOUND)
    check(os.path.exists(os.path.join(hostpath, "hello")) and os.path.exists(os.path.join(sa, "..data")),
          "the host's volumes after the pod's removal")


# A busybox shell that holds N MiB in a variable (command substitution reads it all into memory).
def hold_mib(n):
    return f"x=$(head -c {n}m /dev/zero | tr '\\0' a); echo held ${{#x}}"


def case_resources(d, handler):
    """Per-container resources (issue 48), one pod of three containers, each with a memory limit
    (the kubelet's LinuxContainerResources): `oom` allocates past its 16 MiB and is OOM-killed
    alone (exit 137; the pod and the others run on); `grow` (8 MiB): 12 MiB in an ExecSync is
    killed (137), UpdateContainerResources to 48 MiB, then the same ExecSync holds it (exit 0);
    `holder` holds 8 MiB: ContainerStats of holder and grow differ (memory usage, and the
    holder's above 8 MiB). With ours, the bad input of an Update (below what holder uses, a
    negative limit, past the pod VM's size) fails naming the container and the field, holder
    and the pod untouched."""
    pb = d.cri.pb
    cfg = pod_config(d, "res", "res-pod")
    pod = d.cri.RunPodSandbox(config=cfg, runtime_handler=handler).pod_sandbox_id
    lim = lambda mib: pb.LinuxContainerResources(memory_limit_in_bytes=mib << 20, cpu_shares=512)
    ids = {}
    for name, script, mib in (("holder", hold_mib(8) + "; trap 'exit 0' TERM; while :; do sleep 1; done", 32),
                              ("grow", "trap 'exit 0' TERM; echo up; while :; do sleep 1; done", 8)):
        ids[name] = d.cri.CreateContainer(pod_sandbox_id=pod, sandbox_config=cfg,
                                          config=container_config(d, name, script, lim(mib))).container_id
        d.cri.StartContainer(container_id=ids[name])
    until(lambda: "held 8388608" in open(os.path.join(cfg.log_directory, "holder.log")).read(), "holder holds 8 MiB")
    oom = d.cri.CreateContainer(pod_sandbox_id=pod, sandbox_config=cfg,
                                config=container_config(d, "oom", hold_mib(64) + "; exit 0", lim(16))).container_id
    d.cri.StartContainer(container_id=oom)
    os_ = until(lambda: (lambda s: s if s.state == pb.CONTAINER_EXITED else None)(
        d.cri.ContainerStatus(container_id=oom).status), "the oom container exited")
    check(os_.exit_code == 137, f"oom: exit {os_.exit_code}, want 137 (OOM-killed; reason {os_.reason!r})")
    for name in ("holder", "grow"):
        st = d.cri.ContainerStatus(container_id=ids[name]).status
        check(st.state == pb.CONTAINER_RUNNING, f"{name} after oom's end: {state_name(d, st)}")
    check(d.cri.PodSandboxStatus(pod_sandbox_id=pod).status.state == pb.SANDBOX_READY, "pod not READY after oom")

    # grow: 12 MiB is past its 8 MiB (the exec is killed, grow runs on); raised to 48, it fits
    # (a shell holding N bytes peaks at a few times N while it reads them).
    r = d.cri.ExecSync(container_id=ids["grow"], cmd=["/bin/sh", "-c", hold_mib(12)], timeout=60)
    check(r.exit_code == 137, f"12 MiB under 8 MiB: exit {r.exit_code}, want 137; {r.stdout!r} {r.stderr!r}")
    st = d.cri.ContainerStatus(container_id=ids["grow"]).status
    check(st.state == pb.CONTAINER_RUNNING, f"grow after its exec's OOM kill: {state_name(d, st)}")
    d.cri.UpdateContainerResources(container_id=ids["grow"], linux=lim(48))
    r = d.cri.ExecSync(container_id=ids["grow"], cmd=["/bin/sh", "-c", hold_mib(12)], timeout=60)
    check((r.exit_code, r.stdout) == (0, b"held 12582912\n"),
          f"12 MiB under 48 MiB after Update: exit {r.exit_code}, {r.stdout!r} {r.stderr!r}")

    # ContainerStats per container: each its own cgroup's figures.
    def mem(name):
        s = d.cri.ContainerStats(container_id=ids[name]).stats
        return s.memory.usage_bytes.value, s.memory.working_set_bytes.value, s.cpu.usage_core_nano_seconds.value
    hm, gm = mem("holder"), mem("grow")
    check(hm[0] > 8 << 20 and hm[0] != gm[0] and gm[0] > 0, f"ContainerStats: holder {hm}, grow {gm}")

    if handler == h.NESINIT_HANDLER:
        def refused(name, res, words):
            try:
                d.cri.UpdateContainerResources(container_id=ids[name], linux=res)
            except CriError as e:
                check(ids[name] in str(e) and all(w in str(e) for w in words), f"Update {res}: {e}")
                return
            raise Failure(f"Update of {name} with {res} was accepted")
        refused("holder", lim(1), ["memory_max", "below", "memory.current"])
        refused("holder", pb.LinuxContainerResources(memory_limit_in_bytes=-5), ["linux.resources.memory.limit", "-5"])
        refused("grow", lim(1024), ["linux.resources.memory.limit", "beyond its VM's 320 MiB"])
        st = d.cri.ContainerStatus(container_id=ids["holder"]).status
        check(st.state == pb.CONTAINER_RUNNING, f"holder after the refused updates: {state_name(d, st)}")
    d.cri.StopPodSandbox(pod_sandbox_id=pod)
    d.cri.RemovePodSandbox(pod_sandbox_id=pod)
    try:
        until(lambda: not d.audit(), "nothing left after RemovePodSandbox", bound=30)
    except Failure:
        raise Failure(f"left after RemovePodSandbox: {d.audit()}{d.tail()}")


CASES = {n[5:]: f for n, f in globals().items() if n.startswith("case_")}
HANDLERS = (h.RUNC_HANDLER, h.NESINIT_HANDLER)


def main():
    want = sys.argv[3][len("--containerd="):] if len(sys.argv) == 4 and sys.argv[3].startswith("--containerd=") else None
    if len(sys.argv) != (4 if want else 3) or sys.argv[1] not in CASES or sys.argv[2] not in HANDLERS:
        print(f"usage: cri_test.py {{{','.join(CASES)}}} {{{','.join(HANDLERS)}}} [--containerd=VERSION]",
              file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("SKIP: needs root (containerd)")
        return 77
    case, handler = sys.argv[1:3]
    # The containerd on PATH is the one this run means (1.7 through scripts/fetch-containerd.sh's
    # directory first on PATH): a wrong PATH fails here, not as a silent pass against 1.6.
    ver = subprocess.run(["containerd", "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    print(f"containerd: {ver}", flush=True)
    if want and f" {want}." not in ver and f" v{want}." not in ver:
        print(f"FAIL: containerd on PATH is not {want}: {ver!r}", file=sys.stderr)
        return 1
    shim, env = None, {}
    if handler == h.NESINIT_HANDLER:
        shim = os.environ["NESHOST_SHIM"]
        env = {k: os.path.abspath(os.environ[k]) for k in ("NESHOST", "NESHOST_INITRD") if k in os.environ}
    h.set_subreaper()
    h.enter_own_netns()
    ok = False
    t0 = time.monotonic()
    d = None
    try:
        d = h.CriDaemon(shim=shim, env=env, debug=os.environ.get("NESCRI_DEBUG") == "1")
        d.import_images()
        CASES[case](d, handler)
        ok = True
    except (Failure, CriError) as e:
        print(f"FAIL: {e}", file=sys.stderr)
        if d:
            print(d.tail(), file=sys.stderr)
    finally:
        if d:
            problems = d.close()
            for p in problems:
                print(f"FAIL: {p}", file=sys.stderr)
            ok = ok and not problems
            d.remove()
        h.reap_children()
    print(f"{case} [{handler}]: {'PASS' if ok else 'FAIL'} ({time.monotonic() - t0:.1f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
