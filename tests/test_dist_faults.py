"""Faults and bad input against live nodes: a node killed with SIGKILL mid-run (the others stop
within 10 s naming it and the iteration, the last snapshot is intact, --resume continues), a port
already in use, an unreachable rendezvous, nodes with different solvers, and a seeded fuzzer
throwing over a thousand random and mutated frames at a training node (no crash, no hang, and
the run still computes exactly what one process computes)."""

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import tracemalloc

import numpy as np
import pytest

from minicaffe.dist import frames as F
from minicaffe.dist.local import SECRET, run_nodes
from minicaffe.dist.sockets import Connection, SocketTransport, listen
from minicaffe.dist.transport import DistError
from minicaffe.tools import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

NET = """name: "tiny"
layer { name: "d" type: "Data" top: "data" top: "label" include { phase: TRAIN }
        transform_param { scale: 0.00390625 }
        data_param { source: "synthetic:1x12x12:10:512:0" batch_size: 24 } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "xavier" } } }
layer { name: "pool" type: "Pooling" bottom: "conv" top: "pool" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "ip" type: "InnerProduct" bottom: "pool" top: "ip"
        inner_product_param { num_output: 10 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


def write_solver(tmp_path, name="tiny", **fields):
    (tmp_path / f"{name}_net.prototxt").write_text(NET)
    settings = dict(
        base_lr=0.05, momentum=0.9, weight_decay=0.0005, lr_policy='"inv"', gamma=0.0001, power=0.75, display=1
    )
    settings.update(max_iter=1000, snapshot=5, random_seed=3, snapshot_prefix='"tiny"')
    settings.update(fields)
    text = f'net: "{name}_net.prototxt"\n' + "".join(f"{k}: {v}\n" for k, v in settings.items())
    path = tmp_path / f"{name}_solver.prototxt"
    path.write_text(text)
    return str(path)


def node_env(rank, world, port, secret="s3cret"):
    env = dict(os.environ, PYTHONPATH=ROOT, MINICAFFE_DIST_SECRET=secret)
    env.update(MINICAFFE_RANK=str(rank), MINICAFFE_WORLD_SIZE=str(world), MINICAFFE_RENDEZVOUS=f"127.0.0.1:{port}")
    return env


def free_port():
    s = listen("127.0.0.1", 0)
    port = s.getsockname()[1]
    s.close()
    return port


class Proc:
    """A node process whose output is collected line by line."""

    def __init__(self, args, env, cwd):
        self.p = subprocess.Popen(
            [sys.executable, "-m", "minicaffe.train", *args],
            env=env,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines = []
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self):
        for line in self.p.stdout:
            self.lines.append(line.rstrip())

    def text(self):
        return "\n".join(self.lines)

    def wait_for(self, needle, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(needle in line for line in self.lines):
                return True
            if self.p.poll() is not None:
                time.sleep(0.2)
                return any(needle in line for line in self.lines)
            time.sleep(0.05)
        return False


def start_nodes(tmp_path, world, extra, port=None):
    port = port or free_port()
    solver = write_solver(tmp_path)
    out = str(tmp_path / "run")
    procs = []
    for r in range(world):
        args = [solver, "--no-plot", *extra] + (["--output", out, "--force"] if r == 0 else [])
        procs.append(Proc(args, node_env(r, world, port), str(tmp_path)))
    return procs, out


@pytest.mark.parametrize(
    "wfbp", ["off", pytest.param("on", marks=pytest.mark.slow)]
)  # with WFBP a whole backward of gradients is queued when a node dies: the ABORT must overtake it
def test_sigkill_of_a_node_stops_the_others_and_resume_continues(tmp_path, wfbp):
    procs, out = start_nodes(tmp_path, 3, ["--iters", "400", "--peer-timeout", "5", "--wfbp", wfbp])
    try:
        assert procs[0].wait_for("Iteration 12 ", 120), procs[0].text()
        procs[2].p.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        for p in procs[:2]:
            p.p.wait(timeout=30)
        took = time.monotonic() - killed
    finally:
        for p in procs:
            if p.p.poll() is None:
                p.p.kill()
    assert took < 10, f"the others took {took:.1f} s to stop"
    assert procs[0].p.returncode != 0 and procs[1].p.returncode != 0
    errors = [line for line in procs[0].lines if "ERROR" in line]
    assert len(errors) == 1, errors
    assert "lost node 2" in errors[0] and "at iteration" in errors[0], errors[0]
    assert "lost node 2" in procs[1].text() or "node 0 stopped the run" in procs[1].text()
    # the last snapshot is whole, and the run resumes from it on 3 nodes again
    states = sorted(f for f in os.listdir(out) if f.endswith(".solverstate"))
    assert states, os.listdir(out)
    last = max(states, key=lambda f: int(f.split("_iter_")[1].split(".")[0]))
    it = int(last.split("_iter_")[1].split(".")[0])
    with np.load(os.path.join(out, last)) as z:
        assert "record" in z.files
    port = free_port()
    solver = write_solver(tmp_path)
    resumed = []
    for r in range(3):
        args = [solver, "--no-plot", "--iters", str(it + 3)]
        args += ["--resume", os.path.join(out, last)] if r == 0 else []
        resumed.append(Proc(args, node_env(r, 3, port), str(tmp_path)))
    for p in resumed:
        p.p.wait(timeout=120)
    assert [p.p.returncode for p in resumed] == [0, 0, 0], resumed[0].text() + resumed[1].text()
    assert f"at iteration {it}" in resumed[0].text()
    assert any(f"_iter_{it + 3}.solverstate" in f for f in os.listdir(out))


@pytest.mark.slow
def test_launcher_trains_two_local_nodes(tmp_path):
    solver = write_solver(tmp_path)
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("MINICAFFE_DIST_SECRET", None)
    out = tmp_path / "run"
    r = subprocess.run(
        [sys.executable, "-m", "minicaffe.train", solver, "--nodes", "2", "--iters", "4", "--output", str(out)],
        env=env,
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "node 0/2: listening on 127.0.0.1:" in r.stdout
    assert "MB/iteration" in r.stdout
    assert (out / "timeline.png").exists()
    records = [line for line in (out / "train_log.jsonl").read_text().splitlines() if '"kind": "dist"' in line]
    assert len(records) == 1 and '"1": {' in records[0]  # node 1's statistics reached node 0
    nodes = json.loads(records[0])["nodes"]  # and every node's timeline (benchmarks/poseidon.py draws them)
    for rank in ("0", "1"):
        lanes = {e[0] for e in nodes[rank]["timeline"]}
        assert {"compute", "send", "recv"} <= lanes and nodes[rank]["t_origin"] > 0, (rank, lanes)


def run_main(args, env, capsys, monkeypatch):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    code = train.main(args)
    out = capsys.readouterr()
    return code, out.out + out.err


def test_port_in_use_is_one_clear_error(tmp_path, capsys, monkeypatch):
    busy = listen("127.0.0.1", 0)
    port = busy.getsockname()[1]
    try:
        code, text = run_main(
            [write_solver(tmp_path), "--iters", "2", "--output", str(tmp_path / "o"), "--no-plot"],
            node_env(0, 2, port),
            capsys,
            monkeypatch,
        )
    finally:
        busy.close()
    assert code != 0
    assert "already in use" in text
    assert "Traceback" not in text


def test_unreachable_rendezvous_is_one_clear_error(tmp_path, capsys, monkeypatch):
    code, text = run_main(
        [write_solver(tmp_path), "--iters", "2", "--connect-timeout", "0.5"],
        node_env(1, 2, free_port()),
        capsys,
        monkeypatch,
    )
    assert code != 0
    assert "cannot reach the rendezvous" in text and "Traceback" not in text


def test_nodes_with_different_solvers_refuse_each_other(tmp_path):
    port = free_port()
    a = write_solver(tmp_path, "a")
    b = write_solver(tmp_path, "b", base_lr=0.1)
    procs = [
        Proc([a, "--iters", "2", "--no-plot", "--output", str(tmp_path / "o"), "--connect-timeout", "60"],
             node_env(0, 2, port), str(tmp_path)),
        Proc([b, "--iters", "2", "--no-plot", "--connect-timeout", "60"], node_env(1, 2, port), str(tmp_path)),
    ]  # fmt: skip
    for p in procs:
        p.p.wait(timeout=120)
    assert [p.p.returncode for p in procs] == [1, 1], procs[0].text() + procs[1].text()
    for p in procs:
        assert "node 1's solver differs from node 0's" in p.text(), p.text()
        assert "Traceback" not in p.text()


def test_wrong_secret_is_refused_and_logged(tmp_path):
    logs = []
    t0 = SocketTransport(0, 2, "127.0.0.1:0", b"right", {}, 1 << 20, log=logs.append, handshake_timeout=2)
    t1 = SocketTransport(1, 2, f"127.0.0.1:{t0.address[1]}", b"wrong", {}, 1 << 20, log=lambda m: None)
    with pytest.raises(DistError, match="wrong secret"):
        t1.form()
    deadline = time.monotonic() + 5
    while not t0.refusals and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "wrong secret" in t0.refusals[0][1]
    assert any("refused a connection" in line for line in logs)
    t0.shutdown()


def test_a_lying_length_allocates_nothing(tmp_path):
    """A header announcing 2**62 bytes, or 1 GiB, is refused from its 48 bytes alone."""
    t0 = SocketTransport(0, 2, "127.0.0.1:0", SECRET, {}, 1 << 20, log=lambda m: None, handshake_timeout=2)
    try:
        tracemalloc.start()
        for n, dims in ((2**62, (2**31, 2**31, 1, 1)), (1 << 30, (1 << 30, 0, 0, 0))):
            s = socket.create_connection(t0.address)
            conn = Connection(s, "server", F.MAX_CONTROL)
            h = conn.read_header()  # HELLO
            conn.read_control(h)
            s.sendall(F.HEADER.pack(F.MAGIC, 1, F.AUTH, 0, 1, 3, 4 if dims[1] else 1, 0, *dims, n))
            s.sendall(b"\0" * 4096)
            s.close()
        deadline = time.monotonic() + 5
        while len(t0.refusals) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        reasons = [r for _, r in t0.refusals]
        assert len(reasons) == 2 and all("over this receiver's limit" in r for r in reasons), reasons
        assert peak < 8 << 20, f"peak allocation {peak} bytes"
    finally:
        t0.shutdown()


# -- fuzzing a live node -----------------------------------------------------------------------------
def fuzz_frames(rng, n):
    """n byte strings: random bytes, valid headers with one field or bit mutated, truncations."""
    kinds = sorted(F.KIND_NAMES)
    good = [
        F.pack_header(F.AUTH, 0, 1, np.uint8, (64,)) + bytes(64),
        F.pack_header(F.JOIN, 0, 1, np.uint8, (20,)) + b'{"rank":1,"world":2}',
        F.pack_header(F.GRAD, 3, 1, np.float32, (10,)) + bytes(40),
        F.pack_header(F.PARAM, 0, 0, np.float32, (2, 5)) + bytes(40),
    ]
    out = []
    for _ in range(n):
        choice = rng.integers(6)
        base = bytearray(good[rng.integers(len(good))])
        if choice == 0:
            out.append(rng.bytes(int(rng.integers(1, 200))))
        elif choice == 1:  # flip bits anywhere
            for _ in range(int(rng.integers(1, 6))):
                k = int(rng.integers(len(base)))
                base[k] ^= 1 << int(rng.integers(8))
            out.append(bytes(base))
        elif choice == 2:  # one header field replaced by a random value
            field = int(rng.integers(13))
            values = list(F.HEADER.unpack(bytes(base[:48])))
            fmt = ["4s", "H", "H", "I", "H", "B", "B", "q", "I", "I", "I", "I", "Q"][field]
            if fmt == "4s":
                values[0] = rng.bytes(4)
            else:
                bits = struct.calcsize("<" + fmt) * 8
                values[field] = int(rng.integers(0, 2 ** min(bits, 63)))
                if fmt == "q":
                    values[field] -= 2**62
            try:
                out.append(F.HEADER.pack(*values) + bytes(base[48:]))
            except struct.error:
                out.append(bytes(base))
        elif choice == 3:  # a kind that may not come now
            values = list(F.HEADER.unpack(bytes(base[:48])))
            values[2] = kinds[int(rng.integers(len(kinds)))]
            out.append(F.HEADER.pack(*values) + bytes(base[48:]))
        elif choice == 4:  # truncated
            out.append(bytes(base[: int(rng.integers(1, len(base)))]))
        else:  # a lying length
            values = list(F.HEADER.unpack(bytes(base[:48])))
            values[12] = [0, 1, 2**63, 2**64 - 1, values[12] + 1, max(values[12] - 1, 0)][int(rng.integers(6))]
            out.append(F.HEADER.pack(*values) + bytes(base[48:]))
    return out


def fuzz(address, frames, stop):
    """Send each frame on its own connection (some after reading the HELLO, as a client would)."""
    sent = 0
    for k, frame in enumerate(frames):
        if stop.is_set():
            break
        try:
            s = socket.create_connection(address, timeout=2)
            if k % 2:
                s.recv(48 + 32)  # the challenge
            s.sendall(frame)
            s.close()
            sent += 1
        except OSError:
            pass
    return sent


@pytest.mark.parametrize("n_frames", [1200])
def test_fuzzed_node_still_trains_exactly(n_frames):
    from test_dist_ps import K, lenet_solver, params_of

    ref = lenet_solver(max_iter=K)
    ref.step(K)
    solvers = [lenet_solver(max_iter=K) for _ in range(2)]
    frames = fuzz_frames(np.random.default_rng(2024), n_frames)
    stop, counts = threading.Event(), {}

    def setup(node):
        if node.rank == 1:
            addr = node.transport.address

            def go():
                counts["sent"] = fuzz(addr, frames, stop)

            counts["thread"] = threading.Thread(target=go, daemon=True)
            counts["thread"].start()
            counts["transport"] = node.transport

            class WaitForFuzzer:  # the last iteration ends only when every frame was sent
                def on_iteration(self, solver, loss, lr):
                    if solver.iter == K:
                        counts["thread"].join(60)

            node.solver.add_callback(WaitForFuzzer())

    t0 = time.monotonic()
    run_nodes(solvers, iters=K, setup=setup)
    counts["thread"].join(60)
    stop.set()
    assert time.monotonic() - t0 < 90
    assert counts["sent"] >= 1000
    refusals = counts["transport"].refusals
    assert len(refusals) >= 900, len(refusals)
    for a, b in zip(params_of(solvers[1]), params_of(ref)):
        assert float(np.abs(a - b).max()) <= 1e-4
