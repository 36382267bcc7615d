#!/usr/bin/env python3
"""neshost CLI end to end: serve/wait/inspect against scripted fake guests over Unix sockets.

Every process is bounded by a timeout and reaped; every temp dir removed. No sleeps: readiness is
the `listening` event line serve prints; `wait` blocks on inotify.
usage: cli_test.py NESHOST_BIN
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import check, finish, need_sandbox, skip  # noqa: E402

NESHOST = sys.argv[1]
def run(args, timeout=30, **kw):
    return subprocess.run([NESHOST] + args, capture_output=True, text=True, timeout=timeout, **kw)


DESC = {"exec": {"argv": ["/bin/sh", "-c", "exit 3"], "env": {}, "uid": 0, "gid": 0},
        "geometry": {"width": 1, "height": 1, "fps": 1}, "on_exit": {"terminal": True}}


class Serve:
    """`neshost serve` in the background; waits for its `listening` line."""

    def __init__(self, tmp, extra=(), vm="vm0", sock=None):
        self.sock = sock or os.path.join(tmp, "s", vm + ".sock")
        desc = os.path.join(tmp, "desc.json")
        with open(desc, "w") as f:
            json.dump(DESC, f, indent=2)  # pretty-printed on purpose
        self.state = os.path.join(tmp, "state")
        self.p = subprocess.Popen([NESHOST, "serve", "--listen", "unix:" + self.sock, "--descriptor", desc,
                                   "--state", self.state, "--vm", vm] + list(extra),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines = []
        for line in self.p.stdout:
            self.lines.append(line.rstrip("\n"))
            if " listening " in line:
                break

    def finish(self, timeout=30):
        try:
            out, err = self.p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            out, err = self.p.communicate()
            check(False, "serve did not finish")
        self.lines += out.splitlines()
        self.err = err
        return self.p.returncode

    def __del__(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()


def guest(path, lines, expect=("boot",), then=(), read_after=()):
    """Connect, send `lines`, read one line per `expect` type, send `then`, read `read_after`."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(20)
    s.connect(path)
    f = s.makefile("rb")
    got = []
    s.sendall("".join(l + "\n" for l in lines).encode())
    for t in expect:
        line = f.readline()
        got.append(line)
        check(json.loads(line)["type"] == t, "expected %s, got %r" % (t, line))
    # Nothing to send is not a send: after a refused version the host may already have closed,
    # and even an empty send on a closed Unix socket fails with EPIPE.
    if then:
        s.sendall("".join(l + "\n" for l in then).encode())
    for t in read_after:
        line = f.readline()
        got.append(line)
        check(line and json.loads(line)["type"] == t, "expected %s after, got %r" % (t, line))
    s.close()
    return got


READY = '{"type":"ready","protocol_version":2}'


