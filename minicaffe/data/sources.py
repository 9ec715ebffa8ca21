"""Datasets read from files as Caffe users have them, record by record (never all in memory).

- :class:`DatumDBDataset`  an LMDB / LevelDB of ``Datum`` records (the Data layer's source)
- :class:`ImageListDataset`  a text list of ``path label`` lines (the ImageData layer's source)
- :class:`NpyFileDataset`  images in an uncompressed ``.npy`` file, each batch read with one
  positional read per run of consecutive images (MNIST's built-in sets: 55 MB not held in memory)

All three look like a :class:`~minicaffe.data.dataset.Dataset` to a :class:`~minicaffe.data.BatchReader`:
``len()``, ``shape`` (C, H, W of the first record), ``labels`` (not None: every record has one),
and ``gather(indices) -> (images, labels)``, reading only the records asked for.  ``images`` is
one (N, C, H, W) array when the records share a shape, else a list of (C, H, W) arrays (encoded
images of different sizes; the transformer crops them one by one).
"""

import os
import sys
import threading

import numpy as np
from numba import njit, types

from ._util import DatasetError
from .datum import decode_datum, read_image
from .db import open_db

#: C's ``ssize_t pread(int fd, void *buf, size_t count, off_t offset)``, called by its name from
#: compiled code (LLVM links it against the C library, so the kernel below can be cached); the
#: buffer is passed as its address (an integer: a pointer's register on 64-bit platforms)
_pread = types.ExternalFunction("pread", types.intp(types.intc, types.uintp, types.uintp, types.int64))
#: where ``read_rows`` can run: POSIX (pread) with a 64-bit off_t
NOGIL_READS = hasattr(os, "preadv") and sys.maxsize > 2**32


@njit(nogil=True, cache=True)
def read_rows(fd, offset, item, indices, rows):
    """Fill ``rows`` (n, item) uint8 with the records ``indices`` of a file of ``item``-byte
    records starting at byte ``offset``: one pread per run of consecutive indices, all of them
    without the GIL (from Python each read is a call that drops and takes the GIL again, 64 of
    them for a shuffled batch of 64, while the training threads want it).  Returns (-1, 0), or
    (j, bytes read) for the read that came short, starting at ``indices[j]``."""
    base = rows.ctypes.data
    n = indices.size
    j = 0
    while j < n:
        r = 1
        while j + r < n and indices[j + r] == indices[j] + r:
            r += 1
        want = r * item
        got = _pread(fd, base + j * item, want, offset + indices[j] * item)
        if got != want:
            return j, got
        j += r
    return -1, 0


@njit(nogil=True, cache=True)
def read_rows_affine(fd, offset, item, indices, rows, out, mean, scale):
    """``read_rows``, then ``out[i, c, :] = (rows[i] as out's float type - mean[c]) * scale[0]``
    for the (n, C, H*W) float output ``out``: the Transformer's per-channel affine (minicaffe.data.
    transform) done in the same call without the GIL.  Each step is the one numpy does, in the
    same float type (the store converts a byte exactly, then one subtraction, one product), so the
    bits are numpy's; a mean of 0 and a scale of 1 change no bit.  Returns ``read_rows``'s."""
    j, got = read_rows(fd, offset, item, indices, rows)
    if j >= 0:
        return j, got
    n, channels, plane = out.shape
    s = scale[0]
    for i in range(n):
        for c in range(channels):
            m = mean[c]
            for p in range(plane):
                out[i, c, p] = rows[i, c * plane + p]  # exact: a byte fits any float type
                out[i, c, p] = (out[i, c, p] - m) * s
    return -1, 0


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


