"""The socket transport on loopback: the frame layout byte by byte, every malformed header refused
before anything is allocated, the HMAC handshake both ways, a known-answer exchange over a
3-node mesh, and a listener that turns away strangers while the mesh keeps working."""

import socket
import struct
import threading
import time

import numpy as np
import pytest

from minicaffe.dist import frames as F
from minicaffe.dist.sockets import Connection, SocketTransport, listen
from minicaffe.dist.transport import DistError, TokenBucket, client_auth, parse_delay, parse_rate, server_auth

SECRET = b"test-secret"


def header(magic=b"MCDF", version=1, kind=F.GRAD, key=3, sender=1, dcode=1, ndim=1, clock=7, dims=(5, 0, 0, 0), n=20):
    return F.HEADER.pack(magic, version, kind, key, sender, dcode, ndim, clock, *dims, n)


def test_header_layout_known_answer():
    h = F.pack_header(F.GRAD, key=3, sender=1, dtype=np.float32, shape=(5,), clock=7)
    assert len(h) == F.HEADER_SIZE == 48
    expected = (
        b"MCDF"
        + struct.pack("<H", 1)  # version
        + struct.pack("<H", 6)  # kind GRAD
        + struct.pack("<I", 3)  # key
        + struct.pack("<H", 1)  # sender
        + bytes([1, 1])  # dtype float32, ndim 1
        + struct.pack("<q", 7)  # clock
        + struct.pack("<4I", 5, 0, 0, 0)  # shape
        + struct.pack("<Q", 20)  # nbytes = 5 * 4
    )
    assert h == expected
    parsed = F.parse_header(h, limit=1024)
    assert (parsed.kind, parsed.key, parsed.sender, parsed.dtype, parsed.shape, parsed.clock, parsed.nbytes) == (
        F.GRAD,
        3,
        1,
        np.float32,
        (5,),
        7,
        20,
    )


@pytest.mark.parametrize(
    "fields, reason",
    [
        (dict(magic=b"HTTP"), "bad magic"),
        (dict(version=2), "protocol version 2"),
        (dict(kind=99), "unknown message kind 99"),
        (dict(dcode=9), "unknown dtype code 9"),
        (dict(ndim=5), "ndim 5"),
        (dict(dims=(5, 2, 0, 0)), "beyond ndim"),
        (dict(n=24), "does not match"),  # too long
        (dict(n=16), "does not match"),  # too short
        (dict(n=2**63), "does not match"),
        (dict(dims=(1 << 30, 0, 0, 0), n=4 << 30), "over this receiver's limit"),
        # a length one element short of (2**30 + 1)**2 floats, which float64 arithmetic rounds to
        # this very length: the check is exact (Python ints), so it is a lie, not a limit
        (dict(ndim=2, dims=((1 << 30) + 1, (1 << 30) + 1, 0, 0), n=((1 << 60) + (1 << 31)) * 4), "does not match"),
    ],
)
def test_malformed_headers_are_refused_before_any_payload(fields, reason):
    with pytest.raises(F.FrameError, match=reason):
        F.parse_header(header(**fields), limit=1 << 20, peer="x")


def test_skip_sent_keeps_what_a_gather_write_left():
    head, body = memoryview(b"h" * 48), memoryview(np.arange(10, dtype=np.float32)).cast("B")
    assert F.skip_sent([head, body], 88) == []
    rest = F.skip_sent([head, body], 50)
    assert [bytes(v) for v in rest] == [bytes(body[2:])]
    assert [bytes(v) for v in F.skip_sent([head, body], 10)] == [bytes(head[10:]), bytes(body)]
    # a typed view counts bytes, not elements: 10 floats are 40 bytes, not all of them
    assert len(F.skip_sent([np.arange(10, dtype=np.float32)], 10)) == 1


