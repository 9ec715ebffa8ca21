"""A from-scratch reader of the IDX format (LeCun's MNIST files).

An IDX file is a 4-byte magic number, then one big-endian uint32 per dimension, then the data,
row-major, big-endian::

    magic = 0x00 0x00 <type> <ndim>      type 0x08 = uint8, 0x09 = int8, 0x0B = int16,
                                         0x0C = int32, 0x0D = float32, 0x0E = float64
    dims  = ndim x uint32 (big-endian)
    data  = prod(dims) items of <type>

MNIST ships ``train-images-idx3-ubyte`` (60000 x 28 x 28 uint8), ``train-labels-idx1-ubyte``
(60000 uint8) and the ``t10k-*`` pair (10000), often gzipped (``.gz``); both are read here.
"""

import gzip
import math
import struct
import zlib

import numpy as np

from ._util import DatasetError

GZIP_MAGIC = b"\x1f\x8b"
IDX_TYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def parse_header(data, name):
    """(dtype, dims, header length) of the IDX header at the start of ``data``."""
    if len(data) < 4:
        raise DatasetError(f"{name}: not an IDX file: only {len(data)} bytes (an IDX header is at least 4)")
    zero1, zero2, type_code, ndim = data[0], data[1], data[2], data[3]
    if zero1 != 0 or zero2 != 0 or type_code not in IDX_TYPES:
        raise DatasetError(
            f"{name}: bad IDX magic number 0x{bytes(data[:4]).hex()} (expected 00 00 <type> <ndim> with type one of "
            f"{', '.join(f'0x{t:02X}' for t in IDX_TYPES)}); is this really an IDX file?"
        )
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DatasetError(f"{name}: truncated IDX header: {ndim} dimensions need {header} bytes, file has {len(data)}")
    dims = struct.unpack(f">{ndim}I", bytes(data[4:header]))
    return np.dtype(IDX_TYPES[type_code]), dims, header


def _size(dtype, dims, header):
    return header + math.prod(dims) * dtype.itemsize  # Python ints: no overflow


def parse_idx(data, name="<bytes>"):
    """Decode the bytes of an IDX file into a numpy array (native byte order)."""
    dtype, dims, header = parse_header(data, name)
    expected = _size(dtype, dims, header)
    if len(data) != expected:
        raise DatasetError(
            f"{name}: IDX size mismatch: header says shape {tuple(dims)} of {dtype.name} = "
            f"{expected} bytes in all, the file has {len(data)}"
            f"{' (truncated download?)' if len(data) < expected else ''}"
        )
    array = np.frombuffer(data, dtype=dtype, count=math.prod(dims), offset=header).reshape(dims)
    return array.astype(dtype.newbyteorder("="), copy=True)


def _gunzip(path, raw, max_bytes):
    """Unpack a gzip file, reading the IDX header first: what it says is checked against
    ``max_bytes`` before the rest is unpacked, and no more than it says is ever unpacked."""
    z = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        head = z.decompress(raw, 4)
        if len(head) == 4 and head[:2] == b"\0\0":
            head += z.decompress(z.unconsumed_tail, 4 * head[3])
            dtype, dims, header = parse_header(head, path)
            expected = _size(dtype, dims, header)
            if max_bytes is not None and expected > max_bytes:
                raise DatasetError(
                    f"{path}: the IDX header says shape {tuple(dims)} of {dtype.name} = {expected} bytes, "
                    f"more than the {max_bytes} this data set can hold; refusing to unpack it"
                )
            limit = expected - len(head)
        else:
            limit = 1 << 20  # not an IDX header: unpack a little, for parse_idx to say what is wrong
        body = z.decompress(z.unconsumed_tail, limit)
        if z.unconsumed_tail or (not z.eof and z.decompress(b"", 1)):
            raise DatasetError(f"{path}: unpacks to more bytes than its IDX header says")
    except zlib.error as exc:
        raise DatasetError(f"{path}: damaged gzip data ({exc})") from None
    if not z.eof:
        raise DatasetError(f"{path}: truncated gzip file")
    return head + body


def read_idx(path, max_bytes=None):
    """Read an IDX file, gzipped or not (told by its first bytes, whatever its name).

    ``max_bytes`` bounds the unpacked size (a caller knows what its data set can hold): a small
    gzip file whose header asks for more is refused before it is unpacked.
    """
    path = str(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise DatasetError(f"{path}: cannot read IDX file: {e}") from None
    if data[:2] == GZIP_MAGIC:
        data = _gunzip(path, data, max_bytes)
    elif max_bytes is not None and len(data) > max_bytes:
        raise DatasetError(f"{path}: {len(data)} bytes, more than the {max_bytes} this data set can hold")
    return parse_idx(data, path)


def write_idx(path, array):
    """Write ``array`` as an IDX file (gzipped when ``path`` ends in ``.gz``); tests use this."""
    array = np.asarray(array)
    codes = {np.dtype(v).newbyteorder("=").str.lstrip("<>|="): k for k, v in IDX_TYPES.items()}
    key = array.dtype.newbyteorder("=").str.lstrip("<>|=")
    if key not in codes:
        raise DatasetError(f"write_idx: dtype {array.dtype} has no IDX type code")
    code = codes[key]
    big = array.astype(np.dtype(IDX_TYPES[code]).newbyteorder(">"), copy=False)
    data = bytes([0, 0, code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape) + big.tobytes()
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wb") as f:
        f.write(data)
