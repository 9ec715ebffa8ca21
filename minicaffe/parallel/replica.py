"""Replicas: the training net again, with its Data layers turned into Input layers of a shard.

A worker's replica is built from the same NetParameter as the solver's training net, with the
same phase, level and stages, so it has the same layers and the same parameter shapes.  Each data
layer (Data, MemoryData: any ``DataLayer``) becomes an Input layer whose batch is the worker's shard: the server's Data layer reads the
global batch (the solver's batch, in the solver's order) and every worker copies its contiguous
slice of it.  So the data order, the reader's snapshot position and the global batch size are
exactly those of a one-thread run.
"""

import os

import numpy as np

from .. import proto
from ..net import TEST, TRAIN, Net, filter_layers, normalize_phase
from ..rng import get_rng


def shard_sizes(batch, n):
    """``batch`` items over ``n`` workers, contiguous, sizes differing by at most one."""
    return [batch // n + (1 if k < batch % n else 0) for k in range(n)]


def shard_bounds(batch, n):
    sizes = shard_sizes(batch, n)
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
    return [(int(starts[k]), int(starts[k + 1])) for k in range(n)]


def train_state(solver):
    """(level, stages) the solver built its training net with."""
    p, netp = solver.param, solver.net.param
    state = p.train_state if p.has("train_state") else None
    level = (state.level if state is not None else 0) or netp.state.level
    stages = (tuple(state.stage) if state is not None else ()) + tuple(netp.state.stage)
    return level, stages


def replica_param(solver, data_layers, batch_sizes):
    """The NetParameter of a replica: TRAIN layers of the solver's net, Data -> Input.

    ``data_layers``: the server net's Data layers (by name); ``batch_sizes[name]``: this
    replica's batch for each of them.
    """
    level, stages = train_state(solver)
    src = solver.net.param
    kept = filter_layers(src.layer, TRAIN, level, stages)
    out = src.copy()
    out.clear("layer")
    shapes = {layer.name: [t.shape for t in solver.net.top_vecs[i]] for i, layer in data_layers}
    for lp in kept:
        if lp.name in shapes:
            new = proto.Message("LayerParameter", name=lp.name, type="Input")
            new.top.extend(list(lp.top))
            ip = new.get_or_create("input_param")
            for shape in shapes[lp.name]:
                ip.add("shape").dim.extend([batch_sizes[lp.name]] + list(shape[1:]))
            out.layer.append(new)
        else:
            out.layer.append(lp.copy())
    return out, level, stages


def build_replica(solver, data_layers, batch_sizes):
    """A replica net (the global RNG is left as it was: building runs the fillers)."""
    param, level, stages = replica_param(solver, data_layers, batch_sizes)
    gen = get_rng().bit_generator
    state = gen.state
    try:
        net = Net(param, phase=TRAIN, level=level, stages=stages, dtype=solver.net.dtype, backend=solver.net.backend)
    finally:
        gen.state = state
    return net


def with_synthetic_data(net_param, count=1024, shuffle=None):
    """A copy of ``net_param`` whose Data layers read seeded synthetic images of the right shape
    (MNIST 1x28x28, CIFAR-10 3x32x32, 10 classes): benchmarks and tests need no download."""
    out = net_param.copy()
    for lp in out.layer:
        if lp.type != "Data":
            continue
        src = lp.data_param.source
        shape = "1x28x28" if "mnist" in src else "3x32x32" if "cifar" in src else None
        if shape is None:
            continue
        seed = 1 if "test" in src else 0
        lp.data_param.source = f"synthetic:{shape}:10:{count}:{seed}" + (
            "" if shuffle is None else f"?shuffle={'true' if shuffle else 'false'}"
        )
    return out


def synthetic_solver(solver_file, batch=None, count=1024, shuffle=None, **fields):
    """The Solver of ``solver_file`` with its training net's Data layers reading synthetic data
    (``with_synthetic_data``: MNIST or CIFAR-10 shapes), ``batch`` images per training batch when
    given, no tests, no display and no snapshots; ``fields`` set SolverParameter fields (for
    example ``lr_policy="fixed"``).  Seeded by the solver's ``random_seed`` when it has one, so
    two solvers made alike start alike.  Tests, benchmarks and lessons train with it without a
    download."""
    from ..solvers import get_solver, load_solver_param

    param, base = load_solver_param(solver_file)
    if param.has("net_param"):
        netp = param.net_param
    else:
        netp = proto.parse_file(os.path.join(base, param.net), "NetParameter")
    netp = with_synthetic_data(netp, count=count, shuffle=shuffle)
    if batch:
        for lp in netp.layer:
            if lp.type == "Data" and not any(r.has("phase") and normalize_phase(r.phase) == TEST for r in lp.include):
                lp.data_param.batch_size = batch  # (a Data layer of the test phase keeps its batch)
    param.clear("net")
    param.net_param = netp
    for name in ("test_iter", "test_interval", "snapshot"):
        param.clear(name)
    param.display = 0
    param.snapshot_after_train = False
    for name, value in fields.items():
        setattr(param, name, value)
    return get_solver(param, base_dir=base, log=lambda m: None)
