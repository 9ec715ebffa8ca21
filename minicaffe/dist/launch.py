"""Starting a distributed run: the command-line flags, the local launcher, and the glue that
turns one ``python -m minicaffe.train`` process into a node.

One machine (the launcher starts N node processes on loopback with a fresh secret)::

    python -m minicaffe.train lenet --nodes 4

Several machines (every node started by hand, or by a scheduler, with the same flags but its rank)::

    export MINICAFFE_DIST_SECRET=<the same secret everywhere>
    machine A:  python -m minicaffe.train lenet --rank 0 --world-size 2 --rendezvous 10.0.0.1:29500
    machine B:  python -m minicaffe.train lenet --rank 1 --world-size 2 --rendezvous 10.0.0.1:29500

or through MPI: ``mpiexec -n 4 python -m minicaffe.train lenet --dist mpi``.  The same values may
come from the environment: MINICAFFE_RANK, MINICAFFE_WORLD_SIZE, MINICAFFE_RENDEZVOUS.

Node 0 is the run's face: it writes the log, the snapshots, train_log.json and the plots, and
``--resume`` is read there (it sends the state to the others).  The other nodes train without
testing or snapshotting; under the local launcher their output goes to ``<output>/node<r>.log``.
"""

import gc
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from .. import proto
from .transport import DistError, load_secret, new_secret, parse_delay, parse_rate

LAUNCHED_ENV = "MINICAFFE_DIST_LAUNCHED"


def add_arguments(parser):
    g = parser  # (not an argument group: the tool rebuilds resume commands from the parser's options)
    g.add_argument("--nodes", type=int, default=1, help="start N node processes on this machine (loopback)")
    g.add_argument("--rank", type=int, help="this node's rank (0 = the node that writes logs and snapshots)")
    g.add_argument("--world-size", type=int, help="the number of nodes")
    g.add_argument("--rendezvous", help="HOST:PORT where node 0 listens and the others meet it")
    g.add_argument("--listen", help="HOST:PORT this node listens on (default: a free port)")
    g.add_argument("--secret-file", help="file holding the shared secret (else $MINICAFFE_DIST_SECRET)")
    g.add_argument("--dist", choices=("sockets", "mpi"), default="sockets", help="the transport (default sockets)")
    g.add_argument("--link", help="emulate a link of this rate in the transport (e.g. 1gbit)")
    g.add_argument("--link-delay", default="0", help="with --link: one-way latency per frame (e.g. 0.1ms)")
    g.add_argument("--peer-timeout", type=float, default=10.0, help="seconds of silence before a node is lost")
    g.add_argument(
        "--connect-timeout", type=float, default=60.0, help="seconds to wait for the other nodes at start-up"
    )
    # Poseidon's two ideas (minicaffe/dist/poseidon.py, docs/POSEIDON.md)
    g.add_argument(
        "--comm",
        choices=("ps", "sfb", "hybrid"),
        default="hybrid",
        help="per layer: parameter server, sufficient factors, or hybrid (default): Poseidon's cost rule "
        "picks SFB or PS per fully connected layer, keeping SFB only where this run's costs say it pays "
        "(the plan and its reasons are printed at start-up)",
    )
    g.add_argument(
        "--wfbp",
        choices=("on", "off", "auto"),
        default="auto",
        help="wait-free backprop: sync each layer as soon as its backward is done (default auto: off where "
        "this machine's nodes outnumber its cores, where nothing is left to overlap; else on where the sync "
        "time it can hide outweighs the CPU its syncs cost; the choice and its reason are printed at start-up)",
    )
    g.add_argument(
        "--bucket-kb",
        type=float,
        default=None,
        help="gradient buckets: the parameter server syncs consecutive layers together, in buckets of at "
        "least this many KiB (as PyTorch DDP's bucket_cap_mb; default 1024; 0: every blob on its own)",
    )


