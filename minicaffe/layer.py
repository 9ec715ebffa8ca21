"""The Layer contract and the registry of layer types.

A layer is built from its ``LayerParameter`` (a :class:`minicaffe.proto.Message`) and run by the
Net in Caffe's order::

    setup(bottom, top)      = check_arity -> layer_setup -> reshape -> set loss weights (once)
    forward(bottom, top)    -> top.data from bottom.data      (the Net calls reshape first)
    backward(top, propagate_down, bottom)
                            -> bottom[i].diff for every i with propagate_down[i],
                               and *accumulates* into each parameter blob's diff (Caffe's rule:
                               the solver clears parameter diffs, so shared parameters sum)

``bottom`` and ``top`` are lists of :class:`Blob`.  A subclass sets ``type`` (Caffe's type
string) and is registered with ``@register``; it declares its arity with the class attributes
``min_bottom``/``max_bottom``/``min_top``/``max_top`` (None = unbounded).  Loss layers set
``is_loss = True``: their first top then gets loss weight 1 unless the prototxt says otherwise.

A layer never branches on the device: array work goes through ``self.xp`` (numpy or CuPy) and
kernels through ``self.backend`` (a module of flat functions, see minicaffe.backend).

What the memory planner (minicaffe.memory) needs, each layer declares:

- ``backward_reads``: whose *data* its backward reads: ``"bottom"``, ``"top"``, ``"both"`` (the
  default, always safe) or ``"none"``.  InnerProduct reads only its bottom (dW = dy x^T), MAX
  pooling neither (it keeps an argmax mask).  What backward does not read may be overwritten at
  the turn from forward to backward.
- ``scratch()``: the work arrays it keeps between calls, as :class:`Scratch` records
  ``(name, array, attach, span)``: ``array`` the flat array now, ``attach(flat)`` makes ``flat``
  its storage, ``span`` ``"call"`` (written and read inside one forward or one backward) or
  ``"layer"`` (kept from forward for backward).  None by default.
- ``recompute``: set True to ask a layer to recompute in backward what it would otherwise keep
  from forward (Convolution: im2col's columns), so its scratch spans one call only.

The poison test (tests/test_memory.py) checks these declarations on every net of nets/.

What the step plan (minicaffe/parallel/plan.py) needs, a layer whose images are independent
declares by overriding ``lanes_ok`` and the four methods after it.  The plan then runs it with the
layers around it on each lane's slice of the batch, one task per lane for the whole segment:

- ``lanes_ok(bottom, top)``: True when images [a, b) of every top (forward) and of every bottom
  diff (backward) depend only on images [a, b) of the bottoms (and top diffs): the batch is
  axis 0 of every blob.  False by default: the layer runs whole, as ``forward`` / ``backward``.
- ``prepare_lanes(bottom, top, parts, backward)``: on the calling thread, before a segment starts:
  size the work buffers for ``parts`` (one ``(a, b)`` per lane), so the lanes only take views.
- ``forward_images(lane, a, b, bottom, top)`` / ``backward_images(lane, a, b, top,
  propagate_down, bottom)``: ``forward`` / ``backward`` for images [a, b) only, on lane ``lane``'s
  thread.  Lane 0 accumulates its parameter gradients into the parameter diffs; lane k > 0 writes
  its own partial sums into a block of its own.
- ``reduce_lanes(parts)``: after the backward segment, on the calling thread: add the blocks of
  lanes 1, 2, ... into the parameter diffs, in lane order (the same order as the lanes of one
  layer call: results do not depend on which path ran).

A layer may instead leave its parameter gradients until the lanes meet: with
``params_after_lanes`` True, ``backward_images`` computes the bottom diffs only, and once every
lane has finished the layer's ``backward_images`` call (the lanes wait for each other there),
each lane calls ``backward_params(lane, parts, top, bottom)``: its share of the gradients' rows
over the whole batch.  No partial sums, no reduction, no block per lane, and the rows are the
ones a layer call split across the lanes computes (InnerProduct: its weight gradient as a product
over all the batch's images, in row blocks, is the same arithmetic with or without the plan).
"""

