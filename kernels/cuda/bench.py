"""GPU kernel benchmark: ``python -m kernels.cuda.bench [--family gemm] [--size N] [--gemm-size N] [--repeat R]``.

Every version of every family, on CuPy arrays, each checked against the CPU file's float64
reference on a small case before anything is timed (a wrong kernel is never reported as fast).
Timing follows llm.c's ``benchmark_kernel``: warm-up calls (numba compiles on the first), then
``repeat`` timed calls, each bracketed by CUDA events on the launch stream, with the L2 cache
flushed before each (a write of a buffer larger than L2), and the median reported.  Figures:

* GEMM (``--gemm-size``, default 4096, plus LeNet / CIFAR-10 shapes): each version validated
  against cuBLAS on the case's own inputs, then GFLOP/s (2*M*N*K per call), the ratio to cuBLAS
  (CuPy's matmul) and the share of the case's roofline ceiling measured at its own size (see
  ``bench_gemm``); a rate above its ceiling is flagged ``!`` as a measurement error;
* the rest: GB/s (bytes each call must read and write at least once) and the ratio to the
  device's measured copy bandwidth (a CuPy device-to-device copy of the same size).

Where there is no GPU (no CuPy, no device, or NUMBA_ENABLE_CUDASIM=1) it says so and exits 0:
the simulator proves correctness, not speed, and timing it would mislead.
"""

import argparse
import statistics
import sys

import numpy as np


def why_no_gpu():
    import os

    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0").strip() not in ("", "0"):
        return "NUMBA_ENABLE_CUDASIM=1: numba's simulator would be timed, which measures nothing about a GPU"
    try:
        import cupy
    except ImportError as e:
        return f'CuPy is not installed ({e}); pip install -e ".[cuda]"'
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "CuPy sees no NVIDIA GPU"
    except Exception as e:
        return f"CuPy sees no usable NVIDIA GPU ({type(e).__name__}: {e})"
    return None


class Timer:
    """CUDA-event timing on CuPy's current stream, with an L2 flush before every call."""

    def __init__(self, cupy, warmup=3, repeat=20):
        self.cp = cupy
        self.warmup, self.repeat = warmup, repeat
        l2 = cupy.cuda.Device().attributes.get("L2CacheSize", 64 << 20)
        self.flush_buf = cupy.empty(max(2 * l2, 1 << 24) // 4, dtype=np.float32)

    def __call__(self, fn):
        cp = self.cp
        for _ in range(self.warmup):
            fn()
        times = []
        for _ in range(self.repeat):
            self.flush_buf.fill(1.0)  # evict whatever the last call left in L2
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, end) * 1e-3)
        return statistics.median(times)


