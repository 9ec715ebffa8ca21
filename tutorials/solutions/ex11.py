"""Lesson 11: reference solutions."""

import numpy as np


def choose(m, n, k, P):
    ps = 2.0 * m * n * (P + P - 2) / P
    sfb = 2.0 * k * (P - 1) * (m + n)
    return "sfb" if sfb <= ps else "ps"


def sfb_gradient(us, vs):
    return np.concatenate(us).T @ np.concatenate(vs)
