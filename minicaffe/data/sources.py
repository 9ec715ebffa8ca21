"""Datasets read from files as Caffe users have them, record by record (never all in memory).

- :class:`DatumDBDataset`  an LMDB / LevelDB of ``Datum`` records (the Data layer's source)
- :class:`ImageListDataset`  a text list of ``path label`` lines (the ImageData layer's source)

Both look like a :class:`~minicaffe.data.dataset.Dataset` to a :class:`~minicaffe.data.BatchReader`:
``len()``, ``shape`` (C, H, W of the first record), ``labels`` (not None: every record has one),
and ``gather(indices) -> (images, labels)``, reading only the records asked for.  ``images`` is
one (N, C, H, W) array when the records share a shape, else a list of (C, H, W) arrays (encoded
images of different sizes; the transformer crops them one by one).
"""

import os

import numpy as np

from ._util import DatasetError
from .datum import decode_datum, read_image
from .db import open_db


def _stack(images):
    first = images[0].shape
    if all(im.shape == first for im in images):
        return np.stack(images)
    return images


class DatumDBDataset:
    """The ``Datum`` records of a database, in key order (Caffe's cursor order)."""

    def __init__(self, path, backend=None, is_color=None):
        self.db = open_db(path, backend)
        self.name = str(path)
        self.is_color = is_color
        first, _ = self.read(0)
        self.shape = tuple(first.shape)
        self.labels = True  # every Datum carries a label (0 when unset)

    def __len__(self):
        return len(self.db)

    def read(self, i):
        key = self.db.keys[i]
        return decode_datum(self.db.get(key), self.db.where(key), self.is_color)

    def gather(self, indices):
        images, labels = [], np.empty(len(indices), dtype=np.int64)
        for j, i in enumerate(indices):
            image, labels[j] = self.read(int(i))
            images.append(image)
        return _stack(images), labels

    def __repr__(self):
        return f"DatumDBDataset({self.name!r}, {self.db.backend}, {len(self)} records, first {self.shape})"


def parse_image_list(path, root_folder=""):
    """Caffe's ImageData list: each line ``<path> <label>``, split at the LAST space (so a path may
    contain spaces), label an integer.  -> (paths, labels, line numbers)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise DatasetError(f"image list '{path}' cannot be read: {e.strerror or e}") from None
    paths, labels, numbers = [], [], []
    for n, line in enumerate(lines, 1):
        line = line.rstrip("\r")
        if not line.strip():
            continue
        name, sep, label = line.rpartition(" ")
        if not sep or not name:
            raise DatasetError(f"{path}:{n}: expected '<image path> <label>', got {line!r}")
        try:
            labels.append(int(label))
        except ValueError:
            raise DatasetError(f"{path}:{n}: the label '{label}' is not an integer") from None
        paths.append(root_folder + name)
        numbers.append(n)
    if not paths:
        raise DatasetError(f"image list '{path}' has no images")
    return paths, np.asarray(labels, dtype=np.int64), numbers


class ImageListDataset:
    """Images named in a list file, decoded (Pillow) when read, BGR as Caffe's OpenCV."""

    def __init__(self, list_path, root_folder="", new_height=0, new_width=0, is_color=True):
        self.name = str(list_path)
        self.paths, self.labels, self.lines = parse_image_list(list_path, root_folder)
        self.new_height, self.new_width, self.is_color = int(new_height), int(new_width), bool(is_color)
        if (self.new_height > 0) != (self.new_width > 0):
            raise DatasetError("new_height and new_width must be given together (Caffe's rule)")
        self.shape = tuple(self.read(0).shape)

    def __len__(self):
        return len(self.paths)

    def read(self, i):
        path = self.paths[i]
        where = f"{self.name}:{self.lines[i]}"
        if not os.path.isfile(path):
            raise DatasetError(f"{where}: image '{path}' not found")
        return read_image(path, self.new_height, self.new_width, self.is_color, where=where)

    def gather(self, indices):
        images = [self.read(int(i)) for i in indices]
        return _stack(images), self.labels[np.asarray(indices, dtype=np.int64)]

    def __repr__(self):
        return f"ImageListDataset({self.name!r}, {len(self)} images, first {self.shape})"
