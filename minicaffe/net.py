"""Net: a directed acyclic graph of layers built from a NetParameter (Caffe's net.cpp).

Building a net, in Caffe's order:

1. read the prototxt (or take a parsed NetParameter) and upgrade legacy forms (V1 ``layers``,
   ``input_dim``);
2. keep the layers whose include/exclude rules match the net's state (phase, level, stages);
3. turn ``input``/``input_shape`` into an Input layer, and insert Split layers wherever one blob
   feeds several layers (each consumer then gets its own diff, and Split sums them backward);
4. create each layer, connect its bottoms to blobs produced earlier (a top named like its bottom
   is computed in place, in the same Blob) and set it up;
5. register parameters: ``param { name: ... }`` shares a blob between layers (data and diff, so
   gradients from every user sum); ``lr_mult``/``decay_mult`` are kept per learnable parameter;
6. decide which layers need backward: a layer needs it if a bottom needs it or one of its
   parameters learns (lr_mult != 0); then layers that do not contribute to any loss are pruned
   (``force_backward`` keeps all).

The result is run forward (``forward``), backward (``backward``), or both (``forward_backward``);
each layer's ``forward`` is preceded by its ``reshape``, so inputs may change shape between calls.

Where runtimes and tools join a net (declared, never patched):

- public vectors, as Caffe's ``bottom_vecs()`` / ``top_vecs()``: ``net.bottom_vecs[l]`` and
  ``net.top_vecs[l]`` (layer l's bottom and top Blobs), ``net.layer_names``, ``net.blob_names``;
  ``net.param_layer_indices[i]`` (the layer that owns learnable parameter i: its gradient is
  complete once that layer's backward has run) and ``net.layer_param_indices[l]`` (the reverse);
- per-layer hooks, ``handle = net.add_hooks(before_forward=f, after_backward=g, ...)``: each
  hook is called with a layer index; ``handle.remove()`` takes them out again.  With no hook
  registered the loops run exactly as without them.
"""

import os
from collections import OrderedDict

import numpy as np

from . import backend as _backend
from .blob import Blob
from .errors import LayerError, MinicaffeError, NetError, did_you_mean
from .layer import create_layer
from .parallel import plan

TRAIN, TEST = "TRAIN", "TEST"
#: the per-layer hook points of ``Net.add_hooks``
HOOK_KINDS = ("before_forward", "after_forward", "before_backward", "after_backward")
_PHASES = {0: TRAIN, 1: TEST, "TRAIN": TRAIN, "TEST": TEST, "train": TRAIN, "test": TEST}


def normalize_phase(phase):
    try:
        return _PHASES[phase]
    except (KeyError, TypeError):
        raise MinicaffeError(f"phase must be caffe.TRAIN or caffe.TEST, got {phase!r}") from None


def load_net_param(source):
    """A NetParameter Message from a path, a Message, or prototxt text (upgraded)."""
    from . import proto

    if isinstance(source, proto.Message):
        param = source.copy()
    elif isinstance(source, (str, os.PathLike)) and (
        os.path.exists(source) or "\n" not in str(source) and str(source).endswith(".prototxt")
    ):
        param = proto.parse_file(os.fspath(source), "NetParameter")
    elif isinstance(source, str) and ("{" in source or ":" in source):
        param = proto.parse(source, "NetParameter", filename="<string>")
    else:
        raise MinicaffeError(f"net definition not found: '{source}' (no such file)")
    return proto.upgrade_net(param)


# -- step 2: phase / level / stage filtering ----------------------------------------------------
def _rule_met(rule, phase, level, stages):
    if rule.has("phase") and rule.phase != phase:
        return False
    if rule.has("min_level") and level < rule.min_level:
        return False
    if rule.has("max_level") and level > rule.max_level:
        return False
    if any(s not in stages for s in rule.stage):
        return False
    if any(s in stages for s in rule.not_stage):
        return False
    return True


def filter_layers(layers, phase, level=0, stages=()):
    kept = []
    for lp in layers:
        if lp.include and lp.exclude:
            raise NetError(f"layer '{lp.name}' specifies both include and exclude rules; Caffe allows one kind")
        if lp.include:
            keep = any(_rule_met(r, phase, level, stages) for r in lp.include)
        else:
            keep = not any(_rule_met(r, phase, level, stages) for r in lp.exclude)
        if keep:
            kept.append(lp)
    return kept


