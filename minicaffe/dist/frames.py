"""The wire format: one fixed 48-byte header, then the raw bytes of one tensor (or a short control
payload).  Nothing else travels between nodes: no pickle, no third-party framing.

Header (little-endian, ``struct`` format ``<4sHHIHBBq4IQ``)::

    offset size field    meaning
       0    4  magic     b"MCDF"  (minicaffe distributed frame)
       4    2  version   PROTOCOL_VERSION; a peer speaking another version is refused
       6    2  kind      what the frame carries (KINDS below)
       8    4  key       which tensor: the learnable blob's index (0 for control frames)
      12    2  sender    the sender's rank
      14    1  dtype     DTYPES code of the payload's elements
      15    1  ndim      number of dimensions used in ``shape`` (0..4)
      16    8  clock     the iteration (or parameter version) the tensor belongs to
      24   16  shape     four uint32 dimensions, unused ones 0
      40    8  nbytes    payload length in bytes; must equal prod(shape) * itemsize
      48       payload   nbytes raw bytes (C order)

A receiver reads the 48 bytes, checks everything it can know without the payload (magic, version,
kind, dtype, ndim, that nbytes agrees with the shape and is under the frame's limit), then checks
the header against what it *expects* at this point of the protocol (the tensor of that key has
this dtype and shape) and only then receives the payload with ``recv_into`` straight into the
tensor's own preallocated buffer.  A lying length (too long, too short, 2**63) is refused before
anything is allocated or read.  Control payloads (JSON or nonces) are small and capped.

Sending: ``send_frame`` hands the kernel the header and a memoryview of the array in one
``sendmsg`` (a gather write, no copy of the tensor), looping over partial sends.
"""

import json
import math
import struct

import numpy as np

from ..errors import MinicaffeError

MAGIC = b"MCDF"
PROTOCOL_VERSION = 1
HEADER = struct.Struct("<4sHHIHBBq4IQ")
HEADER_SIZE = HEADER.size  # 48
MAX_NDIM = 4

# message kinds
HELLO = 1  # server -> client: 32-byte challenge nonce
AUTH = 2  # client -> server: client nonce (32) + HMAC (32)
WELCOME = 3  # server -> client: HMAC proving the server knows the secret too (32)
JOIN = 4  # JSON: rank, world size, config hash, listening address
TABLE = 5  # JSON: rank 0's answer: every node's address (or a refusal reason)
GRAD = 6  # a node's gradient slice of blob `key` for the shard that owns it, at `clock`
PARAM = 7  # a shard's fresh parameter slice of blob `key`, version `clock`
HEARTBEAT = 8  # empty; proves the sender is alive
ABORT = 9  # UTF-8 reason; the sender stops the run
BYE = 10  # JSON: the sender's statistics; it ends cleanly
INIT = 11  # rank 0 -> all: a full blob's parameters (key) at start-up or resume
STATE = 12  # JSON: rank 0 -> all: iteration, lr step, data reader positions
HIST = 13  # solver history slice: key = h * n_blobs + blob
HIST_REQ = 14  # rank 0 -> shards: send your history after update `clock`
STOP = 15  # rank 0 -> all: stop after iteration `clock - 1`
REFUSE = 16  # UTF-8 reason, sent before a connection is closed
NORM = 17  # float64 partial sum of squares of a shard's gradient (clip_gradients)
FACTOR = 18  # sufficient factors of an SFB layer (minicaffe.dist.poseidon): key = 2 * blob + (0: u, 1: v)
SFB_HIST = 19  # on resume, node 0 -> all: an SFB layer's whole history buffer, key = h * n_blobs + blob

KIND_NAMES = {
    v: k
    for k, v in dict(globals()).items()
    if k.isupper() and isinstance(v, int) and k not in ("PROTOCOL_VERSION", "HEADER_SIZE", "MAX_NDIM")
}

DTYPES = {1: np.dtype(np.float32), 2: np.dtype(np.float64), 3: np.dtype(np.uint8), 4: np.dtype(np.int64)}
DTYPE_CODES = {v: k for k, v in DTYPES.items()}

MAX_CONTROL = 1 << 16  # the largest control payload (JSON, nonces) a receiver accepts


class FrameError(MinicaffeError):
    """A frame that breaks the protocol: ``reason`` says what, ``peer`` who sent it."""

    def __init__(self, reason, peer=None):
        self.reason, self.peer = reason, peer
        super().__init__(f"{peer}: {reason}" if peer else reason)


class PeerClosed(FrameError):
    """The connection ended (EOF or reset) before a whole frame arrived."""


class Header:
    __slots__ = ("kind", "key", "sender", "dtype", "shape", "clock", "nbytes")

    def __init__(self, kind, key, sender, dtype, shape, clock, nbytes):
        self.kind, self.key, self.sender, self.dtype = kind, key, sender, dtype
        self.shape, self.clock, self.nbytes = shape, clock, nbytes

    def __repr__(self):
        return (
            f"Header({KIND_NAMES.get(self.kind, self.kind)}, key={self.key}, sender={self.sender}, "
            f"{self.dtype}{list(self.shape)}, clock={self.clock}, nbytes={self.nbytes})"
        )


