"""The GPU backends as the engine sees them: selection and its errors, a whole LeNet forward /
backward through the GPU code path against the CPU backend, every hand-written GEMM inside real
layers, and the transfer counter that shows a training step makes no hidden host round trips.

The GPU backend checked is the one this process can have: ``cudasim`` in the default test run,
``cuda`` (marked gpu) in a process started with NUMBA_ENABLE_CUDASIM=0 on a machine with a GPU.
"""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import minicaffe as caffe
from minicaffe import backend as _backend
from minicaffe.errors import MinicaffeError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(params=["cudasim", pytest.param("cuda", marks=pytest.mark.gpu)])
def gpu(request):
    reason = _backend.why_not(request.param)
    if reason is not None:
        pytest.skip(f"{request.param}: {reason}")
    be = _backend.get(request.param)
    yield be
    import kernels.cuda as kc

    kc.use("gemm", "default")


def run_python(code, **env):
    """Run ``code`` in a fresh interpreter (numba's CUDA target is fixed per process)."""
    e = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    e.update(env)
    e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=e, cwd=ROOT, timeout=300
    )


# -- selection ---------------------------------------------------------------------------------------------
def test_set_mode_gpu_picks_the_simulator_under_numba_enable_cudasim_and_explains_otherwise():
    code = """
        import minicaffe as caffe
        from minicaffe import backend
        try:
            caffe.set_mode_gpu()
            print("MODE", backend.mode(), backend.get().name)
        except caffe.MinicaffeError as e:
            print("ERROR", e)
    """
    sim = run_python(code, NUMBA_ENABLE_CUDASIM="1")
    assert "MODE cudasim cudasim" in sim.stdout, sim.stdout + sim.stderr
    real = run_python(code)
    if _backend.why_not("cuda") is None or "MODE cuda" in real.stdout:
        pytest.skip("a GPU is usable here: the no-GPU message cannot be shown")
    out = real.stdout
    assert out.startswith("ERROR the cuda backend cannot be used"), out + real.stderr
    assert "NUMBA_ENABLE_CUDASIM=1" in out  # the way to run without a GPU
    assert ('pip install -e ".[cuda]"' in out) or ("no usable NVIDIA GPU" in out) or ("no NVIDIA GPU" in out)


def test_backends_registered_and_unknown_names_listed():
    assert _backend.BACKENDS == ("cpu", "cudasim", "cuda")
    with pytest.raises(MinicaffeError, match="known: cpu, cudasim, cuda"):
        _backend.get("tpu")
    assert "unknown backend" in _backend.why_not("tpu")


def test_one_process_cannot_have_both_gpu_backends(gpu):
    other = "cuda" if gpu.name == "cudasim" else "cudasim"
    reason = _backend.why_not(other)
    assert reason is not None and "once per process" in reason
    with pytest.raises(MinicaffeError, match=f"the {other} backend cannot be used"):
        _backend.get(other)


def test_explicit_numba_enable_cudasim_0_refuses_the_simulator():
    out = run_python(
        """
        from minicaffe import backend
        print("WHY", backend.why_not("cudasim"))
    """,
        NUMBA_ENABLE_CUDASIM="0",
    )
    assert "WHY NUMBA_ENABLE_CUDASIM=0 is set" in out.stdout, out.stdout + out.stderr


# -- LeNet through the GPU code path --------------------------------------------------------------------------
def lenet_text(batch):
    """nets/lenet.prototxt (deploy) at a tiny batch, with labels and SoftmaxWithLoss in place of
    the final Softmax."""
    with open(os.path.join(ROOT, "nets", "lenet.prototxt")) as f:
        text = f.read()
    text = text.replace("dim: 64", f"dim: {batch}")
    head, _, _ = text.rpartition('layer { name: "prob"')
    return head + (
        f'layer {{ name: "label" type: "Input" top: "label" input_param {{ shape {{ dim: {batch} }} }} }}\n'
        'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }\n'
    )