# -- step 3: inputs and splits -------------------------------------------------------------------
def _input_layer(net_param):
    """Caffe's UpgradeNetInput: `input: "data" input_shape {...}` -> an Input layer at the front."""
    from . import proto

    names = list(net_param.input)
    if not names:
        return []
    shapes = list(net_param.input_shape)
    if len(shapes) not in (0, 1, len(names)):
        raise NetError(
            f"the net has {len(names)} input(s) but {len(shapes)} input_shape(s); give one input_shape per input"
        )
    if not shapes:
        raise NetError(f"input(s) {names} have no input_shape (or input_dim)")
    lp = proto.Message("LayerParameter", name="input", type="Input")
    lp.top.extend(names)
    ip = lp.get_or_create("input_param")
    for s in shapes:
        ip.add("shape").dim.extend(list(s.dim))
    return [lp]


def split_blob_name(layer_name, blob_name, top_index, split_index):
    return f"{blob_name}_{layer_name}_{top_index}_split_{split_index}"


def insert_splits(layers):
    """Give every consumer of a multiply-used blob its own copy (Caffe's InsertSplits)."""
    from . import proto

    last_producer = {}  # blob name -> (layer index, top index)
    consumers = {}  # (layer index, top index) -> number of bottoms reading it
    source_of = {}  # (layer index, bottom index) -> (layer index, top index)
    loss_of = {}  # (layer index, top index) -> loss weight
    for i, lp in enumerate(layers):
        for j, b in enumerate(lp.bottom):
            if b not in last_producer:
                continue  # reported later by the net, with the layer's name
            src = last_producer[b]
            source_of[(i, j)] = src
            consumers[src] = consumers.get(src, 0) + 1
        for j, t in enumerate(lp.top):
            last_producer[t] = (i, j)
            if j < len(lp.loss_weight) and lp.loss_weight[j] != 0:
                loss_of[(i, j)] = lp.loss_weight[j]
    if not any(n > 1 for n in consumers.values()):
        return layers
    split_next = {}
    out = []
    for i, lp in enumerate(layers):
        lp = lp.copy()
        for j, b in enumerate(list(lp.bottom)):
            src = source_of.get((i, j))
            if src is not None and consumers[src] > 1:
                k = split_next.get(src, 0)
                split_next[src] = k + 1
                lp.bottom[j] = split_blob_name(layers[src[0]].name, b, src[1], k)
        out.append(lp)
        for j, t in enumerate(lp.top):
            n = consumers.get((i, j), 0)
            if n > 1:
                sp = proto.Message("LayerParameter", name=f"{t}_{lp.name}_{j}_split", type="Split")
                sp.bottom.append(t)
                sp.top.extend(split_blob_name(lp.name, t, j, k) for k in range(n))
                w = loss_of.get((i, j))
                if w:
                    # the loss weight moves to the split's first top (Caffe's ConfigureSplitLayer)
                    sp.loss_weight.extend([w] + [0.0] * (n - 1))
                    lp.loss_weight[j] = 0.0
                out.append(sp)
    return out


