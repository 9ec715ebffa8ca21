# %% [markdown]
# # Lesson 3: convolution is a matrix product
#
# **You will learn** how im2col turns a convolution into one matrix product (GEMM), where every
# number of the input lands in the column matrix, what the columns cost in memory, and when
# direct loops beat it. **You need** lesson 1 (a convolution layer's forward) and a little
# linear algebra.
#
# A convolution slides each filter over the image and takes a dot product at every position.
# Written as loops that is seven nested loops. Caffe's trick (from Chellapilla et al., 2006):
# copy every window the filter visits into one column of a matrix ("image to columns"); then all
# the dot products of all filters at all positions are one matrix product, and matrix products
# are the fastest code a machine has (lesson 4).

# %%
import matplotlib.pyplot as plt
import numpy as np
from _course import QUICK, cleanup, show, timeit

from kernels import conv, im2col

np.set_printoptions(linewidth=120)
print("quick mode" if QUICK else "full mode")

# %% [markdown]
# ## im2col on a 4x4 image, by hand
# One channel, pixels numbered 0..15, a 3x3 window, stride 1, no padding: the window fits at
# 2 x 2 = 4 positions, so there are 4 columns of 3 x 3 = 9 numbers.

# %%
x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)  # N, C, H, W
k = 3
oh = ow = im2col.out_size(4, k, 0, 1, 1)
col_by_hand = np.stack([x[0, 0, i : i + k, j : j + k].ravel() for i in range(oh) for j in range(ow)], axis=1)
print("x =\n", x[0, 0])
print(
    f"col ({col_by_hand.shape[0]} rows = window taps, {col_by_hand.shape[1]} columns = output positions):\n",
    col_by_hand,
)

# %% [markdown]
# The kernel `kernels.im2col.im2col(x, kh, kw, ph, pw, sh, sw, dh, dw, col)` does the same for
# a whole batch, with padding, stride and dilation; row `r = (c*kh + i)*kw + j` is channel `c`,
# tap `(i, j)`; column `q = n*OH*OW + oh*OW + ow` is image `n`, position `(oh, ow)`.

# %%
col = np.empty((k * k, oh * ow), np.float32)
im2col.im2col(x, k, k, 0, 0, 1, 1, 1, 1, col)
assert np.array_equal(col, col_by_hand)
print("the kernel agrees with the hand-made columns")

# %% [markdown]
# The picture shows where each pixel goes. Each colour is one output position; its window on
# the left becomes its column on the right. Pixel 5 (inside every window) appears four times:
# im2col copies each pixel up to kh*kw times, which is the memory it costs.