def pack_header(kind, key=0, sender=0, dtype=np.uint8, shape=(0,), clock=0, nbytes=None):
    dtype = np.dtype(dtype)
    shape = tuple(map(int, shape))
    if len(shape) > MAX_NDIM:
        raise FrameError(f"a frame carries at most {MAX_NDIM} dimensions, got shape {shape}")
    if nbytes is None:  # (math.prod on Python ints: exact, and 40x cheaper than np.prod on a tuple)
        nbytes = math.prod(shape) * dtype.itemsize
    dims = list(shape) + [0] * (MAX_NDIM - len(shape))
    return HEADER.pack(MAGIC, PROTOCOL_VERSION, kind, key, sender, DTYPE_CODES[dtype], len(shape), clock, *dims, nbytes)


def parse_header(buf, limit, peer=None):
    """Check the 48 bytes of a header on their own; -> Header.  ``limit``: the largest payload
    this receiver would accept from anybody (its largest tensor)."""
    magic, version, kind, key, sender, dcode, ndim, clock, d0, d1, d2, d3, nbytes = HEADER.unpack(buf)
    if magic != MAGIC:
        raise FrameError(f"bad magic {bytes(magic)!r} (expected {MAGIC!r}): not a minicaffe peer", peer)
    if version != PROTOCOL_VERSION:
        raise FrameError(f"protocol version {version}, this node speaks {PROTOCOL_VERSION}", peer)
    if kind not in KIND_NAMES:
        raise FrameError(f"unknown message kind {kind}", peer)
    if dcode not in DTYPES:
        raise FrameError(f"unknown dtype code {dcode}", peer)
    if ndim > MAX_NDIM:
        raise FrameError(f"ndim {ndim} > {MAX_NDIM}", peer)
    dims = (d0, d1, d2, d3)
    if any(dims[ndim:]):
        raise FrameError(f"shape {list(dims)} has dimensions beyond ndim {ndim}", peer)
    shape = dims[:ndim]
    dtype = DTYPES[dcode]
    want = math.prod(shape) * dtype.itemsize if shape else 0  # (Python ints: exact for any lie)
    if nbytes != want:
        raise FrameError(f"length {nbytes} does not match shape {list(shape)} of {dtype} ({want} bytes)", peer)
    if nbytes > limit:
        raise FrameError(f"length {nbytes} over this receiver's limit of {limit} bytes", peer)
    return Header(kind, key, sender, dtype, shape, clock, nbytes)


def check_expected(header, kind, dtype, shape, peer=None):
    """The header is the frame the receiver expects now: this kind, dtype and shape."""
    if header.kind not in (kind if isinstance(kind, tuple) else (kind,)):
        raise FrameError(f"got a {KIND_NAMES[header.kind]} frame where {_kind_names(kind)} was expected", peer)
    if header.dtype != np.dtype(dtype):
        raise FrameError(f"key {header.key}: dtype {header.dtype}, expected {np.dtype(dtype)}", peer)
    if tuple(header.shape) != tuple(shape):
        raise FrameError(f"key {header.key}: shape {list(header.shape)}, expected {list(shape)}", peer)


def _kind_names(kind):
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(KIND_NAMES[k] for k in kinds)


# -- sockets --------------------------------------------------------------------------------------
def recv_exactly_into(sock, view, peer=None):
    """Fill the writable memoryview ``view`` from ``sock`` (recv_into, no intermediate copies)."""
    got, n = 0, len(view)
    while got < n:
        try:
            k = sock.recv_into(view[got:], n - got)
        except ConnectionError as exc:
            raise PeerClosed(f"connection lost ({type(exc).__name__})", peer) from None
        if k == 0:
            raise PeerClosed(f"connection closed after {got} of {n} bytes", peer)
        got += k


def sendmsg_all(sock, buffers):
    """Send every buffer in order with gather writes (``sendmsg``), finishing partial sends."""
    views = [memoryview(b).cast("B") for b in buffers if len(memoryview(b).cast("B"))]
    while views:
        views = skip_sent(views, sock.sendmsg(views))


def skip_sent(views, sent):
    """The byte views still to send after a gather write sent ``sent`` bytes of ``views``."""
    if sent == sum(memoryview(v).nbytes for v in views):  # (the common case: all of it)
        return []
    views = [memoryview(v).cast("B") for v in views]
    while sent and views:
        if sent >= len(views[0]):
            sent -= len(views[0])
            views.pop(0)
        else:
            views[0] = views[0][sent:]
            sent = 0
    return [v for v in views if len(v)]


def as_bytes_view(array):
    """A byte memoryview of a C-contiguous array (the tensor's own memory)."""
    a = np.asarray(array)
    if not a.flags.c_contiguous:
        raise FrameError("only C-contiguous arrays are sent (no hidden copies)")
    return memoryview(a).cast("B") if a.size else memoryview(b"")


def encode_json(obj):
    return np.frombuffer(json.dumps(obj, separators=(",", ":")).encode(), np.uint8)


def decode_json(payload, peer=None):
    try:
        return json.loads(bytes(payload).decode())
    except (UnicodeDecodeError, ValueError) as exc:
        raise FrameError(f"control payload is not JSON ({exc})", peer) from None
