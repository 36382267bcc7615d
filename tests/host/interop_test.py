#!/usr/bin/env python3
"""Interop: `neshost serve` (this library) against the real static init from nesinit/, run as
PID 1 of a fresh pid + mount namespace (`unshare --pid --fork --mount-proc --kill-child`) with an
explicit --channel=unix:PATH. Every process is bounded and reaped; temp dirs removed.
Exit 77 (meson: skipped) when the init or namespaces are unavailable.
usage: interop_test.py NESHOST_BIN NESINIT_BIN
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import check, finish, need_sandbox, skip  # noqa: E402

NESHOST, NESINIT = sys.argv[1], sys.argv[2]
need_sandbox(NESINIT)


def session(argv, extra=(), policy="stop", action=None, expect_rc=None, expect=None):
    """Serve one VM whose guest is the real init running `argv`; return (rc, record, serve lines)."""
    with tempfile.TemporaryDirectory(prefix="nesi-") as tmp:
        sock = os.path.join(tmp, "run", "vm.sock")
        desc = os.path.join(tmp, "desc.json")
        with open(desc, "w") as f:
            json.dump({"type": "boot", "exec": {"argv": argv, "env": {"PATH": "/usr/bin:/bin"}, "uid": 0, "gid": 0},
                       "geometry": {"width": 640, "height": 480, "fps": 30}, "on_exit": {"terminal": True}}, f)
        state = os.path.join(tmp, "state")
        serve = subprocess.Popen([NESHOST, "serve", "--listen", "unix:" + sock, "--descriptor", desc, "--state", state,
                                  "--vm", "real", "--on-exit", policy, "--ready-timeout", "20", "--stop-timeout", "10"]
                                 + list(extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        init = None
        lines = []
        try:
            for line in serve.stdout:
                lines.append(line.rstrip("\n"))
                if " listening " in line:
                    break
            init = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", NESINIT,
                                     "--channel=unix:" + sock, "--log=info", "--grace-ms=2000"],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            if action:
                for line in serve.stdout:
                    lines.append(line.rstrip("\n"))
                    if line.split(" ")[1].strip() == action[0]:
                        action[1](serve)
                        break
            out, err = serve.communicate(timeout=60)
            lines += out.splitlines()
            iout, ierr = init.communicate(timeout=30)
        finally:
            for p in (serve, init):
                if p and p.poll() is None:
                    p.kill()
                    p.wait()
        r = subprocess.run([NESHOST, "inspect", "--state", state, "real"], capture_output=True, text=True, timeout=30)
        rec = json.loads(r.stdout) if r.returncode == 0 else {}
        what = "%s -> %s" % (argv, rec)
        if expect_rc is not None:
            check(serve.returncode == expect_rc, "%s: serve exit %s, want %s\n%s\n%s" %
                  (what, serve.returncode, expect_rc, "\n".join(lines), ierr[-2000:]))
        if expect:
            for k, v in expect.items():
                check(rec.get(k) == v, "%s: %s=%r, want %r" % (what, k, rec.get(k), v))
        check(init.returncode is not None, "the init's namespace ended")
        return serve.returncode, rec, lines


def main():
    session(["/bin/sh", "-c", "exit 7"], expect_rc=7, expect={"outcome": "exited", "exit_code": 7, "signal": None})
    session(["/bin/sh", "-c", "exit 0"], expect_rc=0, expect={"outcome": "exited", "exit_code": 0})
    session(["/bin/sh", "-c", "kill -TERM $$"], expect_rc=143,
            expect={"outcome": "signalled", "signal": 15, "exit_code": None, "exit_status": 143})
    session(["/bin/sh", "-c", "kill -9 $$"], expect_rc=137, expect={"outcome": "signalled", "signal": 9})
    session(["/nonexistent"], expect_rc=127, expect={"outcome": "start_failed", "exit_status": 127})
    session(["/etc/passwd"], expect_rc=126, expect={"outcome": "start_failed", "exit_status": 126})
    # Host wall limit: outcome timeout (124); the ack (`shutdown`) then ends the VM in order.
    session(["/bin/sleep", "1000"], extra=["--timeout", "1"], expect_rc=124, expect={"outcome": "timeout"})
    # SIGTERM to serve -> host.shutdown() -> the init's ordered shutdown SIGTERMs the workload.
    session(["/bin/sleep", "1000"], action=("started", lambda p: p.send_signal(signal.SIGTERM)), expect_rc=143,
            expect={"outcome": "signalled", "signal": 15})
    # keep: booted with terminal=false; the VM stays up after the outcome until shutdown.
    rc, rec, lines = session(["/bin/sh", "-c", "exit 5"], policy="keep",
                             action=("kept", lambda p: p.send_signal(signal.SIGTERM)), expect_rc=5,
                             expect={"outcome": "exited", "exit_code": 5})
    check(any(" boot_sent terminal=false" in l for l in lines), "keep sent terminal=false")


def serve_stdio():
    """serve --data-listen: the real init dials the data channel; the workload's stdout and stderr
    end up in STATE/VM/workload.log, and `neshost logs` prints them apart, byte-exact."""
    with tempfile.TemporaryDirectory(prefix="nesi-") as tmp:
        sock, data = os.path.join(tmp, "run", "vm.sock"), os.path.join(tmp, "run", "data.sock")
        desc = os.path.join(tmp, "desc.json")
        with open(desc, "w") as f:
            json.dump({"type": "boot", "exec": {"argv": ["/bin/sh", "-c", "printf 'out\\n'; printf 'err\\n' >&2; exit 3"],
                                                "env": {"PATH": "/usr/bin:/bin"}, "uid": 0, "gid": 0},
                       "geometry": {"width": 1, "height": 1, "fps": 1}, "on_exit": {"terminal": True},
                       "stdio": {"stdin": False}}, f)
        state = os.path.join(tmp, "state")
        serve = subprocess.Popen([NESHOST, "serve", "--listen", "unix:" + sock, "--data-listen", "unix:" + data,
                                  "--descriptor", desc, "--state", state, "--vm", "io", "--ready-timeout", "20"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        init = None
        try:
            for line in serve.stdout:
                if " data_listening " in line:
                    break
            init = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", NESINIT,
                                     "--channel=unix:" + sock, "--data-channel=unix:" + data, "--log=quiet"],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            out, err = serve.communicate(timeout=60)
            init.wait(timeout=30)
        finally:
            for p in (serve, init):
                if p and p.poll() is None:
                    p.kill()
                    p.wait()
        check(serve.returncode == 3, "serve --data-listen: exit %s, want 3\n%s%s" % (serve.returncode, out, err))
        check(" data_connected" in out, "serve --data-listen: the data channel connected\n" + out)
        lo = subprocess.run([NESHOST, "logs", "--state", state, "io"], capture_output=True, text=True, timeout=30)
        check((lo.returncode, lo.stdout, lo.stderr) == (0, "out\n", "err\n"),
              "neshost logs after serve: %r" % ((lo.returncode, lo.stdout, lo.stderr),))


main()
serve_stdio()
finish()
