"""Data: batches of an LMDB / LevelDB of Datum records or of a named dataset, transformed, made
ahead by a prefetch thread (Caffe's DataLayer).

    layer { name: "mnist" type: "Data" top: "data" top: "label"
            include { phase: TRAIN }
            transform_param { scale: 0.00390625 }
            data_param { source: "examples/mnist/mnist_train_lmdb" batch_size: 64 } }

tops:  data (batch_size, C, h, w) in the net's float type (h, w = crop_size when cropping);
       label (batch_size,) float, optional.

``source`` is looked up in :mod:`minicaffe.data.registry`: the path of an LMDB or LevelDB
(Caffe's ``convert_imageset`` / ``convert_mnist_data`` output, or minicaffe's tools of the same
names), ``mnist_train``, ``cifar10_test``, ``synthetic:3x32x32:10``, Caffe's
``examples/mnist/mnist_train_lmdb`` when no database is there (read as MNIST), or a name given to
``minicaffe.data.register_dataset``.  A database's records are decoded one by one as batches
need them (raw and encoded Datums; encoded images keep their own channels unless
``transform_param { force_color / force_gray }`` or ``data_param { force_encoded_color }``).
``transform_param`` is Caffe's (scale, mean_value, mean_file, mirror, crop_size; see
:mod:`minicaffe.data.transform`).

Order: a database is read in key order at every phase, wrapping around at the end, as Caffe's
cursor.  A named dataset is shuffled afresh every epoch at TRAIN and read in order at TEST.  A
source may override either with a suffix: ``"path/to/train_lmdb?shuffle=true"`` or
``"mnist_train?shuffle=false"`` (Caffe's DataParameter has no shuffle field).  The shuffles and
random crops/flips are seeded from ``minicaffe.set_random_seed`` (the solver's ``random_seed``),
the layer's name and phase; with no seed set they differ from run to run.

``data_param.prefetch`` sets the depth of the queue of ready batches (3 when unset; Caffe's
default is 4).  ``rand_skip`` skips a random number (< rand_skip) of images at the start, as
Caffe.  As every :class:`~minicaffe.layers.data_base.DataLayer`, ``state_dict()`` /
``load_state_dict()`` save and restore the reader's position, so a resumed run reads the same
batches it would have read.
"""

import zlib

import numpy as np

from ..data import BatchReader, DatasetError, Prefetcher, Transformer, get_dataset
from ..data.sources import DatumDBDataset
from ..layer import register
from ..rng import get_seed
from .data_base import DataLayer

DEFAULT_PREFETCH = 3


def split_source(source):
    """``"name?shuffle=false"`` -> ("name", {"shuffle": False})."""
    name, _, query = str(source).partition("?")
    options = {}
    for item in filter(None, query.split("&")):
        key, _, value = item.partition("=")
        if key != "shuffle":
            raise DatasetError(f"data source '{source}': unknown option '{key}' (the only one is shuffle=true|false)")
        if value.lower() not in ("true", "false", "1", "0"):
            raise DatasetError(f"data source '{source}': shuffle must be true or false, got '{value}'")
        options["shuffle"] = value.lower() in ("true", "1")
    return name, options


def layer_seed(name, phase):
    """The seed of a data layer's reader: from the global seed, the layer's name and phase."""
    seed = get_seed()
    if seed is None:
        return int(np.random.SeedSequence().generate_state(1, np.uint64)[0] >> 1)
    words = [seed & 0xFFFFFFFFFFFFFFFF, zlib.crc32(name.encode()), 1 if phase == "TRAIN" else 0]
    return int(np.random.SeedSequence(words).generate_state(1, np.uint64)[0] >> 1)


@register
class Data(DataLayer):
    type = "Data"
    min_top, max_top = 1, 2

    def layer_setup(self, bottom, top):
        dp = self.param.data_param
        if not dp.source:
            raise self.error(
                'data_param { source: ... } is required (an LMDB/LevelDB path, or a dataset name such as "mnist_train")'
            )
        if not dp.batch_size:
            raise self.error("data_param { batch_size: ... } is required and must be positive")
        try:
            name, options = split_source(dp.source)
            tp = self.param.transform_param
            if tp.force_color and tp.force_gray:
                raise DatasetError("transform_param: force_color and force_gray cannot both be set")
            is_color = True if (tp.force_color or dp.force_encoded_color) else False if tp.force_gray else None
            dataset = get_dataset(name, backend=dp.backend if dp.has("backend") else None, is_color=is_color)
            transformer = Transformer.from_param(self.param.transform_param, self.phase, self.dtype)
            self.image_shape = transformer.output_shape(dataset.shape)
        except DatasetError as e:
            raise self.error(str(e)) from None
        if len(top) > 1 and dataset.labels is None:
            raise self.error(f"has a label top but the dataset '{name}' has no labels")
        self.dataset = dataset
        self.batch_size = int(dp.batch_size)
        in_key_order = isinstance(dataset, DatumDBDataset)  # Caffe's cursor order for databases
        shuffle = options.get("shuffle", self.phase == "TRAIN" and not in_key_order)
        reader = BatchReader(
            dataset,
            self.batch_size,
            transformer,
            shuffle=shuffle,
            seed=layer_seed(self.name, self.phase),
            dtype=self.dtype,
        )
        start = 0
        if dp.rand_skip:
            start = int(np.random.default_rng([reader.seed, 2]).integers(dp.rand_skip)) % len(dataset)
        depth = int(dp.prefetch) if dp.has("prefetch") else DEFAULT_PREFETCH
        self.n_tops = len(top)
        self.prefetcher = Prefetcher(reader, depth=depth, index=start)
        self.prefetcher.start()

    def reshape(self, bottom, top):
        top[0].reshape((self.batch_size,) + tuple(self.image_shape))
        if len(top) > 1:
            top[1].reshape((self.batch_size,))

    def next_batch(self):
        try:
            data, labels = self.prefetcher.next()
        except DatasetError as e:
            raise self.error(str(e)) from None
        if tuple(data.shape[1:]) != tuple(self.image_shape):  # a database's images of another size
            raise self.error(
                f"a batch of images {tuple(data.shape[1:])} after the transform, but the first record made "
                f"the top {tuple(self.image_shape)}; images of several sizes need crop_size (or resize them "
                f"when converting)"
            )
        return (data, labels)[: self.n_tops]

    def batch_copied(self):
        """The prefetch thread may make the next batch now: woken earlier, it would take the GIL
        while the copy into the tops had let it go (minicaffe.data.reader, "When the thread wakes")."""
        self.prefetcher.release()

    def position(self):
        """The reader's position as plain JSON (see minicaffe.data.reader)."""
        return self.prefetcher.state_dict()

    def seek(self, state):
        try:
            self.prefetcher.load_state_dict(state)
        except DatasetError as e:
            raise self.error(str(e)) from None
        self.prefetcher.start()

    def stop(self):
        """End the prefetch thread now (it also ends when the layer is collected or at exit)."""
        self.prefetcher.stop()