def test_frame_ping_pong_counts_every_frame():
    """benchmarks/dist_frames.py: every round trip is one GRAD and one PARAM frame of the size
    asked for (payload + the 48-byte header), and the CPU per frame is measured."""
    import importlib.util
    import os

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location("dist_frames", os.path.join(root, "benchmarks", "dist_frames.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    cpu, wall, sent = bench.ping_pong(1024, 50, warmup=10)
    assert sent == [60 * (1024 + F.HEADER_SIZE)] * 2
    assert cpu.shape == (2,) and cpu.sum() > 0 and wall > 0


def test_expectation_checks_dtype_and_shape():
    h = F.parse_header(header(), limit=1024)
    F.check_expected(h, F.GRAD, np.float32, (5,))
    with pytest.raises(F.FrameError, match="shape"):
        F.check_expected(h, F.GRAD, np.float32, (6,))
    with pytest.raises(F.FrameError, match="dtype"):
        F.check_expected(h, F.GRAD, np.float64, (5,))
    with pytest.raises(F.FrameError, match="PARAM was expected"):
        F.check_expected(h, F.PARAM, np.float32, (5,))


def test_tensor_goes_into_the_preallocated_buffer():
    a, b = socket.socketpair()
    try:
        tx, rx = Connection(a, "a", 1 << 20), Connection(b, "b", 1 << 20)
        x = np.arange(12, dtype=np.float32).reshape(3, 4)
        tx.send(F.PARAM, key=2, clock=9, array=x)
        dest = np.zeros((3, 4), np.float32)
        before = dest.__array_interface__["data"][0]
        h = rx.read_header()
        F.check_expected(h, F.PARAM, dest.dtype, dest.shape)
        rx.read_into(h, dest)
        np.testing.assert_array_equal(dest, x)
        assert dest.__array_interface__["data"][0] == before  # the same memory, no new array
    finally:
        a.close()
        b.close()


def test_truncated_payload_is_a_closed_peer():
    a, b = socket.socketpair()
    rx = Connection(b, "b", 1 << 20)
    a.sendall(header() + b"\0" * 8)  # 8 of the 20 bytes announced
    a.close()
    h = rx.read_header()
    with pytest.raises(F.PeerClosed, match="8 of 20"):
        rx.read_into(h, np.zeros(5, np.float32))
    b.close()


def _auth_pair(server_secret, client_secret):
    a, b = socket.socketpair()
    a.settimeout(5)
    b.settimeout(5)
    errors = {}

    def serve():
        try:
            server_auth(Connection(a, "client", F.MAX_CONTROL), server_secret, "client")
        except Exception as exc:  # noqa: BLE001
            errors["server"] = exc

    t = threading.Thread(target=serve)
    t.start()
    try:
        client_auth(Connection(b, "server", F.MAX_CONTROL), client_secret, "server")
    except Exception as exc:  # noqa: BLE001
        errors["client"] = exc
    t.join()
    a.close()
    b.close()
    return errors


def test_hmac_challenge_response():
    assert _auth_pair(SECRET, SECRET) == {}
    errors = _auth_pair(SECRET, b"guess")
    assert "wrong secret" in str(errors["server"])
    assert isinstance(errors["client"], DistError) and "refused" in str(errors["client"])


def make_mesh(world, secret=SECRET, configs=None, logs=None, **kwargs):
    """``world`` SocketTransports on loopback, formed in threads; -> list (or raises the first error)."""
    logs = logs if logs is not None else [[] for _ in range(world)]
    configs = configs or [{"net": "n1"}] * world
    t0 = SocketTransport(0, world, "127.0.0.1:0", secret, configs[0], 1 << 20, log=logs[0].append, **kwargs)
    rdv = f"127.0.0.1:{t0.address[1]}"
    ts, errors = [t0], {}
    for r in range(1, world):
        ts.append(SocketTransport(r, world, rdv, secret, configs[r], 1 << 20, log=logs[r].append, **kwargs))

    def form(r):
        try:
            ts[r].form()
        except Exception as exc:  # noqa: BLE001
            errors[r] = exc

    threads = [threading.Thread(target=form, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        for t in ts:
            t.shutdown()
        raise errors[min(errors)]
    return ts


class Collect:
    """A handler that receives one float64 vector per peer."""

    def __init__(self, world, n):
        self.buf = {r: np.zeros(n) for r in range(world)}
        self.got, self.failures = {}, []
        self.cv = threading.Condition()

    def destination(self, src, h):
        return self.buf[src] if h.kind == F.GRAD else None

    def arrived(self, src, h, array):
        with self.cv:
            self.got[src] = array.copy()
            self.cv.notify_all()

    def control(self, src, h, payload):
        pass

    def failed(self, message):
        self.failures.append(message)

    def wait(self, n, timeout=10):
        with self.cv:
            self.cv.wait_for(lambda: len(self.got) >= n, timeout)


def test_known_answer_exchange_over_a_three_node_mesh():
    world = 3
    ts = make_mesh(world)
    handlers = [Collect(world, 4) for _ in range(world)]
    for t, h in zip(ts, handlers):
        t.start(h)
    for r, t in enumerate(ts):
        for q in range(world):
            if q != r:
                t.send(q, F.GRAD, 0, 0, np.full(4, r + 1.0))
    for r, h in enumerate(handlers):
        h.wait(world - 1)
        total = (r + 1.0) + sum(v[0] for v in h.got.values())
        assert total == sum(range(1, world + 1))  # node r holds every other node's r+1
    byes = [None] * world
    threads = [threading.Thread(target=lambda r=r: byes.__setitem__(r, ts[r].close({"rank": r}))) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert byes[0] == {1: {"rank": 1}, 2: {"rank": 2}}
    assert all(not h.failures for h in handlers)
    assert ts[1].stats.sent[("GRAD", 0)] == 2 * (48 + 4 * 8)  # two frames: header + 4 float64
    assert ts[1].stats.received[("GRAD", 0)] == 2 * (48 + 4 * 8)


def test_mismatched_config_is_refused_on_both_sides():
    with pytest.raises(DistError, match="differs") as info:
        make_mesh(2, configs=[{"net": "aaa"}, {"net": "bbb"}])
    assert "same net" in str(info.value)


def test_wrong_world_size_and_port_in_use():
    t0 = SocketTransport(0, 2, "127.0.0.1:0", SECRET, {}, 1 << 20, log=lambda m: None)
    try:
        with pytest.raises(DistError, match="already in use"):
            SocketTransport(0, 2, f"127.0.0.1:{t0.address[1]}", SECRET, {}, 1 << 20, log=lambda m: None)
    finally:
        t0.shutdown()


def test_unreachable_rendezvous_is_one_clear_error():
    s = listen("127.0.0.1", 0)
    port = s.getsockname()[1]
    s.close()  # nobody listens there now
    t1 = SocketTransport(1, 2, f"127.0.0.1:{port}", SECRET, {}, 1 << 20, log=lambda m: None, connect_timeout=0.5)
    with pytest.raises(DistError, match="cannot reach the rendezvous"):
        t1.form()


def test_listener_refuses_strangers_while_the_mesh_runs():
    logs = [[], []]
    ts = make_mesh(2, logs=logs, handshake_timeout=0.5)
    handlers = [Collect(2, 3) for _ in range(2)]
    for t, h in zip(ts, handlers):
        t.start(h)
    host, port = ts[1].address
    # a port scan: connect, close
    socket.create_connection((host, port)).close()
    # a silent client
    silent = socket.create_connection((host, port))
    # a wrong secret
    bad = socket.create_connection((host, port))
    bad.settimeout(5)
    with pytest.raises(DistError, match="refused"):
        client_auth(Connection(bad, "node 1", F.MAX_CONTROL), b"not the secret", "node 1")
    # garbage instead of AUTH
    junk = socket.create_connection((host, port))
    junk.sendall(b"GET / HTTP/1.1\r\n" * 4)
    deadline = time.monotonic() + 5
    while len(ts[1].refusals) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    reasons = " | ".join(r for _, r in ts[1].refusals)
    assert "wrong secret" in reasons and "sent nothing" in reasons and "bad magic" in reasons
    assert "closed during the handshake" in reasons
    assert any("refused a connection" in line for line in logs[1])
    for s in (silent, bad, junk):
        s.close()
    # the mesh still works
    ts[0].send(1, F.GRAD, 0, 0, np.array([1.0, 2.0, 3.0]))
    handlers[1].wait(1)
    np.testing.assert_array_equal(handlers[1].got[0], [1, 2, 3])
    assert not handlers[0].failures and not handlers[1].failures
    for t in ts:
        t.shutdown()


def test_rates_and_the_token_bucket():
    assert parse_rate("1gbit") == 1e9 / 8
    assert parse_rate("10Gbit") == 10e9 / 8
    assert parse_rate("100mbit") == 100e6 / 8
    assert parse_delay("0.1ms") == pytest.approx(1e-4)
    with pytest.raises(DistError, match="cannot read the rate"):
        parse_rate("fast")
    bucket = TokenBucket(10e6, burst=10e3)  # 10 MB/s
    t0 = time.perf_counter()
    for _ in range(20):
        bucket.take(100_000)  # 2 MB
    elapsed = time.perf_counter() - t0
    assert 0.15 < elapsed < 0.5, elapsed


def test_idle_heartbeats_flush_and_an_abort_that_overtakes_queued_tensors():
    """A sender that sent heartbeats while idle still sends; flush() waits until the queued frames
    are counted; an ABORT goes before the tensors already queued to the same peer."""
    ts = make_mesh(2, heartbeat=0.05)
    order = []

    class Record(Collect):
        def destination(self, src, h):
            order.append(h.kind)
            return np.zeros(1 << 16) if h.kind == F.GRAD else None

        def arrived(self, src, h, array):
            with self.cv:
                self.got.setdefault(src, 0)
                self.got[src] += 1
                self.cv.notify_all()

    handlers = [Record(2, 4), Record(2, 4)]
    for t, h in zip(ts, handlers):
        t.start(h)
    time.sleep(0.3)  # several heartbeats from both sides
    big = np.ones(1 << 16)
    for _ in range(40):
        ts[0].send(1, F.GRAD, 0, 0, big)
    ts[0].send(1, F.ABORT, 0, 0, payload=b"stop")
    assert ts[0].flush(10)
    assert ts[0].stats.sent[("GRAD", 0)] == 40 * (48 + big.nbytes)
    deadline = time.monotonic() + 10
    while order.count(F.GRAD) < 40 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert F.ABORT in order and order.index(F.ABORT) < 40, order[:5]  # it overtook most of the queue
    assert not handlers[0].failures and not handlers[1].failures
    for t in ts:
        t.shutdown()


class Slow(Collect):
    """Receives numbered float64 frames into fresh arrays, slowly (the sender's socket fills)."""

    def __init__(self, n, delay):
        super().__init__(2, n)
        self.n, self.delay, self.frames = n, delay, []

    def destination(self, src, h):
        time.sleep(self.delay)
        return np.empty(self.n) if h.kind == F.GRAD else None

    def arrived(self, src, h, array):
        with self.cv:
            self.frames.append((h.key, array))
            self.cv.notify_all()


@pytest.mark.parametrize("direct", [True, False])
def test_frames_from_several_threads_arrive_whole_and_in_order_per_thread(direct):
    """Frames leave from the calling thread while the peer's queue is empty (``send_now``), else
    through the sender thread; a frame the socket's buffer cut short is finished before any
    other. Two threads send 0.5 MiB frames to a slow receiver: each frame arrives whole, and each
    thread's frames in the order it sent them; the bytes are counted once."""
    n, count = 1 << 16, 12
    ts = make_mesh(2, direct=direct)
    handlers = [Collect(2, 1), Slow(n, 0.01)]
    for t, h in zip(ts, handlers):
        t.start(h)

    def send(first):
        for k in range(first, first + count):
            ts[0].send(1, F.GRAD, k, 0, np.full(n, float(k)))

    threads = [threading.Thread(target=send, args=(first,)) for first in (0, 100)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert ts[0].flush(30)
    got = handlers[1]
    with got.cv:
        got.cv.wait_for(lambda: len(got.frames) == 2 * count, 30)
    keys = [k for k, _ in got.frames]
    assert sorted(keys) == list(range(count)) + list(range(100, 100 + count)), keys
    assert [k for k in keys if k < 100] == list(range(count))  # each thread's frames in order
    assert [k for k in keys if k >= 100] == list(range(100, 100 + count))
    for k, a in got.frames:
        assert (a == k).all(), f"frame {k} arrived mixed with another: {np.unique(a)[:5]}"
    assert sum(v for (kind, _), v in ts[0].stats.sent.items() if kind == "GRAD") == 2 * count * (48 + 8 * n)
    assert not handlers[0].failures and not handlers[1].failures
    for t in ts:
        t.shutdown()


def test_a_silent_peer_is_lost_after_peer_timeout():
    """The receive timeout is the kernel's (SO_RCVTIMEO): a peer that sends nothing, not even a
    heartbeat, for ``peer_timeout`` seconds stops the run with that reason."""
    ts = make_mesh(2, heartbeat=30.0, peer_timeout=0.3)
    handlers = [Collect(2, 1), Collect(2, 1)]
    for t, h in zip(ts, handlers):
        t.start(h)
    deadline = time.monotonic() + 10
    while not handlers[0].failures and time.monotonic() < deadline:
        time.sleep(0.05)
    assert handlers[0].failures and "lost node 1: nothing heard from it for 0.3 s" in handlers[0].failures[0]
    for t in ts:
        t.shutdown()
