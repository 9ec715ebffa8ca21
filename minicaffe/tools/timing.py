"""``python -m minicaffe.time``: per-layer forward and backward time, as ``caffe time`` prints it.

    python -m minicaffe.time lenet                       # nets/lenet_train_test.prototxt, TRAIN
    python -m minicaffe.time caffenet --iterations 5 --phase TEST

Runs ``--warmup`` untimed forward-backward passes (past numba's compilation), then
``--iterations`` timed ones, and prints each layer's median forward and backward time, the
forward, backward and total per iteration, and each layer's share.

Each layer's time is set against its own floor, the time this machine needs at the least for
the work the layer does (on the CPU): a Convolution or InnerProduct's multiply-adds at the
SGEMM rate measured here (OpenBLAS, n=1024, one thread; the higher of a measurement before and
one after the timed iterations, with a warning when they differ by more than 15%) times the
lanes it splits over; any other
layer's bytes (forward: its bottoms read and tops written; backward: its top diffs and the data
its backward reads, its bottom diffs written) at the fastest stream rate measured here for that
many bytes.  ``% roof`` = floor / time: 100% is the machine's limit for that layer.  Layers with
no floor (data layers) show ``-``.

With more than one lane the net runs its step plan (minicaffe/parallel/plan.py): a segment of
per-image layers is one task per lane, so a layer inside it has no call of its own to time on
the calling thread.  Its time is then measured inside each lane, and the slowest lane's is shown
(marked ``*`` after its share); each segment gets a line of its own with its wall time and the rest of it, the
hand-off (starting and joining the lanes, the lanes waiting for each other).  ``--no-plan`` times
every layer call on its own instead, as the net runs without the plan.

``--save-times FILE`` writes the medians as the Poseidon simulator reads them
(``python -m minicaffe.dist.simulate --times FILE``): each layer's forward and backward in
milliseconds, with the parameter count, update time and FC geometry of the layers it syncs.
"""

import argparse
import statistics
import sys
import time

from .common import run_net_tool


def build_parser():
    p = argparse.ArgumentParser(prog="python -m minicaffe.time", description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="a short name from nets/ or a net prototxt")
    p.add_argument("--iterations", type=int, default=50, help="timed iterations (default 50, as caffe time)")
    p.add_argument("--warmup", type=int, default=5, help="untimed iterations first (default 5)")
    p.add_argument("--phase", choices=("TRAIN", "TEST"), default="TRAIN")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    p.add_argument("--data-dir", help="dataset cache directory")
    p.add_argument(
        "--lanes",
        type=int,
        help="split Convolution, InnerProduct and Pooling calls over this many cores (default: all cores, as "
        "python -m minicaffe.train does); BLAS runs cores / lanes threads",
    )
    p.add_argument("--no-roofline", action="store_true", help="do not measure the machine's ceilings")
    p.add_argument(
        "--no-plan",
        action="store_true",
        help="run without the step plan: every layer one call, split over the lanes on its own",
    )
    p.add_argument(
        "--save-times",
        metavar="FILE",
        help="also write each layer's median forward/backward (ms) as python -m minicaffe.dist.simulate --times "
        "reads them (TRAIN phase)",
    )
    return p


# -- each layer's floor ----------------------------------------------------------------------------
GEMM_LAYERS = ("Convolution", "Deconvolution", "InnerProduct")
NO_FLOOR = ("Data", "ImageData", "HDF5Data", "MemoryData", "WindowData", "DummyData", "Input", "Python")


def _count(blobs):
    return sum(b.count for b in blobs)


def layer_work(net, i):
    """(kind, forward work, backward work) of layer i: kind "flop" (multiply-adds x 2) for the
    GEMM layers, "byte" for the others, None where there is no floor (data layers)."""
    layer, bottom, top = net.layers[i], net.bottom_vecs[i], net.top_vecs[i]
    need = net.bottom_need_backward[i]
    params = [bool(p) for p in getattr(layer, "param_propagate_down", [])]
    backward = net.layer_need_backward[i]
    if layer.type in NO_FLOOR:
        return None, 0.0, 0.0
    if layer.type in GEMM_LAYERS:
        if layer.type == "Deconvolution":  # each input value times its (M/G, kh, kw) weights
            macs = 2.0 * _count(bottom) * layer.blobs[0].count / bottom[0].shape[1]
        else:  # each output value: a dot product of one row of the weights
            macs = 2.0 * _count(top) * layer.blobs[0].count / layer.num_output
        bwd = 0.0
        if backward:
            bwd = macs * ((1 if params and params[0] else 0) + sum(1 for b in need if b) / max(1, len(need)))
        return "flop", macs, bwd
    item = (bottom[0] if bottom else top[0]).data.dtype.itemsize
    fwd = item * (_count(b for b in bottom if all(b is not t for t in top)) + _count(top))
    if not top:
        fwd = item * _count(bottom)
    bwd = 0.0
    if backward and any(need):
        reads = layer.backward_reads
        bwd = item * (
            _count(top)
            + (_count(bottom) if reads in ("bottom", "both") else 0)
            + (_count(top) if reads in ("top", "both") else 0)
            + _count(b for b, n in zip(bottom, need) if n)
        )
    return "byte", fwd, bwd


