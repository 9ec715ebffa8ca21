"""HDF5Data: batches read from HDF5 files, one dataset per top (Caffe's HDF5DataLayer).

    layer { name: "data" type: "HDF5Data" top: "data" top: "label"
            hdf5_data_param { source: "train.txt" batch_size: 10 shuffle: true } }

``source`` is a text file naming one HDF5 file per line (a path as written, relative to the
working directory as in Caffe, or else to the list file's directory).  Each file holds a dataset
named as each top (``data``, ``label``, ...), all with the same number of rows N_f; row i of
every dataset is one example.  A top's shape is (batch_size, *dataset.shape[1:]); the values are
converted to the net's float type (integer datasets too).  Files are read whole, one at a time,
when a batch first needs them (Caffe loads one file at a time too).

Order, as Caffe: file by file in list order, row by row, wrapping around after the last file.
With ``shuffle`` the order of the files and the rows within each file are permuted afresh every
epoch (seeded as the Data layer).  No ``transform_param``: Caffe does not transform HDF5 data.
h5py is needed (``pip install h5py``).  A file without a top's dataset, or datasets of
different row counts, stop the layer with an error naming the file and the dataset.
"""

import os
import threading

import numpy as np

from ..data import BatchReader, DatasetError, Prefetcher
from ..layer import register
from .data import DEFAULT_PREFETCH, Data, layer_seed

H5PY_HINT = "HDF5 files need the h5py package: pip install h5py (or pip install 'minicaffe[data]')"


def h5py_module():
    try:
        import h5py
    except ImportError:
        raise DatasetError(H5PY_HINT) from None
    return h5py


def read_file_list(source):
    """The HDF5 file names of a list file (whitespace-separated, as Caffe's ``>>`` reads them)."""
    try:
        with open(source, encoding="utf-8") as f:
            names = f.read().split()
    except OSError as e:
        raise DatasetError(f"HDF5 file list '{source}' cannot be read: {e.strerror or e}") from None
    if not names:
        raise DatasetError(f"HDF5 file list '{source}' names no files")
    base = os.path.dirname(os.path.abspath(source))
    out = []
    for name in names:
        if not os.path.exists(name) and os.path.exists(os.path.join(base, name)):
            name = os.path.join(base, name)
        out.append(name)
    return out


class HDF5Dataset:
    """The rows of datasets ``names`` across ``files``; reads one whole file at a time."""

    def __init__(self, source, names, dtype):
        h5py = h5py_module()
        self.name, self.names, self.dtype = source, list(names), np.dtype(dtype)
        self.files = read_file_list(source)
        self.rows, self.shapes = [], None
        for path in self.files:
            try:
                with h5py.File(path, "r") as f:
                    shapes = []
                    for name in self.names:
                        if name not in f or not isinstance(f[name], h5py.Dataset):
                            have = ", ".join(sorted(f.keys())) or "none"
                            raise DatasetError(
                                f"HDF5 file '{path}' (listed in {source}) has no dataset '{name}' (it has: {have})"
                            )
                        ds = f[name]
                        if ds.ndim < 1 or ds.dtype.kind not in "uif":
                            raise DatasetError(
                                f"HDF5 file '{path}': dataset '{name}' must be numbers of >= 1 dimension, got {ds.dtype} {ds.shape}"
                            )
                        shapes.append(tuple(ds.shape))
            except OSError as e:
                raise DatasetError(f"HDF5 file '{path}' (listed in {source}) cannot be read: {e}") from None
            rows = {s[0] for s in shapes}
            if len(rows) != 1:
                detail = ", ".join(f"'{n}' {s}" for n, s in zip(self.names, shapes))
                raise DatasetError(f"HDF5 file '{path}': its datasets have different numbers of rows ({detail})")
            if self.shapes is None:
                self.shapes = [s[1:] for s in shapes]
            elif [s[1:] for s in shapes] != self.shapes:
                raise DatasetError(
                    f"HDF5 file '{path}': rows of shape {[s[1:] for s in shapes]}, the first file's are {self.shapes}"
                )
            self.rows.append(shapes[0][0])
        self.starts = np.concatenate([[0], np.cumsum(self.rows)]).astype(np.int64)
        if self.starts[-1] == 0:
            raise DatasetError(f"the HDF5 files of '{source}' hold no rows")
        self._lock = threading.Lock()
        self._cached = (None, None)  # (file index, [arrays])

    def __len__(self):
        return int(self.starts[-1])

    def load(self, k):
        with self._lock:
            if self._cached[0] != k:
                h5py = h5py_module()
                try:
                    with h5py.File(self.files[k], "r") as f:
                        arrays = [np.asarray(f[n][...], dtype=self.dtype) for n in self.names]
                except (OSError, KeyError) as e:
                    raise DatasetError(f"HDF5 file '{self.files[k]}' cannot be read: {e}") from None
                self._cached = (k, arrays)
            return self._cached[1]

    def gather(self, indices):
        indices = np.asarray(indices, dtype=np.int64)
        out = [np.empty((len(indices),) + tuple(s), dtype=self.dtype) for s in self.shapes]
        files = np.searchsorted(self.starts, indices, side="right") - 1
        for k in dict.fromkeys(files.tolist()):  # each file once, in order of first use
            sel = files == k
            arrays = self.load(k)
            rows = indices[sel] - self.starts[k]
            for o, a in zip(out, arrays):
                o[sel] = a[rows]
        return out


class HDF5Reader(BatchReader):
    """Caffe's HDF5 order: file after file; with shuffle, files and rows within a file permuted."""

    def order(self, epoch):
        ds = self.dataset
        if not self.shuffle:
            return np.arange(len(ds))
        if epoch not in self._orders:
            if len(self._orders) > 2:
                self._orders.pop(min(self._orders))
            rng = np.random.default_rng([self.seed, 0, epoch])
            parts = [ds.starts[k] + rng.permutation(ds.rows[k]) for k in rng.permutation(len(ds.rows))]
            self._orders[epoch] = np.concatenate(parts)
        return self._orders[epoch]

    def produce(self, epoch, index):
        idx, after = self.indices(epoch, index)
        return self.dataset.gather(idx), None, after


@register
class HDF5Data(Data):
    type = "HDF5Data"
    min_top, max_top = 1, None

    def layer_setup(self, bottom, top):
        p = self.param.hdf5_data_param
        if not p.source:
            raise self.error("hdf5_data_param { source: ... } is required (a text file naming HDF5 files)")
        if not p.batch_size:
            raise self.error("hdf5_data_param { batch_size: ... } must be positive")
        try:
            self.dataset = HDF5Dataset(p.source, self.param.top, self.dtype)
        except DatasetError as e:
            raise self.error(str(e)) from None
        self.batch_size = int(p.batch_size)
        reader = HDF5Reader(
            self.dataset,
            self.batch_size,
            None,
            shuffle=p.shuffle,
            seed=layer_seed(self.name, self.phase),
            dtype=self.dtype,
        )
        self.prefetcher = Prefetcher(reader, depth=DEFAULT_PREFETCH)
        self.prefetcher.start()

    def reshape(self, bottom, top):
        for t, shape in zip(top, self.dataset.shapes):
            t.reshape((self.batch_size,) + tuple(shape))

    def next_batch(self):
        try:
            arrays, _ = self.prefetcher.next()
        except DatasetError as e:
            raise self.error(str(e)) from None
        return tuple(arrays)
