# %% [markdown]
# # Lesson 5: memory-bound kernels
#
# **You will learn** why ReLU, softmax and pooling are limited by how fast memory moves, not by
# arithmetic; how to measure the ceiling they run against (copy bandwidth, which depends on
# whether the data fits in a cache); and how to read a kernel's speed in GB/s against that
# ceiling. **You need** lesson 4 (the roofline).
#
# A GEMM does `n/6` flops per byte it must move; ReLU does one comparison per 8 bytes (read a
# float, write a float). On the roofline of lesson 4 it sits far left of the ridge: no amount
# of clever arithmetic makes it faster than memory can stream its bytes. The question for such a
# kernel is only how close it comes to that stream.

# %%
import matplotlib.pyplot as plt
import numpy as np
from _course import QUICK, cleanup, copy_bandwidth, show, timeit, versions_doc

from kernels import elementwise, pooling, softmax

print("quick mode" if QUICK else "full mode")

# %% [markdown]
# ## Counting bytes, with small numbers
# ReLU on 8 floats: 32 bytes read, 32 written, 8 comparisons. Leaky ReLU adds a multiply.
# The kernel's contract is flat: `relu_fwd(x, slope, y)` writes y.

# %%
x = np.array([-2, -1, -0.5, 0, 0.5, 1, 2, 3], np.float32)
y = np.empty_like(x)
elementwise.relu_fwd(x, 0.1, y)
print("x =", x, "\ny =", y)
flops, nbytes = 2 * x.size, 2 * x.nbytes
print(f"{flops} flops on {nbytes} bytes: {flops / nbytes:.3f} flop/byte")
assert np.allclose(y, np.where(x > 0, x, 0.1 * x))

# %% [markdown]
# ## The ceiling: copy bandwidth, and the cache staircase
# The fastest any streaming kernel can go is the speed of copying its bytes. That speed depends
# on where the bytes live: arrays that fit in L1/L2 cache copy several times faster than arrays
# that must come from main memory. We time `np.copyto` over array sizes from 16 KiB up, and
# count read + write bytes.

# %%
sizes = [2**k for k in range(14, 24 if QUICK else 28)]
bw = [copy_bandwidth(s, repeat=5) for s in sizes]
for s, b in zip(sizes, bw):
    print(f"  {s / 1024:9.0f} KiB: {b / 1e9:6.1f} GB/s")
fig, ax = plt.subplots(figsize=(7, 3.5))
ax.semilogx(sizes, np.array(bw) / 1e9, "o-")
ax.set_xlabel("array size (bytes)")
ax.set_ylabel("copy bandwidth, GB/s (read + write)")
ax.set_title("the cache staircase, measured on this machine")
show(fig, "05_copy_staircase")

# %% [markdown]
# Reading the staircase: the plateaus are cache levels; the last one is main memory. A kernel's
# ceiling is the copy speed at the size of its own working set. `np.copyto` is itself a kernel
# (the C library's `memcpy`), which changes strategy with size, so its curve can dip where the
# hardware would not; where it does, a well-written kernel can even beat it.
#
# ## Three families, every version, against their ceiling
# Each family in `kernels/` has a ladder of versions (their ideas in the docstrings below). We
# check every version against its float64 reference, then time it and turn the time into GB/s of
# the bytes it must move at least: ReLU reads x and writes y; softmax reads x and writes y; max
# pooling reads x and writes y and its argmax mask. Sizes are LeNet's (batch 64; 8 in quick mode).

# %%
for mod in (elementwise, softmax, pooling):
    print(f"--- {mod.__name__}\n{versions_doc(mod)}\n")

