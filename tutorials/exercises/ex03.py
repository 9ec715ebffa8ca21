"""Lesson 3 exercises.  Check with ``python -m tutorials.check 03``."""

import numpy as np  # noqa: F401


def im2col_strided(x, k, stride, pad):
    """x (C, H, W) -> columns (C*k*k, OH*OW), OH = (H + 2*pad - k) // stride + 1 (OW likewise).
    Row (c*k + i)*k + j holds tap (i, j) of channel c; column oh*OW + ow the window whose
    top-left corner is at (oh*stride - pad, ow*stride - pad); zero outside the image."""
    raise NotImplementedError


def conv_by_gemm(x, w, b, stride, pad):
    """x (N, C, H, W), w (M, C, k, k), b (M,) -> y (N, M, OH, OW): your im2col_strided, then
    one matrix product per image, plus the bias."""
    raise NotImplementedError
