"""A distributed run inside one process: P nodes as threads, joined by real loopback sockets.

For tests and lessons ("threads before sockets, sockets before real networks"): every node has
its own Solver and its own SocketTransport, so the whole protocol (handshakes, frames, shards)
runs exactly as across machines; only the processes are missing.

    solvers = [make_solver() for _ in range(3)]
    nodes = run_nodes(solvers, iters=5)          # BSP over 3 nodes; returns the Node objects
    nodes[0].report()
"""

import threading

from .launch import config_hashes
from .ps import Node, frame_bound
from .sockets import SocketTransport

SECRET = b"minicaffe-local-test-secret"


def make_mesh(world, configs, limit, log=None, link=None, **kwargs):
    """``world`` formed SocketTransports on 127.0.0.1 (node 0 on a free port)."""
    logs = log or (lambda m: None)
    t0 = SocketTransport(0, world, "127.0.0.1:0", SECRET, configs[0], limit, log=logs, link=link, **kwargs)
    rdv = f"127.0.0.1:{t0.address[1]}"
    ts = [t0] + [
        SocketTransport(r, world, rdv, SECRET, configs[r], limit, log=logs, link=link, **kwargs)
        for r in range(1, world)
    ]
    errors = {}

    def form(r):
        try:
            ts[r].form()
        except Exception as exc:  # noqa: BLE001  (re-raised below)
            errors[r] = exc

    threads = [threading.Thread(target=form, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        for t in ts:
            t.shutdown()
        raise errors[min(errors)]
    return ts


def run_nodes(solvers, iters=None, staleness=0, workers=1, link=None, setup=None, log=None, bucket_bytes=None):
    """Train ``solvers`` (one per node, built alike) as P nodes in threads for ``iters``
    iterations (default: ``solve()`` to max_iter).  ``setup(node)`` runs on each Node before
    it starts (where a runtime adds its hooks).  -> the Nodes (``report()``, ``finish`` done);
    the first node's error is raised."""
    world = len(solvers)
    limit = frame_bound(solvers[0].net, bucket_bytes)
    ts = make_mesh(world, [config_hashes(s) for s in solvers], limit, log=log, link=link)
    nodes = [Node(s, t, staleness=staleness, workers=workers, bucket_bytes=bucket_bytes) for s, t in zip(solvers, ts)]
    errors = {}

    def run(r):
        node, solver = nodes[r], solvers[r]
        try:
            if setup is not None:
                setup(node)
            node.attach_solver()
            node.start()
            if iters is None:
                solver.solve()
            else:
                solver.step(iters)
            node.reports = node.finish()
        except BaseException as exc:  # noqa: BLE001  (re-raised below)
            errors[r] = exc
            node.abort()
        finally:
            node.detach_solver()

    threads = [threading.Thread(target=run, args=(r,), name=f"minicaffe-node-{r}") for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[min(errors)]
    return nodes
