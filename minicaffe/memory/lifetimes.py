"""When is each buffer of a net used?  The schedule of one training iteration, step by step.

One iteration of a net with L layers is 2L *steps*::

    step i          = forward of layer i               (i = 0 .. L-1)
    step 2L-1-i     = backward of layer i              (only if the layer needs backward)

except that the layers of one segment of the step plan share one step each way (``steps``).

A *buffer* is one flat array the planner may place: a blob's data, a blob's diff, or a layer's
scratch array (Convolution's im2col columns, Pooling's argmax mask).  Its *lifetime* is a list of
step intervals ``[(first, last), ...]``: the contents written at ``first`` must survive until
``last``.  Two buffers whose lifetimes do not intersect may share memory.

The rules (conservative on purpose; ``tests/test_memory.py`` poisons every byte that is not live
and checks that training gives the same numbers):

- a blob's **data** is live from the forward of the first layer that touches it to the last step
  that reads it: the forward of every layer that has it as a bottom or a top, and the backward
  of every such layer *that reads data in backward*.  Most layers do (ReLU reads its bottom,
  Sigmoid its top, LRN both), so that is the default; a layer class that reads less declares it
  with ``backward_reads`` (InnerProduct reads only its bottom; Max pooling reads neither: it
  keeps an argmax mask).  Without these declarations nothing could share memory at the turn
  from forward to backward, where every activation is still live.
- a blob's **diff** is live from the backward of its last consumer to the backward of its
  producer (the layers that run backward and have it as a top, or as a bottom they propagate to).
- **persistent** (live at every step, and across iterations): the net's inputs and outputs (the
  user writes the first before ``forward`` and reads the second after it), the diffs of loss tops
  (they hold the loss weight, written once at setup), diffs that backward reads but never writes
  (a Split top feeding Accuracy: Split sums it, so it must stay the zeros it was allocated as, a
  fact Caffe relies on too), parameters, their gradients, solver history.
- a layer's **scratch** (what its ``scratch()`` declares) lives for one call (span ``"call"``:
  written and read inside the same forward or backward) or from the layer's forward to its
  backward (span ``"layer"``: Convolution leaves im2col's columns for its backward to reuse,
  unless its ``recompute`` is set; Pooling keeps its argmax mask).

In place computation (a top named like its bottom) is one Blob, so one buffer whose uses are the
union of both roles.  Blobs that share storage some other way (``share_data``) are found by
identity of their storage and planned as one buffer.
"""

import numpy as np


class Buffer:
    """One flat array the planner places.

    ``intervals``: list of (first step, last step), inclusive; ``None`` means persistent.
    ``attach(flat)``: hands the placed storage (a flat array of ``count`` elements) to its owner.
    """

    __slots__ = ("name", "category", "count", "dtype", "intervals", "attach", "offset", "blobs")

    def __init__(self, name, category, count, dtype, intervals, attach, blobs=()):
        self.name, self.category = name, category
        self.count, self.dtype = int(count), np.dtype(dtype)
        self.intervals = intervals
        self.attach = attach
        self.offset = None
        self.blobs = tuple(blobs)

    @property
    def nbytes(self):
        return self.count * self.dtype.itemsize

    @property
    def persistent(self):
        return self.intervals is None

    def live_at(self, step):
        if self.intervals is None:
            return True
        return any(a <= step <= b for a, b in self.intervals)

    def overlaps(self, other):
        """Do the two lifetimes share a step?"""
        if self.intervals == [] or other.intervals == []:
            return False  # never used: conflicts with nothing
        if self.intervals is None or other.intervals is None:
            return True
        return any(a <= d and c <= b for a, b in self.intervals for c, d in other.intervals)

    def __repr__(self):
        return (
            f"Buffer({self.name!r}, {self.category}, {self.count} x {self.dtype.name}, "
            f"{'persistent' if self.intervals is None else self.intervals}, offset={self.offset})"
        )


def steps(net, segments=None):
    """(number of steps, forward step of layer i, backward step of layer i) of one iteration.

    A segment of the net's step plan (minicaffe/parallel/plan.py: consecutive per-image layers
    that the lanes run as one task, lane 0 perhaps layers ahead of lane 1) is ONE step forward
    (its first layer's) and ONE step backward (its last layer's): every buffer it touches is
    live at that step, so none of them share bytes.  ``segments``: those to count (default: the
    ones the net runs in lanes now; none with one lane)."""
    L = len(net.layers)
    first, last = list(range(L)), list(range(L))
    for a, b in net.step_plan().running() if segments is None else segments:
        for i in range(a, b + 1):
            first[i], last[i] = a, b
    return 2 * L, (lambda i: first[i]), (lambda i: 2 * L - 1 - last[i])


def _interval(uses):
    return [(min(uses), max(uses))] if uses else []


def recompute_columns(layer):
    """Ask ``layer`` to recompute in backward what it keeps from forward (Convolution's im2col
    columns: Caffe's behaviour), so that its scratch lives for one call only; results are
    unchanged (the poison test checks it)."""
    layer.recompute = True


def layer_scratch(layer):
    """The layer's declared scratch: [Scratch(name, flat array, attach(flat), span)]."""
    return [s for s in layer.scratch() if s.array is not None]


def _storage_key(blob, which):
    return id(blob.data_storage if which == "data" else blob.diff_storage)


