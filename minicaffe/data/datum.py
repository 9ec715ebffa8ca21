"""Caffe's ``Datum``: one image and its label, the record of every LMDB/LevelDB Caffe reads.

caffe.proto::

    message Datum {
      optional int32 channels = 1;   optional int32 height = 2;   optional int32 width = 3;
      optional bytes data = 4;       // C*H*W uint8 pixels, channel-major (c, h, w)
      optional int32 label = 5;
      repeated float float_data = 6; // instead of data, for float images
      optional bool encoded = 7 [default = false];  // data holds a whole PNG/JPEG file
    }

A raw Datum's pixels are stored as OpenCV holds a colour image: channels in **BGR** order.
Caffe's tools write the fields they set, in field-number order (protobuf's rule), so a raw image
from ``convert_imageset`` is ``08 C 10 H 18 W 22 <len> <pixels> 28 <label> 38 00`` and one from
``convert_mnist_data`` has no ``encoded`` field at all.  minicaffe encodes and decodes Datums with
its own wire codec (:mod:`minicaffe.proto.wire`); this module adds the checks a reader of
someone else's database needs (the declared size must match the bytes carried, before anything
is allocated from it) and the image decoding (Pillow) of encoded records.

Image decoding follows OpenCV's ``imdecode``, which is what Caffe calls: ``IMREAD_UNCHANGED``
("native") keeps a grey image 1-channel, a colour image 3-channel BGR and an image with alpha
4-channel BGRA; ``is_color`` True/False forces 3-channel BGR or 1-channel grey (Pillow's
ITU-R 601-2 luma, the same weights OpenCV uses, though rounding may differ by one level).
"""

import io

import numpy as np

from .. import proto
from ..errors import MinicaffeError
from ._util import DatasetError

PIL_HINT = "reading images needs Pillow: pip install Pillow (or pip install 'minicaffe[data]')"


def _pil():
    try:
        from PIL import Image
    except ImportError:
        raise DatasetError(PIL_HINT) from None
    return Image


def encode_datum(image=None, label=0, encoded_bytes=None, set_encoded=True):
    """The wire bytes of a Datum, as Caffe's tools write them.

    ``image``: uint8 (C, H, W) (already BGR) -> a raw Datum (channels, height, width, data,
    label, encoded=false; ``set_encoded=False`` leaves ``encoded`` out, as ``convert_mnist_data``
    does); float (C, H, W) -> ``float_data``.  ``encoded_bytes``: a whole image file -> data,
    label, encoded=true (what ``convert_imageset --encoded`` writes).
    """
    d = proto.Message("Datum")
    if encoded_bytes is not None:
        d.data = bytes(encoded_bytes)
        d.label = int(label)
        d.encoded = True
        return proto.encode(d)
    image = np.asarray(image)
    if image.ndim != 3:
        raise DatasetError(f"a Datum holds one (C, H, W) image, got shape {image.shape}")
    d.channels, d.height, d.width = (int(s) for s in image.shape)
    if image.dtype == np.uint8:
        d.data = np.ascontiguousarray(image).tobytes()
    else:
        d.float_data = np.ascontiguousarray(image, dtype=np.float32).ravel()
    d.label = int(label)
    if set_encoded:
        d.encoded = False
    return proto.encode(d)


def decode_datum(value, where="Datum", is_color=None):
    """-> (image (C, H, W) uint8 or float32, label int) from a Datum's wire bytes.

    ``where`` names the record in errors ("db 'path', key '00000012'").  Encoded records are
    decoded with Pillow (``is_color`` None: native channels, as Caffe's Data layer does).
    """
    try:
        d = proto.decode(value, "Datum", filename=where)
    except MinicaffeError as e:
        raise DatasetError(f"{where}: not a Datum record ({e})") from None
    label, data = int(d.label), d.data
    if d.encoded:
        return decode_image(data, where, is_color), label
    c, h, w = int(d.channels), int(d.height), int(d.width)
    if min(c, h, w) <= 0:
        raise DatasetError(f"{where}: a raw Datum must give channels, height and width > 0, got {c} x {h} x {w}")
    count = c * h * w
    if data:
        if len(data) != count:
            raise DatasetError(
                f"{where}: the Datum says {c} x {h} x {w} = {count} pixels but carries {len(data)} bytes of data"
            )
        return np.frombuffer(data, dtype=np.uint8).reshape(c, h, w), label
    floats = d.float_data
    if len(floats) != count:
        raise DatasetError(
            f"{where}: the Datum says {c} x {h} x {w} = {count} values but carries {len(floats)} float_data and no data"
        )
    return np.asarray(floats, dtype=np.float32).reshape(c, h, w), label


