"""Placing buffers in one arena: greedy by size, first fit in the address space.

Given buffers with lifetimes (minicaffe.memory.lifetimes), choose an offset for each so that two
buffers whose lifetimes share a step never share a byte.  The classic heuristic (used by the
memory planners of TensorFlow Lite and MXNet): take the buffers largest first; put each at the
lowest offset where it overlaps, in memory, no already-placed buffer that is live at the same
time.  Persistent buffers conflict with everything, so they end up side by side.

    plan = plan_net(net)          # lifetimes + offsets; runs the net once to size scratch
    plan.allocate()               # one uint8 arena (device memory on a GPU), every blob attached to its slice
    plan.poison(step)             # fill the bytes no buffer needs at `step` with 0xFF (NaN)
    plan = plan_training(solver)  # a training process: the training net and its test nets, one arena

A training process runs its test nets between iterations, when nothing of the training net but
its persistent buffers (parameters, gradients, history, inputs, outputs) holds anything, so
``plan_training`` places a test net's buffers as if its steps came after the training net's: they
share the bytes of the training net's activations, diffs and scratch (Caffe keeps one column
buffer per net; here the convolutions of both nets, and their activations, share one region).

The *peak* (the most bytes live at any one step) is a lower bound for any placement; the arena
size is what this one achieves.
"""

import numpy as np

from ..errors import MinicaffeError
from ..layers.data_base import DataLayer
from .lifetimes import net_buffers, recompute_columns, steps, unplanned_bytes

ALIGN = 64  # bytes: a cache line, and what numpy's own allocations give


def align_up(n, a=ALIGN):
    return (n + a - 1) // a * a


def place(buffers, align=ALIGN):
    """Set ``buffer.offset`` for each buffer; return the arena size in bytes."""
    placed = []
    for buf in sorted(buffers, key=lambda b: (-b.nbytes, b.name)):
        size = align_up(buf.nbytes, align)
        busy = sorted((o.offset, o.offset + align_up(o.nbytes, align)) for o in placed if o.overlaps(buf))
        offset = 0
        for start, end in busy:
            if offset + size <= start:
                break
            offset = max(offset, end)
        buf.offset = offset
        placed.append(buf)
    return max((b.offset + align_up(b.nbytes, align) for b in buffers), default=0)


def peak_bytes(buffers, n_steps):
    """The most bytes live at any step: no placement can use less."""
    return max((sum(b.nbytes for b in buffers if b.live_at(t)) for t in range(n_steps)), default=0)


def by_category(buffers):
    """{category: (how many buffers, their bytes)} of a plan's buffers."""
    out = {}
    for b in buffers:
        n, total = out.get(b.category, (0, 0))
        out[b.category] = (n + 1, total + b.nbytes)
    return out


def dry_run(net, backward=True):
    """Run one forward/backward (``backward=False``: forward only) so that layers allocate their
    scratch, then undo its effects: parameters (BatchNorm's running sums live there), data
    readers' positions, the global RNG, input blobs and parameter gradients are as before."""
    from ..rng import get_rng

    params = [p.dev_flat_data.copy() for p in net.learnable_params]
    inputs = {name: net.blobs[name].dev_flat_data.copy() for name in net.inputs}
    states = {i: layer.position() for i, layer in enumerate(net.layers) if isinstance(layer, DataLayer)}
    gen = get_rng().bit_generator
    rng_state = gen.state
    try:
        net.forward_backward() if backward else net.forward()
    finally:
        for p, v in zip(net.learnable_params, params):
            p.dev_flat_data[...] = v
        for name, v in inputs.items():
            net.blobs[name].dev_flat_data[...] = v
        for i, state in states.items():
            net.layers[i].seek(state)
        gen.state = rng_state
        net.clear_param_diffs()


def check_placement(buffers):
    """Raise if two buffers that are live at the same step share a byte."""
    bufs = sorted(buffers, key=lambda b: b.offset)
    for i, a in enumerate(bufs):
        for b in bufs[i + 1 :]:
            if b.offset >= a.offset + a.nbytes:
                break
            if a.overlaps(b) and a.nbytes and b.nbytes:
                raise MinicaffeError(f"memory plan: {a.name} and {b.name} are live together and overlap")


