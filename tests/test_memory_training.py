"""Memory of a training process: the one arena of ``plan_training`` (training net, test nets,
parameters, history) changes no result, and a LeNet training step allocates no temporaries."""

import os
import re
import tracemalloc

import numpy as np
import pytest

from minicaffe.data import register_dataset, unregister_dataset
from minicaffe.memory import plan_training
from minicaffe.parallel import lanes
from minicaffe.solvers import get_solver

NETS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "nets")
SOLVER = (
    'net: "{net}" base_lr: 0.01 momentum: 0.9 weight_decay: 0.0005 lr_policy: "inv" gamma: 0.0001 '
    "power: 0.75 max_iter: 100 display: 0 random_seed: 1 test_iter: 2 test_interval: {interval}\n"
)

#: most bytes one phase of a step (a layer's forward or backward, the update) may allocate and
#: free again: numpy's ufuncs keep up to two internal buffers of 8192 elements (64 KiB in float32)
#: while they add a transposed array, as the convolutions' bias epilogue does; any array of the
#: size of a blob, a column buffer or a weight gradient is above it
PHASE_LIMIT = 72 * 1024


@pytest.fixture
def one_lane():
    saved = lanes.count()
    lanes.set_count(1)
    yield
    lanes.set_count(saved)


def lenet(tmp_path, data_layers, interval=1000):
    """Caffe's LeNet (nets/lenet_train_test.prototxt) with its two Data layers replaced."""
    text = open(os.path.join(NETS, "lenet_train_test.prototxt")).read()
    parts = re.split(r"(?=\nlayer \{)", text)
    body = [p for p in parts if 'type: "Data"' not in p]
    net = tmp_path / "lenet.prototxt"
    net.write_text(body[0] + "\n" + data_layers + "".join(body[1:]))
    solver = tmp_path / "solver.prototxt"
    solver.write_text(SOLVER.format(net=net, interval=interval))
    return get_solver(str(solver), log=lambda m: None)


@pytest.fixture
def digits():
    rng = np.random.default_rng(3)
    register_dataset("rss_train", rng.integers(0, 256, (200, 1, 28, 28), dtype=np.uint8), rng.integers(0, 10, 200))
    register_dataset("rss_test", rng.integers(0, 256, (120, 1, 28, 28), dtype=np.uint8), rng.integers(0, 10, 120))
    yield
    unregister_dataset("rss_train")
    unregister_dataset("rss_test")


DATA = (
    'layer { name: "mnist" type: "Data" top: "data" top: "label" include { phase: TRAIN }\n'
    '  transform_param { scale: 0.00390625 } data_param { source: "rss_train" batch_size: 16 } }\n'
    'layer { name: "mnist" type: "Data" top: "data" top: "label" include { phase: TEST }\n'
    '  transform_param { scale: 0.00390625 } data_param { source: "rss_test" batch_size: 20 } }\n'
)


def run(solver, steps):
    losses, tests = [], []
    solver.on_iteration.append(lambda s, loss, lr: losses.append(loss))
    solver.on_test.append(lambda s, i, result: tests.append(dict(result)))
    solver.step(steps)
    return losses, tests, [p.data.copy() for p in solver.net.learnable_params]


@pytest.mark.parametrize("run_first", [False, True])
def test_one_arena_for_training_and_test_nets_changes_no_result(tmp_path, digits, run_first):
    """Tests run between iterations in bytes the training net's activations and scratch use
    during an iteration; losses, test outputs and parameters are bit for bit those without it."""
    plain = run(lenet(tmp_path, DATA, interval=4), 10)
    solver = lenet(tmp_path, DATA, interval=4)
    plan = plan_training(solver, run_first=run_first)
    planned = run(solver, 10)
    assert planned[0] == plain[0]  # losses, exactly
    assert planned[1] == plain[1] and len(planned[1]) == 3  # tests at 0, 4, 8
    for a, b in zip(planned[2], plain[2]):
        np.testing.assert_array_equal(a, b)
    # the test net's activations and scratch share the training net's bytes
    assert plan.size < plan.naive
    test_bufs = [b for b in plan.buffers if "(test)" in b.name and not b.persistent]
    train_bufs = [b for b in plan.buffers if "(test)" not in b.name and not b.persistent]
    assert any(t.offset < r.offset + r.nbytes and r.offset < t.offset + t.nbytes for t in test_bufs for r in train_bufs)
    for net in [solver.net] + solver.test_nets:  # every blob now lives in the arena
        for name in ("conv1", "pool2", "ip1"):
            assert np.shares_memory(net.blobs[name].data, plan.arena.buffer)
    assert np.shares_memory(solver.test_nets[0].params["conv1"][0].data, plan.arena.buffer)


MEMORY_DATA = (
    'layer { name: "mnist" type: "MemoryData" top: "data" top: "label" include { phase: TRAIN }\n'
    "  memory_data_param { batch_size: 64 channels: 1 height: 28 width: 28 } }\n"
    'layer { name: "mnist" type: "MemoryData" top: "data" top: "label" include { phase: TEST }\n'
    "  memory_data_param { batch_size: 100 channels: 1 height: 28 width: 28 } }\n"
)


