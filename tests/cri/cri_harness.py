"""A private containerd with its CRI plugin on, for tests/cri and bench P11.

What it is made of, all under one temp dir and all gone at close() + remove():
- containerd 1.6 (Debian's) with its own root, state, sockets and config.toml; CRI on:
  `sandbox_image` our own pause image, CNI from Debian's containernetworking-plugins
  (/usr/lib/cni: bridge, host-local, loopback) with a conf of ours, pod network namespaces kept
  under containerd's state dir (`netns_mounts_under_state_dir`), runc's state under our dir; two
  runtime handlers: `runc` (io.containerd.runc.v2, Debian's runc) and `nesinit`
  (io.containerd.nesinit.v2, when the shim is given).
- A network namespace of the caller's own (enter_own_netns(), before the daemon starts): the CNI
  bridge, the pods' veths and their addresses exist only there; nothing is configured in the
  machine's namespace (no bridge, address, route or firewall rule). The caller (the test) is in
  it too, so it reaches the pods' IPs.
- A private mount namespace for the daemon (`unshare --mount --propagation private`) with fresh
  tmpfs over /run and /var/lib: the shims' sockets (runc's shim puts them in
  /run/containerd/s, a fixed path), libcni's result cache (/var/lib/cni) and every snapshot,
  rootfs and netns mount stay there, never in the machine's mount table or file system.
- Images built at test time from the machine's static busybox and catatonit (pause mode) into
  OCI tarballs, imported with `ctr -n k8s.io images import` under their exact names.

The caller is a child subreaper (set_subreaper()): the shims daemonize and are reparented to it,
so audit() finds everything the daemon started, and close() reaps it.
"""
import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
sys.path.insert(0, HERE)
from oci_image import oci_archive  # noqa: E402
from procs import processes  # noqa: E402
from cri_client import Cri  # noqa: E402

BOUND = 120  # seconds: the most any one step may take
NS = "k8s.io"  # containerd's namespace for everything CRI does
PAUSE_IMAGE = "nesinit.test/pause:1"
BUSYBOX_IMAGE = "nesinit.test/busybox:1"
POD_SUBNET, POD_GATEWAY = "10.99.88.0/24", "10.99.88.1"  # only ever inside the caller's own netns
BRIDGE = "nescri0"
PAGE = "nesinit-cri-page"  # /www/index.html in the busybox image
BUSYBOX_APPLETS = ("sh", "httpd", "wget", "echo", "cat", "sleep", "seq", "ls", "hostname", "id", "true",
                   "ps", "nc", "ip", "mount", "test", "grep", "wc")
RUNC_HANDLER, NESINIT_HANDLER = "runc", "nesinit"
PR_SET_CHILD_SUBREAPER = 36
CLONE_NEWNET = 0x40000000


class Failure(Exception):
    """A step of the harness or a test's check that did not hold; the message says what."""


def check(cond, what):
    if not cond:
        raise Failure(what)


def until(cond, what, bound=BOUND, step=0.05):
    """Polls `cond` (a state read from the daemon or the kernel, not a timing guess) until it
    returns a true value, which is returned; Failure after `bound` seconds."""
    deadline = time.monotonic() + bound
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise Failure(f"{what}: not after {bound} s")
        time.sleep(step)


_libc = ctypes.CDLL(None, use_errno=True)


def set_subreaper():
    """Makes this process the subreaper of everything it starts (the shims daemonize)."""
    if _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise Failure(f"prctl(PR_SET_CHILD_SUBREAPER): errno {ctypes.get_errno()}")


def enter_own_netns():
    """Moves this (still single-threaded) process into a new network namespace with lo up, and
    checks that it is not the one it was in. Everything it starts later inherits it."""
    outer = os.readlink("/proc/self/ns/net")
    if _libc.unshare(CLONE_NEWNET) != 0 or os.readlink("/proc/self/ns/net") == outer:
        raise Failure(f"unshare(CLONE_NEWNET): errno {ctypes.get_errno()}")
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True, timeout=BOUND)
    return os.readlink("/proc/self/ns/net")


def reap_children():
    """Reaps every exited child (and reparented orphan) without waiting."""
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return


def descendants():
    """[(pid, cmd)] of every live process below this one (a subreaper's view), zombies excluded."""
    me, kids = os.getpid(), {}
    procs = list(processes())
    for p in procs:
        kids.setdefault(p.ppid, []).append(p)
    out, todo = [], [me]
    while todo:
        for p in kids.get(todo.pop(), []):
            if p.state != "Z":
                out.append((p.pid, p.cmd))
            todo.append(p.pid)
    return out


