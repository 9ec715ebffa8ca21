"""CIFAR-10 from the standard binary batches, when the user has them.

No package registry ships CIFAR-10, so minicaffe never downloads it.  Get
``cifar-10-binary.tar.gz`` from https://www.cs.toronto.edu/~kriz/cifar.html and put either the
archive itself or its extracted folder ``cifar-10-batches-bin/`` in the data directory ``D``
(:func:`minicaffe.data.data_dir`), or put the ``.bin`` files directly in ``D`` or ``D/cifar10``.

Each ``.bin`` file is 10,000 records of 1 label byte + 3072 pixel bytes (1024 red, 1024 green,
1024 blue, each 32 x 32 row-major), i.e. already (C, H, W) order.  ``train`` is
``data_batch_1.bin`` .. ``data_batch_5.bin`` (50,000), ``test`` is ``test_batch.bin`` (10,000).
Images are (N, 3, 32, 32) uint8 in RGB order (Caffe's own convert_cifar_data keeps this order),
labels (N,) int64.
"""

import tarfile

import numpy as np

from ._util import DatasetError, data_dir

RECORD = 1 + 3 * 32 * 32
FILES = {"train": [f"data_batch_{i}.bin" for i in range(1, 6)], "test": ["test_batch.bin"]}
ARCHIVE = "cifar-10-binary.tar.gz"
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")

_memo = {}


def parse_batch(data, name="<bytes>"):
    """Decode one binary batch -> (images (N, 3, 32, 32) uint8, labels (N,) int64)."""
    if len(data) == 0 or len(data) % RECORD:
        raise DatasetError(
            f"{name}: {len(data)} bytes is not a whole number of CIFAR-10 records "
            f"({RECORD} bytes each: 1 label + 3072 pixels)"
        )
    records = np.frombuffer(data, dtype=np.uint8).reshape(-1, RECORD)
    labels = records[:, 0].astype(np.int64)
    if labels.max() > 9:
        raise DatasetError(f"{name}: label {labels.max()} out of range 0..9; is this the CIFAR-10 (not -100) binary?")
    return records[:, 1:].reshape(-1, 3, 32, 32).copy(), labels


def _search_dirs(root):
    return [root / "cifar-10-batches-bin", root / "cifar10" / "cifar-10-batches-bin", root / "cifar10", root]


def _read_split(split, root):
    names = FILES[split]
    for d in _search_dirs(root):
        if all((d / n).is_file() for n in names):
            return [((d / n).read_bytes(), str(d / n)) for n in names]
    for archive in (root / ARCHIVE, root / "cifar10" / ARCHIVE):
        if archive.is_file():
            try:
                with tarfile.open(archive, "r:gz") as tar:
                    members = {m.name.rsplit("/", 1)[-1]: m for m in tar.getmembers() if m.isfile()}
                    missing = [n for n in names if n not in members]
                    if missing:
                        raise DatasetError(f"{archive} does not hold {', '.join(missing)}")
                    return [(tar.extractfile(members[n]).read(), f"{archive}!{n}") for n in names]
            except (tarfile.TarError, OSError, EOFError) as e:
                raise DatasetError(f"{archive}: cannot read the archive ({e})") from None
    tried = ", ".join(str(d) for d in _search_dirs(root))
    raise DatasetError(
        f"CIFAR-10 {split} data not found: need {', '.join(names)} (the binary version) in one of {tried}, or "
        f"{ARCHIVE} in {root}. No package registry ships CIFAR-10: download {ARCHIVE} from "
        f"https://www.cs.toronto.edu/~kriz/cifar.html and put it there (or point MINICAFFE_DATA / --data-dir at "
        f'where it is). For benchmarks without the files use source "synthetic:3x32x32:10".'
    )


def load(split, cache_dir=None):
    """CIFAR-10 ``split`` ("train" or "test") -> (images, labels)."""
    if split not in FILES:
        raise DatasetError(f"CIFAR-10 has splits 'train' and 'test', not '{split}'")
    root = data_dir(cache_dir)
    key = (split, str(root))
    if key not in _memo:
        parts = [parse_batch(data, name) for data, name in _read_split(split, root)]
        _memo[key] = (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
    return _memo[key]
