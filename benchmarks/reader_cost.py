"""What the data reader's thread spends on one batch: LeNet's Data layer (MNIST train, batch 64,
``scale: 0.00390625``, shuffled), the two ways it can make a batch, timed alternately in one
process.

    python benchmarks/reader_cost.py                  # 9 rounds of 400 batches each way
    python benchmarks/reader_cost.py --batch 100 --rounds 5

"fused": ``BatchReader.fused``, the reads and the transform in one compiled call without the GIL
(``NpyFileDataset.gather_affine``); "numpy": the same reader with ``fused`` off: the compiled
reads into bytes (``gather``), then the Transformer's numpy passes (to float, times the scale).
Both give the same bits (tests/test_data_mnist.py).  "memory", for comparison: the same images
held in memory (``np.load``: 47 MB more resident memory, which is why minicaffe reads them from
the file), gathered by numpy indexing, then the numpy passes.  Per round and way: the thread's CPU per
batch (``time.thread_time``); the parts of the numpy way are timed once each.  The summary is
the median over rounds of each way and of the per-round ratio; the load average is printed
before and after.  This times the reader alone, on a core of its own: inside a training step
the same batch costs the thread 3-4x more (``benchmarks/gil_profile.py --no-gil``: other
threads share the caches and, here, the core).
"""

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def per_batch_us(fn, n):
    t = time.thread_time()
    for _ in range(n):
        fn()
    return (time.thread_time() - t) / n * 1e6


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--batches", type=int, default=400, help="batches per round and way")
    args = p.parse_args(argv)

    import numpy as np

    from minicaffe.data import BatchReader, Dataset, Transformer, get_dataset

    dataset = get_dataset("mnist_train")
    transformer = Transformer(scale=0.00390625, phase="TRAIN")
    reader = BatchReader(dataset, args.batch, transformer, shuffle=True, seed=1)
    fused = reader.fused
    if fused is None:
        sys.exit(f"the reader cannot fuse here ({dataset!r}): nothing to compare")
    in_memory = Dataset("in memory", np.load(dataset.path), dataset.labels)
    memory = BatchReader(in_memory, args.batch, transformer, shuffle=True, seed=1)
    pos = [(0, 0), (0, 0)]

    def produce():
        *_, pos[0] = reader.produce(*pos[0])

    def produce_memory():
        *_, pos[1] = memory.produce(*pos[1])

    print(f"mnist_train, batch {args.batch}: {args.rounds} rounds of {args.batches} batches each way; "
          f"load {os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
    times = {"fused": [], "numpy": [], "memory": []}
    for _ in range(args.rounds):
        for way in times:
            reader.fused = fused if way == "fused" else None
            fn = produce_memory if way == "memory" else produce
            fn()  # (compiled already; the first batch of a way after the other)
            times[way].append(per_batch_us(fn, args.batches))
    reader.fused = None
    batches = iter([reader.indices(1, i * args.batch)[0] for i in range(args.batches + 1)])  # fresh images
    idx, _ = reader.indices(0, 0)
    images, _ = dataset.gather(idx)
    parts = {
        "indices (the order, Python)": per_batch_us(lambda: reader.indices(0, args.batch), args.batches),
        "gather (compiled preads)": per_batch_us(lambda: dataset.gather(next(batches)), args.batches),
        "transform (numpy)": per_batch_us(lambda: transformer(images), args.batches),
        "labels to float": per_batch_us(lambda: dataset.labels[idx].astype(np.float32), args.batches),
    }
    ratios = [b / a for a, b in zip(times["fused"], times["numpy"])]
    for way, ts in times.items():
        print(f"  {way:6s} {statistics.median(ts):7.1f} us CPU per batch  (rounds {min(ts):.1f} .. {max(ts):.1f})")
    print(f"  numpy / fused {statistics.median(ratios):.2f}x (rounds {min(ratios):.2f} .. {max(ratios):.2f})")
    print("  the numpy way's parts, once each:")
    for name, us in parts.items():
        print(f"    {name:30s} {us:6.1f} us")
    print(f"load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