class Arena:
    """One allocation carved into sections: ``reserve(nbytes)`` -> offset, then ``allocate()``."""

    def __init__(self, xp=np):
        self.size = 0
        self.buffer = None
        self.xp = xp  # the backend's array module: on a GPU the arena is device memory

    def reserve(self, nbytes):
        offset = self.size
        self.size += align_up(int(nbytes))
        return offset

    def allocate(self):
        self.buffer = self.xp.empty(self.size, dtype=np.uint8)
        return self.buffer

    def view(self, offset, count, dtype):
        """A flat array of ``count`` elements of ``dtype`` at byte ``offset``."""
        dtype = np.dtype(dtype)
        return self.buffer[offset : offset + count * dtype.itemsize].view(dtype)


class NetPlan:
    """The placed buffers of one net: ``buffers`` (offsets relative to the plan's section),
    ``size`` (bytes), ``peak`` (bytes live at the busiest step), ``naive`` (bytes with one
    allocation per buffer), ``unplanned`` (bytes layers keep for themselves)."""

    def __init__(self, net, buffers, unplanned=0):
        self.net = net
        self.buffers = buffers
        self.n_steps, self._fwd, self._bwd = steps(net)  # as net_buffers counted them
        self.size = place(buffers)
        self.peak = peak_bytes(buffers, self.n_steps)
        self.naive = sum(b.nbytes for b in buffers)
        self.unplanned = unplanned
        self.arena, self.base = None, 0
        self._dead = None

    def check(self):
        """No two buffers that are live at the same step share a byte (the planner's invariant)."""
        check_placement(self.buffers)

    def attach(self, arena, base):
        """Give every buffer its slice of ``arena`` (which has this plan's ``size`` bytes at ``base``)."""
        self.arena, self.base = arena, base
        for b in self.buffers:
            b.attach(arena.view(base + b.offset, b.count, b.dtype))
        self._dead = None

    def allocate(self):
        """A private arena for this plan alone; returns it."""
        arena = Arena(self.net.xp)
        base = arena.reserve(self.size)
        arena.allocate()
        self.attach(arena, base)
        return arena

    def by_category(self):
        return by_category(self.buffers)

    # -- poison: prove that no live buffer is overwritten --------------------------------------
    def dead_ranges(self, step):
        """Byte ranges of this plan's section that no buffer needs at ``step``."""
        if self._dead is None:
            self._dead = {}
        if step not in self._dead:
            live = sorted((b.offset, b.offset + b.nbytes) for b in self.buffers if b.live_at(step) and b.nbytes)
            ranges, pos = [], 0
            for start, end in live:
                if start > pos:
                    ranges.append((pos, start))
                pos = max(pos, end)
            if pos < self.size:
                ranges.append((pos, self.size))
            self._dead[step] = ranges
        return self._dead[step]

    def poison(self, step):
        """Fill every byte not live at ``step`` with 0xFF: NaN as a float, -1 as an integer."""
        buf = self.arena.buffer
        for start, end in self.dead_ranges(step):
            buf[self.base + start : self.base + end] = 0xFF

    def forward_backward_poisoned(self):
        """One iteration of the net (its own loop), poisoning the dead bytes before every step
        through the net's hooks; returns the loss."""
        net = self.net
        fwd, bwd = self._fwd, self._bwd
        with net.add_hooks(before_forward=lambda i: self.poison(fwd(i)), before_backward=lambda i: self.poison(bwd(i))):
            return net.forward_backward()


def plan_net(net, params=True, run_first=True, recompute=False, extra=()):
    """Lifetimes and offsets of every buffer of ``net`` (nothing is attached yet).

    ``run_first``: run the net once (``dry_run``) so that scratch arrays have their sizes.
    ``params``: plan the parameters and gradients too (as two flat vectors).
    ``recompute``: let convolutions recompute im2col in backward instead of keeping the columns
    (less memory, one more im2col per layer per step; see lifetimes.recompute_columns).
    """
    if recompute:
        for layer in net.layers:
            recompute_columns(layer)
    if run_first:
        dry_run(net)
    buffers = net_buffers(net, params=params) + list(extra)
    plan = NetPlan(net, buffers, unplanned_bytes(net, buffers))
    plan.check()
    return plan


