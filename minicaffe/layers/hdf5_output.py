"""HDF5Output: write the batches that reach it into an HDF5 file (Caffe's HDF5OutputLayer).

    layer { name: "out" type: "HDF5Output" bottom: "data" bottom: "label"
            hdf5_output_param { file_name: "features.h5" } }

Two bottoms, written as the datasets ``data`` and ``label`` as Caffe names them, 4-D float of the
net's type: (num, channels, height, width), missing axes 1, as Caffe's legacy shape.  The file is
created (truncated) when the layer is set up.  Every forward appends its batch, so after k
batches each dataset has k x batch rows; the file is flushed after each batch and closed with the
layer (``stop()``).  No top, no backward.  Needs h5py.

Difference from Caffe: Caffe writes a batch per forward into datasets of fixed names and so fails
at the second forward ("dataset already exists"); minicaffe appends (chunked, resizable
datasets), which is what the layer is for.
"""

import numpy as np

from ..data import DatasetError
from ..layer import Layer, register
from .hdf5_data import h5py_module


def legacy_4d(shape):
    shape = tuple(int(s) for s in shape)
    if len(shape) > 4:
        return None
    return shape + (1,) * (4 - len(shape))


@register
class HDF5Output(Layer):
    type = "HDF5Output"
    min_bottom, max_bottom = 2, 2
    min_top, max_top = 0, 0

    def layer_setup(self, bottom, top):
        name = self.param.hdf5_output_param.file_name
        if not name:
            raise self.error("hdf5_output_param { file_name: ... } is required")
        try:
            h5py = h5py_module()
        except DatasetError as e:
            raise self.error(str(e)) from None
        try:
            self.file = h5py.File(name, "w")
        except OSError as e:
            raise self.error(f"cannot create HDF5 file '{name}': {e}") from None
        self.file_name = name
        self.rows = 0

    def reshape(self, bottom, top):
        if bottom[0].shape[0] != bottom[1].shape[0]:
            raise self.error(
                f"data has {bottom[0].shape[0]} rows but label {bottom[1].shape[0]} (shapes {bottom[0].shape}, {bottom[1].shape})"
            )
        for b in bottom:
            if legacy_4d(b.shape) is None:
                raise self.error(f"bottom '{b.name}' of shape {b.shape}: HDF5Output writes blobs of at most 4 axes")

    def forward(self, bottom, top):
        n = bottom[0].shape[0]
        for key, b in zip(("data", "label"), bottom):
            shape = legacy_4d(b.shape)
            arr = np.asarray(self.backend.to_host(b.dev_data), dtype=self.dtype).reshape(shape)
            if key not in self.file:
                self.file.create_dataset(key, data=arr, maxshape=(None,) + shape[1:], chunks=True)
            else:
                ds = self.file[key]
                if ds.shape[1:] != shape[1:]:
                    raise self.error(f"bottom '{b.name}' changed shape to {shape} after writing rows of {ds.shape[1:]}")
                ds.resize(self.rows + n, axis=0)
                ds[self.rows :] = arr
        self.rows += n
        self.file.flush()

    def backward(self, top, propagate_down, bottom):
        pass  # Caffe's HDF5Output passes no gradient

    def stop(self):
        """Close the file (also done when the layer is collected)."""
        if getattr(self, "file", None) is not None:
            self.file.close()
            self.file = None

    def __del__(self):
        try:
            self.stop()
        except Exception:  # noqa: BLE001  (interpreter shutdown)
            pass
