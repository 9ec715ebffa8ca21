"""The GPU GEMM ladder (kernels/cuda/gemm.py): every rung correct in numba's simulator on shapes
that are not multiples of any tile, and the code-generation properties that make each rung
faster than the one below it, checked on the PTX (no GPU needed).

Correctness: random matrices (never the identity, which hides a swapped index), every
transpose pair, alpha/beta with beta == 0 meaning "C is not read" (C starts as NaN there).  The
register-blocked rungs also run with the tile sizes a GPU launches (128 x 128 blocks of 8 x 8
per thread), so the configuration that will be timed is the one proven here.

Code generation (a fresh process on numba's real CUDA target compiles the kernels to PTX and
``ptxas`` assembles them for sm_80, as tests/test_cuda_ptx.py does; skipped, saying why, where
there is no NVVM): no local-memory traffic (accumulators in registers), at most 128 registers
(two 256-thread blocks per SM), the inner loop's FMA : shared-load ratio TM*TN : (TM + TN) with
the shared loads' offsets folded into the instruction, and v4's single barrier per K-slice with
the next slice's global loads issued before this slice's FMAs.
"""

import re
import shutil

import numpy as np
import pytest
from kernel_check import assert_close, sum_tol
from ptx_check import compile_in_subprocess

from minicaffe import backend as _backend

RUNGS = ["v1_naive", "v2_tiled", "v3_regblock", "v4_double_buffered", "v5_vectorized"]
BLOCKED = ["v3_regblock", "v4_double_buffered", "v5_vectorized"]


@pytest.fixture(scope="module")
def sim():
    reason = _backend.why_not("cudasim")
    if reason is not None:
        pytest.skip(f"cudasim: {reason}")
    _backend.get("cudasim")
    from kernels.cuda import _launch

    return _launch


def launcher(_launch, **config):
    import dataclasses

    return _launch.Launcher(simulator=True, config=dataclasses.replace(_launch.SIM_WIDE_CONFIG, **config))


def check_product(L, version, M, K, N, ta, tb, alpha, beta, seed):
    from kernels.cuda import gemm
    from kernels.gemm import gemm_reference

    rng = np.random.default_rng(seed)
    a = rng.standard_normal((K, M) if ta else (M, K)).astype(np.float32)
    b = rng.standard_normal((N, K) if tb else (K, N)).astype(np.float32)
    c0 = rng.standard_normal((M, N)).astype(np.float32)
    if beta == 0:
        c0[...] = np.nan  # must not be read
    ref = gemm_reference(ta, tb, alpha, a, b, beta, c0)
    mag = gemm_reference(ta, tb, abs(alpha), np.abs(a), np.abs(b), abs(beta), np.abs(np.nan_to_num(c0)))
    c = L.xp.array(c0, copy=True)
    gemm.VERSIONS["gemm"][version](L, ta, tb, alpha, L.xp.array(a, copy=True), L.xp.array(b, copy=True), beta, c)
    assert_close(
        c.get(),
        ref,
        sum_tol(np.float32, K + 1, mag),
        kernel="gemm",
        version=version,
        shape=f"M,K,N={M, K, N} trans={ta, tb} alpha,beta={alpha, beta} tiles={L.config.regblock}",
    )


TRANSPOSES = [(False, False), (False, True), (True, False), (True, True)]
ALPHA_BETA = [(1.0, 0.0), (0.5, 0.25), (-1.5, 0.0), (2.0, -1.0)]  # one per transpose pair


@pytest.mark.parametrize("version", RUNGS)
def test_rungs_on_odd_shapes(sim, version):
    """1x1x1 and 17x9x33 (M, K, N) with the simulator's small tiles (v3-v5: 16 x 16 blocks of
    4 x 4 per thread; a 3 x 3 grid that strides): every transpose pair, each with its own
    alpha/beta."""
    L = launcher(sim, gemm_tile=8)  # v2: 8 x 8 tiles (4 x 4 costs the simulator twice the barriers)
    for M, K, N in ((1, 1, 1), (17, 9, 33)):
        for (ta, tb), (alpha, beta) in zip(TRANSPOSES, ALPHA_BETA):
            check_product(L, version, M, K, N, ta, tb, alpha, beta, seed=M + 7 * N)


