#!/usr/bin/env python3
"""P6 inside a VM: the workload's stdout through the init's data channel vs raw writes to a
virtio-serial port of the same VM, measured in the guest by the same clock (/proc/uptime, 10 ms).

One QEMU (TCG) per round, started here as an embedder's VMM would start it, with three ports:
nes.0 (the lifecycle channel) and nes.1 (the data channel) for `neshost serve`, and nes.raw,
drained by this script. The workload writes N MiB with dd (bs 64 KiB) straight to the nes.raw
port (raw), and N MiB with the same dd to its stdout (through the init, the data channel and the
host into STATE/VM/workload.log), and reports both times on stderr. Alternating order between rounds;
medians. Prints one markdown row.
usage: vm_stdio_bench.py NESHOST INITRD KERNEL [MIB] [ROUNDS]
"""
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading

NESHOST, INITRD, KERNEL = sys.argv[1:4]
MIB = int(sys.argv[4]) if len(sys.argv) > 4 else 16
ROUNDS = int(sys.argv[5]) if len(sys.argv) > 5 else 3

CS = 'read u _ < /proc/uptime; echo "${u%%.*}${u#*.}"'  # centiseconds since boot


def workload(raw_first):
    # No udev in the initramfs: the port's device is found by its name in sysfs, as the init does.
    raw = ("for d in /sys/class/virtio-ports/*; do [ \"$(cat $d/name)\" = nes.raw ] && p=/dev/${d##*/}; done; "
           "dd if=/dev/zero of=$p bs=65536 count=%d 2>/dev/null" % (MIB * 16))
    init = "dd if=/dev/zero bs=65536 count=%d 2>/dev/null" % (MIB * 16)  # the same writer as raw
    steps = [("raw", raw), ("init", init)] if raw_first else [("init", init), ("raw", raw)]
    s = "cs() { %s; }; " % CS
    for name, cmd in steps:
        s += "a=$(cs); %s; b=$(cs); echo %s $((b-a)) >&2; " % (cmd, name)
    return s + "exit 0"


def drain(listener, counted):
    conn, _ = listener.accept()
    n = 0
    while True:
        b = conn.recv(1 << 20)
        if not b:
            break
        n += len(b)
    counted.append(n)
    conn.close()


def round_(tmp, raw_first):
    run = os.path.join(tmp, "run")
    os.makedirs(run, exist_ok=True)
    ch, data, rawp = (os.path.join(run, n) for n in ("c.sock", "d.sock", "r.sock"))
    state = os.path.join(tmp, "state")
    desc = os.path.join(tmp, "desc.json")
    with open(desc, "w") as f:
        json.dump({"exec": {"argv": ["/bin/sh", "-c", workload(raw_first)], "env": {"PATH": "/bin:/usr/bin"},
                            "uid": 0, "gid": 0},
                   "geometry": {"width": 1, "height": 1, "fps": 1}, "on_exit": {"terminal": True},
                   "stdio": {"stdin": False}}, f)
    lr = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lr.bind(rawp)
    lr.listen(1)
    counted = []
    t = threading.Thread(target=drain, args=(lr, counted), daemon=True)
    t.start()
    serve = subprocess.Popen([NESHOST, "serve", "--listen", "unix:" + ch, "--data-listen", "unix:" + data,
                              "--descriptor", desc, "--state", state, "--vm", "p6", "--ready-timeout", "120"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    qemu = None
    try:
        for line in serve.stdout:
            if " data_listening " in line:
                break
        qemu = subprocess.Popen(
            ["qemu-system-x86_64", "-M", "q35", "-accel", "tcg", "-m", "256", "-smp", "1", "-no-reboot",
             "-nodefaults", "-no-user-config", "-display", "none", "-bios", "qboot.rom",
             "-kernel", KERNEL, "-initrd", INITRD,
             "-append", "console=ttyS0 quiet loglevel=0 panic=-1 edd=off nesinit.channel=virtio-port:nes.0 "
                        "nesinit.data=virtio-port:nes.1 nesinit.log=quiet",
             "-chardev", "stdio,id=con0,signal=off", "-serial", "chardev:con0",
             "-device", "virtio-serial-pci,id=vser0",
             "-chardev", "socket,id=c0,server=off,path=" + ch,
             "-device", "virtserialport,bus=vser0.0,chardev=c0,name=nes.0",
             "-chardev", "socket,id=c1,server=off,path=" + data,
             "-device", "virtserialport,bus=vser0.0,chardev=c1,name=nes.1",
             "-chardev", "socket,id=c2,server=off,path=" + rawp,
             "-device", "virtserialport,bus=vser0.0,chardev=c2,name=nes.raw"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        serve.stdout.read()
        rc = serve.wait(timeout=600)
        qemu.wait(timeout=120)
        t.join(30)
    finally:
        for p in (serve, qemu):
            if p and p.poll() is None:
                p.kill()
                p.wait()
        lr.close()
    logs = subprocess.run([NESHOST, "logs", "--state", state, "p6"], capture_output=True, timeout=120)
    times = dict(l.split() for l in logs.stderr.decode().split("\n") if l.strip())
    got = len(logs.stdout)
    if rc != 0 or got != MIB << 20 or counted != [MIB << 20]:
        raise SystemExit("vm_stdio_bench: rc %s, stdout %d bytes, raw %s bytes, times %s" % (rc, got, counted, times))
    return int(times["raw"]) * 10, int(times["init"]) * 10  # ms


def main():
    raw, init = [], []
    for i in range(ROUNDS):
        tmp = tempfile.mkdtemp(prefix="nes-p6vm.", dir="/tmp")
        try:
            r, n = round_(tmp, raw_first=(i % 2 == 0))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        raw.append(r)
        init.append(n)
    r, n = statistics.median(raw), statistics.median(init)
    rate = lambda ms: MIB * 1000.0 / ms if ms else float("inf")
    print("| P6 in a VM (TCG): workload stdout -> init -> data port nes.1 -> host workload.log, %d MiB "
          "(median of %d, guest clock) | MiB/s | %.1f | raw `dd` to virtio port nes.raw in the same VM | %.1f | %.2f |"
          % (MIB, ROUNDS, rate(n), rate(r), rate(n) / rate(r)))


main()
