#!/usr/bin/env python3
"""P10: the VM's network, side by side in one invocation (scripts/bench.sh runs it; not a test).
Prints markdown rows for bench/results/latest.md.

Each round boots two microVMs (TCG) with `neshost run`, one per user-mode backend, alternating
which goes first: `--network user` (passt, the default) and `--network slirp` (QEMU's libslirp), both with
`--add-host hostsvc:host-gateway`. In each VM the workload runs tests/vm's net_probe (shared
read-only at /probe), which times itself in the guest (CLOCK_MONOTONIC):
  tcp   `net_probe send 10.0.2.2 P MIB`: MIB MiB of zeros in 64 KiB writes guest -> host over TCP
        to a sink on the host's 127.0.0.1 that counts every byte; timed from connect to the sink's
        EOF after the guest's shutdown (everything arrived);
  down  `net_probe recv 10.0.2.2 P`: MIB MiB host -> guest over TCP from a source on the host's
        127.0.0.1 that sends them and closes; timed from connect to EOF (the guest has them all);
  chan  `net_probe write MIB`: the same writes to the workload's stdout, the data channel (init ->
        virtio port -> neshost run -> this script, which counts every byte); timed to the last
        write's return;
  conn  `net_probe connects 10.0.2.2 P N`: N TCP connects guest -> host (connect(2)'s time, the
        median of the N), each accepted and closed by the host.
(Not `dd | nc`: busybox nc reads a pipe at ~4 MiB/s under TCG, for either backend, so it timed nc.)
tcp and chan alternate order between rounds. Medians over rounds; ratios passt/slirp and
network/data channel. The whole run is in a network namespace of its own (tests/support/netns.py).
Usage: p10_network.py NESHOST NET_PROBE [MIB [ROUNDS [CONNECTS]]]   (defaults 64, 3, 100)
"""
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "support"))
import netns  # noqa: E402

class Server:
    """A TCP server on 127.0.0.1 (`port`): one thread accepts and calls handle(conn) per connection,
    one at a time; close() stops it."""

    def __init__(self):
        self.s = socket.socket()
        self.s.bind(("127.0.0.1", 0))
        self.s.listen(128)
        self.port = self.s.getsockname()[1]
        self.t = threading.Thread(target=self._serve, daemon=True)
        self.t.start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.s.accept()
            except OSError:
                return
            with conn:
                self.handle(conn)

    def close(self):
        try:
            self.s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.t.join(30)
        self.s.close()


class Sink(Server):
    """Counts each connection's bytes to EOF (`counts`)."""

    def __init__(self):
        self.counts = []
        super().__init__()

    def handle(self, conn):
        n = 0
        while True:
            b = conn.recv(1 << 20)
            if not b:
                break
            n += len(b)
        self.counts.append(n)


