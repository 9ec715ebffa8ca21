"""Lesson 3: kernels.

Convolution is im2col (copy every receptive field into a column) followed by one matrix product.
Every kernel family in ``kernels/`` has a float64 numpy reference and a ladder of numba
versions; ``kernels.use(family, version)`` picks the one the engine runs.
"""

import os
import time

import numpy as np

import kernels
from kernels import gemm, im2col

QUICK = os.environ.get("MINICAFFE_TUTORIAL_QUICK") == "1"
rng = np.random.default_rng(0)

# -- 1. im2col by hand -------------------------------------------------------------------------
x = rng.standard_normal((1, 2, 4, 4)).astype(np.float32)  # N, C, H, W
kh = kw = 3
oh = ow = 2  # (4 - 3) // 1 + 1
col = np.empty((2 * kh * kw, 1 * oh * ow), np.float32)
im2col.im2col(x, kh, kw, 0, 0, 1, 1, 1, 1, col)
# column (oh, ow) holds the 3x3 patch of each channel whose corner is (oh, ow):
patch = x[0, :, 1:4, 0:3].reshape(-1)  # oh = 1, ow = 0
print("column for output (1, 0):", col[:, 1 * ow + 0][:4], "... by hand:", patch[:4], "...")
assert np.array_equal(col[:, 2], patch)

# -- 2. the GEMM ladder ------------------------------------------------------------------------
n = 128 if QUICK else 512
a = rng.standard_normal((n, n)).astype(np.float32)
b = rng.standard_normal((n, n)).astype(np.float32)
reference = gemm.gemm_reference(False, False, 1.0, a, b, 0.0, None)
print(f"\nGEMM {n}x{n}x{n}: versions {list(gemm.VERSIONS['gemm'])}")
for version, fn in gemm.VERSIONS["gemm"].items():
    c = np.empty((n, n), np.float32)
    fn(False, False, 1.0, a, b, 0.0, c)  # compile (numba) and check
    err = np.abs(c - reference).max()
    times = []
    for _ in range(3):
        t = time.perf_counter()
        fn(False, False, 1.0, a, b, 0.0, c)
        times.append(time.perf_counter() - t)
    best = min(times)
    print(f"  {version:<14} {1e3 * best:8.2f} ms  {2 * n**3 / best / 1e9:7.1f} GFLOP/s  max error {err:.1e}")
    assert err < 1e-3 * n**0.5


# -- 3. choosing the version the engine runs ---------------------------------------------------
def current():
    return next(v for v, fn in gemm.VERSIONS["gemm"].items() if fn is gemm.gemm)


kernels.use("gemm", "v2_reordered")  # every layer's GEMM now runs this numba version
print("\nengine GEMM is now", current())
assert current() == "v2_reordered"
kernels.use("gemm", gemm.DEFAULTS["gemm"])
print("and back to", current())
print("lesson 3 done")
