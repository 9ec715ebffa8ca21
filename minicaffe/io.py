"""Weight files: Caffe's binary ``.caffemodel`` and a documented ``.npz``.

``.caffemodel`` is a NetParameter in protobuf's wire format; each layer that has parameters
carries them as BlobProto messages (``shape { dim }`` and packed float ``data``; old files use
num/channels/height/width and V1 ``layers``).  It is decoded by minicaffe.proto's own wire reader.

``.npz`` (numpy's zip of arrays) holds one array per parameter blob under the key
``"<layer name>/<blob index>"`` (e.g. ``conv1/0`` = conv1's weights, ``conv1/1`` its bias), in
the blob's shape and dtype.  Anything can read it: ``np.load(path)["conv1/0"]``.

Which format is written follows the file name (``.caffemodel`` -> Caffe's, else ``.npz``); which is
read follows the file's first bytes.  Files are written atomically (a temporary file beside the
target, then a rename), so an interrupted save never leaves a damaged file behind.

Loading follows Caffe's CopyTrainedLayersFrom: parameters are matched by layer name; layers the
file has and the net lacks are skipped (listed in ``load_weights``'s return value); a layer whose
blob count or shapes differ is an error naming the layer, the blob and both shapes.
"""

import io as _io
import os
import tempfile

import numpy as np

from .errors import WeightsError

ZIP_MAGIC = b"PK\x03\x04"
HDF5_MAGIC = b"\x89HDF"


def atomic_write(path, write):
    """Call write(fileobj) on a temporary file beside ``path``, then rename it over ``path``."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=os.path.basename(path), dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def net_arrays(net):
    """{'layer/i': host array} for every parameter blob of ``net`` (shared blobs once per layer)."""
    out = {}
    for name, layer in zip(net.layer_names, net.layers):
        for i, blob in enumerate(layer.blobs):
            out[f"{name}/{i}"] = np.asarray(net.backend.to_host(blob.data))
    return out


def save_weights(net, path):
    path = os.fspath(path)
    if path.endswith(".caffemodel"):
        data = encode_caffemodel(net)
        atomic_write(path, lambda f: f.write(data))
    else:
        arrays = net_arrays(net)
        atomic_write(path, lambda f: np.savez(f, **arrays))


def encode_caffemodel(net):
    from . import proto

    msg = proto.Message("NetParameter", name=net.name)
    for name, layer in zip(net.layer_names, net.layers):
        lp = msg.add("layer", name=name, type=layer.type)
        for blob in layer.blobs:
            bp = lp.add("blobs")
            bp.get_or_create("shape").dim.extend(int(d) for d in blob.shape)
            bp.data = np.asarray(net.backend.to_host(blob.data), dtype=np.float32).ravel()
    return proto.encode(msg)


def read_weight_arrays(path):
    """{layer name: [array, ...]} from a .caffemodel or .npz file."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise WeightsError(f"weights file not found: {path}")
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:4] == ZIP_MAGIC:
        try:
            npz = np.load(_io.BytesIO(raw), allow_pickle=False)
        except Exception as exc:
            raise WeightsError(f"{path}: not a readable .npz ({exc})") from None
        layers = {}
        for key in npz.files:
            lname, sep, idx = key.rpartition("/")
            if not sep or not idx.isdigit():
                raise WeightsError(f"{path}: key '{key}' is not of the form '<layer>/<blob index>'")
            layers.setdefault(lname, {})[int(idx)] = npz[key]
        out = {}
        for lname, blobs in layers.items():
            if sorted(blobs) != list(range(len(blobs))):
                raise WeightsError(
                    f"{path}: layer '{lname}' has blob indices {sorted(blobs)}; expected 0..{len(blobs) - 1}"
                )
            out[lname] = [blobs[i] for i in range(len(blobs))]
        return out
    if raw[:4] == HDF5_MAGIC:
        raise WeightsError(f"{path}: HDF5 weights (.caffemodel.h5) are not supported; use a binary .caffemodel or .npz")
    from . import proto

    msg = proto.upgrade_net(proto.decode(raw, "NetParameter", filename=path))
    out = {}
    for lp in msg.layer:
        if lp.blobs:
            out[lp.name] = [_blob_array(bp, path, lp.name, i) for i, bp in enumerate(lp.blobs)]
    return out


def _blob_array(bp, path, lname, i):
    if bp.has("shape"):
        shape = tuple(int(d) for d in bp.shape.dim)
    else:
        shape = tuple(int(v) for v in (bp.num, bp.channels, bp.height, bp.width))
    values = bp.double_data if len(bp.double_data) else bp.data
    values = np.asarray(values)
    if values.size != int(np.prod(shape)):
        raise WeightsError(f"{path}: layer '{lname}' blob {i} has shape {shape} but {values.size} values")
    return values.reshape(shape)


def _legacy_equal(target_shape, source_shape):
    """Caffe's Blob::ShapeEquals for old 4-d blobs: (1,1,500,800) fits (500,800)."""
    if len(target_shape) > 4 or len(source_shape) != 4:
        return False
    padded = (1,) * (4 - len(target_shape)) + tuple(target_shape)
    return padded == tuple(source_shape)


