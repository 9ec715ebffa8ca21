"""Solver: Caffe's training loop (solver.cpp), shared by every update rule.

A solver owns a training net and its test nets (built from the solver prototxt), and runs::

    step(n):  for each iteration
                  test all test nets      (every test_interval, and at 0 if test_initialization)
                  clear parameter diffs   (unless the gradient source overwrites them)
                  callbacks: on_start(solver)
                  loss = mean over iter_size of gradient_source()   (net.forward_backward();
                                                                     gradients accumulate)
                  display (every `display` iterations: smoothed loss, outputs, lr)
                  callbacks: on_gradients_ready(solver)
                  apply_update():  lr = policy(iter); updater(solver, lr), by default
                                   local_update: clip gradients; per parameter:
                                   normalize (1/iter_size) -> regularize (L2/L1 decay) ->
                                   compute_update_value (the rule: SGD, Adam, ...) ; data -= diff
                  iter += 1; callbacks: on_iteration(solver, loss, lr)
                  snapshot every `snapshot` iterations (callbacks: on_snapshot(solver, weights, state))

Where runtimes join a solver (declared seams; a runtime never replaces a solver's methods):

- **callbacks** (Caffe's ``Solver::Callback``): ``solver.add_callback(cb)`` /
  ``remove_callback(cb)``.  ``cb`` may define any of ``on_start(solver)`` (each iteration, after
  the diffs are cleared, before its gradients are computed), ``on_gradients_ready(solver)`` (the
  iteration's gradients, summed over iter_size, are in the learnable parameters' diffs; the
  update has not run), ``on_iteration(solver, loss, lr)`` (after the update; ``solver.iter`` is
  the next iteration), ``on_test_start(solver, index)`` (before test net ``index`` runs),
  ``on_test(solver, index, result)`` and ``on_snapshot(solver, weights, state)``.  Callbacks run
  in the order they were added.  The lists ``solver.on_iteration``, ``on_test_start``, ``on_test``
  and ``on_snapshot`` take plain functions of the same arguments; they run after the callback
  objects.
- **the gradient source**: ``solver.set_gradient_source(fn)``: ``fn()`` computes one batch's
  loss and leaves its gradients *added* to the parameters' diffs (the default is
  ``net.forward_backward``; the threaded runtime's gathers the workers' gradients).
  ``set_gradient_source(fn, overwrites=True)`` declares that ``fn`` *writes* every learnable
  parameter's diff whatever it held, so the loop does not clear the diffs before it (with
  iter_size 1 only: iter_size batches must add up).  Callbacks see the difference in one place:
  ``on_start`` then finds the previous iteration's diffs instead of zeros; from the source's
  return on, the diffs are what the default loop leaves.  ``set_gradient_source(None)``
  restores the default.
- **the updater**: ``solver.set_updater(fn)``: ``fn(solver, rate)`` applies the iteration's
  update to the parameters, e.g. through a remote parameter server.  The default is
  :meth:`Solver.local_update` (clip gradients, then ``update_parameter(i, rate)`` for every
  learnable parameter).  ``set_updater(None)`` restores it.
- **data layers** (``minicaffe.layers.data_base.DataLayer``): the solver finds them by type and
  saves and restores their ``state_dict()`` in its snapshots.

Subclasses implement ``compute_update_value(i, rate)`` (turn ``param.diff`` into the step) and
name their history buffers.  Snapshots: weights as ``<prefix>_iter_<N>.caffemodel`` (Caffe's
binary format) and the solver state as ``<prefix>_iter_<N>.solverstate``.  By default the state is
an .npz (history arrays + a JSON record of the iteration, the RNG and the data readers' positions;
no pickle), because an exact resume needs the RNG and reader positions that Caffe's format has no
field for; ``snapshot_format: BINARYPROTO`` set in the solver writes Caffe's SolverState instead,
and ``restore`` reads either (``caffe_state.py``).
"""

import hashlib
import json
import math
import os
import re
import time

import numpy as np

from .. import rng as _rng
from ..checks import explain_nonfinite
from ..errors import MinicaffeError, SolverError, WeightsError
from ..io import ZIP_MAGIC, atomic_write, file_sha256, open_npz, read_npz_member, save_weights
from ..layers.data_base import DataLayer
from ..net import TEST, TRAIN, Net, load_net_param
from . import caffe_state, lr_policy

