"""A training iteration the host never waits in, and its capture as a CUDA graph.

Why: on a GPU a LeNet step is a few hundred small kernel launches, each 10-40 us of Python, so
the step costs the same at batch 64 as at 1024.  A CUDA graph records the launches of one step
once and replays them with one call.  A step can be captured only if nothing in it needs the
host: no copy across the bus, no wait for the device, no Python decision on a device value.
``Solver.step`` makes three such waits per iteration (the batch arrives inside the data layer's
forward; SoftmaxWithLoss reads its label check; the solver reads the loss to test it and to
smooth it), so this module splits the iteration in two::

    prologue (host):  the data layers read the batch on the host; it is copied to the device
                      (the step's one host->device copy); the learning rate of this iteration is
                      written to a device array if it changed (the lr policy runs on the host)
    body (device):    clear the parameter diffs (one fill: the parameters are made slices of
                      flat vectors when the mode is enabled); forward of every other layer;
                      backward; the SGD update of every parameter in one launch (rates read on
                      the device); the loss copied into a device scalar.  The layers check on the device
                      (``Net.set_deferred_checks``): a bad label makes the loss NaN.

and keeps the losses on the device until they are needed: at a display line, a snapshot, a test,
and when ``step`` returns.  Then they are read in one copy; a non-finite one raises as
``Solver.step`` does, after ``net.check_deferred()`` has had the chance to name a bad label (the
layer, the label, where) -- up to ``display`` iterations late, which is the price of not waiting.

Modes (``Solver.enable_graph(mode)``):

* ``"graph"`` -- the body captured once as a CUDA graph on a CuPy stream (after one warm-up body,
  whose effect on the parameters is undone) and replayed every iteration.  The real ``cuda``
  backend only.
* ``"check"`` -- the body run as it is, inside the launcher's capture mode: any copy, sync or
  scalar read in it raises ``CaptureViolation``.  On ``cudasim`` this proves the step capturable
  without a GPU (tests/test_cuda_launch.py).
* ``"device"`` -- the body run as it is, losses kept on the device (no capture, no check).

What the body cannot hold, refused when the mode is enabled with a SolverError saying so: an
update rule other than SGD with L2 decay (its fused kernel takes the rate from the device;
Adam's bias correction and the others' per-iteration constants would be frozen into a graph),
gradient clipping (it decides on a norm read on the host), iter_size > 1, a custom gradient
source or updater, callbacks that run inside an iteration (on_start, on_gradients_ready), and
data layers after the first compute layer.  A Dropout layer draws its mask on the host: the
capture check finds it (a host->device copy inside the body).
"""

import time

import numpy as np

from ..errors import SolverError

MODES = ("graph", "check", "device")