def load_weights(net, path):
    """Copy parameters from ``path`` into ``net`` by layer name; return the skipped layer names."""
    arrays = read_weight_arrays(path)
    skipped, copies = [], []
    for lname, values in arrays.items():  # check everything before changing anything
        layer = net.layer_dict.get(lname)
        if layer is None:
            skipped.append(lname)
            continue
        if len(values) != len(layer.blobs):
            raise WeightsError(
                f"{path}: layer '{lname}' has {len(values)} parameter blob(s) in the file "
                f"but {len(layer.blobs)} in the net"
            )
        for i, (blob, arr) in enumerate(zip(layer.blobs, values)):
            if tuple(arr.shape) != blob.shape:
                if not (arr.size == blob.count and _legacy_equal(blob.shape, arr.shape)):
                    raise WeightsError(
                        f"{path}: layer '{lname}' blob {i}: the file has shape {tuple(arr.shape)} "
                        f"but the net expects {blob.shape}"
                    )
            copies.append((blob, arr))
    for blob, arr in copies:
        blob.data[...] = net.backend.from_host(arr.reshape(blob.shape), blob.dtype)
    return skipped


# -- pycaffe's caffe.io helpers ------------------------------------------------------------------
from .data.datum import array_to_datum, datum_to_array  # noqa: E402, F401 (Datums: minicaffe/data/datum.py)
from .image import load_image, oversample, resize_image  # noqa: E402, F401 (images: minicaffe/image.py)


def blobproto_to_array(blob, return_diff=False):
    """A BlobProto message (e.g. a decoded mean.binaryproto) as a numpy array of its shape."""
    values = np.asarray(blob.diff if return_diff else (blob.double_data if len(blob.double_data) else blob.data))
    if blob.has("shape"):
        shape = tuple(int(d) for d in blob.shape.dim)
    else:
        shape = tuple(int(v) for v in (blob.num, blob.channels, blob.height, blob.width))
    return values.reshape(shape)


def array_to_blobproto(arr, diff=None):
    """A numpy array as a BlobProto message (shape + float data), as pycaffe's helper."""
    from . import proto

    arr = np.asarray(arr)
    blob = proto.Message("BlobProto")
    blob.get_or_create("shape").dim.extend(int(d) for d in arr.shape)
    blob.data = arr.astype(np.float32).ravel()
    if diff is not None:
        blob.diff = np.asarray(diff, np.float32).ravel()
    return blob


class Transformer:
    """pycaffe's ``caffe.io.Transformer``: turn an image (H, W, C) in [0, 1] into a net input.

    ``preprocess(name, image)`` applies, in pycaffe's order: transpose (e.g. (2, 0, 1) for HWC ->
    CHW), channel swap (e.g. (2, 1, 0) for RGB -> BGR), raw scale (e.g. 255), mean subtraction
    (per channel or a whole (C, H, W) mean), input scale.  ``deprocess`` undoes it.
    """

    def __init__(self, inputs):
        self.inputs = dict(inputs)  # {blob name: shape}
        self.transpose, self.channel_swap, self.raw_scale, self.mean, self.input_scale = {}, {}, {}, {}, {}

    def _check(self, name):
        if name not in self.inputs:
            from .errors import MinicaffeError

            raise MinicaffeError(f"Transformer: '{name}' is not one of its inputs {list(self.inputs)}")

    def set_transpose(self, name, order):
        self._check(name)
        self.transpose[name] = tuple(order)

    def set_channel_swap(self, name, order):
        self._check(name)
        self.channel_swap[name] = tuple(order)

    def set_raw_scale(self, name, scale):
        self._check(name)
        self.raw_scale[name] = float(scale)

    def set_input_scale(self, name, scale):
        self._check(name)
        self.input_scale[name] = float(scale)

    def set_mean(self, name, mean):
        self._check(name)
        mean = np.asarray(mean, dtype=np.float32)
        if mean.ndim == 1:
            mean = mean[:, None, None]
        self.mean[name] = mean

    def preprocess(self, name, image):
        self._check(name)
        x = np.asarray(image, dtype=np.float32)
        if name in self.transpose:
            x = x.transpose(self.transpose[name])
        if name in self.channel_swap:
            x = x[list(self.channel_swap[name])]
        if name in self.raw_scale:
            x = x * self.raw_scale[name]
        if name in self.mean:
            x = x - self.mean[name]
        if name in self.input_scale:
            x = x * self.input_scale[name]
        return x

    def deprocess(self, name, data):
        self._check(name)
        x = np.asarray(data, dtype=np.float32).copy()
        if name in self.input_scale:
            x /= self.input_scale[name]
        if name in self.mean:
            x += self.mean[name]
        if name in self.raw_scale:
            x /= self.raw_scale[name]
        if name in self.channel_swap:
            x = x[np.argsort(self.channel_swap[name])]
        if name in self.transpose:
            x = x.transpose(np.argsort(self.transpose[name]))
        return x
