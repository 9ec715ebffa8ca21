"""Caffe's ``transform_param``, applied to a whole batch at once with numpy.

For each image (C, H, W) -> (C, h, w) in the layer's float type, as Caffe's DataTransformer::

    crop     crop_size > 0: an h = w = crop_size window; at TRAIN its corner is drawn at random
             (each image its own), at TEST it is centred: offset (H - crop_size) // 2
    mirror   at TRAIN each image is flipped left-right with probability 1/2
    mean     mean_value (one value for every channel, or one per channel) or mean_file (a whole
             mean image, a BlobProto .binaryproto as Caffe's compute_image_mean writes; cropped at
             the same offset as the image) is subtracted
    scale    the result is multiplied by scale:  out = (pixel - mean) * scale

The batch is done without a Python loop over images.  A random crop is one gather:
``sliding_window_view`` sees the batch as every (h, w) window at every offset, (N, C, H-h+1,
W-w+1, h, w), without copying, and indexing it with the per-image offsets ``[n, :, h_off, w_off]``
copies out exactly the chosen windows, (N, C, h, w).  Mirroring then reverses the last axis of
the flipped images, ``v[flip] = v[flip, ..., ::-1]``.  A mean image is subtracted in the full frame
before cropping, so every pixel meets the mean value at its own input position, as in Caffe.
(A gather with four broadcast index arrays, ``x[n, c, rows, cols]``, gives the same batch but is
~4x slower: numpy computes a flat index per output element.)

Differences from Caffe: Caffe draws ``mirror`` at random in the TEST phase too; minicaffe mirrors
only at TRAIN (a test score should not depend on coin flips).  The random draws come from numpy,
so the particular crops and flips differ from Caffe's.
"""

from pathlib import Path

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ._util import DatasetError


class Transformer:
    def __init__(
        self, scale=1.0, mean_value=(), mean_file=None, mirror=False, crop_size=0, phase="TRAIN", dtype=np.float32
    ):
        """``mean_file``: a path, or an already loaded mean image (C, H, W)."""
        mean_value = [float(v) for v in (mean_value or ())]
        if mean_value and mean_file is not None:
            raise DatasetError("transform_param: give mean_file or mean_value, not both (Caffe's rule)")
        if crop_size < 0:
            raise DatasetError(f"transform_param: crop_size must be >= 0, got {crop_size}")
        self.scale = float(scale)
        self.mean_value = mean_value
        self.mean_image = None
        if mean_file is not None:
            self.mean_image = (
                np.asarray(mean_file, dtype=np.float64)
                if not isinstance(mean_file, (str, Path))
                else load_mean_file(mean_file)
            )
            if self.mean_image.ndim != 3:
                raise DatasetError(f"transform_param: the mean image must be (C, H, W), got {self.mean_image.shape}")
        self.mirror = bool(mirror)
        self.crop_size = int(crop_size)
        self.phase = phase
        self.dtype = np.dtype(dtype)
        self._mean_cache = None

    @classmethod
    def from_param(cls, param, phase="TRAIN", dtype=np.float32):
        """From a TransformationParameter message (unset fields read as Caffe's defaults)."""
        return cls(
            scale=param.scale,
            mean_value=list(param.mean_value),
            mean_file=param.mean_file or None,
            mirror=param.mirror,
            crop_size=param.crop_size,
            phase=phase,
            dtype=dtype,
        )

    @property
    def random(self):
        """Whether a transform draws random numbers (crop or mirror at TRAIN)."""
        return self.phase == "TRAIN" and (self.mirror or self.crop_size > 0)

    def affine(self, channels):
        """When this transform is only ``(pixel - mean[c]) * scale`` (no crop, no mirror, no mean
        image): (mean (channels,) of ``dtype``, scale); else None.  A reader may then do it inside
        its compiled read (``NpyFileDataset.gather_affine``), with the bits of :meth:`__call__`."""
        if self.crop_size or self.mean_image is not None or (self.mirror and self.phase == "TRAIN"):
            return None
        if self.mean_value and len(self.mean_value) not in (1, channels):
            return None  # (output_shape says why)
        mean = np.zeros(channels, dtype=self.dtype)
        if self.mean_value:
            mean[:] = np.asarray(self.mean_value, dtype=self.dtype)
        return mean, self.scale

    def output_shape(self, in_shape):
        """(C, H, W) of an input image -> (C, h, w) of its transform; checks the sizes fit."""
        c, h, w = in_shape
        if self.crop_size:
            if self.crop_size > h or self.crop_size > w:
                raise DatasetError(f"transform_param: crop_size {self.crop_size} is larger than the image {h} x {w}")
            h = w = self.crop_size
        if self.mean_value and len(self.mean_value) not in (1, c):
            raise DatasetError(
                f"transform_param: {len(self.mean_value)} mean_value(s) for {c} channel(s); "
                f"give one value, or one per channel"
            )
        if self.mean_image is not None and tuple(self.mean_image.shape) != tuple(in_shape):
            raise DatasetError(
                f"transform_param: the mean image has shape {tuple(self.mean_image.shape)} but the "
                f"data images are {tuple(in_shape)}; the mean must be of the uncropped image"
            )
        return (c, h, w)

    def __call__(self, images, rng=None):
        """Transform a batch ``images`` (N, C, H, W) -> new array (N, C, h, w) of ``self.dtype``.

        ``rng`` (a numpy Generator) is needed when :attr:`random`; draws: crop rows, crop columns,
        then mirror flags, one per image each.
        """
        n, c, H, W = images.shape
        _, h, w = self.output_shape((c, H, W))
        x, fresh = images, False
        if self.mean_image is not None:  # (x - mean) in the full frame
            x, fresh = images.astype(self.dtype) - self.mean_image.astype(self.dtype)[None], True
        if self.random:
            if rng is None:
                raise DatasetError("a random transform (crop or mirror at TRAIN) needs an rng")
            if self.crop_size:
                h_off = rng.integers(0, H - h + 1, size=n)
                w_off = rng.integers(0, W - w + 1, size=n)
                windows = sliding_window_view(x, (h, w), axis=(2, 3))  # (N, C, H-h+1, W-w+1, h, w)
                x, fresh = windows[np.arange(n), :, h_off, w_off], True  # (N, C, h, w), a copy
            if self.mirror:
                flip = rng.integers(0, 2, size=n).astype(bool)
                if not fresh:
                    x, fresh = x.copy(), True
                x[flip] = x[flip, ..., ::-1]
        elif self.crop_size:
            top, left = (H - h) // 2, (W - w) // 2
            x = x[:, :, top : top + h, left : left + w]
        out = x.astype(self.dtype, copy=not fresh)
        if self.mean_value:
            out -= np.asarray(self.mean_value, dtype=self.dtype).reshape(1, -1, 1, 1)
        if self.scale != 1.0:
            out *= self.dtype.type(self.scale)
        return out


