"""What the distributed algorithms need from a network, and the pieces every transport shares.

The parameter server (``minicaffe.dist.ps``) talks to a :class:`Transport`; it never knows whether
frames travel over minicaffe's own sockets (``minicaffe.dist.sockets``) or over MPI
(``minicaffe.dist.mpi``).  The contract:

``rank``, ``world``
    this node's number and the number of nodes.
``start(handler)``
    begin delivering frames from peers to ``handler`` (an object with the four methods below),
    each peer's frames in the order they were sent.
``send(dst, kind, key, clock, array=None, payload=None)``
    queue one frame for node ``dst`` and return at once; ``array`` (a C-contiguous numpy array)
    is sent from its own memory, so the caller must not change it until the protocol says it
    has arrived (the parameter server's clocks guarantee that).  ``payload`` is a small control
    message (bytes or a uint8 array).
``close(stats=None)``
    say goodbye to every peer (with this node's statistics for rank 0), wait for theirs, stop.
``stats``
    a :class:`Stats`: bytes sent and received per (kind, key).

The handler (the parameter server's node) answers:

``destination(src, header)``
    the preallocated array a tensor frame must be received into (its dtype and shape are the
    expectation the header is checked against before any byte of payload is read), or ``None``
    for a control frame (then at most ``frames.MAX_CONTROL`` bytes are read into a fresh buffer).
    Raises ``FrameError`` for a frame that must not come now.
``arrived(src, header, array)`` / ``control(src, header, payload)``
    the whole frame is there.
``failed(message)``
    the transport lost a peer or a peer broke the protocol; the run must stop.

Authentication (used by the socket transport; MPI's launcher is trusted): peers share a secret;
every connection starts with an HMAC-SHA256 challenge-response, both ways::

    server -> client  HELLO    nonce_s (32 random bytes)
    client -> server  AUTH     nonce_c, HMAC(secret, "minicaffe-client" | nonce_s | nonce_c)
    server -> client  WELCOME  HMAC(secret, "minicaffe-server" | nonce_c | nonce_s)

so neither side ever sends the secret, a recorded exchange cannot be replayed (fresh nonces), and
the client learns that the server knows the secret too.  A client that fails gets a REFUSE frame
and the connection is closed; the server logs it and keeps serving.
"""

import hashlib
import hmac
import os
import re
import secrets
import threading
import time

import numpy as np

from ..errors import SolverError
from . import frames as F

SECRET_ENV = "MINICAFFE_DIST_SECRET"


class DistError(SolverError):
    """A distributed run cannot start or cannot go on (a lost node, a refused peer, ...); a
    SolverError, so the tools stop with one line and keep the last snapshot."""


# -- the secret -----------------------------------------------------------------------------------
def new_secret():
    return secrets.token_hex(32)


def load_secret(secret_file=None, env=None, required=True):
    """The shared secret as bytes: from ``secret_file``, else the environment variable
    MINICAFFE_DIST_SECRET; ``required`` -> a clear error where neither is given."""
    env = os.environ if env is None else env
    if secret_file:
        try:
            with open(secret_file, "rb") as f:
                text = f.read().strip()
        except OSError as exc:
            raise DistError(f"cannot read the secret file {secret_file}: {exc.strerror}") from None
        if not text:
            raise DistError(f"the secret file {secret_file} is empty")
        return text
    value = env.get(SECRET_ENV, "")
    if value:
        return value.encode()
    if required:
        raise DistError(
            f"no shared secret: set {SECRET_ENV} (the same value on every node, e.g. from "
            f"`python -c 'import secrets; print(secrets.token_hex(32))'`) or pass --secret-file"
        )
    return None


def _mac(secret, label, a, b):
    return hmac.new(secret, label + a + b, hashlib.sha256).digest()


NONCE = 32


def server_auth(conn, secret, peer):
    """Challenge a freshly accepted connection; raises FrameError (after sending REFUSE) if it fails."""
    nonce_s = os.urandom(NONCE)
    conn.send_control(F.HELLO, nonce_s)
    h = conn.read_header()
    if h.kind != F.AUTH or h.nbytes != 2 * NONCE:
        raise F.FrameError(f"expected AUTH ({2 * NONCE} bytes), got {h!r}", peer)
    body = conn.read_control(h)
    nonce_c, mac = body[:NONCE], body[NONCE:]
    if not hmac.compare_digest(mac, _mac(secret, b"minicaffe-client", nonce_s, nonce_c)):
        conn.refuse("authentication failed (wrong secret)")
        raise F.FrameError("authentication failed: wrong secret", peer)
    conn.send_control(F.WELCOME, _mac(secret, b"minicaffe-server", nonce_c, nonce_s))


def client_auth(conn, secret, peer):
    h = conn.read_header()
    if h.kind == F.REFUSE:
        raise DistError(f"{peer} refused the connection: {bytes(conn.read_control(h)).decode(errors='replace')}")
    if h.kind != F.HELLO or h.nbytes != NONCE:
        raise F.FrameError(f"expected HELLO ({NONCE} bytes), got {h!r}", peer)
    nonce_s = bytes(conn.read_control(h))
    nonce_c = os.urandom(NONCE)
    conn.send_control(F.AUTH, nonce_c + _mac(secret, b"minicaffe-client", nonce_s, nonce_c))
    h = conn.read_header()
    if h.kind == F.REFUSE:
        reason = bytes(conn.read_control(h)).decode(errors="replace")
        raise DistError(f"{peer} refused this node: {reason} (is the secret the same on every node?)")
    if h.kind != F.WELCOME or h.nbytes != NONCE:
        raise F.FrameError(f"expected WELCOME, got {h!r}", peer)
    mac = bytes(conn.read_control(h))
    if not hmac.compare_digest(mac, _mac(secret, b"minicaffe-server", nonce_c, nonce_s)):
        raise DistError(f"{peer} does not know the shared secret: not a node of this run")


