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


def container_config(d, name, script):
    """A ContainerConfig for the busybox image running `sh -c SCRIPT`, its log at NAME.log; the
    pod's network and IPC, a pid namespace of its own (what the kubelet sends by default)."""
    pb = d.cri.pb
    return pb.ContainerConfig(metadata=pb.ContainerMetadata(name=name, attempt=0),
                              image=pb.ImageSpec(image=h.BUSYBOX_IMAGE), command=["/bin/sh", "-c", script],
                              log_path=f"{name}.log", linux=pb.LinuxContainerConfig(
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
