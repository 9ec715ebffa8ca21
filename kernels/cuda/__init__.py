"""Hand-written GPU kernels (numba.cuda), one module per family, beside the CPU ladders.

    gemm.py         cublas (baseline, default) | v1_naive | v2_tiled | v3_regblock |
                    v4_double_buffered | v5_vectorized
    im2col.py       im2col / col2im: v1_naive (col2im with atomics) | v2_caffe (default)
    pooling.py      max / average, forward and backward: v1_scatter | v2_gather (backward)
    softmax.py      softmax fwd/bwd: v1_thread | v2_block | v3_auto; loss fwd/bwd; fused
                    softmax + cross-entropy (a lab kernel: not in the backend contract)
    elementwise.py  ReLU / sigmoid / tanh: v1_naive | v2_gridstride (default)
    sgd.py          the whole SGD step (decay, momentum, update) fused
    _reduce.py      the block reduction the softmax and loss kernels share
    _launch.py      the launcher: the one place where a real GPU and numba's simulator differ
    bench.py        ``python -m kernels.cuda.bench``: every version against cuBLAS / bandwidth

Each family module has the CPU family's contract with the launcher ``L`` as an extra first
argument, ``VERSIONS`` (public name -> {version -> function}), ``DEFAULTS`` and ``use(version)``;
the float64 references are the CPU files' (imported, not copied).  The GPU backends
(``minicaffe/backend/cuda.py``, ``cudasim.py``) bind ``L`` and look kernels up at call time, so
``kernels.cuda.use("gemm", "v2_tiled")`` or ``MINICAFFE_CUDA_KERNELS="gemm=v2_tiled"`` switches what
the engine runs.

Importing a family module imports ``numba.cuda``, which fixes this process's CUDA target: the
real one, or the simulator when ``NUMBA_ENABLE_CUDASIM=1``.  This package never imports
minicaffe.
"""

import importlib
import os

FAMILIES = ("gemm", "im2col", "pooling", "softmax", "elementwise", "sgd")


def family(name):
    if name not in FAMILIES:
        raise ValueError(f"unknown GPU kernel family '{name}'; known: {', '.join(FAMILIES)}")
    return importlib.import_module(f"{__name__}.{name}")


def use(family_name, version):
    """Make ``version`` the one the GPU backends run for ``family_name`` ("default" restores it)."""
    family(family_name).use(version)


def apply_env():
    """Apply MINICAFFE_CUDA_KERNELS="family=version,..." (the GPU backends call this at import)."""
    spec = os.environ.get("MINICAFFE_CUDA_KERNELS", "").strip()
    for item in filter(None, (s.strip() for s in spec.split(","))):
        fam, sep, ver = item.partition("=")
        if not sep or not ver.strip():
            raise ValueError(f"MINICAFFE_CUDA_KERNELS: expected family=version, got '{item}'")
        try:
            use(fam.strip(), ver.strip())
        except ValueError as e:
            raise ValueError(f"MINICAFFE_CUDA_KERNELS: {e}") from None
