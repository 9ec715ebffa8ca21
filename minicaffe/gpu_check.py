"""Check a GPU setup in one command: ``python -m minicaffe.gpu_check``.

It says, one line per item, what this machine has for minicaffe's ``cuda`` backend and what is
missing, then -- when everything is there -- runs the GPU path once: one hand-written kernel
launched on a CuPy array, cuBLAS through the backend's GEMM, a host->device->host round trip
counted by the transfer counter, and LeNet forward + backward on the GPU compared with the CPU.
Exit status 0 when the GPU path works, 1 when something is missing or wrong (the last line says
what to do).

``--simulator`` runs the same checks on numba's CUDA simulator (the ``cudasim`` backend), which
needs no GPU: the test suite runs it that way.

    python -m minicaffe.gpu_check
    python -m minicaffe.gpu_check --simulator
"""

import argparse
import importlib.metadata as md
import os
import platform
import sys

import numpy as np


def _version(dist):
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _installed_cupy():
    for dist in ("cupy-cuda13x", "cupy-cuda12x", "cupy-cuda11x", "cupy"):
        v = _version(dist)
        if v:
            return dist, v
    return None, None


def environment(simulator):
    """[(ok, line)] about the software and the device; ok None for lines that are information."""
    rows = [
        (None, f"python {platform.python_version()}, numpy {np.__version__}, numba {_version('numba')}"),
    ]
    if simulator:
        rows.append((None, "mode: numba's CUDA simulator (cudasim backend): no GPU needed, none used"))
        return rows
    ncuda = _version("numba-cuda")
    rows.append(
        (
            bool(ncuda),
            f"numba-cuda {ncuda}"
            if ncuda
            else "numba-cuda is not installed (numba's CUDA target; numba's built-in one is deprecated)",
        )
    )
    dist, v = _installed_cupy()
    if dist is None:
        rows.append((False, "CuPy is not installed"))
        return rows
    rows.append((True, f"{dist} {v}"))
    try:
        import cupy

        n = cupy.cuda.runtime.getDeviceCount()
        drv = cupy.cuda.runtime.driverGetVersion()
        rt = cupy.cuda.runtime.runtimeGetVersion()
    except Exception as exc:  # CUDARuntimeError, a missing driver library
        rows.append((False, f"CuPy sees no usable NVIDIA GPU or driver ({type(exc).__name__}: {exc})"))
        return rows
    rows.append((None, f"CUDA driver {drv // 1000}.{drv % 1000 // 10}, runtime {rt // 1000}.{rt % 1000 // 10}"))
    if drv // 1000 < rt // 1000:
        rows.append((False, f"the driver (CUDA {drv // 1000}) is older than CuPy's runtime (CUDA {rt // 1000})"))
    if n < 1:
        rows.append((False, "there is no NVIDIA GPU on this machine"))
        return rows
    for i in range(n):
        props = cupy.cuda.runtime.getDeviceProperties(i)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        rows.append(
            (True, f"GPU {i}: {name}, {props['totalGlobalMem'] / 2**30:.0f} GiB, sm_{props['major']}{props['minor']}")
        )
    return rows


def smoke(simulator):
    """Run the GPU path once; returns [(ok, line)]."""
    import minicaffe as caffe
    from minicaffe import backend as B

    name = "cudasim" if simulator else "cuda"
    gpu = B.get(name)
    cpu = B.get("cpu")
    rows = []
    x = np.linspace(-1, 1, 1000, dtype=np.float32)
    gpu.transfers.reset()
    d = gpu.from_host(x)
    y = gpu.xp.zeros_like(d)
    gpu.relu_fwd(d, 0.0, y)  # a numba.cuda kernel on the backend's device arrays
    got = gpu.to_host(y)
    ok = np.array_equal(got, np.maximum(x, 0)) and gpu.transfers.snapshot()["h2d"] == 1
    rows.append((ok, f"a numba.cuda kernel launched on {name}'s device arrays: {'right' if ok else 'WRONG'}"))
    a = np.random.default_rng(0).standard_normal((64, 48)).astype(np.float32)
    c = gpu.xp.zeros((64, 64), dtype=np.float32)
    gpu.gemm(False, True, 1.0, gpu.from_host(a), gpu.from_host(a), 0.0, c)
    err = float(np.abs(gpu.to_host(c) - a @ a.T).max())
    rows.append((err < 1e-3, f"the backend's GEMM (a @ a.T, 64x48): max error {err:.2g}"))

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(root, "nets", "lenet.prototxt")
    text = open(path).read().replace("dim: 64", "dim: 2")
    nets = [caffe.Net(text, caffe.TEST, backend=b) for b in (cpu, gpu)]
    for name_ in nets[0].params:
        for pa, pb in zip(nets[0].params[name_], nets[1].params[name_]):
            pb.data[...] = pa.data
    img = np.random.default_rng(1).uniform(0, 1, nets[0].blobs["data"].shape).astype(np.float32)
    outs = [n.forward(data=img)["prob"] for n in nets]
    err = float(np.abs(outs[0] - outs[1]).max())
    rows.append((err < 1e-5, f"LeNet forward on {name} against the CPU (batch 2): max |diff| in prob {err:.2g}"))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m minicaffe.gpu_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--simulator", action="store_true", help="check the cudasim backend instead (no GPU needed)")
    args = ap.parse_args(argv)
    if args.simulator:
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    from minicaffe import backend as B

    rows = environment(args.simulator)
    name = "cudasim" if args.simulator else "cuda"
    reason = B.why_not(name)
    if reason is None and all(ok is not False for ok, _ in rows):
        try:
            rows += smoke(args.simulator)
        except Exception as exc:
            rows.append((False, f"running the GPU path failed: {type(exc).__name__}: {exc}"))
    for ok, line in rows:
        mark = "  " if ok is None else ("ok" if ok else "NO")
        print(f"[{mark}] {line}")
    if reason is not None:
        print(f"[NO] the {name} backend cannot be used: {reason}")
    if reason is None and all(ok is not False for ok, _ in rows):
        print(f"GPU check passed: the {name} backend works on this machine.")
        return 0
    if not args.simulator:
        print(
            'To fix: pip install -e ".[cuda]" (CUDA 13 driver) or -e ".[cuda12]" (CUDA 12 driver); '
            "without a GPU, --simulator checks the same code path in numba's CUDA simulator."
        )
    return 1


if __name__ == "__main__":
    sys.exit(main())