@pytest.mark.parametrize(
    "version,ta,tb", [("v3_regblock", False, True), ("v4_double_buffered", True, False), ("v5_vectorized", True, True)]
)
def test_gpu_tiles_on_a_shape_no_tile_divides(sim, version, ta, tb):
    """130 x 50 x 70 with the GPU's own tile sizes (128 x 128 x 8, 8 x 8 per thread: 256
    threads), one block striding over the two row tiles: partial tiles in M, N and K at once."""
    L = launcher(sim, regblock=sim.GPU_CONFIG.regblock, gemm_grid=1)
    check_product(L, version, 130, 50, 70, ta, tb, 0.5, 0.25, seed=3)


@pytest.mark.slow
@pytest.mark.parametrize("version", BLOCKED)
@pytest.mark.parametrize("ta,tb", TRANSPOSES)
def test_gpu_tiles_every_transpose(sim, version, ta, tb):
    L = launcher(sim, regblock=sim.GPU_CONFIG.regblock, gemm_grid=2)
    for alpha, beta in ((1.0, 0.0), (0.5, 0.25)):
        check_product(L, version, 130, 50, 70, ta, tb, alpha, beta, seed=11)


def test_blocking_shapes_are_checked(sim):
    from kernels.cuda import gemm

    with pytest.raises(ValueError, match="powers of two"):
        gemm.make_regblock(96, 128, 8, 8, 8)  # 96 is not a power of two
    with pytest.raises(ValueError, match="dividing"):
        gemm.make_double_buffered(128, 128, 8, 16, 16)  # 64 threads cannot load a 128-wide row
    with pytest.raises(ValueError, match="multiples of 4"):
        gemm.make_vectorized(32, 32, 8, 2, 2)  # float4 fragments need 4 | TM, TN


def test_the_top_rung_is_selectable(sim):
    import kernels.cuda as kc
    from kernels.cuda import gemm

    assert gemm.DEFAULTS["gemm"] == "cublas"
    try:
        kc.use("gemm", "v4_double_buffered")
        assert gemm.gemm is gemm.VERSIONS["gemm"]["v4_double_buffered"]
    finally:
        kc.use("gemm", "default")
    assert gemm.gemm is gemm.VERSIONS["gemm"]["cublas"]


