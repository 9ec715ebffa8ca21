"""``python -m minicaffe.tools.convert_mnist_data``: MNIST's IDX files -> an LMDB/LevelDB, as
Caffe's ``examples/mnist/convert_mnist_data``.

    python -m minicaffe.tools.convert_mnist_data train-images-idx3-ubyte train-labels-idx1-ubyte \\
        mnist_train_lmdb [--backend lmdb|leveldb]

Keys ``%08d`` (the item number), values Datums of channels 1, height rows, width cols, data (the
pixels), label: the same bytes Caffe writes (no ``encoded`` field: Caffe's tool never sets it).
The IDX files may be gzipped.  Magic numbers are checked as Caffe does (2051 images, 2049 labels).
"""

import argparse
import sys

from ..data._util import DatasetError
from ..data.datum import encode_datum
from ..data.db import Writer
from ..data.idx import read_idx
from .common import banner, one_line_errors


def convert(image_file, label_file, db_path, backend="lmdb", log=print):
    images, labels = read_idx(image_file), read_idx(label_file)
    if images.ndim != 3 or images.dtype.name != "uint8":
        raise DatasetError(f"{image_file}: not an MNIST image file (expected uint8 N x rows x cols, magic 2051)")
    if labels.ndim != 1 or labels.dtype.name != "uint8":
        raise DatasetError(f"{label_file}: not an MNIST label file (expected uint8 N, magic 2049)")
    if len(images) != len(labels):
        raise DatasetError(f"{image_file} has {len(images)} images but {label_file} has {len(labels)} labels")
    log(f"A total of {len(images)} items.")
    log(f"Rows: {images.shape[1]} Cols: {images.shape[2]}")
    with Writer(db_path, backend) as db:
        for i in range(len(images)):
            db.put(f"{i:08d}", encode_datum(images[i][None], int(labels[i]), set_encoded=False))
    log(f"Processed {len(images)} files.")
    return len(images)


@one_line_errors
def main(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m minicaffe.tools.convert_mnist_data", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("input_image_file")
    p.add_argument("input_label_file")
    p.add_argument("output_db_file")
    p.add_argument("--backend", default="lmdb", choices=("lmdb", "leveldb"))
    a = p.parse_args(argv)
    print(banner())
    convert(a.input_image_file, a.input_label_file, a.output_db_file, a.backend)


if __name__ == "__main__":
    sys.exit(main())
