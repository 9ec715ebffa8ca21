"""Lesson 5: reference solutions."""

import numpy as np


def softmax_rows(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).astype(x.dtype)


def max_pool_2x2(x):
    N, C, H, W = x.shape
    win = x.reshape(N, C, H // 2, 2, W // 2, 2).transpose(0, 1, 2, 4, 3, 5).reshape(N, C, H // 2, W // 2, 4)
    k = win.argmax(axis=4)  # first maximum in (row, column) order of the window
    y = np.take_along_axis(win, k[..., None], axis=4)[..., 0]
    p = np.arange(H // 2)[:, None]
    q = np.arange(W // 2)[None, :]
    mask = (2 * p + k // 2) * W + 2 * q + k % 2
    return y, mask.astype(np.int32)