STATE_FORMAT = "minicaffe-solverstate-1"
#: what a callback object given to ``Solver.add_callback`` may define (Caffe's Solver::Callback + three)
CALLBACK_METHODS = ("on_start", "on_gradients_ready", "on_iteration", "on_test_start", "on_test", "on_snapshot")
MAX_ITER = 2**31 - 1  # Caffe's iteration counter is an int
MAX_RECORD_BYTES = 64 << 20  # a record holds a loss window, RNG and reader positions: far less


def load_solver_param(source):
    """A SolverParameter from a path or a Message, upgraded; remembers the file's directory."""
    from .. import proto

    if isinstance(source, proto.Message):
        return proto.upgrade_solver(source.copy()), os.getcwd()
    path = os.fspath(source)
    if not os.path.exists(path):
        raise SolverError(f"solver file not found: {path}")
    param = proto.upgrade_solver(proto.parse_file(path, "SolverParameter"))
    return param, os.path.dirname(os.path.abspath(path))


def resolve_path(path, base_dir, what):
    """Caffe resolves paths from the working directory; minicaffe then tries beside the solver."""
    if os.path.exists(path):
        return path
    candidate = os.path.join(base_dir, path)
    if os.path.exists(candidate):
        return candidate
    raise SolverError(f"{what} '{path}' not found (looked in the working directory and in {base_dir})")


