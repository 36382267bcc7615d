#!/usr/bin/env python3
"""P11: a Kubernetes pod's start through containerd's CRI plugin, and the host memory per pod.

Pod start: RunPodSandbox -> CreateContainer -> StartContainer -> the container's first output
line in its CRI log (`echo first; exec sleep ...`: the time a kubelet would see the pod's first
log line), a one-container pod, handlers alternating, medians; each phase's median too. Memory:
N pods (1, then 4) each with that one container running, the PSS (/proc/PID/smaps_rollup,
Kuasar's method: shared pages split among their sharers) summed over every process the pods
brought (the shims and their children: pause, the workload; for nesinit also neshost, QEMU,
virtiofsd), divided by N.

The daemon is tests/cri/cri_harness.py's private containerd (own root, state, sockets, config; in
a network namespace and a mount namespace of this run's own; CNI bridge there only; images built
here), one daemon for every handler, so they are measured side by side in one run. Prints
markdown rows for bench/results/latest.md (scripts/bench.sh runs it; not a test).

Usage: p11_cri.py CRI_STUBS_DIR [RUNS] [--nesinit SHIM NESHOST INITRD]   (default RUNS 5; root)
With --nesinit both handlers are measured (ours: the pod is one VM); without it, runc's alone.
"""
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "cri"))
import cri_harness as h  # noqa: E402
sys.path.insert(0, os.path.join(HERE, "..", "tests", "support"))
from procs import pss_kib  # noqa: E402
from cri_test import atomic_dir  # noqa: E402

BOUND = 300  # seconds: the most one pod's start may take


def pod_config(d, name):
    pb = d.cri.pb
    uid = f"p11-{name}-{time.monotonic_ns()}"
    logdir = os.path.join(d.pods_dir, uid)
    os.makedirs(logdir)
    return pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(name=name, uid=uid, namespace="p11"),
                               hostname=name, log_directory=logdir,
                               linux=pb.LinuxPodSandboxConfig(cgroup_parent=d.cgroup_parent))


def first_line(path):
    """True once the CRI log at `path` holds a complete first record."""
    try:
        with open(path) as f:
            return "\n" in f.read(4096)
    except FileNotFoundError:
        return False


def kubelet_mounts(d, name):
    """The mounts a kubelet gives a pod's container (issue 48), made on the host as it makes
    them: the service-account token (a projected volume in the AtomicWriter's `..data` layout),
    a ConfigMap, a Secret, an emptyDir, a read-only hostPath, /etc/hosts and
    /dev/termination-log: seven CRI mounts."""
    M = d.cri.pb.Mount
    kub = os.path.join(d.tmp, "kubelet", name)
    vol = lambda kind, v: os.path.join(kub, "volumes", f"kubernetes.io~{kind}", v)  # noqa: E731
    sa, cm, sec, ed = vol("projected", "kube-api-access"), vol("configmap", "cfg"), vol("secret", "sec"), vol("empty-dir", "ed")
    atomic_dir(sa, {"token": "t", "ca.crt": "ca", "namespace": "p11"}, 0o644, "2026_12_07_00_00_00.1")
    atomic_dir(cm, {"app.conf": "x"}, 0o644, "2026_12_07_00_00_00.2")
    atomic_dir(sec, {"password": "y"}, 0o400, "2026_12_07_00_00_00.3")
    os.makedirs(ed)
    os.makedirs(os.path.join(kub, "containers"))
    term, hosts = os.path.join(kub, "containers", "term"), os.path.join(kub, "etc-hosts")
    for p in (term, hosts):
        open(p, "w").close()
    return [M(container_path="/etc/hosts", host_path=hosts), M(container_path="/dev/termination-log", host_path=term),
            M(container_path="/var/run/secrets/kubernetes.io/serviceaccount", host_path=sa, readonly=True),
            M(container_path="/etc/config", host_path=cm, readonly=True),
            M(container_path="/etc/secret", host_path=sec, readonly=True),
            M(container_path="/data", host_path=ed), M(container_path="/host", host_path=d.tmp, readonly=True)]