def plan_memory(net, params=True, recompute=False):
    """Plan ``net`` and move it into a fresh arena; returns the NetPlan (``plan.arena``)."""
    plan = plan_net(net, params=params, recompute=recompute)
    plan.allocate()
    return plan


def history_buffers(solver):
    """The solver's history (momentum, Adam's moments...) as persistent flat buffers: attaching
    one copies that history into the flat vector and makes its arrays views of it."""
    from .flat import ParamLayout, attach_history
    from .lifetimes import Buffer

    layout = ParamLayout(solver.net)
    return [
        Buffer(
            f"solver {name}",
            "solver history",
            layout.count,
            solver.net.dtype,
            None,
            lambda flat, hist=hist: attach_history(layout, hist, flat),
        )
        for name, hist in zip(solver.history_names, solver.history)
    ]


def plan_solver(solver, recompute=False):
    """Plan the solver's training net, its parameters, gradients and history in one arena."""
    plan = plan_net(solver.net, params=True, recompute=recompute, extra=history_buffers(solver))
    plan.allocate()
    for net in solver.test_nets:
        net.share_with(solver.net)
    return plan


class TrainingPlan:
    """The one arena of a training process (``plan_training``): ``size``, ``peak`` and ``naive``
    bytes as in NetPlan, over the training net's buffers and its test nets'; ``arena``."""

    def __init__(self, buffers, n_steps, arena):
        self.buffers, self.arena = buffers, arena
        self.size = arena.size
        self.peak = peak_bytes(buffers, n_steps)
        self.naive = sum(b.nbytes for b in buffers)

    def by_category(self):
        return by_category(self.buffers)


def plan_training(solver, recompute=False, run_first=True):
    """Plan the solver's training net (parameters, gradients, the solver's history, activations,
    diffs, scratch) and its test nets (forward only) in one arena, a test net's steps placed after
    the training net's (see the module docstring), and attach everything to it.  Values are
    copied in; results are bit for bit those of the unplanned nets (tests/test_memory.py).

    ``run_first=False`` plans without running the nets first: only the scratch layers have sized
    at reshape (Convolution and Pooling do) is placed, the rest stays the layers' own; nothing is
    computed, so no page of the unplanned buffers is touched and the process's peak stays low.
    """
    net = solver.net
    train = plan_net(net, params=True, recompute=recompute, extra=history_buffers(solver), run_first=run_first)
    buffers, shift = list(train.buffers), train.n_steps
    for test in solver.test_nets:
        if run_first:
            dry_run(test, backward=False)
        for b in net_buffers(test, params=False, backward=False):
            if b.intervals == []:
                continue  # a diff no forward touches keeps its own (never touched) storage
            if b.intervals:
                b.intervals = [(a + shift, z + shift) for a, z in b.intervals]
            b.name = f"{test.name} (test): {b.name}"
            buffers.append(b)
        shift += steps(test)[0]
    arena = Arena(net.xp)
    base = arena.reserve(place(buffers))
    check_placement(buffers)
    arena.allocate()
    for b in buffers:
        b.attach(arena.view(base + b.offset, b.count, b.dtype))
    for test in solver.test_nets:
        test.share_with(net)  # their parameters are the training net's, now in the arena
    trim_heap()  # the storage the blobs had before is free now
    return TrainingPlan(buffers, shift, arena)


def trim_heap():
    """Give freed C-heap memory back to the operating system (glibc's ``malloc_trim``).

    Blobs allocate their storage when a net is built; attaching them to an arena frees it, but
    arrays under glibc's mmap threshold (128 KiB, raised as large blocks are freed) live in the
    C heap, whose freed pages stay resident until trimmed: about 11 MiB for LeNet's two nets.
    Returns False where there is no ``malloc_trim`` (not glibc), and does nothing there."""
    import ctypes
    import gc
    import sys

    if not sys.platform.startswith("linux"):
        return False
    gc.collect()  # blobs in reference cycles (layers <-> nets) are freed now, not at some later time
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
    return True