def bucket_bytes(args):
    """``--bucket-kb`` in bytes (the default: ps.DEFAULT_BUCKET_BYTES)."""
    from .ps import DEFAULT_BUCKET_BYTES

    kb = getattr(args, "bucket_kb", None)
    if kb is None:
        return DEFAULT_BUCKET_BYTES
    if kb < 0:
        raise DistError(f"--bucket-kb must be >= 0 (0: one bucket per blob), got {kb:g}")
    return int(kb * 1024)


def planning_link_rate(args):
    """The link rate (bytes/s each way) the hybrid rule and ``--wfbp auto`` plan with: ``--link``
    where the transport emulates one, else MINICAFFE_LINK_RATE (the emulated cluster sets it to
    its tc rate; set it on a real cluster), else None (cost.DEFAULT_LINK_RATE, 10 Gbit/s, assumed)."""
    text = getattr(args, "link", None) or os.environ.get("MINICAFFE_LINK_RATE")
    return parse_rate(text) if text else None


def planning_link(args):
    """The link the plan assumes, in words (for the settings every node must agree on)."""
    from .cost import DEFAULT_LINK_RATE

    rate = planning_link_rate(args)
    return f"a link of {(rate or DEFAULT_LINK_RATE) * 8 / 1e9:g} Gbit/s{'' if rate else ' (assumed)'}"


def wfbp_setting(args, world=2, costs=None, link_rate=None):
    """-> (on?, why): ``--wfbp on|off`` as given; ``auto`` (the default) is ``cost.wfbp_auto``
    on the run's plan ``costs``: off with one node, or where the node processes on this machine
    (x their worker threads) outnumber its cores (nothing is left to overlap: measured with
    gradient buckets, 4 nodes on 2 cores: LeNet at 10 Gbit/s 13% slower with WFBP, the FC head
    19% slower; docs/POSEIDON.md), and else on where the sync time it can hide is more than the
    CPU its syncs cost (off on fast links where the syncs are CPU-bound). Without ``costs``:
    on wherever there is a core per compute thread."""
    from . import cost

    value = getattr(args, "wfbp", None) or "auto"
    if value != "auto":
        return value == "on", f"--wfbp {value}"
    from ..parallel import blas

    busy, cores = local_nodes() * max(1, getattr(args, "workers", 1) or 1), blas.cores()
    if costs is None:
        if world < 2:
            return False, "auto: one node"
        if busy > cores:
            return False, f"auto: {busy} busy threads on {cores} cores leave nothing to overlap"
        return True, "auto"
    return cost.wfbp_auto(costs, world, busy, cores, bucket_bytes=bucket_bytes(args), link_rate=link_rate)


def _env_int(name):
    v = os.environ.get(name)
    return int(v) if v not in (None, "") else None


def node_settings(args):
    """(rank, world, rendezvous) from the flags or the environment; None when not a node."""
    if args.dist == "mpi":
        return "mpi"
    rank = args.rank if args.rank is not None else _env_int("MINICAFFE_RANK")
    world = args.world_size if args.world_size is not None else _env_int("MINICAFFE_WORLD_SIZE")
    rdv = args.rendezvous or os.environ.get("MINICAFFE_RENDEZVOUS")
    if rank is None and world is None and rdv is None:
        return None
    missing = [n for n, v in (("--rank", rank), ("--world-size", world), ("--rendezvous", rdv)) if v is None]
    if missing:
        raise DistError(f"a node needs --rank, --world-size and --rendezvous; missing {', '.join(missing)}")
    if world < 1 or not 0 <= rank < world:
        raise DistError(f"--rank {rank} must be in 0..{world - 1} (--world-size {world})")
    return rank, world, rdv


def is_launcher(args):
    return getattr(args, "nodes", 1) > 1 and node_settings(args) is None


def is_node(args):
    return node_settings(args) is not None


