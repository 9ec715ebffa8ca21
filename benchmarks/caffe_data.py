"""Reading Caffe's databases: what a Datum LMDB costs against the same images in memory.

    python benchmarks/caffe_data.py              # 60,000 MNIST-sized records, batches of 64
    python benchmarks/caffe_data.py --records 10000 --batch 100

Writes a synthetic MNIST-shaped IDX pair into a temporary directory, converts it with
``convert_mnist_data`` (timed: records/s), opens the LMDB (its key list, timed), then times a
batch (decode every Datum with minicaffe's protobuf codec + ``scale``) from the LMDB and from an
in-memory uint8 array of the same images (the registered-dataset path), median of 3 runs of 200
batches each, and checks both give the same batch.  Prints the load average beside the figures.
"""

import argparse
import os
import tempfile
import time

import numpy as np

from minicaffe.data import BatchReader, Transformer
from minicaffe.data.dataset import Dataset
from minicaffe.data.idx import write_idx
from minicaffe.data.sources import DatumDBDataset
from minicaffe.tools import convert_mnist_data


def batch_time(reader, batches=200, repeats=3):
    reader.produce(0, 0)  # warm up
    times = []
    for _ in range(repeats):
        t, pos = time.perf_counter(), (0, 0)
        for _ in range(batches):
            *_, pos = reader.produce(*pos)
        times.append((time.perf_counter() - t) / batches)
    return float(np.median(times))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=60000)
    p.add_argument("--batch", type=int, default=64)
    a = p.parse_args(argv)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (a.records, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, a.records).astype(np.uint8)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory() as tmp:
        write_idx(os.path.join(tmp, "img"), images)
        write_idx(os.path.join(tmp, "lab"), labels)
        db = os.path.join(tmp, "lmdb")
        t = time.perf_counter()
        convert_mnist_data.convert(os.path.join(tmp, "img"), os.path.join(tmp, "lab"), db, log=lambda m: None)
        t_convert = time.perf_counter() - t
        t = time.perf_counter()
        lmdb_set = DatumDBDataset(db)
        t_open = time.perf_counter() - t
        memory_set = Dataset("memory", images[:, None], labels)
        transform = Transformer(scale=1 / 256)
        readers = {
            n: BatchReader(ds, a.batch, transform, shuffle=False)
            for n, ds in (("lmdb", lmdb_set), ("memory", memory_set))
        }
        np.testing.assert_array_equal(readers["lmdb"].produce(0, 128)[0], readers["memory"].produce(0, 128)[0])
        t_lmdb, t_mem = batch_time(readers["lmdb"]), batch_time(readers["memory"])
    print(f"convert_mnist_data: {a.records} records in {t_convert:.2f} s ({a.records / t_convert:,.0f} records/s)")
    print(f"open the LMDB (key list): {t_open:.3f} s")
    print(
        f"batch of {a.batch}: LMDB {1e3 * t_lmdb:.2f} ms ({a.batch / t_lmdb:,.0f} images/s), "
        f"in memory {1e3 * t_mem:.2f} ms; ratio {t_lmdb / t_mem:.1f}x"
    )
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
