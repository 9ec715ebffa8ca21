"""Small hostile files against minicaffe's readers: peak memory (tracemalloc) and time.

    python benchmarks/bad_input.py            # the minicaffe on PYTHONPATH

Cases: a 1 MB zip-bomb ``.npz`` (an InnerProduct's weights: zeros that unpack to ~1 GB) given to
``Net.copy_from``; a ~1 MB gzip-bomb IDX file (header: 1,000,000 x 28 x 28) given to ``read_idx``
as MNIST's loader calls it; a 1 MB ``.caffemodel`` of empty layer records; a prototxt with a
10 MB quoted string.  Each prints the outcome (the error's first words), the peak traced
allocation and the seconds.  Run it on two checkouts under the same load to compare them.
"""

import gzip
import os
import struct
import sys
import tempfile
import time
import tracemalloc
import zipfile

import numpy as np

import minicaffe as caffe
from minicaffe import proto
from minicaffe.data import idx

NET = """name: "b"
input: "data" input_shape { dim: 1 dim: 1000 }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 3 } }
"""


def _run(fn):
    try:
        fn()
        return "accepted"
    except Exception as exc:  # noqa: BLE001 - reported, whatever it is
        return f"{type(exc).__name__}: {str(exc)[:90]}"


def measure(label, fn, size):
    """Peak memory from a run under tracemalloc; time from a second run without it (tracing
    slows Python code several times)."""
    tracemalloc.start()
    outcome = _run(fn)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    t0 = time.perf_counter()
    _run(fn)
    seconds = time.perf_counter() - t0
    print(f"{label:<34} {size / 1e6:6.2f} MB file  peak {peak / 1e6:9.1f} MB  {seconds:7.2f} s  {outcome}")


def zip_bomb(path, member, n_floats):
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        with z.open(member, "w", force_zip64=True) as f:
            np.lib.format.write_array_header_1_0(
                f, {"descr": "<f4", "fortran_order": False, "shape": (3, n_floats // 3)}
            )
            zeros, left = bytes(1 << 22), n_floats // 3 * 3 * 4
            while left:
                f.write(zeros[: min(left, len(zeros))])
                left -= min(left, len(zeros))
        bias = np.zeros(3, np.float32)
        with z.open(member.replace("/0", "/1"), "w") as f:
            np.lib.format.write_array(f, bias)


def main():
    print(f"python {sys.version.split()[0]}, numpy {np.__version__}, load {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as tmp:
        net = caffe.Net(proto.parse(NET, "NetParameter"), caffe.TEST)
        bomb = os.path.join(tmp, "bomb.npz")
        zip_bomb(bomb, "ip/0.npy", 270_000_000)  # 1.08 GB of float32 zeros
        measure("zip-bomb .npz -> copy_from", lambda: net.copy_from(bomb), os.path.getsize(bomb))

        gz = os.path.join(tmp, "train-images-idx3-ubyte.gz")
        with gzip.open(gz, "wb", compresslevel=9) as f:
            f.write(bytes([0, 0, 8, 3]) + struct.pack(">3I", 1_000_000, 28, 28))
            zeros = bytes(1 << 22)
            for _ in range(1_000_000 * 784 // len(zeros)):
                f.write(zeros)
        try:  # MNIST's loader bounds what it reads; older versions take no bound
            read = lambda: idx.read_idx(gz, max_bytes=4 * (60_000 * 784 + 16))  # noqa: E731
            idx.read_idx.__code__.co_varnames.index("max_bytes")
        except ValueError:
            read = lambda: idx.read_idx(gz)  # noqa: E731
        measure("gzip-bomb IDX -> read_idx", read, os.path.getsize(gz))

        empty = os.path.join(tmp, "empty.caffemodel")
        with open(empty, "wb") as f:
            f.write(b"\xa2\x06\x00" * 333_333)
        measure("1 MB of empty layer records", lambda: net.copy_from(empty), os.path.getsize(empty))

        text = 'name: "' + "a" * 10_000_000 + '"'
        measure("10 MB quoted string -> parse", lambda: proto.parse(text, "NetParameter"), len(text))


if __name__ == "__main__":
    main()