class DeviceStep:
    """What ``Solver.step`` runs when ``solver.enable_graph(mode)`` was called."""

    def __init__(self, solver, mode="graph"):
        if mode not in MODES:
            raise SolverError(f"enable_graph: mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.solver, self.mode = solver, mode
        net = self.net = solver.net
        be = self.backend = net.backend
        if mode == "graph" and be.name != "cuda":
            raise SolverError(
                f"enable_graph('graph') captures the training step as a CUDA graph, which needs the real "
                f"cuda backend (CuPy on an NVIDIA GPU); this solver's net runs on '{be.name}'"
                + (
                    ": on the simulator, enable_graph('check') runs every step in capture mode instead, which "
                    "proves it capturable"
                    if be.name == "cudasim"
                    else ""
                )
            )
        if mode == "check" and be.name == "cpu":
            raise SolverError("enable_graph('check') checks a GPU backend's capture contract; this net runs on cpu")
        self._refuse_what_cannot_be_captured()
        n = 0
        while n < len(net.layers) and not net.bottom_vecs[n]:
            n += 1
        if n == 0:
            raise SolverError(f"net '{net.name}' has no data or input layer in front: nothing to feed the step")
        late = [net.layer_names[i] for i in range(n, len(net.layers)) if not net.bottom_vecs[i]]
        if late:
            raise SolverError(
                f"layer(s) {late} make data after the first compute layer '{net.layer_names[n]}': the step's "
                f"input must all be read before its device part starts"
            )
        self.first = n  # layers [0, first) run on the host in the prologue
        self._flatten()
        self.loss = net.xp.zeros((), dtype=net.dtype)
        self._rate = None
        self.graph = None
        self._stream = None
        self._captured_shapes = None
        net.set_deferred_checks(True)

    def _flatten(self):
        """Every learnable parameter's data, diff and momentum as slices of three flat device
        vectors (minicaffe.memory.flat, as the threaded runtime does): clearing the gradients is
        one fill and the update one launch (``sgd_step_segments``) instead of one per parameter."""
        from ..memory.flat import ParamLayout, attach_history

        net, be, xp, p = self.net, self.backend, self.net.xp, self.solver.param
        lay = self.layout = ParamLayout(net)
        self.W = xp.empty(lay.count, dtype=net.dtype)
        self.G = xp.zeros(lay.count, dtype=net.dtype)
        self.H = xp.empty(lay.count, dtype=net.dtype)
        lay.attach_data(self.W)  # the current values copied in
        lay.attach_diff(self.G)
        attach_history(lay, self.solver.history[0], self.H)
        for t in self.solver.test_nets:
            t.share_with(net)
        decays = np.array([p.weight_decay * d for d in net.params_weight_decay], dtype=net.dtype)
        self.offsets = be.from_host(np.array(lay.offsets + [lay.count], dtype=np.int64))
        self.decays = be.from_host(decays)
        self.lr_mults = np.array(net.params_lr, dtype=np.float64)
        self.rates = xp.zeros(len(lay.counts), dtype=net.dtype)

    def _refuse_what_cannot_be_captured(self):
        s, p = self.solver, self.solver.param
        why = []
        if s.type != "SGD":
            why.append(f"the {s.type} update (only SGD's fused update reads its rate on the device)")
        if p.regularization_type != "L2":
            why.append(f"regularization_type {p.regularization_type} (the fused SGD update does L2)")
        if p.clip_gradients >= 0:
            why.append("clip_gradients (it scales by a norm read on the host)")
        if p.iter_size != 1:
            why.append(f"iter_size {p.iter_size}")
        if s.customized:
            why.append(f"a custom {' and '.join(s.customized)} (a runtime's)")
        inner = [
            type(cb).__name__ for cb in s.callbacks if any(hasattr(cb, m) for m in ("on_start", "on_gradients_ready"))
        ]
        if inner:
            why.append(f"callbacks that run inside an iteration ({', '.join(inner)})")
        if why:
            raise SolverError(
                f"enable_graph({self.mode!r}): this solver's step cannot run without the host: " + "; ".join(why)
            )

    def close(self):
        self.net.set_deferred_checks(False)
        self.graph = self._stream = None

    # -- one iteration ---------------------------------------------------------------------------
    def _prologue(self, rate):
        net = self.net
        for i in range(self.first):
            net.layers[i].reshape(net.bottom_vecs[i], net.top_vecs[i])
            net.layers[i].forward(net.bottom_vecs[i], net.top_vecs[i])
        for i in range(self.first):
            for t in net.top_vecs[i]:
                _ = t.dev_flat_data  # the batch's copy to the device: here, not inside the body
        if rate != self._rate:
            self.rates[...] = self.backend.from_host((rate * self.lr_mults).astype(net.dtype))
            self._rate = rate

    def _body(self):
        net, be = self.net, self.backend
        self.G.fill(0)  # every parameter gradient: one fill
        loss = net.forward_device(self.first)
        net.backward_from_to()
        be.sgd_step_segments(self.W, self.G, self.H, self.offsets, self.solver.param.momentum, self.rates, self.decays)
        self.loss[...] = loss

    def _input_shapes(self):
        return [t.shape for i in range(self.first) for t in self.net.top_vecs[i]]

    def _capture(self):
        """Warm up (kernels compiled, scratch and pool memory allocated), undo the warm-up's
        update, then record the body as a graph."""
        net, be = self.net, self.backend
        state = [self.W, self.H] + [b.dev_flat_data for layer in net.layers for b in layer.blobs]
        saved = [a.copy() for a in state]  # (parameters, momentum, and layer state such as BatchNorm's)
        self._body()
        for a, s in zip(state, saved):
            a[...] = s
        be.synchronize()
        with be.capture("the captured training step") as captured:
            self._body()
        self.graph, self._stream = captured.graph, captured.stream

    def iteration(self, rate):
        """One iteration; returns its loss as a device scalar (a copy, kept)."""
        self._prologue(rate)
        if self.mode == "graph":
            shapes = self._input_shapes()
            if self.graph is None or shapes != self._captured_shapes:
                # a new batch shape reshapes the net: the old graph's buffers and sizes are wrong
                self._capture()
                self._captured_shapes = shapes
            self.graph.launch()
        elif self.mode == "check":
            with self.backend.capturing("a training step (enable_graph('check'))"):
                self._body()
        else:
            self._body()
        return self.loss.copy()

    # -- the loop ------------------------------------------------------------------------------------
    def run(self, iters):
        """``Solver.step(iters)`` in this mode: tests, display, snapshots and callbacks as there."""
        s, p = self.solver, self.solver.param
        start_iter, stop_iter = s.iter, s.iter + int(iters)
        average = max(p.average_loss, 1)
        s.losses, s.smoothed_loss = [], 0.0
        pending = []
        tick, last = time.perf_counter(), s.iter
        try:
            while s.iter < stop_iter and not s.requested_stop:
                if p.test_interval and s.iter % p.test_interval == 0 and (s.iter > 0 or p.test_initialization):
                    self._flush(pending, start_iter, average)
                    s.test_all()
                rate = s.learning_rate()
                loss = self.iteration(rate)
                pending.append((s.iter, loss))
                if p.display and s.iter % p.display == 0:
                    self._flush(pending, start_iter, average)
                    now = time.perf_counter()
                    lapse = now - tick
                    speed = (s.iter - last) / lapse if lapse > 0 else 0.0
                    s.log(
                        f"Iteration {s.iter} ({speed:.4g} iter/s, {lapse:.4g}s/{p.display} iters, {self.mode} "
                        f"mode), loss = {s.smoothed_loss:.6g}"
                    )
                    s.log(f"Iteration {s.iter}, lr = {rate:.6g}")
                    tick, last = now, s.iter
                s.iter += 1
                s.run_callbacks("on_iteration", loss, rate)
                for cb in s.on_iteration:
                    cb(s, loss, rate)
                if p.snapshot and s.iter % p.snapshot == 0:
                    self._flush(pending, start_iter, average)
                    s.snapshot()
        finally:
            if pending:
                self._flush(pending, start_iter, average)

    def _flush(self, pending, start_iter, average):
        """Read the kept losses in one copy; raise for a non-finite one (naming a bad label first
        if a layer found one); fold them into the smoothed loss."""
        if not pending:
            return
        s, xp = self.solver, self.net.xp
        values = self.backend.to_host(xp.stack([v for _, v in pending]))
        items = list(zip([it for it, _ in pending], values.tolist()))
        pending.clear()
        for it, v in items:
            if not np.isfinite(v):
                self.net.check_deferred()  # a bad label: LayerError naming it
                from ..checks import explain_nonfinite

                raise SolverError(f"loss is {v} at iteration {it}: {explain_nonfinite(self.net)}")
            # the smoothed loss's window index is that of iteration it, not of s.iter
            s.update_smoothed_loss(v, start_iter + (s.iter - it), average)