def copy_bandwidth(cp, timer, nbytes):
    a = cp.empty(nbytes // 4, dtype=np.float32)
    b = cp.empty_like(a)
    t = timer(lambda: cp.copyto(b, a))
    return 2 * a.nbytes / t / 1e9


def row(name, version, seconds, figure, unit, ratio, ratio_of):
    print(f"  {name:<16} {version:<14} {seconds * 1e6:10.1f} us  {figure:9.1f} {unit:<7} {ratio:6.2f}x {ratio_of}")


def check(ok, what):
    if not ok:
        raise SystemExit(f"bench: {what} does not match its reference -- not timing a wrong kernel")


#: the GEMM cases: (name, M, N, K, trans_a, trans_b); the square one takes --size.  The LeNet and
#: CIFAR-10 quick shapes are the CPU ladder's (kernels/gemm.py: batch 64, conv as W @ col over
#: the whole batch, inner products as X @ W^T), so the two benchmarks compare like with like.
GEMM_SHAPES = [
    ("LeNet conv1 fwd  W@col", 20, 36864, 25, False, False),
    ("LeNet conv2 fwd  W@col", 50, 4096, 500, False, False),
    ("LeNet conv2 dW   dY@col^T", 50, 500, 4096, False, True),
    ("LeNet conv2 dcol W^T@dY", 500, 4096, 50, True, False),
    ("LeNet ip1 fwd    X@W^T", 64, 500, 800, False, True),
    ("LeNet ip1 dW     dY^T@X", 500, 800, 64, True, False),
    ("CIFAR conv1 fwd  W@col", 32, 102400, 75, False, False),
    ("CIFAR conv2 fwd  W@col", 32, 25600, 800, False, False),
    ("CIFAR conv3 fwd  W@col", 64, 6400, 800, False, False),
]


def make_fma_burn():
    """The kernel ``fma_peak`` times: ``burn(x, n)``, 8 independent FMA chains per thread, n
    passes of 64 FMAs (the inner loop unrolls; tests/test_cuda_gemm_ladder.py checks its PTX).
    Built on first use: importing this module must not import numba.cuda."""
    from numba import cuda

    one, tiny = np.float32(0.9999), np.float32(1e-7)  # float32 constants: Python floats would widen to f64

    @cuda.jit
    def burn(x, n):
        i = cuda.grid(1)
        v0 = x[i]
        v1, v2, v3, v4, v5, v6, v7 = v0 + tiny, v0 - tiny, v0 * one, v0 + one, v0 - one, -v0, v0 * tiny
        for _ in range(n):
            for _ in range(8):
                v0 = v0 * one + tiny
                v1 = v1 * one + tiny
                v2 = v2 * one + tiny
                v3 = v3 * one + tiny
                v4 = v4 * one + tiny
                v5 = v5 * one + tiny
                v6 = v6 * one + tiny
                v7 = v7 * one + tiny
        x[i] = v0 + v1 + v2 + v3 + v4 + v5 + v6 + v7

    return burn


def fma_peak(L, timer):
    """FP32 FLOP/s this GPU reaches on a kernel that does nothing but independent FMAs (8 SM-fulls
    of 256-thread blocks): the compute side of the GEMM ceilings, measured."""
    burn = make_fma_burn()
    sms = L.xp.cuda.Device().attributes["MultiProcessorCount"]
    blocks, threads, n = sms * 8, 256, 1024
    x = L.xp.zeros(blocks * threads, np.float32)
    t = timer(lambda: L.launch(burn, blocks, threads, x, n))
    return 2.0 * 64 * n * blocks * threads / t


def gemm_case_check(xp, version, a, b, c, ref, bound):
    """A version's product against cuBLAS's on the case's own inputs: |c - ref| <= bound, with
    bound = (K + 2) eps32 (|op(a)| @ |op(b)|) (the classical bound, twice over: both may err)."""
    ok = (xp.abs(c - ref) <= 2 * bound).all()  # NaN (an element never written) fails too
    check(bool(ok.get()), f"gemm {version} at this shape")


def bench_gemm(L, timer, size, peak, copy_bw, shapes=None, versions=None):
    """Every GEMM version on every case: validated against cuBLAS on the case's own inputs, then
    timed.  ``peak``: FP32 FLOP/s from ``fma_peak``; ``copy_bw(nbytes)``: device copy GB/s at
    that size.  A case's ceiling is the roofline at its own size: min(compute, memory), compute
    = the larger of ``peak`` and cuBLAS on this shape (cuBLAS is proof the GPU can do it), memory
    = its FLOPs over the time to move a, b and c once at the copy rate measured at the case's own
    byte count.  A rate above its ceiling is flagged ``!``: a measurement error, not a result.
    Returns the rows (dicts) and the number flagged."""
    xp = L.xp
    from . import gemm

    versions = versions or list(gemm.VERSIONS["gemm"])
    shapes = shapes if shapes is not None else [(f"square {size}", size, size, size, False, False)] + GEMM_SHAPES
    eps32 = float(np.finfo(np.float32).eps)
    rng = np.random.default_rng(0)
    print(
        f"gemm  C = op(A) @ op(B), float32 (GFLOP/s; ratio to cuBLAS; share of the case's ceiling, "
        f"! = above it: a measurement error).  FMA peak measured: {peak / 1e9:.0f} GFLOP/s"
    )
    rows, flagged = [], 0
    for name, M, N, K, ta, tb in shapes:
        a = xp.asarray(rng.standard_normal((K, M) if ta else (M, K), dtype=np.float32))
        b = xp.asarray(rng.standard_normal((N, K) if tb else (K, N), dtype=np.float32))
        A, B = (a.T if ta else a), (b.T if tb else b)
        ref = xp.matmul(A, B)
        bound = (K + 2) * eps32 * xp.matmul(xp.abs(A), xp.abs(B))
        c = xp.empty((M, N), np.float32)
        flops = 2.0 * M * N * K
        nbytes = 4 * (M * K + K * N + M * N)
        mem_ceiling = flops / (nbytes / (copy_bw(nbytes) * 1e9))
        case_rows = []
        for version in versions:
            f = gemm.VERSIONS["gemm"][version]
            c.fill(np.nan)
            f(L, ta, tb, 1.0, a, b, 0.0, c)
            gemm_case_check(xp, version, a, b, c, ref, bound)
            t = timer(lambda f=f: f(L, ta, tb, 1.0, a, b, 0.0, c))
            case_rows.append({"case": name, "version": version, "M": M, "N": N, "K": K, "seconds": t})
        base = next((r["seconds"] for r in case_rows if r["version"] == "cublas"), None)
        compute = max([peak] + ([flops / base] if base else []))
        ceiling = min(compute, mem_ceiling)
        print(
            f"  {name}  M,N,K = {M},{N},{K}  trans = {ta},{tb}  ceiling {ceiling / 1e9:.0f} GFLOP/s "
            f"({'memory' if mem_ceiling < compute else 'compute'})"
        )
        for r in case_rows:
            rate = flops / r["seconds"]
            flag = "!" if rate > ceiling * 1.02 else " "
            flagged += flag == "!"
            r.update(gflops=rate / 1e9, vs_cublas=(base / r["seconds"]) if base else None, of_ceiling=rate / ceiling)
            vs = f"{r['vs_cublas']:6.2f}x of cuBLAS" if base else ""
            print(
                f"    {r['version']:<20} {r['seconds'] * 1e6:10.1f} us  {rate / 1e9:9.1f} GFLOP/s  {vs}  "
                f"{r['of_ceiling']:5.0%} of ceiling {flag}"
            )
        rows += case_rows
    if flagged:
        print(f"! {flagged} rate(s) above their ceiling: measurement errors, not results; rerun")
    return rows, flagged


def bench_streams(L, timer, size, families):
    """The memory-bound families: GB/s against the device's copy bandwidth."""
    cp = L.xp
    from . import elementwise, im2col, pooling, sgd, softmax

    n = size * size * 16
    peak = copy_bandwidth(cp, timer, 4 * n)
    print(f"memory-bound kernels, float32 (GB/s; ratio to a device copy: {peak:.0f} GB/s)")
    rng = np.random.default_rng(1)
    f32 = np.float32
    x = cp.asarray(rng.standard_normal(n, dtype=f32))
    y = cp.empty_like(x)
    dy = cp.asarray(rng.standard_normal(n, dtype=f32))
    cases = []
    if "elementwise" in families:
        for fn in ("relu_fwd", "sigmoid_fwd", "tanh_fwd"):
            for v, f in elementwise.VERSIONS[fn].items():
                args = (x, 0.0, y) if fn == "relu_fwd" else (x, y)
                cases.append((fn, v, (lambda f=f, args=args: f(L, *args)), 8 * n))
        for v, f in elementwise.VERSIONS["relu_bwd"].items():
            cases.append(("relu_bwd", v, (lambda f=f: f(L, x, dy, 0.0, y)), 12 * n))
    if "sgd" in families:
        w, g, h = (cp.asarray(rng.standard_normal(n, dtype=f32)) for _ in range(3))
        cases.append(("sgd_step", "v1_gridstride", lambda: sgd.sgd_step(L, w, g, h, 0.9, 0.01, 5e-4), 20 * n))
    if "im2col" in families:
        N, C, H = 64, 32, 28
        xi = cp.asarray(rng.standard_normal((N, C, H, H), dtype=f32))
        col = cp.empty((C * 9, N * H * H), f32)
        for v, f in im2col.VERSIONS["im2col"].items():
            cases.append(
                ("im2col 3x3 p1", v, (lambda f=f: f(L, xi, 3, 3, 1, 1, 1, 1, 1, 1, col)), xi.nbytes + col.nbytes)
            )
        for v, f in im2col.VERSIONS["col2im"].items():
            cases.append(
                ("col2im 3x3 p1", v, (lambda f=f: f(L, col, 3, 3, 1, 1, 1, 1, 1, 1, xi)), xi.nbytes + col.nbytes)
            )
    if "pooling" in families:
        N, C, H = 64, 32, 56
        xp_ = cp.asarray(rng.standard_normal((N, C, H, H), dtype=f32))
        yp = cp.empty((N, C, H // 2, H // 2), f32)
        mk = cp.empty(yp.shape, np.int32)
        dxp = cp.empty_like(xp_)
        for v, f in pooling.VERSIONS["max_pool_fwd"].items():
            cases.append(
                ("max_pool 2x2", v, (lambda f=f: f(L, xp_, 2, 2, 2, 2, 0, 0, yp, mk)), xp_.nbytes + 2 * yp.nbytes)
            )
        for v, f in pooling.VERSIONS["max_pool_bwd"].items():
            cases.append(
                ("max_pool_bwd", v, (lambda f=f: f(L, yp, mk, 2, 2, 2, 2, 0, 0, dxp)), xp_.nbytes + 2 * yp.nbytes)
            )
        for v, f in pooling.VERSIONS["ave_pool_bwd"].items():
            cases.append(("ave_pool_bwd", v, (lambda f=f: f(L, yp, 2, 2, 2, 2, 0, 0, dxp)), xp_.nbytes + yp.nbytes))
    if "softmax" in families:
        for shape in ((size * 16, 1000, 1), (16, 21, size * 64)):
            xs = cp.asarray(rng.standard_normal(shape, dtype=f32))
            ys = cp.empty_like(xs)
            for v, f in softmax.VERSIONS["softmax_fwd"].items():
                cases.append(
                    (f"softmax {shape[1]}x{shape[2]}", v, (lambda f=f, xs=xs, ys=ys: f(L, xs, ys)), 2 * xs.nbytes)
                )
    for name, v, fn, nbytes in cases:
        t = timer(fn)
        row(name, v, t, nbytes / t / 1e9, "GB/s", nbytes / t / 1e9 / peak, "of copy")


def check_small(L, families=("gemm", "im2col", "pooling", "softmax", "elementwise", "sgd")):
    """Every version of every public function of ``families`` against the CPU files' float64
    references on a small odd-sized case, before anything is timed (a wrong kernel is never
    reported as fast).  Works with any launcher: tests/test_cuda_kernels.py runs it in the
    simulator, where the full per-version tests also live."""
    xp = L.xp
    rng = np.random.default_rng(2)
    f32 = np.float32

    def dev(a):
        return xp.array(np.ascontiguousarray(a), copy=True)

    def host(a):
        return a.get() if hasattr(a, "get") else np.asarray(a)

    def close(got, ref, what, tol=1e-4):
        check(np.allclose(host(got), ref, rtol=tol, atol=tol), what)

    if "gemm" in families:
        from kernels.gemm import gemm_reference

        from . import gemm

        a, b = rng.standard_normal((9, 7)).astype(f32), rng.standard_normal((9, 5)).astype(f32)
        for v, f in gemm.VERSIONS["gemm"].items():
            c = dev(np.zeros((7, 5), f32))
            f(L, True, False, 1.0, dev(a), dev(b), 0.0, c)
            close(c, gemm_reference(True, False, 1.0, a, b, 0.0, None), f"gemm {v}")
    if "im2col" in families:
        from kernels.im2col import col2im_reference, im2col_reference

        from . import im2col

        x = rng.standard_normal((2, 3, 7, 6)).astype(f32)
        geo = (3, 3, 1, 1, 2, 1, 1, 1)
        ref = im2col_reference(x, *geo)
        for v, f in im2col.VERSIONS["im2col"].items():
            col = dev(np.zeros(ref.shape, f32))
            f(L, dev(x), *geo, col)
            close(col, ref, f"im2col {v}")
        for v, f in im2col.VERSIONS["col2im"].items():
            xo = dev(np.zeros(x.shape, f32))
            f(L, dev(ref.astype(f32)), *geo, xo)
            close(xo, col2im_reference(ref, *geo, x.shape), f"col2im {v}")
    if "pooling" in families:
        from kernels.pooling import REFERENCES as R

        from . import pooling

        x = rng.standard_normal((2, 3, 7, 7)).astype(f32)
        g = (3, 3, 2, 2, 1, 1)
        ys, ms = R["max_pool_fwd"](x, *g, 4, 4)
        dy = rng.standard_normal((2, 3, 4, 4)).astype(f32)
        for v, f in pooling.VERSIONS["max_pool_fwd"].items():
            y, m = dev(np.zeros(ys.shape, f32)), dev(np.zeros(ys.shape, np.int32))
            f(L, dev(x), *g, y, m)
            close(y, ys, f"max_pool_fwd {v}")
            check(np.array_equal(host(m), ms), f"max_pool_fwd {v} mask")
        for v, f in pooling.VERSIONS["max_pool_bwd"].items():
            dx = dev(np.zeros(x.shape, f32))
            f(L, dev(dy), dev(ms), *g, dx)
            close(dx, R["max_pool_bwd"](dy, ms, x.shape), f"max_pool_bwd {v}")
        for v, f in pooling.VERSIONS["ave_pool_fwd"].items():
            y = dev(np.zeros(ys.shape, f32))
            f(L, dev(x), *g, y)
            close(y, R["ave_pool_fwd"](x, *g, 4, 4), f"ave_pool_fwd {v}")
        for v, f in pooling.VERSIONS["ave_pool_bwd"].items():
            dx = dev(np.zeros(x.shape, f32))
            f(L, dev(dy), *g, dx)
            close(dx, R["ave_pool_bwd"](dy, *g, x.shape), f"ave_pool_bwd {v}")
    if "softmax" in families:
        from kernels.softmax import softmax_bwd_reference, softmax_fwd_reference

        from . import softmax

        x = rng.standard_normal((7, 13, 3)).astype(f32)
        y = softmax_fwd_reference(x).astype(f32)
        dy = rng.standard_normal(x.shape).astype(f32)
        for v, f in softmax.VERSIONS["softmax_fwd"].items():
            out = dev(np.zeros(x.shape, f32))
            f(L, dev(x), out)
            close(out, softmax_fwd_reference(x), f"softmax_fwd {v}", 1e-5)
        for v, f in softmax.VERSIONS["softmax_bwd"].items():
            out = dev(np.zeros(x.shape, f32))
            f(L, dev(y), dev(dy), out)
            close(out, softmax_bwd_reference(y, dy), f"softmax_bwd {v}", 1e-5)
    if "elementwise" in families:
        from kernels.elementwise import REFERENCES as R

        from . import elementwise

        x = rng.uniform(-3, 3, 37).astype(f32)
        dy = rng.standard_normal(37).astype(f32)
        for fn in elementwise.VERSIONS:
            args = {"relu_fwd": (x, 0.1), "relu_bwd": (x, dy, 0.1)}.get(fn, (x,) if fn.endswith("fwd") else (x, dy))
            for v, f in elementwise.VERSIONS[fn].items():
                out = dev(np.zeros(37, f32))
                f(L, *[dev(a) if isinstance(a, np.ndarray) else a for a in args], out)
                close(out, R[fn](*args), f"{fn} {v}")
    if "sgd" in families:
        from kernels.sgd import sgd_step_reference

        from . import sgd

        w, g, h = (rng.standard_normal(29).astype(f32) for _ in range(3))
        wr, hr = sgd_step_reference(w, g, h, 0.9, 0.01, 5e-4)
        for v, f in sgd.VERSIONS["sgd_step"].items():
            wd, hd = dev(w), dev(h)
            f(L, wd, dev(g), hd, 0.9, 0.01, 5e-4)
            close(wd, wr, f"sgd_step {v} w")
            close(hd, hr, f"sgd_step {v} h")


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m kernels.cuda.bench", description=__doc__.split("\n")[0])
    p.add_argument(
        "--family",
        action="append",
        choices=("gemm", "im2col", "pooling", "softmax", "elementwise", "sgd"),
        help="benchmark only these families (repeatable; default all)",
    )
    p.add_argument("--size", type=int, default=2048, help="scales the memory-bound families' shapes")
    p.add_argument("--gemm-size", type=int, default=4096, help="the square GEMM case's edge (M = N = K)")
    p.add_argument("--repeat", type=int, default=20)
    args = p.parse_args(argv)
    reason = why_no_gpu()
    if reason:
        print(f"kernels.cuda.bench: no GPU benchmark here -- {reason}.")
        print(
            "The GPU kernels are still tested on this machine, in numba's CUDA simulator "
            "(pytest tests/test_cuda_kernels.py); the simulator proves correctness, not speed."
        )
        return 0
    import cupy
    from numba import cuda  # noqa: F401  (the real target: NUMBA_ENABLE_CUDASIM is not set)

    from . import _launch

    L = _launch.launcher(simulator=False)
    dev = cupy.cuda.Device()
    props = cupy.cuda.runtime.getDeviceProperties(dev.id)
    print(
        f"device: {props['name'].decode()}  (cc {props['major']}.{props['minor']}, "
        f"{props['multiProcessorCount']} SMs, L2 {dev.attributes.get('L2CacheSize', 0) >> 20} MiB)"
    )
    timer = Timer(cupy, repeat=args.repeat)
    families = args.family or ["gemm", "im2col", "pooling", "softmax", "elementwise", "sgd"]
    check_small(L, families)
    print("# every version of " + ", ".join(families) + " checked against its float64 reference")
    if "gemm" in families:
        peak = fma_peak(L, timer)
        bench_gemm(L, timer, args.gemm_size, peak, lambda nbytes: copy_bandwidth(cupy, timer, nbytes))
    rest = [f for f in families if f != "gemm"]
    if rest:
        bench_streams(L, timer, args.size // 16 or 1, rest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
