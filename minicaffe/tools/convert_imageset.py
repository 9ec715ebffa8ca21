"""``python -m minicaffe.tools.convert_imageset``: images listed in a file -> an LMDB/LevelDB of
Datum records, as Caffe's ``convert_imageset``.

    python -m minicaffe.tools.convert_imageset [FLAGS] ROOTFOLDER/ LISTFILE DB_NAME
    python -m minicaffe.tools.convert_imageset --resize_height=32 --resize_width=32 --shuffle \\
        images/ train.txt train_lmdb

LISTFILE has one ``<path> <label>`` per line (split at the last space); each image is read from
ROOTFOLDER + path.  Every record is what Caffe writes: key ``%08d_<path>`` (line number after any
shuffle), value a Datum: raw BGR pixels (channels, height, width, data, label, encoded=false), or
with ``--encoded`` the image file's own bytes (data, label, encoded=true); the file is re-encoded
(as ``--encode_type``, or its extension) only when resizing or when its extension is not the
requested type.  Commits every 1,000 records.  An image that cannot be read is reported with its
list line and skipped, as Caffe does.

Differences from Caffe: decoding and resizing use Pillow (bilinear), not OpenCV, so a resized
pixel may differ by a level or two, and re-encoded JPEGs are not the same bytes; ``--shuffle``
draws its order from ``--seed`` (Caffe's comes from its own RNG).
"""

import argparse
import os
import sys

import numpy as np

from ..data._util import DatasetError
from ..data.datum import bgr_chw_to_pil, encode_datum, read_image
from ..data.db import Writer
from ..data.sources import parse_image_list
from .common import banner, one_line_errors


def caffe_bool(value):
    """gflags' boolean: ``--flag``, ``--flag=true``, ``--flag=false`` (1/0, yes/no)."""
    v = str(value).lower()
    if v in ("true", "1", "yes", "t", "y"):
        return True
    if v in ("false", "0", "no", "f", "n"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{value}'")


def add_flag(p, name, help, **kw):
    """A Caffe flag, spelled ``--name`` or ``--name-with-dashes``."""
    names = [f"--{name}"] + ([f"--{name.replace('_', '-')}"] if "_" in name else [])
    p.add_argument(*names, dest=name, help=help, **kw)


def add_bool(p, name, help):
    add_flag(p, name, help, type=caffe_bool, nargs="?", const=True, default=False)


def build_parser():
    p = argparse.ArgumentParser(prog="python -m minicaffe.tools.convert_imageset", description=__doc__.split("\n\n")[0])
    p.add_argument("root_folder", help="prefix of every path in the list (end it with /)")
    p.add_argument("list_file", help="a text file of '<path> <label>' lines")
    p.add_argument("db_name", help="the database to create (must not exist)")
    add_bool(p, "gray", "treat images as grayscale (1 channel)")
    add_bool(p, "shuffle", "shuffle the list before writing (order drawn from --seed)")
    add_flag(p, "backend", "lmdb or leveldb (default lmdb)", default="lmdb", choices=("lmdb", "leveldb"))
    add_flag(p, "resize_width", "width images are resized to (0: keep)", type=int, default=0)
    add_flag(p, "resize_height", "height images are resized to (0: keep)", type=int, default=0)
    add_bool(p, "check_size", "stop if the images are not all of one size")
    add_bool(p, "encoded", "store the encoded image (PNG/JPEG bytes) in the Datum")
    add_flag(p, "encode_type", "what to encode images as ('png', 'jpg', ...); implies --encoded", default="")
    add_flag(p, "seed", "seed of --shuffle (default 0)", type=int, default=0)
    return p


def _encode_as(image, enc):
    import io

    fmt = {"jpg": "JPEG", "jpeg": "JPEG", "png": "PNG", "bmp": "BMP", "ppm": "PPM", "tif": "TIFF", "tiff": "TIFF"}
    if enc not in fmt:
        raise DatasetError(f"cannot encode images as '{enc}' (known: {', '.join(sorted(fmt))})")
    buf = io.BytesIO()
    extra = {"quality": 95} if fmt[enc] == "JPEG" else {}  # OpenCV's default JPEG quality
    bgr_chw_to_pil(image).save(buf, format=fmt[enc], **extra)
    return buf.getvalue()


def _ext(path):
    return os.path.splitext(path)[1][1:].lower()


def convert(
    root_folder,
    list_file,
    db_name,
    gray=False,
    shuffle=False,
    backend="lmdb",
    resize_height=0,
    resize_width=0,
    check_size=False,
    encoded=False,
    encode_type="",
    seed=0,
    log=print,
):
    """Write the database; return (records written, records skipped)."""
    is_color = not gray
    if os.path.exists(db_name):
        raise DatasetError(f"'{db_name}' exists already; remove it first (Caffe's tools refuse too)")
    paths, labels, numbers = parse_image_list(list_file)
    order = np.arange(len(paths))
    if shuffle:
        log("Shuffling data")
        order = np.random.default_rng(seed).permutation(len(paths))
    log(f"A total of {len(paths)} images.")
    if encode_type and not encoded:
        log("encode_type specified, assuming encoded=true.")
    encoded = encoded or bool(encode_type)
    resize_height, resize_width = max(0, resize_height), max(0, resize_width)
    count = skipped = 0
    size = None
    with Writer(db_name, backend) as db:
        for line_id, i in enumerate(order):
            name, where = paths[i], f"{list_file}:{numbers[i]}"
            path = root_folder + name
            try:
                image = read_image(path, resize_height, resize_width, is_color, where=where)
            except DatasetError as e:
                log(f"WARNING {e}; skipped")
                skipped += 1
                continue
            if encoded:
                enc = encode_type.lower() or _ext(name)
                same = _ext(name) == enc or (enc == "jpg" and _ext(name) == "jpeg")
                if same and not (resize_height and resize_width):
                    with open(path, "rb") as f:
                        value = encode_datum(label=labels[i], encoded_bytes=f.read())
                else:
                    value = encode_datum(label=labels[i], encoded_bytes=_encode_as(image, enc))
            else:
                value = encode_datum(image, labels[i])
            if check_size and not encoded:
                if size is None:
                    size = image.size
                elif image.size != size:
                    raise DatasetError(f"{where}: '{path}' has {image.size} pixel values, the first image {size}")
            db.put(f"{line_id:08d}_{name}", value)
            count += 1
            if count % 1000 == 0:
                log(f"Processed {count} files.")
    if count % 1000:
        log(f"Processed {count} files.")
    return count, skipped


@one_line_errors
def main(argv=None):
    a = build_parser().parse_args(argv)
    print(banner())
    if not os.path.isfile(a.list_file):
        raise DatasetError(f"list file '{a.list_file}' not found")
    _, skipped = convert(
        a.root_folder,
        a.list_file,
        a.db_name,
        a.gray,
        a.shuffle,
        a.backend,
        a.resize_height,
        a.resize_width,
        a.check_size,
        a.encoded,
        a.encode_type,
        a.seed,
    )
    if skipped:
        print(f"{skipped} image(s) could not be read and were skipped", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
