# %% [markdown]
# # Lesson 6: GPU kernels, run in numba's CUDA simulator
#
# **You will learn** how a GPU kernel divides work among blocks and threads, why a grid-stride
# loop makes a kernel correct for any launch size, how a block shares a tile of data in shared
# memory to cut global-memory traffic, how a block reduces many numbers to one, and what changes
# when the same code runs on a real GPU. **You need** lessons 4 and 5 (GEMM, memory-bound
# kernels); no GPU.
#
# numba compiles `@cuda.jit` Python functions for NVIDIA GPUs. With `NUMBA_ENABLE_CUDASIM=1` it
# runs the very same functions on the CPU instead, every CUDA thread as a Python thread: a
# thousand times slower, but exact, and you can print and inspect everything. minicaffe's tests
# run its GPU kernels this way on every commit. This lesson sets the variable itself (set
# `NUMBA_ENABLE_CUDASIM=0` on a machine with a GPU to run it for real).

# %%
import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")  # before numba.cuda is imported: fixed per process

import matplotlib.pyplot as plt
import numpy as np
from _course import QUICK, cleanup, show, versions_doc
from numba import cuda

SIM = os.environ["NUMBA_ENABLE_CUDASIM"] == "1"
print("quick mode" if QUICK else "full mode", "| target:", "CUDA simulator (CPU)" if SIM else "a real GPU")

# %% [markdown]
# ## Threads and blocks
# A launch `kernel[blocks, threads](...)` starts `blocks x threads` copies of the function. Each
# knows its block (`cuda.blockIdx.x`) and its place in the block (`cuda.threadIdx.x`). The usual
# mapping gives thread t of block b the element `i = b * threads + t`; a **grid-stride loop**
# then steps by the whole grid (`blocks * threads`), so any launch covers any n. Here 3 blocks of
# 4 threads cover 30 elements; each element records which thread did it, in which pass.


# %%
@cuda.jit
def who(block, thread, rnd):
    start = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    stride = cuda.gridDim.x * cuda.blockDim.x
    for i in range(start, block.size, stride):  # the grid-stride loop
        block[i] = cuda.blockIdx.x
        thread[i] = cuda.threadIdx.x
        rnd[i] = (i - start) // stride


n, blocks, threads = 30, 3, 4
block, thread, rnd = (np.full(n, -1, np.int32) for _ in range(3))
who[blocks, threads](block, thread, rnd)
print("block :", block)
print("thread:", thread)
print("pass  :", rnd)
assert (block >= 0).all() and np.array_equal(block * threads + thread + rnd * blocks * threads, np.arange(n))

# %%
fig, ax = plt.subplots(figsize=(11, 1.9))
colors = plt.cm.Set2(block)
for i in range(n):
    ax.add_patch(plt.Rectangle((i, 0), 1, 1, fc=colors[i], ec="w"))
    ax.text(i + 0.5, 0.62, f"t{thread[i]}", ha="center", fontsize=8)
    ax.text(i + 0.5, 0.22, f"p{rnd[i]}", ha="center", fontsize=7, color="0.3")
ax.set_xlim(0, n)
ax.set_ylim(0, 1)
ax.set_yticks([])
ax.set_xlabel("element index (colour = block, t = thread in block, p = pass of the grid-stride loop)")
ax.set_title(f"{blocks} blocks x {threads} threads over {n} elements")
show(fig, "06_thread_mapping")

# %% [markdown]
# On a real GPU a block's threads run in groups of 32 (a *warp*) in lockstep, so neighbouring
# threads should touch neighbouring addresses: then a warp's 32 loads merge into a few memory
# transactions (*coalescing*). The mapping above does exactly that on every pass.
#
# ## Shared-memory tiling: a GEMM
# The naive GPU GEMM gives each thread one element of C and loads a row of A and a column of B
# from global memory: `2K` loads for `K` multiply-adds, each number loaded by many threads. A
# tiled kernel lets a block of `T x T` threads load a `T x T` tile of A and one of B into
# **shared memory** (fast, on-chip, visible to the block), wait for each other
# (`cuda.syncthreads()`), then do `T` multiply-adds each from shared memory. Global loads drop by
# a factor T.

# %%
T = 2


