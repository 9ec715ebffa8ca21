"""Lesson 10 exercises.  Check with ``python -m tutorials.check 10``."""

import numpy as np  # noqa: F401


def recv_exactly(sock, n):
    """Exactly n bytes from the socket (bytes or bytearray).  ``sock.recv(k)`` may return fewer
    than k bytes; it returns b"" when the peer has closed: raise ConnectionError then."""
    raise NotImplementedError


def ps_bytes_per_clock(counts, P):
    """Payload bytes one node sends per clock in a sharded parameter server of P nodes, for blobs
    of ``counts`` float32 numbers: its gradient slices for the other P-1 shards, and its own
    shard's fresh parameters to each of the other P-1 nodes (shards of count / P, as floats)."""
    raise NotImplementedError