class Net:
    """A net: ``Net(prototxt, phase)``, ``Net(prototxt, weights, phase)`` or keywords
    ``Net(prototxt, phase=TEST, weights=..., level=0, stages=(), dtype=np.float32)``.

    pycaffe-compatible attributes: ``blobs`` (name -> Blob), ``params`` (layer name -> [Blob]),
    ``layers``, ``layer_dict``, ``inputs``, ``outputs``, ``top_names``, ``bottom_names``,
    ``blob_loss_weights``; methods ``forward``, ``backward``, ``reshape``, ``save``, ``copy_from``.
    """

    def __init__(self, network, *args, phase=None, weights=None, level=0, stages=(), dtype=np.float32, backend=None):
        if args:
            if len(args) == 1:
                phase = args[0] if phase is None else phase
            elif len(args) == 2:
                weights, phase = args
            else:
                raise MinicaffeError("Net(prototxt, phase) or Net(prototxt, weights, phase)")
        if isinstance(phase, (str, os.PathLike)) and normalize_phase_or_none(phase) is None:
            weights, phase = phase, None  # Net(prototxt, weights) without a phase
        if phase is None:
            raise MinicaffeError("Net needs a phase: caffe.TRAIN or caffe.TEST")
        self.phase = normalize_phase(phase)
        self.backend = backend if backend is not None else _backend.get()
        self.xp = self.backend.xp
        self.dtype = np.dtype(dtype)
        self.param = load_net_param(network)
        self.name = self.param.name
        self.source = os.fspath(network) if isinstance(network, (str, os.PathLike)) else "<message>"
        stages = tuple(stages or ()) + tuple(self.param.state.stage)
        level = level or self.param.state.level
        self._hooks = {kind: [] for kind in HOOK_KINDS}
        self._forward_hooked = self._backward_hooked = False
        self._plan = None  # the step plan (minicaffe/parallel/plan.py), built on first use
        self._build(level, stages)
        # on a GPU backend: compile the engine's kernels for this dtype now, so that no launch
        # inside a step compiles (once per dtype and process; cpu: nothing to do)
        self.backend.precompile(self.dtype)
        if weights is not None:
            self.copy_from(weights)

    # -- construction: Caffe's Net::Init, one named step each ----------------------------------
    def _build(self, level, stages):
        layer_params = _input_layer(self.param) + filter_layers(self.param.layer, self.phase, level, stages)
        layer_params = insert_splits(layer_params)
        self._start_build()
        for lp in layer_params:
            self._add_layer(lp)
        self._prune_backward()
        self._index()

    def _start_build(self):
        self.layers, self.layer_names = [], []
        self.bottom_ids, self.top_ids = [], []  # per layer: indices into self.blob_list
        self.blob_list, self.blob_names, self._blob_index = [], [], {}
        self.blobs = OrderedDict()
        self.blob_loss_weights = OrderedDict()
        self._available = OrderedDict()  # blob name -> index, produced and not consumed
        self._blob_need_backward = []
        self.layer_need_backward, self.bottom_need_backward = [], []
        self.params_owner = []  # flat list over (layer, param index)
        self.learnable_params, self.params_lr, self.params_weight_decay = [], [], []
        self.param_layer_indices = []  # learnable param i -> the index of the layer that owns it
        self._param_by_name = {}  # param { name } -> index into learnable_params
        self._owner_lr_set = []  # did the owner's prototxt give lr_mult explicitly?
        self.inputs = []
        self.duplicate_layer_names = []

    def _add_layer(self, lp):
        """Create one layer, connect it to the blobs so far, set it up, register its parameters."""
        if lp.name in self.layer_names:
            # Caffe allows it (examples/mnist/mnist_autoencoder.prototxt has two "loss" layers);
            # by-name lookups (layer_dict, params, weight files) then see the last one, as in pycaffe.
            self.duplicate_layer_names.append(lp.name)
        layer = create_layer(lp, self.backend, self.dtype, self.phase)
        bids = self._connect_bottoms(lp)
        top_names = list(lp.top)
        if layer.auto_top_blobs and len(top_names) < layer.min_top:
            top_names += [f"(automatic){lp.name}_{k}" for k in range(len(top_names), layer.min_top)]
        tids = self._connect_tops(lp, top_names, bids)
        bottoms = [self.blob_list[i] for i in bids]
        tops = [self.blob_list[i] for i in tids]
        try:
            layer.setup(bottoms, tops)
        except MinicaffeError:
            raise
        except Exception as exc:  # a layer bug or a shape numpy rejected: name the layer
            shapes = ", ".join(str(b.shape) for b in bottoms)
            raise LayerError(
                lp.name, lp.type, f"setup failed with bottom shapes [{shapes}]: {type(exc).__name__}: {exc}"
            ) from exc
        for j, w in enumerate(layer.loss_weights):
            if w != 0:
                self.blob_loss_weights[top_names[j]] = w
        self.layers.append(layer)
        self.layer_names.append(lp.name)
        self.bottom_ids.append(bids)
        self.top_ids.append(tids)
        param_need_bw = self._append_params(layer, lp)
        need_bw = any(self._blob_need_backward[i] for i in bids) or param_need_bw
        for i in tids:
            self._blob_need_backward[i] = need_bw
        self.layer_need_backward.append(need_bw)
        self.bottom_need_backward.append([self._blob_need_backward[i] for i in bids])

    def _connect_bottoms(self, lp):
        """Blob indices of the layer's bottoms (each produced by an earlier layer)."""
        bids = []
        for b in lp.bottom:
            if b not in self.blobs:
                known = list(self.blobs)
                raise LayerError(
                    lp.name,
                    lp.type,
                    f"bottom blob '{b}' is not produced by any earlier layer."
                    + (did_you_mean(b, known, "blobs so far") if known else " No blob exists yet."),
                )
            bids.append(self._blob_index[b])
            self._available.pop(b, None)
        return bids

    def _connect_tops(self, lp, top_names, bids):
        """Blob indices of the layer's tops: new blobs, or its bottom's for in-place computation."""
        tids = []
        for j, t in enumerate(top_names):
            if j < len(lp.bottom) and lp.bottom[j] == t:  # in place
                idx = bids[j]
            elif t in self.blobs:
                if t in lp.bottom:
                    raise LayerError(
                        lp.name,
                        lp.type,
                        f"top '{t}' is bottom {list(lp.bottom).index(t)} but top {j}: "
                        f"in-place computation needs the same position",
                    )
                raise LayerError(
                    lp.name,
                    lp.type,
                    f"top blob '{t}' is produced by an earlier layer too; a blob name may be produced once (or in place)",
                )
            else:
                idx = len(self.blob_list)
                blob = Blob((), dtype=self.dtype, xp=self.xp, name=t)
                self.blob_list.append(blob)
                self.blob_names.append(t)
                self._blob_index[t] = idx
                self.blobs[t] = blob
                self._blob_need_backward.append(False)
                if lp.type == "Input":
                    self.inputs.append(t)
            tids.append(idx)
            self._available[t] = idx
        return tids

    def _prune_backward(self):
        """From the top: only layers under some loss run backward; then propagate_down and
        force_backward, as Caffe."""
        under_loss = set()
        for li in range(len(self.layers) - 1, -1, -1):
            layer = self.layers[li]
            contributes = any(w != 0 for w in layer.loss_weights) or any(
                self.blob_names[t] in under_loss for t in self.top_ids[li]
            )
            if not contributes:
                self.layer_need_backward[li] = False
            if contributes:
                for b in self.bottom_ids[li]:
                    under_loss.add(self.blob_names[b])
            lp = layer.param
            for j in range(len(self.bottom_ids[li])):
                if not contributes:
                    self.bottom_need_backward[li][j] = False
                if j < len(lp.propagate_down) and not lp.propagate_down[j]:
                    self.bottom_need_backward[li][j] = False
        if self.param.force_backward:
            for li, layer in enumerate(self.layers):
                self.layer_need_backward[li] = True
                for j in range(len(self.bottom_ids[li])):
                    self.bottom_need_backward[li][j] = layer.allow_force_backward(j)

    def _index(self):
        """The by-name views (pycaffe's) and the per-layer vectors (Caffe's)."""
        self.outputs = list(self._available)
        del self._available, self._blob_need_backward
        names = self.layer_names
        self.layer_dict = OrderedDict(zip(names, self.layers))
        self.top_names = OrderedDict((n, [self.blob_names[i] for i in ids]) for n, ids in zip(names, self.top_ids))
        self.bottom_names = OrderedDict(
            (n, [self.blob_names[i] for i in ids]) for n, ids in zip(names, self.bottom_ids)
        )
        self.params = OrderedDict((n, l.blobs) for n, l in zip(names, self.layers) if l.blobs)
        self.bottom_vecs = [[self.blob_list[i] for i in ids] for ids in self.bottom_ids]
        self.top_vecs = [[self.blob_list[i] for i in ids] for ids in self.top_ids]
        self.layer_param_indices = [[] for _ in self.layers]
        for i, li in enumerate(self.param_layer_indices):
            self.layer_param_indices[li].append(i)

    @property
    def _layer_names(self):
        """pycaffe's name for ``layer_names``."""
        return self.layer_names

    @property
    def _blob_names(self):
        """pycaffe's name for ``blob_names``."""
        return self.blob_names

    def _append_params(self, layer, lp):
        """Register layer's parameter blobs (Caffe's AppendParam); True if any of them learns."""
        layer.param_propagate_down = []
        for pi, pblob in enumerate(layer.blobs):
            spec = lp.param[pi] if pi < len(lp.param) else None
            lr = spec.lr_mult if spec is not None else 1.0
            decay = spec.decay_mult if spec is not None else 1.0
            lr_given = spec is not None and spec.has("lr_mult")
            pname = spec.name if spec is not None else ""
            pblob.name = f"{lp.name}[{pi}]"
            owner = self._param_by_name.get(pname) if pname else None
            if owner is None:
                owner = len(self.learnable_params)
                self.learnable_params.append(pblob)
                self.params_lr.append(lr)
                self.params_weight_decay.append(decay)
                self._owner_lr_set.append(lr_given)
                self.params_owner.append(None)
                self.param_layer_indices.append(len(self.layers) - 1)
                if pname:
                    self._param_by_name[pname] = owner
            else:
                owner_blob = self.learnable_params[owner]
                permissive = spec.share_mode == "PERMISSIVE"
                if (owner_blob.count != pblob.count) if permissive else (owner_blob.shape != pblob.shape):
                    raise LayerError(
                        lp.name,
                        lp.type,
                        f"shared parameter '{pname}' has shape {pblob.shape} "
                        f"here but {owner_blob.shape} in the layer that owns it",
                    )
                pblob.share_data(owner_blob)
                pblob.share_diff(owner_blob)
                self.params_owner.append(owner)
                if lr_given:
                    if self._owner_lr_set[owner] and self.params_lr[owner] != lr:
                        raise LayerError(
                            lp.name,
                            lp.type,
                            f"shared parameter '{pname}' has lr_mult {lr} here "
                            f"but {self.params_lr[owner]} in the layer that owns it",
                        )
                    self.params_lr[owner], self._owner_lr_set[owner] = lr, True
                lr = self.params_lr[owner]
            layer.param_propagate_down.append(lr != 0)
        return any(layer.param_propagate_down)

    # -- running -----------------------------------------------------------------------------------
    def _layer_index(self, name, what):
        if name is None:
            return None
        if isinstance(name, int):
            return name
        try:
            return self.layer_names.index(name)
        except ValueError:
            raise NetError(
                f"{what}: no layer named '{name}' in net '{self.name}'."
                + did_you_mean(name, self.layer_names, "layers")
            ) from None

    def forward_from_to(self, start=0, end=None):
        """Run layers start..end (inclusive); return the summed weighted loss.  With more than one
        lane (minicaffe/parallel/lanes.py) the step plan runs its segments of per-image layers in
        the lanes, one task per lane for each (``step_plan``)."""
        end = len(self.layers) - 1 if end is None else end
        if self.uses_step_plan():
            return self._plan.forward(start, end)
        if self._forward_hooked:
            return self._forward_hooked_from_to(start, end)
        loss = 0.0
        layers, bottoms, tops = self.layers, self.bottom_vecs, self.top_vecs
        for i in range(start, end + 1):
            loss += layers[i].forward_loss(bottoms[i], tops[i])
        return loss

    def forward_device(self, start=0, end=None):
        """Run layers start..end like ``forward_from_to``, but return the summed weighted loss as
        a 0-d array of the backend's, read by nothing: with ``set_deferred_checks(True)`` a
        forward on a GPU then waits for the host nowhere (what a CUDA-graph capture needs)."""
        end = len(self.layers) - 1 if end is None else end
        loss = None
        before, after = self._hooks["before_forward"], self._hooks["after_forward"]
        for i in range(start, end + 1):
            for hook in before:
                hook(i)
            layer, top = self.layers[i], self.top_vecs[i]
            layer.reshape(self.bottom_vecs[i], top)
            layer.forward(self.bottom_vecs[i], top)
            v = layer.device_loss(top)
            if v is not None:
                loss = v if loss is None else loss + v
            for hook in after:
                hook(i)
        return self.xp.zeros((), self.dtype) if loss is None else loss

    def set_deferred_checks(self, on=True):
        """Layers that check their inputs on the host in forward (SoftmaxWithLoss's labels) check
        them on the device instead, and raise when ``check_deferred()`` is called."""
        for layer in self.layers:
            layer.deferred_checks = bool(on)

    def check_deferred(self):
        """Raise the first problem a deferred check found (LayerError naming the layer), reading
        each checking layer's flag (on a GPU: one small copy each)."""
        for layer in self.layers:
            layer.check_deferred()

    def backward_from_to(self, start=None, end=0):
        start = len(self.layers) - 1 if start is None else start
        if self.uses_step_plan():
            return self._plan.backward(start, end)
        if self._backward_hooked:
            return self._backward_hooked_from_to(start, end)
        layers, bottoms, tops, need = self.layers, self.bottom_vecs, self.top_vecs, self.layer_need_backward
        for i in range(start, end - 1, -1):
            if need[i]:
                layers[i].backward(tops[i], self.bottom_need_backward[i], bottoms[i])

    # -- hooks: where runtimes and tools join the loops ------------------------------------------
    def add_hooks(self, before_forward=None, after_forward=None, before_backward=None, after_backward=None):
        """Call functions of a layer index around each layer's forward and backward.

        ``before_forward(l)``: before layer l's reshape + forward (a runtime may wait here for
        layer l's fresh parameters); ``after_forward(l)``: right after it.
        ``before_backward(l)`` / ``after_backward(l)``: around layer l's backward, only for
        layers that run backward; after it, layer l's parameter gradients are complete for the
        parameters it owns (``layer_param_indices[l]``): wait-free backprop sends them here.
        Hooks of one kind run in the order they were added.  Returns a :class:`HookHandle`;
        ``handle.remove()`` (or leaving ``with net.add_hooks(...):``) takes them out.
        """
        given = {
            "before_forward": before_forward,
            "after_forward": after_forward,
            "before_backward": before_backward,
            "after_backward": after_backward,
        }
        for kind, fn in given.items():
            if fn is not None and not callable(fn):
                raise NetError(f"add_hooks: {kind} must be a function of a layer index, got {type(fn).__name__}")
        handle = HookHandle(self, {k: f for k, f in given.items() if f is not None})
        for kind, fn in handle.hooks.items():
            self._hooks[kind].append(fn)
        self._hooks_changed()
        return handle

    def remove_hooks(self, handle):
        """Take out the hooks ``add_hooks`` returned ``handle`` for (``handle.remove()`` calls this)."""
        for kind, fn in handle.hooks.items():
            hooks = self._hooks[kind]
            for k, h in enumerate(hooks):
                if h is fn:
                    del hooks[k]
                    break
        self._hooks_changed()

    def _hooks_changed(self):
        h = self._hooks
        self._forward_hooked = bool(h["before_forward"] or h["after_forward"])
        self._backward_hooked = bool(h["before_backward"] or h["after_backward"])

    def hooks(self, kind):
        """The functions registered for hook point ``kind`` (one of HOOK_KINDS), in order."""
        return self._hooks[kind]

    def forward_layer(self, i):
        """Layer i's reshape + forward with its hooks around it; its weighted loss."""
        for hook in self._hooks["before_forward"]:
            hook(i)
        loss = self.layers[i].forward_loss(self.bottom_vecs[i], self.top_vecs[i])
        for hook in self._hooks["after_forward"]:
            hook(i)
        return loss

    def backward_layer(self, i):
        """Layer i's backward with its hooks around it (nothing if it needs no backward)."""
        if self.layer_need_backward[i]:
            for hook in self._hooks["before_backward"]:
                hook(i)
            self.layers[i].backward(self.top_vecs[i], self.bottom_need_backward[i], self.bottom_vecs[i])
            for hook in self._hooks["after_backward"]:
                hook(i)

    def step_plan(self):
        """The net's :class:`~minicaffe.parallel.plan.StepPlan`, built on first use: which runs
        of consecutive per-image layers the lanes run as one segment each (none on a GPU)."""
        if self._plan is None:
            self._plan = plan.StepPlan(self)
        return self._plan

    def uses_step_plan(self):
        """Do forward and backward run through the step plan now?  With more than one lane, the
        plan switched on (``minicaffe.parallel.plan.set_enabled``) and at least one segment."""
        return bool(self.step_plan().running())

    def _forward_hooked_from_to(self, start, end):
        return sum((self.forward_layer(i) for i in range(start, end + 1)), 0.0)

    def _backward_hooked_from_to(self, start, end):
        for i in range(start, end - 1, -1):
            self.backward_layer(i)

    def _set_inputs(self, arrays, what):
        for name, value in arrays.items():
            if name not in self.blobs:
                raise NetError(
                    f"{what}: '{name}' is not a blob of net '{self.name}'." + did_you_mean(name, self.blobs, "blobs")
                )
            blob = self.blobs[name]
            value = np.asarray(value) if not hasattr(value, "shape") else value
            if tuple(value.shape) != blob.shape:
                raise NetError(
                    f"{what}: blob '{name}' has shape {blob.shape} but the array given has shape "
                    f"{tuple(value.shape)}; call net.blobs['{name}'].reshape(...) and net.reshape() first"
                )
            # a host array overwrites the host side (one copy to the device, on a GPU, when the
            # engine next reads the blob: Blob's SyncedMemory); a device array (CuPy's on cuda)
            # is copied on the device, never through the host
            if what == "forward":
                blob.data = value
            else:
                blob.diff = value

    def forward(self, blobs=None, start=None, end=None, **kwargs):
        """pycaffe's forward: set inputs from keyword arrays, run, return {output: array}."""
        self._set_inputs(kwargs, "forward")
        s = self._layer_index(start, "forward(start=)") or 0
        e = self._layer_index(end, "forward(end=)")
        self.forward_from_to(s, e)
        outs = list(self.top_names[self.layer_names[e]]) if e is not None else list(self.outputs)
        outs += [b for b in (blobs or []) if b not in outs]
        return {name: self.blobs[name].data for name in outs}

    def backward(self, diffs=None, start=None, end=None, **kwargs):
        """pycaffe's backward: set output diffs from keywords, run, return {input: diff}."""
        self._set_inputs(kwargs, "backward")
        s = self._layer_index(start, "backward(start=)")
        e = self._layer_index(end, "backward(end=)") or 0
        self.backward_from_to(s, e)
        outs = list(self.bottom_names[self.layer_names[e]]) if end is not None else list(self.inputs)
        outs += [b for b in (diffs or []) if b not in outs]
        return {name: self.blobs[name].diff for name in outs}

    def forward_backward(self):
        loss = self.forward_from_to()
        self.backward_from_to()
        return loss

    def set_input_arrays(self, data, labels, layer=None):
        """pycaffe's set_input_arrays: feed a MemoryData layer (the first one, or ``layer``)."""
        targets = [l for l in self.layers if l.type == "MemoryData" and (layer is None or l.name == layer)]
        if not targets:
            raise NetError(
                f"set_input_arrays: net '{self.name}' has no MemoryData layer" + (f" named '{layer}'" if layer else "")
            )
        targets[0].set_input_arrays(data, labels)

    def clear_param_diffs(self):
        for p in self.learnable_params:
            p.dev_flat_diff[...] = 0

    def reshape(self):
        for i, layer in enumerate(self.layers):
            layer.reshape(self.bottom_vecs[i], self.top_vecs[i])

    def share_with(self, other):
        """Use other's trained parameters (Caffe's ShareTrainedLayersWith): by layer name."""
        for name, layer in zip(self.layer_names, self.layers):
            src = other.layer_dict.get(name)
            if src is None or not layer.blobs:
                continue
            if len(src.blobs) != len(layer.blobs):
                raise NetError(
                    f"share_with: layer '{name}' has {len(layer.blobs)} parameter blobs here "
                    f"but {len(src.blobs)} in the other net"
                )
            for i, (mine, theirs) in enumerate(zip(layer.blobs, src.blobs)):
                if mine.shape != theirs.shape:
                    raise NetError(
                        f"share_with: layer '{name}' parameter {i} has shape {mine.shape} "
                        f"here but {theirs.shape} in the other net"
                    )
                mine.share_data(theirs)

    # -- weights -------------------------------------------------------------------------------------
    def save(self, path):
        from . import io

        io.save_weights(self, path)

    def copy_from(self, path, log=None, strict=False):
        """Copy parameters by layer name from a .caffemodel or .npz; returns the
        :class:`~minicaffe.io.WeightsReport` (copied, ignored, missing layers), whose lines go to
        ``log`` (default: stderr, as Caffe's log, when a layer is ignored or missing)."""
        from . import io

        report = io.load_weights(self, path, strict=strict)
        if log is not None or report.ignored or report.missing:
            for line in report.lines():
                (log or io.stderr_log)(line)
        return report

    def __repr__(self):
        return f"<Net '{self.name}' {self.phase}: {len(self.layers)} layers, {len(self.blobs)} blobs>"


class HookHandle:
    """What ``Net.add_hooks`` returns: ``remove()`` takes the hooks out (twice is harmless);
    usable as a context manager."""

    def __init__(self, net, hooks):
        self.net, self.hooks = net, hooks
        self.removed = False

    def remove(self):
        if not self.removed:
            self.removed = True
            self.net.remove_hooks(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()
        return False


def normalize_phase_or_none(value):
    try:
        return _PHASES[value]
    except (KeyError, TypeError):
        return None
