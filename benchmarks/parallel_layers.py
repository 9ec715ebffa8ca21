"""Which layers' time does not halve with the batch: what caps ``--workers 2`` against one thread.

    python benchmarks/parallel_layers.py                      # LeNet, batch 64 against 32, 5 rounds
    python benchmarks/parallel_layers.py --rounds 7 --iterations 100

Two workers each run the training net on half the global batch.  If every layer took exactly
half as long on half the batch, two workers on two cores would finish a step in half the
one-thread time (2x) before any runtime cost.  This script times each layer's forward and
backward in one thread (one lane, OpenBLAS 1 thread, the step plan as ``python -m
minicaffe.time`` runs it) on the LeNet training net at the solver's batch and at half of it,
alternating the two nets for ``--rounds`` rounds in one process, and prints per layer the
medians and the part that does not halve: ``half - whole / 2`` (ms per worker and step that a
second worker cannot take away).  The sum of that column over the layers, against half the
whole step, bounds the speedup of ``--workers 2`` on this layer work alone:
``whole / (whole / 2 + extra)``.  The update is not here (the workers shard it).
"""

import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)


def lenet_net(batch):
    import minicaffe as caffe
    from minicaffe import proto
    from minicaffe.net import TRAIN, Net

    caffe.set_random_seed(1)
    param = proto.parse_file(os.path.join(ROOT, "nets", "lenet_train_test.prototxt"), "NetParameter")
    for lp in param.layer:
        if lp.type == "Data":
            lp.data_param.batch_size = batch
    return Net(param, phase=TRAIN)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--iterations", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    args = p.parse_args(argv)

    from minicaffe.parallel import blas, lanes
    from minicaffe.tools.timing import time_layers

    lanes.set_count(1)
    blas.set_threads(1)
    sizes = (args.batch, args.batch // 2)
    nets = {b: lenet_net(b) for b in sizes}
    per = {b: ([[] for _ in nets[b].layers], [[] for _ in nets[b].layers], []) for b in sizes}
    for _ in range(args.rounds):
        for b in sizes:
            fwd, bwd, totals = time_layers(nets[b], args.iterations, warmup=args.warmup)
            for i in range(len(fwd)):
                per[b][0][i].append(statistics.median(fwd[i]))
                per[b][1][i].append(statistics.median(bwd[i]))
            per[b][2].append(statistics.median(totals))
    med = statistics.median
    ms = lambda s: 1000.0 * s
    whole, half = sizes
    names = nets[whole].layer_names
    print(f"LeNet TRAIN, one thread: batch {whole} against {half}, medians of {args.rounds} rounds x {args.iterations}")
    print(f"{'layer':10s} {'fwd ' + str(whole):>9s} {'bwd ' + str(whole):>9s} {'fwd ' + str(half):>9s} "
          f"{'bwd ' + str(half):>9s} {'not halved':>11s}")  # fmt: skip
    extra = 0.0
    for i, name in enumerate(names):
        f64, b64 = med(per[whole][0][i]), med(per[whole][1][i])
        f32, b32 = med(per[half][0][i]), med(per[half][1][i])
        e = (f32 + b32) - (f64 + b64) / 2
        extra += e
        print(f"{name:10s} {ms(f64):9.3f} {ms(b64):9.3f} {ms(f32):9.3f} {ms(b32):9.3f} {ms(e):11.3f}")
    t64, t32 = med(per[whole][2]), med(per[half][2])
    print(f"forward+backward: {ms(t64):.3f} ms at {whole}, {ms(t32):.3f} ms at {half} (rounds: "
          + ", ".join(f"{ms(a):.2f}/{ms(b):.2f}" for a, b in zip(per[whole][2], per[half][2])) + ")")  # fmt: skip
    print(f"not halved, summed over the layers: {ms(extra):.3f} ms per worker; "
          f"{ms(t64):.3f} / {ms(t32):.3f} = {t64 / t32:.2f}x at most for two workers on this work")  # fmt: skip


if __name__ == "__main__":
    main()