def twin_nets(text, gpu, dtype=np.float32, seed=0, classes=10):
    """The same net on cpu and on ``gpu`` with identical weights and inputs."""
    cpu = _backend.get("cpu")
    a = caffe.Net(text, caffe.TRAIN, backend=cpu, dtype=dtype)
    b = caffe.Net(text, caffe.TRAIN, backend=gpu, dtype=dtype)
    rng = np.random.default_rng(seed)
    for name in a.params:
        for pa, pb in zip(a.params[name], b.params[name]):
            pb.data[...] = pa.data  # pycaffe's idiom: host arrays on every backend
    for name in a.inputs:
        shape = a.blobs[name].shape
        if name == "label":
            v = rng.integers(0, classes, shape).astype(dtype)
        else:
            v = rng.uniform(0, 1, shape).astype(dtype)
        a.blobs[name].data[...] = v
        b.blobs[name].data[...] = v
    return a, b


def compare(a, b, gpu, what, rtol):
    for name in a.blobs:
        for field in ("data", "diff") if what == "all" else (what,):
            x = np.asarray(getattr(a.blobs[name], field), np.float64)
            y = np.asarray(getattr(b.blobs[name], field), np.float64)  # host arrays
            scale = max(np.abs(x).max(initial=0), 1e-3)
            err = np.abs(x - y).max(initial=0)
            assert err <= rtol * scale, (
                f"blob '{name}'.{field}: max |cpu - {gpu.name}| = {err:.3g} > {rtol}*{scale:.3g}"
            )
    for name in a.params:
        for i, (pa, pb) in enumerate(zip(a.params[name], b.params[name])):
            x = np.asarray(pa.diff, np.float64)
            y = np.asarray(pb.diff, np.float64)
            scale = max(np.abs(x).max(initial=0), 1e-3)
            err = np.abs(x - y).max(initial=0)
            assert err <= rtol * scale, (
                f"param {name}[{i}].diff: max |cpu - {gpu.name}| = {err:.3g} > {rtol}*{scale:.3g}"
            )


def test_lenet_forward_backward_matches_cpu(gpu):
    """The whole LeNet (conv, max pool, inner product, ReLU, softmax loss) on a batch of 2, in
    float32, through every default GPU kernel; the CPU backend is the reference."""
    a, b = twin_nets(lenet_text(2), gpu)
    la = a.forward_backward()
    lb = b.forward_backward()
    assert abs(la - lb) <= 1e-5 * max(1.0, abs(la)), (la, lb)
    compare(a, b, gpu, "all", rtol=2e-5)


