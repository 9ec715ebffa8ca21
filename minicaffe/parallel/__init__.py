"""SingleCaffe's runtime: one parameter-server thread, N worker threads, one memory arena.

    from minicaffe.parallel import train_with_workers
    solver = minicaffe.get_solver("nets/lenet_solver.prototxt")
    trainer = train_with_workers(solver, 2)              # BSP; staleness=s for SSP
    print(trainer.stats())                               # where the time went

See runtime.py (the threads and the protocol), replica.py (how replicas and shards are built),
blas.py (BLAS threads), and docs/PARALLEL.md (design, measurements).
"""

from .replica import shard_bounds, shard_sizes, with_synthetic_data
from .runtime import ParallelTrainer, WorkerError, WorkerTimeout, train_with_workers

__all__ = [
    "ParallelTrainer",
    "WorkerError",
    "WorkerTimeout",
    "train_with_workers",
    "shard_sizes",
    "shard_bounds",
    "with_synthetic_data",
]
