"""Lesson 12 exercises.  Check with ``python -m tutorials.check 12``."""


def speedup(t_one, t_period, P):
    """Weak scaling: each of P nodes keeps one node's batch.  t_one: one node's seconds per
    iteration; t_period: seconds per iteration of the P-node run."""
    raise NotImplementedError


def sync_seconds(nbytes, rounds, bandwidth, latency):
    """One layer's sync in the simulator's model: ``rounds`` one-way latencies plus half of
    ``nbytes`` (sent + received, moving at once on a full-duplex link) at ``bandwidth`` bytes/s."""
    raise NotImplementedError
