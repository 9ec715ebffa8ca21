"""The MPI transport: the same frames, carried by MPI (mpi4py) instead of minicaffe's sockets.

    mpiexec -n 4 python -m minicaffe.train lenet --dist mpi

The parameter server does not know which transport runs it: this class has the same four
methods as ``sockets.SocketTransport`` (see transport.py).  MPI brings what the socket transport
builds by hand: the ranks, the connections, the launch (``mpiexec`` or a cluster scheduler), and
the trust (whoever can start ranks in the job is a member; no secret is exchanged).

One communication thread per node does everything, so MPI is never entered from two threads at
once and nothing spins on a blocking call (MPICH busy-waits inside blocking receives, which would
steal the cores the workers compute on)::

    loop:   start the queued sends:   Isend(header, dst, tag 1); Isend(payload, dst, tag 2)
            Iprobe(any source, tag 1) -> Recv the 48-byte header, check it (frames.parse_header),
            ask the handler where the payload goes, Irecv(payload straight into it, src, tag 2)
            complete finished requests (handler.arrived / control)
            nothing to do: sleep 0.2 ms

MPI keeps the messages of one sender on one tag in order, so the k-th payload of a rank matches
its k-th header.  At start-up every rank's configuration hashes are all-gathered (as fixed-size
byte arrays, not pickled objects) and compared, so different nets or solvers stop with one
message on every rank.  A rank that dies usually makes ``mpiexec`` end the whole job.
"""

import hashlib
import json
import threading
import time
from collections import deque

import numpy as np

from . import frames as F
from .transport import DistError, Stats, Transport, as_payload

TAG_HEADER, TAG_PAYLOAD = 1, 2


def _mpi():
    try:
        from mpi4py import MPI
    except ImportError:
        raise DistError(
            "--dist mpi needs mpi4py and an MPI library: pip install 'minicaffe[mpi]' (mpi4py + the mpich wheel)"
        ) from None
    return MPI


def mpi_rank():
    return _mpi().COMM_WORLD.Get_rank()


