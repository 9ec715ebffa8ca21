"""Lesson 12: reference solutions."""


def speedup(t_one, t_period, P):
    return P * t_one / t_period


def sync_seconds(nbytes, rounds, bandwidth, latency):
    return rounds * latency + nbytes / 2 / bandwidth
