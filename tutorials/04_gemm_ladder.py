# %% [markdown]
# # Lesson 4: the GEMM ladder
#
# **You will learn** why the same matrix product can run a hundred times faster or slower
# depending only on the order of its loops and how it uses caches and registers; how to place a
# kernel on a roofline plot measured on your own machine; and what each rung of
# `kernels/gemm.py` adds. **You need** lesson 3 (convolution is a GEMM) and a rough idea of what a
# cache is.
#
# GEMM is `C = alpha * A @ B + beta * C`, with A (M, K), B (K, N), C (M, N). It does `2*M*N*K`
# floating-point operations (one multiply and one add per term) on `M*K + K*N + M*N` numbers:
# for square matrices of size n, `2 n^3` flops on `3 n^2` numbers, so each number loaded could
# be reused about n times. Whether a kernel achieves that reuse decides its speed.

# %%
import matplotlib.pyplot as plt
import numba
import numpy as np
from _course import QUICK, cleanup, copy_bandwidth, show, timeit

from kernels import gemm

print("quick mode" if QUICK else "full mode", "| numba threads:", numba.get_num_threads())

# %% [markdown]
# ## A product by hand
# Three loops: for each row i of A and column j of B, a dot product over k.

# %%
A = np.array([[1, 2, 3], [4, 5, 6]], np.float32)
B = np.array([[1, 0], [0, 1], [1, 1]], np.float32)
C = np.zeros((2, 2), np.float32)
for i in range(2):
    for j in range(2):
        for p in range(3):
            C[i, j] += A[i, p] * B[p, j]
print("A @ B =\n", C, "\nflops: 2*M*N*K =", 2 * 2 * 2 * 3)
assert np.array_equal(C, A @ B)

# %% [markdown]
# ## Loop order decides the memory walk
# The loops can run in any order and give the same C. In the order i, j, p (the dot product)
# the inner loop walks **down a column of B**: consecutive accesses are N floats apart in memory,
# so each touches a new cache line. In the order i, p, j the inner loop is
# `C[i, :] += A[i, p] * B[p, :]`: it walks B and C **along rows**, one cache line serving 16
# floats, and the compiler can use SIMD instructions (8 floats at once with AVX2). The figure
# numbers the elements of B in the order the first row of C reads them, for n = 8.

# %%
n = 8
orders = {"i, j, p (dot product)": [], "i, p, j (row update)": []}
for j in range(n):  # row i = 0 of C
    for p in range(n):
        orders["i, j, p (dot product)"].append(p * n + j)
for p in range(n):
    for j in range(n):
        orders["i, p, j (row update)"].append(p * n + j)
