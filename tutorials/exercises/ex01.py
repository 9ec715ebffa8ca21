"""Lesson 1 exercises.  Check with ``python -m tutorials.check 01``."""

import numpy as np  # noqa: F401


def inner_product_backward(x, w, dy):
    """y = x @ w.T + b with x (M, K), w (N, K), b (N,), dy = dL/dy (M, N).
    Return (dx, dw, db): dL/dx (M, K), dL/dw (N, K), dL/db (N,)."""
    raise NotImplementedError


def numeric_gradient(f, v, h=1e-5):
    """Central differences: an array like v whose element i is (f() at v[i]+h - f() at v[i]-h) / 2h.
    f takes no arguments and reads v; restore every element of v after you change it."""
    raise NotImplementedError


def relative_error(a, b):
    """Caffe's GradientChecker measure: |a - b| / max(|a|, |b|, 1), elementwise."""
    raise NotImplementedError
