"""The socket transport: minicaffe's own TCP mesh on Python's ``socket`` module.

Forming the run (every connection first passes the HMAC challenge of ``transport.py``)::

    rank 0   listens on the rendezvous address; waits for world-1 JOINs
    rank r   listens on its own address (port 0 = any free port), then
             connects to the rendezvous, authenticates, sends JOIN {rank, world, config hash,
             the address it listens on}
    rank 0   checks every JOIN (world size, unique rank, same net+solver hash), answers each with
             TABLE {every node's address} (or REFUSE with the reason, and stops)
    rank r   connects to every rank q with 0 < q < r (JOIN again, checked the same way) and
             accepts the connections of the ranks above it

So every pair of nodes shares one TCP connection, and each connection has a sender thread (a
queue of frames, gather-written with ``sendmsg``; heartbeats when idle) and a receiver thread
(``recv_into`` straight into the tensor the handler names).  The listening socket stays open for
the whole run: anybody else who connects is challenged, refused and logged, and the run goes on.

A frame to a peer whose queue is empty leaves from the calling thread (``send_now``: one
non-blocking ``sendmsg``; what the socket's buffer does not take, the sender thread finishes
before anything else), so most frames cost no hand-off to the sender thread: no queue, no
wake-up, no second thread taking the GIL. Measured: see docs/DISTRIBUTED.md. With an emulated
link (``link``) every frame goes through the sender thread, which paces it.

A peer that disappears (its process killed: the kernel closes its sockets at once; its machine
gone: no heartbeat for ``peer_timeout`` seconds) or that breaks the protocol stops the run:
the handler's ``failed`` names the node.
"""

import collections
import errno
import json
import queue
import socket
import struct
import threading
import time

import numpy as np

from . import frames as F
from .transport import DistError, Stats, TokenBucket, Transport, as_payload, client_auth, server_auth

MAX_PENDING_HANDSHAKES = 32


class Connection:
    """One TCP socket speaking frames.  ``limit``: the largest payload accepted."""

    def __init__(self, sock, peer, limit, rank=0, link=None, stats=None):
        self.sock, self.peer, self.limit, self.rank = sock, peer, limit, rank
        self.link = link
        self.stats = stats
        self.hbuf = bytearray(F.HEADER_SIZE)
        self.hview = memoryview(self.hbuf)
        self.send_lock = threading.Lock()
        self.partial = None  # (views, kind, key, nbytes, t0): a frame send_now began

    def read_header(self):
        F.recv_exactly_into(self.sock, self.hview, self.peer)
        return F.parse_header(self.hbuf, self.limit, self.peer)

    def read_control(self, header):
        if header.nbytes > F.MAX_CONTROL:
            raise F.FrameError(f"control frame of {header.nbytes} bytes (limit {F.MAX_CONTROL})", self.peer)
        buf = bytearray(header.nbytes)
        F.recv_exactly_into(self.sock, memoryview(buf), self.peer)
        if self.stats is not None:
            self.stats.on_receive(header.kind, header.key, header.nbytes)
        return buf

    def read_into(self, header, array):
        view = F.as_bytes_view(array)
        t0 = time.perf_counter()
        F.recv_exactly_into(self.sock, view, self.peer)
        if self.stats is not None:
            self.stats.on_receive(header.kind, header.key, header.nbytes, t0)

    def _frame(self, kind, key, clock, array):
        a = as_payload(array)
        head = F.pack_header(kind, key, self.rank, a.dtype, a.shape if a.ndim else (a.size,), clock)
        return head, F.as_bytes_view(a)

    def send_now(self, kind, key=0, clock=0, array=None):
        """Send a frame from the calling thread as far as the socket takes it without blocking.
        -> None: all of it left; True: the socket's buffer filled, the rest waits in ``partial``
        for the sender thread (which finishes it before any other frame); False: the connection
        is busy, nothing was sent. Only for unlimited links (an emulated one paces every byte
        in its sender)."""
        if self.link is not None or not self.send_lock.acquire(blocking=False):
            return False
        try:
            if self.partial is not None:
                return False
            head, body = self._frame(kind, key, clock, array)
            t0 = time.perf_counter()
            views = [memoryview(head), body] if len(body) else [memoryview(head)]
            try:
                sent = self.sock.sendmsg(views, [], socket.MSG_DONTWAIT)
            except BlockingIOError:
                sent = 0
            rest = F.skip_sent(views, sent)
            if rest:
                self.partial = (rest, kind, key, len(body), t0)
                return True
            if self.stats is not None:
                self.stats.on_send(kind, key, len(body), t0)
            return None
        finally:
            self.send_lock.release()

    def _finish_partial(self):
        """(with ``send_lock``) The rest of a frame ``send_now`` began, before anything else."""
        if self.partial is not None:
            views, kind, key, nbytes, t0 = self.partial
            F.sendmsg_all(self.sock, views)
            self.partial = None
            if self.stats is not None:
                self.stats.on_send(kind, key, nbytes, t0)

    def finish_partial(self):
        with self.send_lock:
            self._finish_partial()

    def send(self, kind, key=0, clock=0, array=None):
        """One frame: header + the array's own bytes in one gather write (rate-limited if a link
        is emulated, then in 256 KiB pieces so the bucket paces it)."""
        head, body = self._frame(kind, key, clock, array)
        t0 = time.perf_counter()
        with self.send_lock:
            self._finish_partial()
            if self.link is None:
                F.sendmsg_all(self.sock, [head, body])
            else:
                if self.link.delay:
                    time.sleep(self.link.delay)
                self.link.take(len(head))
                F.sendmsg_all(self.sock, [head])
                step = 256 * 1024
                for off in range(0, len(body), step):
                    piece = body[off : off + step]
                    self.link.take(len(piece))
                    F.sendmsg_all(self.sock, [piece])
        if self.stats is not None:
            self.stats.on_send(kind, key, len(body), t0)

    def send_control(self, kind, payload, key=0, clock=0):
        self.send(kind, key, clock, np.frombuffer(bytes(payload), np.uint8))

    def refuse(self, reason):
        try:
            self.send_control(F.REFUSE, reason.encode()[:1024])
        except OSError:
            pass

    def close(self):
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