fig, axes = plt.subplots(1, 2, figsize=(8.5, 4))
for ax, (label, seq) in zip(axes, orders.items()):
    visit = np.empty(n * n, int)
    visit[seq] = np.arange(n * n)
    ax.imshow(visit.reshape(n, n), cmap="viridis")
    for e in range(n * n):
        ax.text(e % n, e // n, visit[e], ha="center", va="center", fontsize=7, color="w")
    jumps = np.abs(np.diff(seq))
    ax.set_title(f"{label}\nmean jump {jumps.mean():.1f} floats", fontsize=9)
    ax.set_xlabel("column of B")
    ax.set_ylabel("row of B (memory is row by row)")
fig.suptitle("order in which C's first row reads B (8 x 8)")
show(fig, "04_loop_order")
assert np.abs(np.diff(orders["i, p, j (row update)"])).mean() < np.abs(np.diff(orders["i, j, p (dot product)"])).mean()

# %% [markdown]
# ## The ladder
# `kernels/gemm.py` climbs from the triple loop to within reach of OpenBLAS, one idea per rung:
# the loop order above, then blocks of A and B sized to stay in cache and copied ("packed")
# contiguous, then a micro-kernel that keeps a small tile of C in registers, then threads. Its
# docstring says what each rung does; here it is, as the code has it today:

# %%
from _course import versions_doc

print(versions_doc(gemm))
versions = list(gemm.VERSIONS["gemm"])
rungs = [v for v in versions if v.startswith("v")]  # the hand-written ladder, in order
print("\nladder:", " -> ".join(rungs), "| baseline:", [v for v in versions if v not in rungs])

# %% [markdown]
# We check every rung against the float64 reference, then time it at several sizes, all on one
# core: BLAS is told to use one thread too (`minicaffe.parallel.blas.set_threads`), so the
# comparison is fair; the threaded rung comes after. All numbers are measured now, on this
# machine, under whatever else it is doing.

# %%
from minicaffe.parallel import blas as blas_threads

threaded = [v for v in rungs if "prange" in v or "thread" in v]
serial = [v for v in versions if v not in threaded]
sizes = [48, 96, 160] if QUICK else [128, 256, 512, 1024]
rng = np.random.default_rng(0)
all_threads = blas_threads.get_threads() or 1


def measure(v, n, repeat):
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    ref = gemm.gemm_reference(False, False, 1.0, a, b, 0.0, None)
    c = np.empty((n, n), np.float32)
    fn = gemm.VERSIONS["gemm"][v]
    fn(False, False, 1.0, a, b, 0.0, c)  # compiles on the first call
    err = np.abs(c - ref).max()
    assert err < 1e-4 * n, f"{v} is wrong at n={n}: max error {err}"
    return 2 * n**3 / timeit(lambda: fn(False, False, 1.0, a, b, 0.0, c), repeat=repeat) / 1e9


blas_threads.set_threads(1)
gflops = {v: [] for v in serial}
for n in sizes:
    for v in serial:
        gflops[v].append(measure(v, n, 3 if QUICK or v == rungs[0] else 5))
    print(f"n={n:5d}, one core, GFLOP/s: " + " | ".join(f"{v} {gflops[v][-1]:.1f}" for v in serial))
blas_threads.set_threads(all_threads)

# %% [markdown]
# ## Threads
# The last rung splits the columns of C across cores; BLAS does the same with its own threads.
# At the largest size, with every core (on a machine busy with other work, threads gain less
# than the number of cores, and can even lose):

# %%
n = max(sizes)
cores = blas_threads.cores()
for v in threaded + [v for v in versions if v not in rungs]:
    g = measure(v, n, 5)
    base = gflops[v][-1] if v in gflops else gflops[rungs[rungs.index(v) - 1]][-1]
    print(f"  {v:13s} {g:7.1f} GFLOP/s with {cores} cores = {g / base:.2f} x its one-core version")
    gflops[f"{v} ({cores} cores)"] = [np.nan] * (len(sizes) - 1) + [g]

# %% [markdown]
# ## The roofline, measured here
# A kernel is limited either by arithmetic (the machine's peak flop rate) or by memory (bytes per
# second times flops per byte). The **roofline** is `min(peak, intensity * bandwidth)`, with
# *intensity* = flops per byte moved from memory. We measure both ceilings: bandwidth with a
# large `np.copyto`, and the compute ceiling with the best BLAS rate seen above (a measured
# bound, below the chip's datasheet peak). A square GEMM needs at least `3 n^2` floats moved, an
# intensity of `2n^3 / 12n^2 = n/6` flops per byte: far right of the ridge, so it *can* run at the
# compute ceiling. The naive loop cannot, because it moves far more bytes than the minimum: every
# multiply-add loads a fresh element of B, 2 flops per 4 bytes (the hollow marker).

# %%
bw = copy_bandwidth((16 if QUICK else 256) * 2**20)
peak = np.nanmax([np.nanmax(g) for g in gflops.values()]) * 1e9
print(
    f"copy bandwidth {bw / 1e9:.1f} GB/s, compute ceiling (best measured) {peak / 1e9:.1f} GFLOP/s, ridge at {peak / bw:.1f} flop/byte"
)

top = max(sizes)
ai = np.logspace(-2, 3, 200)
fig, (r0, r1) = plt.subplots(1, 2, figsize=(11, 4.2))
r0.loglog(ai, np.minimum(peak, ai * bw) / 1e9, "k-", lw=2, label="roofline (measured)")
for v in gflops:
    r0.loglog([top / 6], [gflops[v][-1]], "o", ms=7, label=v)
r0.loglog([0.5], [gflops[rungs[0]][-1]], "o", mfc="none", mec="k", ms=10, label=f"{rungs[0]} at its real intensity")
r0.set_xlabel("arithmetic intensity (flop / byte)")
r0.set_ylabel("GFLOP/s")
r0.set_title(f"roofline: each rung at n = {top}")
r0.legend(fontsize=7)
for v in gflops:
    r1.plot(sizes, gflops[v], "o-", label=v)
r1.set_xlabel("n (square matrices)")
r1.set_ylabel("GFLOP/s")
r1.set_yscale("log")
r1.set_title("the ladder: speed against size")
show(fig, "04_roofline")

# %% [markdown]
# What to see: the naive loop's speed is set by memory, and falls as the matrices outgrow the
# caches. Reordering gains SIMD but still streams B once per row of A. Blocking keeps the working
# set in cache, so its speed stops depending on n. The micro-kernel keeps a tile of C in
# registers, so each loaded number feeds several multiply-adds. Threads multiply what is left
# by the number of free cores (on a busy machine, less).

# %%
last = {v: gflops[v][-1] for v in gflops}
for v in last:
    print(f"  at n={top}: {v:13s} {last[v]:7.1f} GFLOP/s = {last[v] / max(last.values()):.2f} x the fastest")
assert last[rungs[1]] > last[rungs[0]], "the second rung (the loop order) should beat the first"
assert max(last[v] for v in serial if v in rungs) > 2 * last[rungs[0]], (
    "the top of the ladder should leave the naive loop far behind"
)

# %% [markdown]
# ## Exercises
# 1. Write `matmul_ikj(a, b)` in `tutorials/exercises/ex04.py`: the i, p, j order, compiled with
#    `numba.njit`, returning a new float32 array. Check: `python -m tutorials.check 04.1`
#    (then time it against the first rung at n = 512 yourself).
# 2. Write `gemm_intensity(m, n, k)` (flops per byte when A and B are read once and C written
#    once, float32) and `roofline(intensity, peak, bandwidth)`. Check: `python -m tutorials.check 04.2`
# 3. (thought) Blocked GEMM sizes its blocks to the caches. Why does its speed stop falling with
#    n, and why is blocking alone still well below BLAS? What does a register micro-kernel change?
#
# Answers to the thought questions: `tutorials/solutions/ANSWERS.md`.

# %%
cleanup()
print("lesson 4 done")
