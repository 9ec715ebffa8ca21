"""How fast one tensor moves between two nodes: minicaffe's transport vs a raw socket copy.

    python -m minicaffe.dist.linkcheck --mb 64 --rounds 5        (as two nodes: rank, world,
                                                                   rendezvous, secret in the env)

Node 0 asks node 1 for a tensor of ``--mb`` MiB, alternately through the SocketTransport (frames,
``sendmsg`` from the array's own memory, ``recv_into`` the receiver's preallocated array) and
over a plain TCP connection between the same two nodes (``sendall`` / ``recv_into``: what iperf3
measures), ``--rounds`` times each (first every transport copy, then every raw one).  Each copy is timed
from node 0's request to the last byte; node 0 prints one JSON line with the median rate of each
(bytes/s), their ratio, and the CPU seconds per byte the transport copies cost both processes
together (``cpu_s_per_byte``: what moving data costs the cores, which nodes sharing a machine
pay out of their compute) and, from 2,000 frames of 64 bytes sent first, the CPU seconds one
frame costs both ends beyond its bytes (``cpu_s_per_frame``), and the median round trip of a
small request and its answer (``round_trip_s``). The simulator's ``Host`` takes the CPU costs;
half the round trip is a message's latency through the runtime.  benchmarks/dist.py runs it on loopback and on the emulated cluster.
"""

import argparse
import json
import os
import resource
import socket
import statistics
import sys
import threading
import time

import numpy as np

from . import frames as F
from .sockets import SocketTransport, listen
from .transport import load_secret, parse_delay, parse_rate


class _Node:
    def __init__(self, transport, n):
        self.t = transport
        self.buf = np.empty(n, np.uint8)
        self.data = np.ones(n, np.uint8)
        self.arrived_ev = threading.Event()
        self.failures = []
        self.cpu_at_go = self.cpu_at_raw = None  # node 1: CPU time at the first request of each kind
        self.cpu_small = None
        self.small = np.ones(SMALL_BYTES, np.uint8)
        self.small_buf = np.empty(SMALL_BYTES, np.uint8)
        self.small_count = 0

    def destination(self, src, h):
        if h.kind == F.GRAD:
            return self.buf if h.key == 0 else self.small_buf
        return None

    def arrived(self, src, h, array):
        if h.key in (0, 2):  # the tensor, or a ping's answer
            self.arrived_ev.set()
            return
        self.small_count += 1
        if self.small_count == SMALL_FRAMES:
            self.arrived_ev.set()

    def control(self, src, h, payload):  # node 1: node 0 asks for the tensor, or many small ones
        if payload == b"ping":  # answered at once with one small frame
            self.t.send(0, F.GRAD, 2, 0, self.small)
            return
        if payload == b"small":
            if self.cpu_small is None:
                self.cpu_small = _cpu()
            for _ in range(SMALL_FRAMES):
                self.t.send(0, F.GRAD, 1, 0, self.small)
            return
        if self.cpu_at_go is None:
            self.cpu_at_go = _cpu()
        self.t.send(0, F.GRAD, 0, 0, self.data)

    def failed(self, message):
        self.failures.append(message)
        self.arrived_ev.set()


SMALL_FRAMES, SMALL_BYTES = 2000, 64  # the per-frame cost: many frames that carry almost nothing
PINGS = 200


def _cpu():
    """This process's CPU seconds so far, user + system (every thread)."""
    r = resource.getrusage(resource.RUSAGE_SELF)  # microseconds, where os.times() counts 10 ms ticks
    return r.ru_utime + r.ru_stime


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m minicaffe.dist.linkcheck")
    p.add_argument("--mb", type=float, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--link", help="emulate this link rate in the transport (e.g. 1gbit)")
    args = p.parse_args(argv)
    rank, world = int(os.environ["MINICAFFE_RANK"]), int(os.environ["MINICAFFE_WORLD_SIZE"])
    rdv = os.environ["MINICAFFE_RENDEZVOUS"]
    n = int(args.mb * (1 << 20))
    link = (parse_rate(args.link), parse_delay("0")) if args.link else None
    t = SocketTransport(rank, world, rdv, load_secret(), {"linkcheck": n}, n, link=link, log=lambda m: None).form()
    node = _Node(t, n)
    t.start(node)
    host, port = rdv.rsplit(":", 1)
    raw_port = int(port) + 1
    if rank == 0:
        server = listen(host, raw_port)
        conn, _ = server.accept()
        view = memoryview(node.buf).cast("B")
        times = {"transport": [], "raw": []}
        # a small request and its answer, PINGS times: the round trip through both nodes'
        # sender and receiver threads (what a sync waits beyond its bytes, with the wire's latency)
        rtts = []
        for _ in range(PINGS):
            node.arrived_ev.clear()
            t0 = time.perf_counter()
            t.send(1, F.STATE, 0, 0, payload=b"ping")
            node.arrived_ev.wait(60)
            rtts.append(time.perf_counter() - t0)
        # many small frames: what a frame costs the CPU beyond its bytes
        node.arrived_ev.clear()
        c_small, t_small = _cpu(), time.perf_counter()
        t.send(1, F.STATE, 0, 0, payload=b"small")
        node.arrived_ev.wait(600)
        c_small, t_small = _cpu() - c_small, time.perf_counter() - t_small
        cpu0 = _cpu()
        for _ in range(args.rounds):
            node.arrived_ev.clear()
            t0 = time.perf_counter()
            t.send(1, F.STATE, 0, 0, payload=b"go")
            node.arrived_ev.wait(600)
            times["transport"].append(time.perf_counter() - t0)
        cpu0 = _cpu() - cpu0
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            conn.sendall(b"g")
            got = 0
            while got < n:
                k = conn.recv_into(view[got:], n - got)
                if k == 0:
                    raise SystemExit("raw copy: connection closed")
                got += k
            times["raw"].append(time.perf_counter() - t0)
        conn.sendall(b"q")
        cpu1, cpu1_small = (float(x) for x in conn.makefile().readline().split())  # node 1's CPU seconds
        conn.close()
        server.close()
        tr, raw = statistics.median(times["transport"]), statistics.median(times["raw"])
        out = {
            # CPU seconds per byte moved through the transport, both ends together (user +
            # system: framing, the copies into and out of the kernel, TCP, the veth/bridge path)
            "cpu_s_per_byte": (cpu0 + cpu1) / (args.rounds * n),
            # and per frame (64-byte frames, both ends): the fixed cost of a frame
            "cpu_s_per_frame": (c_small + cpu1_small) / SMALL_FRAMES,
            "frames_per_s": SMALL_FRAMES / t_small,
            "round_trip_s": statistics.median(rtts),  # a small request and its answer
            "bytes": n,
            "rounds": args.rounds,
            "transport_Bps": n / tr,
            "raw_Bps": n / raw,
            "ratio": raw / tr,
            "link_Bps": link[0] if link else None,
            "failures": node.failures,
        }
        print(json.dumps(out), flush=True)
    else:
        deadline = time.monotonic() + 30
        while True:
            try:
                s = socket.create_connection((host, raw_port), timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        s.settimeout(600)
        mv = memoryview(node.data).cast("B")
        while True:
            c = s.recv(1)
            if c != b"g":
                break
            if node.cpu_at_raw is None:  # the transport rounds are over
                node.cpu_at_raw = _cpu()
            s.sendall(mv)
        small = (node.cpu_at_go or _cpu()) - node.cpu_small
        s.sendall(f"{(node.cpu_at_raw or _cpu()) - node.cpu_at_go} {small}\n".encode())
        s.close()
    t.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