def start_pod(d, handler, name, mounts=False):
    """One pod with one container (with a kubelet's mounts when `mounts`), to its first log
    line. Returns (pod id, phase times in s: run, create, start, first output, total)."""
    pb = d.cri.pb
    cfg = pod_config(d, name)
    ms = kubelet_mounts(d, name) if mounts else []
    t0 = time.monotonic()
    pod = d.cri.RunPodSandbox(config=cfg, runtime_handler=handler, deadline=BOUND).pod_sandbox_id
    t1 = time.monotonic()
    c = d.cri.CreateContainer(pod_sandbox_id=pod, sandbox_config=cfg, deadline=BOUND, config=pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name="c"), image=pb.ImageSpec(image=h.BUSYBOX_IMAGE), mounts=ms,
        command=["/bin/sh", "-c", "echo first; exec sleep 100000"], log_path="c.log")).container_id
    t2 = time.monotonic()
    d.cri.StartContainer(container_id=c, deadline=BOUND)
    t3 = time.monotonic()
    log = os.path.join(cfg.log_directory, "c.log")
    # Polling a file's state every millisecond (a benchmark's clock, not a test's synchronisation).
    h.until(lambda: first_line(log), f"{name}: first output", bound=BOUND, step=0.001)
    t4 = time.monotonic()
    return pod, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t0)


def remove_pod(d, pod):
    d.cri.StopPodSandbox(pod_sandbox_id=pod, deadline=BOUND)
    d.cri.RemovePodSandbox(pod_sandbox_id=pod, deadline=BOUND)


def pods_pss(d):
    """{short process name: PSS KiB summed} over every process below this one but the daemon:
    everything the pods brought."""
    out = {}
    for pid, cmd in h.descendants():
        if pid == d.proc.pid:
            continue
        name = os.path.basename(cmd.split()[0]) if cmd else "?"
        out[name] = out.get(name, 0) + pss_kib(pid)
    return out


def memory(d, handler, n):
    """PSS per pod (KiB) with `n` pods running, and the per-process breakdown of the total."""
    pods = []
    try:
        for i in range(n):
            pods.append(start_pod(d, handler, f"m{handler}{n}x{i}")[0])
        by = pods_pss(d)
        return sum(by.values()) / n, by
    finally:
        for p in pods:
            remove_pod(d, p)


