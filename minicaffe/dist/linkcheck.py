"""How fast one tensor moves between two nodes: minicaffe's transport vs a raw socket copy.

    python -m minicaffe.dist.linkcheck --mb 64 --rounds 5        (as two nodes: rank, world,
                                                                   rendezvous, secret in the env)

Node 0 asks node 1 for a tensor of ``--mb`` MiB, alternately through the SocketTransport (frames,
``sendmsg`` from the array's own memory, ``recv_into`` the receiver's preallocated array) and
over a plain TCP connection between the same two nodes (``sendall`` / ``recv_into``: what iperf3
measures), ``--rounds`` times each, interleaved so both see the same machine.  Each copy is timed
from node 0's request to the last byte; node 0 prints one JSON line with the median rate of each
(bytes/s) and their ratio.  benchmarks/dist.py runs it on loopback and on the emulated cluster.
"""

import argparse
import json
import os
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

    def destination(self, src, h):
        return self.buf if h.kind == F.GRAD else None

    def arrived(self, src, h, array):
        self.arrived_ev.set()

    def control(self, src, h, payload):  # node 1: node 0 asks for the tensor
        self.t.send(0, F.GRAD, 0, 0, self.data)

    def failed(self, message):
        self.failures.append(message)
        self.arrived_ev.set()


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
        for _ in range(args.rounds):
            node.arrived_ev.clear()
            t0 = time.perf_counter()
            t.send(1, F.STATE, 0, 0, payload=b"go")
            node.arrived_ev.wait(600)
            times["transport"].append(time.perf_counter() - t0)
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
        conn.close()
        server.close()
        tr, raw = statistics.median(times["transport"]), statistics.median(times["raw"])
        out = {
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
        while s.recv(1) == b"g":
            s.sendall(mv)
        s.close()
    t.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
