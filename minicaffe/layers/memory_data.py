"""MemoryData: batches from arrays handed over in Python (Caffe's MemoryDataLayer, used through
pycaffe's ``net.set_input_arrays(data, labels)``).

    layer { name: "data" type: "MemoryData" top: "data" top: "label"
            memory_data_param { batch_size: 32 channels: 1 height: 28 width: 28 } }

``set_input_arrays(data, labels)``: data (N, channels, height, width), labels (N,) (or
(N, 1, 1, 1) as pycaffe passes them), N a multiple of batch_size.  Each forward hands out the
next batch_size items and wraps around at N, as Caffe.  No transform is applied (Caffe applies
``transform_param`` only to Datum/cv::Mat inputs, not to these arrays).  Caffe requires float32
C-contiguous arrays and keeps a reference to them; minicaffe accepts any real dtype and keeps a
copy in the net's float type.
"""

import numpy as np

from ..layer import register
from .data_base import DataLayer


@register
class MemoryData(DataLayer):
    type = "MemoryData"
    min_top, max_top = 2, 2

    def layer_setup(self, bottom, top):
        p = self.param.memory_data_param
        dims = (int(p.batch_size), int(p.channels), int(p.height), int(p.width))
        if min(dims) <= 0:
            raise self.error(
                f"memory_data_param needs batch_size, channels, height and width, all positive; got {dims}"
            )
        self.batch_size, self.channels, self.height, self.width = dims
        self._data = self._labels = None
        self.pos = 0

    def reshape(self, bottom, top):
        top[0].reshape(self.batch_size, self.channels, self.height, self.width)
        top[1].reshape(self.batch_size)

    def set_input_arrays(self, data, labels):
        """Hand the layer its data (N, C, H, W) and labels (N,); N a multiple of batch_size."""
        data, labels = np.asarray(data), np.asarray(labels)
        want = (self.channels, self.height, self.width)
        if data.ndim != 4 or tuple(data.shape[1:]) != want:
            raise self.error(f"set_input_arrays: data must be (N, {', '.join(map(str, want))}), got {data.shape}")
        if labels.size != data.shape[0] or (labels.ndim > 1 and labels.shape[0] != data.shape[0]):
            raise self.error(
                f"set_input_arrays: {data.shape[0]} images but labels of shape {labels.shape}; "
                f"give one label per image, shape (N,) or (N, 1, 1, 1)"
            )
        if data.shape[0] == 0 or data.shape[0] % self.batch_size:
            raise self.error(
                f"set_input_arrays: the number of images ({data.shape[0]}) must be a positive multiple "
                f"of batch_size {self.batch_size}"
            )
        if data.dtype.kind not in "uif" or labels.dtype.kind not in "uifb":
            raise self.error(
                f"set_input_arrays: data and labels must be real numbers, got {data.dtype} and {labels.dtype}"
            )
        self._data = np.ascontiguousarray(data, dtype=self.dtype)
        self._labels = np.ascontiguousarray(labels.reshape(-1), dtype=self.dtype)
        self.pos = 0

    # Caffe's C++ name
    reset = set_input_arrays

    def set_batch_size(self, batch_size):
        if batch_size <= 0:
            raise self.error(f"batch_size must be positive, got {batch_size}")
        if self._data is not None and self._data.shape[0] % batch_size:
            raise self.error(f"batch_size {batch_size} does not divide the {self._data.shape[0]} images held")
        self.batch_size = int(batch_size)

    def next_batch(self):
        if self._data is None:
            raise self.error(
                "has no data: call net.set_input_arrays(data, labels) (or this layer's set_input_arrays) before forward"
            )
        end = self.pos + self.batch_size
        batch = self._data[self.pos : end], self._labels[self.pos : end]
        self.pos = end % self._data.shape[0]
        return batch

    def position(self):
        return {"pos": int(self.pos)}

    def seek(self, state):
        self.pos = int(state.get("pos", 0))