def gemm_ceiling():
    """The one-thread SGEMM rate (GFLOP/s, OpenBLAS, n=1024) measured now: BLAS set to one
    thread for the measurement, then put back."""
    from kernels.bench import sgemm_peak

    from ..parallel import blas

    threads = blas.get_threads() or 1
    blas.set_threads(1)
    try:
        return sgemm_peak()
    finally:
        blas.set_threads(threads)


#: ceilings measured before and after the timed iterations that differ by more than this
#: fraction: the machine was busy during one of them, and the line says so
CEILING_SPREAD = 0.15


def floors(net, lanes_used, earlier=None):
    """[(floor seconds forward, backward) or None] per layer, and a line naming the ceilings.
    A GEMM layer's ceiling is the one-thread SGEMM rate times the cores it may use: its lanes
    times the BLAS threads each lane's GEMMs run.  The rate is measured now and, given
    ``earlier`` (a rate measured before the timed iterations), the higher of the two is taken:
    a ceiling is the best the machine reaches, and one measurement in a busy moment (seen: 40
    against 100 GFLOP/s) would lower every floor and raise every percentage."""
    from kernels.bench import stream_bandwidth

    from ..parallel import blas

    threads = blas.get_threads() or 1
    rates = [r for r in (earlier, gemm_ceiling()) if r]
    gemm = max(rates)
    cores = min(blas.cores(), lanes_used * threads)
    out = []
    for i in range(len(net.layers)):
        kind, f, b = layer_work(net, i)
        if kind is None:
            out.append(None)
        elif kind == "flop":
            rate = gemm * 1e9 * cores
            out.append((f / rate, b / rate))
        else:
            out.append(tuple(x / (stream_bandwidth(x)[0] * 1e9) if x else 0.0 for x in (f, b)))
    big = stream_bandwidth(64 << 20)[0]
    measured = "" if len(rates) < 2 else f"; the higher of {rates[0]:.1f} before and {rates[1]:.1f} after the timing"
    line = (
        f"Floors: GEMM layers at {gemm:.1f} GFLOP/s (SGEMM n=1024, 1 thread{measured}) x {cores} core(s) "
        f"({lanes_used} lane(s) x {threads} BLAS thread(s)); "
        f"others at the stream rate for their bytes ({big:.0f} GB/s from DRAM, more from cache)"
    )
    if min(rates) < (1 - CEILING_SPREAD) * gemm:
        line += (
            f"\nWarning: the SGEMM rate measured {min(rates):.1f} against {gemm:.1f} GFLOP/s: the machine was busy "
            "during the run, so its times (and the percentages) are not the machine's best"
        )
    return out, line


def time_layers(net, iterations, warmup=5, segments_out=None):
    """{layer index: ([forward seconds], [backward seconds])} and the per-iteration totals.

    A layer outside a segment of the step plan is timed around its call by the net's hooks; a
    layer inside one by the plan, inside each lane (``StepPlan.record``): the slowest lane's
    time.  ``segments_out``, a list, receives the segments with their wall times:
    ((first, last), [forward seconds], [backward seconds])."""
    n = len(net.layers)
    fwd = [[] for _ in range(n)]
    bwd = [[] for _ in range(n)]
    totals = []
    clock = time.perf_counter
    started = [0.0]
    times_f, times_b = [0.0] * n, [0.0] * n
    plan = net.step_plan() if net.uses_step_plan() else None
    segments = plan.segments if plan is not None else []
    inside = {i for a, b in segments for i in range(a, b + 1)}
    walls = [([], []) for _ in segments]

    def start(i):
        started[0] = clock()

    def stop_forward(i):
        if i not in inside:
            times_f[i] = clock() - started[0]

    def stop_backward(i):
        if i not in inside:
            times_b[i] = clock() - started[0]

    if plan is not None:
        plan.record = True
    try:
        with net.add_hooks(
            before_forward=start, after_forward=stop_forward, before_backward=start, after_backward=stop_backward
        ):
            for it in range(warmup + iterations):
                times_f[:] = [0.0] * n
                times_b[:] = [0.0] * n
                if plan is not None:
                    plan.layer_times.clear()
                    plan.segment_times.clear()
                t_iter = clock()
                net.forward_backward()
                if it < warmup:
                    continue
                totals.append(clock() - t_iter)
                if plan is not None:
                    for (i, phase), per_lane in plan.layer_times.items():
                        (times_f if phase == "forward" else times_b)[i] = max(per_lane)
                    for k, (a, b) in enumerate(segments):
                        for j, phase in enumerate(("forward", "backward")):
                            per_layer = [
                                plan.layer_times[(i, phase)] for i in range(a, b + 1) if (i, phase) in plan.layer_times
                            ]
                            slowest = max(map(sum, zip(*per_layer)), default=0.0)  # the slowest lane's layers
                            wall = plan.segment_times.get((a, phase), 0.0)
                            walls[k][j].append((wall, wall - slowest))
                for i in range(n):
                    fwd[i].append(times_f[i])
                    bwd[i].append(times_b[i])
    finally:
        if plan is not None:
            plan.record = False
    if segments_out is not None:
        segments_out.extend((seg, f, b) for seg, (f, b) in zip(segments, walls))
    return fwd, bwd, totals


