"""The dataset registry: what a prototxt's ``data_param { source: "..." }`` names.

Caffe's Data layer reads the LMDB or LevelDB at the path in ``source``; minicaffe does too, and
also accepts dataset *names*.  First match wins:

====================================================  ============================================
``source``                                             dataset
====================================================  ============================================
a name given to :func:`register_dataset`               your arrays (exact name; checked first)
``mnist_train`` / ``mnist_test``                       MNIST, 60,000 / 10,000 images 1x28x28 uint8,
                                                       read from disk per batch
the path of an LMDB or LevelDB directory               its Datum records, in key order, read as
                                                       needed (:mod:`.db`, :mod:`.sources`)
any path ending in ``mnist_train_lmdb`` or             MNIST train / test, so Caffe's
``mnist_train_leveldb`` (``mnist_test_*``) that is     ``examples/mnist/lenet_train_test.prototxt``
not a database on disk                                 runs unchanged without converting MNIST
``cifar10_train`` / ``cifar10_test``                   CIFAR-10 binary batches (user-provided files),
                                                       50,000 / 10,000 images 3x32x32 uint8
any path ending in ``cifar10_train_lmdb`` /            CIFAR-10 train / test (Caffe's
``cifar10_test_lmdb`` (or ``_leveldb``)                ``examples/cifar10/*.prototxt``)
``synthetic:CxHxW[:classes[:count[:seed]]]``           seeded synthetic images (defaults: 10
                                                       classes, 1024 images, seed 0)
a path to an ``.npz`` file                             its arrays ``images`` (or ``data``) and
                                                       ``labels`` (optional)
====================================================  ============================================

Register your own in-memory dataset (tests and notebooks do this)::

    import minicaffe.data
    minicaffe.data.register_dataset("my_digits", images, labels)   # images (N,C,H,W) uint8 or float
    # prototxt:  data_param { source: "my_digits" batch_size: 32 }

``register_dataset(name, factory)`` with a callable registers a dataset loaded on first use.
"""

import threading
from pathlib import Path

import numpy as np

from . import cifar10, mnist, synthetic
from ._util import DatasetError, data_dir
from .dataset import Dataset
from .db import detect_backend, fingerprint

_user = {}  # name -> Dataset or factory
_loaded = {}  # (canonical name, data dir) -> Dataset
_lock = threading.RLock()

BUILTIN = {
    "mnist_train": ("MNIST training set, 60000 x 1x28x28 uint8", lambda: _mnist("train")),
    "mnist_test": ("MNIST test set, 10000 x 1x28x28 uint8", lambda: _mnist("test")),
    "cifar10_train": ("CIFAR-10 training batches (your files), 50000 x 3x32x32 uint8", lambda: _cifar("train")),
    "cifar10_test": ("CIFAR-10 test batch (your file), 10000 x 3x32x32 uint8", lambda: _cifar("test")),
}

# Caffe's example databases (the last part of the path) -> our names.
CAFFE_PATHS = {
    f"{ds}_{split}_{db}": f"{ds}_{split}"
    for ds in ("mnist", "cifar10")
    for split in ("train", "test")
    for db in ("lmdb", "leveldb")
}


def _mnist(split):
    return mnist.open_split(split)  # read from disk batch by batch (mnist.py, "Training reads batches")


def _cifar(split):
    images, labels = cifar10.load(split)
    return Dataset(f"cifar10_{split}", images, labels)


def register_dataset(name, images, labels=None):
    """Make ``name`` usable as a ``data_param { source: name }``.

    ``images``: an array (N, C, H, W) (or (N, H, W), (N, D)) of uint8 or float, kept as given;
    ``labels``: (N,) or None.  Or ``images`` is a callable returning a :class:`Dataset` or an
    (images, labels) pair, called on first use.  Registering a name again replaces it.
    """
    if not isinstance(name, str) or not name:
        raise DatasetError(f"a dataset name must be a non-empty string, got {name!r}")
    with _lock:
        _user[name] = images if callable(images) else Dataset(name, images, labels)
        for key in [k for k in _loaded if k[0] == name]:
            del _loaded[key]