from collections import namedtuple

import numpy as np

from .blob import Blob
from .checks import check_layer_param
from .errors import LayerError, did_you_mean

LAYERS = {}

#: a work array a layer keeps between calls (see the module docstring, ``Layer.scratch``)
Scratch = namedtuple("Scratch", "name array attach span")


def register(cls):
    """Class decorator: make ``cls`` creatable by its Caffe type string ``cls.type``."""
    if not cls.type:
        raise TypeError(f"{cls.__name__} has no 'type' string")
    if cls.type in LAYERS and LAYERS[cls.type] is not cls:
        raise TypeError(f"layer type '{cls.type}' registered twice ({LAYERS[cls.type].__name__}, {cls.__name__})")
    LAYERS[cls.type] = cls
    return cls


def layer_class(type_name, where=""):
    from . import layers  # noqa: F401  (registers every built-in layer)

    cls = LAYERS.get(type_name)
    if cls is None:
        raise LayerError(
            where or "?",
            type_name,
            f"unknown layer type '{type_name}'." + did_you_mean(type_name, LAYERS, "layer types"),
        )
    return cls


def create_layer(param, backend, dtype=np.float32, phase="TRAIN"):
    """Instantiate the registered class for ``param.type`` (after minicaffe.checks)."""
    cls = layer_class(param.type, param.name)
    check_layer_param(param)
    return cls(param, backend=backend, dtype=dtype, phase=phase)


