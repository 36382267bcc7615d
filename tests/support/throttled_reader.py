#!/usr/bin/env python3
"""A reader that takes a pipe, FIFO or pty at a set byte rate, for the tests of issue 24 (a slow
reader costs time, never bytes; docs/protocol.md "The receipt").

The pace comes from a token bucket: `rate` bytes per second accrue, at most `burst` of them (the
largest single read), and a read asks for no more than the bucket holds. So the writer on the
other side sees a reader that is behind for as long as it writes faster than `rate`: its pipe
fills and stays full, which is the backpressure under test. The only waits are the bucket's own
(how long until enough tokens accrued) and a pause the test asked for; neither stands in for an
event the test waits on.

Everything read is counted and hashed (SHA-256); with keep=True it is kept as well (to compare a
known stream byte for byte). pause_at=K stops reading after exactly K bytes until resume(): the
test sees it through wait_paused(), so it acts while the writer is provably behind.

As a program, for a shell pipeline (`... | throttled_reader.py RATE [PAUSE_AT]`): reads stdin at
RATE (bytes/s; k, m suffixes are 1024-based) and prints `BYTES SHA256` on stdout at EOF; with
PAUSE_AT, the pause lasts until SIGUSR1.
"""
import errno
import hashlib
import os
import threading
import time


class ThrottledReader:
    """Reads `fd` (not owned; the caller closes it after join()) on a thread of its own."""

    def __init__(self, fd, rate, burst=None, pause_at=None, keep=False):
        if rate <= 0:
            raise ValueError("rate must be positive")
        self.fd = fd
        self.rate = float(rate)
        # Small bursts keep the pace smooth: a read takes at most rate/16 (4 KiB..64 KiB), so at
        # 64 KiB/s the writer sees 16 reads of 4 KiB a second, at 1 MB/s 16 of ~61 KiB.
        self.burst = int(burst) if burst else max(4096, min(65536, int(rate) // 16))
        self.pause_at = pause_at
        self.keep = keep
        self.count = 0
        self.data = bytearray() if keep else None
        self.error = None  # an OSError other than the end of a pty, if reading failed
        self.eof = False
        self._sha = hashlib.sha256()
        self._cv = threading.Condition()
        self._paused = False  # reached pause_at and waiting for resume()
        self._resumed = False
        self._stopped = False
        self.started_at = None
        self.ended_at = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self._thread.start()
        return self

    # -- the test's side --

    def wait_paused(self, bound):
        """True once exactly pause_at bytes were read and the reader is waiting; False if the
        stream ended first or `bound` seconds passed."""
        deadline = time.monotonic() + bound
        with self._cv:
            while not self._paused and not self.eof and self.error is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cv.wait(left)
            return self._paused

    def resume(self):
        """Reads on (to EOF) from where the pause stopped; harmless if it never paused."""
        with self._cv:
            self._resumed = True
            self._cv.notify_all()

    def stop(self):
        """Stops reading at the next chance (a cleanup path); the fd is left as it is."""
        with self._cv:
            self._stopped = True
            self._cv.notify_all()

    def join(self, bound):
        """Waits for EOF (or stop()); False if the thread is still reading after `bound` s."""
        self._thread.join(bound)
        return not self._thread.is_alive()

    def hexdigest(self):
        return self._sha.hexdigest()

    def seconds(self):
        """From the first byte to EOF (None before both)."""
        if self.started_at is None or self.ended_at is None:
            return None
        return self.ended_at - self.started_at

    # -- the reading thread --

    def _wait(self, seconds):
        """Waits for the bucket (or a stop); True if stopped."""
        with self._cv:
            if not self._stopped and seconds > 0:
                self._cv.wait(seconds)
            return self._stopped

    def _run(self):
        tokens = float(self.burst)  # a full bucket to start: the first read is not delayed
        last = time.monotonic()
        try:
            while True:
                if self.pause_at is not None and self.count == self.pause_at and not self._resumed:
                    with self._cv:
                        self._paused = True
                        self._cv.notify_all()
                        while not self._resumed and not self._stopped:
                            self._cv.wait()
                        self._paused = False
                        if self._stopped:
                            return
                    last = time.monotonic()  # nothing accrues while paused
                want = self.burst
                if self.pause_at is not None and not self._resumed:
                    want = min(want, self.pause_at - self.count)
                now = time.monotonic()
                tokens = min(float(self.burst), tokens + (now - last) * self.rate)
                last = now
                if tokens < want:  # the bucket's own wait: until `want` tokens have accrued
                    if self._wait((want - tokens) / self.rate):
                        return
                    continue
                with self._cv:
                    if self._stopped:
                        return
                try:
                    b = os.read(self.fd, want)
                except OSError as e:
                    if e.errno == errno.EIO:  # a pty master whose slave side closed: its EOF
                        b = b""
                    elif e.errno == errno.EINTR:
                        continue
                    else:
                        raise
                if not b:
                    break
                if self.started_at is None:
                    self.started_at = time.monotonic()
                tokens -= len(b)
                self._sha.update(b)
                if self.keep:
                    self.data += b
                with self._cv:
                    self.count += len(b)
        except OSError as e:
            with self._cv:
                self.error = e
                self._cv.notify_all()
            return
        with self._cv:
            self.eof = True
            self.ended_at = time.monotonic()
            self._cv.notify_all()


def parse_rate(s):
    s = s.strip().lower()
    mult = {"k": 1024, "m": 1024 * 1024}.get(s[-1:], 1)
    return int(float(s[:-1] if mult != 1 else s) * mult)


def main(argv):
    import signal
    import sys
    if len(argv) not in (2, 3):
        print("usage: throttled_reader.py RATE [PAUSE_AT]  (reads stdin; prints BYTES SHA256)",
              file=sys.stderr)
        return 2
    r = ThrottledReader(0, parse_rate(argv[1]), pause_at=parse_rate(argv[2]) if len(argv) == 3 else None)
    signal.signal(signal.SIGUSR1, lambda *_: r.resume())
    r.start()
    while not r.join(1.0):
        pass
    if r.error is not None:
        print(f"throttled_reader: {r.error}", file=sys.stderr)
        return 1
    print(r.count, r.hexdigest())
    return 0


if __name__ == "__main__":
    import sys
    sys.exit(main(sys.argv))
