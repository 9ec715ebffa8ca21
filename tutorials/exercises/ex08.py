"""Lesson 8 exercises.  Check with ``python -m tutorials.check 08``."""

import numpy as np  # noqa: F401


def place_first_fit(sizes, intervals):
    """sizes[i]: bytes of buffer i; intervals[i]: (first step, last step), inclusive.  Return a
    list of offsets such that two buffers live at a common step never share a byte.  Place the
    biggest first (ties: lower index first), each at the lowest offset that fits."""
    raise NotImplementedError


def peak_live(sizes, intervals, n_steps):
    """The most bytes live at any one step 0 .. n_steps-1."""
    raise NotImplementedError