class Solver:
    """Base of every solver.  ``Solver(path_or_param)``; ``step(n)``, ``solve()``, ``restore(state)``."""

    type = None
    #: names of the per-parameter history buffers this rule keeps (SGD: one, AdaDelta/Adam: two)
    history_names = ("history",)

    def __init__(self, solver, log=None, backend=None, train_net=None, base_dir=None):
        self.param, self.base_dir = load_solver_param(solver)
        if base_dir is not None:
            self.base_dir = base_dir  # where relative net paths of a Message are looked up
        self.log = log if log is not None else _default_log
        self.backend = backend
        self.iter = 0
        self.current_step = 0
        self.losses, self.smoothed_loss = [], 0.0
        self.on_iteration, self.on_test, self.on_snapshot = [], [], []
        self.callbacks = []
        self._gradient_source = None
        self._source_overwrites = False  # the gradient source writes the diffs: no clearing before it
        self._updater = None
        self.on_test_start = []  # callbacks (solver, test net index) before a test runs
        self._display_mark = None  # (clock, iteration) of the last display line + where step() ended
        self._device_step = None  # enable_graph: minicaffe/solvers/graph.py
        self.requested_stop = False
        self._fields = None  # UpdateFields, during local_update
        p = self.param
        lr_policy.check(p, "solver")
        if p.regularization_type not in ("L1", "L2"):
            raise SolverError(f"solver: unknown regularization_type '{p.regularization_type}'; use L2 or L1")
        if p.iter_size < 1:
            raise SolverError(f"solver: iter_size must be >= 1, got {p.iter_size}")
        if p.random_seed >= 0:
            _rng.set_random_seed(p.random_seed)
        self.check_hyperparameters()
        self.net = train_net if train_net is not None else self._build_train_net()
        self.test_nets = self._build_test_nets()
        self.history = [
            [self.net.xp.zeros_like(b.dev_data) for b in self.net.learnable_params] for _ in self.history_names
        ]
        self.log(
            f"Solver {self.type}: net '{self.net.name}', {len(self.net.learnable_params)} learnable "
            f"blobs, {sum(b.count for b in self.net.learnable_params)} parameters, "
            f"{len(self.test_nets)} test net(s)"
        )

    def check_hyperparameters(self):
        """Rules may refuse settings that make no sense for them (AdaGrad with momentum, ...)."""

    # -- nets ------------------------------------------------------------------------------------
    def _make_net(self, source, phase, state):
        stages = tuple(state.stage) if state is not None else ()
        level = state.level if state is not None else 0
        kwargs = {} if self.backend is None else {"backend": self.backend}
        return Net(source, phase=phase, level=level, stages=stages, **kwargs)

    def _build_train_net(self):
        p = self.param
        given = [f for f in ("net", "net_param", "train_net", "train_net_param") if p.has(f)]
        if len(given) != 1:
            raise SolverError(
                "solver must name exactly one training net (net, net_param, train_net or "
                f"train_net_param); it names {given or 'none'}"
            )
        field = given[0]
        value = getattr(p, field)
        if field in ("net", "train_net"):
            value = resolve_path(value, self.base_dir, f"solver: {field}")
            self.net_path = value
        state = p.train_state if p.has("train_state") else None
        return self._make_net(load_net_param(value), TRAIN, state)

    def _build_test_nets(self):
        p = self.param
        sources = [resolve_path(t, self.base_dir, "solver: test_net") for t in p.test_net]
        sources += [t for t in p.test_net_param]
        n_generic = 0
        if p.has("net") or p.has("net_param"):
            n_generic = max(len(p.test_iter) - len(sources), 0)
            generic = getattr(self, "net_path", None) or p.net_param
            sources += [generic] * n_generic
        if len(p.test_iter) != len(sources):
            raise SolverError(
                f"solver: {len(p.test_iter)} test_iter value(s) for {len(sources)} test net(s); "
                f"give one test_iter per test net"
            )
        states = list(p.test_state)
        if states and len(states) != len(sources):
            raise SolverError(f"solver: {len(states)} test_state(s) for {len(sources)} test net(s)")
        nets = []
        for i, src in enumerate(sources):
            net = self._make_net(load_net_param(src), TEST, states[i] if states else None)
            net.share_with(self.net)
            nets.append(net)
        return nets

    # -- the loop --------------------------------------------------------------------------------
    def learning_rate(self):
        if self.param.lr_policy == "multistep":
            new = lr_policy.advance_multistep(self.param, self.iter, self.current_step)
            if new != self.current_step:
                self.current_step = new
                self.log(f"MultiStep Status: Iteration {self.iter}, step = {self.current_step}")
        return lr_policy.learning_rate(self.param, self.iter, self.current_step)

    # -- seams (see the module docstring) --------------------------------------------------------
    def add_callback(self, callback):
        """Register an object with any of on_start, on_gradients_ready, on_iteration, on_test,
        on_snapshot (Caffe's Solver::Callback); it runs after those added before it."""
        names = [n for n in CALLBACK_METHODS if callable(getattr(callback, n, None))]
        if not names:
            raise SolverError(f"add_callback: {type(callback).__name__} defines none of {', '.join(CALLBACK_METHODS)}")
        if any(cb is callback for cb in self.callbacks):
            raise SolverError(f"add_callback: {callback!r} is already registered")
        self.callbacks.append(callback)

    def remove_callback(self, callback):
        for k, cb in enumerate(self.callbacks):
            if cb is callback:
                del self.callbacks[k]
                return
        raise SolverError(f"remove_callback: {callback!r} is not registered")

    def run_callbacks(self, method, *args):
        """Call ``method`` (one of CALLBACK_METHODS) on every registered callback object that has it."""
        self._call(method, *args)

    def _call(self, method, *args):
        for cb in self.callbacks:
            fn = getattr(cb, method, None)
            if fn is not None:
                fn(self, *args)

    def set_gradient_source(self, fn, overwrites=False):
        """``fn() -> loss`` computes one batch and adds its gradients to the parameters' diffs;
        None restores the default, ``self.net.forward_backward``.  ``overwrites=True``: ``fn``
        writes every learnable parameter's diff (whatever it held), so the loop skips clearing
        them first; such a source cannot accumulate iter_size > 1 batches (``step`` refuses it)."""
        if fn is not None and not callable(fn):
            raise SolverError(f"set_gradient_source: expected a function, got {type(fn).__name__}")
        self._gradient_source = fn
        self._source_overwrites = bool(overwrites) and fn is not None

    @property
    def customized(self):
        """What replaces the default loop's parts: the names of a custom gradient source and
        updater, if set (a runtime's; enable_graph refuses them)."""
        return [n for n, f in (("gradient source", self._gradient_source), ("updater", self._updater)) if f is not None]

    def set_updater(self, fn):
        """``fn(solver, rate)`` applies the update to the parameters; None restores
        :meth:`local_update`."""
        if fn is not None and not callable(fn):
            raise SolverError(f"set_updater: expected a function, got {type(fn).__name__}")
        self._updater = fn

    def forward_backward(self):
        """One batch's loss and gradients, from the gradient source."""
        if self._gradient_source is None:
            return self.net.forward_backward()
        return self._gradient_source()

    def enable_graph(self, mode="graph"):
        """Run each iteration without the host waiting in it (minicaffe/solvers/graph.py):
        ``"graph"`` captures it once as a CUDA graph and replays it (the cuda backend),
        ``"check"`` runs it in capture mode (any host round trip raises: the simulator's proof),
        ``"device"`` keeps the losses on the device.  ``disable_graph()`` goes back."""
        from .graph import DeviceStep

        self.disable_graph()
        self._device_step = DeviceStep(self, mode)
        return self._device_step

    def disable_graph(self):
        if self._device_step is not None:
            self._device_step.close()
            self._device_step = None

    def step(self, iters):
        if self._device_step is not None:
            return self._device_step.run(iters)
        p = self.param
        start_iter, stop_iter = self.iter, self.iter + int(iters)
        average = max(p.average_loss, 1)
        self.losses, self.smoothed_loss = [], 0.0
        if self._display_mark is None or self._display_mark[2] != self.iter:  # not where the last step() ended
            self._display_mark = (time.perf_counter(), self.iter, None)
        if self._source_overwrites and p.iter_size > 1:
            raise SolverError(
                f"iter_size {p.iter_size}: the gradient source overwrites the parameters' diffs "
                f"(set_gradient_source(..., overwrites=True)), so it cannot add up iter_size batches"
            )
        while self.iter < stop_iter and not self.requested_stop:
            if p.test_interval and self.iter % p.test_interval == 0 and (self.iter > 0 or p.test_initialization):
                self.test_all()
            if not self._source_overwrites:  # (a source that overwrites them would undo the clearing)
                self.net.clear_param_diffs()
            self._call("on_start")
            loss = 0.0
            for _ in range(p.iter_size):
                loss += self.forward_backward()
            loss /= p.iter_size
            if not math.isfinite(loss):
                raise SolverError(f"loss is {loss} at iteration {self.iter}: {explain_nonfinite(self.net)}")
            self._update_smoothed_loss(loss, start_iter, average)
            display = p.display and self.iter % p.display == 0
            if display:
                # the pace since the last display line, also when step(1) is called in a loop
                now = time.perf_counter()
                tick, last_iter, _ = self._display_mark
                lapse = now - tick
                rate = (self.iter - last_iter) / lapse if lapse > 0 else 0.0
                self.log(
                    f"Iteration {self.iter} ({rate:.4g} iter/s, {lapse:.4g}s/{p.display} iters), "
                    f"loss = {self.smoothed_loss:.6g}"
                )
                self._display_mark = (now, self.iter, None)
                for line in self._output_lines(self.net, "Train"):
                    self.log(line)
            self._call("on_gradients_ready")
            lr = self.apply_update(display)
            self.iter += 1
            self._call("on_iteration", loss, lr)
            for cb in self.on_iteration:
                cb(self, loss, lr)
            if p.snapshot and self.iter % p.snapshot == 0:
                self.snapshot()
        self._display_mark = self._display_mark[:2] + (self.iter,)

    def solve(self, resume_file=None):
        p = self.param
        self.log(f"Solving {self.net.name}")
        self.log(f"Learning Rate Policy: {p.lr_policy}")
        if resume_file:
            self.restore(resume_file)
        start_iter = self.iter
        self.step(p.max_iter - self.iter)
        if p.snapshot_after_train and (not p.snapshot or self.iter % p.snapshot != 0):
            self.snapshot()
        if self.requested_stop:
            self.log("Optimization stopped early.")
            return
        if p.display and self.iter % p.display == 0:
            loss = self.net.forward_from_to()
            self._update_smoothed_loss(loss, start_iter, max(p.average_loss, 1))
            self.log(f"Iteration {self.iter}, loss = {self.smoothed_loss:.6g}")
        if p.test_interval and self.iter % p.test_interval == 0:
            self.test_all()
        self.log("Optimization Done.")

    def update_smoothed_loss(self, loss, start_iter, average):
        """Fold ``loss`` into the smoothed loss (Caffe's window of ``average`` losses; the slot is
        that of iteration ``self.iter`` counted from ``start_iter``)."""
        self._update_smoothed_loss(loss, start_iter, average)

    def _update_smoothed_loss(self, loss, start_iter, average):
        if len(self.losses) < average:
            self.losses.append(loss)
            n = len(self.losses)
            self.smoothed_loss = (self.smoothed_loss * (n - 1) + loss) / n
        else:
            idx = (self.iter - start_iter) % average
            self.smoothed_loss += (loss - self.losses[idx]) / average
            self.losses[idx] = loss

    def _output_lines(self, net, kind, scores=None):
        lines, k = [], 0
        for name in net.outputs:
            values = scores[name] if scores is not None else np.array(net.blobs[name].cpu_data()).ravel()
            weight = net.blob_loss_weights.get(name, 0.0)
            for v in np.ravel(values):
                msg = f" (* {weight:g} = {weight * v:.6g} loss)" if weight else ""
                lines.append(f"    {kind} net output #{k}: {name} = {v:.6g}{msg}")
                k += 1
        return lines

    def test_all(self):
        results = []
        for i in range(len(self.test_nets)):
            results.append(self.test(i))
        return results

    def test(self, index=0):
        """Run test net ``index`` for test_iter[index] batches; log and return {output: mean}."""
        net, n = self.test_nets[index], self.param.test_iter[index]
        self._call("on_test_start", index)
        for cb in self.on_test_start:
            cb(self, index)
        self.log(f"Iteration {self.iter}, Testing net (#{index})")
        net.share_with(self.net)
        sums = {}
        loss = 0.0
        for _ in range(n):
            loss += net.forward_from_to()
            for name in net.outputs:
                v = np.asarray(net.blobs[name].cpu_data(), dtype=np.float64).ravel()
                sums[name] = sums[name] + v if name in sums else v.copy()
        scores = {name: s / n for name, s in sums.items()}
        if self.param.test_compute_loss:
            self.log(f"Test loss: {loss / n:.6g}")
        for line in self._output_lines(net, "Test", scores):
            self.log(line)
        result = {name: (float(v[0]) if v.size == 1 else v.tolist()) for name, v in scores.items()}
        self._call("on_test", index, result)
        for cb in self.on_test:
            cb(self, index, result)
        return result

    # -- the update ------------------------------------------------------------------------------
    def apply_update(self, display=False):
        rate = self.learning_rate()
        if display:
            self.log(f"Iteration {self.iter}, lr = {rate:.6g}")
        if self._updater is None:
            self.local_update(rate)
        else:
            self._updater(self, rate)
        return rate

    def local_update(self, rate):
        """The default updater: clip gradients, then update every learnable parameter here."""
        self.clip_gradients()
        self._fields = UpdateFields(self.param)
        try:
            for i in range(len(self.net.learnable_params)):
                self.update_parameter(i, rate)
        finally:
            self._fields = None

    @property
    def update_fields(self):
        """The solver fields each parameter's update reads (``UpdateFields``): read once for a
        whole ``local_update``, else now."""
        f = self._fields
        return f if f is not None else UpdateFields(self.param)

    def update_parameter(self, i, rate):
        """Caffe's per-parameter sequence: normalize -> regularize -> the rule -> data -= diff."""
        p = self.net.learnable_params[i]
        self.normalize(i)
        self.regularize(i)
        self.compute_update_value(i, rate)
        p.dev_flat_data[...] -= p.dev_flat_diff

    def clip_gradients(self):
        clip = self.param.clip_gradients
        if clip < 0:
            return
        xp = self.net.xp
        sumsq = sum(float(xp.dot(p.dev_flat_diff, p.dev_flat_diff)) for p in self.net.learnable_params)
        norm = math.sqrt(sumsq)
        if norm > clip:
            scale = clip / norm
            self.log(
                f"Gradient clipping: scaling down gradients (L2 norm {norm:.6g} > {clip:g}) by scale factor {scale:.6g}"
            )
            for p in self.net.learnable_params:
                p.dev_flat_diff[...] *= scale

    def normalize(self, i):
        iter_size = self.update_fields.iter_size
        if iter_size > 1:
            self.net.learnable_params[i].dev_flat_diff[...] *= 1.0 / iter_size

    def regularize(self, i):
        f = self.update_fields
        decay = f.weight_decay * self.net.params_weight_decay[i]
        if not decay:
            return
        p = self.net.learnable_params[i]
        if f.regularization_type == "L2":
            p.dev_flat_diff[...] += decay * p.dev_flat_data
        else:
            p.dev_flat_diff[...] += decay * self.net.xp.sign(p.dev_flat_data)

    def compute_update_value(self, i, rate):
        raise NotImplementedError

    # -- snapshots -------------------------------------------------------------------------------
    def snapshot_prefix(self):
        prefix = self.param.snapshot_prefix
        if not prefix:
            base = getattr(self, "net_path", None)
            prefix = os.path.splitext(base)[0] if base else "snapshot"
        return prefix

    def snapshot(self, prefix=None):
        """Write <prefix>_iter_<N>.caffemodel and .solverstate atomically; return both paths."""
        prefix = prefix or self.snapshot_prefix()
        weights = f"{prefix}_iter_{self.iter}.caffemodel"
        state = f"{prefix}_iter_{self.iter}.solverstate"
        self.log(f"Snapshotting to binary proto file {weights}")
        save_weights(self.net, weights)
        self.log(f"Snapshotting solver state to {state}")
        if caffe_state.wants_caffe_format(self.param, self.log):  # Caffe's SolverState (see caffe_state.py)
            caffe_state.save(self, state, weights)
        else:
            self.save_state(state, weights)
        self._call("on_snapshot", weights, state)
        for cb in self.on_snapshot:
            cb(self, weights, state)
        return weights, state

    def state_record(self, weights_path):
        data_states = {}
        for kind, nets in (("train", [self.net]), ("test", self.test_nets)):
            for ni, net in enumerate(nets):
                for layer in net.layers:
                    if isinstance(layer, DataLayer):
                        data_states[f"{kind}/{ni}/{layer.name}"] = layer.state_dict()
        gen = _rng.get_rng().bit_generator
        return {
            "format": STATE_FORMAT,
            "type": self.type,
            "net": self.net.name,
            "iter": self.iter,
            "current_step": self.current_step,
            "learned_net": os.path.basename(weights_path),
            "losses": self.losses,
            "smoothed_loss": self.smoothed_loss,
            "param_shapes": [list(p.shape) for p in self.net.learnable_params],
            "rng": {"bit_generator": type(gen).__name__, "state": gen.state, "seed": _rng.get_seed()},
            "data": data_states,
        }

    def save_state(self, path, weights_path):
        """Write the solver state; its record carries the sha256 of ``weights_path`` (already
        written), which :meth:`restore` checks, so a damaged or swapped .caffemodel is refused."""
        record = self.state_record(weights_path)
        record["weights_sha256"] = file_sha256(weights_path)
        record["record_sha256"] = _record_digest(record)
        arrays = {"record": np.frombuffer(json.dumps(record).encode(), dtype=np.uint8)}
        for name, hist in zip(self.history_names, self.history):
            for i, h in enumerate(hist):
                arrays[f"{name}/{i}"] = np.asarray(self.net.backend.to_host(h))
        atomic_write(path, lambda f: np.savez(f, **arrays))

    def read_state(self, state_path):
        """The record and history arrays of a .solverstate, every field checked against this
        solver; nothing is changed.  SolverError naming the file and the field otherwise."""
        if not os.path.exists(state_path):
            raise SolverError(f"solver state not found: {state_path}")
        with open(state_path, "rb") as f:
            magic = f.read(4)
        if magic != ZIP_MAGIC:
            raise SolverError(f"{state_path}: not a minicaffe solver state (not an .npz archive)")
        with open_npz(state_path, SolverError) as zf:
            members = {m.filename[:-4] if m.filename.endswith(".npy") else m.filename: m for m in zf.infolist()}
            if "record" not in members:
                raise SolverError(
                    f"{state_path} is a weights file, not a solver state (it has no record): give it to "
                    f"--weights (Net.copy_from) to start from it"
                )
            raw = read_npz_member(
                zf, members["record"], f"{state_path}: record", max_bytes=MAX_RECORD_BYTES, error=SolverError
            )
            try:
                record = json.loads(bytes(raw).decode())
            except (UnicodeDecodeError, ValueError) as exc:
                raise SolverError(f"{state_path}: the record is not JSON ({exc})") from None
            self._check_record(record, state_path)
            history = []
            for name, hist in zip(self.history_names, self.history):
                arrays = []
                for i, h in enumerate(hist):
                    key = f"{name}/{i}"
                    if key not in members:
                        raise SolverError(
                            f"{state_path}: history array {key} is missing ({self.type} keeps {len(hist)})"
                        )
                    arr = read_npz_member(zf, members[key], f"{state_path}: {key}", error=SolverError)
                    if arr.shape != tuple(h.shape):
                        raise SolverError(f"{state_path}: {key} has shape {arr.shape}, the parameter {tuple(h.shape)}")
                    arrays.append(arr)
                history.append(arrays)
        return record, history

    def _check_record(self, record, path):
        def bad(field, why):
            return SolverError(f"{path}: the record's {field!r} is {record.get(field)!r}: {why}")

        if not isinstance(record, dict):
            raise SolverError(f"{path}: the record is not a JSON object")
        if record.get("format") != STATE_FORMAT:
            raise SolverError(f"{path}: unknown solver state format {record.get('format')!r}")
        fields = ("type", "net", "iter", "current_step", "learned_net", "losses", "smoothed_loss", "param_shapes")
        for field in fields + ("rng", "data"):
            if field not in record:
                raise SolverError(f"{path}: the record has no {field!r}")
        for field in ("type", "net", "learned_net"):
            if not isinstance(record[field], str):
                raise bad(field, "expected a string")
        for field in ("iter", "current_step"):
            v = record[field]
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= MAX_ITER:
                raise bad(field, f"expected an integer from 0 to {MAX_ITER}")
        name = record["learned_net"]
        if not name or name in (".", "..") or os.path.basename(name) != name or "\\" in name:
            raise bad("learned_net", "expected the file name of the .caffemodel beside the state")
        m = re.fullmatch(r".*_iter_(\d+)\.caffemodel(\.h5)?", name)
        if m and int(m.group(1)) != record["iter"]:
            raise bad("iter", f"but the state names its weights {name}: an edited or mismatched record")
        losses = record["losses"]
        if not isinstance(losses, list) or not all(_finite_number(v) for v in losses):
            raise bad("losses", "expected a list of finite numbers")
        if len(losses) > max(self.param.average_loss, 1):
            raise bad("losses", f"the smoothed-loss window holds at most average_loss = {self.param.average_loss}")
        if not _finite_number(record["smoothed_loss"]):
            raise bad("smoothed_loss", "expected a finite number")
        shapes = record["param_shapes"]
        if not isinstance(shapes, list) or not all(
            isinstance(sh, list) and all(isinstance(d, int) for d in sh) for sh in shapes
        ):
            raise bad("param_shapes", "expected a list of shapes")
        own = [list(p.shape) for p in self.net.learnable_params]
        if shapes != own or record["net"] != self.net.name:
            raise SolverError(
                f"{path}: the state is of net '{record['net']}' with parameter shapes "
                f"{shapes}, but this solver trains net '{self.net.name}' with "
                f"{own}: a snapshot from another net"
            )
        if record["type"] != self.type:
            raise SolverError(f"{path}: the state was written by a {record['type']} solver, this is {self.type}")
        rng = record["rng"]
        if not isinstance(rng, dict) or not isinstance(rng.get("bit_generator"), str) or "state" not in rng:
            raise bad("rng", "expected {bit_generator, state, seed}")
        gen = _rng.get_rng().bit_generator
        if rng["bit_generator"] == type(gen).__name__:
            try:
                type(gen)().state = rng["state"]  # try it on a scratch generator first
            except (TypeError, ValueError, KeyError) as exc:
                raise bad("rng", f"not a {rng['bit_generator']} state ({exc})") from None
        if not isinstance(record["data"], dict) or not all(isinstance(v, dict) for v in record["data"].values()):
            raise SolverError(f"{path}: the record's 'data' is not a map of reader positions")
        for field in ("weights_sha256", "record_sha256"):
            digest = record.get(field)
            if digest is not None and not (isinstance(digest, str) and len(digest) == 64):
                raise bad(field, "expected a sha256 in hex")
        if "record_sha256" in record and _record_digest(record) != record["record_sha256"]:
            raise SolverError(
                f"{path}: the record does not match its sha256: it was edited or damaged after the snapshot"
            )

    def restore(self, state_path):
        """Continue from a .solverstate: weights, history, iteration, RNG and data positions.

        Everything is read and checked first (the record's fields, the history arrays' shapes, the
        weights file against the sha256 the state recorded, every layer present); only then does
        anything in the solver change.
        """
        state_path = os.fspath(state_path)
        if not os.path.exists(state_path):
            raise SolverError(f"solver state not found: {state_path}")
        if caffe_state.is_caffe_state(state_path):  # not minicaffe's .npz: Caffe's, or the wrong file
            if _looks_like_weights(state_path):
                raise SolverError(
                    f"{state_path} is a weights file, not a solver state: give it to --weights "
                    f"(Net.copy_from) to start from it; --resume takes the .solverstate a snapshot "
                    f"writes beside its .caffemodel"
                )
            return caffe_state.restore(self, state_path)
        record, history = self.read_state(state_path)
        weights = os.path.join(os.path.dirname(os.path.abspath(state_path)), record["learned_net"])
        if not os.path.exists(weights):
            raise SolverError(f"{state_path}: its weights file {weights} is not there")
        digest = record.get("weights_sha256")
        if digest is None:
            self.log(f"{state_path} records no checksum of its weights (written by an older minicaffe)")
        elif file_sha256(weights) != digest:
            raise SolverError(
                f"{weights}: its sha256 {file_sha256(weights)} does not match the {digest} recorded in the "
                f"solver state {state_path}: the weights were changed or damaged after the snapshot"
            )
        try:
            self.net.copy_from(weights, strict=True, log=lambda line: None)
        except WeightsError as exc:
            raise SolverError(f"resuming from {state_path}: {exc}") from None
        for arrays, hist in zip(history, self.history):
            for arr, h in zip(arrays, hist):
                h[...] = self.net.backend.from_host(arr, h.dtype)
        self.iter = int(record["iter"])
        self.current_step = int(record["current_step"])
        self.losses = [float(v) for v in record["losses"]]
        self.smoothed_loss = float(record["smoothed_loss"])
        gen = _rng.get_rng().bit_generator
        if record["rng"]["bit_generator"] == type(gen).__name__:
            gen.state = record["rng"]["state"]
        for kind, nets in (("train", [self.net]), ("test", self.test_nets)):
            for ni, net in enumerate(nets):
                for layer in net.layers:
                    key = f"{kind}/{ni}/{layer.name}"
                    if key in record["data"] and isinstance(layer, DataLayer):
                        layer.load_state_dict(record["data"][key])
        for net in self.test_nets:
            net.share_with(self.net)
        self.log(f"Restored solver state from {state_path} at iteration {self.iter}")


class UpdateFields:
    """The SolverParameter fields every parameter's update reads, read once: a message field
    costs about 3 us a read, and LeNet's update of its eight parameters read 32 of them on the
    calling thread while the other cores waited (``Solver.update_fields``)."""

    __slots__ = ("iter_size", "weight_decay", "momentum", "regularization_type")

    def __init__(self, param):
        self.iter_size = param.iter_size
        self.weight_decay = param.weight_decay
        self.momentum = param.momentum
        self.regularization_type = param.regularization_type


def _looks_like_weights(path):
    """A .caffemodel (by name, or a NetParameter with layers) given where a state is expected."""
    if path.endswith((".caffemodel", ".caffemodel.h5")):
        return True
    from .. import proto

    try:
        with open(path, "rb") as f:
            msg = proto.decode(f.read(), "NetParameter", filename=path)
    except MinicaffeError:  # not a NetParameter: then not weights
        return False
    return bool(len(msg.layer) or len(msg.layers))


def _record_digest(record):
    """The sha256 of a state record's JSON (keys sorted), without its own digest."""
    body = {k: v for k, v in record.items() if k != "record_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _finite_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _default_log(message):
    print(message, flush=True)