def net_buffers(net, params=True, backward=True):
    """Every buffer of ``net`` with its lifetime (see the module docstring).

    ``params``: include the parameters and their gradients (two persistent flat buffers);
    replicas of a data-parallel run leave them out (they are shared, see minicaffe.parallel).
    ``backward=False``: the net only runs forward (a test net): no layer's backward counts, so
    diffs nobody writes are never live.
    Scratch sizes are what the layers hold now: run the net once first (``dry_run``).
    """
    # the segments that run in lanes now, and from now on no other (plan.limit_to_running)
    n_steps, fwd, bwd = steps(net, net.step_plan().limit_to_running())
    param_ids = set()
    for layer in net.layers:
        for b in layer.blobs:
            param_ids.add(id(b))
    persistent_data = set(net.inputs) | set(net.outputs)
    loss_diff = {}  # id(blob) -> loss weight
    for li, layer in enumerate(net.layers):
        for w, t in zip(layer.loss_weights, net.top_vecs[li]):
            if w:
                loss_diff[id(t)] = w

    # group blobs by storage (in place = the same Blob; share_data = the same buffer object)
    groups = {"data": {}, "diff": {}}
    for name, blob in zip(net.blob_names, net.blob_list):
        if id(blob) in param_ids:
            continue
        for which in ("data", "diff"):
            groups[which].setdefault(_storage_key(blob, which), []).append((name, blob))

    uses = {"data": {}, "diff": {}}
    diff_written = set()  # diffs some backward writes (a consumer's)
    for li, layer in enumerate(net.layers):
        reads = layer.backward_reads
        runs_bw = backward and net.layer_need_backward[li]
        for role, blobs in (("bottom", net.bottom_vecs[li]), ("top", net.top_vecs[li])):
            for j, blob in enumerate(blobs):
                dk, gk = _storage_key(blob, "data"), _storage_key(blob, "diff")
                uses["data"].setdefault(dk, set()).add(fwd(li))
                if runs_bw:
                    if reads == "both" or reads == role:
                        uses["data"][dk].add(bwd(li))
                    if role == "top" or net.bottom_need_backward[li][j]:
                        uses["diff"].setdefault(gk, set()).add(bwd(li))
                    if role == "bottom" and net.bottom_need_backward[li][j]:
                        diff_written.add(gk)

    buffers = []
    for which in ("data", "diff"):
        for key, members in groups[which].items():
            names = [n for n, _ in members]
            blobs = [b for _, b in members]
            count = max(b.count for b in blobs)
            if which == "data":
                persistent = any(n in persistent_data for n in names)
            else:
                # a diff that backward reads but no backward writes (a Split top feeding a layer
                # that does not run backward, e.g. Accuracy) must stay zero, as allocated
                zero = key in uses["diff"] and key not in diff_written
                persistent = zero or any(id(b) in loss_diff for b in blobs)
            intervals = None if persistent else _interval(uses[which].get(key, ()))
            category = "activations" if which == "data" else "activation diffs"

            def attach(flat, blobs=blobs, which=which, zero=which == "diff" and persistent):
                if zero:
                    flat[...] = 0
                for b in blobs:
                    if which == "data":
                        b.attach(flat, b.diff_storage)
                    else:
                        b.attach(b.data_storage, flat)
                    if which == "diff" and id(b) in loss_diff:
                        b.dev_flat_diff[...] = loss_diff[id(b)]

            buffers.append(
                Buffer(
                    f"{'='.join(dict.fromkeys(names))}.{which}",
                    category,
                    count,
                    blobs[0].dtype,
                    intervals,
                    attach,
                    blobs,
                )
            )

    for li, layer in enumerate(net.layers):
        runs_bw = backward and net.layer_need_backward[li]
        for name, arr, attach, span in layer_scratch(layer):
            if arr is None or arr.size == 0:
                continue
            if span == "call":
                intervals = [(fwd(li), fwd(li))] + ([(bwd(li), bwd(li))] if runs_bw else [])
            else:
                intervals = [(fwd(li), bwd(li) if runs_bw else fwd(li))]
            buffers.append(Buffer(f"{layer.name}:{name}", "layer scratch", arr.size, arr.dtype, intervals, attach))

    if params:
        from .flat import ParamLayout

        layout = ParamLayout(net)
        if layout.count:
            buffers.append(Buffer("params", "params", layout.count, net.dtype, None, layout.attach_data))
            buffers.append(Buffer("param diffs", "param diffs", layout.count, net.dtype, None, layout.attach_diff))
    return buffers


def unplanned_bytes(net, buffers):
    """Bytes the layers hold that no buffer covers (internal blobs and arrays: SoftmaxWithLoss's
    probabilities, LRN's scale, Dropout's mask...): counted in the report, not placed."""
    planned = set()
    for layer in net.layers:
        for _, arr, _, _ in layer_scratch(layer):
            if arr is not None:
                planned.add(id(arr))
    total, seen = 0, set()
    from ..blob import Blob

    for layer in net.layers:
        params = {id(b) for b in layer.blobs}
        for value in vars(layer).values():
            items = value if isinstance(value, (list, tuple)) else [value]
            for v in items:
                if isinstance(v, Blob) and id(v) not in params and id(v) not in seen:
                    seen.add(id(v))
                    total += v.nbytes
                elif isinstance(v, np.ndarray) and id(v) not in planned and id(v) not in seen:
                    seen.add(id(v))
                    total += v.nbytes
                elif (
                    hasattr(v, "buf")
                    and isinstance(v.buf, np.ndarray)
                    and id(v.buf) not in planned
                    and id(v.buf) not in seen
                ):
                    seen.add(id(v.buf))
                    total += v.buf.nbytes
    return total
