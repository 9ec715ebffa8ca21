"""Convolution forward as a whole: direct loops against im2col + GEMM.

Contract (a lab kernel: the engine's ConvolutionLayer composes im2col and gemm itself; this
family measures that composition against direct convolution, so a student sees where the
time goes):

    conv_fwd(x, w, bias, ph, pw, sh, sw, dh, dw, y)
        x (N, C, H, W), w (M, C, kh, kw), bias (M,) or (0,) for none, y (N, M, OH, OW)
        y[n, m, oh, ow] = bias[m] + sum_{c,i,j} w[m,c,i,j] * x[n, c, oh*sh-ph+i*dh, ow*sw-pw+j*dw]
        (zero outside the image; OH, OW with Caffe's floor rounding; no groups)

Versions:
  v1_naive        the definition: seven nested loops, a bounds test per multiply-add.
  v2_direct       loops turned so the innermost runs along an output row: y[n,m,oh,:] +=
                  w[m,c,i,j] * x[n,c,ih, (ow*sw + j*dw - pw)] over the valid ow range, hoisted
                  bounds, unit stride when sw == 1 (an AXPY LLVM vectorizes).  No workspace.
  v3_im2col_blas  im2col (the default numba kernel) into a (C*kh*kw, N*OH*OW) workspace, one
                  BLAS GEMM W (M, C*kh*kw) @ col, then (M, N, OH*OW) -> (N, M, OH*OW) and the
                  bias.  What the engine's ConvolutionLayer does; the default.
  v4_im2col_micro the same with the hand-written GEMM (kernels.gemm v3_micro): all numba.
"""

import numpy as np
from numba import njit

from . import _versions
from . import gemm as _gemm
from . import im2col as _im2col

__all__ = ["conv_fwd", "conv_fwd_reference", "VERSIONS", "DEFAULTS", "use"]


def conv_fwd_reference(x, w, bias, ph, pw, sh, sw, dh, dw):
    """float64 y by summing shifted, strided slices of the padded input (one per (c, i, j)
    tap, contracted over c with einsum): independent of im2col and of the loops below."""
    x = np.asarray(x, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    N, C, H, W = x.shape
    M, _, kh, kw = w.shape
    OH = (H + 2 * ph - (dh * (kh - 1) + 1)) // sh + 1
    OW = (W + 2 * pw - (dw * (kw - 1) + 1)) // sw + 1
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    y = np.zeros((N, M, OH, OW))
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, :, i * dh : i * dh + sh * (OH - 1) + 1 : sh, j * dw : j * dw + sw * (OW - 1) + 1 : sw]
            y += np.einsum("nchw,mc->nmhw", patch, w[:, :, i, j])
    if np.size(bias):
        y += np.asarray(bias, dtype=np.float64)[None, :, None, None]
    return y


@njit(nogil=True, cache=True)
def _geometry(x, w, ph, pw, sh, sw, dh, dw, y):
    N, C, H, W = x.shape
    M, C2, kh, kw = w.shape
    OH = _im2col.out_size(H, kh, ph, sh, dh)
    OW = _im2col.out_size(W, kw, pw, sw, dw)
    if C2 != C or y.shape[0] != N or y.shape[1] != M or y.shape[2] != OH or y.shape[3] != OW:
        raise ValueError("conv_fwd: w must be (M, C, kh, kw) and y (N, M, OH, OW)")
    return N, C, H, W, M, kh, kw, OH, OW


@njit(nogil=True, cache=True)
def conv_fwd_v1_naive(x, w, bias, ph, pw, sh, sw, dh, dw, y):
    N, C, H, W, M, kh, kw, OH, OW = _geometry(x, w, ph, pw, sh, sw, dh, dw, y)
    for n in range(N):
        for m in range(M):
            for oh in range(OH):
                for ow in range(OW):
                    s = y.dtype.type(bias[m]) if bias.size else y.dtype.type(0)
                    for c in range(C):
                        for i in range(kh):
                            for j in range(kw):
                                ih = oh * sh - ph + i * dh
                                iw = ow * sw - pw + j * dw
                                if 0 <= ih < H and 0 <= iw < W:
                                    s += w[m, c, i, j] * x[n, c, ih, iw]
                    y[n, m, oh, ow] = s