@cuda.jit
def tiled_matmul(A, B, C):
    sa = cuda.shared.array((T, T), np.float32)
    sb = cuda.shared.array((T, T), np.float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    row = cuda.blockIdx.y * T + ty
    col = cuda.blockIdx.x * T + tx
    acc = 0.0
    for k0 in range(0, A.shape[1], T):  # one phase per tile along K
        sa[ty, tx] = A[row, k0 + tx] if row < A.shape[0] and k0 + tx < A.shape[1] else 0.0
        sb[ty, tx] = B[k0 + ty, col] if k0 + ty < B.shape[0] and col < B.shape[1] else 0.0
        cuda.syncthreads()  # the tile is loaded
        for k in range(T):
            acc += sa[ty, k] * sb[k, tx]
        cuda.syncthreads()  # everyone is done with it before the next load
    if row < C.shape[0] and col < C.shape[1]:
        C[row, col] = acc


rng = np.random.default_rng(0)
M = K = N = 4
A = rng.standard_normal((M, K)).astype(np.float32)
B = rng.standard_normal((K, N)).astype(np.float32)
C = np.zeros((M, N), np.float32)
tiled_matmul[(N // T, M // T), (T, T)](A, B, C)
print("tiled GEMM max error:", np.abs(C - A @ B).max())
assert np.allclose(C, A @ B, atol=1e-5)
naive_loads, tiled_loads = 2 * M * N * K, 2 * M * N * K // T
print(f"global loads: one thread per element {naive_loads}, tiled with T={T}: {tiled_loads} (T x fewer)")

# %% [markdown]
# The figure follows the block that computes C's bottom-left tile (block row 1, block column 0):
# in phase 0 it loads the first tile of A's row band and of B's column band, in phase 1 the next.

# %%
fig, axes = plt.subplots(1, 3, figsize=(10, 3.4))
phase_color = ["#1b9e77", "#d95f02"]
for ax, (name, shape) in zip(axes, (("A", (M, K)), ("B", (K, N)), ("C", (M, N)))):
    ax.set_xlim(0, shape[1])
    ax.set_ylim(shape[0], 0)
    ax.set_xticks(range(shape[1] + 1))
    ax.set_yticks(range(shape[0] + 1))
    ax.grid(True, color="0.8")
    ax.set_title(name)
for phase in range(K // T):
    c = phase_color[phase]
    axes[0].add_patch(plt.Rectangle((phase * T, 1 * T), T, T, fc=c, alpha=0.6))
    axes[0].text(phase * T + T / 2, T + T / 2, f"phase {phase}", ha="center", va="center", fontsize=8)
    axes[1].add_patch(plt.Rectangle((0, phase * T), T, T, fc=c, alpha=0.6))
    axes[1].text(T / 2, phase * T + T / 2, f"phase {phase}", ha="center", va="center", fontsize=8)
axes[2].add_patch(plt.Rectangle((0, T), T, T, fc="#7570b3", alpha=0.6))
axes[2].text(T / 2, T + T / 2, "block (1, 0)", ha="center", va="center", fontsize=8)
fig.suptitle(f"tiles in shared memory: block (1, 0) of a {M}x{N} GEMM, T = {T}")
show(fig, "06_tiles")

# %% [markdown]
# ## A reduction in a block
# Summing n numbers in parallel: each of the block's threads loads one number into shared
# memory, then in each step the first half of the active threads adds the second half's values
# to their own, halving the active threads, until thread 0 holds the sum: `log2(threads)` steps.
# We record the shared array after every step.

# %%
R = 8


@cuda.jit
def block_sum(x, out, trace):
    s = cuda.shared.array(R, np.float32)
    t = cuda.threadIdx.x
    s[t] = x[t] if t < x.size else 0.0
    cuda.syncthreads()
    trace[0, t] = s[t]
    step, half = 1, R // 2
    while half > 0:
        if t < half:
            s[t] += s[t + half]
        cuda.syncthreads()
        trace[step, t] = s[t]
        step += 1
        half //= 2
    if t == 0:
        out[0] = s[0]


x = np.arange(1, R + 1, dtype=np.float32)
out = np.zeros(1, np.float32)
trace = np.zeros((4, R), np.float32)
block_sum[1, R](x, out, trace)
print("shared memory after each step:\n", trace)
print("sum", out[0], "= 1 + ... + 8 =", x.sum())
assert out[0] == x.sum()

fig, ax = plt.subplots(figsize=(7, 2.8))
ax.imshow(trace, cmap="Blues")
for s_ in range(trace.shape[0]):
    for t_ in range(R):
        active = t_ < (R >> s_) if s_ else True
        ax.text(t_, s_, f"{trace[s_, t_]:.0f}", ha="center", va="center", color="k" if active else "0.7", fontsize=9)
ax.set_xlabel("thread (its slot of shared memory)")
ax.set_ylabel("step")
ax.set_title("tree reduction: grey values are no longer read")
show(fig, "06_reduction")

# %% [markdown]
# ## The engine's GPU kernels
# `kernels/cuda/` holds minicaffe's GPU kernels, one file per family, with the same contracts as
# the CPU families. The GEMM ladder on the GPU:

# %%
import kernels.cuda
from kernels.cuda import gemm as cuda_gemm

print(versions_doc(cuda_gemm))

# %% [markdown]
# The engine reaches them through a backend: `cudasim` (this process) runs them in the simulator
# on numpy arrays, `cuda` on a GPU with CuPy arrays. `kernels.cuda.use(family, version)`
# switches the version the backend runs; every version must match the float64 reference.

# %%
import minicaffe as caffe
from kernels.gemm import gemm_reference

be = caffe.backend.get("cudasim" if SIM else "cuda")
m, k, n_ = (6, 5, 7) if QUICK else (16, 12, 20)
a = rng.standard_normal((m, k)).astype(np.float32)
b = rng.standard_normal((k, n_)).astype(np.float32)
ref = gemm_reference(False, False, 1.0, a, b, 0.0, None)
for version in cuda_gemm.VERSIONS["gemm"]:
    kernels.cuda.use("gemm", version)
    da, db = be.from_host(a, np.float32), be.from_host(b, np.float32)
    dc = be.xp.zeros((m, n_), np.float32)
    be.gemm(False, False, 1.0, da, db, 0.0, dc)
    err = np.abs(be.to_host(dc) - ref).max()
    print(f"  {version:12s} max error {err:.1e}")
    assert err < 1e-4
kernels.cuda.use("gemm", "default")

# %% [markdown]
# ## What changes on a real GPU
# The code is the same; what differs is scale and cost:
#
# - **Launch sizes.** The simulator starts each thread as a Python thread (about a millisecond
#   each), so minicaffe's launcher uses 2 blocks of 2 threads there; on a GPU, blocks of 256
#   threads and thousands of blocks. Grid-stride loops make both correct.
# - **What is fast.** In the simulator everything is slow alike. On a GPU, global memory is
#   hundreds of cycles away and shared memory a few, so tiling and coalescing decide the speed;
#   a warp whose threads take different branches runs both paths.
# - **Launch overhead.** Starting a kernel from Python costs tens of microseconds on a real GPU,
#   while LeNet's layers take microseconds of arithmetic: a small net's step is launch-bound,
#   which is why the GPU backend fuses steps where it can (docs/GPU.md).
# - **Errors.** The simulator checks array bounds and reports the thread; a real GPU may
#   silently read garbage. Test in the simulator first.
#
# The chart puts numbers on the GEMM's global-memory traffic for the sizes of LeNet's ip1 (batch 64):
# loads per multiply-add for each strategy, from the tile sizes the GPU configuration uses.

# %%
Mg, Ng, Kg = 64, 500, 800
strategies = {
    "one thread per element": 2.0,
    "shared tiles 16x16": 2 / 16,
    "register blocks 64x64 (4x4 per thread)": 2 / 64,
}
fig, ax = plt.subplots(figsize=(7, 2.6))
ax.barh(list(strategies), [v * Mg * Ng * Kg * 4 / 2**20 for v in strategies.values()], color=["C3", "C1", "C2"])
ax.set_xscale("log")
ax.set_xlabel("MiB loaded from global memory (log)")
ax.set_title(f"GEMM {Mg}x{Kg} @ {Kg}x{Ng}: global traffic by strategy")
show(fig, "06_gpu_traffic")
for s_, v in strategies.items():
    print(f"  {s_:42s} {v:.4f} loads per multiply-add -> {v * Mg * Ng * Kg * 4 / 2**20:8.1f} MiB")

# %% [markdown]
# ## Exercises
# 1. Write `scale_kernel(x, a, out)`: `out[i] = a * x[i]`, a `@cuda.jit` kernel with a grid-stride
#    loop, correct for any launch size. Check: `python -m tutorials.check 06.1`
# 2. Write `block_max(x, out)`: one block of 8 threads reduces `x` (any length) to its maximum in
#    `out[0]`, each thread first taking the max of its grid-stride share, then a tree in shared
#    memory. Check: `python -m tutorials.check 06.2`
# 3. (thought) In `tiled_matmul`, what goes wrong if the second `cuda.syncthreads()` is removed?
#    Why can the simulator miss it while a GPU shows it?
#
# Answers to the thought questions: `tutorials/solutions/ANSWERS.md`.

# %%
cleanup()
print("lesson 6 done")
