"""Weight files: Caffe's binary ``.caffemodel`` and a documented ``.npz``.

``.caffemodel`` is a NetParameter in protobuf's wire format; each layer that has parameters
carries them as BlobProto messages (``shape { dim }`` and packed float ``data``; old files use
num/channels/height/width and V1 ``layers``).  It is decoded by minicaffe.proto's own wire reader.

``.npz`` (numpy's zip of arrays) holds one array per parameter blob under the key
``"<layer name>/<blob index>"`` (e.g. ``conv1/0`` = conv1's weights, ``conv1/1`` its bias), in
the blob's shape and dtype.  Anything can read it: ``np.load(path)["conv1/0"]``.

Which format is written follows the file name (``.caffemodel`` -> Caffe's, else ``.npz``); which is
read follows the file's first bytes.  Files are written atomically (a temporary file beside the
target, then a rename), so an interrupted save never leaves a damaged file behind; every file
minicaffe writes gets the permissions of a file the user creates (0666 masked by the umask).

Loading follows Caffe's CopyTrainedLayersFrom: parameters are matched by layer name.  It reports
both directions, every time (:class:`WeightsReport`): layers the file has and the net lacks are
*ignored*, layers with parameters the net has and the file lacks are *missing* (they keep their
initial values).  A file that fills none of the net's layers is refused (an empty or foreign
file), and so is any blob whose count or shape differs, naming the layer, the blob and both shapes.

A weights file is input from anywhere, so reading it is bounded before anything is allocated:

- a ``.caffemodel`` is walked record by record; only the layers the net wants are decoded, and
  each blob's shape (at most 32 axes, no negative dimension) is checked against its value count
  and the net's shape first.  At most ``MAX_FILE_LAYERS`` layer records are read.
- an ``.npz`` member is read only if the net wants that layer, and only after its ``.npy`` header
  (dtype, shape) matches the net's blob and the member's unpacked size matches the header: a
  "zip bomb" is refused before it is unpacked.  The zip's CRC-32 is checked on every member read.
"""

import difflib
import hashlib
import math
import os
import sys
import tempfile
import zipfile
import zlib

import numpy as np

from .errors import WeightsError

ZIP_MAGIC = b"PK\x03\x04"
HDF5_MAGIC = b"\x89HDF"
#: Caffe's kMaxBlobAxes
MAX_BLOB_AXES = 32
#: more layer records than any real net has (ResNet-1001 has ~3,000 layers)
MAX_FILE_LAYERS = 100_000
#: an .npz read without a net to bound it may unpack at most this many times its packed size
NPZ_MAX_RATIO = 100
# what reading a damaged zip member raises (a bad CRC-32 is BadZipFile)
_ZIP_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, OSError, NotImplementedError, ValueError)