def cgroup_mounts():
    """The mount points of this machine's cgroup hierarchies (v1 controllers and v2), from
    /proc/self/mountinfo."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            pre, _, post = line.partition(" - ")
            if post.split()[0] in ("cgroup", "cgroup2"):
                out.append(pre.split()[4])
    return out


def busybox_root(d):
    """A root for the busybox image: /bin/busybox and its applets, /www/index.html (PAGE), /tmp."""
    os.makedirs(os.path.join(d, "bin"))
    shutil.copy("/bin/busybox", os.path.join(d, "bin", "busybox"))
    for a in BUSYBOX_APPLETS:
        os.symlink("busybox", os.path.join(d, "bin", a))
    os.makedirs(os.path.join(d, "www"))
    with open(os.path.join(d, "www", "index.html"), "w") as f:
        f.write(PAGE + "\n")
    os.makedirs(os.path.join(d, "tmp"), mode=0o1777)
    return d


def pause_root(d):
    """A root for the pod sandbox image: Debian's static catatonit as /pause (run as `-P`: pause
    mode, no program, reaps orphans, ends on SIGTERM/SIGINT; what Kubernetes' pause does) and
    nothing else, as Kubernetes' own pause image: CRI runs it with a read-only root, so the
    runtime makes the mount points (runc does; ours: host/shim/mount_points.hpp)."""
    os.makedirs(d)
    shutil.copy(shutil.which("catatonit") or "/usr/bin/catatonit", os.path.join(d, "pause"))
    return d


class CriDaemon:
    """The private containerd (see the module's doc). `shim`: containerd-shim-nesinit-v2's path
    to register the `nesinit` handler (None: runc only); `env`: extra environment for the daemon
    and so the shims (NESHOST, NESHOST_INITRD...). The caller has called set_subreaper() and
    enter_own_netns(). Attributes: tmp, sock, cri (a Cri client), log (containerd's log)."""

    def __init__(self, shim=None, env=None, debug=False):
        self.tmp = tempfile.mkdtemp(prefix="nescri-", dir="/tmp")
        # Every pod's cgroups go under this parent (PodSandboxConfig.linux.cgroup_parent), made
        # by runc in the machine's hierarchies and removed by close(): without one, containerd
        # puts them under /k8s.io, a directory nothing removes.
        self.cgroup_parent = "/" + os.path.basename(self.tmp)
        self.proc = None
        self.cri = None
        try:
            self._setup(shim, env or {}, debug)
        except BaseException:
            self.close()
            self.remove()
            raise

    def _setup(self, shim, env, debug):
        t = self.tmp
        self.sock = os.path.join(t, "c.sock")
        self.log = os.path.join(t, "containerd.log")
        self.pods_dir = os.path.join(t, "pods")  # the pods' log_directory
        os.makedirs(self.pods_dir)
        self.bin = os.path.join(t, "bin")
        os.mkdir(self.bin)
        if shim:
            os.symlink(os.path.abspath(shim), os.path.join(self.bin, "containerd-shim-nesinit-v2"))
        self.cni_conf = os.path.join(t, "cni")
        os.mkdir(self.cni_conf)
        self.ipam_dir = os.path.join(t, "ipam")
        with open(os.path.join(self.cni_conf, "10-nescri.conflist"), "w") as f:
            json.dump({"cniVersion": "1.0.0", "name": "nescri", "plugins": [{
                "type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False, "hairpinMode": True,
                "ipam": {"type": "host-local", "dataDir": self.ipam_dir,
                         "ranges": [[{"subnet": POD_SUBNET, "gateway": POD_GATEWAY}]],
                         "routes": [{"dst": "0.0.0.0/0"}]}}]}, f)
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        runtimes = f'[{cri}.containerd.runtimes.runc]\n  runtime_type = "io.containerd.runc.v2"\n' \
                   f'[{cri}.containerd.runtimes.runc.options]\n  Root = "{t}/runc"\n'
        if shim:
            runtimes += f'[{cri}.containerd.runtimes.nesinit]\n  runtime_type = "io.containerd.nesinit.v2"\n'
        self.cfg = os.path.join(t, "config.toml")
        with open(self.cfg, "w") as f:
            f.write(f'version = 2\nroot = "{t}/root"\nstate = "{t}/state"\n'
                    f'[grpc]\n  address = "{self.sock}"\n[ttrpc]\n  address = "{self.sock}.ttrpc"\n'
                    f'[debug]\n  level = "{"debug" if debug else "info"}"\n'
                    f'[{cri}]\n  sandbox_image = "{PAUSE_IMAGE}"\n  netns_mounts_under_state_dir = true\n'
                    f'  disable_apparmor = true\n  restrict_oom_score_adj = true\n  stream_server_address = "127.0.0.1"\n  stream_server_port = "0"\n'
                    f'[{cri}.cni]\n  bin_dir = "/usr/lib/cni"\n  conf_dir = "{self.cni_conf}"\n  max_conf_num = 1\n'
                    f'[{cri}.containerd]\n  snapshotter = "overlayfs"\n  default_runtime_name = "runc"\n'
                    + runtimes)
        self.env = dict(os.environ, PATH=self.bin + ":" + os.environ.get("PATH", "/usr/bin:/bin"),
                        TMPDIR=t, XDG_RUNTIME_DIR=t, NESHOST_NETWORK="none", **env)
        logf = open(self.log, "ab")
        # The daemon's own mount namespace, /run and /var/lib fresh tmpfs in it (module doc).
        script = ("set -e; mount -n -t tmpfs -o mode=0755,size=64m nescri-run /run; mkdir -p /run/containerd; "
                  "mount -n -t tmpfs -o mode=0755,size=16m nescri-varlib /var/lib; mkdir -p /var/lib/cni; "
                  'exec containerd --config "$0"')
        self.proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script,
                                      self.cfg], stdout=logf, stderr=logf, stdin=subprocess.DEVNULL, env=self.env)
        logf.close()
        until(lambda: self.proc.poll() is not None or self.ctr("version", check_rc=False)[0] == 0,
              "containerd answering")
        check(self.proc.poll() is None, f"containerd exited {self.proc.returncode}{self.tail()}")
        self.cri = Cri(self.sock)
        until(lambda: self._cri_ready(), "the CRI plugin ready")

    def _cri_ready(self):
        try:
            st = self.cri.Status(deadline=5)
        except Exception:  # noqa: BLE001 — not serving yet
            return False
        return any(c.type == "RuntimeReady" and c.status for c in st.status.conditions)

    # ---- images ----

    def import_images(self):
        """Builds the busybox image and the pause image (module doc) and imports both into
        namespace k8s.io under their exact names; checks that CRI sees them."""
        for ref, root, kw in ((BUSYBOX_IMAGE, busybox_root(os.path.join(self.tmp, "img-busybox")), {}),
                              (PAUSE_IMAGE, pause_root(os.path.join(self.tmp, "img-pause")),
                               {"cmd": (), "entrypoint": ("/pause", "-P")})):
            tarball = os.path.join(self.tmp, ref.split("/")[-1].replace(":", "-") + ".tar")
            oci_archive(tarball, root, ref, **kw)
            self.ctr("-n", NS, "images", "import", tarball)
            os.unlink(tarball)
            st = self.cri.ImageStatus(image=self.cri.pb.ImageSpec(image=ref))
            check(st.image.id, f"CRI does not see the imported image {ref}{self.tail()}")

    # ---- ctr, logs ----

    def ctr(self, *args, check_rc=True, timeout=BOUND):
        """Runs `ctr --address SOCK ARGS`; (exit status, stdout, stderr)."""
        r = subprocess.run(["ctr", "--address", self.sock, *args], capture_output=True, timeout=timeout,
                           env=self.env, stdin=subprocess.DEVNULL)
        out, err = r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")
        if check_rc and r.returncode != 0:
            raise Failure(f"ctr {' '.join(args)}: exit {r.returncode}: {err}{self.tail()}")
        return r.returncode, out, err

    def tail(self, n=40):
        try:
            with open(self.log, errors="replace") as f:
                return "\ncontainerd log (tail):\n" + "".join(f.readlines()[-n:])
        except OSError:
            return ""

    # ---- what is left ----

    def daemon_root(self, path):
        """`path` as the daemon's mount namespace sees it (/proc/PID/root/...)."""
        return f"/proc/{self.proc.pid}/root{path}"

    def audit(self):
        """Everything a removed pod may have left, as a list of strings (empty: nothing): CRI's
        pods and containers, containerd's tasks and containers in k8s.io, processes other than the
        daemon itself (shims, pause, workloads, QEMU, virtiofsd), shim sockets, mounts in the
        daemon's namespace under our dir and under /run (snapshots, rootfs, netns), pod network
        namespaces, veths in our namespace, the pods' cgroups, IP reservations in host-local's
        store."""
        left = []
        if self.cri:
            pods = self.cri.ListPodSandbox().items
            left += [f"pod {p.metadata.name} ({p.id[:12]}) {self.cri.pb.PodSandboxState.Name(p.state)}" for p in pods]
            ctrs = self.cri.ListContainers().containers
            left += [f"container {c.metadata.name} ({c.id[:12]})" for c in ctrs]
        if self.proc and self.proc.poll() is None:
            for what in ("tasks", "containers"):
                _, out, _ = self.ctr("-n", NS, what, "ls", "-q", check_rc=False)
                left += [f"ctr {what}: {x}" for x in out.split()]
            left += [f"process {pid}: {cmd}" for pid, cmd in descendants() if pid != self.proc.pid]
            try:
                socks = os.listdir(self.daemon_root("/run/containerd/s"))
            except FileNotFoundError:
                socks = []
            left += [f"shim socket /run/containerd/s/{s}" for s in socks]
            # containerd-shim-nesinit-v2's: beside containerd's socket (docs/containerd.md).
            ours = os.path.join(self.tmp, "s")
            left += [f"shim socket {ours}/{s}" for s in (os.listdir(ours) if os.path.isdir(ours) else [])]
            try:
                with open(f"/proc/{self.proc.pid}/mountinfo") as f:
                    for line in f:
                        mp = line.split()[4]
                        if (mp.startswith(self.tmp) or mp.startswith("/run/") or mp.startswith("/var/lib/")) \
                                and mp not in ("/run", "/var/lib"):
                            left.append(f"mount {mp}")
            except OSError as e:
                left.append(f"mountinfo of the daemon: {e}")
        netns_dir = os.path.join(self.tmp, "state", "io.containerd.grpc.v1.cri", "netns")
        if os.path.isdir(netns_dir):
            left += [f"pod netns {n}" for n in os.listdir(netns_dir)]
        links = subprocess.run(["ip", "-o", "link", "show", "type", "veth"], capture_output=True, text=True,
                               timeout=BOUND).stdout
        left += [f"veth {l.split(':')[1].strip()}" for l in links.splitlines() if l.strip()]
        for m in cgroup_mounts():
            parent = m + self.cgroup_parent
            if os.path.isdir(parent):
                left += [f"cgroup {parent}/{c}" for c in os.listdir(parent) if os.path.isdir(os.path.join(parent, c))]
        net_store = os.path.join(self.ipam_dir, "nescri")
        if os.path.isdir(net_store):
            left += [f"IP reserved {n}" for n in os.listdir(net_store) if n[0].isdigit()]
        return left

    # ---- the end ----

    def close(self):
        """Every pod stopped and removed through CRI (bounded), then the daemon stopped
        (SIGTERM, SIGKILL after 20 s), then everything it left reaped: what is still alive 30 s
        later is SIGKILLed and reported (returned as a list of strings)."""
        problems = []
        try:
            if self.cri and self.proc and self.proc.poll() is None:
                for p in self.cri.ListPodSandbox(deadline=30).items:
                    try:
                        self.cri.StopPodSandbox(pod_sandbox_id=p.id, deadline=60)
                        self.cri.RemovePodSandbox(pod_sandbox_id=p.id, deadline=60)
                    except Exception as e:  # noqa: BLE001 — keep closing the rest
                        problems.append(f"removing pod {p.id[:12]}: {e}")
        except Exception as e:  # noqa: BLE001
            problems.append(f"listing pods: {e}")
        if self.cri:
            self.cri.close()
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        try:
            until(lambda: not descendants(), "the daemon's descendants gone", bound=30)
        except Failure:
            for pid, cmd in descendants():
                problems.append(f"left running: {pid} {cmd}")
                try:
                    os.kill(pid, 9)
                except OSError:
                    pass
        reap_children()
        # The pods' cgroup parent, in every hierarchy (children first; rmdir of an empty cgroup).
        for m in cgroup_mounts():
            parent = m + self.cgroup_parent
            if not os.path.isdir(parent):
                continue
            for root, dirs, _ in os.walk(parent, topdown=False):
                for c in dirs:
                    try:
                        os.rmdir(os.path.join(root, c))
                    except OSError as e:
                        problems.append(f"cgroup {os.path.join(root, c)}: {e}")
            try:
                os.rmdir(parent)
            except OSError as e:
                problems.append(f"cgroup {parent}: {e}")
        return problems

    def remove(self):
        """Removes the temp dir (after close(): nothing can still write into it)."""
        shutil.rmtree(self.tmp, ignore_errors=True)