# -- link emulation -------------------------------------------------------------------------------
_RATE = re.compile(r"^\s*([0-9.]+)\s*([kmgt]?)(bit|bps|b|B|byte|bytes)?(/s)?\s*$", re.I)


def parse_rate(text):
    """'1gbit', '10Gbit', '100mbit', '125MB' -> bytes per second (bits by default, as tc)."""
    m = _RATE.match(str(text))
    if not m:
        raise DistError(f"cannot read the rate '{text}' (examples: 1gbit, 100mbit, 10gbit)")
    value = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m.group(2).lower()]
    unit = m.group(3) or "bit"
    if unit in ("B", "byte", "bytes") or unit == "Bps":
        return value
    return value / 8.0


def parse_delay(text):
    """'0.1ms', '50us', '1s' -> seconds."""
    m = re.match(r"^\s*([0-9.]+)\s*(s|ms|us)?\s*$", str(text))
    if not m:
        raise DistError(f"cannot read the delay '{text}' (examples: 0.1ms, 50us)")
    return float(m.group(1)) * {"s": 1.0, "ms": 1e-3, "us": 1e-6, None: 1e-3}[m.group(2)]


class TokenBucket:
    """A link of ``rate`` bytes/s: ``take(n)`` returns when n bytes may leave (bucket of ``burst``).

    One bucket per outgoing link (per peer), as each veth pair of the emulated cluster is shaped
    on its own.  ``delay`` is added once per frame (the link's latency)."""

    def __init__(self, rate, burst=None, delay=0.0):
        self.rate = float(rate)
        # a burst of 50 ms of traffic (at least one 256 KiB send piece): a wake-up that comes
        # late on a busy machine is made up by the next pieces instead of lowering the rate
        self.burst = float(burst if burst is not None else self.default_burst(self.rate))
        self.delay = float(delay)
        self.tokens = self.burst
        self.t = time.perf_counter()
        self.lock = threading.Lock()

    @staticmethod
    def default_burst(rate):
        return max(256 * 1024, rate / 20)

    def take(self, n):
        with self.lock:
            now = time.perf_counter()
            self.tokens = min(self.burst, self.tokens + (now - self.t) * self.rate)
            self.t = now
            self.tokens -= n
            wait = -self.tokens / self.rate if self.tokens < 0 else 0.0
        if wait > 0:
            time.sleep(wait)


# -- statistics -----------------------------------------------------------------------------------
TIMELINE_KINDS = (F.GRAD, F.PARAM, F.FACTOR)  # the frames a timeline draws: gradients, parameters, factors


class Stats:
    """Bytes (payload + header) per (direction, kind, key); thread-safe."""

    def __init__(self):
        self.lock = threading.Lock()
        self.sent = {}
        self.received = {}
        self.recording = False  # while True, tensor frames are also logged as timeline events
        self.events = []  # (lane, t_start, t_end, kind, key), perf_counter seconds

    def add(self, table, kind, key, n):
        k = (F.KIND_NAMES.get(kind, str(kind)), int(key))
        with self.lock:
            table[k] = table.get(k, 0) + n

    def on_send(self, kind, key, n, t0=None):
        self.add(self.sent, kind, key, n + F.HEADER_SIZE)
        if self.recording and t0 is not None and kind in TIMELINE_KINDS:
            self.events.append(("send", t0, time.perf_counter(), kind, key))

    def on_receive(self, kind, key, n, t0=None):
        self.add(self.received, kind, key, n + F.HEADER_SIZE)
        if self.recording and t0 is not None and kind in TIMELINE_KINDS:
            self.events.append(("recv", t0, time.perf_counter(), kind, key))

    def totals(self):
        with self.lock:
            return sum(self.sent.values()), sum(self.received.values())

    def by_key(self, kinds=("GRAD", "PARAM")):
        """{key: [sent, received]} over the given kinds (the per-layer traffic)."""
        out = {}
        with self.lock:
            for table, j in ((self.sent, 0), (self.received, 1)):
                for (kind, key), n in table.items():
                    if kind in kinds:
                        out.setdefault(key, [0, 0])[j] += n
        return out


class Transport:
    """The interface (see the module docstring); the socket and MPI transports implement it."""

    rank = 0
    world = 1

    def start(self, handler):
        raise NotImplementedError

    def send(self, dst, kind, key, clock, array=None, payload=None):
        raise NotImplementedError

    def flush(self, timeout=30.0):
        """Wait until every frame sent so far has left this node and is counted in ``stats``
        (so a report taken next includes it); False if ``timeout`` ran out first."""
        raise NotImplementedError

    def close(self, stats=None):
        raise NotImplementedError


def as_payload(payload):
    if payload is None:
        return np.empty(0, np.uint8)
    if isinstance(payload, (bytes, bytearray, memoryview)):
        return np.frombuffer(bytes(payload), np.uint8)
    return np.ascontiguousarray(payload)
