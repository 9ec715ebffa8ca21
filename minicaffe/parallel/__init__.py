"""SingleCaffe's runtime: one parameter-server thread, N worker threads, one memory arena.

    from minicaffe.parallel import train_with_workers
    solver = minicaffe.get_solver("nets/lenet_solver.prototxt")
    trainer = train_with_workers(solver, 2)              # BSP; staleness=s for SSP
    print(trainer.stats())                               # where the time went

See runtime.py (the threads and the protocol), replica.py (how replicas and shards are built),
blas.py (BLAS threads), lanes.py (one layer call split across cores, which the layers import),
and docs/PARALLEL.md (design, measurements).

The runtime's names are loaded on first use (PEP 562): the layers import ``parallel.lanes``
while the engine itself is still loading, and the runtime imports the engine.
"""

import importlib

_LAZY = {
    "ParallelTrainer": "runtime",
    "WorkerError": "runtime",
    "WorkerTimeout": "runtime",
    "train_with_workers": "runtime",
    "shard_sizes": "replica",
    "shard_bounds": "replica",
    "with_synthetic_data": "replica",
    "synthetic_solver": "replica",
}


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ParallelTrainer",
    "WorkerError",
    "WorkerTimeout",
    "train_with_workers",
    "shard_sizes",
    "shard_bounds",
    "with_synthetic_data",
    "synthetic_solver",
]
