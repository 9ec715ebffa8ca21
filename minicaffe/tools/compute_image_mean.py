"""``python -m minicaffe.tools.compute_image_mean``: the mean image of a Datum database ->
``mean.binaryproto``, as Caffe's ``compute_image_mean``.

    python -m minicaffe.tools.compute_image_mean train_lmdb mean.binaryproto [--backend lmdb]

Reads every record in key order (encoded ones decoded with their own channels), sums in float32
record by record as Caffe does, divides by the count, and writes a BlobProto with num 1,
channels, height, width and the packed float data: the same bytes Caffe writes for the same
database.  Prints the mean of each channel (Caffe's ``mean_value channel [c]``).
"""

import argparse
import sys

import numpy as np

from ..data._util import DatasetError, atomic_write
from ..data.sources import DatumDBDataset
from .common import banner, one_line_errors


def mean_blobproto(sum_image, count):
    """The BlobProto bytes of ``sum_image / count`` (float32 (C, H, W)), laid out as Caffe's."""
    from .. import proto

    c, h, w = sum_image.shape
    blob = proto.Message("BlobProto", num=1, channels=c, height=h, width=w)
    blob.data = (sum_image / np.float32(count)).astype(np.float32).ravel()
    return proto.encode(blob)


def compute(db_path, backend=None, log=print):
    """-> (mean (C, H, W) float32, BlobProto bytes)."""
    ds = DatumDBDataset(db_path, backend)
    total = np.zeros(ds.shape, dtype=np.float32)
    for i in range(len(ds)):
        image, _ = ds.read(i)
        if image.shape != total.shape:
            raise DatasetError(f"{ds.db.where(ds.db.keys[i])}: image {image.shape}, the first record is {total.shape}")
        total += image.astype(np.float32)  # Caffe: float sum += pixel, one record at a time
        if (i + 1) % 10000 == 0:
            log(f"Processed {i + 1} files.")
    if len(ds) % 10000:
        log(f"Processed {len(ds)} files.")
    data = mean_blobproto(total, len(ds))
    mean = (total / np.float32(len(ds))).astype(np.float32)
    return mean, data


@one_line_errors
def main(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m minicaffe.tools.compute_image_mean", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("input_db")
    p.add_argument("output_file", nargs="?", help="the .binaryproto to write (none: only print the channel means)")
    p.add_argument("--backend", choices=("lmdb", "leveldb"), help="only needed when the files do not tell")
    a = p.parse_args(argv)
    print(banner())
    mean, data = compute(a.input_db, a.backend.upper() if a.backend else None)
    if a.output_file:
        print(f"Write to {a.output_file}")
        atomic_write(a.output_file, lambda f: f.write(data))
    print(f"Number of channels: {mean.shape[0]}")
    for c in range(mean.shape[0]):
        print(f"mean_value channel [{c}]: {float(mean[c].astype(np.float64).mean()):g}")


if __name__ == "__main__":
    sys.exit(main())
