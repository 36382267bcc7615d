#!/usr/bin/env python3
"""P7: the init's own share of a VM boot, from the kernel handing over to /init to `ready` on the
channel, against the floor measured in the same VM: a minimal busybox /init script that loads the
same modules (none on the lean kernel: everything built in) and writes one line to the same port.

Both initramfs come from scripts/mkinitrd.sh with the same busybox userland and only the modules
the channel needs (a virtio-serial port on q35: virtio_pci and virtio_console, with their
dependencies, in /etc/nesinit/modules); they differ only in /init. Each round boots one QEMU
(TCG) per contender, alternating which goes first. The hand-over is the kernel's own line "Run
/init as init process" (printed to the serial console just before it execs /init: `loglevel=7`),
the end is the first line on the port's socket; both are stamped by this script's clock
(time.monotonic) as the bytes arrive, so the serial path's latency is in both alike. QEMU is
killed as soon as the line is in. Medians. Prints one markdown row.
usage: p7_boot.py INIT KERNEL [ROUNDS]   ($P7_MODULES: the root modules, default "virtio_pci
virtio_console" for Debian's cloud kernel; "" for the lean kernel)
"""
import os
import selectors
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

INIT, KERNEL = sys.argv[1:3]
ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 5
TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULES = os.environ.get("P7_MODULES", "virtio_pci virtio_console")
PORT = "nes.0"
HANDOVER = b"Run /init as init process"
LIMIT_S = 120  # one boot under TCG takes ~3 s; a hung one is killed

# The floor: devtmpfs and sysfs (to find the port by name, no udev), the same modules in the same
# order, a busy wait for the port's node, one line, then power-off.
FLOOR = """#!/bin/sh
mount -t devtmpfs dev /dev
mount -t sysfs sys /sys
[ -f /etc/nesinit/modules ] && while read -r m; do insmod "$m"; done < /etc/nesinit/modules
p=
while [ -z "$p" ]; do
  for d in /sys/class/virtio-ports/*; do
    [ "$(cat "$d/name" 2>/dev/null)" = %s ] && [ -e "/dev/${d##*/}" ] && p=/dev/${d##*/}
  done
done
echo '{"type":"ready","protocol_version":2}' > "$p"
poweroff -f
""" % PORT


def mkinitrd(init, out):
    subprocess.run([os.path.join(TOP, "scripts/mkinitrd.sh"), "-o", out, "--init", init, "--modules", MODULES],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)


def boot(tmp, initrd, append):
    """One boot: seconds from the hand-over line on the serial console to the first line on the
    port, and that line."""
    sock = os.path.join(tmp, "c.sock")
    if os.path.exists(sock):
        os.unlink(sock)
    lst = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lst.bind(sock)
    lst.listen(1)
    qemu = subprocess.Popen(
        ["qemu-system-x86_64", "-M", "q35", "-accel", "tcg", "-m", "256", "-smp", "1", "-no-reboot",
         "-nodefaults", "-no-user-config", "-display", "none", "-bios", "qboot.rom",
         "-kernel", KERNEL, "-initrd", initrd,
         "-append", "console=ttyS0 loglevel=7 panic=-1 edd=off " + append,
         "-chardev", "stdio,id=con0,signal=off", "-serial", "chardev:con0",
         "-device", "virtio-serial-pci,id=vser0",
         "-chardev", "socket,id=c0,server=off,path=" + sock,
         "-device", "virtserialport,bus=vser0.0,chardev=c0,name=" + PORT],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    sel = selectors.DefaultSelector()
    conn = None
    serial, chan = b"", b""
    t_handover = t_line = None
    deadline = time.monotonic() + LIMIT_S
    try:
        lst.settimeout(LIMIT_S)
        conn, _ = lst.accept()  # QEMU connects before the guest starts
        sel.register(qemu.stdout, selectors.EVENT_READ, "serial")
        sel.register(conn, selectors.EVENT_READ, "chan")
        while t_line is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SystemExit("p7_boot: no line on the port within %d s (serial tail: %r)" % (LIMIT_S, serial[-400:]))
            for key, _ in sel.select(left):
                now = time.monotonic()
                if key.data == "serial":
                    b = os.read(qemu.stdout.fileno(), 65536)
                    if not b:
                        sel.unregister(qemu.stdout)
                        continue
                    serial += b
                    if t_handover is None and HANDOVER in serial:
                        t_handover = now
                    serial = serial[-4096:]
                else:
                    b = conn.recv(65536)
                    if not b:
                        raise SystemExit("p7_boot: the port closed before a line (serial tail: %r)" % serial[-400:])
                    chan += b
                    if b"\n" in chan:
                        t_line = now
    finally:
        qemu.kill()
        qemu.wait()
        sel.close()
        if conn:
            conn.close()
        lst.close()
    if t_handover is None:
        raise SystemExit("p7_boot: no %r on the serial console" % HANDOVER)
    return t_line - t_handover, chan.split(b"\n")[0]


def main():
    tmp = tempfile.mkdtemp(prefix="nes-p7.", dir="/tmp")
    try:
        floor_init = os.path.join(tmp, "floor-init")
        with open(floor_init, "w") as f:
            f.write(FLOOR)
        os.chmod(floor_init, 0o755)
        rd = {"nesinit": os.path.join(tmp, "nesinit.cpio"), "floor": os.path.join(tmp, "floor.cpio")}
        mkinitrd(INIT, rd["nesinit"])
        mkinitrd(floor_init, rd["floor"])
        append = {"nesinit": "nesinit.channel=virtio-port:%s nesinit.log=quiet" % PORT, "floor": ""}
        got = {"nesinit": [], "floor": []}
        for i in range(ROUNDS):
            for who in (("nesinit", "floor") if i % 2 == 0 else ("floor", "nesinit")):
                s, line = boot(tmp, rd[who], append[who])
                if not line.startswith(b'{"type":"ready"'):
                    raise SystemExit("p7_boot: %s sent %r, not ready" % (who, line))
                got[who].append(s * 1000)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    n, f = statistics.median(got["nesinit"]), statistics.median(got["floor"])
    # Each round's two boots are adjacent in time: their ratio is the least disturbed by load
    # elsewhere on the machine.
    pairs = [a / b for a, b in zip(got["nesinit"], got["floor"])]
    span = lambda v, fmt="%.0f": (fmt + "-" + fmt) % (min(v), max(v))
    print("| P7 the init's share of a VM boot (TCG, q35): kernel's hand-over to /init -> `ready` on virtio port %s, "
          "modules %s (median of %d, alternating; nesinit %s ms, floor %s ms; per-round ratio %s, median %.2f) "
          "| ms | %.0f | busybox /init script: same modules, one line to the same port | %.0f | %.2f |"
          % (PORT, MODULES.replace(" ", "+") or "none (built into the kernel)", ROUNDS, span(got["nesinit"]), span(got["floor"]),
             span(pairs, "%.2f"), statistics.median(pairs), n, f, n / f))


main()
