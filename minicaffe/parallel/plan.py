"""The step plan: the lanes run whole segments of per-image layers, one hand-off per segment.

lanes.py splits one layer *call*: a Convolution, Pooling or InnerProduct call hands each helper
thread its slice of the batch and waits for all of them.  Each such hand-off costs 30-70 us (wake
the helper, wait for the slowest lane), more when the helper had gone to sleep, and a LeNet step
made eleven of them.  But most layers of a convolutional net treat every image on its own, so
nothing forces the lanes to meet between them.  The plan, built once per net, groups consecutive
layers whose images are independent (``Layer.lanes_ok``: Convolution, Pooling, InnerProduct,
ReLU) into *segments*, and runs each segment as ONE task per lane.  LeNet, TRAIN (ip2's product,
0.6 MFLOP, is too small to be worth a lane: ``InnerProduct.lanes_ok``)::

    forward:   mnist | [conv1 pool1 conv2 pool2 ip1 relu1] | ip2 | loss
    backward:  loss | ip2 | [relu1 ip1 : ip1's dW by rows : pool2 conv2 pool1 conv1] | reduce conv2, conv1

Inside a segment lane k runs each layer, in order, on its images [a_k, b_k) of the batch
(``forward_images`` / ``backward_images``).  It never waits for the other lanes: every image it
reads was written by itself (the same split for every layer of the segment) or before the segment
began.  Only what needs the whole batch waits for the end of the segment: the parameter gradients,
the loss, and every layer outside a segment (run as before, one call each, with lanes.py
splitting it where that pays).  A parameter gradient is made in one of two ways:

- summed per lane: lane k > 0 sums its images' share into a block of its own, and after the
  segment ``reduce_lanes`` adds the blocks into the diffs in lane order (Convolution);
- by rows after the lanes meet (``params_after_lanes``: InnerProduct): once every lane has run
  the layer's ``backward_images``, the lanes wait for each other (a barrier), then each computes
  its block of the gradient's rows over the whole batch (``backward_params``) and goes on to the
  segment's next layer.  A big weight gradient is then written once, in halves, not twice and
  added; and it is computed while its inputs (the layer's bottom and top diff) are still in
  cache, where the lanes are nearly in step (ip1's rows in LeNet's step took 0.31 ms per lane
  there against 0.35 at the segment's end, after conv2 had run).

The calling thread does for the segment's layers what the Net's loop does for each layer, before
the lanes start: the hooks of ``Net.add_hooks`` that come before (``before_forward`` /
``before_backward``, for each layer in order), each layer's ``reshape`` (forward: a top's shape
follows from its bottom's), and ``prepare_lanes`` (work buffers sized for the split, so the lanes
only take views).  After the lanes: ``reduce_lanes`` (backward), then the hooks that come after.
So when a layer's ``after_backward`` hook runs its parameter gradients are complete, as wait-free
backprop needs; they only arrive together, at the end of the segment.

Memory (minicaffe/memory/lifetimes.py) counts a segment as one step: all the buffers it touches
are live at once (lane 0 may be two layers ahead of lane 1), so none of them share bytes.  Only
the segments that run when the memory is planned count, and they are the only ones that run
after it (``limit_to_running``): an arena planned for one lane runs layer by layer at two.

Timing: with ``record`` set each lane notes how long each layer of a segment took on it, and the
plan how long each segment took from the first task's start to the last lane's end; ``python -m
minicaffe.time`` prints the slowest lane's time per layer and the rest of the segment (its
hand-off) on a line of its own.  A layer inside a segment has no time of its own on the clock of
the calling thread.
"""

import threading
import time
from functools import partial

from . import lanes

_state = {"enabled": True}


def enabled():
    """Do nets run their step plan's segments in lanes?  (Yes unless switched off; it only
    matters with more than one lane.)"""
    return _state["enabled"]


def set_enabled(on):
    """Switch the step plan on or off for the process (off: every layer is one call, split by
    lanes.py on its own, as before plans); returns the previous setting."""
    old, _state["enabled"] = _state["enabled"], bool(on)
    return old


