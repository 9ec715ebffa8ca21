"""``python -m minicaffe.test``: score a net with trained weights, as ``caffe test`` does.

    python -m minicaffe.test lenet --weights runs/lenet/lenet_iter_10000.caffemodel
    python -m minicaffe.test path/to/train_test.prototxt --weights w.caffemodel --iterations 100

Runs the net (TEST phase by default) for ``--iterations`` batches, prints every batch's outputs
(``Batch 3, accuracy = 0.99``) and the mean of each output over all batches.
"""

import argparse
import time

import numpy as np

from .common import run_net_tool


def build_parser():
    p = argparse.ArgumentParser(prog="python -m minicaffe.test", description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="a short name from nets/ (lenet, ...) or a net prototxt")
    p.add_argument("--weights", required=True, help="trained weights (.caffemodel or .npz)")
    p.add_argument("--iterations", type=int, default=50, help="number of batches (default 50, as caffe test)")
    p.add_argument("--phase", choices=("TEST", "TRAIN"), default="TEST")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    p.add_argument("--data-dir", help="dataset cache directory")
    p.add_argument("--quiet", action="store_true", help="print only the means")
    return p


def score(net, iterations, log, quiet=False):
    """Run ``iterations`` forward passes; return {output: mean} (scalar outputs as floats)."""
    sums = {}
    for i in range(iterations):
        net.forward_from_to()
        for name in net.outputs:
            v = np.asarray(net.blobs[name].cpu_data(), dtype=np.float64).ravel()
            sums[name] = sums[name] + v if name in sums else v.copy()
            if not quiet:
                log(f"Batch {i}, {name} = " + " ".join(f"{x:.6g}" for x in v))
    means = {name: s / iterations for name, s in sums.items()}
    for name, m in means.items():
        weight = net.blob_loss_weights.get(name, 0.0)
        extra = f" (* {weight:g} = {weight * m[0]:.6g} loss)" if weight and m.size == 1 else ""
        log(f"{name} = " + " ".join(f"{x:.6g}" for x in m) + extra)
    return {name: (float(m[0]) if m.size == 1 else m.tolist()) for name, m in means.items()}


def main(argv=None):
    args = build_parser().parse_args(argv)

    def body(net, path, log):
        log(f"Scoring {net.name} ({path}) with {args.weights} for {args.iterations} iterations")
        t = time.perf_counter()
        score(net, args.iterations, log, args.quiet)
        log(f"Done in {time.perf_counter() - t:.2f} s")

    return run_net_tool(args, body)