SMALL_NET = """
name: "small"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 2 dim: 7 dim: 6 } } }
layer { name: "label" type: "Input" top: "label" input_param { shape { dim: 2 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 3 kernel_size: 3 pad: 1 stride: 2 weight_filler { type: "gaussian" std: 0.3 }
                            bias_filler { type: "constant" value: 0.1 } } }
layer { name: "pool" type: "Pooling" bottom: "conv" top: "pool" pooling_param { pool: AVE kernel_size: 2 stride: 1 } }
layer { name: "sig" type: "Sigmoid" bottom: "pool" top: "pool" }
layer { name: "ip" type: "InnerProduct" bottom: "pool" top: "ip"
        inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "tanh" type: "TanH" bottom: "ip" top: "ip" }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


@pytest.mark.parametrize("version", ["v1_naive", "v2_tiled", "v3_regblock", "v4_double_buffered", "v5_vectorized"])
def test_every_hand_written_gemm_inside_layers(gpu, version):
    """Convolution and InnerProduct forward and backward (all four transpose combinations occur)
    with each hand-written GEMM, plus average pooling, sigmoid and tanh, against the CPU."""
    import kernels.cuda as kc

    kc.use("gemm", version)
    a, b = twin_nets(SMALL_NET, gpu, dtype=np.float64, classes=5)
    la, lb = a.forward_backward(), b.forward_backward()
    assert abs(la - lb) <= 1e-12 * max(1.0, abs(la)), (la, lb)
    compare(a, b, gpu, "all", rtol=1e-12)


# -- the bus ------------------------------------------------------------------------------------------------------
def test_a_training_step_makes_no_hidden_transfers(gpu):
    """One SGD step (a small conv net: LeNet's 430k weights are slow to stream through the
    simulator): upload a batch (2 host->device copies), forward + backward, the momentum update
    through the backend's sgd_step kernel.  The batch is written the pycaffe way
    (``blob.data[...] = array``, a host array) and reaches the device by the blob's lazy sync;
    the only device->host copies are SoftmaxWithLoss's 4-number status (32 bytes: the label
    check) and the loss the net returns (4 bytes); afterwards no blob's host side is the newer,
    and none was copied back.  (A step with deferred checks copies neither: test_cuda_launch.py.)"""
    a, b = twin_nets(SMALL_NET, gpu, classes=5)
    history = [b.xp.zeros_like(p.dev_data) for p in b.learnable_params]
    b.forward_backward()  # the first step uploads the weights written from the host
    rng = np.random.default_rng(1)
    data = rng.uniform(0, 1, b.blobs["data"].shape).astype(np.float32)
    label = rng.integers(0, 5, b.blobs["label"].shape).astype(np.float32)
    gpu.transfers.reset()
    b.blobs["data"].data = data  # overwrites: no copy back first (``.data[...] =`` would make one)
    b.blobs["label"].data = label
    b.clear_param_diffs()
    loss = b.forward_backward()
    for p, h in zip(b.learnable_params, history):
        gpu.sgd_step(p.dev_flat_data, p.dev_flat_diff, h.reshape(-1), 0.9, 0.01, 5e-4)
    gpu.synchronize()
    t = gpu.transfers.snapshot()
    assert t["h2d"] == 2 and t["h2d_bytes"] == data.nbytes + label.nbytes, t
    assert t["d2h"] == 2 and t["d2h_bytes"] == 32 + 4, t
    assert np.isfinite(loss)
    for name, blob in b.blobs.items():
        assert isinstance(blob.dev_data, gpu.xp.ndarray) and isinstance(blob.dev_diff, gpu.xp.ndarray), name
        assert "at host" not in blob.head, (name, blob.head)


def test_to_host_and_from_host_copy_and_count(gpu):
    gpu.transfers.reset()
    h = np.arange(6, dtype=np.float32)
    d = gpu.from_host(h, np.float32)
    h[0] = 99  # the device copy does not follow the host array
    back = gpu.to_host(d)
    back[1] = -1  # nor does the device follow a host copy
    assert gpu.to_host(d).tolist() == [0, 1, 2, 3, 4, 5]
    assert gpu.transfers.snapshot() == {"d2h": 2, "h2d": 1, "d2h_bytes": 48, "h2d_bytes": 24}


SOLVER_NET = """
name: "dummy"
layer { name: "data" type: "DummyData" top: "data" top: "label"
        dummy_data_param { shape { dim: 2 dim: 1 dim: 5 dim: 5 } shape { dim: 2 }
                           data_filler { type: "gaussian" std: 1 } data_filler { type: "constant" value: 1 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 2 kernel_size: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


def test_a_solver_step_moves_only_the_batch_and_the_loss(gpu, tmp_path):
    """Solver.step on a GPU backend, as a user runs it: the data layer makes a batch on the host
    each iteration (DummyData's gaussian refill) and the blob syncs it to the device -- one
    host->device copy; the label check's status (32 bytes) and the loss (4 bytes) -- two
    device->host copies; nothing else crosses (weights, gradients, momentum and every activation
    stay on the device)."""
    (tmp_path / "net.prototxt").write_text(SOLVER_NET)
    (tmp_path / "solver.prototxt").write_text(
        'net: "net.prototxt"\nbase_lr: 0.01\nmomentum: 0.9\nweight_decay: 5e-4\nlr_policy: "fixed"\n'
        "max_iter: 10\ndisplay: 0\nrandom_seed: 1\n"
    )
    solver = caffe.SGDSolver(str(tmp_path / "solver.prototxt"), log=lambda m: None, backend=gpu)
    solver.step(1)  # uploads the filled weights once
    gpu.transfers.reset()
    solver.step(2)
    gpu.synchronize()
    t = gpu.transfers.snapshot()
    batch_bytes = 2 * 1 * 5 * 5 * 4
    assert t == {"d2h": 4, "h2d": 2, "d2h_bytes": 2 * (32 + 4), "h2d_bytes": 2 * batch_bytes}, t
    assert np.isfinite(solver.smoothed_loss)


def test_pycaffe_blob_data_is_a_host_array_that_writes_through(gpu):
    """pycaffe's idiom on a GPU backend: ``blob.data`` is a numpy array; writing into it reaches
    the next forward; after a forward it holds the new values (one copy back, counted)."""
    text = (
        'layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }\n'
        'layer { name: "s" type: "Scale" bottom: "x" top: "y" scale_param { filler { type: "constant" value: 2 } } }\n'
    )
    net = caffe.Net(text, caffe.TEST, backend=gpu, dtype=np.float64)
    assert type(net.blobs["x"].data) is np.ndarray and type(net.params["s"][0].diff) is np.ndarray
    net.blobs["x"].data[...] = np.arange(6.0).reshape(2, 3)
    net.params["s"][0].data[...] = [1.0, 10.0, 100.0]  # weights, in place, as pycaffe scripts do
    out = net.forward()
    assert type(out["y"]) is np.ndarray
    np.testing.assert_array_equal(out["y"], [[0, 10, 200], [3, 40, 500]])
    net.forward_from_to()  # the engine's side of y is newer again
    gpu.transfers.reset()
    y = net.blobs["y"].data  # one copy to the host
    np.testing.assert_array_equal(y, [[0, 10, 200], [3, 40, 500]])
    assert gpu.transfers.snapshot()["d2h"] == 1 and net.blobs["y"].head[0] == "at host"
    assert net.blobs["y"].dev_data is not None and net.blobs["y"].head[0] == "at device"
    # forward accepts device arrays too, copied on the device
    out = net.forward(x=gpu.from_host(np.ones((2, 3))))
    np.testing.assert_array_equal(out["y"], [[1, 10, 100], [1, 10, 100]])


def test_caffe_accessor_names_and_heads(gpu):
    from minicaffe.blob import Blob

    b = Blob((3,), dtype=np.float32, xp=gpu.xp, name="b")
    assert b.head == ("uninitialized", "uninitialized")
    b.mutable_cpu_data()[...] = [1, 2, 3]
    assert b.head[0] == "at host"
    d = b.gpu_data()  # read on the device: both sides now hold the values
    assert b.head[0] == "synced" and gpu.to_host(d).tolist() == [1, 2, 3]
    b.mutable_gpu_data()[...] = d * 2
    assert b.head[0] == "at device"
    assert b.cpu_data().tolist() == [2, 4, 6] and b.head[0] == "synced"
    cpu = Blob((3,), name="c")
    assert cpu.head is None and cpu.data is cpu.dev_data  # one array, nothing to sync
    with pytest.raises(caffe.MinicaffeError, match="no device copy"):
        cpu.gpu_data()


PLANTED = """
import numpy as np
import pytest

from minicaffe.blob import Blob


def mix_in_arithmetic(backend, b):
    b.dev_data[...] = b.dev_data * np.full(3, 2, np.float32)  # a host array into device math


def implicit_to_numpy(backend, b):
    b.dev_data[...] = np.asarray(b.dev_data) * 2  # a device array read as if it were numpy


def host_array_to_a_kernel(backend, b):
    backend.relu_fwd(np.ones(3, np.float32), 0.0, b.dev_flat_data)  # a kernel fed from the host


@pytest.mark.parametrize("mistake", [mix_in_arithmetic, implicit_to_numpy, host_array_to_a_kernel])
def test_planted(backend, mistake):
    b = Blob((3,), dtype=np.float32, xp=backend.xp)
    b.data = np.ones(3, np.float32)
    mistake(backend, b)
    assert b.data.min() >= 1
"""


def test_the_cpu_only_run_catches_planted_host_device_mistakes(pytester):
    """Three host/device mix-ups that a real GPU rejects pass on the cpu backend (one array
    there) and must fail on cudasim, in an ordinary CPU-only test run: the simulator's device
    arrays refuse numpy as CuPy's do, and kernels refuse host arrays."""
    pytester.makeconftest(open(os.path.join(ROOT, "tests", "conftest.py")).read())
    pytester.makepyfile(test_planted=PLANTED)
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, failed=3)
    out = result.stdout.str()
    for mistake in ("mix_in_arithmetic", "implicit_to_numpy", "host_array_to_a_kernel"):
        assert f"FAILED test_planted.py::test_planted[cudasim-{mistake}]" in out, out
    assert "Unsupported type <class 'numpy.ndarray'>" in out
    assert "Implicit conversion to a NumPy array is not allowed" in out
    assert "a kernel was handed a host numpy array" in out


def test_gpu_check_says_what_is_missing_and_passes_on_the_simulator():
    """``python -m minicaffe.gpu_check``: without CuPy it exits 1 naming what is missing and the
    command that installs it; ``--simulator`` runs the whole check (a kernel, the GEMM, LeNet
    against the CPU) on cudasim and exits 0."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    if _backend.why_not("cuda") is None:
        pytest.skip("a GPU is usable here: the missing-parts message cannot be shown")
    real = subprocess.run([sys.executable, "-m", "minicaffe.gpu_check"], capture_output=True, text=True, env=env)
    assert real.returncode == 1, real.stdout + real.stderr
    assert "[NO] CuPy is not installed" in real.stdout or "sees no usable NVIDIA GPU" in real.stdout, real.stdout
    assert 'pip install -e ".[cuda]"' in real.stdout, real.stdout
    sim = subprocess.run(
        [sys.executable, "-m", "minicaffe.gpu_check", "--simulator"], capture_output=True, text=True, env=env
    )
    assert sim.returncode == 0, sim.stdout + sim.stderr
    assert "GPU check passed: the cudasim backend works" in sim.stdout, sim.stdout
    assert "[NO]" not in sim.stdout, sim.stdout


def test_gpu_step_benchmark_says_why_it_cannot_measure_here():
    """benchmarks/gpu_step.py times LeNet on a GPU against PyTorch; where there is no GPU it
    exits 0 with the reason instead of failing."""
    if _backend.why_not("cuda") is None:
        pytest.skip("a GPU is usable here: the benchmark would run (minutes), not explain")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    r = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "gpu_step.py")], capture_output=True, text=True, env=env
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "nothing to measure on this machine: the cuda backend cannot run here" in r.stdout, r.stdout


def test_a_planned_net_lives_in_a_device_arena(gpu):
    """plan_memory on a GPU backend puts the arena in device memory (it was a numpy array, which
    only a simulator with numpy device arrays let pass), and the planned net computes what the
    CPU's planned net does."""
    from minicaffe.memory import plan_memory

    losses, grads = [], []
    for be in (_backend.get("cpu"), gpu):
        caffe.set_random_seed(0)
        net = caffe.Net(SMALL_NET, caffe.TRAIN, backend=be, dtype=np.float64)
        plan = plan_memory(net)
        assert isinstance(plan.arena.buffer, be.xp.ndarray)
        rng = np.random.default_rng(0)
        net.blobs["data"].data = rng.uniform(0, 1, net.blobs["data"].shape)
        net.blobs["label"].data = rng.integers(0, 5, 2).astype(np.float64)
        losses.append(net.forward_backward())
        grads.append(net.params["conv"][0].diff.copy())
    assert losses[0] == pytest.approx(losses[1], rel=1e-12)
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-10, atol=1e-14)
