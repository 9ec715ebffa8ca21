"""Emulated links: the transport's token bucket paces a mesh to the link rate (runs anywhere), and
the namespace cluster (veth + bridge + tc) carries a tensor at the shaped rate and leaves no
namespace behind (runs where root and `ip netns` exist; skipped with the reason elsewhere)."""

import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from minicaffe.dist import emulate
from minicaffe.dist import frames as F
from minicaffe.dist.local import make_mesh

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Sink:
    def __init__(self, n):
        self.buf = np.empty(n, np.uint8)
        self.done = threading.Event()

    def destination(self, src, h):
        return self.buf

    def arrived(self, src, h, array):
        self.done.set()

    def control(self, src, h, payload):
        pass

    def failed(self, message):
        pass


def test_in_transport_limiter_paces_to_the_link_rate():
    rate = 100e6 / 8  # 100 Mbit/s
    n = 8 << 20
    ts = make_mesh(2, [{}, {}], n, link=(rate, 0.0))
    sinks = [Sink(n), Sink(n)]
    for t, s in zip(ts, sinks):
        t.start(s)
    t0 = time.perf_counter()
    ts[1].send(0, F.GRAD, 0, 0, np.ones(n, np.uint8))
    assert sinks[0].done.wait(30)
    took = time.perf_counter() - t0
    achieved = n / took
    assert 0.8 * rate < achieved < 1.1 * rate, f"{achieved / 1e6:.1f} MB/s on a {rate / 1e6:.1f} MB/s link"
    for t in ts:
        t.shutdown()


def test_without_root_the_reason_is_clear(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "need root" in emulate.why_not()
    code = emulate.main(["--nodes", "2", "--", "true"])
    assert code == 1


WHY = emulate.why_not()


@pytest.mark.skipif(WHY is not None, reason=f"namespace cluster: {WHY}")
def test_namespace_cluster_shapes_the_link_and_cleans_up():
    before = set(emulate.leftovers())
    env = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run(
        [sys.executable, "-m", "minicaffe.dist.emulate", "--nodes", "2", "--bandwidth", "200mbit", "--delay", "0.1ms",
         "--", sys.executable, "-m", "minicaffe.dist.linkcheck", "--mb", "8", "--rounds", "2"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    link = 200e6 / 8
    assert 0.8 * link < out["transport_Bps"] < 1.05 * link, out
    # the CPU both ends spent per byte (framing, copies, TCP, veth + bridge): real, and far below
    # what a link of this rate could hide (20 ns per byte = 50 MB per CPU second)
    assert 0 < out["cpu_s_per_byte"] < 2e-8, out
    assert 0 < out["cpu_s_per_frame"] < 1e-3, out  # a frame's fixed cost: microseconds, not a millisecond
    assert set(emulate.leftovers()) == before  # every namespace of the run is gone