def unregister_dataset(name):
    with _lock:
        _user.pop(name, None)
        for key in [k for k in _loaded if k[0] == name]:
            del _loaded[key]


def known_sources():
    """{name: description} of every name ``source`` may take (patterns shown as patterns)."""
    out = {name: "registered by register_dataset" for name in _user}
    out.update({name: desc for name, (desc, _) in BUILTIN.items()})
    out["<path of an LMDB/LevelDB>"] = "Caffe's Datum database (convert_imageset, convert_mnist_data)"
    out.update({f".../{path}": f"Caffe's database path, read as {name}" for path, name in CAFFE_PATHS.items()})
    out["synthetic:CxHxW[:classes[:count[:seed]]]"] = "seeded synthetic images of any shape"
    out["<path>.npz"] = "arrays 'images' (or 'data') and 'labels' from an .npz file"
    return out


def resolve_source(source):
    """The canonical dataset name for a ``source`` string (see the table above)."""
    source = str(source).strip()
    if source in _user or source in BUILTIN:
        return source
    if source.startswith("synthetic"):
        return source
    if detect_backend(source):
        return source
    tail = source.rstrip("/\\").replace("\\", "/").rsplit("/", 1)[-1]
    if tail in CAFFE_PATHS:
        return CAFFE_PATHS[tail]
    if source.endswith(".npz"):
        return source
    listing = "\n".join(f"  {k:44s} {v}" for k, v in known_sources().items())
    raise DatasetError(
        f"unknown data source '{source}': no LMDB or LevelDB database there, and not a dataset name. Known:\n"
        f"{listing}\n"
        f"Make a database with python -m minicaffe.tools.convert_imageset (an image list) or "
        f"convert_mnist_data (IDX files), or register arrays with "
        f"minicaffe.data.register_dataset('{tail or 'name'}', images, labels) before building the net."
    )


def get_dataset(source, backend=None, is_color=None):
    """The :class:`Dataset` for a ``source`` string, loaded (and fetched) on first use.

    A database path gives a :class:`~minicaffe.data.sources.DatumDBDataset` (``backend`` is a
    hint used only when the files do not tell; ``is_color`` None decodes encoded images with
    their own channels, True/False forces colour/grey).
    """
    name = resolve_source(source)
    if name not in _user and detect_backend(name):
        from .sources import DatumDBDataset

        key = ("db", str(Path(name).resolve()), fingerprint(name), is_color)
        with _lock:
            if key not in _loaded:
                _loaded[key] = DatumDBDataset(name, backend, is_color)
            return _loaded[key]
    key = (name, str(data_dir()))
    with _lock:
        if key in _loaded:
            return _loaded[key]
        if name in _user:
            entry = _user[name]
            ds = entry() if callable(entry) else entry
            if not isinstance(ds, Dataset):
                ds = Dataset(name, *ds)
        elif name in BUILTIN:
            ds = BUILTIN[name][1]()
        elif name.startswith("synthetic"):
            ds = Dataset(name, *synthetic.make(**synthetic.parse_spec(name)))
        else:
            ds = _npz(name)
        _loaded[key] = ds
        return ds


def _npz(path):
    p = Path(path).expanduser()
    if not p.is_file():
        raise DatasetError(f"data source '{path}': no such .npz file")
    try:
        with np.load(p, allow_pickle=False) as z:
            key = "images" if "images" in z.files else "data" if "data" in z.files else None
            if key is None:
                raise DatasetError(
                    f"{path}: an .npz data source needs an array 'images' (or 'data'); "
                    f"it has {', '.join(z.files) or 'none'}"
                )
            return Dataset(str(path), z[key], z["labels"] if "labels" in z.files else None)
    except (OSError, ValueError) as e:
        raise DatasetError(f"{path}: cannot read .npz data source ({e})") from None