def _batch(net, i):
    """The batch size of layer i's blobs (axis 0 of every bottom and top), or None when they
    disagree, a blob has no axes, or the layer has no blobs."""
    blobs = net.bottom_vecs[i] + net.top_vecs[i]
    if not blobs or any(b.num_axes == 0 for b in blobs):
        return None
    n = blobs[0].shape[0]
    return n if all(b.shape[0] == n for b in blobs) else None


def per_image(net, i, n):
    """Can layer i run on slices of a batch of ``n`` images inside a segment?"""
    layer = net.layers[i]
    return _batch(net, i) == n and not any(layer.loss_weights) and layer.lanes_ok(net.bottom_vecs[i], net.top_vecs[i])


def find_segments(net):
    """[(first, last)]: the runs of at least two consecutive layers that are per-image for the
    same batch size (none on a backend without host lanes: a GPU runs the whole batch)."""
    if not net.backend.host_lanes:
        return []
    out, first, n = [], None, None
    for i in range(len(net.layers) + 1):
        m = _batch(net, i) if i < len(net.layers) else None
        if first is not None and (m != n or not per_image(net, i, n)):
            if i - first >= 2:
                out.append((first, i - 1))
            first = None
        if first is None and m is not None and m >= 2 and per_image(net, i, m):
            first, n = i, m
    return out