class MPITransport(Transport):
    def __init__(self, config, limit, log=print, link=None, comm=None):
        MPI = _mpi()
        if link:
            raise DistError("--link emulates a link inside the socket transport; with --dist mpi shape the network")
        self.MPI = MPI
        self.comm = comm or MPI.COMM_WORLD
        self.rank, self.world = self.comm.Get_rank(), self.comm.Get_size()
        self.limit = max(int(limit), F.MAX_CONTROL)
        self.log, self.stats = log, Stats()
        self.handler = None
        self.outbox = deque()
        self.lock = threading.Lock()
        self.byes = {}
        self.closing = False
        self.error = None
        self._stop = False
        self.in_flight = 0  # frames handed to send() and not yet completed and counted
        log(f"node {self.rank}/{self.world}: MPI ({MPI.Get_library_version().splitlines()[0].strip()})")
        self._check_config(config)

    def _check_config(self, config):
        keys = sorted(config)
        mine = np.frombuffer(b"".join(hashlib.sha256(json.dumps(config[k]).encode()).digest() for k in keys), np.uint8)
        every = np.empty((self.world, mine.size), np.uint8)
        self.comm.Allgather(mine, every)
        for r in range(self.world):
            for j, k in enumerate(keys):
                if not np.array_equal(every[r, 32 * j : 32 * j + 32], every[0, 32 * j : 32 * j + 32]):
                    raise DistError(
                        f"node {r}'s {k} differs from node 0's: every node must train the same net with the same solver"
                    )

    # -- the communication thread ------------------------------------------------------------
    def start(self, handler):
        self.handler = handler
        self.thread = threading.Thread(target=self._loop, name="minicaffe-dist-mpi", daemon=True)
        self.thread.start()

    def send(self, dst, kind, key, clock, array=None, payload=None):
        a = array if array is not None else as_payload(payload)
        with self.lock:
            self.outbox.append((dst, kind, key, clock, a))
            self.in_flight += 1

    def flush(self, timeout=30.0):
        deadline = time.monotonic() + timeout
        while self.in_flight and self.error is None and time.monotonic() < deadline:
            time.sleep(0.001)
        return not self.in_flight

    def _loop(self):
        MPI, comm = self.MPI, self.comm
        sending = []  # (requests, kind, key, n)
        receiving = []  # (request, src, header, dest or bytearray)
        status = MPI.Status()
        hbuf = bytearray(F.HEADER_SIZE)
        try:
            while True:
                busy = False
                with self.lock:
                    items = list(self.outbox)
                    self.outbox.clear()
                for dst, kind, key, clock, a in items:
                    head = np.frombuffer(
                        F.pack_header(kind, key, self.rank, a.dtype, a.shape if a.ndim else (a.size,), clock), np.uint8
                    )
                    reqs = [comm.Isend(head, dst, TAG_HEADER)]
                    if a.nbytes:
                        reqs.append(comm.Isend(F.as_bytes_view(a), dst, TAG_PAYLOAD))
                    sending.append((reqs, kind, key, a.nbytes, head, a))
                    busy = True
                still = []
                for item in sending:
                    if MPI.Request.Testall(item[0]):
                        self.stats.on_send(item[1], item[2], item[3])
                        with self.lock:
                            self.in_flight -= 1
                    else:
                        still.append(item)
                sending = still
                while comm.Iprobe(MPI.ANY_SOURCE, TAG_HEADER, status):
                    src = status.Get_source()
                    comm.Recv(hbuf, src, TAG_HEADER)
                    h = F.parse_header(hbuf, self.limit, f"node {src}")
                    busy = True
                    if h.kind == F.BYE:
                        body = bytearray(h.nbytes)
                        comm.Recv(body, src, TAG_PAYLOAD)
                        self.byes[src] = F.decode_json(body, f"node {src}")
                        continue
                    if h.kind == F.HEARTBEAT:
                        continue
                    dest = self.handler.destination(src, h)
                    if dest is None:
                        if h.nbytes > F.MAX_CONTROL:
                            raise F.FrameError(f"control frame of {h.nbytes} bytes", f"node {src}")
                        dest_buf = bytearray(h.nbytes)
                    else:
                        F.check_expected(h, h.kind, dest.dtype, dest.shape, f"node {src}")
                        dest_buf = dest
                    req = comm.Irecv(F.as_bytes_view(dest_buf), src, TAG_PAYLOAD) if h.nbytes else None
                    receiving.append((req, src, h, dest, dest_buf))
                keep = []
                for item in receiving:
                    req, src, h, dest, buf = item
                    if req is None or req.Test():
                        self.stats.on_receive(h.kind, h.key, h.nbytes)
                        if dest is None:
                            self.handler.control(src, h, buf)
                        else:
                            self.handler.arrived(src, h, dest)
                    else:
                        keep.append(item)
                receiving = keep
                if self._stop and not sending and not self.outbox:
                    return
                if not busy:
                    time.sleep(0.0002)
        except Exception as exc:  # noqa: BLE001  (stops the run with the reason)
            self.error = str(exc)
            if not self.closing and self.handler is not None:
                self.handler.failed(f"MPI transport: {exc}")

    def close(self, stats=None, timeout=60.0):
        payload = np.frombuffer(json.dumps(stats or {}).encode(), np.uint8)
        for r in range(self.world):
            if r != self.rank:
                self.send(r, F.BYE, 0, 0, payload)
        deadline = time.monotonic() + timeout
        while len(self.byes) < self.world - 1 and time.monotonic() < deadline and self.error is None:
            time.sleep(0.01)
        self.closing = True
        self._stop = True
        self.thread.join(10)
        self.comm.Barrier()
        return dict(self.byes)

    def shutdown(self):
        """Stop the communication thread after a failure (mpiexec ends the other ranks when
        this one exits with an error)."""
        self.closing = True
        self._stop = True
