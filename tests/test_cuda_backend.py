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
            pb.data[...] = gpu.from_host(pa.data, dtype)
    for name in a.inputs:
        shape = a.blobs[name].shape
        if name == "label":
            v = rng.integers(0, classes, shape).astype(dtype)
        else:
            v = rng.uniform(0, 1, shape).astype(dtype)
        a.blobs[name].data[...] = v
        b.blobs[name].data[...] = gpu.from_host(v, dtype)
    return a, b


def compare(a, b, gpu, what, rtol):
    for name in a.blobs:
        for field in ("data", "diff") if what == "all" else (what,):
            x = np.asarray(getattr(a.blobs[name], field), np.float64)
            y = np.asarray(gpu.to_host(getattr(b.blobs[name], field)), np.float64)
            scale = max(np.abs(x).max(initial=0), 1e-3)
            err = np.abs(x - y).max(initial=0)
            assert err <= rtol * scale, (
                f"blob '{name}'.{field}: max |cpu - {gpu.name}| = {err:.3g} > {rtol}*{scale:.3g}"
            )
    for name in a.params:
        for i, (pa, pb) in enumerate(zip(a.params[name], b.params[name])):
            x = np.asarray(pa.diff, np.float64)
            y = np.asarray(gpu.to_host(pb.diff), np.float64)
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


@pytest.mark.parametrize("version", ["v1_naive", "v2_tiled", "v3_regblock"])
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
    through the backend's sgd_step kernel.  The only device->host copy is the loss (24 bytes,
    in softmax_loss_fwd); blobs stay device arrays throughout."""
    a, b = twin_nets(SMALL_NET, gpu, classes=5)
    history = [b.xp.zeros_like(p.data) for p in b.learnable_params]
    rng = np.random.default_rng(1)
    data = rng.uniform(0, 1, b.blobs["data"].shape).astype(np.float32)
    label = rng.integers(0, 5, b.blobs["label"].shape).astype(np.float32)
    gpu.transfers.reset()
    b.blobs["data"].data[...] = gpu.from_host(data, np.float32)
    b.blobs["label"].data[...] = gpu.from_host(label, np.float32)
    b.clear_param_diffs()
    loss = b.forward_backward()
    for p, h in zip(b.learnable_params, history):
        gpu.sgd_step(p.flat_data, p.flat_diff, h.reshape(-1), 0.9, 0.01, 5e-4)
    gpu.synchronize()
    t = gpu.transfers.snapshot()
    assert t["h2d"] == 2 and t["h2d_bytes"] == data.nbytes + label.nbytes, t
    assert t["d2h"] == 1 and t["d2h_bytes"] == 24, t
    assert np.isfinite(loss)
    for name, blob in b.blobs.items():
        assert isinstance(blob.data, gpu.xp.ndarray) and isinstance(blob.diff, gpu.xp.ndarray), name


def test_to_host_and_from_host_copy_and_count(gpu):
    gpu.transfers.reset()
    h = np.arange(6, dtype=np.float32)
    d = gpu.from_host(h, np.float32)
    h[0] = 99  # the device copy does not follow the host array
    back = gpu.to_host(d)
    back[1] = -1  # nor does the device follow a host copy
    assert gpu.to_host(d).tolist() == [0, 1, 2, 3, 4, 5]
    assert gpu.transfers.snapshot() == {"d2h": 2, "h2d": 1, "d2h_bytes": 48, "h2d_bytes": 24}
