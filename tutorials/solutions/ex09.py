"""Lesson 9: reference solutions."""

import numpy as np


def may_start(clock, applied, staleness):
    return applied >= clock - staleness


def shard_bounds(batch, n):
    sizes = [batch // n + (1 if k < batch % n else 0) for k in range(n)]
    starts = np.concatenate([[0], np.cumsum(sizes)])
    return [(int(starts[k]), int(starts[k + 1])) for k in range(n)]


def reduce_gradients(grads, sizes):
    total = sum(sizes)
    return sum(g * (s / total) for g, s in zip(grads, sizes))