# -- writing ----------------------------------------------------------------------------------------
def current_umask():
    """The process's umask, read without changing it where the system tells it (Linux's
    /proc/self/status); else by setting and restoring it."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write(path, write):
    """Call write(fileobj) on a temporary file beside ``path``, then rename it over ``path``.

    The file gets the mode of any file the user creates (0666 masked by the umask: 0644 under the
    usual umask 022), the same for snapshots, logs and dataset caches.  A crash half-way leaves
    the old ``path`` (or nothing) and at most a hidden ``.tmp-*`` file beside it, never a torn
    ``path``.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=os.path.basename(path), dir=directory)
    try:
        os.fchmod(fd, 0o666 & ~current_umask())  # mkstemp makes 0600
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def file_sha256(path, chunk=1 << 20):
    """The sha256 (hex) of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def net_arrays(net):
    """{'layer/i': host array} for every parameter blob of ``net`` (shared blobs once per layer)."""
    out = {}
    for name, layer in zip(net.layer_names, net.layers):
        for i, blob in enumerate(layer.blobs):
            out[f"{name}/{i}"] = np.array(blob.cpu_data())
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
            bp.data = np.asarray(blob.cpu_data(), dtype=np.float32).ravel()
    return proto.encode(msg)


# -- reading ----------------------------------------------------------------------------------------
def _read_file(path):
    path = os.fspath(path)
    if not os.path.exists(path):
        raise WeightsError(f"weights file not found: {path}")
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise WeightsError(f"{path}: cannot read the weights file ({exc.strerror or exc})") from None


def read_weight_arrays(path):
    """{layer name: [array, ...]} of every layer with parameters in a .caffemodel or .npz file
    (an .npz member may unpack to at most ``NPZ_MAX_RATIO`` times its packed size)."""
    return _scan_weights(path, None)[0]


def _scan_weights(path, wanted):
    """(arrays, names) of a weights file: ``names`` lists every layer that holds parameters, in
    file order; ``arrays`` ({layer: [array, ...]}) only those in ``wanted`` ({layer: [blob shape,
    ...]}, e.g. a net's; None: all), each blob checked against its shape before its values are
    read."""
    path = os.fspath(path)
    raw = _read_file(path)
    if path.endswith(".solverstate"):  # minicaffe's (.npz) or Caffe's (protobuf) solver state
        raise WeightsError(
            f"{path} is a solver state, not weights: give it to --resume (Solver.restore); its "
            f"weights are in the .caffemodel written beside it"
        )
    if raw[:4] == ZIP_MAGIC:
        return _scan_npz(path, wanted)
    if raw[:4] == HDF5_MAGIC:  # Caffe's .caffemodel.h5 (snapshot_format: HDF5), read by solvers/caffe_state.py
        from .solvers.caffe_state import read_h5_weights

        return _fit_arrays(read_h5_weights(path), path, wanted)
    return _scan_caffemodel(raw, path, wanted)


def _fit_arrays(layers, path, wanted):
    """{layer: [arrays]} of a reader that decodes everything, checked against ``wanted`` as the
    scanners check their blobs -> (arrays, names)."""
    if wanted is None:
        return layers, list(layers)
    arrays = {}
    for lname, blobs in layers.items():
        if lname not in wanted:
            continue
        if len(blobs) != len(wanted[lname]):
            raise WeightsError(
                f"{path}: layer '{lname}' has {len(blobs)} parameter blob(s) in the file but {len(wanted[lname])} in the net"
            )
        out = []
        for i, a in enumerate(blobs):
            target = _blob_fits(wanted, lname, i, tuple(a.shape))
            if target is False:
                raise WeightsError(
                    f"{path}: layer '{lname}' blob {i}: the file has shape {tuple(a.shape)} but the net expects "
                    f"{tuple(wanted[lname][i])}"
                )
            out.append(a.reshape(target))
        arrays[lname] = out
    return arrays, list(layers)


def _blob_fits(wanted, lname, i, shape):
    """The net's shape for a blob of ``shape`` (None when there is no net to compare with, False
    when it does not fit; Caffe's old 4-d shapes fit their squeezed form)."""
    if wanted is None:
        return None
    target = tuple(wanted[lname][i])
    if shape == target or (math.prod(shape) == math.prod(target) and _legacy_equal(target, shape)):
        return target
    return False


def _scan_caffemodel(raw, path, wanted):
    from .errors import PrototxtError
    from .proto.wire import LEN, Decoder

    decoder = Decoder(raw, filename=path)
    arrays, names, n_layers = {}, {}, 0  # names: an ordered set
    # (field number of the layer list, name field, blobs field) for the modern and V1 layer messages
    kinds = {100: ("LayerParameter", 1, 7), 2: ("V1LayerParameter", 4, 6)}
    try:
        for field, wire_type, payload, _ in decoder.records("NetParameter", 0, len(raw)):
            if field is None or field.number not in kinds or wire_type != LEN:
                continue
            n_layers += 1
            if n_layers > MAX_FILE_LAYERS:
                raise WeightsError(
                    f"{path}: more than {MAX_FILE_LAYERS} layer records; not a weights file of any real net"
                )
            if payload[0] == payload[1]:
                continue  # an empty layer
            type_name, name_no, blobs_no = kinds[field.number]
            lname, blobs = "", []
            for sub, sub_wire, sub_payload, at in decoder.records(type_name, *payload):
                if sub is None or sub_wire != LEN:
                    continue
                if sub.number == name_no:
                    lname = bytes(raw[sub_payload[0] : sub_payload[1]]).decode("utf-8", "surrogateescape")
                elif sub.number == blobs_no:
                    blobs.append(sub_payload)
                elif type_name == "V1LayerParameter" and sub.number == 1:
                    raise WeightsError(
                        f"{path}: a V0 (pre-2014) layer at byte offset {at}; upgrade the file with "
                        f"Caffe's upgrade_net_proto_binary first"
                    )
            if not blobs:
                continue
            names.pop(lname, None)  # Caffe copies each in turn: the last one wins
            names[lname] = None
            if wanted is not None and lname not in wanted:
                continue
            if wanted is not None and len(blobs) != len(wanted[lname]):
                raise WeightsError(
                    f"{path}: layer '{lname}' has {len(blobs)} parameter blob(s) in the file "
                    f"but {len(wanted[lname])} in the net"
                )
            arrays[lname] = [
                _blob_array(decoder.decode_message("BlobProto", *b), path, lname, i, wanted)
                for i, b in enumerate(blobs)
            ]
    except PrototxtError as exc:
        raise WeightsError(f"{path}: not a readable .caffemodel: {exc.bare_message}") from None
    return arrays, list(names)


def _blob_array(bp, path, lname, i, wanted=None):
    where = f"{path}: layer '{lname}' blob {i}"
    if bp.has("shape"):
        shape = tuple(int(d) for d in bp.shape.dim)
    else:
        shape = tuple(int(v) for v in (bp.num, bp.channels, bp.height, bp.width))
    if len(shape) > MAX_BLOB_AXES:
        raise WeightsError(f"{where} has {len(shape)} dimensions; a blob has at most {MAX_BLOB_AXES}")
    if any(d < 0 for d in shape):
        raise WeightsError(f"{where} has a negative dimension in its shape {shape}")
    values = bp.double_data if len(bp.double_data) else bp.data
    count = len(values)
    if count != math.prod(shape):
        raise WeightsError(f"{where} has shape {shape} ({math.prod(shape)} values) but holds {count} values")
    target = _blob_fits(wanted, lname, i, shape)
    if target is False:
        raise WeightsError(f"{where}: the file has shape {shape} but the net expects {tuple(wanted[lname][i])}")
    return np.asarray(values).reshape(shape if target is None else target)


def _npy_header(f, where):
    """(shape, dtype, fortran_order) of the .npy stream ``f``, checked; nothing else is read."""
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            raise ValueError(f"unsupported .npy format version {version}")
    except (ValueError, SyntaxError) as exc:
        raise WeightsError(f"{where}: not a readable .npy array ({exc})") from None
    if dtype.hasobject or dtype.kind not in "fiub":
        raise WeightsError(f"{where}: dtype {dtype} is not numeric")
    if len(shape) > MAX_BLOB_AXES or any(d < 0 for d in shape):
        raise WeightsError(f"{where}: shape {shape} is not the shape of a blob")
    return tuple(shape), dtype, fortran


def read_npz_member(zf, info, where, expected_shape=None, max_bytes=None, error=WeightsError):
    """One array of an open .npz (``zf``, its ZipInfo ``info``), read only after its header is
    checked: the shape must be ``expected_shape`` (when given) and the unpacked size must be what
    the header says (and at most ``max_bytes``).  Any damage (CRC, truncation) is ``error``."""
    try:
        with zf.open(info) as f:
            try:
                shape, dtype, fortran = _npy_header(f, where)
            except WeightsError as exc:
                raise error(str(exc)) from None
            if expected_shape is not None and shape != tuple(expected_shape):
                raise error(f"{where}: the file has shape {shape} but {tuple(expected_shape)} is expected")
            nbytes = math.prod(shape) * dtype.itemsize
            if info.file_size != f.tell() + nbytes:
                raise error(
                    f"{where}: the header says shape {shape} of {dtype} ({nbytes} bytes) but the member "
                    f"holds {info.file_size - f.tell()} bytes of data"
                )
            if max_bytes is not None and nbytes > max_bytes:
                raise error(f"{where}: {nbytes} bytes unpacked from {info.compress_size} is more than {max_bytes}")
            buf = f.read(nbytes)
            if len(buf) != nbytes or f.read(1):
                raise error(f"{where}: truncated or damaged member {info.filename}")
    except _ZIP_ERRORS as exc:
        raise error(f"{where}: damaged member {info.filename} ({exc})") from None
    array = np.frombuffer(buf, dtype=dtype)
    return array.reshape(shape[::-1]).T if fortran else array.reshape(shape)


def open_npz(path, error=WeightsError):
    """A ZipFile of ``path``; a damaged archive is ``error`` naming the file."""
    try:
        return zipfile.ZipFile(path)
    except _ZIP_ERRORS as exc:
        raise error(f"{path}: not a readable .npz archive ({exc})") from None


def _scan_npz(path, wanted):
    layers = {}
    with open_npz(path) as zf:
        members = zf.infolist()
        keys = [m.filename[:-4] if m.filename.endswith(".npy") else m.filename for m in members]
        if "record" in keys:
            raise WeightsError(
                f"{path} is a solver state, not weights: give it to --resume (Solver.restore); its "
                f"weights are in the .caffemodel written beside it"
            )
        for key, info in zip(keys, members):
            lname, sep, idx = key.rpartition("/")
            if not sep or not idx.isdigit():
                raise WeightsError(f"{path}: key '{key}' is not of the form '<layer>/<blob index>'")
            layers.setdefault(lname, {})[int(idx)] = info
        arrays = {}
        for lname, blobs in layers.items():
            if sorted(blobs) != list(range(len(blobs))):
                raise WeightsError(
                    f"{path}: layer '{lname}' has blob indices {sorted(blobs)}; expected 0..{len(blobs) - 1}"
                )
            if wanted is not None and lname not in wanted:
                continue
            if wanted is not None and len(blobs) != len(wanted[lname]):
                raise WeightsError(
                    f"{path}: layer '{lname}' has {len(blobs)} parameter blob(s) in the file "
                    f"but {len(wanted[lname])} in the net"
                )
            out = []
            for i in range(len(blobs)):
                info, where = blobs[i], f"{path}: layer '{lname}' blob {i}"
                if wanted is None:
                    limit = NPZ_MAX_RATIO * info.compress_size + (1 << 20)
                    out.append(read_npz_member(zf, info, where, max_bytes=limit))
                    continue
                try:
                    with zf.open(info) as f:  # the header first: refuse before unpacking anything
                        shape, _, _ = _npy_header(f, where)
                except _ZIP_ERRORS as exc:
                    raise WeightsError(f"{where}: damaged member {info.filename} ({exc})") from None
                target = _blob_fits(wanted, lname, i, shape)
                if target is False:
                    raise WeightsError(
                        f"{where}: the file has shape {shape} but the net expects {tuple(wanted[lname][i])}"
                    )
                out.append(read_npz_member(zf, info, where, expected_shape=shape).reshape(target))
            arrays[lname] = out
    return arrays, list(layers)


def _legacy_equal(target_shape, source_shape):
    """Caffe's Blob::ShapeEquals for old 4-d blobs: (1,1,500,800) fits (500,800)."""
    if len(target_shape) > 4 or len(source_shape) != 4:
        return False
    padded = (1,) * (4 - len(target_shape)) + tuple(target_shape)
    return padded == tuple(source_shape)


class WeightsReport:
    """What :func:`load_weights` did: ``copied``, ``ignored`` (in the file, not in the net) and
    ``missing`` (layers with parameters in the net, not in the file) layer names.

    Iterating it yields the ignored names (what ``copy_from`` returned before it reported more).
    """

    def __init__(self, path, copied, ignored, missing, types=None):
        self.path, self.copied, self.ignored, self.missing = path, copied, ignored, missing
        self.types = types or {}

    def __iter__(self):
        return iter(self.ignored)

    def __len__(self):
        return len(self.ignored)

    def lines(self):
        """Caffe-like log lines: one per ignored and per missing layer, then a summary."""
        out = []
        for name in self.ignored:
            close = difflib.get_close_matches(name, self.missing, n=1, cutoff=0.5)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            out.append(f"Ignoring source layer '{name}': the net has no layer of that name{hint}")
        for name in self.missing:
            kind = f" ({self.types[name]})" if name in self.types else ""
            out.append(f"Layer '{name}'{kind} is not in {self.path}: it keeps its initial values")
        out.append(
            f"Copied {len(self.copied)} layer(s) from {self.path}"
            + (f"; ignored {len(self.ignored)}" if self.ignored else "")
            + (f"; {len(self.missing)} missing" if self.missing else "")
        )
        return out

    def __repr__(self):
        return f"<WeightsReport copied={self.copied} ignored={self.ignored} missing={self.missing}>"


def stderr_log(message):
    print(message, file=sys.stderr, flush=True)


def _preview(names, n=8):
    shown = ", ".join(f"'{x}'" for x in names[:n])
    return shown + (f", ... ({len(names)} in all)" if len(names) > n else "") if names else "none"


def load_weights(net, path, log=None, strict=False):
    """Copy parameters from ``path`` into ``net`` by layer name; return a :class:`WeightsReport`.

    Everything is read and checked before anything in the net changes.  ``log`` (a function of
    one line) gets the report's lines.  Refused: a file that fills none of the net's layers that
    have parameters; with ``strict``, a file that misses any of them (a snapshot of this net).
    """
    path = os.fspath(path)
    wanted, types = {}, {}
    for lname, layer in net.layer_dict.items():
        if layer.blobs:
            wanted[lname] = [tuple(b.shape) for b in layer.blobs]
            types[lname] = layer.type
    arrays, names = _scan_weights(path, wanted)
    copied = [n for n in names if n in wanted]
    ignored = [n for n in names if n not in wanted]
    missing = [n for n in wanted if n not in arrays]
    if wanted and not copied:
        raise WeightsError(
            f"{path}: fills none of the net's {len(wanted)} layers with parameters "
            f"(the file's layers with parameters: {_preview(names)}; the net's: {_preview(list(wanted))})"
        )
    if strict and missing:
        raise WeightsError(f"{path} does not hold layer(s) {', '.join(repr(m) for m in missing)} of net '{net.name}'")
    for lname in copied:
        for blob, arr in zip(net.layer_dict[lname].blobs, arrays[lname]):
            blob.data[...] = arr.reshape(blob.shape)  # on the host; synced on first use
    report = WeightsReport(path, copied, ignored, missing, types)
    if log is not None:
        for line in report.lines():
            log(line)
    return report


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
