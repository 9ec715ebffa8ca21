"""The kernel ladder benchmark: validate every version against the float64 reference, then
time it, and say how close it comes to this machine's own limits.

    python -m kernels.bench [family ...] [--versions v1_naive,v4_micro] [--sizes 512,1024]
                            [--json out.json] [--plot out.png] [--quick] [--repeats N]

Families: gemm, conv, im2col, pooling, softmax, elementwise, sgd (default: all).

For each (family, case, version): one call compiles (numba), the result is checked against
the family's float64 reference (a wrong version is reported and not timed), two more calls
warm up, then the call is repeated (at least ``--repeats`` times and 0.2 s) and the median
and the spread (interquartile range / median) are reported.  Time becomes GFLOP/s for the
compute-bound families (gemm, conv) and GB/s for the memory-bound ones (bytes each version
must at least read and write once), then a fraction of a ceiling measured in the same run:

* compute: OpenBLAS SGEMM (n = 1024, single thread) -- the machine's practical FMA peak;
* memory: a numpy copy moving the same number of bytes (so a kernel whose data fits in L2 is
  compared with an L2-resident copy, not with DRAM).

The vendor baseline (numpy / OpenBLAS doing the same job, in the same dtype) is timed on the
same case where one exists, and each version's speed is given as a multiple of it.

BLAS runs single-threaded (OPENBLAS_NUM_THREADS=1, set for a re-executed child process when
the caller has not set it), so that every number is one core's.  If OPENBLAS_CORETYPE is set
in the environment (the machine's docs: it may be, and it slows a current numpy), the SGEMM
ceiling is also measured in a child process without it and both are reported; tests never
touch either variable.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np

FAMILIES = ("gemm", "conv", "im2col", "pooling", "softmax", "elementwise", "sgd")
F32 = np.float32


# -- timing ---------------------------------------------------------------------------------------
CLOCKS = {"cpu": time.thread_time, "wall": time.perf_counter}
_clock = ["cpu"]


def _time(fn, repeats, min_time=0.2, max_time=3.0, clock=None):
    """Median and interquartile spread (both seconds) of fn(); fn has been warmed up.

    The default clock is the calling thread's CPU time: on a shared machine (this one has
    2 cores and several users) a descheduled thread does not count as a slow kernel.  prange
    versions run on other threads too, so they are always timed by the wall clock."""
    tick = CLOCKS[clock or _clock[0]]
    ts = []
    t_start = time.perf_counter()
    while True:
        t0 = tick()
        fn()
        ts.append(tick() - t0)
        el = time.perf_counter() - t_start
        if (len(ts) >= repeats and el >= min_time) or el >= max_time:
            break
    ts = np.array(ts)
    q1, med, q3 = np.percentile(ts, [25, 50, 75])
    return float(med), float((q3 - q1) / med) if med > 0 else 0.0, len(ts)


def _warm(fn, n=2):
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    for _ in range(n if first < 0.5 else 0):
        fn()
    return first


# -- ceilings ------------------------------------------------------------------------------------
def sgemm_peak(n=1024, repeats=5):
    a = np.random.default_rng(0).standard_normal((n, n)).astype(F32)
    b = a.copy()
    c = np.empty_like(a)
    _warm(lambda: np.matmul(a, b, out=c))
    med, spread, _ = _time(lambda: np.matmul(a, b, out=c), repeats)
    return 2 * n**3 / med / 1e9


def _sgemm_peak_subprocess(env):
    code = "from kernels.bench import sgemm_peak; print(sgemm_peak())"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    try:
        return float(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None


_copy_cache = {}


def _copy_loop():
    from numba import njit

    @njit(nogil=True, cache=True)
    def copy_loop(dst, src, z, reps):
        # "+ z" (z = 0 at run time) keeps LLVM from turning the loop into a memcpy call,
        # whose large-size path uses non-temporal stores and would measure DRAM instead of
        # the cache the data sits in
        for _ in range(reps):
            for i in range(src.size):
                dst[i] = src[i] + z

    return copy_loop


def copy_bandwidth(nbytes, repeats=5):
    """GB/s of a copy moving ``nbytes`` in all (nbytes/2 read + nbytes/2 written, the same
    working set), measured inside one compiled loop, so that no per-call overhead is
    counted: the ceiling for a kernel whose data has that size (small: caches; large: DRAM)."""
    n = max(int(nbytes // 8), 256)  # float32 elements per buffer
    if n not in _copy_cache:
        loop = _copy_loop()
        src = np.ones(n, F32)
        dst = np.empty_like(src)
        reps = max(1, (64 << 20) // (8 * n))  # at least ~64 MB moved per timing
        loop(dst, src, F32(0), 1)
        med, _, _ = _time(lambda: loop(dst, src, F32(0), reps), repeats, min_time=0.05)
        _copy_cache[n] = 2 * src.nbytes * reps / med / 1e9
    return _copy_cache[n]


# -- cases: each builds inputs, one runner per version, a check, flops and bytes ------------------
class Case:
    def __init__(self, family, fn, name, kind, flops, nbytes, run, check, baseline=None):
        self.family, self.fn, self.name, self.kind = family, fn, name, kind
        self.flops, self.nbytes = flops, nbytes
        self.run = run  # version function -> zero-arg callable
        self.check = check  # (version fn) -> None, or AssertionError (after a run)
        self.baseline = baseline  # zero-arg callable (vendor / numpy), or None


def _close(got, ref, tol, what):
    got = np.asarray(got, dtype=np.float64)
    err = np.abs(got - ref)
    bad = ~(err <= tol)
    if bad.any():
        i = tuple(int(v) for v in np.argwhere(bad)[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.size} off; at {i} got "
            f"{got[i]!r} expected {ref[i]!r} "
            f"(tol {np.broadcast_to(tol, ref.shape)[i]:.3g})"
        )


def _sum_tol(n, mag, dtype=F32):
    return (n + 4) * float(np.finfo(dtype).eps) * mag + 1e-30


def gemm_cases(sizes, quick):
    from kernels import gemm as G

    rng = np.random.default_rng(0)
    shapes = [(f"square {n}", n, n, n, False, False) for n in sizes]
    shapes += [
        ("LeNet conv1 fwd  W@col", 20, 36864, 25, False, False),
        ("LeNet conv2 fwd  W@col", 50, 4096, 500, False, False),
        ("LeNet conv2 dW   dY@col^T", 50, 500, 4096, False, True),
        ("LeNet conv2 dcol W^T@dY", 500, 4096, 50, True, False),
        ("LeNet ip1 fwd    X@W^T", 64, 500, 800, False, True),
        ("LeNet ip2 fwd    X@W^T", 64, 10, 500, False, True),
        ("LeNet ip1 dW     dY^T@X", 500, 800, 64, True, False),
    ]
    if not quick:
        shapes += [
            ("CIFAR conv1 fwd  W@col", 32, 102400, 75, False, False),
            ("CIFAR conv2 fwd  W@col", 32, 25600, 800, False, False),
            ("CIFAR conv3 fwd  W@col", 64, 6400, 800, False, False),
            ("CIFAR ip1 fwd    X@W^T", 100, 64, 1024, False, True),
        ]
    cases = []
    for name, M, N, K, ta, tb in shapes:
        a = rng.standard_normal((K, M) if ta else (M, K)).astype(F32)
        b = rng.standard_normal((N, K) if tb else (K, N)).astype(F32)
        c = np.empty((M, N), F32)
        # the reference for big squares costs seconds: check them on a corner block instead
        ref = G.gemm_reference(ta, tb, 1.0, a, b, 0.0, None) if M * N * K <= 3e8 else None

        def run(fn, a=a, b=b, c=c, ta=ta, tb=tb):
            return lambda: fn(ta, tb, 1.0, a, b, 0.0, c)

        def check(fn, a=a, b=b, c=c, ta=ta, tb=tb, ref=ref, K=K):
            if ref is None:
                A = a.T if ta else a
                B = b.T if tb else b
                r = A[:64].astype(np.float64) @ B[:, :64].astype(np.float64)
                _close(c[:64, :64], r, _sum_tol(K, np.abs(A[:64]) @ np.abs(B[:, :64])), "gemm")
            else:
                _close(c, ref, _sum_tol(K, G.gemm_reference(ta, tb, 1.0, np.abs(a), np.abs(b), 0.0, None)), "gemm")

        cases.append(
            Case(
                "gemm",
                "gemm",
                f"{name} ({M}x{N}x{K})",
                "compute",
                2.0 * M * N * K,
                4.0 * (M * K + K * N + M * N),
                run,
                check,
                baseline=run(G.gemm_blas),
            )
        )
    return cases


def conv_cases(quick):
    from kernels import conv as CV

    rng = np.random.default_rng(1)
    shapes = [("LeNet conv1", (64, 1, 28, 28), (20, 1, 5, 5), 0), ("LeNet conv2", (64, 20, 12, 12), (50, 20, 5, 5), 0)]
    if not quick:
        shapes += [("CIFAR conv2", (100, 32, 16, 16), (32, 32, 5, 5), 2)]
    cases = []
    for name, xs, ws, p in shapes:
        x = rng.standard_normal(xs).astype(F32)
        w = rng.standard_normal(ws).astype(F32)
        bias = rng.standard_normal(ws[0]).astype(F32)
        OH = xs[2] + 2 * p - ws[2] + 1
        y = np.empty((xs[0], ws[0], OH, OH), F32)
        ref = CV.conv_fwd_reference(x, w, bias, p, p, 1, 1, 1, 1)
        mag = CV.conv_fwd_reference(np.abs(x), np.abs(w), np.abs(bias), p, p, 1, 1, 1, 1)
        K = ws[1] * ws[2] * ws[3]

        def run(fn, x=x, w=w, bias=bias, y=y, p=p):
            return lambda: fn(x, w, bias, p, p, 1, 1, 1, 1, y)

        def check(fn, y=y, ref=ref, mag=mag, K=K):
            _close(y, ref, _sum_tol(K, mag), "conv_fwd")

        flops = 2.0 * y.size * K
        cases.append(
            Case(
                "conv",
                "conv_fwd",
                f"{name} x{xs} w{ws}",
                "compute",
                flops,
                4.0 * (x.size + w.size + y.size),
                run,
                check,
            )
        )
    return cases


def im2col_cases(quick):
    from kernels import im2col as IM

    rng = np.random.default_rng(2)
    shapes = [
        ("LeNet conv1", (64, 1, 28, 28), 5, 0),
        ("LeNet conv2", (64, 20, 12, 12), 5, 0),
        ("CIFAR conv1", (100, 3, 32, 32), 5, 2),
        ("CIFAR conv2", (100, 32, 16, 16), 5, 2),
    ]
    if quick:
        shapes = shapes[:2] + shapes[3:]
    cases = []
    for name, xs, k, p in shapes:
        x = rng.standard_normal(xs).astype(F32)
        ref = IM.im2col_reference(x, k, k, p, p, 1, 1, 1, 1)
        col = np.empty(ref.shape, F32)
        back = np.empty(xs, F32)
        ref_back = IM.col2im_reference(ref, k, k, p, p, 1, 1, 1, 1, xs)
        mag_back = IM.col2im_reference(np.abs(ref), k, k, p, p, 1, 1, 1, 1, xs)
        nbytes = 4.0 * (x.size + col.size)

        def run_f(fn, x=x, col=col, k=k, p=p):
            return lambda: fn(x, k, k, p, p, 1, 1, 1, 1, col)

        def run_b(fn, col=col, back=back, k=k, p=p, ref=ref):
            col[...] = ref
            return lambda: fn(col, k, k, p, p, 1, 1, 1, 1, back)

        def check_f(fn, col=col, ref=ref):
            _close(col, ref, 0.0, "im2col")

        def check_b(fn, back=back, ref_back=ref_back, mag=mag_back, k=k):
            _close(back, ref_back, _sum_tol(k * k, mag), "col2im")

        def base_f(x=x, k=k, p=p, col=col):
            # numpy: pad, a strided window view, one copy into col's layout
            N, C, H, W = x.shape
            xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
            v = np.lib.stride_tricks.sliding_window_view(xp, (k, k), axis=(2, 3))
            col.reshape(C, k, k, N, -1)[...] = v.transpose(1, 4, 5, 0, 2, 3).reshape(C, k, k, N, -1)

        cases.append(
            Case("im2col", "im2col", f"{name} x{xs} k{k} p{p}", "memory", 0, nbytes, run_f, check_f, baseline=base_f)
        )
        cases.append(Case("im2col", "col2im", f"{name} x{xs} k{k} p{p}", "memory", 0, nbytes, run_b, check_b))
    return cases


def pooling_cases(quick):
    from kernels import pooling as PO

    rng = np.random.default_rng(3)
    shapes = [
        ("LeNet pool1 MAX", (64, 20, 24, 24), 2, 2, "max"),
        ("LeNet pool2 MAX", (64, 50, 8, 8), 2, 2, "max"),
        ("CIFAR pool1 MAX", (100, 32, 32, 32), 3, 2, "max"),
        ("CIFAR pool2 AVE", (100, 32, 16, 16), 3, 2, "ave"),
    ]
    if quick:
        shapes = [shapes[0], shapes[2], shapes[3]]
    cases = []
    for name, xs, k, s, kind in shapes:
        x = rng.standard_normal(xs).astype(F32)
        P = -(-(xs[2] - k) // s) + 1
        ys = xs[:2] + (P, P)
        y = np.empty(ys, F32)
        mask = np.empty(ys, np.int32)
        dy = rng.standard_normal(ys).astype(F32)
        dx = np.empty(xs, F32)
        if kind == "max":
            y_ref, m_ref = PO.max_pool_fwd_reference(x, k, k, s, s, 0, 0, P, P)
            dx_ref = PO.max_pool_bwd_reference(dy, m_ref, xs)

            def run_f(fn, x=x, y=y, mask=mask, k=k, s=s):
                return lambda: fn(x, k, k, s, s, 0, 0, y, mask)

            def run_b(fn, dy=dy, m=m_ref, dx=dx, k=k, s=s):
                return lambda: fn(dy, m, k, k, s, s, 0, 0, dx)

            def check_f(fn, y=y, mask=mask, y_ref=y_ref, m_ref=m_ref):
                _close(y, y_ref, 0.0, "max_pool_fwd")
                _close(mask, m_ref, 0.0, "max_pool_fwd mask")

            def check_b(fn, dx=dx, dx_ref=dx_ref, k=k, dy=dy, m=m_ref):
                _close(dx, dx_ref, _sum_tol(k * k, PO.max_pool_bwd_reference(np.abs(dy), m, dx.shape)), "max_pool_bwd")

            fwd_bytes = 4.0 * (x.size + 2 * y.size)
            bwd_bytes = 4.0 * (2 * dy.size + dx.size)
            fns = ("max_pool_fwd", "max_pool_bwd")
        else:
            y_ref = PO.ave_pool_fwd_reference(x, k, k, s, s, 0, 0, P, P)
            dx_ref = PO.ave_pool_bwd_reference(dy, k, k, s, s, 0, 0, xs)

            def run_f(fn, x=x, y=y, k=k, s=s):
                return lambda: fn(x, k, k, s, s, 0, 0, y)

            def run_b(fn, dy=dy, dx=dx, k=k, s=s):
                return lambda: fn(dy, k, k, s, s, 0, 0, dx)

            def check_f(fn, y=y, y_ref=y_ref, k=k, x=x, P=P, s=s):
                _close(
                    y,
                    y_ref,
                    _sum_tol(k * k, PO.ave_pool_fwd_reference(np.abs(x), k, k, s, s, 0, 0, P, P)),
                    "ave_pool_fwd",
                )

            def check_b(fn, dx=dx, dx_ref=dx_ref, k=k, dy=dy, s=s):
                _close(
                    dx,
                    dx_ref,
                    _sum_tol(k * k, PO.ave_pool_bwd_reference(np.abs(dy), k, k, s, s, 0, 0, dx.shape)),
                    "ave_pool_bwd",
                )

            fwd_bytes = 4.0 * (x.size + y.size)
            bwd_bytes = 4.0 * (dy.size + dx.size)
            fns = ("ave_pool_fwd", "ave_pool_bwd")
        cases.append(Case("pooling", fns[0], f"{name} x{xs} k{k}s{s}", "memory", 0, fwd_bytes, run_f, check_f))
        cases.append(Case("pooling", fns[1], f"{name} x{xs} k{k}s{s}", "memory", 0, bwd_bytes, run_b, check_b))
    return cases


def softmax_cases(quick):
    from kernels import softmax as SM

    rng = np.random.default_rng(4)
    shapes = [
        ("LeNet loss (64, 10, 1)", (64, 10, 1)),
        ("(256, 1000, 1)", (256, 1000, 1)),
        ("spatial (4, 21, 4096)", (4, 21, 4096)),
    ]
    if quick:
        shapes = shapes[:2]
    cases = []
    for name, shp in shapes:
        x = (rng.standard_normal(shp) * 3).astype(F32)
        y = np.empty_like(x)
        dy = rng.standard_normal(shp).astype(F32)
        dx = np.empty_like(x)
        y_ref = SM.softmax_fwd_reference(x)
        yv = y_ref.astype(F32)
        dx_ref = SM.softmax_bwd_reference(yv, dy)
        eps = float(np.finfo(F32).eps)

        def run_f(fn, x=x, y=y):
            return lambda: fn(x, y)

        def run_b(fn, yv=yv, dy=dy, dx=dx):
            return lambda: fn(yv, dy, dx)

        def check_f(fn, y=y, y_ref=y_ref, C=shp[1], x=x):
            _close(y, y_ref, (C + 30 + np.ptp(x)) * eps * y_ref + 1e-37, "softmax_fwd")

        def check_b(fn, dx=dx, dx_ref=dx_ref, yv=yv, dy=dy, C=shp[1]):
            mag = np.abs(yv) * (np.abs(dy) + np.abs(dy * yv).sum(1, keepdims=True))
            _close(dx, dx_ref, _sum_tol(C, mag), "softmax_bwd")

        def base_f(x=x, y=y):
            np.subtract(x, x.max(axis=1, keepdims=True), out=y)
            np.exp(y, out=y)
            y /= y.sum(axis=1, keepdims=True)

        def base_b(yv=yv, dy=dy, dx=dx):
            np.multiply(dy, yv, out=dx)
            s = dx.sum(axis=1, keepdims=True)
            np.subtract(dy, s, out=dx)
            dx *= yv

        cases.append(Case("softmax", "softmax_fwd", name, "memory", 0, 8.0 * x.size, run_f, check_f, baseline=base_f))
        cases.append(Case("softmax", "softmax_bwd", name, "memory", 0, 12.0 * x.size, run_b, check_b, baseline=base_b))
    # the loss, on LeNet's shape
    prob = SM.softmax_fwd_reference(rng.standard_normal((64, 10, 1))).astype(F32)
    label = rng.integers(0, 10, (64, 1)).astype(F32)
    loss_ref = SM.softmax_loss_fwd_reference(prob, label, -1, False)
    g_ref = SM.softmax_loss_bwd_reference(prob, label, -1, False, 1 / 64)
    g = np.empty_like(prob)

    def run_lf(fn):
        return lambda: fn(prob, label, -1, False)

    def check_lf(fn):
        got = fn(prob, label, -1, False)
        assert got[1] == loss_ref[1] and abs(got[0] - loss_ref[0]) <= 1e-9 * abs(loss_ref[0])

    def run_lb(fn):
        return lambda: fn(prob, label, -1, False, 1 / 64, g)

    def check_lb(fn):
        _close(g, g_ref, 3 * float(np.finfo(F32).eps) * (np.abs(g_ref) + 1 / 64), "softmax_loss_bwd")

    cases.append(
        Case(
            "softmax",
            "softmax_loss_fwd",
            "LeNet (64, 10, 1)",
            "memory",
            0,
            4.0 * (prob.size + label.size),
            run_lf,
            check_lf,
        )
    )
    cases.append(
        Case(
            "softmax",
            "softmax_loss_bwd",
            "LeNet (64, 10, 1)",
            "memory",
            0,
            4.0 * (2 * prob.size + label.size),
            run_lb,
            check_lb,
        )
    )
    return cases


def elementwise_cases(quick):
    from kernels import elementwise as EW

    rng = np.random.default_rng(5)
    sizes = [("LeNet ip1 top", 64 * 500), ("CIFAR conv1 top", 100 * 32 * 32 * 32), ("16 M", 1 << 24)]
    if quick:
        sizes = sizes[:2]
    eps = float(np.finfo(F32).eps)
    cases = []
    for name, n in sizes:
        x = (rng.standard_normal(n) * 3).astype(F32)
        dy = rng.standard_normal(n).astype(F32)
        y = np.empty_like(x)
        ys = EW.sigmoid_fwd_reference(x).astype(F32)
        yt = EW.tanh_fwd_reference(x).astype(F32)
        ax, ad = np.abs(x.astype(np.float64)), np.abs(dy.astype(np.float64))
        mags = dict(
            relu_fwd=ax,
            relu_bwd=ad,
            sigmoid_fwd=np.abs(ys.astype(np.float64)),
            sigmoid_bwd=ad * np.abs(ys) * (1 + np.abs(ys)),
            tanh_fwd=np.abs(yt.astype(np.float64)),
            tanh_bwd=ad * (1 + yt * yt),
        )
        specs = [
            ("relu_fwd", (x, 0.0), EW.relu_fwd_reference(x, 0.0), 8.0 * n, lambda x=x, y=y: np.maximum(x, 0, out=y)),
            (
                "relu_bwd",
                (x, dy, 0.0),
                EW.relu_bwd_reference(x, dy, 0.0),
                12.0 * n,
                lambda x=x, dy=dy, y=y: np.multiply(dy, x > 0, out=y),
            ),
            (
                "sigmoid_fwd",
                (x,),
                EW.sigmoid_fwd_reference(x),
                8.0 * n,
                lambda x=x, y=y: (
                    np.negative(x, out=y),
                    np.exp(y, out=y),
                    np.add(y, 1, out=y),
                    np.reciprocal(y, out=y),
                ),
            ),
            ("sigmoid_bwd", (ys, dy), EW.sigmoid_bwd_reference(ys, dy), 12.0 * n, None),
            ("tanh_fwd", (x,), EW.tanh_fwd_reference(x), 8.0 * n, lambda x=x, y=y: np.tanh(x, out=y)),
            ("tanh_bwd", (yt, dy), EW.tanh_bwd_reference(yt, dy), 12.0 * n, None),
        ]
        for fn_name, args, ref, nbytes, base in specs:

            def run(fn, args=args, y=y):
                return lambda: fn(*args, y)

            def check(fn, y=y, ref=ref, what=fn_name, mag=mags[fn_name]):
                _close(y, ref, 8 * eps * mag + 2e-38, what)

            cases.append(Case("elementwise", fn_name, f"{name} n={n}", "memory", 0, nbytes, run, check, baseline=base))
    return cases


def sgd_cases(quick):
    from kernels import sgd as SG

    rng = np.random.default_rng(6)
    sizes = [("LeNet all params", 431080), ("16 M", 1 << 24)]
    cases = []
    for name, n in sizes:
        w0, g, h0 = (rng.standard_normal(n).astype(F32) for _ in range(3))
        w, h = w0.copy(), h0.copy()
        w_ref, h_ref = SG.sgd_step_reference(w0, g, h0, 0.9, 0.01, 5e-4)

        def run(fn, w=w, g=g, h=h, w0=w0, h0=h0):
            return lambda: fn(w, g, h, 0.9, 0.01, 5e-4)

        def check(fn, w=w, h=h, w0=w0, h0=h0, g=g, w_ref=w_ref, h_ref=h_ref):
            # one step from the initial state (the warm-up calls kept updating w and h)
            w[...], h[...] = w0, h0
            fn(w, g, h, 0.9, 0.01, 5e-4)
            eps = float(np.finfo(F32).eps)
            _close(h, h_ref, 8 * eps * (np.abs(h_ref) + np.abs(w0) + np.abs(g)), "sgd h")
            _close(w, w_ref, 8 * eps * (np.abs(w0) + np.abs(h0) + np.abs(g)), "sgd w")

        def base(w=w, g=g, h=h):
            h *= 0.9
            h += 0.01 * (g + 5e-4 * w)
            w -= h

        cases.append(Case("sgd", "sgd_step", f"{name} n={n}", "memory", 0, 20.0 * n, run, check, baseline=base))
    return cases


# -- the driver ----------------------------------------------------------------------------------
def _module(family):
    import importlib

    return importlib.import_module(f"kernels.{family}")


def build_cases(families, sizes, quick):
    out = []
    for fam in families:
        if fam == "gemm":
            out += gemm_cases(sizes or ([128, 512] if quick else [128, 256, 512, 1024, 2048]), quick)
        else:
            out += globals()[f"{fam}_cases"](quick)
    return out


def run_case(case, versions, repeats, quick):
    mod = _module(case.family)
    rows = []
    base_med = None
    if case.baseline is not None:
        _warm(case.baseline)
        base_med, base_spread, _ = _time(case.baseline, repeats)
    ceiling = None
    if case.kind == "memory":
        ceiling = copy_bandwidth(case.nbytes)
    for ver, fn in mod.VERSIONS[case.fn].items():
        if versions and ver not in versions:
            continue
        if ver.startswith("v1_naive") and case.family in ("gemm", "conv") and case.flops > (3e8 if quick else 3e9):
            rows.append(dict(version=ver, skipped="too slow for this size"))
            continue
        call = case.run(fn)
        first = _warm(call, 0)
        try:
            case.check(fn)
        except AssertionError as e:
            rows.append(dict(version=ver, error=f"WRONG: {e}"))
            continue
        if first < 0.5:
            _warm(call, 2)
        med, spread, n = _time(
            call,
            repeats if first < 0.5 else 1,
            max_time=3.0 if first < 0.5 else 0,
            clock="wall" if "prange" in ver else None,
        )
        r = dict(version=ver, median_s=med, spread=spread, n=n)
        if case.kind == "compute":
            r["gflops"] = case.flops / med / 1e9
        else:
            r["gbs"] = case.nbytes / med / 1e9
            r["ceiling_gbs"] = ceiling
            r["fraction"] = r["gbs"] / ceiling
        if base_med is not None:
            r["x_vendor"] = base_med / med
        rows.append(r)
    base = None if base_med is None else dict(median_s=base_med, spread=base_spread)
    return rows, base


def _fmt_case(case, rows, base, peak):
    lines = []
    for r in rows:
        if "skipped" in r or "error" in r:
            lines.append(f"| {case.fn} | {case.name} | {r['version']} | {r.get('skipped') or r.get('error')} | | | | |")
            continue
        if case.kind == "compute":
            rate = f"{r['gflops']:.1f} GFLOP/s"
            frac = r["gflops"] / peak
        else:
            rate = f"{r['gbs']:.1f} GB/s"
            frac = r["fraction"]
        xv = f"{r['x_vendor']:.2f}x" if "x_vendor" in r else "-"
        lines.append(
            f"| {case.fn} | {case.name} | {r['version']} | {r['median_s'] * 1e3:.3f} | "
            f"{100 * r['spread']:.0f}% | {rate} | {100 * frac:.0f}% | {xv} |"
        )
    if base is not None:
        if case.kind == "compute":
            rate = f"{case.flops / base['median_s'] / 1e9:.1f} GFLOP/s"
            frac = case.flops / base["median_s"] / 1e9 / peak
        else:
            g = case.nbytes / base["median_s"] / 1e9
            rate = f"{g:.1f} GB/s"
            frac = g / copy_bandwidth(case.nbytes)
        lines.append(
            f"| {case.fn} | {case.name} | (vendor: numpy/BLAS) | "
            f"{base['median_s'] * 1e3:.3f} | {100 * base['spread']:.0f}% | {rate} | "
            f"{100 * frac:.0f}% | 1.00x |"
        )
    return lines


def simd_report():
    """What the compiler made of the GEMM micro-kernel: count packed FMAs in its hot loop."""
    import re

    from numba import njit

    from kernels import gemm as G

    # numba cannot show the assembly of cache-loaded code: compile a private, uncached copy
    opts = {k: v for k, v in G._gemm_v4_cols.targetoptions.items() if k not in ("cache", "nopython")}
    fn = njit(**opts)(G._gemm_v4_cols.py_func)
    for dt in (np.float32, np.float64):
        a = np.ones((8, 8), dt)
        fn(dt(1), a, False, a, False, np.zeros_like(a), 0, 8)
    out = {}
    for sig in fn.signatures:
        asm = fn.inspect_asm(sig)
        blocks = re.split(r"\n(?=\.LBB)", asm)
        hot = max(blocks, key=lambda b: len(re.findall(r"vfmadd\w+p[sd]\s+%ymm", b)))
        body = []
        for ln in hot.splitlines()[1:]:  # the loop body: up to its backward branch
            if ln.startswith("\t") and not ln.startswith("\t."):
                body.append(ln.strip())
                if re.match(r"j\w+\s+\.LBB", ln.strip()):
                    break
        key = str(sig[1].dtype)
        out[key] = dict(
            loop_body_instructions=len(body),
            packed_ymm_fma=sum(bool(re.match(r"vfmadd\w+p[sd]\s+%ymm", b)) for b in body),
            packed_ymm_loads=sum(bool(re.match(r"vmovu?p[sd]\s+\(.*%ymm", b)) for b in body),
            zmm_used="zmm" in asm,
        )
        if key == "float32":
            out["float32_loop_body"] = body
    return out


def machine_info():
    info = dict(python=platform.python_version(), numpy=np.__version__, machine=platform.machine(), cpus=os.cpu_count())
    try:
        import numba

        info["numba"] = numba.__version__
        info["numba_threads"] = numba.get_num_threads()
    except Exception:  # pragma: no cover
        pass
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
            f.seek(0)
            flags = next((ln for ln in f if ln.startswith("flags")), "")
            info["simd"] = [x for x in ("avx2", "fma", "avx512f") if f" {x}" in flags]
    except OSError:
        pass
    try:
        info["loadavg"] = os.getloadavg()
    except OSError:
        pass
    for k in ("OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        info[k] = os.environ.get(k)
    return info


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fams = [f for f in FAMILIES if any(r["family"] == f for r in results["cases"])]
    n = len(fams) + 1
    cols = 2
    rows_ = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows_, cols, figsize=(15, 4.2 * rows_))
    axes = np.atleast_1d(axes).ravel()
    peak = results["ceilings"]["sgemm_gflops"]
    # roofline: every timed point at its arithmetic intensity
    ax = axes[0]
    ai = np.logspace(-2, 3, 100)
    bw = results["ceilings"]["copy_gbs_large"]
    ax.loglog(ai, np.minimum(peak, ai * bw), "k-", lw=1.5, label=f"roof: {peak:.0f} GFLOP/s, {bw:.1f} GB/s")
    markers = dict(zip(FAMILIES, "osD^v<>"))
    for c in results["cases"]:
        if c["flops"] <= 0:
            continue
        for r in c["rows"]:
            if "median_s" in r:
                ax.loglog(
                    c["flops"] / c["bytes"],
                    c["flops"] / r["median_s"] / 1e9,
                    markers.get(c["family"], "o"),
                    ms=4,
                    alpha=0.6,
                    color=f"C{_vidx(r['version'])}",
                )
    ax.set_xlabel("arithmetic intensity (FLOP/byte, compulsory traffic)")
    ax.set_ylabel("GFLOP/s")
    ax.set_title("roofline (gemm o, conv s; colour = version rung)")
    ax.legend(fontsize=7)
    for ax, fam in zip(axes[1:], fams):
        cases = [c for c in results["cases"] if c["family"] == fam]
        labels, series = [], {}
        for i, c in enumerate(cases):
            labels.append(f"{c['fn']}\n{c['name'][:28]}")
            for r in c["rows"]:
                if "median_s" not in r:
                    continue
                frac = (r["gflops"] / peak) if "gflops" in r else r["fraction"]
                series.setdefault(r["version"], {})[i] = frac
        width = 0.8 / max(len(series), 1)
        for k, (ver, pts) in enumerate(sorted(series.items(), key=lambda kv: _vidx(kv[0]))):
            xs = [i + k * width for i in pts]
            ax.bar(xs, [100 * v for v in pts.values()], width, label=ver, color=f"C{_vidx(ver)}")
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(cases))])
        ax.set_xticklabels(labels, fontsize=6, rotation=30, ha="right")
        unit = "% of SGEMM peak" if fam in ("gemm", "conv") else "% of copy bandwidth"
        ax.set_ylabel(unit)
        ax.set_title(f"{fam}: the ladder")
        ax.legend(fontsize=7, ncol=2)
    for ax in axes[n:]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _vidx(ver):
    if ver == "blas":
        return 0
    try:
        return int(ver.split("_")[0][1:])
    except ValueError:
        return 9


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m kernels.bench", description=__doc__.split("\n")[0])
    ap.add_argument("families", nargs="*", help=f"kernel families: {', '.join(FAMILIES)} (default: all)")
    ap.add_argument("--versions", default="", help="comma-separated version names to run")
    ap.add_argument("--sizes", default="", help="gemm: comma-separated square sizes")
    ap.add_argument("--json", default="", help="write the results here")
    ap.add_argument("--plot", default="", help="write a ladder/roofline PNG here")
    ap.add_argument("--quick", action="store_true", help="fewer shapes and repeats")
    ap.add_argument("--repeats", type=int, default=0, help="minimum timed calls per version")
    ap.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="cpu",
        help="cpu: the thread's CPU time (default; robust on a shared machine); "
        "wall: elapsed time.  prange versions always use wall.",
    )
    args = ap.parse_args(argv)

    if "OPENBLAS_NUM_THREADS" not in os.environ:
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
        return subprocess.call([sys.executable, "-m", "kernels.bench"] + (argv or sys.argv[1:]), env=env)
    _clock[0] = args.clock
    families = args.families or list(FAMILIES)
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        ap.error(
            f"unknown famil{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}; known: {', '.join(FAMILIES)}"
        )
    versions = set(filter(None, args.versions.split(",")))
    sizes = [int(s) for s in args.sizes.split(",") if s]
    repeats = args.repeats or (3 if args.quick else 7)

    info = machine_info()
    print(
        f"# kernels.bench on {info.get('cpu', '?')} ({info.get('cpus')} cpus, "
        f"{'+'.join(info.get('simd', []))}), numpy {info['numpy']}, numba "
        f"{info.get('numba')}, load average {info.get('loadavg', ('?',))[0]}, clock "
        f"{args.clock}"
    )
    if info.get("loadavg") and info["loadavg"][0] > (info.get("cpus") or 1):
        print("# WARNING: the machine is busy (load average above the core count): timings are noisy and low")
    peak = sgemm_peak()
    ceilings = dict(
        sgemm_gflops=peak,
        sgemm_note="OpenBLAS SGEMM n=1024, 1 thread",
        copy_gbs_l2=copy_bandwidth(256 << 10),
        copy_gbs_l3=copy_bandwidth(8 << 20),
        copy_gbs_large=copy_bandwidth(256 << 20),
    )
    if os.environ.get("OPENBLAS_CORETYPE") or os.environ.get("OPENBLAS_L2_SIZE"):
        env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
        ceilings["sgemm_gflops_without_coretype_override"] = _sgemm_peak_subprocess(env)
    print(
        f"# ceilings: SGEMM {peak:.1f} GFLOP/s (OpenBLAS, n=1024, 1 thread); copy "
        f"{ceilings['copy_gbs_l2']:.1f} GB/s (256 KB), {ceilings['copy_gbs_l3']:.1f} GB/s "
        f"(8 MB), {ceilings['copy_gbs_large']:.1f} GB/s (256 MB)"
    )
    if "sgemm_gflops_without_coretype_override" in ceilings:
        print(
            f"#   SGEMM without OPENBLAS_CORETYPE/L2_SIZE: {ceilings['sgemm_gflops_without_coretype_override']} GFLOP/s"
        )
    print(
        "# memory-bound kernels: % of a numpy copy moving the same bytes; compute-bound: % "
        "of the SGEMM ceiling; x vendor: speed relative to numpy/OpenBLAS on the same case"
    )
    print()
    print("| kernel | case | version | median ms | spread | rate | % ceiling | x vendor |")
    print("|---|---|---|---|---|---|---|---|")
    results = dict(
        machine=info, ceilings=ceilings, cases=[], command="python -m kernels.bench " + " ".join(argv or sys.argv[1:])
    )
    for case in build_cases(families, sizes, args.quick):
        rows, base = run_case(case, versions, repeats, args.quick)
        for line in _fmt_case(case, rows, base, peak):
            print(line, flush=True)
        results["cases"].append(
            dict(
                family=case.family,
                fn=case.fn,
                name=case.name,
                kind=case.kind,
                flops=case.flops,
                bytes=case.nbytes,
                rows=rows,
                vendor=base,
            )
        )
    if "gemm" in families:
        results["simd"] = simd_report()
        print()
        print(f"# SIMD check of the v4 micro-kernel (hot loop of _gemm_v4_cols): {json.dumps(results['simd'])}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
        print(f"# wrote {args.json}")
    if args.plot:
        plot(results, args.plot)
        print(f"# wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