_WAKE = ("wake",)  # a queue entry that only wakes a sender for its urgent frames


def parse_address(text, what="address"):
    host, sep, port = str(text).rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise DistError(f"{what} '{text}' must be HOST:PORT (for example 127.0.0.1:29500)")
    return host.strip("[]"), int(port)


def listen(host, port, what="listen"):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((host, port))
    except OSError as exc:
        s.close()
        if exc.errno == errno.EADDRINUSE:
            raise DistError(
                f"cannot {what} on {host}:{port}: the port is already in use (another run? choose another port)"
            ) from None
        raise DistError(f"cannot {what} on {host}:{port}: {exc.strerror}") from None
    s.listen(64)
    return s


def _tune(sock):
    """Nagle off (small control frames leave at once); the buffer sizes are left to the kernel's
    autotuning, which a fixed SO_SNDBUF/SO_RCVBUF would switch off."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _kernel_timeouts(sock, seconds):
    """A blocking socket whose sends and receives fail after ``seconds`` without progress
    (SO_SNDTIMEO/SO_RCVTIMEO: BlockingIOError). Python's own ``settimeout`` makes every call a
    poll() and then the call: two system calls per receive, on every frame of a run."""
    sock.settimeout(None)
    whole = int(seconds)
    tv = struct.pack("ll", whole, int((seconds - whole) * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)


class SocketTransport(Transport):
    """A full TCP mesh between ``world`` nodes (see the module docstring).

    ``config``: a JSON-able dict every node must agree on (the net and solver hashes); ``limit``:
    the largest tensor payload any frame may carry; ``link``: (rate bytes/s, delay s) to emulate
    a link in the sender, or None; ``log``: where refusals and start-up lines go; ``direct``:
    send from the calling thread where the peer's queue is empty (False: every frame through
    the sender thread).
    """

    def __init__(
        self,
        rank,
        world,
        rendezvous,
        secret,
        config,
        limit,
        listen_address=None,
        link=None,
        log=print,
        connect_timeout=60.0,
        handshake_timeout=10.0,
        heartbeat=1.0,
        peer_timeout=10.0,
        direct=True,
    ):
        if not 0 <= rank < world:
            raise DistError(f"rank {rank} is not in 0..{world - 1} (world size {world})")
        self.rank, self.world = rank, world
        self.secret, self.config, self.limit = secret, config, max(int(limit), F.MAX_CONTROL)
        self.link_spec, self.log = link, log
        self.connect_timeout, self.handshake_timeout = connect_timeout, handshake_timeout
        self.heartbeat, self.peer_timeout = heartbeat, peer_timeout
        self.direct = direct
        self.stats = Stats()
        self.refusals = []  # (address, reason): what the listener turned away
        self.conns = {}
        self.handler = None
        self.closing = False
        self.byes = {}
        self._cv = threading.Condition()
        self._joined = queue.Queue()
        self._pending = threading.Semaphore(MAX_PENDING_HANDSHAKES)
        self._threads = []
        self.rdv_host, self.rdv_port = parse_address(rendezvous, "rendezvous address")
        if rank == 0:
            self.lsock = listen(self.rdv_host, self.rdv_port, "listen on the rendezvous address")
        else:
            # any interface by default: the address the others use is the one this node reaches
            # node 0 from (see _join); loopback runs stay on loopback
            default = "127.0.0.1" if self.rdv_host.startswith("127.") or self.rdv_host == "localhost" else "0.0.0.0"
            host, port = listen_address if listen_address else (default, 0)
            self.lsock = listen(host, port)
        self.address = self.lsock.getsockname()[:2]
        log(f"node {rank}/{world}: listening on {self.address[0]}:{self.address[1]}")
        self._spawn(self._accept_loop, "minicaffe-dist-accept")

    def form(self):
        """Meet the other nodes (see the module docstring); returns self once every pair is connected."""
        try:
            self._form()
        except BaseException:
            self.shutdown()
            raise
        return self

    # -- forming the mesh ------------------------------------------------------------------------
    def _spawn(self, fn, name, *args):
        t = threading.Thread(target=fn, args=args, name=name, daemon=True)
        t.start()
        self._threads.append(t)
        return t

    def _link(self):
        if not self.link_spec:
            return None
        rate, delay = self.link_spec
        return TokenBucket(rate, delay=delay)

    def _accept_loop(self):
        while True:
            try:
                sock, addr = self.lsock.accept()
            except OSError:
                return  # closed
            peer = f"{addr[0]}:{addr[1]}"
            if not self._pending.acquire(blocking=False):
                self._refused(peer, "too many connections in handshake at once")
                sock.close()
                continue
            threading.Thread(target=self._handshake, args=(sock, peer), daemon=True).start()

    def _refused(self, peer, reason):
        self.refusals.append((peer, reason))
        self.log(f"node {self.rank}: refused a connection from {peer}: {reason}")

    def _handshake(self, sock, peer):
        conn = Connection(sock, peer, F.MAX_CONTROL, self.rank)
        try:
            sock.settimeout(self.handshake_timeout)
            server_auth(conn, self.secret, peer)
            h = conn.read_header()
            if h.kind != F.JOIN:
                raise F.FrameError(f"expected JOIN after authentication, got {h!r}", peer)
            join = F.decode_json(conn.read_control(h), peer)
            if not isinstance(join, dict) or not isinstance(join.get("rank"), int):
                raise F.FrameError("JOIN without a rank", peer)
            with self._cv:
                formed = len(self.conns) == self.world - 1
            if formed or self.closing:
                conn.refuse("this run is already formed")
                raise F.FrameError("a node joined a run that is already formed", peer)
            self._joined.put((join, conn))
        except TimeoutError:
            self._refused(peer, f"sent nothing for {self.handshake_timeout:g} s")
            conn.close()
        except F.PeerClosed as exc:
            self._refused(peer, f"closed during the handshake ({exc.reason})")
            conn.close()
        except (F.FrameError, OSError) as exc:
            self._refused(peer, getattr(exc, "reason", None) or str(exc))
            conn.close()
        except Exception as exc:  # noqa: BLE001  (whatever a stranger sends, the listener goes on)
            self._refused(peer, f"{type(exc).__name__}: {exc}")
            conn.close()
        finally:
            self._pending.release()

    def _connect(self, host, port, what):
        deadline = time.monotonic() + self.connect_timeout
        delay = 0.05
        while True:
            try:
                sock = socket.create_connection((host, port), timeout=min(5.0, self.connect_timeout))
                return sock
            except OSError as exc:
                if time.monotonic() + delay > deadline:
                    raise DistError(
                        f"node {self.rank}: cannot reach {what} at {host}:{port} after "
                        f"{self.connect_timeout:g} s ({exc.strerror or exc}); is node 0 running, and is the "
                        f"address right?"
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    def _join(self, host, port, what):
        peer = f"{what} {host}:{port}"
        sock = self._connect(host, port, what)
        conn = Connection(sock, peer, F.MAX_CONTROL, self.rank)
        try:
            sock.settimeout(max(self.handshake_timeout, 30.0))
            client_auth(conn, self.secret, peer)
            host = self.address[0]
            if host in ("0.0.0.0", ""):  # advertise the interface that reaches the others
                host = sock.getsockname()[0]
            me = {"rank": self.rank, "world": self.world, "config": self.config, "address": [host, self.address[1]]}
            conn.send_control(F.JOIN, json.dumps(me).encode())
        except (F.FrameError, OSError) as exc:
            conn.close()
            raise DistError(f"node {self.rank}: handshake with {peer} failed: {exc}") from None
        except DistError:
            conn.close()
            raise
        return conn

    def _check_join(self, join):
        """'' if this JOIN fits the run, else why not."""
        r = join.get("rank")
        if join.get("world") != self.world:
            return f"node {r} was started with world size {join.get('world')}, node {self.rank} with {self.world}"
        if not isinstance(r, int) or not 0 <= r < self.world or r == self.rank:
            return f"rank {r} is not a valid peer rank for node {self.rank} (world {self.world})"
        if r in self.conns:
            return f"two nodes claim rank {r}"
        theirs = join.get("config") or {}
        for key, mine in self.config.items():
            if theirs.get(key) != mine:
                return (
                    f"node {r}'s {key} differs from node {self.rank}'s ({theirs.get(key)} vs {mine}): "
                    f"every node must train the same net with the same solver and communication settings"
                )
        return ""

    def _take_joins(self, n, deadline_what):
        """Accept ``n`` authenticated JOINs; -> {rank: (join, conn)}."""
        got = {}
        deadline = time.monotonic() + self.connect_timeout
        while len(got) < n:
            left = deadline - time.monotonic()
            try:
                join, conn = self._joined.get(timeout=max(left, 0.01))
            except queue.Empty:
                raise DistError(
                    f"node {self.rank}: only {len(got)} of {n} {deadline_what} joined within {self.connect_timeout:g} s"
                ) from None
            why = self._check_join(join) or ("" if join["rank"] not in got else f"two nodes claim rank {join['rank']}")
            if why:
                conn.refuse(why)
                conn.close()
                for _, c in got.values():
                    c.refuse(why)
                    c.close()
                raise DistError(f"node {self.rank}: {why}")
            got[join["rank"]] = (join, conn)
        return got

    def _form(self):
        if self.world == 1:
            return
        if self.rank == 0:
            got = self._take_joins(self.world - 1, "nodes")
            table = {str(r): j["address"] for r, (j, _) in got.items()}
            table["0"] = list(self.address)
            for r, (_, conn) in got.items():
                conn.send_control(F.TABLE, json.dumps({"addresses": table}).encode())
                self._adopt(r, conn)
        else:
            conn = self._join(self.rdv_host, self.rdv_port, "the rendezvous (node 0)")
            h = conn.read_header()
            if h.kind == F.REFUSE:
                reason = bytes(conn.read_control(h)).decode(errors="replace")
                conn.close()
                raise DistError(f"node 0 refused node {self.rank}: {reason}")
            if h.kind != F.TABLE:
                raise DistError(f"node {self.rank}: node 0 answered with {h!r}, not the address table")
            table = F.decode_json(conn.read_control(h), "node 0")["addresses"]
            self._adopt(0, conn)
            for q in range(1, self.rank):
                host, port = table[str(q)]
                c = self._join(host, port, f"node {q}")
                self._adopt(q, c)
            got = self._take_joins(self.world - 1 - self.rank, "higher-ranked nodes")
            for r, (_, c) in got.items():
                self._adopt(r, c)

    def _adopt(self, r, conn):
        conn.peer = f"node {r}"
        conn.limit = self.limit
        conn.link = self._link()
        conn.stats = self.stats
        conn.sock.settimeout(None)
        _tune(conn.sock)
        with self._cv:
            self.conns[r] = conn

    # -- running -----------------------------------------------------------------------------
    def start(self, handler):
        self.handler = handler
        self.queues = {r: queue.Queue() for r in self.conns}
        self.urgent = {r: collections.deque() for r in self.conns}  # ABORT overtakes queued tensors
        self.gates = {r: threading.Lock() for r in self.conns}  # "queue empty?" and what follows, at once
        self.senders = []
        for r, conn in self.conns.items():
            _kernel_timeouts(conn.sock, self.peer_timeout)
            self.senders.append(self._spawn(self._send_loop, f"minicaffe-dist-send-{r}", r, conn))
            self._spawn(self._recv_loop, f"minicaffe-dist-recv-{r}", r, conn)

    def send(self, dst, kind, key, clock, array=None, payload=None):
        item = (kind, key, clock, array if array is not None else as_payload(payload))
        if kind == F.ABORT:
            # the reason a run stops must not wait behind the gradients already queued (with WFBP a
            # whole backward's worth): it goes next, and an empty marker wakes the sender
            self.urgent[dst].append(item)
            self.queues[dst].put(_WAKE)
            return
        q = self.queues[dst]
        with self.gates[dst]:
            if self.direct and not q.unfinished_tasks:  # nothing queued: send from this thread
                try:
                    began = self.conns[dst].send_now(*item)
                except OSError as exc:
                    self._fail(f"lost node {dst}: sending failed ({exc.strerror or exc})")
                    return
                if began is not False:
                    if began:  # the socket's buffer is full: the sender thread sends the rest
                        q.put(_WAKE)
                    return
            q.put(item)

    def _fail(self, message):
        if not self.closing and self.handler is not None:
            self.handler.failed(message)

    def _send_loop(self, r, conn):
        q = self.queues[r]
        while True:
            queued = True
            try:
                item = q.get(timeout=self.heartbeat)
            except queue.Empty:
                item, queued = (F.HEARTBEAT, 0, 0, None), False
            if item is None:
                q.task_done()
                return
            try:
                conn.finish_partial()  # (a frame begun by send_now goes on first)
                while self.urgent[r]:
                    conn.send(*self.urgent[r].popleft())
                if item is not _WAKE:
                    conn.send(*item)
            except BlockingIOError:  # (SO_SNDTIMEO ran out)
                self._fail(f"lost node {r}: sending failed (blocked for {self.peer_timeout:g} s)")
                return
            except OSError as exc:
                self._fail(f"lost node {r}: sending failed ({exc.strerror or exc})")
                return
            finally:
                if queued:
                    q.task_done()  # sent and counted (or failed): flush() waits for this

    def flush(self, timeout=30.0):
        deadline = time.monotonic() + timeout
        for q in getattr(self, "queues", {}).values():
            while q.unfinished_tasks and time.monotonic() < deadline:
                time.sleep(0.001)
        return all(not q.unfinished_tasks for q in getattr(self, "queues", {}).values())

    def _recv_loop(self, r, conn):
        handler = self.handler
        while True:
            try:
                h = conn.read_header()
                if h.sender != r:
                    raise F.FrameError(f"frame claims to come from node {h.sender}", conn.peer)
                if h.kind == F.HEARTBEAT:
                    continue
                if h.kind == F.BYE:
                    payload = conn.read_control(h)
                    with self._cv:
                        self.byes[r] = F.decode_json(payload, conn.peer)
                        self._cv.notify_all()
                    return
                dest = handler.destination(r, h)
                if dest is None:
                    handler.control(r, h, conn.read_control(h))
                else:
                    F.check_expected(h, h.kind, dest.dtype, dest.shape, conn.peer)
                    conn.read_into(h, dest)
                    handler.arrived(r, h, dest)
            except (TimeoutError, BlockingIOError):  # (SO_RCVTIMEO ran out)
                self._fail(f"lost node {r}: nothing heard from it for {self.peer_timeout:g} s")
                return
            except F.PeerClosed as exc:
                self._fail(f"lost node {r}: {exc.reason}")
                return
            except F.FrameError as exc:
                self._fail(f"node {r} broke the protocol: {exc.reason}")
                return
            except OSError as exc:
                self._fail(f"lost node {r}: {exc.strerror or exc}")
                return

    def close(self, stats=None, timeout=30.0):
        """Send BYE (with ``stats``) to every peer, wait for theirs; -> {rank: their stats}."""
        if self.handler is None:  # never started
            self.shutdown()
            return {}
        payload = np.frombuffer(json.dumps(stats or {}).encode(), np.uint8)
        for r in self.conns:
            self.queues[r].put((F.BYE, 0, 0, payload))
            self.queues[r].put(None)
        deadline = time.monotonic() + timeout
        for t in self.senders:  # every frame queued (the BYE last) has left
            t.join(max(deadline - time.monotonic(), 0.01))
        with self._cv:
            while len(self.byes) < len(self.conns) and time.monotonic() < deadline:
                self._cv.wait(0.1)
            self.closing = True
        self.shutdown()
        return dict(self.byes)

    def shutdown(self, flush=1.0):
        """Stop (after a failure): give the frames already queued (an ABORT saying why) up to
        ``flush`` seconds to leave, then close every socket."""
        if flush and getattr(self, "senders", None):
            for q in self.queues.values():
                q.put(None)
            deadline = time.monotonic() + flush
            for t in self.senders:
                t.join(max(deadline - time.monotonic(), 0.0))
        self.closing = True
        try:
            self.lsock.close()
        except OSError:
            pass
        for conn in self.conns.values():
            conn.close()