def rank_of(args):
    s = node_settings(args)
    if s is None:
        return 0
    if s == "mpi":
        from .mpi import mpi_rank

        return mpi_rank()
    return s[0]


# -- the local launcher ---------------------------------------------------------------------------
def free_port(host="127.0.0.1"):
    import socket

    s = socket.socket()
    s.bind((host, 0))
    port = s.getsockname()[1]
    s.close()
    return port


def launch_local(argv, args, log_dir=None, log=None):
    """Start ``args.nodes`` node processes on loopback; wait; -> exit code.

    A node that dies makes the others stop by themselves (they lose its connection); the
    launcher gives them 15 s, then terminates what is left, and says which node went first."""
    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    n = args.nodes
    # node 0 makes the run directory (once its nets are built); the others' output goes here
    log_dir = log_dir or tempfile.mkdtemp(prefix="minicaffe-nodes-")
    secret = os.environ.get("MINICAFFE_DIST_SECRET") or new_secret()
    port = free_port()
    env = dict(os.environ, MINICAFFE_DIST_SECRET=secret)
    env[LAUNCHED_ENV] = "1"
    cmd = [sys.executable, "-m", "minicaffe.train"] + list(argv)  # --nodes stays: node 0 prints it in resume hints
    procs, files = [], []
    log(f"minicaffe: starting {n} nodes on 127.0.0.1 (rendezvous port {port}); nodes 1..{n - 1} log to {log_dir}/")
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # the nodes get Ctrl-C themselves
    try:
        for r in range(n):
            node_env = dict(env, MINICAFFE_RANK=str(r), MINICAFFE_WORLD_SIZE=str(n), MINICAFFE_LOCAL_NODES=str(n))
            node_env["MINICAFFE_RENDEZVOUS"] = f"127.0.0.1:{port}"
            if r == 0:
                procs.append(subprocess.Popen(cmd, env=node_env))
            else:
                f = open(os.path.join(log_dir, f"node{r}.log"), "w")  # noqa: SIM115
                files.append(f)
                procs.append(subprocess.Popen(cmd, env=node_env, stdout=f, stderr=subprocess.STDOUT))
        first_bad, deadline = None, None
        while True:
            codes = [p.poll() for p in procs]
            for r, c in enumerate(codes):
                if c not in (None, 0) and first_bad is None:
                    first_bad = (r, c)
                    deadline = time.monotonic() + 15
            if all(c is not None for c in codes):
                break
            if deadline is not None and time.monotonic() > deadline:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
            time.sleep(0.1)
    finally:
        signal.signal(signal.SIGINT, previous)
        for f in files:
            f.close()
    if first_bad is None:
        shutil.rmtree(log_dir, ignore_errors=True)  # kept only when something went wrong
        return 0
    r, c = first_bad
    if r == 0 and c == 130:  # Ctrl-C: node 0 stopped every node after the same iteration
        return 130
    how = f"was killed by {signal.Signals(-c).name}" if c < 0 else f"exited with status {c}"
    log(f"error: node {r} {how}; the run stopped")
    if r != 0:
        path = os.path.join(log_dir, f"node{r}.log")
        with open(path, errors="replace") as f:
            tail = f.read().splitlines()[-4:]
        log(f"the end of {path}:\n    " + "\n    ".join(tail))
    return c if c > 0 else 1


# -- a node ---------------------------------------------------------------------------------------
def config_hashes(solver):
    """What every node must agree on: the training net and the solver's hyper-parameters
    (not where a node writes its files, nor how often it tests or logs)."""
    net = proto.to_text(solver.net.param).encode()
    sp = solver.param.copy()
    for field in (
        "snapshot_prefix",
        "snapshot",
        "snapshot_after_train",
        "test_interval",
        "display",
        "net",
        "net_param",
        "train_net",
        "train_net_param",
        "test_net",
        "test_net_param",
        "test_iter",
        "test_state",
    ):
        sp.clear(field)
    return {
        "net": hashlib.sha256(net).hexdigest()[:16],
        "solver": hashlib.sha256(proto.to_text(sp).encode()).hexdigest()[:16],
        "solver type": solver.type,
    }