class Source(Server):
    """Sends each connection `size` zero bytes, then closes it."""

    def __init__(self, size):
        self.size = size
        super().__init__()

    def handle(self, conn):
        chunk = bytes(1 << 20)
        try:
            for _ in range(self.size // len(chunk)):
                conn.sendall(chunk)
        except OSError:
            pass


# The keys below name the backends; `neshost run --network` calls passt `user` and QEMU's slirp `slirp`.
CLI_MODE = {"user": "user", "slirp": "slirp"}

def workload(mib, n, port, src_port, tcp_first):
    steps = ["/probe/net_probe send 10.0.2.2 %d %d" % (port, mib), "/probe/net_probe recv 10.0.2.2 %d" % src_port,
             "/probe/net_probe write %d" % mib]
    steps = steps if tcp_first else steps[::-1]
    return " && ".join(steps + ["/probe/net_probe connects 10.0.2.2 %d %d >&2" % (port, n)])


def one_vm(nh, tmp, backend, mib, n, tcp_first):
    sink, source = Sink(), Source(mib << 20)
    env = dict(os.environ, TMPDIR=os.path.join(tmp, "rt"), XDG_RUNTIME_DIR=tmp)
    os.makedirs(env["TMPDIR"], exist_ok=True)
    argv = [nh, "run", "--accel", "tcg", "--ready-timeout", "300", "--state", os.path.join(tmp, "state"),
            "--rm", "--network", CLI_MODE[backend], "--add-host", "hostsvc:host-gateway",
            "-v", os.path.join(tmp, "probe") + ":/probe:ro", "--", "/bin/sh", "-c",
            workload(mib, n, sink.port, source.port, tcp_first)]
    try:
        p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        err = []
        t = threading.Thread(target=lambda: err.append(p.stderr.read()), daemon=True)
        t.start()
        got = 0
        while True:
            b = p.stdout.read1(1 << 20)
            if not b:
                break
            got += len(b)
        rc = p.wait(timeout=900)
        t.join(60)
    finally:
        sink.close()
        source.close()
    text = b"".join(err).decode(errors="replace")
    names = {"send": "tcp", "recv": "down", "write": "chan"}
    times = {names[k]: int(v) for k, v in re.findall(r"(send|write) \d+ ms (\d+)", text)}
    down = re.search(r"recv (\d+) ms (\d+)", text)
    if down and int(down.group(1)) == mib << 20:  # only a whole download is timed
        times["down"] = int(down.group(2))
    m = re.search(r"connects (\d+) median_us (\d+) mean_us (\d+)", text)
    if rc != 0 or got != mib << 20 or (mib << 20) not in sink.counts or len(times) != 3 or not m:
        raise SystemExit(f"p10 {backend}: exit {rc}, stdout {got} bytes, the sink got {sink.counts[:3]}..., "
                         f"stderr tail:\n{text[-2000:]}")
    secs = {k: max(v, 1) / 1000 for k, v in times.items()}
    return {"tcp": mib / secs["tcp"], "down": mib / secs["down"], "chan": mib / secs["chan"], "conn_us": int(m.group(2)),
            "conn_mean_us": int(m.group(3))}


def passt_version():
    """The version of the passt `neshost run` starts (NESHOST_PASST, else the fetched one)."""
    top = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    prog = os.environ.get("NESHOST_PASST") or os.path.join(top, ".cache", "passt", "passt")
    try:
        out = subprocess.run([prog, "--version"], capture_output=True, text=True, timeout=30).stdout
        return out.split("\n")[0].replace("passt ", "")
    except OSError:
        return "?"


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    netns.isolate()  # from here on in a namespace of our own (the machine's stays untouched)
    nh, probe = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    mib = int(sys.argv[3]) if len(sys.argv) > 3 else 64
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    n = int(sys.argv[5]) if len(sys.argv) > 5 else 100
    tmp = tempfile.mkdtemp(prefix="nes-p10.")
    res = {"user": [], "slirp": []}
    try:
        os.mkdir(os.path.join(tmp, "probe"))
        shutil.copy(probe, os.path.join(tmp, "probe", "net_probe"))
        for r in range(rounds):
            order = ["user", "slirp"] if r % 2 == 0 else ["slirp", "user"]
            for b in order:
                res[b].append(one_vm(nh, tmp, b, mib, n, tcp_first=(r % 2 == 0)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    def med(b, k):
        return statistics.median(x[k] for x in res[b])

    def rng(b, k, f="{:.0f}"):
        xs = [x[k] for x in res[b]]
        return f"{f.format(min(xs))}-{f.format(max(xs))}"

    pu, ps, cu, cs = med("user", "tcp"), med("slirp", "tcp"), med("user", "chan"), med("slirp", "chan")
    du, ds = med("user", "down"), med("slirp", "down")
    lu, ls = med("user", "conn_us"), med("slirp", "conn_us")
    what = f"{mib} MiB guest → host in 64 KiB writes (net_probe; median of {rounds}, alternating, guest clock)"
    rows = [
        f"| P10 TCP {what}, `--network user` (passt {passt_version()}; {rng('user', 'tcp')}) to the host's "
        f"127.0.0.1 via host-gateway | MiB/s | {pu:.1f} | `--network slirp` (QEMU's libslirp; {rng('slirp', 'tcp')}) | "
        f"{ps:.1f} | {pu / ps:.2f} |",
        f"| P10 TCP {mib} MiB host → guest (net_probe recv: connect to EOF, whole downloads only; median of {rounds}), "
        f"`--network user` (passt; {rng('user', 'down')}) | MiB/s | {du:.1f} | `--network slirp` "
        f"({rng('slirp', 'down')}) | {ds:.1f} | {du / ds:.2f} |",
        f"| P10 TCP {what}, passt | MiB/s | {pu:.1f} | the data channel in the same VM: the workload's stdout "
        f"read by the host ({rng('user', 'chan')}) | {cu:.1f} | {pu / cu:.2f} |",
        f"| P10 TCP {what}, slirp | MiB/s | {ps:.1f} | the data channel in the same VM ({rng('slirp', 'chan')}) | "
        f"{cs:.1f} | {ps / cs:.2f} |",
        f"| P10 TCP connect set-up guest → host, {n} connects per VM (connect(2) in the guest, median; median of "
        f"{rounds} VMs; passt {rng('user', 'conn_us')}, means {rng('user', 'conn_mean_us')}), passt | µs | {lu:.0f} | "
        f"slirp ({rng('slirp', 'conn_us')}, means {rng('slirp', 'conn_mean_us')}) | {ls:.0f} | {lu / ls:.2f} |",
    ]
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