def main():
    args = sys.argv[1:]
    nes = None
    if "--nesinit" in args:
        i = args.index("--nesinit")
        nes = args[i + 1:i + 4]
        del args[i:i + 4]
    if not args or os.geteuid() != 0 or (nes is not None and len(nes) != 3):
        print(__doc__, file=sys.stderr)
        return 2
    os.environ["CRI_STUBS_DIR"] = os.path.abspath(args[0])
    runs = int(args[1]) if len(args) > 1 else 5
    handlers = [h.RUNC_HANDLER] + ([h.NESINIT_HANDLER] if nes else [])
    env = {"NESHOST": os.path.abspath(nes[1]), "NESHOST_INITRD": os.path.abspath(nes[2])} if nes else {}
    h.set_subreaper()
    h.enter_own_netns()
    d = h.CriDaemon(shim=os.path.abspath(nes[0]) if nes else None, env=env)
    try:
        d.import_images()
        times = {k: [] for k in handlers}
        vtimes = {(k, m): [] for k in handlers for m in (False, True)}  # with a kubelet's mounts or not
        variants = list(vtimes)
        for i in range(runs):
            for k in handlers[i % len(handlers):] + handlers[:i % len(handlers)]:  # rotate who goes first
                pod, t = start_pod(d, k, f"t{k}{i}")
                times[k].append(t)
                remove_pod(d, pod)
            for k, m in variants[i % len(variants):] + variants[:i % len(variants)]:
                pod, t = start_pod(d, k, f"v{k}{int(m)}{i}", mounts=m)
                vtimes[(k, m)].append(t[4])
                remove_pod(d, pod)
        mem = {k: {n: memory(d, k, n) for n in (1, 4)} for k in handlers}
        left = d.audit()
        if left:
            raise h.Failure(f"left after the runs: {left}")
    finally:
        problems = d.close()
        d.remove()
        h.reap_children()
    if problems:
        print(f"p11: {problems}", file=sys.stderr)
        return 1
    load = os.getloadavg()[0]
    med = {k: [statistics.median(t[j] for t in v) for j in range(5)] for k, v in times.items()}
    spread = {k: f"{min(t[4] for t in v):.2f}-{max(t[4] for t in v):.2f} s" for k, v in times.items()}
    stamp = time.strftime("%Y-%m-%d %H:%M", time.gmtime())

    def col(k, v, fmt):
        return fmt.format(v) if k in med else "not measured"

    r = med[h.RUNC_HANDLER]
    n = med.get(h.NESINIT_HANDLER)

    def row(what, unit, j, fmt, scale=1.0):
        nv = col(h.NESINIT_HANDLER, n[j] * scale if n else 0, fmt)
        ratio = f"{n[j] / r[j]:.1f}" if n else "—"
        print(f"| {what} | {unit} | {nv} | containerd's runc runtime (io.containerd.runc.v2) | {fmt.format(r[j] * scale)} | {ratio} |")

    print(f"| P11 CRI pod start, RunPodSandbox → CreateContainer → StartContainer → first log line, one-container pod "
          f"(median of {runs}, alternating; {stamp}, load {load:.1f}; runc {spread[h.RUNC_HANDLER]}"
          + (f", nesinit {spread[h.NESINIT_HANDLER]}" if n else "") + ") | s | "
          + col(h.NESINIT_HANDLER, n[4] if n else 0, "{:.2f}") + f" | containerd's runc runtime (io.containerd.runc.v2) | "
          f"{r[4]:.3f} | {f'{n[4] / r[4]:.1f}' if n else '—'} |")
    row("P11 phase: RunPodSandbox (pause + CNI)", "ms", 0, "{:.0f}", 1000)
    row("P11 phase: CreateContainer", "ms", 1, "{:.0f}", 1000)
    row("P11 phase: StartContainer", "ms", 2, "{:.0f}", 1000)
    row("P11 phase: StartContainer answered → first log line", "ms", 3, "{:.1f}", 1000)
    vmed = {k: statistics.median(v) for k, v in vtimes.items()}
    nm_ = vmed.get((h.NESINIT_HANDLER, True))
    print(f"| P11 CRI pod start with a kubelet's mounts (token dir, ConfigMap, Secret, emptyDir, hostPath, /etc/hosts, "
          f"/dev/termination-log) / without, same one-container pod (median of {runs} each, alternating with runc's; "
          f"{stamp}, load {load:.1f}; nesinit {nm_:.2f} vs {vmed[(h.NESINIT_HANDLER, False)]:.2f} s; "
          f"runc {vmed[(h.RUNC_HANDLER, True)]:.3f} vs {vmed[(h.RUNC_HANDLER, False)]:.3f} s; goal ≤ 1.1) | × | "
          + (f"{nm_ / vmed[(h.NESINIT_HANDLER, False)]:.2f}" if nm_ else "not measured")
          + f" | containerd's runc runtime, same | {vmed[(h.RUNC_HANDLER, True)] / vmed[(h.RUNC_HANDLER, False)]:.2f} | — |")
    for npods in (1, 4):
        rm, rby = mem[h.RUNC_HANDLER][npods]
        nm = mem.get(h.NESINIT_HANDLER, {}).get(npods)
        parts = ", ".join(f"{k} {v / npods / 1024:.2f}" for k, v in sorted(rby.items(), key=lambda kv: -kv[1]))
        nparts = ""
        if nm:
            nparts = "; nesinit: " + ", ".join(f"{k} {v / npods / 1024:.2f}" for k, v in sorted(nm[1].items(), key=lambda kv: -kv[1]))
        print(f"| P11 host memory per pod, {npods} pod{'s' if npods > 1 else ''} running (PSS from smaps_rollup of the "
              f"shim and its children, per pod; runc: {parts}{nparts} MiB) | MiB | "
              + (f"{nm[0] / 1024:.2f}" if nm else "not measured")
              + f" | containerd's runc runtime | {rm / 1024:.2f} | {f'{nm[0] / rm:.1f}' if nm else '—'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
