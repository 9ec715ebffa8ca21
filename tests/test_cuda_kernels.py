"""Every version of every GPU kernel family (kernels/cuda) against the CPU files' float64
references, on tiny odd shapes.

Runs on the GPU target this process has: numba's simulator (the default test run: numpy arrays)
or, in a process started with NUMBA_ENABLE_CUDASIM=0 on a machine with a GPU, the real device
(CuPy arrays; those cases are marked ``gpu``).  The kernels are the same either way.
"""

import math

import numpy as np
import pytest
from kernel_check import assert_close, assert_equal, eps, sum_tol

from minicaffe import backend as _backend


@pytest.fixture(scope="module", params=["cudasim", pytest.param("cuda", marks=pytest.mark.gpu)])
def L(request):
    reason = _backend.why_not(request.param)
    if reason is not None:
        pytest.skip(f"{request.param}: {reason}")
    _backend.get(request.param)  # selects numba's target (the simulator for cudasim)
    from kernels.cuda import _launch

    if request.param == "cudasim":  # more threads per launch than the engine's simulator config
        launcher = _launch.Launcher(simulator=True, config=_launch.SIM_WIDE_CONFIG)
    else:
        launcher = _launch.launcher(simulator=False)
    yield launcher
    for fam in ("gemm", "im2col", "pooling", "softmax", "elementwise", "sgd"):
        import kernels.cuda as kc

        kc.use(fam, "default")


def dev(L, a):
    """A device copy of host array a (a copy in the simulator too: kernels write in place)."""
    return L.xp.array(np.ascontiguousarray(a), copy=True)


def host(L, a):
    return a.get() if hasattr(a, "get") else np.array(a)


# -- GEMM -----------------------------------------------------------------------------------------------
GEMM_SHAPES = [(1, 1, 1), (5, 7, 9), (9, 3, 17), (13, 11, 6)]