def report(net, fwd, bwd, totals, log, floor=None, segments=()):
    med = statistics.median
    inside = {i for (a, b), _, _ in segments for i in range(a, b + 1)}
    ms = lambda s: 1000 * s
    total_f = sum(med(f) for f in fwd)
    total_b = sum(med(b) for b in bwd)
    log("Average time per layer (median):")
    width = max(len(name) for name in net.layer_names)
    for i, (name, layer, f, b) in enumerate(zip(net.layer_names, net.layers, fwd, bwd)):
        share = 100 * (med(f) + med(b)) / max(total_f + total_b, 1e-12)
        roof = ""
        if floor is not None:
            fl = floor[i]
            if fl is None:
                roof = "  floor:        -  % roof:   -"
            else:
                pct = 100 * (fl[0] + fl[1]) / max(med(f) + med(b), 1e-12)
                roof = f"  floor: {ms(fl[0] + fl[1]):8.3f} ms  % roof: {pct:3.0f}"
        mark = "*" if i in inside else " "
        log(
            f"  {name:>{width}} {layer.type:<16} forward: {ms(med(f)):8.3f} ms  backward: {ms(med(b)):8.3f} ms"
            f"  ({share:4.1f}%){mark}{roof}"
        )
    for (a, b), walls_f, walls_b in segments:
        (wf, hf), (wb, hb) = ([med(x[j] for x in w) for j in (0, 1)] for w in (walls_f, walls_b))
        log(
            f"  * segment {net.layer_names[a]} .. {net.layer_names[b]} (the step plan: one task per lane): "
            f"forward {ms(wf):.3f} ms, backward {ms(wb):.3f} ms wall, of which hand-off {ms(hf):.3f} + {ms(hb):.3f} ms"
        )
    if segments:
        log(
            "  * timed inside the lanes, the slowest lane's (layers of a segment have no call of their own; "
            "--no-plan times each call)"
        )
        total_f += sum(med(x[0] for x in f) for _, f, _ in segments) - sum(med(fwd[i]) for i in inside)
        total_b += sum(med(x[0] for x in b) for _, _, b in segments) - sum(med(bwd[i]) for i in inside)
    log(f"Average Forward pass: {ms(total_f):.3f} ms.")
    log(f"Average Backward pass: {ms(total_b):.3f} ms.")
    log(
        f"Average Forward-Backward: {ms(med(totals)):.3f} ms (median of {len(totals)}; "
        f"min {ms(min(totals)):.3f}, max {ms(max(totals)):.3f})."
    )
    log(f"Total Time: {ms(sum(totals)):.1f} ms.")


def main(argv=None):
    args = build_parser().parse_args(argv)

    from ..parallel import blas, lanes, plan

    if args.lanes is None:
        args.lanes = blas.cores() if args.device == "cpu" else 1
    if args.lanes < 1:
        print(f"error: --lanes must be >= 1, got {args.lanes}", file=sys.stderr)
        return 1
    if args.save_times and args.phase != "TRAIN":
        print("error: --save-times needs --phase TRAIN (the simulator needs each layer's backward)", file=sys.stderr)
        return 1
    saved = lanes.set_count(args.lanes), blas.get_threads(), plan.set_enabled(not args.no_plan)
    blas.set_threads(max(1, blas.cores() // args.lanes))

    def body(net, path, log):
        log(
            f"*** Benchmark begins *** {net.name} ({path}), {args.phase}, {args.warmup} warm-up + "
            f"{args.iterations} timed iterations, {args.lanes} lane(s), BLAS threads {blas.get_threads()}, "
            f"step plan {'on' if net.uses_step_plan() else 'off'}"
        )
        segments = []
        roof = args.device == "cpu" and not args.no_roofline
        earlier = gemm_ceiling() if roof else None  # the ceiling before the timing too (see floors)
        fwd, bwd, totals = time_layers(net, args.iterations, args.warmup, segments)
        floor = None
        if roof:
            floor, line = floors(net, args.lanes, earlier)
            for part in line.split("\n"):
                log(part)
        report(net, fwd, bwd, totals, log, floor, segments)
        log("*** Benchmark ends ***")
        if args.save_times:
            from ..dist import simulate

            simulate.save_times(simulate.layers_from_timings(net, fwd, bwd), args.save_times)
            log(f"Wrote the per-layer times to {args.save_times} (python -m minicaffe.dist.simulate --times reads it)")

    try:
        return run_net_tool(args, body)
    finally:
        lanes.set_count(saved[0])
        plan.set_enabled(saved[2])
        if saved[1]:
            blas.set_threads(saved[1])
