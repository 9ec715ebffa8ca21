"""Lesson 7 exercises.  Check with ``python -m tutorials.check 07``."""

import numpy as np  # noqa: F401


def learning_rate(policy, base_lr, it, gamma=0.0, power=0.0, stepsize=1, max_iter=1):
    """Caffe's rate at iteration ``it`` for policy "fixed", "step", "exp", "inv" or "poly"."""
    raise NotImplementedError


def sgd_momentum_step(w, g, h, lr, momentum, weight_decay):
    """Caffe's SGD with L2 weight decay: the gradient gets weight_decay * w added, the history
    h becomes momentum * h + lr * gradient, and the weights move by -h.  Return new (w, h);
    do not modify the inputs."""
    raise NotImplementedError