# %%
colors = plt.cm.Set2(np.arange(4))
fig, (a0, a1) = plt.subplots(1, 2, figsize=(9, 4.2), gridspec_kw={"width_ratios": [1, 1.2]})
a0.imshow(np.ones((4, 4, 3)))
for v in range(16):
    a0.text(v % 4, v // 4, str(v), ha="center", va="center", fontsize=12)
for q, c in enumerate(colors):
    i, j = divmod(q, ow)
    d = 0.08 * q - 0.12
    a0.add_patch(plt.Rectangle((j - 0.5 + d, i - 0.5 + d), 3, 3, fill=False, ec=c, lw=3))
a0.set_title("input 4x4, four 3x3 windows")
a0.set_xticks([]), a0.set_yticks([])
img = np.ones((9, 4, 3))
for q, c in enumerate(colors):
    img[:, q] = c[:3]
a1.imshow(img, aspect="auto")
for r in range(9):
    for q in range(4):
        a1.text(q, r, str(int(col[r, q])), ha="center", va="center", fontsize=10)
a1.set_xticks(range(4), [f"({q // ow},{q % ow})" for q in range(4)])
a1.set_yticks(range(9), [f"tap ({r // 3},{r % 3})" for r in range(9)])
a1.set_xlabel("output position (oh, ow)")
a1.set_title("col: 9 x 4")
fig.tight_layout()
show(fig, "03_im2col_columns")

# %% [markdown]
# ## One GEMM for all filters
# With M filters stored as rows of a matrix `W` (M, C*kh*kw), the output at every position is
# `W @ col`: row m, column q is filter m's dot product with window q. Two filters on our image:

# %%
w = np.array([[[[1, 0, 0], [0, 0, 0], [0, 0, 0]]], [[[0, 0, 0], [0, 1, 0], [0, 0, 0]]]], np.float32)  # (M, C, 3, 3)
y = (w.reshape(2, -1) @ col).reshape(2, oh, ow)
print("filter 0 picks the top-left tap:\n", y[0], "\nfilter 1 picks the centre:\n", y[1])
assert np.array_equal(y[0], x[0, 0, :2, :2]) and np.array_equal(y[1], x[0, 0, 1:3, 1:3])

# %% [markdown]
# ## The real thing: padding, stride, a batch
# A batch of 2 images of 3 channels, 4 filters of 3x3, padding 1, stride 2. We check every
# im2col version in `kernels/im2col.py` against the float64 reference, then im2col + GEMM
# against the definition of convolution (`kernels.conv.conv_fwd_reference`).

# %%
rng = np.random.default_rng(0)
xb = rng.standard_normal((2, 3, 7, 6)).astype(np.float32)
wb = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
bias = rng.standard_normal(4).astype(np.float32)
geom = (1, 1, 2, 2, 1, 1)  # ph, pw, sh, sw, dh, dw
OH, OW = im2col.out_size(7, 3, 1, 2, 1), im2col.out_size(6, 3, 1, 2, 1)
ref_col = im2col.im2col_reference(xb, 3, 3, *geom)
print("col shape", ref_col.shape, "= (C*kh*kw, N*OH*OW) =", (3 * 9, 2 * OH * OW))
for name, fn in im2col.VERSIONS["im2col"].items():
    c = np.empty(ref_col.shape, np.float32)
    fn(xb, 3, 3, *geom, c)
    print(f"  im2col {name:12s} max error {np.abs(c - ref_col).max():.1e}")
    assert np.allclose(c, ref_col, atol=1e-6)
yb = (wb.reshape(4, -1) @ ref_col).reshape(4, 2, OH, OW).transpose(1, 0, 2, 3) + bias[None, :, None, None]
ref_y = conv.conv_fwd_reference(xb, wb, bias, *geom)
print("im2col + GEMM vs the definition: max error", np.abs(yb - ref_y).max())
assert np.allclose(yb, ref_y, atol=1e-4)

# %% [markdown]
# Note the last step: the GEMM gives (M, N*OH*OW), filters first; the layer wants (N, M, OH, OW),
# so it moves the batch axis to the front. minicaffe puts the whole batch in the columns and
# does one GEMM per batch; Caffe does one GEMM per image (smaller, but many more calls).
#
# ## Direct loops vs im2col + GEMM, measured
# `kernels/conv.py` holds four ways to compute the same convolution forward. We time each on
# the shapes of LeNet's two convolutions (batch 64; 8 in quick mode) and note the bytes the
# columns take. Which one wins depends on your machine and the shape; the numbers below are
# measured now.

# %%
batch = 8 if QUICK else 64
shapes = {"LeNet conv1": (batch, 1, 28, 28, 20, 5), "LeNet conv2": (batch, 20, 12, 12, 50, 5)}
results = {}
for label, (n, c, h, wd, m, kk) in shapes.items():
    xs = rng.standard_normal((n, c, h, wd)).astype(np.float32)
    ws = rng.standard_normal((m, c, kk, kk)).astype(np.float32) * 0.1
    bs = np.zeros(m, np.float32)
    oh_, ow_ = h - kk + 1, wd - kk + 1
    ref = conv.conv_fwd_reference(xs, ws, bs, 0, 0, 1, 1, 1, 1)
    col_bytes = c * kk * kk * n * oh_ * ow_ * 4
    flops = 2 * n * m * c * kk * kk * oh_ * ow_
    print(
        f"{label}: x {xs.shape}, {m} filters {kk}x{kk}: {flops / 1e6:.0f} MFLOP, columns {col_bytes / 2**20:.1f} MiB (input {xs.nbytes / 2**20:.2f} MiB)"
    )
    results[label] = {}
    for name, fn in conv.VERSIONS["conv_fwd"].items():
        out = np.empty((n, m, oh_, ow_), np.float32)
        fn(xs, ws, bs, 0, 0, 1, 1, 1, 1, out)
        assert np.allclose(out, ref, rtol=1e-3, atol=1e-3), f"{name} is wrong on {label}"
        t = timeit(lambda: fn(xs, ws, bs, 0, 0, 1, 1, 1, 1, out), repeat=3 if QUICK else 7)
        results[label][name] = t
        print(f"   {name:16s} {t * 1e3:8.2f} ms  {flops / t / 1e9:6.2f} GFLOP/s")

# %%
fig, ax = plt.subplots(figsize=(8, 3.6))
names = list(conv.VERSIONS["conv_fwd"])
width = 0.8 / len(shapes)
for i, (label, r) in enumerate(results.items()):
    ax.barh(np.arange(len(names)) + i * width, [r[nm] * 1e3 for nm in names], height=width, label=label)
ax.set_yticks(np.arange(len(names)) + width / 2, names)
ax.set_xscale("log")
ax.set_xlabel(f"forward time, ms (batch {batch}, log scale)")
ax.legend()
ax.set_title("one convolution, four ways (measured on this machine)")
show(fig, "03_direct_vs_im2col")
for label, r in results.items():
    best = min(r, key=r.get)
    print(f"{label}: fastest is {best}; the naive loops take {r[names[0]] / r[best]:.0f}x as long")
    assert r[names[0]] > r[best], "the textbook loops should not be the fastest"

# %% [markdown]
# What to see: the textbook loops (first bar) are far behind; the im2col versions pay for the
# copy but then run a GEMM, whose speed comes from reusing every loaded number many times
# (lesson 4). A direct loop with the right order (v2) avoids the copy and its memory and can win
# on small inputs; im2col wins as the number of filters and channels grows, because the GEMM's
# work grows faster than the copy's.

#
# ## Fewer multiplies: Winograd
# Every version so far does r x r multiply-adds per output per channel pair (25 for a 5x5
# filter); the fastest are at the GEMM's limit, so the next step is less arithmetic. Two
# outputs of a 3-tap filter, y0 = g0 d0 + g1 d1 + g2 d2 and y1 = g0 d1 + g1 d2 + g2 d3, take 6
# multiplies. Winograd's F(2, 3) takes 4: it evaluates the filter polynomial g0 + g1 t + g2 t^2
# and the data at 4 points (0, 1, -1 and "infinity", where a polynomial's value is its leading
# coefficient), multiplies the values pointwise and interpolates back:
# y = A^T [(G g) * (B^T d)]. `kernels/winograd.py` derives the three matrices from the points
# (exact fractions, then float64).

# %%
from kernels import winograd  # noqa: E402

AT, G, BT = winograd.transforms(2, 3)
print("B^T =\n", BT, "\nG =\n", G, "\nA^T =\n", AT)
g, d = np.array([1.0, 2.0, -1.0]), np.array([3.0, 0.5, -2.0, 4.0])
direct = np.array([g @ d[0:3], g @ d[1:4]])
products = (G @ g) * (BT @ d)  # the 4 multiplies
print("direct:", direct, "  Winograd:", AT @ products, "  from the 4 products", products)
assert np.allclose(AT @ products, direct)

# %% [markdown]
# In two dimensions the same matrices act on both axes of a tile, and over C channels the
# pointwise products become one small GEMM per tile position: F(4x4, 5x5) reads 8x8 input
# tiles and does 64 multiplies per 16 outputs instead of 400. The price is float32 accuracy:
# the transforms have entries up to 5.25, so rounding grows. Measured here on LeNet's conv2:

# %%
xb = rng.standard_normal((4 if QUICK else 32, 20, 12, 12)).astype(np.float32)
wb = (rng.standard_normal((50, 20, 5, 5)) * 0.06).astype(np.float32)
bb = np.zeros(50, np.float32)
ref = conv.conv_fwd_reference(xb, wb, bb, 0, 0, 1, 1, 1, 1)
errs, times = {}, {}
for name in ("v3_im2col_blas", "v7_winograd"):
    yb = np.empty(ref.shape, np.float32)
    fn = conv.VERSIONS["conv_fwd"][name]
    times[name] = timeit(lambda fn=fn, yb=yb: fn(xb, wb, bb, 0, 0, 1, 1, 1, 1, yb))
    errs[name] = np.abs(yb - ref).max() / np.abs(ref).max()
    print(f"{name:15s} {times[name] * 1e3:7.3f} ms   max error / max |y| = {errs[name]:.1e}")
print("multiplies per output per channel pair: direct 25, F(4x4, 5x5)", 64 / 16)
assert errs["v7_winograd"] < 2e-5 and errs["v3_im2col_blas"] < errs["v7_winograd"]

# %% [markdown]
# What to see: Winograd is faster here by doing a quarter of the arithmetic (its transforms
# are extra memory traffic, so the gain is less than 4x), and its error is about ten times the
# direct sum's, still a few millionths of the largest value. minicaffe's Convolution layer takes
# this route for stride-1 3x3 and 5x5 convolutions with at least 16 channels in and out;
# `engine: CAFFE` in the prototxt keeps im2col (docs/KERNELS.md, "v7_winograd").
#
# ## Exercises
# 1. Write `im2col_strided(x, k, stride, pad)` for one image `x` (C, H, W): return the
#    (C*k*k, OH*OW) columns, row order as the kernel's. Check: `python -m tutorials.check 03.1`
# 2. Write `conv_by_gemm(x, w, b, stride, pad)` for a batch x (N, C, H, W) and filters
#    w (M, C, k, k) with your im2col and one matrix product per image. Check:
#    `python -m tutorials.check 03.2`
# 3. (thought) How many bytes do the columns of LeNet's conv2 take at batch 64 (input 20x12x12,
#    5x5 filters, float32)? When memory is tight, minicaffe can recompute them in backward
#    instead of keeping them (lesson 8). What does that cost in time?
# 4. (thought) Why does the Convolution layer not use Winograd for LeNet's conv1 (one input
#    channel, 20 filters), though its 5x5 filters fit F(4x4, 5x5)?
#
# Answers to the thought questions: `tutorials/solutions/ANSWERS.md`.

# %%
cleanup()
print("lesson 3 done")
