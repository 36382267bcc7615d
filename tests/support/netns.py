"""A fresh network namespace for one test process (the VM network tests and bench P10): a VM with
a NIC runs only inside a namespace its test made, never in the machine's own.

isolate() re-executes the calling program (sys.argv) under `unshare --net`, so the whole test
process, and everything it starts (neshost, QEMU, passt, servers), lives in a namespace made for
it and gone when the last of them exits: no `ip netns add` (that would mount under the machine's
/run/netns), nothing configured in the machine's namespace. Inside, lo is up and a veth pair
(both ends inside) carries 198.51.100.1/24 (TEST-NET-2) with the default route through its peer
198.51.100.2: passt refuses to start without a routable interface, and with this one it starts
while nothing can leave the machine (the peer end is a dead end in the same namespace).

NetnsHolder is the other shape, for a test that needs several namespaces side by side (the
`netns:PATH` cases of tests/vm/vm_test.py and tests/shim/containerd_test.py): each one held by a
process the test starts and ends, named /proc/PID/ns/net.
"""
import os
import subprocess
import sys
import time

_MARK = "NES_TEST_NETNS_PARENT"  # the parent's namespace (readlink /proc/self/ns/net) in the child
VETH, VETH_PEER = "nes-veth0", "nes-veth1"
VETH_ADDR, VETH_GATEWAY = "198.51.100.1/24", "198.51.100.2"


def _ns():
    return os.readlink("/proc/self/ns/net")


def _ip(*args):
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")


def _configure():
    """Inside the new namespace: lo up, the veth pair, its address and the default route."""
    _ip("link", "set", "lo", "up")
    _ip("link", "add", VETH, "type", "veth", "peer", "name", VETH_PEER)
    _ip("addr", "add", VETH_ADDR, "dev", VETH)
    _ip("link", "set", VETH, "up")
    _ip("link", "set", VETH_PEER, "up")
    _ip("route", "add", "default", "via", VETH_GATEWAY, "dev", VETH)


def isolate():
    """Makes the caller run in a network namespace of its own. In the machine's namespace (the
    first call): runs `unshare --net` on this same program and arguments and exits with its status
    (never returns). In the re-executed child: checks that its namespace is not its parent's (the
    one the test was started in; a RuntimeError if it is: nothing may run there), configures it
    (see the module's doc) and returns. Needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN) and `ip`."""
    parent = os.environ.get(_MARK)
    if parent is None:
        env = dict(os.environ, **{_MARK: _ns()})
        sys.stdout.flush()
        sys.stderr.flush()
        # unshare execs the program (no --fork): the child's parent is this process, which waits.
        rc = subprocess.run(["unshare", "--net", "--", sys.executable, *sys.argv], env=env).returncode
        sys.exit(rc if rc >= 0 else 128 - rc)
    del os.environ[_MARK]  # a grandchild that isolates itself again gets its own namespace
    here = _ns()
    if here == parent or here == os.readlink(f"/proc/{os.getppid()}/ns/net"):
        raise RuntimeError(f"netns: still in the parent's network namespace ({here})")
    _configure()


class NetnsHolder:
    """A network namespace held by `unshare --net` running `cat` on a pipe (EOF ends it), with lo
    up: named /proc/PID/ns/net (`path`; `p` is the holder, `p.pid` names it to `ip ... netns`),
    never `ip netns add` (that mounts under the machine's /run/netns). close() ends it (reaped).
    Every failure raises `error` (a subclass sets its test's own failure type) with what failed.
    `bound`: seconds any one step may take."""

    error = RuntimeError

    def __init__(self, bound=120):
        self.bound = bound
        self.p = subprocess.Popen(["unshare", "--net", "--", "cat"], stdin=subprocess.PIPE,
                                  stdout=subprocess.DEVNULL)
        self.path = f"/proc/{self.p.pid}/ns/net"
        # unshare execs cat only once the namespace exists: poll until the pid's namespace differs
        # (a state, bounded), or it exited.
        deadline = time.monotonic() + bound
        while self.p.poll() is None and os.readlink(self.path) == _ns():
            if time.monotonic() > deadline:
                self.close()
                raise self.error(f"the holder's namespace: not made after {bound} s")
            time.sleep(0.01)
        if self.p.poll() is not None:
            raise self.error(f"unshare --net failed (exit {self.p.returncode})")
        self.sh("ip link set lo up")

    def sh(self, cmd, check_rc=True):
        """Runs `sh -c CMD` in the namespace; its stdout. check_rc: a non-zero exit raises `error`."""
        r = subprocess.run(["nsenter", f"--net={self.path}", "sh", "-c", cmd], capture_output=True, text=True,
                           timeout=self.bound)
        if check_rc and r.returncode != 0:
            raise self.error(f"in {self.path}: {cmd}: {r.returncode} {r.stderr}")
        return r.stdout

    def close(self):
        """Ends the holder (EOF on its stdin; SIGKILL after 10 s) and reaps it. Idempotent."""
        if self.p.poll() is None:
            self.p.stdin.close()
            try:
                self.p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
