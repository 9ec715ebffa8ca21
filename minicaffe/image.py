"""Images in, net inputs out: pycaffe's ``caffe.io.load_image``, ``resize_image`` and ``oversample``.

``minicaffe.io`` re-exports these beside its weights functions and ``Transformer``, so
``caffe.io.load_image(path)`` works as in pycaffe.

Decoding is Pillow's.  matplotlib (a dependency already) requires Pillow, so it is always there;
Pillow reads JPEG, PNG, BMP, GIF, TIFF and WebP and returns 8-bit images as uint8 whatever the
format, where matplotlib's ``imread`` reads only PNG itself (as floats) and hands every other
format to Pillow anyway (as uint8).  pycaffe decodes with scikit-image; the result is the same:
float32 in [0, 1], shape (H, W, 3), or (H, W, 1) with ``color=False``.
"""

import os

import numpy as np

from .errors import MinicaffeError


def load_image(filename, color=True):
    """An image file as float32 (H, W, 3) RGB in [0, 1] (``color=False``: (H, W, 1) gray).

    Gray images are repeated into three channels when ``color``; an alpha channel is dropped
    (as pycaffe does); 16-bit images are scaled by 1/65535.
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(os.fspath(filename)) as im:
            im.load()
    except FileNotFoundError:
        raise MinicaffeError(f"load_image: no such file: {filename}") from None
    except (UnidentifiedImageError, OSError) as exc:
        raise MinicaffeError(f"load_image: {filename} is not an image Pillow can read ({exc})") from None
    if im.mode.startswith("I"):  # 16-bit (Pillow opens 16-bit gray PNGs as "I" or "I;16")
        img = np.asarray(im, dtype=np.float32) / 65535.0
    else:
        img = np.asarray(im.convert("RGB" if color else "L"), dtype=np.float32) / 255.0
    if img.ndim == 2:
        img = img[:, :, None]
        if color:
            img = np.tile(img, (1, 1, 3))
    elif not color:
        img = img.mean(axis=2, keepdims=True)
    return np.ascontiguousarray(img, dtype=np.float32)


def resize_image(im, new_dims, interp_order=1):
    """``im`` (H, W, K) resized to ``new_dims`` (h, w): interp_order 0 = nearest, 1 = bilinear
    (pycaffe allows higher orders through scikit-image; those are refused here)."""
    from PIL import Image

    im = np.asarray(im, dtype=np.float32)
    if im.ndim != 3:
        raise MinicaffeError(f"resize_image: expected an (H, W, K) image, got shape {im.shape}")
    if interp_order not in (0, 1):
        raise MinicaffeError(f"resize_image: interp_order {interp_order} is not supported (0 nearest, 1 bilinear)")
    h, w = (int(d) for d in new_dims)
    if (h, w) == im.shape[:2]:
        return im.copy()
    method = Image.NEAREST if interp_order == 0 else Image.BILINEAR
    channels = [np.asarray(Image.fromarray(im[:, :, k], mode="F").resize((w, h), method)) for k in range(im.shape[2])]
    return np.stack(channels, axis=2).astype(np.float32)


def oversample(images, crop_dims):
    """The 10 crops of each image pycaffe's classifier averages over: 4 corners and the center,
    and their mirror images.  ``images``: iterable of (H, W, K); returns (10 * N, h, w, K)."""
    images = [np.asarray(im, dtype=np.float32) for im in images]
    im_shape = np.array(images[0].shape)
    crop_dims = np.array(crop_dims)
    if np.any(crop_dims > im_shape[:2]):
        raise MinicaffeError(f"oversample: crop {tuple(crop_dims)} is larger than the image {tuple(im_shape[:2])}")
    im_center = im_shape[:2] / 2.0
    h_indices = (0, im_shape[0] - crop_dims[0])
    w_indices = (0, im_shape[1] - crop_dims[1])
    crops_ix = np.empty((5, 4), dtype=int)
    curr = 0
    for i in h_indices:
        for j in w_indices:
            crops_ix[curr] = (i, j, i + crop_dims[0], j + crop_dims[1])
            curr += 1
    crops_ix[4] = np.tile(im_center, (1, 2)) + np.concatenate([-crop_dims / 2.0, crop_dims / 2.0])
    crops_ix = np.tile(crops_ix, (2, 1))
    crops = np.empty((10 * len(images), crop_dims[0], crop_dims[1], im_shape[-1]), dtype=np.float32)
    ix = 0
    for im in images:
        for crop in crops_ix:
            crops[ix] = im[crop[0] : crop[2], crop[1] : crop[3], :]
            ix += 1
        crops[ix - 5 : ix] = crops[ix - 5 : ix, :, ::-1, :]  # mirrors
    return crops