@njit(nogil=True, cache=True, fastmath={"contract"})
def conv_fwd_v2_direct(x, w, bias, ph, pw, sh, sw, dh, dw, y):
    N, C, H, W, M, kh, kw, OH, OW = _geometry(x, w, ph, pw, sh, sw, dh, dw, y)
    oh_rng, ow_rng = _im2col._ranges(kh, kw, ph, pw, sh, sw, dh, dw, H, W, OH, OW)
    for n in range(N):
        for m in range(M):
            ym = y[n, m]
            ym[...] = bias[m] if bias.size else 0
            for c in range(C):
                xc = x[n, c]
                for i in range(kh):
                    for j in range(kw):
                        wv = w[m, c, i, j]
                        lo, hi = ow_rng[j, 0], ow_rng[j, 1]
                        off = j * dw - pw
                        for oh in range(oh_rng[i, 0], oh_rng[i, 1]):
                            xr = xc[oh * sh - ph + i * dh]
                            yr = ym[oh]
                            if sw == 1:
                                for ow in range(lo, hi):
                                    yr[ow] += wv * xr[ow + off]
                            else:
                                for ow in range(lo, hi):
                                    yr[ow] += wv * xr[ow * sw + off]


def _make_im2col_gemm(gemm_fn, name):
    def conv_fwd(x, w, bias, ph, pw, sh, sw, dh, dw, y):
        N, C, H, W = x.shape
        M, _, kh, kw = w.shape
        OH, OW = y.shape[2], y.shape[3]
        col = np.empty((C * kh * kw, N * OH * OW), x.dtype)
        _im2col.im2col(x, kh, kw, ph, pw, sh, sw, dh, dw, col)
        out = np.empty((M, N * OH * OW), y.dtype)
        gemm_fn(False, False, 1.0, w.reshape(M, C * kh * kw), col, 0.0, out)
        yv = y.reshape(N, M, OH * OW)
        yv[...] = out.reshape(M, N, OH * OW).transpose(1, 0, 2)
        if np.size(bias):
            yv += bias[None, :, None]

    conv_fwd.__name__ = name
    return conv_fwd


conv_fwd_v3_im2col_blas = _make_im2col_gemm(_gemm.gemm_blas, "conv_fwd_v3_im2col_blas")
conv_fwd_v4_im2col_micro = _make_im2col_gemm(_gemm.VERSIONS["gemm"]["v3_micro"], "conv_fwd_v4_im2col_micro")

VERSIONS = {
    "conv_fwd": {
        "v1_naive": conv_fwd_v1_naive,
        "v2_direct": conv_fwd_v2_direct,
        "v3_im2col_blas": conv_fwd_v3_im2col_blas,
        "v4_im2col_micro": conv_fwd_v4_im2col_micro,
    }
}
DEFAULTS = {"conv_fwd": "v3_im2col_blas"}
REFERENCES = {"conv_fwd": conv_fwd_reference}

conv_fwd = VERSIONS["conv_fwd"][DEFAULTS["conv_fwd"]]


def use(version):
    """Bind conv_fwd to ``version`` (or "default")."""
    _versions.rebind(globals(), VERSIONS, DEFAULTS, version)


from . import _apply_env  # noqa: E402

_apply_env("conv")


# -- self-check and benchmark: python -m kernels.conv --------------------------------------------
def bench_cases(quick, sizes=()):
    """The benchmark's cases (``python -m kernels.conv``, ``python -m kernels.bench``): inputs, a
    runner per version, a check against the float64 reference, the work done."""
    from kernels import conv as CV

    from ._bench import F32, Case, close, sum_tol  # noqa: F401

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
            close(y, ref, sum_tol(K, mag), "conv_fwd")

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


if __name__ == "__main__":
    import sys

    from kernels._bench import family_main

    sys.exit(family_main("conv"))