def decode_image(data, where="image", is_color=None):
    """Image file bytes -> uint8 (C, H, W), BGR(A) channel order as OpenCV gives it.

    ``is_color``: None keeps the file's own channels (grey 1, colour 3, with alpha 4); True gives
    3 (BGR), False 1 (grey).
    """
    Image = _pil()
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()
            mode = img.mode
            if is_color is True:
                img = img.convert("RGB")
            elif is_color is False:
                img = img.convert("L")
            elif mode in ("1", "L", "I;16", "I"):
                img = img.convert("L")
            elif mode in ("RGBA", "LA", "PA") or (mode == "P" and "transparency" in img.info):
                img = img.convert("RGBA")
            else:
                img = img.convert("RGB")
            arr = np.asarray(img, dtype=np.uint8)
    except DatasetError:
        raise
    except Exception as e:  # noqa: BLE001  (Pillow raises many types for a bad file)
        raise DatasetError(f"{where}: cannot decode the image ({type(e).__name__}: {e})") from None
    return hwc_to_bgr_chw(arr)


def hwc_to_bgr_chw(arr):
    """Pillow's (H, W) / (H, W, 3 RGB) / (H, W, 4 RGBA) -> (C, H, W) in OpenCV's BGR(A) order."""
    if arr.ndim == 2:
        return np.ascontiguousarray(arr[None])
    if arr.shape[2] == 3:
        arr = arr[:, :, ::-1]
    elif arr.shape[2] == 4:
        arr = arr[:, :, [2, 1, 0, 3]]
    return np.ascontiguousarray(arr.transpose(2, 0, 1))


def bgr_chw_to_pil(image):
    """uint8 (C, H, W) BGR (or grey) -> a Pillow image (for re-encoding)."""
    Image = _pil()
    image = np.asarray(image, dtype=np.uint8)
    if image.shape[0] == 1:
        return Image.fromarray(image[0], "L")
    if image.shape[0] == 3:
        return Image.fromarray(np.ascontiguousarray(image[::-1].transpose(1, 2, 0)), "RGB")
    if image.shape[0] == 4:
        return Image.fromarray(np.ascontiguousarray(image[[2, 1, 0, 3]].transpose(1, 2, 0)), "RGBA")
    raise DatasetError(f"cannot make an image of {image.shape[0]} channels")


def read_image(path, height=0, width=0, is_color=True, where=None):
    """An image file -> uint8 (C, H, W) BGR, resized to (height, width) when both are > 0.

    Caffe's ReadImageToCVMat: ``is_color`` loads 3-channel colour, else 1-channel grey; the
    resize is bilinear (OpenCV's INTER_LINEAR; Pillow's bilinear filter, which can differ from
    OpenCV's by a level or so per pixel).
    """
    where = where or str(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise DatasetError(f"{where}: cannot read image '{path}' ({e.strerror or e})") from None
    image = decode_image(data, where, bool(is_color))
    if height > 0 and width > 0 and image.shape[1:] != (height, width):
        image = resize(image, height, width)
    return image


def resize(image, height, width):
    """uint8 (C, H, W) -> (C, height, width), bilinear."""
    Image = _pil()
    out = np.empty((image.shape[0], height, width), dtype=np.uint8)
    for c in range(image.shape[0]):
        out[c] = np.asarray(Image.fromarray(image[c], "L").resize((width, height), Image.BILINEAR))
    return out


# -- pycaffe's caffe.io helpers (re-exported by minicaffe.io) ------------------------------------
def array_to_datum(arr, label=None):
    """pycaffe's ``caffe.io.array_to_datum``: a (C, H, W) array -> a Datum message (uint8 ->
    ``data``, anything else -> ``float_data``); ``datum.SerializeToString()`` is the record."""
    arr = np.asarray(arr)
    if arr.ndim != 3:
        raise ValueError(f"Incorrect array shape: a Datum holds one (C, H, W) array, got {arr.shape}")
    datum = proto.Message("Datum")
    datum.channels, datum.height, datum.width = (int(s) for s in arr.shape)
    if arr.dtype == np.uint8:
        datum.data = arr.tobytes()
    else:
        datum.float_data = arr.astype(np.float32).ravel()
    if label is not None:
        datum.label = int(label)
    return datum


def datum_to_array(datum):
    """pycaffe's ``caffe.io.datum_to_array``: a raw Datum message -> (C, H, W) array (uint8 from
    ``data``, else float from ``float_data``).  Encoded Datums: use :func:`decode_datum` on the bytes."""
    shape = (int(datum.channels), int(datum.height), int(datum.width))
    if len(datum.data):
        return np.frombuffer(datum.data, dtype=np.uint8).reshape(shape)
    return np.asarray(datum.float_data, dtype=np.float64).reshape(shape)
