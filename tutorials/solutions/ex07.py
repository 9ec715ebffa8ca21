"""Lesson 7: reference solutions."""

import numpy as np


def learning_rate(policy, base_lr, it, gamma=0.0, power=0.0, stepsize=1, max_iter=1):
    if policy == "fixed":
        return base_lr
    if policy == "step":
        return base_lr * gamma ** (it // stepsize)
    if policy == "exp":
        return base_lr * gamma**it
    if policy == "inv":
        return base_lr * (1.0 + gamma * it) ** (-power)
    if policy == "poly":
        return base_lr * (1.0 - it / max_iter) ** power
    raise ValueError(f"unknown policy {policy}")


def sgd_momentum_step(w, g, h, lr, momentum, weight_decay):
    h = momentum * np.asarray(h) + lr * (np.asarray(g) + weight_decay * np.asarray(w))
    return np.asarray(w) - h, h
