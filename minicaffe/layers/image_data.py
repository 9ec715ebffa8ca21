"""ImageData: batches of image files named in a text list (Caffe's ImageDataLayer).

    layer { name: "data" type: "ImageData" top: "data" top: "label"
            transform_param { mirror: true crop_size: 227 mean_file: "mean.binaryproto" }
            image_data_param { source: "train.txt" root_folder: "images/" batch_size: 50
                               new_height: 256 new_width: 256 shuffle: true } }

``source``: one ``<path> <label>`` per line, split at the last space (so paths may hold spaces);
each image is ``root_folder + path``, decoded with Pillow into Caffe's layout: BGR channels
(``is_color: false``: one grey channel), resized bilinearly to new_height x new_width when both
are set.  Images are read as batches need them (by the prefetch thread), never all at once.
``shuffle`` visits the list in a fresh random order every epoch (seeded like the Data layer),
otherwise in list order; ``rand_skip`` skips a random number (< rand_skip) of images at the
start.  ``transform_param`` as the Data layer (the deprecated scale/mean_file/crop_size/mirror of
image_data_param are not read: Caffe's ImageData ignores them too).

A missing or undecodable image stops the layer with an error naming the list file, the line and
the image path (Caffe stops too).  Differences from Caffe: Pillow instead of OpenCV for decoding
and resizing (a resized pixel may differ by a level); mirroring only at TRAIN, as the Data layer.
"""

import numpy as np

from ..data import BatchReader, DatasetError, Prefetcher, Transformer
from ..data.sources import ImageListDataset
from ..layer import register
from .data import DEFAULT_PREFETCH, Data, layer_seed


@register
class ImageData(Data):
    type = "ImageData"
    min_top, max_top = 1, 2

    def layer_setup(self, bottom, top):
        p = self.param.image_data_param
        if not p.source:
            raise self.error("image_data_param { source: ... } is required (a text file of '<path> <label>' lines)")
        if not p.batch_size:
            raise self.error("image_data_param { batch_size: ... } must be positive")
        try:
            dataset = ImageListDataset(p.source, p.root_folder, p.new_height, p.new_width, p.is_color)
            transformer = Transformer.from_param(self.param.transform_param, self.phase, self.dtype)
            self.image_shape = transformer.output_shape(dataset.shape)
        except DatasetError as e:
            raise self.error(str(e)) from None
        self.dataset = dataset
        self.batch_size = int(p.batch_size)
        reader = BatchReader(
            dataset,
            self.batch_size,
            transformer,
            shuffle=p.shuffle,
            seed=layer_seed(self.name, self.phase),
            dtype=self.dtype,
        )
        start = int(np.random.default_rng([reader.seed, 2]).integers(p.rand_skip)) % len(dataset) if p.rand_skip else 0
        self.n_tops = len(top)
        self.prefetcher = Prefetcher(reader, depth=DEFAULT_PREFETCH, index=start)
        self.prefetcher.start()
