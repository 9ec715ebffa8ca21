"""Caffe's learning-rate policies (solver.prototxt ``lr_policy``), as functions of the iteration.

fixed      base_lr
step       base_lr * gamma ^ floor(iter / stepsize)
exp        base_lr * gamma ^ iter
inv        base_lr * (1 + gamma * iter) ^ (-power)
multistep  base_lr * gamma ^ (number of stepvalues already reached)
poly       base_lr * (1 - iter / max_iter) ^ power
sigmoid    base_lr * 1 / (1 + exp(-gamma * (iter - stepsize)))
"""

import math

from ..errors import SolverError, did_you_mean

POLICIES = ("fixed", "step", "exp", "inv", "multistep", "poly", "sigmoid")


def check(param, where="solver"):
    """Raise a clear error for an unknown policy or a missing hyper-parameter.

    An unset lr_policy means "fixed" (Caffe stops with "Unknown learning rate policy: ").
    """
    if not param.lr_policy:
        param.lr_policy = "fixed"
    policy = param.lr_policy
    if policy not in POLICIES:
        raise SolverError(f"{where}: unknown lr_policy '{policy}'." + did_you_mean(policy, POLICIES, "policies"))
    need = {
        "step": ("gamma", "stepsize"),
        "exp": ("gamma",),
        "inv": ("gamma", "power"),
        "multistep": ("gamma", "stepvalue"),
        "poly": ("power",),
        "sigmoid": ("gamma", "stepsize"),
    }
    for field in need.get(policy, ()):
        if not param.has(field):
            raise SolverError(f"{where}: lr_policy '{policy}' needs '{field}'")
    if policy == "step" and param.stepsize <= 0:
        raise SolverError(f"{where}: lr_policy 'step' needs stepsize > 0, got {param.stepsize}")
    if policy == "poly" and param.max_iter <= 0:
        raise SolverError(f"{where}: lr_policy 'poly' needs max_iter > 0")
    values = list(param.stepvalue)
    if any(b <= a for a, b in zip(values, values[1:])):
        raise SolverError(f"{where}: stepvalue must increase, got {values}")


def learning_rate(param, it, current_step=0):
    """The rate at iteration ``it``; ``current_step`` is multistep's count of reached stepvalues."""
    base, policy = param.base_lr, param.lr_policy
    if policy == "fixed":
        return base
    if policy == "step":
        return base * param.gamma ** (it // param.stepsize)
    if policy == "exp":
        return base * param.gamma**it
    if policy == "inv":
        return base * (1.0 + param.gamma * it) ** (-param.power)
    if policy == "multistep":
        return base * param.gamma**current_step
    if policy == "poly":
        return base * (1.0 - it / param.max_iter) ** param.power
    if policy == "sigmoid":
        return base * (1.0 / (1.0 + math.exp(-param.gamma * (it - param.stepsize))))
    raise SolverError(f"unknown lr_policy '{policy}'")


def advance_multistep(param, it, current_step):
    """Caffe's rule: step on when iter reaches the next stepvalue."""
    values = param.stepvalue
    while current_step < len(values) and it >= values[current_step]:
        current_step += 1
    return current_step