def make_transport(args, solver, log):
    settings = node_settings(args)
    from .poseidon import frame_limit
    from .ps import frame_bound

    limit = max(frame_bound(solver.net, bucket_bytes(args)), frame_limit(solver.net))
    config = config_hashes(solver)
    # every node must agree (the buckets decide which frames travel)
    config["communication"] = (
        f"--comm {args.comm}, --wfbp {args.wfbp or 'auto'}, --bucket-kb {bucket_bytes(args) / 1024:g}, "
        f"planned for {planning_link(args)}"
    )
    link = None
    if args.link:
        link = (parse_rate(args.link), parse_delay(args.link_delay))
    if settings == "mpi":
        from .mpi import MPITransport

        return MPITransport(config, limit, log=log, link=link)
    from .sockets import SocketTransport, parse_address

    rank, world, rdv = settings
    listen = parse_address(args.listen, "--listen") if args.listen else None
    secret = load_secret(args.secret_file)
    t = SocketTransport(
        rank,
        world,
        rdv,
        secret,
        config,
        limit,
        listen_address=listen,
        link=link,
        log=log,
        peer_timeout=args.peer_timeout,
        connect_timeout=args.connect_timeout,
    )
    return t.form()


def run_secondary(args):
    """A node other than 0: build the same solver from the same flags and train; writes no files
    (node 0 sends the initial parameters, the iteration and the data position)."""
    from ..data import set_data_dir
    from ..solvers import get_solver, load_solver_param
    from ..tools.common import resolve_solver

    rank = rank_of(args)

    def log(message):
        print(f"[node {rank}] {message}", flush=True)

    if args.device == "gpu":
        raise DistError("--device gpu is not supported across nodes yet; train on the CPU")
    if args.data_dir:
        set_data_dir(os.path.abspath(args.data_dir))
    param, base_dir = load_solver_param(resolve_solver(args.solver))
    for flag, field in (("iters", "max_iter"), ("seed", "random_seed"), ("snapshot", "snapshot")):
        if getattr(args, flag) is not None:
            setattr(param, field, getattr(args, flag))
    solver = get_solver(param, base_dir=base_dir, log=log)
    train(solver, args, log)
    return 0