class StepPlan:
    """A net's segments and how to run them (``net.step_plan()`` builds it once)."""

    def __init__(self, net):
        self.net = net
        self.segments = find_segments(net)
        self._last = dict(self.segments)  # first layer -> last layer of its segment
        self.record = False
        self.layer_times = {}  # (layer, "forward" / "backward") -> [seconds per lane], last run
        self.segment_times = {}  # (first, "forward" / "backward") -> wall seconds of the lanes, last run
        # (layer, phase) -> [(start, end) per lane] and (first, phase) -> (start, end), last run, on
        # time.perf_counter's clock: when each lane ran what (phase "params": backward_params after
        # the barrier; benchmarks/step_timeline.py draws it)
        self.layer_spans = {}
        self.segment_spans = {}

    def running(self):
        """The segments forward and backward run in lanes now: none with one lane or the plan off."""
        return self.segments if lanes.count() > 1 and enabled() else []

    def limit_to_running(self):
        """Keep only the segments that run now, for good, and return them.  A memory plan
        (minicaffe/memory/lifetimes.py) lets two buffers share bytes when no step uses both; it
        counts a segment as one step, so it must know which layers may run at once, and no
        other segment may start running later (one lane when the arena was planned, two after)."""
        self.segments = list(self.running())
        self._last = dict(self.segments)
        return self.segments

    def segment_of(self, i):
        """(first, last) of the segment holding layer i, or None."""
        for first, last in self.segments:
            if first <= i <= last:
                return first, last
        return None

    # -- the loops the Net delegates to ------------------------------------------------------------
    def forward(self, start, end):
        """Layers start..end forward (segments wholly inside the range in lanes); the summed loss."""
        net, loss, i = self.net, 0.0, start
        while i <= end:
            last = self._last.get(i)
            if last is not None and last <= end and self._forward_segment(i, last):
                i = last + 1
            else:
                loss += net.forward_layer(i)
                i += 1
        return loss

    def backward(self, start, end):
        """Layers start..end backward, start >= end (segments wholly inside the range in lanes)."""
        net, i = self.net, start
        while i >= end:
            seg = self.segment_of(i)
            if seg is not None and seg[1] == i and seg[0] >= end and self._backward_segment(*seg):
                i = seg[0] - 1
            else:
                net.backward_layer(i)
                i -= 1

    # -- one segment -------------------------------------------------------------------------------
    def _split(self, first, last):
        """The lanes' (a, b) slices for the segment as its blobs are shaped now, or None when a
        layer no longer takes slices (the batch changed shape): the layers then run one by one."""
        net = self.net
        n = _batch(net, first)
        if n is None or n < 2 or not all(per_image(net, i, n) for i in range(first, last + 1)):
            return None
        return lanes.split(n, lanes.count())

    def _forward_segment(self, first, last):
        net = self.net
        layers, bottoms, tops = net.layers, net.bottom_vecs, net.top_vecs
        order = range(first, last + 1)
        for i in order:
            layers[i].reshape(bottoms[i], tops[i])
        parts = self._split(first, last)
        if parts is None:
            return False
        self._hooks("before_forward", order)
        for i in order:
            layers[i].prepare_lanes(bottoms[i], tops[i], parts, None)
        calls = [partial(layers[i].forward_images, bottom=bottoms[i], top=tops[i]) for i in order]
        self._run((first, "forward"), order, calls, parts)
        self._hooks("after_forward", order)
        return True

    def _backward_segment(self, first, last):
        net = self.net
        layers, bottoms, tops, need = net.layers, net.bottom_vecs, net.top_vecs, net.bottom_need_backward
        order = [i for i in range(last, first - 1, -1) if net.layer_need_backward[i]]
        parts = self._split(first, last)
        if parts is None:
            return False
        self._hooks("before_backward", order)
        for i in order:
            layers[i].prepare_lanes(bottoms[i], tops[i], parts, need[i])
        calls = [
            partial(layers[i].backward_images, top=tops[i], propagate_down=need[i], bottom=bottoms[i]) for i in order
        ]
        later = [i for i in order if layers[i].params_after_lanes and any(layers[i].param_propagate_down)]
        after = [partial(layers[i].backward_params, parts=parts, top=tops[i], bottom=bottoms[i]) for i in later]
        self._run((first, "backward"), order, calls, parts, later, after)
        for i in order:
            layers[i].reduce_lanes(parts)
        self._hooks("after_backward", order)
        return True

    def _hooks(self, kind, order):
        """The Net's hooks of ``kind`` for each layer of a segment, layer by layer (as its loop)."""
        hooks = self.net.hooks(kind)
        if hooks:
            for i in order:
                for hook in hooks:
                    hook(i)

    def _run(self, key, order, calls, parts, later=(), after=()):
        """One task per lane: lane k makes each call of ``calls`` (one per layer of ``order``, its
        arguments but the lane and the slice bound) on its images [a, b), in order.  For a layer
        of ``later`` (its call in ``after``: ``backward_params``), the lane then waits for every
        lane to have made that layer's call (a barrier), and makes the ``after`` call with its
        lane number before it goes on to the next layer: the gradient's rows are computed while
        the layer's inputs are still in cache, where the lanes are still nearly in step."""
        barrier = threading.Barrier(len(parts)) if after else None
        clock = time.perf_counter if self.record else None
        spent = {i: [0.0] * len(parts) for i in order}
        spans = {i: [(0.0, 0.0)] * len(parts) for i in order}
        after_spans = {i: [(0.0, 0.0)] * len(parts) for i in later}
        then = dict(zip(later, after))

        def task(k, a, b):
            def run():
                try:
                    for i, call in zip(order, calls):
                        t = clock() if clock else 0.0
                        call(k, a, b)
                        if clock:
                            spans[i][k] = (t, clock())
                            spent[i][k] = spans[i][k][1] - t
                        if i in then:
                            barrier.wait()
                            t = clock() if clock else 0.0
                            then[i](k)
                            if clock:
                                after_spans[i][k] = (t, clock())
                                spent[i][k] += after_spans[i][k][1] - t
                except threading.BrokenBarrierError:
                    return  # another lane failed before the barrier: lanes.run raises its error
                except BaseException:
                    if barrier is not None:
                        barrier.abort()  # the other lanes must not wait for this one
                    raise

            return run

        t0 = clock() if clock else 0.0
        lanes.run([task(k, a, b) for k, (a, b) in enumerate(parts)])
        if clock:
            t1 = clock()
            self.segment_times[key] = t1 - t0
            self.segment_spans[key] = (t0, t1)
            for i, per_lane in spent.items():
                self.layer_times[(i, key[1])] = per_lane
                self.layer_spans[(i, key[1])] = spans[i]
            for i, per_lane in after_spans.items():
                self.layer_spans[(i, "params")] = per_lane
