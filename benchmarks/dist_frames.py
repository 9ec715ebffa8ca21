"""What one frame costs the socket transport in CPU: a ping-pong between two nodes on loopback.

    python benchmarks/dist_frames.py                     # 3000 round trips of 4 KiB frames
    python benchmarks/dist_frames.py --bytes 64 262144 --trips 2000

Two SocketTransports in one process (``minicaffe.dist.local.make_mesh``: the handshake, the
sender and receiver threads, the framing, exactly as a run uses them). Node 0 sends a GRAD
frame to node 1; node 1's handler, on its receiver thread, answers with a PARAM frame; node 0's
handler wakes the main thread, which sends the next. So every frame pays what a training run's
frames pay: a header packed and parsed, a payload received into its preallocated array, the
statistics, a thread woken on the other side. Printed per frame: the process's CPU (user +
system, both ends together) and the wall time, over ``--trips`` round trips after a warm-up.
A test checks the frame counts and bytes (tests/test_dist_transport.py).
"""

import argparse
import os
import resource
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from minicaffe.dist import frames as F  # noqa: E402
from minicaffe.dist.local import make_mesh  # noqa: E402


class Echo:
    """A handler: node 1 answers every GRAD with a PARAM; node 0 counts the answers."""

    def __init__(self, size):
        self.buf = np.zeros(size // 4, np.float32)
        self.transport = None
        self.answers = 0
        self.cv = threading.Condition()

    def destination(self, src, header):
        return self.buf

    def arrived(self, src, header, array):
        if header.kind == F.GRAD:
            self.transport.send(src, F.PARAM, header.key, header.clock, self.buf)
        else:
            with self.cv:
                self.answers += 1
                self.cv.notify()

    def control(self, src, header, payload):
        pass

    def failed(self, message):
        raise SystemExit(f"the transport failed: {message}")


def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return np.array([r.ru_utime, r.ru_stime])


def ping_pong(size, trips, warmup=200):
    """-> (CPU seconds per frame [user, system], wall seconds per frame, bytes of GRAD and PARAM
    frames node 0 and node 1 sent, headers included)."""
    ts = make_mesh(2, [{}, {}], size)
    echoes = [Echo(size), Echo(size)]
    for t, e in zip(ts, echoes):
        e.transport = t
        t.start(e)
    first = echoes[0]
    out = np.ones(size // 4, np.float32)

    def run(n):
        for i in range(n):
            ts[0].send(1, F.GRAD, 0, i, out)
            with first.cv:
                while first.answers <= i:
                    first.cv.wait(5)
        first.answers = 0

    run(warmup)
    c0, t0 = cpu(), time.perf_counter()
    run(trips)
    c1, t1 = cpu(), time.perf_counter()
    closing = [threading.Thread(target=t.close) for t in ts]  # (each waits for the other's goodbye)
    for t in closing:
        t.start()
    for t in closing:
        t.join()
    # (counted once closed: a frame's rest that the socket's buffer could not take at once is
    # finished, and counted, by the sender thread)
    sent = [sum(n for (kind, _), n in t.stats.sent.items() if kind in ("GRAD", "PARAM")) for t in ts]
    frames = 2 * trips
    return (c1 - c0) / frames, (t1 - t0) / frames, sent


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bytes", type=int, nargs="+", default=[4096], help="payload sizes (multiples of 4)")
    p.add_argument("--trips", type=int, default=3000, help="round trips timed per size (2 frames each)")
    args = p.parse_args(argv)
    print(f"load {os.getloadavg()[0]:.2f}; {args.trips} round trips per size")
    for size in args.bytes:
        c, w, _ = ping_pong(size, args.trips)
        print(
            f"{size:>9,} B: CPU {1e6 * c.sum():7.1f} us per frame (both ends; user {1e6 * c[0]:.1f}, "
            f"system {1e6 * c[1]:.1f}), wall {1e6 * w:7.1f} us"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