class PhasePeaks:
    """The most bytes each phase of a step allocates above what it started with (tracemalloc):
    every layer's forward and backward (the Net's hooks) and the update (Solver callbacks)."""

    def __init__(self, solver):
        self.net, self.peaks, self.phase, self.start = solver.net, {}, None, 0
        self.handle = self.net.add_hooks(
            before_forward=lambda i: self.begin(f"{self.net.layer_names[i]} forward"),
            after_forward=lambda i: self.end(),
            before_backward=lambda i: self.begin(f"{self.net.layer_names[i]} backward"),
            after_backward=lambda i: self.end(),
        )
        solver.add_callback(self)

    def begin(self, phase):
        self.phase = phase
        tracemalloc.reset_peak()
        self.start = tracemalloc.get_traced_memory()[0]

    def end(self):
        if self.phase is not None and tracemalloc.is_tracing():
            peak = tracemalloc.get_traced_memory()[1] - self.start
            self.peaks[self.phase] = max(self.peaks.get(self.phase, 0), peak)
        self.phase = None

    def on_gradients_ready(self, solver):
        self.end()
        self.begin("update (lr policy, weight decay, momentum, step)")

    def on_iteration(self, solver, loss, lr):
        self.end()


def test_lenet_training_step_allocates_no_temporaries(tmp_path, one_lane):
    """After warm-up, no phase of a LeNet step (batch 64, Caffe's SGD solver) allocates an array:
    every activation, diff, column buffer and weight-gradient product is kept between steps."""
    solver = lenet(tmp_path, MEMORY_DATA)
    rng = np.random.default_rng(0)
    for net, n in ((solver.net, 256), (solver.test_nets[0], 200)):
        images = rng.integers(0, 256, (n, 1, 28, 28)).astype(np.float32) / 256
        net.layers[0].set_input_arrays(images, rng.integers(0, 10, n))
    plan_training(solver, run_first=False)
    solver.step(3)  # warm-up: kernels compiled or loaded, every buffer at its size
    peaks = PhasePeaks(solver)
    tracemalloc.start()
    try:
        solver.step(4)
    finally:
        tracemalloc.stop()
    # every phase was seen: each layer's forward and backward (but the data layer's), the update
    assert len(peaks.peaks) == 2 * len(solver.net.layers) - 1 + 1
    over = {phase: peak for phase, peak in peaks.peaks.items() if peak > PHASE_LIMIT}
    assert not over, f"phases of a LeNet step that allocated more than {PHASE_LIMIT} bytes: {over}"


def test_curves_are_drawn_from_each_buckets_lowest_and_highest_point():
    from minicaffe.tools.train import min_max_decimate

    x = np.arange(10)
    assert len(min_max_decimate(x, x * 2.0)[0]) == 10  # a short curve: every point
    rng = np.random.default_rng(0)
    x, y = np.arange(10_000), rng.lognormal(size=10_000)
    dx, dy = min_max_decimate(x, y, buckets=1000)
    assert len(dx) <= 2000 and np.all(np.diff(dx) > 0)  # in order, at most 2 a bucket
    np.testing.assert_array_equal(dy, y[dx])  # points of the curve, not averages
    for a in range(0, 10_000, 10):  # every bucket keeps its extremes: the line covers the same pixels
        inside = (dx >= a) & (dx < a + 10)
        assert dy[inside].min() == y[a : a + 10].min() and dy[inside].max() == y[a : a + 10].max()


def test_the_train_tool_plans_one_arena_in_one_process(tmp_path, digits, capsys):
    from minicaffe.tools import train

    solver = lenet(tmp_path, DATA, interval=3)
    del solver  # only its files are wanted
    args = [str(tmp_path / "solver.prototxt"), "--iters", "4", "--no-plot", "--lanes", "1"]
    assert train.main(args + ["--output", str(tmp_path / "one")]) == 0
    text = capsys.readouterr().out
    line = next(x for x in text.splitlines() if "Memory: one arena of" in x)
    assert "1 test net(s)" in line
    assert train.main(args + ["--output", str(tmp_path / "two"), "--workers", "2"]) == 0
    assert "Memory: one arena" not in capsys.readouterr().out  # the threaded runtime plans its own


def test_the_train_log_is_read_line_by_line_and_a_cut_last_line_is_ignored(tmp_path):
    """read_log streams train_log.jsonl (a 10,000-iteration log read whole held 8 MiB of Python
    objects while curves.png was drawn); a last line a kill cut short is dropped, a damaged line
    before it is an error naming the line."""
    from minicaffe.errors import MinicaffeError
    from minicaffe.tools import train

    lines = [
        '{"kind": "start", "solver": "s.prototxt"}',
        *(f'{{"kind": "iter", "iter": {i}, "loss": {1 / (i + 1)}, "lr": 0.01, "seconds": {i}}}' for i in range(3)),
        "",
        '{"kind": "test", "iter": 2, "net": 0, "seconds": 2.5, "outputs": {"accuracy": 0.5}}',
    ]
    log = tmp_path / train.LOG_NAME
    log.write_text("\n".join(lines) + '\n{"kind": "iter", "iter": 3, "lo')  # killed mid-write
    data = train.read_log(str(tmp_path))
    assert data["train"]["iter"] == [0, 1, 2] and data["train"]["loss"] == [1.0, 0.5, 1 / 3]
    assert [t["outputs"] for t in data["test"]] == [{"accuracy": 0.5}] and data["solver"] == "s.prototxt"
    log.write_text("\n".join(lines[:2] + ['{"kind": "iter", "it'] + lines[2:]) + "\n")
    with pytest.raises(MinicaffeError, match=r"train_log.jsonl:3: not a JSON record"):
        train.read_log(str(log))
    log.write_text("\n".join(lines) + '\n{"kind": "iter", "iter": 3, "lo\n')  # ends with a newline: damaged
    with pytest.raises(MinicaffeError, match=r":7: not a JSON record"):
        train.read_log(str(log))