def load_mean_file(path):
    """A mean image (C, H, W) float64 from a Caffe ``.binaryproto`` (BlobProto) or a ``.npy``.

    A path that does not exist but names Caffe's example mean of a known data set
    (``examples/cifar10/mean.binaryproto``, or any ``<dir>/mean.binaryproto`` whose ``<dir>`` is
    ``cifar10`` or ``mnist``) is computed from that data set's training images, which is what
    Caffe's ``compute_image_mean`` tool would have written there.
    """
    p = Path(path).expanduser()
    if not p.is_file():
        folder = p.parent.name
        if p.name == "mean.binaryproto" and folder in ("cifar10", "mnist"):
            return compute_image_mean(f"{folder}_train")
        raise DatasetError(
            f"mean_file '{path}' not found (a BlobProto .binaryproto as Caffe's compute_image_mean "
            f"writes, or an .npy of shape (C, H, W))"
        )
    if p.suffix == ".npy":
        mean = np.load(p, allow_pickle=False).astype(np.float64)
    else:
        from .. import proto

        try:
            blob = proto.decode(p.read_bytes(), "BlobProto")
        except Exception as e:  # noqa: BLE001  (any decoding failure -> one clear error)
            raise DatasetError(f"mean_file '{path}': cannot decode it as a BlobProto ({e})") from None
        mean = blob_to_array(blob, str(path))
    if mean.ndim == 4 and mean.shape[0] == 1:
        mean = mean[0]
    if mean.ndim != 3:
        raise DatasetError(f"mean_file '{path}': expected a (1, C, H, W) or (C, H, W) blob, got shape {mean.shape}")
    return mean


def blob_to_array(blob, where="BlobProto"):
    """A decoded BlobProto message -> numpy array (its ``shape``, or legacy num/channels/height/width)."""
    dims = list(blob.shape.dim) if len(blob.shape.dim) else [blob.num, blob.channels, blob.height, blob.width]
    values = list(blob.double_data) if len(blob.double_data) else list(blob.data)
    count = int(np.prod(dims)) if dims else 1
    if len(values) != count:
        raise DatasetError(f"{where}: the blob's shape {tuple(dims)} holds {count} values but it carries {len(values)}")
    return np.asarray(values, dtype=np.float64).reshape([int(d) for d in dims])


def compute_image_mean(source):
    """Per-pixel mean (C, H, W) float64 of a data source's images (Caffe's compute_image_mean)."""
    from .registry import get_dataset

    dataset = get_dataset(source)
    n = len(dataset)
    total = np.zeros(dataset.shape, dtype=np.float64)
    for start in range(0, n, 4096):  # chunks: no float64 copy of the whole set
        images, _ = dataset.gather(np.arange(start, min(start + 4096, n)))
        if isinstance(images, list) or images.shape[1:] != total.shape:
            raise DatasetError(f"compute_image_mean: the images of '{source}' are not all of one shape")
        total += images.sum(axis=0, dtype=np.float64)
    return total / n