class NpyFileDataset:
    """Images (N, C, H, W) in an uncompressed ``.npy`` file, labels (N,) in memory.

    ``gather`` allocates the batch and fills it with ``pread`` straight from the file (no
    memory map, so no page of the file becomes part of the process's resident memory; the
    kernel's page cache keeps the file warm for the next epoch): one call per run of consecutive
    indices, so a test set read in order costs one call per batch and a shuffled batch of 64 costs
    64 calls of one image each, made by ``read_rows`` without the GIL (where C's pread is not
    there, by ``os.preadv`` from Python).  The bytes are those of the array ``np.load`` would
    return.
    """

    def __init__(self, name, path, labels):
        from numpy.lib import format as npy

        self.name, self.path = name, str(path)
        with open(self.path, "rb") as f:
            try:
                version = npy.read_magic(f)
                header = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
                shape, fortran, dtype = header(f)
            except ValueError as e:
                raise DatasetError(f"{self.path}: not a .npy file ({e})") from None
            self.offset = f.tell()
            size = os.fstat(f.fileno()).st_size
        if len(shape) != 4 or fortran or dtype.hasobject:
            raise DatasetError(f"{self.path}: expected a C-ordered (N, C, H, W) array, got {shape} {dtype}")
        self.dtype, self.count, self.shape = dtype, int(shape[0]), tuple(int(d) for d in shape[1:])
        self.item = int(np.prod(self.shape)) * dtype.itemsize  # bytes per image
        if self.offset + self.count * self.item != size:
            raise DatasetError(
                f"{self.path}: holds {size} bytes; a {shape} {dtype} array after its {self.offset}-byte header "
                f"needs {self.offset + self.count * self.item} (a truncated or damaged file)"
            )
        labels = np.asarray(labels)
        if labels.shape != (self.count,):
            raise DatasetError(f"{self.path}: {self.count} images but labels of shape {labels.shape}")
        self.labels = labels
        self._fd = os.open(self.path, os.O_RDONLY)
        self._lock = None if hasattr(os, "preadv") else threading.Lock()  # seek + read elsewhere

    def __len__(self):
        return self.count

    def _read(self, out, offset):
        if self._lock is None:
            return os.preadv(self._fd, [out], offset)
        with self._lock:
            os.lseek(self._fd, offset, os.SEEK_SET)
            return os.readv(self._fd, [out])

    def gather(self, indices):
        idx, fd = self._check(indices)
        out = np.empty((idx.size,) + self.shape, dtype=self.dtype)
        rows = out.view(np.uint8).reshape(idx.size, self.item)  # one row of bytes per image
        if not idx.size:
            return out, self.labels[idx]
        if NOGIL_READS:
            j, got = read_rows(fd, self.offset, self.item, idx, rows)
            if j < 0:
                return out, self.labels[idx]
            self._read_failed(idx, rows, j, got)
        starts = np.flatnonzero(np.diff(idx) != 1) + 1
        for a, b in zip([0, *starts.tolist()], [*starts.tolist(), idx.size]):
            want = (b - a) * self.item
            got = self._read(rows[a:b], self.offset + int(idx[a]) * self.item)
            if got != want:
                raise DatasetError(
                    f"{self.path}: image {int(idx[a])}: the read came short ({got} bytes; file changed?)"
                )
        return out, self.labels[idx]

    def can_gather_affine(self):
        """Whether :meth:`gather_affine` can do the transform in the compiled read: bytes (uint8)
        images, and C's pread."""
        return NOGIL_READS and self.dtype == np.uint8

    def gather_affine(self, indices, mean, scale):
        """``gather`` and the Transformer's affine part in one compiled call without the GIL:
        -> (images (n, C, H, W) of ``mean``'s float type, each ``(pixel - mean[c]) * scale``,
        labels).  The bits are those of ``Transformer(...)(gather(indices)[0])`` (see
        :meth:`can_gather_affine` for when it applies); it saves a Python thread the transform's
        passes and arrays (``benchmarks/reader_cost.py``)."""
        idx, fd = self._check(indices)
        out = np.empty((idx.size,) + self.shape, dtype=mean.dtype)
        rows = np.empty((idx.size, self.item), dtype=np.uint8)
        scale = np.full(1, scale, dtype=mean.dtype)
        j, got = read_rows_affine(
            fd, self.offset, self.item, idx, rows, out.reshape(idx.size, self.shape[0], -1), mean, scale
        )
        if j >= 0:
            self._read_failed(idx, rows, j, got)
        return out, self.labels[idx]

    def _check(self, indices):
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= self.count):
            raise DatasetError(f"'{self.name}': image index out of range 0..{self.count - 1}")
        if self._fd is None:
            raise DatasetError(f"'{self.name}': {self.path} was closed")
        return idx, self._fd

    def _read_failed(self, idx, rows, j, got):
        """Raise the clear error of a compiled read that came short at ``idx[j]``."""
        where = f"{self.path}: image {int(idx[j])}"
        if got < 0:  # the system's reason: the same read again, from Python
            try:
                self._read(rows[j : j + 1], self.offset + int(idx[j]) * self.item)
            except (OSError, TypeError) as e:
                raise DatasetError(f"{where} cannot be read: {getattr(e, 'strerror', None) or e}") from None
        raise DatasetError(f"{where}: the read came short ({got} bytes; file changed?)")

    def close(self):
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __del__(self):
        try:
            self.close()
        except (AttributeError, OSError):  # a half-built instance, or interpreter shutdown
            pass

    def __repr__(self):
        return f"NpyFileDataset({self.name!r}, {self.path!r}, {self.count} x {'x'.join(map(str, self.shape))})"


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
