"""Lesson 9 exercises.  Check with ``python -m tutorials.check 09``."""

import numpy as np  # noqa: F401


def may_start(clock, applied, staleness):
    """May a worker start computing clock ``clock`` (0, 1, ...) when ``applied`` updates are in
    the weights?  staleness 0 is BSP (it needs the update of clock - 1)."""
    raise NotImplementedError


def shard_bounds(batch, n):
    """[(lo, hi)] rows of the batch for each of n workers: contiguous, covering the batch, sizes
    differing by at most one, the larger shards first."""
    raise NotImplementedError


def reduce_gradients(grads, sizes):
    """grads: list of n gradient vectors (one per worker, each the mean over its shard);
    sizes: shard sizes.  Return the gradient of the whole batch (the mean over all its rows)."""
    raise NotImplementedError