def test_help_and_usage():
    for args in (["--help"], ["serve", "--help"], ["wait", "--help"], ["inspect", "--help"]):
        r = run(args)
        check(r.returncode == 0 and "usage" in r.stdout, "help %s" % args)
    cases = [
        (["serve", "--bogus"], "--bogus"),
        (["serve", "--listen", "tcp:1", "--descriptor", "x", "--state", "y"], "--listen"),
        (["serve", "--descriptor", "x", "--state", "y"], "--listen"),
        (["serve", "--listen", "unix:/tmp/x", "--descriptor", "/nonexistent", "--state", "y"], "--descriptor"),
        (["serve", "--listen", "unix:/tmp/x", "--descriptor", "x", "--state", "y", "--on-exit", "maybe"], "--on-exit"),
        (["serve", "--listen", "unix:/tmp/x", "--descriptor", "x", "--state", "y", "--timeout", "-1"], "--timeout"),
        (["serve", "--listen", "unix:/" + "a" * 120, "--descriptor", "x", "--state", "y"], "sun_path"),
        (["serve", "--listen", "vsock:7000", "--descriptor", "x", "--state", "y"], "--cid"),
        (["serve", "--listen", "unix:/tmp/x", "--descriptor", "x", "--state", "y", "--vm", "../etc"], "--vm"),
        (["serve", "--listen"], "--listen needs a value"),
        (["wait", "--state", "/tmp"], "VM is required"),
        (["wait", "--state", "/tmp", "--timeout", "abc", "vm"], "--timeout"),
        (["inspect", "--bogus", "vm"], "--bogus"),
        (["exec", "-ix", "vm", "sh"], "unknown flag -ix"),
        (["exec", "-e", "=novalue", "vm", "sh"], "--env: expected K=V"),
        (["exec", "-w", "rel", "vm", "sh"], "--workdir"),
        (["exec", "vm"], "ARGV is required"),
        (["exec", "vm", "--"], "ARGV is required"),
        (["exec", "-u"], "--user needs a value"),
        (["logs", "-n"], "--tail needs a value"),
        (["logs", "-x", "vm"], "unknown flag -x"),
        (["kill", "-s"], "--signal needs a value"),
        (["nonsense"], "unknown command"),
        ([], "usage"),
    ]
    for args, needle in cases:
        r = run(args)
        check(r.returncode == 125, "exit 125 for %s (got %d)" % (args, r.returncode))
        check(needle in r.stderr + r.stdout, "%r names %r: %r" % (args, needle, r.stderr))


