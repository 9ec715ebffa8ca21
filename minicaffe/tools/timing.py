"""``python -m minicaffe.time``: per-layer forward and backward time, as ``caffe time`` prints it.

    python -m minicaffe.time lenet                       # nets/lenet_train_test.prototxt, TRAIN
    python -m minicaffe.time caffenet --iterations 5 --phase TEST

Runs ``--warmup`` untimed forward-backward passes (past numba's compilation), then
``--iterations`` timed ones, and prints each layer's median forward and backward time, the
forward, backward and total per iteration, and each layer's share.
"""

import argparse
import statistics
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
    return p


def time_layers(net, iterations, warmup=5):
    """{layer index: ([forward seconds], [backward seconds])} and the per-iteration totals,
    timed around each layer by the net's hooks (the net runs its own loop)."""
    n = len(net.layers)
    fwd = [[] for _ in range(n)]
    bwd = [[] for _ in range(n)]
    totals = []
    clock = time.perf_counter
    started = [0.0]
    times_f, times_b = [0.0] * n, [0.0] * n

    def start(i):
        started[0] = clock()

    def stop_forward(i):
        times_f[i] = clock() - started[0]

    def stop_backward(i):
        times_b[i] = clock() - started[0]

    with net.add_hooks(
        before_forward=start, after_forward=stop_forward, before_backward=start, after_backward=stop_backward
    ):
        for it in range(warmup + iterations):
            times_f[:] = [0.0] * n
            times_b[:] = [0.0] * n
            t_iter = clock()
            net.forward_backward()
            if it >= warmup:
                totals.append(clock() - t_iter)
                for i in range(n):
                    fwd[i].append(times_f[i])
                    bwd[i].append(times_b[i])
    return fwd, bwd, totals


def report(net, fwd, bwd, totals, log):
    med = statistics.median
    ms = lambda s: 1000 * s
    total_f = sum(med(f) for f in fwd)
    total_b = sum(med(b) for b in bwd)
    log("Average time per layer (median):")
    width = max(len(name) for name in net.layer_names)
    for name, layer, f, b in zip(net.layer_names, net.layers, fwd, bwd):
        share = 100 * (med(f) + med(b)) / max(total_f + total_b, 1e-12)
        log(
            f"  {name:>{width}} {layer.type:<16} forward: {ms(med(f)):8.3f} ms  backward: {ms(med(b)):8.3f} ms"
            f"  ({share:4.1f}%)"
        )
    log(f"Average Forward pass: {ms(total_f):.3f} ms.")
    log(f"Average Backward pass: {ms(total_b):.3f} ms.")
    log(
        f"Average Forward-Backward: {ms(med(totals)):.3f} ms (median of {len(totals)}; "
        f"min {ms(min(totals)):.3f}, max {ms(max(totals)):.3f})."
    )
    log(f"Total Time: {ms(sum(totals)):.1f} ms.")


def main(argv=None):
    args = build_parser().parse_args(argv)

    def body(net, path, log):
        log(
            f"*** Benchmark begins *** {net.name} ({path}), {args.phase}, {args.warmup} warm-up + "
            f"{args.iterations} timed iterations"
        )
        fwd, bwd, totals = time_layers(net, args.iterations, args.warmup)
        report(net, fwd, bwd, totals, log)
        log("*** Benchmark ends ***")

    return run_net_tool(args, body)