# -- what the compiler makes of the rungs (PTX; no GPU needed) ------------------------------------------------
SCRIPT = r"""
import json, os, shutil, subprocess, sys, tempfile
import types as _types
from numba import cuda, types as T
# the device functions the kernels call are compiled "for the current device", which asks the
# driver; with no GPU, say it is an sm_80 (as tests/test_cuda_ptx.py does)
import numba.cuda.dispatcher as _disp
_disp.get_current_device = lambda: _types.SimpleNamespace(compute_capability=(8, 0))
from kernels.cuda import gemm, _launch

f32 = T.float32
C2 = T.Array(f32, 2, "C")
BM, BN, BK, TM, TN = _launch.GPU_CONFIG.regblock
builds = {
    "v3.nn": gemm.make_regblock(BM, BN, BK, TM, TN, False, False, True),
    "v3.tt.beta": gemm.make_regblock(BM, BN, BK, TM, TN, True, True, False),
    "v4.nn": gemm.make_double_buffered(BM, BN, BK, TM, TN, False, False, True),
    "v4.tn.beta": gemm.make_double_buffered(BM, BN, BK, TM, TN, True, False, False),
    "v5.nn": gemm.make_vectorized(BM, BN, BK, TM, TN, False, False, True),
    "v5.nt.beta": gemm.make_vectorized(BM, BN, BK, TM, TN, False, True, False),
}
ptxas = shutil.which("ptxas")
out = {}
for name, k in builds.items():
    ptx, _ = cuda.compile_ptx(k.py_func, (f32, C2, C2, f32, C2), cc=(8, 0))
    rec = {"ptx": ptx}
    if ptxas:
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "k.ptx")
            open(p, "w").write(ptx)
            r = subprocess.run([ptxas, "-arch=sm_80", "-v", p, "-o", os.path.join(d, "k.cubin")],
                               capture_output=True, text=True)
            rec["ptxas_rc"], rec["ptxas"] = r.returncode, r.stdout + r.stderr
    out[name] = rec
from kernels.cuda import bench
ptx, _ = cuda.compile_ptx(bench.make_fma_burn().py_func, (T.Array(f32, 1, "C"), T.int64), cc=(8, 0))
out["fma_burn"] = {"ptx": ptx}
out["regblock"] = [BM, BN, BK, TM, TN]
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def ptx():
    return compile_in_subprocess(SCRIPT, "the GEMM rungs", timeout=600)


def inner_loop(ptx_text, fmas):
    """The body of the loop that holds the outer products: the PTX from a label to the branch
    back to it, holding at least ``fmas`` FMAs and no barrier."""
    for m in re.finditer(r"^(\$L__BB\d+_\d+):", ptx_text, re.M):
        label = m.group(1)
        back = re.search(rf"\bbra(?:\.uni)?\s+{re.escape(label)};", ptx_text[m.end() :])
        if not back:
            continue
        body = ptx_text[m.end() : m.end() + back.end()]
        if "bar.sync" not in body and len(re.findall(r"\bfma\.rn\.f32\b", body)) >= fmas:
            return body
    return None


def instructions(body):
    return [ln.split()[0] for ln in body.splitlines() if re.match(r"\s+[@a-z]", ln)]


def gemm_builds(ptx):
    return {k: v for k, v in ptx.items() if k.startswith("v")}


def test_no_local_memory_and_float32_only(ptx):
    for name, rec in {**gemm_builds(ptx), "fma_burn": ptx["fma_burn"]}.items():
        text = rec["ptx"]
        assert not re.search(r"\b(?:ld|st)\.local\b", text), f"{name}: accumulators spilled to local memory"
        assert not re.search(r"\b(?:fma|mul|add)(?:\.rn)?\.f64\b", text), f"{name}: float64 math in a float32 kernel"


def test_registers_fit_two_blocks_per_sm(ptx):
    if not shutil.which("ptxas"):
        pytest.skip("no ptxas on PATH: register counts need it")
    for name, rec in gemm_builds(ptx).items():
        assert rec["ptxas_rc"] == 0, (name, rec["ptxas"][-800:])
        regs = int(re.search(r"Used (\d+) registers", rec["ptxas"]).group(1))
        spills = [int(x) for x in re.findall(r"(\d+) bytes spill (?:stores|loads)", rec["ptxas"])]
        assert not any(spills), f"{name}: ptxas spills ({rec['ptxas'][-300:]})"
        # 256 threads x 128 registers = half of an SM's 64K: two blocks resident, 16 warps
        assert regs <= 128, f"{name}: {regs} registers, so only one 256-thread block per SM"


def test_inner_loop_is_fmas_and_folded_shared_loads(ptx):
    """Per k: TM + TN values from shared memory for TM * TN FMAs, the loads' offsets constant in
    the instruction (``[%rd+64]``), and little else: the unsigned-index idiom at work.  v3 and v4
    load them one float at a time (``ld.shared.f32``); v5 four at a time (``ld.shared.v4.f32``:
    its tiles are arrays of 16-byte records, which numba aligns to 16 bytes) and stores its tiles
    the same way (``st.shared.v4.f32``)."""
    BM, BN, BK, TM, TN = ptx["regblock"]  # the GPU's (read in the subprocess: importing kernels.cuda
    for name, rec in gemm_builds(ptx).items():  # here would fix this process's numba target)
        body = inner_loop(rec["ptx"], TM * TN)
        assert body is not None, f"{name}: no loop of {TM * TN}+ FMAs without a barrier"
        ops = instructions(body)
        n_fma = sum(op == "fma.rn.f32" for op in ops)
        n_lds = sum(op == "ld.shared.f32" for op in ops)
        n_lds4 = sum(op == "ld.shared.v4.f32" for op in ops)
        steps = n_fma // (TM * TN)  # k-steps in one pass of the loop (the compiler may unroll)
        assert steps >= 2 and n_fma == steps * TM * TN, (name, n_fma)  # step() does two k per pass
        if name.startswith("v5"):
            assert n_lds == 0 and n_lds4 == steps * (TM + TN) // 4, (name, n_lds, n_lds4)
            assert "st.shared.v4.f32" in rec["ptx"] and "st.shared.f32" not in rec["ptx"], name
        else:
            assert n_lds4 == 0 and n_lds == steps * (TM + TN), (name, n_lds, n_lds4)
        loads = n_lds + n_lds4
        folded = re.findall(r"ld\.shared(?:\.v4)?\.f32\s+[%{][^\[]*\[%r[d]?\d+\+\d+\]", body)
        assert len(folded) >= loads - 2 * steps, f"{name}: shared-load offsets not folded ({len(folded)} of {loads})"
        # FMAs are most of the loop (v3: 128 of 177 PTX instructions, v5: 128 of 153; the 64x64 /
        # 4x4 kernel this ladder replaced had 16 of 66: 42 of 64-bit index arithmetic per k)
        share = 0.8 if name.startswith("v5") else 0.68
        assert n_fma >= share * len(ops), f"{name}: {n_fma} FMAs in a loop of {len(ops)} instructions"


def test_double_buffering_structure(ptx):
    """v3: two barriers per K-slice; v4 and v5: one, with the next slice's global loads issued before
    the FMAs (in program order: the compiler is free to keep them early, not to sink them past
    a barrier)."""
    TM, TN = ptx["regblock"][3:]
    for name, rec in gemm_builds(ptx).items():
        text = rec["ptx"]
        body = inner_loop(text, TM * TN)
        start = text.index(body)
        slice_loop = None  # the innermost loop around the outer products that holds a barrier
        for label in reversed(re.findall(r"^(\$L__BB\d+_\d+):", text[: start - 1], re.M)):
            back = re.search(rf"\bbra(?:\.uni)?\s+{re.escape(label)};", text[start:])
            if back and "bar.sync" in text[text.index(label + ":") : start + back.end()]:
                slice_loop = text[text.index(label + ":") : start + back.end()]
                break
        assert slice_loop is not None, f"{name}: no K-slice loop found"
        bars = slice_loop.count("bar.sync")
        if name.startswith("v3"):
            assert bars == 2, (name, bars)
        else:  # v4 and v5
            assert bars == 1, (name, bars)
            first_fma = slice_loop.index("fma.rn.f32")
            assert "ld.global" in slice_loop[:first_fma], f"{name}: the next slice is not fetched before the FMAs"


# -- the GPU benchmark's GEMM part, driven in the simulator (its timing needs a GPU) ---------------------------
SMALL_CASES = [("odd", 9, 11, 5, False, True), ("tiny", 3, 4, 2, True, False)]


def test_benchmark_validates_each_case_and_flags_rates_above_the_ceiling(sim, capsys):
    """The benchmark's GEMM loop with a stand-in clock: every version is run and validated on
    each case's own inputs before its time is taken; a clock that reports impossible speed is
    flagged against the memory ceiling, a plausible one is not."""
    from kernels.cuda import bench

    L = launcher(sim)
    calls = []

    def clock(seconds):
        def timer(fn):
            fn()
            calls.append(fn)
            return seconds

        return timer

    rows, flagged = bench.bench_gemm(L, clock(1e-3), 0, 1e12, lambda nbytes: 1000.0, shapes=SMALL_CASES)
    assert flagged == 0 and len(rows) == len(SMALL_CASES) * (1 + len(RUNGS)) == len(calls)
    assert {r["version"] for r in rows} == {"cublas", *RUNGS}
    rows, flagged = bench.bench_gemm(L, clock(1e-12), 0, 1e12, lambda nbytes: 1000.0, shapes=SMALL_CASES[1:])
    assert flagged == 1 + len(RUNGS), capsys.readouterr().out
    assert "above their ceiling" in capsys.readouterr().out


def test_benchmark_refuses_a_wrong_product(sim):
    from kernels.cuda import bench

    L = launcher(sim)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((9, 7)).astype(np.float32), rng.standard_normal((7, 5)).astype(np.float32)
    ref = L.xp.asarray(a @ b)
    bound = 9 * np.finfo(np.float32).eps * L.xp.asarray(np.abs(a) @ np.abs(b))
    good = L.xp.asarray((a @ b).copy())
    bench.gemm_case_check(L.xp, "good", None, None, good, ref, bound)
    bad = (a @ b).copy()
    bad[3, 2] += 1e-3  # one element off by far more than rounding
    with pytest.raises(SystemExit, match="not timing a wrong kernel"):
        bench.gemm_case_check(L.xp, "bad", None, None, L.xp.asarray(bad), ref, bound)


def test_benchmark_without_a_gpu_says_why_and_exits_0(capsys):
    from kernels.cuda import bench

    assert bench.main(["--family", "gemm"]) == 0
    out = capsys.readouterr().out
    assert "no GPU benchmark here" in out


def test_the_benchmarks_fma_kernel_is_64_float32_fmas_per_pass(ptx):
    """The compute ceiling is only as good as this kernel: its inner loop must unroll to 64
    independent float32 FMAs per pass (float64 constants would halve what it measures)."""
    text = ptx["fma_burn"]["ptx"]
    assert not re.search(r"\.f64\b", text), "the FMA-peak kernel does float64 math"
    body = inner_loop(text, 64)
    assert body is not None and len(re.findall(r"\bfma\.rn\.f32\b", body)) == 64
