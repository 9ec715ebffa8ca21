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
import struct

import numpy as np

from ._util import DatasetError

GZIP_MAGIC = b"\x1f\x8b"
IDX_TYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def parse_idx(data, name="<bytes>"):
    """Decode the bytes of an IDX file into a numpy array (native byte order)."""
    if len(data) < 4:
        raise DatasetError(f"{name}: not an IDX file: only {len(data)} bytes (an IDX header is at least 4)")
    zero1, zero2, type_code, ndim = data[0], data[1], data[2], data[3]
    if zero1 != 0 or zero2 != 0 or type_code not in IDX_TYPES:
        raise DatasetError(
            f"{name}: bad IDX magic number 0x{data[:4].hex()} (expected 00 00 <type> <ndim> with type one of "
            f"{', '.join(f'0x{t:02X}' for t in IDX_TYPES)}); is this really an IDX file?"
        )
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DatasetError(f"{name}: truncated IDX header: {ndim} dimensions need {header} bytes, file has {len(data)}")
    dims = struct.unpack(f">{ndim}I", data[4:header])
    dtype = np.dtype(IDX_TYPES[type_code])
    count = int(np.prod(dims, dtype=np.int64)) if dims else 1
    expected = header + count * dtype.itemsize
    if len(data) != expected:
        raise DatasetError(
            f"{name}: IDX size mismatch: header says shape {tuple(dims)} of {dtype.name} = "
            f"{expected} bytes in all, the file has {len(data)}"
            f"{' (truncated download?)' if len(data) < expected else ''}"
        )
    array = np.frombuffer(data, dtype=dtype, count=count, offset=header).reshape(dims)
    return array.astype(dtype.newbyteorder("="), copy=True)


def read_idx(path):
    """Read an IDX file, gzipped or not (told by its first bytes, whatever its name)."""
    path = str(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
        if data[:2] == GZIP_MAGIC:
            data = gzip.decompress(data)
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise DatasetError(f"{path}: cannot read IDX file: {e}") from None
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
