"""Lesson 11 exercises.  Check with ``python -m tutorials.check 11``."""

import numpy as np  # noqa: F401


def choose(m, n, k, P):
    """ "sfb" or "ps": Poseidon's rule for an m x n FC layer, k rows per node, P nodes that are
    both workers and server shards (SFB when its floats are <= the parameter server's)."""
    raise NotImplementedError


def sfb_gradient(us, vs):
    """us[p] (K_p x M) and vs[p] (K_p x N), one pair per node: the summed weight gradient
    sum_p us[p]^T vs[p] (M x N), computed with one matrix product."""
    raise NotImplementedError