@pytest.mark.parametrize(
    "version", ["cublas", "v1_naive", "v2_tiled", "v3_regblock", "v4_double_buffered", "v5_vectorized"]
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gemm_versions(L, version, dtype):
    from kernels.cuda import gemm
    from kernels.gemm import gemm_reference

    rng = np.random.default_rng(7)
    f = gemm.VERSIONS["gemm"][version]
    for M, K, N in GEMM_SHAPES:
        for ta in (False, True):
            for tb in (False, True):
                for alpha, beta in ((1.0, 0.0), (0.5, 0.25)):
                    a = rng.standard_normal((K, M) if ta else (M, K)).astype(dtype)
                    b = rng.standard_normal((N, K) if tb else (K, N)).astype(dtype)
                    c0 = rng.standard_normal((M, N)).astype(dtype)
                    if beta == 0:
                        c0[...] = np.nan  # must not be read
                    ref = gemm_reference(ta, tb, alpha, a, b, beta, c0)
                    mag = gemm_reference(ta, tb, abs(alpha), np.abs(a), np.abs(b), abs(beta), np.abs(np.nan_to_num(c0)))
                    c = dev(L, c0)
                    f(L, ta, tb, alpha, dev(L, a), dev(L, b), beta, c)
                    assert_close(
                        host(L, c),
                        ref,
                        sum_tol(dtype, K + 1, mag),
                        kernel="gemm",
                        version=version,
                        shape=f"M,K,N={M, K, N} trans={ta, tb} alpha,beta={alpha, beta}",
                    )


def test_gemm_gpu_tile_sizes_in_simulator(L):
    """The tile sizes a GPU launches (16x16 tiles; 64x64 register blocks of 4x4) on one small
    product, so the configuration the GPU runs is itself checked, not only the simulator's."""
    if not L.simulator:
        pytest.skip("the GPU runs these sizes in test_gemm_versions already")
    from kernels.cuda import _launch, gemm
    from kernels.gemm import gemm_reference

    rng = np.random.default_rng(3)
    a = rng.standard_normal((18, 5)).astype(np.float32)
    b = rng.standard_normal((5, 17)).astype(np.float32)
    ref = gemm_reference(False, False, 1.0, a, b, 0.0, None)
    for T in (16,):
        c = dev(L, np.zeros((18, 17), np.float32))
        L.launch(gemm.make_tiled(T), (1, 1), (T, T), np.float32(1), dev(L, a), dev(L, b), np.float32(0), c)
        assert_close(host(L, c), ref, sum_tol(np.float32, 6, np.abs(a) @ np.abs(b)), kernel="gemm", version=f"tiled{T}")
    BM, BN, BK, TM, TN = _launch.GPU_CONFIG.regblock
    c = dev(L, np.zeros((18, 17), np.float32))
    L.launch(
        gemm.make_regblock(BM, BN, BK, TM, TN),
        (1, 1),
        (BN // TN, BM // TM),
        np.float32(1),
        dev(L, a),
        dev(L, b),
        np.float32(0),
        c,
    )
    assert_close(host(L, c), ref, sum_tol(np.float32, 6, np.abs(a) @ np.abs(b)), kernel="gemm", version="regblock64")


def test_gemm_aliasing_and_shape_errors(L):
    from kernels.cuda import gemm
    from kernels.gemm import gemm_reference

    a = np.arange(12, dtype=np.float64).reshape(3, 4)
    # a random matrix, not the identity: I @ I = I however the kernel reads c while writing it
    m = np.random.default_rng(5).standard_normal((5, 5))
    want = gemm_reference(False, False, 1.0, m, m, 0.0, None)
    for version, f in gemm.VERSIONS["gemm"].items():
        c = dev(L, m)
        f(L, False, False, 1.0, c, c, 0.0, c)  # c = c @ c with c aliased
        assert_close(host(L, c), want, sum_tol(np.float64, 6, np.abs(m) @ np.abs(m)), kernel="gemm", version=version)
        c = dev(L, m)
        f(L, True, False, 0.5, c, c, 1.0, c)  # c = 0.5 c^T c + c: beta reads c too
        want_t = gemm_reference(True, False, 0.5, m, m, 1.0, m)
        assert_close(
            host(L, c),
            want_t,
            sum_tol(np.float64, 7, np.abs(m).T @ np.abs(m) + np.abs(m)),
            kernel="gemm",
            version=version,
        )
        with pytest.raises(ValueError, match="does not fit"):
            f(L, False, False, 1.0, dev(L, a), dev(L, a), 0.0, dev(L, np.zeros((3, 4))))


# -- im2col / col2im -----------------------------------------------------------------------------------------
IM2COL_CASES = [
    # (N, C, H, W), (kh, kw, ph, pw, sh, sw, dh, dw)
    ((2, 3, 5, 6), (3, 3, 1, 1, 1, 1, 1, 1)),
    ((1, 2, 7, 5), (3, 2, 0, 1, 2, 1, 1, 2)),
    ((2, 1, 4, 4), (2, 2, 0, 0, 2, 2, 1, 1)),
    ((1, 2, 3, 3), (1, 1, 0, 0, 1, 1, 1, 1)),
]


@pytest.mark.parametrize("version", ["v1_naive", "v2_caffe"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_im2col_col2im_versions(L, version, dtype):
    from kernels.cuda import im2col as K
    from kernels.im2col import col2im_reference, im2col_reference

    rng = np.random.default_rng(11)
    for shape, geo in IM2COL_CASES:
        x = rng.standard_normal(shape).astype(dtype)
        ref = im2col_reference(x, *geo)
        col = dev(L, np.full(ref.shape, np.nan, dtype))
        K.VERSIONS["im2col"][version](L, dev(L, x), *geo, col)
        assert_equal(host(L, col), ref.astype(dtype), kernel="im2col", version=version, shape=f"{shape} {geo}")
        c = rng.standard_normal(ref.shape).astype(dtype)
        xr = col2im_reference(c, *geo, shape)
        xo = dev(L, np.full(shape, np.nan, dtype))
        K.VERSIONS["col2im"][version](L, dev(L, c), *geo, xo)
        taps = geo[0] * geo[1]
        mag = col2im_reference(np.abs(c), *geo, shape)
        assert_close(
            host(L, xo), xr, sum_tol(dtype, taps, mag), kernel="col2im", version=version, shape=f"{shape} {geo}"
        )


def test_im2col_wrong_col_shape_is_a_value_error(L):
    from kernels.cuda import im2col as K

    x = dev(L, np.zeros((1, 1, 4, 4)))
    with pytest.raises(ValueError, match="col must have shape"):
        K.im2col(L, x, 3, 3, 0, 0, 1, 1, 1, 1, dev(L, np.zeros((9, 5))))


# -- pooling -------------------------------------------------------------------------------------------------
def pooled(size, k, s, p):
    out = int(math.ceil((size + 2 * p - k) / s)) + 1
    if p and (out - 1) * s >= size + p:
        out -= 1
    return out


POOL_CASES = [
    ((2, 3, 7, 6), (3, 3, 2, 2, 1, 1)),
    ((1, 2, 4, 4), (2, 2, 2, 2, 0, 0)),
    ((2, 1, 5, 7), (3, 2, 1, 2, 0, 1)),
    ((1, 1, 6, 6), (3, 3, 3, 3, 0, 0)),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_pooling_versions(L, dtype):
    from kernels.cuda import pooling as K
    from kernels.pooling import (
        ave_pool_bwd_reference,
        ave_pool_fwd_reference,
        max_pool_bwd_reference,
        max_pool_fwd_reference,
    )

    rng = np.random.default_rng(5)
    for shape, (kh, kw, sh, sw, ph, pw) in POOL_CASES:
        N, C, H, W = shape
        PH, PW = pooled(H, kh, sh, ph), pooled(W, kw, sw, pw)
        x = rng.permutation(np.linspace(-1, 1, int(np.prod(shape)))).reshape(shape).astype(dtype)
        dy = rng.standard_normal((N, C, PH, PW)).astype(dtype)
        where = f"{shape} k{kh}x{kw} s{sh}x{sw} p{ph}x{pw}"
        yr, mr = max_pool_fwd_reference(x, kh, kw, sh, sw, ph, pw, PH, PW)
        for v, f in K.VERSIONS["max_pool_fwd"].items():
            y, m = dev(L, np.zeros((N, C, PH, PW), dtype)), dev(L, np.zeros((N, C, PH, PW), np.int32))
            f(L, dev(L, x), kh, kw, sh, sw, ph, pw, y, m)
            assert_equal(host(L, y), yr.astype(dtype), kernel="max_pool_fwd", version=v, shape=where)
            assert_equal(host(L, m), mr, kernel="max_pool_fwd mask", version=v, shape=where)
        dxr = max_pool_bwd_reference(dy, mr, shape)
        for v, f in K.VERSIONS["max_pool_bwd"].items():
            dx = dev(L, np.full(shape, np.nan, dtype))
            f(L, dev(L, dy), dev(L, mr), kh, kw, sh, sw, ph, pw, dx)
            assert_close(
                host(L, dx),
                dxr,
                sum_tol(dtype, kh * kw, max_pool_bwd_reference(np.abs(dy), mr, shape)),
                kernel="max_pool_bwd",
                version=v,
                shape=where,
            )
        ar = ave_pool_fwd_reference(x, kh, kw, sh, sw, ph, pw, PH, PW)
        for v, f in K.VERSIONS["ave_pool_fwd"].items():
            y = dev(L, np.zeros((N, C, PH, PW), dtype))
            f(L, dev(L, x), kh, kw, sh, sw, ph, pw, y)
            assert_close(
                host(L, y),
                ar,
                sum_tol(dtype, kh * kw + 1, np.ones_like(ar)),
                kernel="ave_pool_fwd",
                version=v,
                shape=where,
            )
        br = ave_pool_bwd_reference(dy, kh, kw, sh, sw, ph, pw, shape)
        bm = ave_pool_bwd_reference(np.abs(dy), kh, kw, sh, sw, ph, pw, shape)
        for v, f in K.VERSIONS["ave_pool_bwd"].items():
            dx = dev(L, np.full(shape, np.nan, dtype))
            f(L, dev(L, dy), kh, kw, sh, sw, ph, pw, dx)
            assert_close(
                host(L, dx), br, sum_tol(dtype, kh * kw + 1, bm), kernel="ave_pool_bwd", version=v, shape=where
            )


# -- softmax ---------------------------------------------------------------------------------------------------
SOFTMAX_SHAPES = [(3, 5, 1), (2, 4, 3), (1, 37, 1), (4, 1, 2)]


def _exp_tol(dtype, ref, C):
    """exp on a GPU is within a few ulp (float32: __expf-free expf, 2 ulp); the sum adds C terms."""
    return (C + 8) * eps(dtype) * np.abs(ref) + 4 * float(np.finfo(dtype).tiny)


@pytest.mark.parametrize("version", ["v1_thread", "v2_block", "v3_auto"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_versions(L, version, dtype):
    from kernels.cuda import softmax as K
    from kernels.softmax import softmax_bwd_reference, softmax_fwd_reference

    rng = np.random.default_rng(2)
    for shape in SOFTMAX_SHAPES:
        x = (rng.standard_normal(shape) * 4).astype(dtype)
        ref = softmax_fwd_reference(x)
        y = dev(L, np.full(shape, np.nan, dtype))
        K.VERSIONS["softmax_fwd"][version](L, dev(L, x), y)
        assert_close(
            host(L, y), ref, _exp_tol(dtype, ref, shape[1]), kernel="softmax_fwd", version=version, shape=str(shape)
        )
        yy = ref.astype(dtype)
        dy = rng.standard_normal(shape).astype(dtype)
        dref = softmax_bwd_reference(yy, dy)
        mag = np.abs(yy) * (np.abs(dy) + (np.abs(dy) * np.abs(yy)).sum(axis=1, keepdims=True))
        dx = dev(L, np.full(shape, np.nan, dtype))
        K.VERSIONS["softmax_bwd"][version](L, dev(L, yy), dev(L, dy), dx)
        assert_close(
            host(L, dx),
            dref,
            sum_tol(dtype, shape[1] + 2, mag),
            kernel="softmax_bwd",
            version=version,
            shape=str(shape),
        )


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_loss_and_fused_xent(L, dtype):
    from kernels.cuda import softmax as K
    from kernels.softmax import softmax_fwd_reference, softmax_loss_bwd_reference, softmax_loss_fwd_reference

    rng = np.random.default_rng(9)
    for shape in SOFTMAX_SHAPES[:3]:
        outer, C, inner = shape
        x = (rng.standard_normal(shape) * 3).astype(dtype)
        prob = softmax_fwd_reference(x).astype(dtype)
        label = rng.integers(0, C, (outer, inner)).astype(dtype)
        label.flat[0] = 255  # the ignore label
        for has_ignore in (True,):
            ref_loss, ref_count = softmax_loss_fwd_reference(prob, label, 255, has_ignore)
            loss, count = K.softmax_loss_fwd(L, dev(L, prob), dev(L, label), 255, has_ignore)
            assert count == ref_count
            assert abs(loss - ref_loss) <= 64 * eps(dtype) * (abs(ref_loss) + 1), (loss, ref_loss)
            p = dev(L, np.full(shape, np.nan, dtype))
            loss2, count2 = K.softmax_xent_fwd(L, dev(L, x), dev(L, label), 255, has_ignore, p)
            assert count2 == ref_count
            assert abs(loss2 - ref_loss) <= 64 * eps(dtype) * (abs(ref_loss) + 1) * C, (loss2, ref_loss)
            assert_close(host(L, p), prob, _exp_tol(dtype, prob, C), kernel="softmax_xent_fwd prob", version="v1")
            dref = softmax_loss_bwd_reference(prob, label, 255, has_ignore, 0.7)
            dx = dev(L, np.full(shape, np.nan, dtype))
            K.softmax_loss_bwd(L, dev(L, prob), dev(L, label), 255, has_ignore, 0.7, dx)
            assert_close(
                host(L, dx), dref, 4 * eps(dtype) * (np.abs(dref) + 1), kernel="softmax_loss_bwd", version="v1"
            )


def test_softmax_loss_bad_label_names_its_position(L):
    from kernels.cuda import softmax as K

    prob = dev(L, np.full((2, 3, 2), 1 / 3))
    label = np.zeros((2, 2))
    label[1, 0] = 3
    with pytest.raises(ValueError, match=r"label 3.0 at position \(outer=1, inner=0\) is outside \[0, 3\)"):
        K.softmax_loss_fwd(L, prob, dev(L, label), -1, False)
    with pytest.raises(ValueError, match="outside"):
        K.softmax_xent_fwd(L, prob, dev(L, label), -1, False, dev(L, np.zeros((2, 3, 2))))
    dx = dev(L, np.zeros((2, 3, 2)))
    K.softmax_loss_bwd(L, prob, dev(L, label), -1, False, 1.0, dx)  # no sync: NaN marks the row
    d = host(L, dx)
    assert np.isnan(d[1, :, 0]).all() and not np.isnan(np.delete(d.reshape(2, 3, 2)[1], 0, axis=1)).any()


# -- elementwise, sgd -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("version", ["v1_naive", "v2_gridstride"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_elementwise_versions(L, version, dtype):
    from kernels.cuda import elementwise as K
    from kernels.elementwise import REFERENCES as R

    rng = np.random.default_rng(4)
    for n in (1, 7, 61):
        x = rng.uniform(-3, 3, n).astype(dtype)
        dy = rng.standard_normal(n).astype(dtype)
        y_sig = R["sigmoid_fwd"](x).astype(dtype)
        y_tanh = R["tanh_fwd"](x).astype(dtype)
        cases = [
            ("relu_fwd", (x, 0.1), R["relu_fwd"](x, 0.1)),
            ("relu_bwd", (x, dy, 0.1), R["relu_bwd"](x, dy, 0.1)),
            ("sigmoid_fwd", (x,), R["sigmoid_fwd"](x)),
            ("sigmoid_bwd", (y_sig, dy), R["sigmoid_bwd"](y_sig, dy)),
            ("tanh_fwd", (x,), R["tanh_fwd"](x)),
            ("tanh_bwd", (y_tanh, dy), R["tanh_bwd"](y_tanh, dy)),
        ]
        for fn, args, ref in cases:
            out = dev(L, np.full(n, np.nan, dtype))
            K.VERSIONS[fn][version](L, *[dev(L, a) if isinstance(a, np.ndarray) else a for a in args], out)
            # bound: a few roundings of the result, plus (backward) of the dy * (1 +- y*y) terms
            tol = 8 * eps(dtype) * (np.abs(ref) + 2 * np.abs(dy) * fn.endswith("bwd")) + 4 * float(np.finfo(dtype).tiny)
            assert_close(host(L, out), ref, tol, kernel=fn, version=version, shape=f"n={n}")
        # in place: y is x
        xx = dev(L, x)
        K.VERSIONS["relu_fwd"][version](L, xx, 0.1, xx)
        assert_close(
            host(L, xx), R["relu_fwd"](x, 0.1), 2 * eps(dtype) * np.abs(x), kernel="relu_fwd in place", version=version
        )


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sgd_step(L, dtype):
    from kernels.cuda import sgd
    from kernels.sgd import sgd_step_reference

    rng = np.random.default_rng(1)
    w, g, h = (rng.standard_normal(29).astype(dtype) for _ in range(3))
    wr, hr = sgd_step_reference(w, g, h, 0.9, 0.01, 5e-4)
    wd, gd, hd = dev(L, w), dev(L, g), dev(L, h)
    sgd.sgd_step(L, wd, gd, hd, 0.9, 0.01, 5e-4)
    for name, got, want in (("w", wd, wr), ("h", hd, hr)):
        assert_close(host(L, got), want, 4 * eps(dtype) * (np.abs(want) + 1), kernel=f"sgd_step {name}", version="v1")
    assert np.array_equal(host(L, gd), g), "sgd_step wrote g (the contract: g is only read)"


def test_pooling_gather_is_deterministic(L):
    """Overlapping windows (3x3, stride 2: up to 4 windows per pixel; ties make one pixel the
    maximum of several windows): the gathering backward passes give the same bits on every
    run; max pooling's the same bits as the CPU default too, which sums in the same (p, q)
    order; average pooling's agree with the reference."""
    from kernels import pooling as CPU
    from kernels.cuda import pooling as K

    rng = np.random.default_rng(11)
    N, C, H, W, k, s = 2, 3, 9, 8, 3, 2
    x = rng.integers(0, 4, (N, C, H, W)).astype(np.float32)  # many ties: shared maxima
    PH, PW = pooled(H, k, s, 0), pooled(W, k, s, 0)
    dy = rng.standard_normal((N, C, PH, PW)).astype(np.float32)
    y, m = np.empty((N, C, PH, PW), np.float32), np.empty((N, C, PH, PW), np.int32)
    CPU.max_pool_fwd(x, k, k, s, s, 0, 0, y, m)
    assert len(set(m.ravel().tolist())) < m.size, "the case should route several windows to one pixel"
    want_max = np.empty_like(x)
    CPU.max_pool_bwd(dy, m, k, k, s, s, 0, 0, want_max)
    want_ave = CPU.ave_pool_bwd_reference(dy, k, k, s, s, 0, 0, x.shape)
    runs = []
    for _ in range(2):
        dx = dev(L, np.full(x.shape, np.nan, np.float32))
        K.VERSIONS["max_pool_bwd"]["v2_gather"](L, dev(L, dy), dev(L, m), k, k, s, s, 0, 0, dx)
        assert_equal(host(L, dx), want_max, kernel="max_pool_bwd", version="v2_gather")
        da = dev(L, np.full(x.shape, np.nan, np.float32))
        K.VERSIONS["ave_pool_bwd"]["v2_gather"](L, dev(L, dy), k, k, s, s, 0, 0, da)
        mag = CPU.ave_pool_bwd_reference(np.abs(dy), k, k, s, s, 0, 0, x.shape)
        assert_close(host(L, da), want_ave, sum_tol(np.float32, 5, mag), kernel="ave_pool_bwd", version="v2_gather")
        runs.append(host(L, da))
    assert_equal(runs[1], runs[0], kernel="ave_pool_bwd (second run)", version="v2_gather")


def test_gpu_benchmark_checks_every_version_first(L):
    """The GPU benchmark's own check (it runs before anything is timed) passes on every family."""
    from kernels.cuda import bench

    bench.check_small(L)


# -- the version switch ------------------------------------------------------------------------------------------
def test_versions_tables_and_switch(L):
    import kernels.cuda as kc

    for fam in kc.FAMILIES:
        mod = kc.family(fam)
        assert set(mod.DEFAULTS) == set(mod.VERSIONS)
        for fn, ver in mod.DEFAULTS.items():
            assert getattr(mod, fn) is mod.VERSIONS[fn][ver], (fam, fn)
    kc.use("gemm", "v2_tiled")
    assert kc.family("gemm").gemm is kc.family("gemm").VERSIONS["gemm"]["v2_tiled"]
    kc.use("gemm", "default")
    with pytest.raises(ValueError, match="no version 'v9'"):
        kc.use("gemm", "v9")
    with pytest.raises(ValueError, match="unknown GPU kernel family"):
        kc.use("fft", "v1")