def local_nodes():
    """How many nodes share this machine: set by the local launcher and the emulator
    (MINICAFFE_LOCAL_NODES), by MPICH's mpiexec (MPI_LOCALNRANKS); else 1."""
    for name in ("MINICAFFE_LOCAL_NODES", "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        v = _env_int(name)
        if v:
            return v
    return 1


def blas_threads(workers):
    """BLAS threads per node: the cores divided among the nodes and worker threads here, so that
    OpenBLAS threads (which spin while they wait) do not oversubscribe the cores."""
    from ..parallel import blas

    n = max(1, blas.cores() // (local_nodes() * max(1, workers)))
    blas.set_threads(n)
    return n


class FreezeHeap:
    """A Solver callback for a node's process: after the first iteration (the nets built, numba's
    kernels compiled) every object alive moves to the garbage collector's permanent generation
    (``gc.freeze``), so that its full passes walk only what later iterations allocate.  Without
    it a full pass walks ~100,000 objects (~50 ms of CPU on this machine) every few hundred
    iterations; the nodes' reports count the collector's time (``gc_s``)."""

    def __init__(self, log=None):
        self.log, self.done = log, False

    def on_iteration(self, solver, loss, lr):
        if not self.done:
            self.done = True
            gc.collect()  # (what is garbage now need not be kept for the whole run)
            gc.freeze()
            if self.log:
                self.log(f"garbage collector: {gc.get_freeze_count():,} objects frozen after the first iteration")


def train(solver, args, log, out_dir=None):
    """Train ``solver`` as one node of the run the flags describe; -> the run's statistics
    (every node's, on node 0).  Raises DistError (a SolverError) when the run cannot go on."""
    from .ps import Node

    if solver.net.backend.name != "cpu":
        raise DistError(f"training across nodes runs on the CPU; this solver's net is on '{solver.net.backend.name}'")
    transport = make_transport(args, solver, log)
    rank, world = transport.rank, transport.world
    log(
        f"node {rank}/{world}: {args.workers} worker thread(s), "
        + ("BSP" if not args.staleness else f"SSP staleness {args.staleness}")
        + (f", link emulated at {args.link}" if args.link else "")
    )
    resume = bool(getattr(args, "resume", None)) and rank == 0
    threads = blas_threads(args.workers)
    log(f"node {rank}: BLAS threads {threads} ({local_nodes()} node(s) on this machine, {args.workers} worker(s) each)")
    from . import cost

    link_rate = planning_link_rate(args)
    costs = cost.plan(
        solver.net,
        world,
        comm=args.comm,
        iter_size=max(1, solver.param.iter_size),
        global_batch=True,
        bucket_bytes=bucket_bytes(args),
        link_rate=link_rate,
    )
    wfbp, why = wfbp_setting(args, world, costs, link_rate)
    if rank == 0:
        log(f"WFBP {'on' if wfbp else 'off'} ({why})")
    # WFBP: the next clock's gradients go to another slot where a unit syncs inside the backward
    slots = cost.wfbp_gradient_slots(costs, args.staleness, bucket_bytes(args)) if wfbp else None
    node = Node(
        solver,
        transport,
        staleness=args.staleness,
        workers=args.workers,
        log=log,
        resume=resume,
        gradient_slots=slots,
        bucket_bytes=bucket_bytes(args),
    )
    from .poseidon import Poseidon

    poseidon = Poseidon(node, comm=args.comm, wfbp=wfbp, log=log, costs=costs)
    previous = None
    if rank != 0 and os.environ.get(LAUNCHED_ENV):
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # node 0 decides when to stop
    node.attach_solver()
    freeze = FreezeHeap(log if rank == 0 else None)
    solver.add_callback(freeze)
    try:
        node.start()
        solver.solve()
    except BaseException:
        node.abort()
        raise
    finally:
        node.detach_solver()
        solver.remove_callback(freeze)
        if freeze.done:
            gc.unfreeze()
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    reports = node.finish()
    poseidon.close()
    mine = reports[rank]
    log(
        f"node {rank}: {mine['iterations']} iterations, {mine['bytes_per_iter'] / 1e6:.3f} MB/iteration "
        f"(sent + received, the start-up's included), compute {mine['compute_s']:.2f} s, sync {mine['sync_s']:.2f} s "
        f"(waiting for parameters {mine['wait_s']:.2f} s), garbage collector {mine['gc_s']:.3f} s"
    )
    for name, s in mine["layers"].items():
        log(
            f"    {name:>12}: sent {s['sent'] / 1e6:9.3f} MB, received {s['received'] / 1e6:9.3f} MB, wait {s['wait_s']:.3f} s"
        )
    log(poseidon.bytes_table(mine["iterations"]))
    record = {"kind": "dist", "world": world, "transport": args.dist, "link": args.link}
    record.update(comm=args.comm, wfbp=wfbp, poseidon=poseidon.report(mine["iterations"]))
    # every node's report, its timeline included (a few recorded clocks, at most 4000 events:
    # what timeline.png draws, kept for benchmarks/poseidon.py's per-node figure)
    record["nodes"] = {str(r): rep for r, rep in sorted(reports.items())}
    if out_dir is not None and rank == 0:
        from .timeline import plot_timeline

        path = os.path.join(out_dir, "timeline.png")
        plot_timeline(reports, path)
        log(f"Timeline of the first iterations (compute vs communication, per node): {path}")
    return record