def test_serve_exit_code_then_wait_inspect_from_new_processes():
    with tempfile.TemporaryDirectory(prefix="nesh-") as tmp:
        state = os.path.join(tmp, "state")
        os.makedirs(state)
        # A waiter started before the outcome exists.
        waiter = subprocess.Popen([NESHOST, "wait", "--state", state, "--timeout", "60", "vm0"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        sv = Serve(tmp)
        got = guest(sv.sock, [READY], ("boot",), ['{"type":"started","pid":9}', '{"type":"workload_exited","exit_code":3}'],
                    ("shutdown",))
        boot = json.loads(got[0])
        check(boot["exec"]["argv"] == ["/bin/sh", "-c", "exit 3"], "descriptor sent")
        check(boot["on_exit"]["terminal"] is True, "terminal from policy stop")
        rc = sv.finish()
        check(rc == 3, "serve exits with the workload's code (got %d)" % rc)
        kinds = [l.split(" ")[1] for l in sv.lines]
        for k in ("listening", "connected", "ready", "boot_sent", "started", "outcome", "recorded",
                  "shutdown_sent", "finished"):
            check(k in kinds, "event %s printed" % k)
        check(not os.path.exists(sv.sock), "socket removed at the end")
        try:
            out, err = waiter.communicate(timeout=30)
        finally:
            if waiter.poll() is None:
                waiter.kill()
                waiter.wait()
        check(waiter.returncode == 3 and out.strip() == "3", "wait before: %d %r %r" % (waiter.returncode, out, err))
        r = run(["wait", "--state", state, "vm0"])
        check(r.returncode == 3 and r.stdout.strip() == "3", "wait after, fresh process")
        r = run(["inspect", "--state", state, "vm0"])
        check(r.returncode == 0, "inspect")
        rec = json.loads(r.stdout)
        check(list(rec) == ["schema_version", "vm", "generation", "outcome", "exit_code", "signal", "exit_status",
                            "reason", "started_at", "finished_at", "status", "status_reason", "monitor_pid",
                            "monitor_alive", "stop_requested", "vmm_pid", "vmm_alive", "paused"], "record fields %s" % list(rec))
        check((rec["status"], rec["monitor_pid"], rec["stop_requested"]) == ("exited", None, False),
              "serve has no monitor file; the record alone reconciles as exited: %s" % rec)
        check(rec["outcome"] == "exited" and rec["exit_code"] == 3 and rec["signal"] is None and rec["exit_status"] == 3,
              "record values %s" % rec)
        check(rec["started_at"].endswith("Z") and len(rec["started_at"]) == 30, "RFC 3339 ns")
        r = run(["inspect", "--state", state, "other"])
        check(r.returncode == 1 and "no outcome" in r.stderr, "inspect missing")
        r = run(["wait", "--state", state, "--timeout", "0.2", "other"])
        check(r.returncode == 124, "wait --timeout gives 124 (got %d)" % r.returncode)


def serve_case(extra, lines, then, expect_rc, expect_outcome, read_after=("shutdown",), expect=("boot",)):
    with tempfile.TemporaryDirectory(prefix="nesh-") as tmp:
        sv = Serve(tmp, extra)
        if lines is not None:
            guest(sv.sock, lines, expect, then, read_after)
        rc = sv.finish()
        check(rc == expect_rc, "%s: exit %d, want %d (%s)" % (expect_outcome, rc, expect_rc, sv.err))
        r = run(["inspect", "--state", sv.state, "vm0"])
        rec = json.loads(r.stdout) if r.returncode == 0 else {}
        check(rec.get("outcome") == expect_outcome, "%s recorded: %s" % (expect_outcome, rec))
        return sv, rec


def test_outcomes_and_statuses():
    serve_case([], [READY], ['{"type":"workload_exited","signal":9}'], 137, "signalled")
    serve_case([], [READY], ['{"type":"start_failed","reason":"nope","errno":2,"class":"not_found"}'], 127, "start_failed")
    serve_case([], [READY], ['{"type":"mount_failed","tag":"w","reason":"x","errno":19}'], 125, "mount_failed")
    serve_case(["--ready-timeout", "0.2", "--stop-timeout", "0.2"], None, [], 125, "no_ready")
    serve_case([], ['{"type":"ready","protocol_version":1}'], [], 125, "version_mismatch", (), ())
    serve_case([], [READY], ["not json"], 125, "protocol_error", ())
    # The wall limit ends a running workload with `stop` first (then grace, then shutdown).
    serve_case(["--timeout", "1.5"], [READY], ['{"type":"started","pid":2}'], 124, "timeout", ("stop",))
    sv, rec = serve_case(["--generation", "9"], [READY], ['{"type":"workload_exited","exit_code":0}'], 0, "exited")
    check(rec.get("generation") == 9, "--generation recorded")


def test_keep_until_sigterm():
    with tempfile.TemporaryDirectory(prefix="nesh-") as tmp:
        sv = Serve(tmp, ["--on-exit", "keep"])
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(20)
        s.connect(sv.sock)
        f = s.makefile("rb")
        s.sendall((READY + "\n").encode())
        boot = json.loads(f.readline())
        check(boot["on_exit"]["terminal"] is False, "keep: terminal=false overrides the descriptor")
        s.sendall(b'{"type":"workload_exited","exit_code":4}\n')
        for line in sv.p.stdout:  # wait for the `kept` event: the VM stays up
            sv.lines.append(line.rstrip("\n"))
            if " kept " in line or line.split(" ")[1].strip() == "kept":
                break
        sv.p.terminate()  # SIGTERM: shutdown() -> `shutdown` to the guest
        line = f.readline()
        check(json.loads(line)["type"] == "shutdown", "keep: shutdown only after SIGTERM")
        s.close()
        rc = sv.finish()
        check(rc == 4, "keep: exit status 4 (got %d)" % rc)


def test_in_use_is_refused():
    with tempfile.TemporaryDirectory(prefix="nesh-") as tmp:
        sv = Serve(tmp)
        desc = os.path.join(tmp, "desc.json")
        r = run(["serve", "--listen", "unix:" + sv.sock, "--descriptor", desc, "--state", os.path.join(tmp, "st2")])
        check(r.returncode == 125 and "in use" in r.stderr, "live socket not stolen: %d %r" % (r.returncode, r.stderr))
        check(os.path.exists(sv.sock), "the live socket is still there")
        guest(sv.sock, [READY], ("boot",), ['{"type":"workload_exited","exit_code":0}'], ("shutdown",))
        check(sv.finish() == 0, "first serve unaffected")


def test_logs():
    """`neshost logs` over a CRI log written here (rotated file + live one): streams apart and
    byte-exact, P records joined, --tail, --since, --timestamps, -f ending when no run is alive."""
    with tempfile.TemporaryDirectory(prefix="nesh-") as tmp:
        d = os.path.join(tmp, "state", "v1")
        os.makedirs(d)
        with open(os.path.join(d, "workload.log.1"), "w") as f:
            f.write("2025-01-01T00:00:00.000000001Z stdout F old line\n")
            f.write("2025-01-01T00:00:01.5Z stderr F old err\n")
        with open(os.path.join(d, "workload.log"), "w") as f:
            f.write("2025-01-02T00:00:00.000000000Z stdout P par\n")
            f.write("2025-01-02T00:00:00.100000000Z stdout F tial\n")
            f.write("2025-01-02T00:00:01+01:00 stderr F new err\n")
            f.write("2025-01-02T00:00:02.000000000Z stdout P no newline\n")
        st = os.path.join(tmp, "state")
        r = run(["logs", "--state", st, "v1"])
        check(r.returncode == 0 and r.stdout == "old line\npartial\nno newline" and r.stderr == "old err\nnew err\n",
              "logs: %d %r %r" % (r.returncode, r.stdout, r.stderr))
        r = run(["logs", "--state", st, "--tail", "2", "v1"])
        check(r.stdout == "no newline" and r.stderr == "new err\n", "--tail 2: %r %r" % (r.stdout, r.stderr))
        r = run(["logs", "--state", st, "--since", "2025-01-01T23:30:00Z", "v1"])
        check(r.stdout == "partial\nno newline" and r.stderr == "", "--since: %r %r" % (r.stdout, r.stderr))
        r = run(["logs", "--state", st, "-t", "-f", "v1"])  # no live run: -f prints and ends
        check(r.returncode == 0 and r.stdout.startswith("2025-01-01T00:00:00.000000001Z old line\n2025-01-02T00:00:00.000000000Z partial\n"),
              "--timestamps -f: %r" % r.stdout)
        r = run(["logs", "--state", st, "nosuch"])
        check(r.returncode == 1 and "no workload log" in r.stderr, "missing: %d %r" % (r.returncode, r.stderr))
        r = run(["logs", "--state", st, "--since", "later", "v1"])
        check(r.returncode == 125 and "--since" in r.stderr, "bad --since: %d %r" % (r.returncode, r.stderr))


def test_output_lost_in_the_record():
    """A record whose output was lost: wait exits 125 and names each stream; inspect and ps show it."""
    with tempfile.TemporaryDirectory(prefix="nesh-") as tmp:
        state = os.path.join(tmp, "state")
        os.makedirs(os.path.join(state, "vmL"), mode=0o700)
        rec = {"schema_version": 1, "vm": "vmL", "generation": 1, "outcome": "exited", "exit_code": 7,
               "signal": None, "exit_status": 7, "reason": "workload exited with code 7",
               "started_at": "2026-12-02T10:00:00.000000000Z", "finished_at": "2026-12-02T10:00:01.000000000Z",
               "lost": {"stdout": 1234567}, "truncated": {"stderr": 12},
               "lost_reason": "the VM was stopped while its output was still being read"}
        with open(os.path.join(state, "vmL", "outcome.json"), "w") as f:
            f.write(json.dumps(rec, separators=(",", ":")) + "\n")
        r = run(["wait", "--state", state, "vmL"])
        check(r.returncode == 125 and r.stdout.strip() == "125", "wait: 125 when output was lost: %d %r" % (r.returncode, r.stdout))
        check(r.stderr == "neshost wait: 1234567 bytes of stdout lost: the VM was stopped while its output was still being read\n"
                          "neshost wait: stderr truncated: its eof never arrived (12 bytes received)\n",
              "wait names each stream: %r" % r.stderr)
        r = run(["inspect", "--state", state, "vmL"])
        got = json.loads(r.stdout)
        check(got["exit_status"] == 7 and got["lost"] == {"stdout": 1234567} and got["truncated"] == {"stderr": 12}
              and got["lost_reason"].startswith("the VM was stopped"), "inspect shows the record as written: %s" % got)
        check(got["status"] == "exited" and "1234567 bytes of stdout lost" in got["status_reason"],
              "inspect's status_reason says it: %s" % got["status_reason"])
        r = run(["ps", "--state", state, "-a"])
        check("exited (125, output lost)" in r.stdout, "ps -a: %r" % r.stdout)
        # Only truncated (an init that never counts): the record's last field is an object.
        os.makedirs(os.path.join(state, "vmT"), mode=0o700)
        for k in ("lost", "lost_reason"):
            del rec[k]
        rec["vm"] = "vmT"
        with open(os.path.join(state, "vmT", "outcome.json"), "w") as f:
            f.write(json.dumps(rec, separators=(",", ":")) + "\n")
        r = run(["inspect", "--state", state, "vmT"])
        got = json.loads(r.stdout)
        check(got["truncated"] == {"stderr": 12} and got["status"] == "exited", "inspect, truncated only: %s" % got)
        r = run(["wait", "--state", state, "vmT"])
        check(r.returncode == 125 and "stderr truncated" in r.stderr, "wait, truncated only: %d %r" % (r.returncode, r.stderr))


# The way out every passt refusal names (host/vm/passt.cpp).
PASST_WAY_OUT = "scripts/fetch-passt.sh fetches one, or point NESHOST_PASST at one, or use --network slirp|none"


def stand_in(tmp, name, body):
    """An executable sh script tmp/name running `body`; returns its path."""
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        f.write("#!/bin/sh\n" + body + "\n")
    os.chmod(path, 0o755)
    return path


def test_run_network_refusals():
    """Bad network input: exit 125 before anything starts (no state, no runtime dir, no process)."""
    with tempfile.TemporaryDirectory() as tmp:
        state, rt = os.path.join(tmp, "state"), os.path.join(tmp, "rt")
        os.mkdir(rt)
        env = dict(os.environ, TMPDIR=rt, NESHOST_KERNEL=os.path.join(tmp, "no-kernel"))
        busy_tcp = socket.socket()
        busy_tcp.bind(("127.0.0.1", 0))
        busy_tcp.listen()
        tport = busy_tcp.getsockname()[1]
        busy_udp = socket.socket(type=socket.SOCK_DGRAM)
        busy_udp.bind(("127.0.0.1", 0))
        uport = busy_udp.getsockname()[1]
        cases = [
            (["-p", "70000:80"], {}, "neshost run: --publish 70000:80: host port '70000' must be 1..65535\n"),
            (["-p", "8080"], {}, "neshost run: --publish 8080: expected [IP:]HOST:GUEST[/tcp|/udp] (a host port is required)\n"),
            (["--network", "user", "-p", "127.0.0.1:%d:80" % tport], {},
             "neshost run: --publish 127.0.0.1:%d:80: host port %d/tcp is already in use\n" % (tport, tport)),
            (["-d", "--network", "user", "-p", "127.0.0.1:%d:53/udp" % uport], {},
             "neshost run: --publish 127.0.0.1:%d:53/udp: host port %d/udp is already in use\n" % (uport, uport)),
            (["--network", "none", "-p", "127.0.0.1:8080:80"], {},
             "neshost run: --publish needs --network user (passt) or slirp (it is none: the guest has no NIC)\n"),
            (["--network", "bogus"], {}, "neshost run: --network bogus: unknown mode (user, passt, slirp, none or netns:PATH)\n"),
            ([], {"NESHOST_NETWORK": "bogus"},
             "neshost run: $NESHOST_NETWORK: --network bogus: unknown mode (user, passt, slirp, none or netns:PATH)\n"),
            (["--network", "passt"], {"NESHOST_PASST": os.path.join(tmp, "no-passt")},
             "neshost run: --network user needs passt (%s: No such file or directory); %s\n" %
             (os.path.join(tmp, "no-passt"), PASST_WAY_OUT)),
            (["--network", "user"], {"NESHOST_PASST": stand_in(tmp, "old-passt", "echo 'passt 0.0~git20230309.7c7625d-1'")},
             "neshost run: %s is 'passt 0.0~git20230309.7c7625d-1': passt older than 20260728 loses guest-bound "
             "TCP data under QEMU (docs/network.md); %s\n" % (os.path.join(tmp, "old-passt"), PASST_WAY_OUT)),
            (["--sandbox", "--network", "user"], {},
             "neshost run: --sandbox runs no VM and shares this host's network: --network passt needs one (--network none only)\n"),
            (["--dns", "1.2.3"], {}, "neshost run: --dns 1.2.3: not an IPv4 or IPv6 address\n"),
            (["--add-host", "db"], {}, "neshost run: --add-host db: expected NAME:IP or NAME:host-gateway\n"),
        ]
        for args, extra, want in cases:
            want += "Try 'neshost run --help'.\n"  # a usage error's hint, as every one's
            r = run(["run", "--state", state, "--vm", "n"] + args + ["--", "true"], env=dict(env, **extra))
            check(r.returncode == 125 and r.stderr == want and r.stdout == "",
                  "%s: exit %d, stderr %r (want 125, %r)" % (args, r.returncode, r.stderr, want))
            check(not os.path.exists(state) and os.listdir(rt) == [], "%s: nothing left: %s %s" %
                  (args, os.path.exists(state) and os.listdir(state), os.listdir(rt)))
        busy_tcp.close()
        busy_udp.close()
        # A monitor that fails after -d's fork but before anything is recorded (here: no kernel;
        # a passt that cannot start is the same path): the creator prints why and exits 125, and
        # no VM dir is left (only the monitor's log would have been).
        failing = stand_in(tmp, "failing-passt", '[ "$1" = --version ] && echo "passt 2026_07_28.f8df3f1"; exit 1')
        r = run(["run", "-d", "--rm", "--state", state, "--vm", "pf", "--network", "passt", "--", "true"],
                env=dict(env, NESHOST_PASST=failing))
        check(r.returncode == 125 and "the monitor ended before the workload started" in r.stderr,
              "-d with a failing passt: exit %d, stderr %r" % (r.returncode, r.stderr))
        check(not os.path.exists(os.path.join(state, "pf")), "-d with a failing passt left %s" %
              (os.path.exists(state) and os.listdir(state)))
        # --name and --vm naming two VMs is a usage error (125, as every usage error).
        r = run(["run", "--state", state, "--name", "a", "--vm", "b", "--", "true"], env=env)
        check(r.returncode == 125 and "--name a and --vm b name two VMs" in r.stderr, "name/vm: %d %r" % (r.returncode, r.stderr))
        r = run(["run", "--help"])
        for flag in ("--network MODE", "-p, --publish", "--dns IP", "--dns-search", "--dns-option", "--add-host",
                     "--name NAME", "--rm", "NESHOST_TCG_BOOT_WORDS"):
            check(flag in r.stdout, "run --help lists %s" % flag)
        # --help is help whatever other flags are given (as docker's), even ones that exclude each other.
        r = run(["run", "--help", "--snapshot", "warm", "--kernel", "/k", "--sandbox"])
        check(r.returncode == 0 and "usage: neshost run" in r.stdout and not r.stderr,
              "run --help with conflicting flags: %d %r" % (r.returncode, r.stderr))
        try:
            check(os.waitpid(-1, os.WNOHANG) is None, "no child left")
        except ChildProcessError:
            pass


def test_run_usage_refusals_start_nothing():
    """Every bad value, and what the flags ask of this host, exits 125 naming the flag before
    anything starts: no state dir, nothing in the runtime dir, no QEMU (a stand-in on PATH that
    would leave a mark), with and without -d (the creator refuses before it forks)."""
    with tempfile.TemporaryDirectory() as tmp:
        state, rt, bin_dir = os.path.join(tmp, "state"), os.path.join(tmp, "rt"), os.path.join(tmp, "bin")
        os.mkdir(rt)
        os.mkdir(bin_dir)
        mark = os.path.join(tmp, "qemu-ran")
        stand_in(bin_dir, "qemu-system-x86_64", 'echo "$@" >> %s; exit 1' % mark)
        kernel = os.path.join(tmp, "vmlinuz")
        with open(kernel, "w") as f:
            f.write("not a kernel, never booted\n")
        env = dict(os.environ, TMPDIR=rt, PATH=bin_dir + ":" + os.environ.get("PATH", ""), NESHOST_KERNEL=kernel,
                   NESHOST_NETWORK="none")
        cases = [
            (["-v", ":"], "--volume"),
            (["-v", tmp + ":relative"], "--volume"),
            (["-p", "abc"], "--publish abc"),
            (["-h", "h" * 300], "--hostname: 300 bytes, the guest's limit is 64 (HOST_NAME_MAX)"),
            (["--hostname", "a b"], "--hostname: expected 1..64 letters"),
            (["--mem", "32"], "--mem: expected an integer 64..1048576, got '32'"),
            (["--mem", "1048576"], "--mem 1048576: more than this host's memory"),
            (["--cpus", "0"], "--cpus: expected an integer 1..64, got '0'"),
            (["--timeout", "0"], "--timeout: expected seconds > 0"),
            (["--ready-timeout", "soon"], "--ready-timeout: expected seconds > 0"),
            (["-e", "=x"], "--env: expected K=V or K, got '=x'"),
            (["-w", "rel"], "--workdir: 'rel' is not an absolute path"),
            (["-u", "root"], "--user: expected UID[:GID]"),
            (["--kernel", os.path.join(tmp, "none")], "--kernel '%s': No such file or directory" % os.path.join(tmp, "none")),
            (["--initrd", tmp], "--initrd '%s': not a regular file" % tmp),
            (["--rootfs", os.path.join(tmp, "none")], "--rootfs: '%s' is not a directory" % os.path.join(tmp, "none")),
            (["--state", ""], "--state: expected a path, got ''"),
            (["--stdin-hold"], "--stdin-hold needs -i"),
            (["--bogus"], "unknown flag --bogus"),
        ]
        for args, needle in cases:
            for detach in ([], ["-d"]):
                r = run(["run", "--state", state, "--vm", "n"] + detach + args + ["--", "true"], env=env)
                check(r.returncode == 125 and needle in r.stderr and r.stdout == "" and
                      r.stderr.endswith("Try 'neshost run --help'.\n"),
                      "%s: exit %d, stderr %r (want 125 naming %r)" % (detach + args, r.returncode, r.stderr[:300], needle))
                check(not os.path.exists(state) and os.listdir(rt) == [] and not os.path.exists(mark),
                      "%s: nothing started or left: %s %s %s" % (detach + args, os.path.exists(state) and os.listdir(state),
                                                                 os.listdir(rt), os.path.exists(mark)))
        # snapshot create takes run's entries: the same refusals, nothing made.
        for args, needle in [(["--mem", "32"], "--mem: expected an integer"), (["--accel", "hvf"], "--accel: expected"),
                             (["--rm"], "unknown flag --rm")]:
            r = run(["snapshot", "create", "--state", state] + args + ["base"], env=env)
            check(r.returncode == 125 and needle in r.stderr, "snapshot create %s: %d %r" % (args, r.returncode, r.stderr))
            check(not os.path.exists(state) and not os.path.exists(mark), "snapshot create %s left something" % args)
        # --accel kvm on a host without a usable KVM: said before anything starts. A private mount
        # namespace (root) binds /dev/null over /dev/kvm where this host has one.
        kvm_cmd = [NESHOST, "run", "--state", state, "--accel", "kvm", "--", "true"]
        if not os.path.exists("/dev/kvm"):
            argv = kvm_cmd
        elif os.geteuid() == 0 and shutil.which("unshare"):
            argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                    'mount --bind /dev/null /dev/kvm && exec "$@"', "sh"] + kvm_cmd
        else:
            argv = None
            print("-- (--accel kvm without KVM: not root, and this host has /dev/kvm: not run)")
        if argv:
            for detach in ([], ["-d"]):
                a = argv[:-2] + detach + argv[-2:]
                r = subprocess.run(a, capture_output=True, text=True, timeout=30, env=env)
                check(r.returncode == 125 and "neshost run: --accel kvm: KVM is missing on this host (/dev/kvm" in r.stderr,
                      "--accel kvm without KVM %s: %d %r" % (detach, r.returncode, r.stderr))
                check(not os.path.exists(state) and os.listdir(rt) == [] and not os.path.exists(mark),
                      "--accel kvm without KVM %s started something" % detach)
        # Every other command: the same status for its usage errors.
        for args in (["ps", "--bogus"], ["logs"], ["stop", "-t", "-1", "vm"], ["kill", "-s", "NOPE", "vm"],
                     ["wait", "--format", "yaml", "vm"], ["exec", "vm"], ["port", "vm", "x"], ["rm"], ["serve"],
                     ["snapshot", "nope"], ["inspect", "../x"], ["nonsense"]):
            r = run(args + ["--state", state] if args[0] not in ("exec", "nonsense") else args, env=env)
            check(r.returncode == 125, "%s: exit %d (want 125) %r" % (args, r.returncode, r.stderr))


def test_port_and_ps_show_published_ports():
    """`neshost port` and `ps` read the ports from monitor.json (docker port's and docker ps's texts)."""
    with tempfile.TemporaryDirectory() as tmp:
        state = os.path.join(tmp, "state")
        os.makedirs(os.path.join(state, "web"), mode=0o700)
        mon = {"schema_version": 1, "vm": "web", "generation": 1, "pid": 999999, "start_time": 1, "boot_id": "x",
               "created_at": "2025-01-01T00:00:00.000000000Z", "command": ["httpd"],
               "ports": ["127.0.0.1:8080->80/tcp", "0.0.0.0:5353->53/udp"]}
        with open(os.path.join(state, "web", "monitor.json"), "w") as f:
            f.write(json.dumps(mon) + "\n")
        r = run(["port", "--state", state, "web"])
        check(r.returncode == 0 and r.stdout == "80/tcp -> 127.0.0.1:8080\n53/udp -> 0.0.0.0:5353\n",
              "port: %d %r %r" % (r.returncode, r.stdout, r.stderr))
        r = run(["port", "--state", state, "web", "80"])
        check(r.returncode == 0 and r.stdout == "127.0.0.1:8080\n", "port web 80: %r" % r.stdout)
        r = run(["port", "--state", state, "web", "53/udp"])
        check(r.returncode == 0 and r.stdout == "0.0.0.0:5353\n", "port web 53/udp: %r" % r.stdout)
        r = run(["port", "--state", state, "web", "81"])
        check(r.returncode == 1 and "no published port 81/tcp" in r.stderr, "port web 81: %d %r" % (r.returncode, r.stderr))
        r = run(["port", "--state", state, "web", "x"])
        check(r.returncode == 125, "port web x: %d" % r.returncode)
        r = run(["port", "--state", state, "nosuch"])
        check(r.returncode == 1, "port nosuch: %d" % r.returncode)
        r = run(["ps", "-a", "--state", state])
        lines = r.stdout.splitlines()
        check(lines[0].split() == ["VM", "GEN", "STATUS", "MONITOR", "PORTS", "COMMAND"] and
              "127.0.0.1:8080->80/tcp, 0.0.0.0:5353->53/udp" in lines[1] and lines[1].endswith("httpd"),
              "ps -a: %r" % r.stdout)


for t in [test_output_lost_in_the_record, test_logs, test_help_and_usage, test_serve_exit_code_then_wait_inspect_from_new_processes, test_outcomes_and_statuses,
          test_keep_until_sigterm, test_in_use_is_refused, test_run_network_refusals, test_run_usage_refusals_start_nothing,
          test_port_and_ps_show_published_ports]:
    print("--", t.__name__, flush=True)
    t()
finish()
