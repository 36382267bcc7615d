"""The test processes' view of /proc: one scan, shared by the Python end-to-end tests (which
processes a run left, which QEMU a neshost started, whether a pid still lives)."""
import json
import os
from typing import Iterator, NamedTuple, Optional


class Proc(NamedTuple):
    """One process as /proc/PID/stat and /proc/PID/cmdline show it: state is stat's third field
    (R, S, D, Z, ...); cmd is the argv joined with spaces (empty for a kernel thread or a zombie)."""
    pid: int
    ppid: int
    state: str
    cmd: str


def proc(pid: int) -> Optional[Proc]:
    """The process `pid`, or None if it is gone (or vanished while being read)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            st = f.read()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace").rstrip()
    except OSError:
        return None
    fields = st[st.rindex(")") + 2:].split()  # the command name may hold spaces and parentheses
    return Proc(pid, int(fields[1]), fields[0], cmd)


def processes() -> Iterator[Proc]:
    """Every process visible in this pid namespace, those that vanish mid-scan skipped."""
    for name in os.listdir("/proc"):
        if name.isdigit():
            p = proc(int(name))
            if p is not None:
                yield p


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    p = proc(pid)
    return p is not None and p.state != "Z"


def pss_kib(pid):
    """PSS of `pid` in KiB from /proc/PID/smaps_rollup (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def vm_pids(state, vm):
    """(QEMU's pid, its monitor's pid) of detached VM `vm` under STATE, as its records name them
    (STATE/VM/vmm.json "vmm"."pid", STATE/VM/monitor.json "pid")."""
    with open(os.path.join(state, vm, "vmm.json")) as f:
        qemu = json.load(f)["vmm"]["pid"]
    with open(os.path.join(state, vm, "monitor.json")) as f:
        monitor = json.load(f)["pid"]
    return qemu, monitor
