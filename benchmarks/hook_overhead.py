"""What Net's per-layer hooks cost: LeNet's TRAIN forward-backward, in one process, interleaved.

    python benchmarks/hook_overhead.py [--iterations 400]

Three loops over the same net and the same synthetic batch, one after the other in every round
(so a change in the machine's load hits all three alike): the plain loop written out (each
layer's forward_loss, then backward), ``net.forward_backward()`` with no hook registered, and
``net.forward_backward()`` with two no-op hooks (before_forward, after_backward). Prints each
median and its ratio to the plain loop.
"""

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iterations", type=int, default=400)
    p.add_argument("--warmup", type=int, default=30)
    args = p.parse_args()
    import minicaffe as caffe
    from minicaffe import proto
    from minicaffe.parallel import with_synthetic_data

    path = os.path.join(os.path.dirname(HERE), "nets", "lenet_train_test.prototxt")
    caffe.set_random_seed(1)
    net = caffe.Net(with_synthetic_data(proto.parse_file(path, "NetParameter")), caffe.TRAIN)

    def plain():
        loss = 0.0
        layers, bottoms, tops = net.layers, net.bottom_vecs, net.top_vecs
        for i in range(len(layers)):
            loss += layers[i].forward_loss(bottoms[i], tops[i])
        for i in range(len(layers) - 1, -1, -1):
            if net.layer_need_backward[i]:
                layers[i].backward(tops[i], net.bottom_need_backward[i], bottoms[i])
        return loss

    def hooked():
        with net.add_hooks(before_forward=lambda i: None, after_backward=lambda i: None):
            t = time.perf_counter()
            net.forward_backward()
            return time.perf_counter() - t

    for _ in range(args.warmup):
        plain()
        net.forward_backward()
    times = {"plain loop": [], "no hooks": [], "two no-op hooks": []}
    for _ in range(args.iterations):
        t = time.perf_counter()
        plain()
        times["plain loop"].append(time.perf_counter() - t)
        t = time.perf_counter()
        net.forward_backward()
        times["no hooks"].append(time.perf_counter() - t)
        times["two no-op hooks"].append(hooked())
    base = statistics.median(times["plain loop"])
    print(f"LeNet TRAIN forward-backward, batch 64, median of {args.iterations}, load {os.getloadavg()[0]:.2f}")
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"  {name:16s} {m * 1e3:8.3f} ms   {m / base:.3f} x plain")


if __name__ == "__main__":
    main()