# %%
batch = 8 if QUICK else 64
rng = np.random.default_rng(0)
xa = rng.standard_normal(batch * 20 * 24 * 24).astype(np.float32)  # LeNet's conv1 output, flat
xs = rng.standard_normal((batch, 10, 1)).astype(np.float32) * 3  # LeNet's 10 scores
xs2 = rng.standard_normal((batch // 4 or 1, 21, 64 * 64)).astype(np.float32)  # a segmentation net's scores
xp = rng.standard_normal((batch, 20, 24, 24)).astype(np.float32)  # pool1's input
PH = PW = 12


def case_relu(fn):
    y = np.empty_like(xa)
    return (lambda: fn(xa, 0.0, y)), (lambda: y), elementwise.REFERENCES["relu_fwd"](xa, 0.0), 2 * xa.nbytes


def case_softmax(x):
    def make(fn):
        y = np.empty_like(x)
        return (lambda: fn(x, y)), (lambda: y), softmax.REFERENCES["softmax_fwd"](x), 2 * x.nbytes

    return make


def case_pool(fn):
    y = np.empty((batch, 20, PH, PW), np.float32)
    mask = np.empty(y.shape, np.int32)
    ref, _ = pooling.REFERENCES["max_pool_fwd"](xp, 2, 2, 2, 2, 0, 0, PH, PW)
    return (lambda: fn(xp, 2, 2, 2, 2, 0, 0, y, mask)), (lambda: y), ref, xp.nbytes + y.nbytes + mask.nbytes


cases = {
    "relu_fwd": (elementwise, case_relu),
    "softmax_fwd": (softmax, case_softmax(xs2)),
    "max_pool_fwd": (pooling, case_pool),
}
results = []
for name, (mod, make) in cases.items():
    for version, fn in mod.VERSIONS[name].items():
        run, out, ref, moved = make(fn)
        run()
        assert np.allclose(out(), ref, rtol=1e-5, atol=1e-6), f"{name} {version} is wrong"
        t = timeit(run, repeat=5 if QUICK else 20)
        results.append((name, version, moved / t, moved))
        print(
            f"  {name:13s} {version:11s} {t * 1e6:9.1f} us  {moved / t / 1e9:6.1f} GB/s  ({moved / 2**20:.2f} MiB moved)"
        )
small = np.empty_like(xs)
softmax.softmax_fwd(xs, small)
assert np.allclose(small, softmax.REFERENCES["softmax_fwd"](xs), atol=1e-6)
print(f"LeNet's own softmax is {xs.nbytes} bytes: too small to measure a bandwidth; its cost is the call")

# %% [markdown]
# The figure puts every version's GB/s beside the copy ceiling at its working-set size (the
# dashed mark). A version near its mark has nothing left to gain on one core; one far below it
# wastes time on something else (a branch per element, float64 arithmetic on float32 data, a
# strided walk, or for the parallel versions, starting threads for too little work).

# %%
ceiling = {n: copy_bandwidth(max(m for nn, _, _, m in results if nn == n) // 2, repeat=9) for n in cases}
fig, ax = plt.subplots(figsize=(8, 0.32 * len(results) + 1.2))
labels = [f"{n} {v}" for n, v, _, _ in results]
colors = {n: f"C{i}" for i, n in enumerate(cases)}
ax.barh(range(len(results)), [g / 1e9 for _, _, g, _ in results], color=[colors[n] for n, *_ in results])
for i, (n, *_rest) in enumerate(results):
    ax.plot([ceiling[n] / 1e9] * 2, [i - 0.4, i + 0.4], "k--", lw=1.5)
ax.set_yticks(range(len(results)), labels, fontsize=8)
ax.invert_yaxis()
ax.set_xlabel("GB/s of the bytes each kernel must move (dashed: copy at that size)")
ax.set_title("memory-bound kernels against their ceiling")
show(fig, "05_bandwidth")

best = {}
for n in cases:
    g, v = max((g, v) for nn, v, g, _ in results if nn == n)
    best[n] = g / ceiling[n]
    print(f"{n}: best {v} at {g / 1e9:.1f} GB/s = {best[n]:.2f} x copy")
assert best["relu_fwd"] > 0.1, "ReLU is a pure stream: its best version should run near copy speed"
assert best["softmax_fwd"] < best["relu_fwd"], "softmax does an exp per element, ReLU a comparison"

# %% [markdown]
# Softmax sits well below its ceiling: it computes an `exp` per element, a call of a few
# nanoseconds that numba does not vectorize without Intel's SVML, so at these sizes it is bound
# by that arithmetic, not by memory. ReLU and 2x2 pooling, whose work per byte is a comparison,
# are the true streams. (If a bar passes its dashed mark, the two timings disagree by the noise
# of a busy machine; run the lesson again.)

# %% [markdown]
# ## Exercises
# 1. Write `softmax_rows(x)` for a 2-d array, softmax over each row, that does not overflow for
#    scores like 1000 and agrees with the kernel. Check: `python -m tutorials.check 05.1`
# 2. Write `max_pool_2x2(x)` for x (N, C, H, W) with even H and W, returning `(y, mask)` with
#    Caffe's mask (the flat index h*W + w of each window's maximum, the first one on ties), using
#    numpy reshapes, no Python loop over pixels. Check: `python -m tutorials.check 05.2`
# 3. (thought) The `prange` versions split the work across cores. Why can they be slower than
#    the serial version on LeNet's sizes, and when do they win? What does a second core add to
#    the ceiling of a memory-bound kernel?
#
# Answers to the thought questions: `tutorials/solutions/ANSWERS.md`.

# %%
cleanup()
print("lesson 5 done")
