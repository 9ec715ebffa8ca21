"""Dataset: a named pair of arrays, images (N, C, H, W) and labels (N,).

Images are kept as they come (uint8 pixels for MNIST and CIFAR-10, float for anything a user
registers); the transformer turns a batch of them into the layer's float type, so the full data
set sits in memory at one byte a pixel.
"""

import numpy as np

from ._util import DatasetError


class Dataset:
    """``images`` (N, C, H, W), ``labels`` (N,) int64 or None.

    Images given as (N, D) become (N, D, 1, 1) and (N, H, W) become (N, 1, H, W), as Caffe
    would store them in a Datum.
    """

    def __init__(self, name, images, labels=None):
        images = np.asarray(images)
        if images.ndim == 2:
            images = images.reshape(images.shape[0], images.shape[1], 1, 1)
        elif images.ndim == 3:
            images = images.reshape(images.shape[0], 1, images.shape[1], images.shape[2])
        if images.ndim != 4:
            raise DatasetError(
                f"dataset '{name}': images must be (N, C, H, W), (N, H, W) or (N, D); got shape {images.shape}"
            )
        if images.dtype.kind not in "uif":
            raise DatasetError(f"dataset '{name}': images must be integer or float arrays, got {images.dtype}")
        if images.shape[0] == 0:
            raise DatasetError(f"dataset '{name}' is empty")
        if labels is not None:
            labels = np.asarray(labels)
            if labels.ndim > 1 and labels.size == labels.shape[0]:
                labels = labels.reshape(-1)
            if labels.ndim != 1 or labels.shape[0] != images.shape[0]:
                raise DatasetError(
                    f"dataset '{name}': {images.shape[0]} images but labels of shape {labels.shape}; "
                    f"labels must be one per image"
                )
            if labels.dtype.kind not in "uifb":
                raise DatasetError(f"dataset '{name}': labels must be numbers, got {labels.dtype}")
        self.name = name
        self.images = np.ascontiguousarray(images)
        self.labels = labels

    def __len__(self):
        return self.images.shape[0]

    def gather(self, indices):
        """(images (n, C, H, W), labels (n,) or None) of the images at ``indices`` (the readers'
        one access to a data set, so file-backed data sets can read only what is asked for)."""
        return self.images[indices], None if self.labels is None else self.labels[indices]

    @property
    def shape(self):
        """The shape of one image, (C, H, W)."""
        return tuple(self.images.shape[1:])

    def __repr__(self):
        return (
            f"Dataset({self.name!r}, {len(self)} x {'x'.join(map(str, self.shape))} {self.images.dtype.name}"
            f"{', unlabeled' if self.labels is None else ''})"
        )