class Layer:
    type = None
    min_bottom, max_bottom = 0, None
    min_top, max_top = 0, None
    is_loss = False
    #: Caffe's AutoTopBlobs: the Net creates anonymous tops up to ``min_top`` if the prototxt names fewer
    auto_top_blobs = False
    #: whose data backward reads: "bottom", "top", "both" (safe) or "none" (the memory planner)
    backward_reads = "both"
    #: recompute in backward what would otherwise be kept from forward (less memory)
    recompute = False
    #: check inputs on the device and raise when ``check_deferred()`` asks, instead of reading a
    #: flag on the host inside forward (a step that must not wait for the host: Net.set_deferred_checks)
    deferred_checks = False

    def __init__(self, param, backend=None, dtype=np.float32, phase="TRAIN"):
        if backend is None:
            from . import backend as _backend

            backend = _backend.get()
        self.param = param
        self.name = param.name
        self.backend = backend
        self.xp = backend.xp
        self.dtype = np.dtype(dtype)
        self.phase = phase
        self.blobs = []  # learnable parameters, in Caffe's order (weights, bias, ...)
        self.param_propagate_down = []
        self.loss_weights = []

    # -- helpers for subclasses ----------------------------------------------------------------
    def error(self, message):
        """An error naming this layer; ``raise self.error(...)``."""
        return LayerError(self.name, self.type, message)

    def new_blob(self, shape, name=""):
        return Blob(shape, dtype=self.dtype, xp=self.xp, name=name or self.name)

    def allow_force_backward(self, bottom_index):
        """False for inputs no gradient can flow to (labels of a loss layer)."""
        return True

    # -- the contract --------------------------------------------------------------------------
    def setup(self, bottom, top):
        self.check_arity(bottom, top)
        in_place = [(j, tuple(t.shape)) for j, t in enumerate(top) if any(t is b for b in bottom)]
        self.layer_setup(bottom, top)
        self.reshape(bottom, top)
        for j, before in in_place:  # a layer computed in place must not change its blob's shape
            if tuple(top[j].shape) != before:
                raise self.error(
                    f"cannot compute in place: top {j} is also its bottom, and it would reshape that "
                    f"blob from {before} to {tuple(top[j].shape)}; give the top its own name"
                )
        self.set_loss_weights(top)

    def check_arity(self, bottom, top):
        for what, blobs, lo, hi in (
            ("bottom", bottom, self.min_bottom, self.max_bottom),
            ("top", top, self.min_top, self.max_top),
        ):
            n = len(blobs)
            if n < lo or (hi is not None and n > hi):
                want = f"exactly {lo}" if lo == hi else (f"at least {lo}" if hi is None else f"{lo} to {hi}")
                raise self.error(f"takes {want} {what} blob(s), got {n}")

    def layer_setup(self, bottom, top):
        """Read the layer's parameters and create its parameter blobs (once)."""

    def reshape(self, bottom, top):
        raise NotImplementedError(f"{type(self).__name__}.reshape")

    def forward(self, bottom, top):
        raise NotImplementedError(f"{type(self).__name__}.forward")

    def backward(self, top, propagate_down, bottom):
        """Default: a layer with nothing to propagate (data layers, Silence, Accuracy)."""

    def scratch(self):
        """[Scratch(name, flat array, attach(flat), span)] for the work arrays kept between calls."""
        return []

    # -- lanes: the step plan's per-image calls (see the module docstring) ----------------------
    def lanes_ok(self, bottom, top):
        """Can the plan run this layer on slices of the batch?  (Default: no.)"""
        return False

    def prepare_lanes(self, bottom, top, parts, backward):
        """Size the work buffers for ``parts`` before the lanes start (default: none needed)."""

    def forward_images(self, lane, a, b, bottom, top):
        raise NotImplementedError(f"{type(self).__name__}.forward_images")

    def backward_images(self, lane, a, b, top, propagate_down, bottom):
        raise NotImplementedError(f"{type(self).__name__}.backward_images")

    def reduce_lanes(self, parts):
        """Add the partial parameter gradients of lanes 1.. into the diffs (default: none kept)."""

    #: True: the step plan calls ``backward_params`` on every lane after all lanes' ``backward_images``
    params_after_lanes = False

    def backward_params(self, lane, parts, top, bottom):
        """Lane ``lane``'s share of the parameter gradients over the whole batch (``params_after_lanes``)."""
        raise NotImplementedError(f"{type(self).__name__}.backward_params")

    # -- loss ----------------------------------------------------------------------------------
    def set_loss_weights(self, top):
        weights = list(self.param.loss_weight)
        if weights and len(weights) != len(top):
            raise self.error(f"loss_weight given {len(weights)} time(s) but the layer has {len(top)} top(s)")
        if not weights:
            weights = [1.0 if (self.is_loss and i == 0) else 0.0 for i in range(len(top))]
        self.loss_weights = [float(w) for w in weights]
        for w, t in zip(self.loss_weights, top):
            if w != 0.0:
                # As in Caffe, a loss top carries its weight in its diff: backward reads it there.
                t.dev_diff[...] = w

    def forward_loss(self, bottom, top):
        """Reshape, forward, and return this layer's weighted loss (Caffe's Layer::Forward): a
        Python float (on a GPU, one counted copy of the scalar to the host)."""
        self.reshape(bottom, top)
        self.forward(bottom, top)
        loss = self.device_loss(top)
        return 0.0 if loss is None else float(self.backend.to_host(loss))

    def device_loss(self, top):
        """This layer's weighted loss, sum over its tops of data . diff, as a 0-d array of the
        backend's (None when it has no loss top): nothing is read by the host."""
        loss = None
        for w, t in zip(self.loss_weights, top):
            if w != 0.0:
                if t.count == 1:  # a scalar loss (every loss layer's): one product, one launch
                    v = self.xp.multiply(t.dev_flat_data, t.dev_flat_diff).reshape(())
                else:
                    v = (t.dev_data * t.dev_diff).sum()
                loss = v if loss is None else loss + v
        return loss

    def check_deferred(self):
        """Raise what a check deferred by ``deferred_checks`` found (default: nothing to check)."""

    def __repr__(self):
        return f"<{type(self).__name__} '{self.name}'>"
