"""Batch order, shuffling, determinism with and without the prefetch thread, saved state,
the source registry, CIFAR-10 binaries and synthetic data."""

import gc
import json
import tarfile
import time

import numpy as np
import pytest

from minicaffe.data import (
    BatchReader,
    Dataset,
    DatasetError,
    Prefetcher,
    Transformer,
    cifar10,
    get_dataset,
    register_dataset,
    resolve_source,
    synthetic,
    synthetic_dataset,
    unregister_dataset,
)


def make_dataset(n=23, shape=(2, 5, 5), seed=0):
    rng = np.random.default_rng(seed)
    return Dataset("t", rng.integers(0, 256, size=(n,) + shape, dtype=np.uint8), np.arange(n))


def ids(labels):
    return labels.astype(int).tolist()


def take(prefetcher, k):
    return [prefetcher.next() for _ in range(k)]


# -- order -------------------------------------------------------------------------------------
def test_sequential_reads_in_order_and_wraps():
    r = Prefetcher(BatchReader(make_dataset(10), 4, shuffle=False), depth=0)
    assert [ids(b[1]) for b in take(r, 4)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 1], [2, 3, 4, 5]]
    assert r.state_dict()["epoch"] == 1 and r.state_dict()["index"] == 6


def test_every_epoch_is_a_fresh_permutation():
    n, b = 23, 5
    r = Prefetcher(BatchReader(make_dataset(n), b, shuffle=True, seed=11), depth=0)
    stream = np.concatenate([lab for _, lab in take(r, 3 * n)])  # 15 epochs of labels
    epochs = stream[: (len(stream) // n) * n].reshape(-1, n).astype(int)
    for e in epochs:
        assert sorted(e) == list(range(n))  # each image once per epoch
    assert len({tuple(e) for e in epochs}) == len(epochs)  # a new order each epoch
    assert epochs[0].tolist() != list(range(n))


def test_shuffle_is_determined_by_the_seed():
    def stream(seed):
        r = Prefetcher(BatchReader(make_dataset(), 4, shuffle=True, seed=seed), depth=0)
        return [ids(b[1]) for b in take(r, 20)]

    assert stream(3) == stream(3)
    assert stream(3) != stream(4)


def test_batch_larger_than_dataset():
    r = Prefetcher(BatchReader(make_dataset(3), 7, shuffle=False), depth=0)
    assert ids(r.next()[1]) == [0, 1, 2, 0, 1, 2, 0]


# -- prefetch ----------------------------------------------------------------------------------
def _reader(seed=5, phase="TRAIN"):
    t = Transformer(scale=1 / 255, crop_size=3, mirror=True, phase=phase)
    return BatchReader(make_dataset(), 4, t, shuffle=True, seed=seed)


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_prefetch_thread_gives_the_same_batches_as_no_thread(depth):
    want = take(Prefetcher(_reader(), depth=0), 30)
    p = Prefetcher(_reader(), depth=depth)
    got = []
    for i in range(30):
        if i % 7 == 3:
            time.sleep(0.01)  # let the thread run ahead sometimes
        got.append(p.next())
    p.stop()
    for (a, la), (b, lb) in zip(want, got):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(la, lb)


def test_queue_is_bounded_and_thread_stops():
    p = Prefetcher(_reader(), depth=2)
    p.start()
    time.sleep(0.2)
    assert p._queue.qsize() <= 2
    thread = p._thread
    p.stop()
    assert not thread.is_alive()


def test_the_thread_makes_the_next_batch_only_once_the_caller_released_its_place():
    """Caffe's free queue: the batch the caller holds fills a place until release() (the Data
    layer calls it after copying the batch into its tops), so the thread is not woken while the
    copy has let the GIL go.  With a plain queue, taking a batch woke the thread at once."""

    class Counting(BatchReader):
        made = 0

        def produce(self, epoch, index):
            Counting.made += 1
            return super().produce(epoch, index)

    p = Prefetcher(Counting(make_dataset(), 4, shuffle=False), depth=1)
    first, _ = p.next()
    time.sleep(0.3)
    assert Counting.made == 1 and p._queue.qsize() == 0  # held: no place free for the next batch
    p.release()
    p.release()  # twice is harmless: one place only
    deadline = time.time() + 5
    while p._queue.qsize() == 0 and time.time() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    assert Counting.made == 2 and p._queue.qsize() == 1
    second, _ = p.next()  # next() also releases what the caller still held
    np.testing.assert_array_equal(second, take(Prefetcher(_reader_plain(), depth=0), 2)[1][0])
    assert first.shape == second.shape
    p.stop()


def _reader_plain():
    return BatchReader(make_dataset(), 4, shuffle=False)


def test_dropped_prefetcher_ends_its_thread():
    p = Prefetcher(_reader(), depth=2)
    p.next()
    thread = p._thread
    del p
    gc.collect()
    thread.join(2)
    assert not thread.is_alive()


def test_error_in_the_thread_is_raised_in_the_caller():
    class Failing:
        """Pixels that can be read twice, then the disk fails."""

        def __init__(self, array):
            self.array, self.shape, self.reads = array, array.shape, 0

        def __getitem__(self, index):
            self.reads += 1
            if self.reads > 2:
                raise DatasetError("disk on fire")
            return self.array[index]

    ds = Dataset("b", np.zeros((8, 1, 2, 2), np.uint8), np.arange(8))
    ds.images = Failing(ds.images)
    p = Prefetcher(BatchReader(ds, 2, shuffle=False), depth=2)
    p.next(), p.next()
    with pytest.raises(DatasetError, match="disk on fire"):
        p.next()


# -- state -------------------------------------------------------------------------------------
@pytest.mark.parametrize("depth", [0, 3])
def test_state_round_trip_continues_the_exact_sequence(depth):
    reference = take(Prefetcher(_reader(), depth=0), 40)
    p = Prefetcher(_reader(), depth=depth)
    take(p, 17)
    state = json.loads(json.dumps(p.state_dict()))  # plain JSON, no pickle
    assert set(state) == {"epoch", "index", "seed", "shuffle", "size"}
    rest_here = take(p, 23)
    p.stop()
    # a new reader (say, a resumed run built with another seed) continues from the saved state
    q = Prefetcher(_reader(seed=999), depth=depth)
    q.next()
    q.load_state_dict(state)
    rest_there = take(q, 23)
    q.stop()
    for (a, la), (b, lb), (c, lc) in zip(reference[17:], rest_here, rest_there):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)
        np.testing.assert_array_equal(la, lc)


def test_state_from_another_dataset_is_refused():
    p = Prefetcher(_reader(), depth=0)
    with pytest.raises(DatasetError, match="data set of 99 images, this one has 23"):
        p.load_state_dict({"epoch": 0, "index": 0, "seed": 1, "shuffle": True, "size": 99})
    with pytest.raises(DatasetError, match="not a data reader state"):
        p.load_state_dict({"index": 0})


# -- registry ----------------------------------------------------------------------------------
@pytest.fixture
def registered():
    names = []

    def reg(name, *args):
        names.append(name)
        register_dataset(name, *args)

    yield reg
    for n in names:
        unregister_dataset(n)


@pytest.mark.parametrize(
    "source, name",
    [
        ("mnist_train", "mnist_train"),
        ("mnist_test", "mnist_test"),
        ("examples/mnist/mnist_train_lmdb", "mnist_train"),
        ("examples/mnist/mnist_test_lmdb", "mnist_test"),
        ("/home/me/caffe/examples/mnist/mnist_test_leveldb/", "mnist_test"),
        ("cifar10_train", "cifar10_train"),
        ("examples/cifar10/cifar10_test_lmdb", "cifar10_test"),
        ("synthetic:3x32x32:10", "synthetic:3x32x32:10"),
    ],
)
def test_source_names(source, name):
    assert resolve_source(source) == name


def test_unknown_source_lists_the_known_ones():
    with pytest.raises(DatasetError) as e:
        resolve_source("examples/imagenet/ilsvrc12_train_lmdb")
    text = str(e.value)
    assert "unknown data source 'examples/imagenet/ilsvrc12_train_lmdb'" in text
    for known in ("mnist_train", "cifar10_test", ".../mnist_train_lmdb", "synthetic:CxHxW", "register_dataset"):
        assert known in text


def test_register_your_own(registered):
    x = np.arange(4 * 6, dtype=np.float32).reshape(4, 6)
    registered("mine", x, [0, 1, 0, 1])
    ds = get_dataset("mine")
    assert ds.shape == (6, 1, 1) and len(ds) == 4 and ds.images.dtype == np.float32
    assert get_dataset("mine") is ds
    registered("lazy", lambda: (np.zeros((2, 3, 3), np.uint8), None))
    assert get_dataset("lazy").shape == (1, 3, 3) and get_dataset("lazy").labels is None
    registered("mine", np.zeros((2, 1, 2, 2)), None)  # replacing drops the old one
    assert len(get_dataset("mine")) == 2


def test_register_checks_its_arrays():
    with pytest.raises(DatasetError, match="3 images but labels of shape \\(2,\\)"):
        register_dataset("bad", np.zeros((3, 2, 2)), [1, 2])
    with pytest.raises(DatasetError, match="images must be .* got shape \\(3, 1, 1, 1, 1\\)"):
        register_dataset("bad", np.zeros((3, 1, 1, 1, 1)))


def test_npz_source(tmp_path):
    np.savez(tmp_path / "d.npz", images=np.ones((3, 1, 2, 2), np.uint8), labels=[4, 5, 6])
    ds = get_dataset(str(tmp_path / "d.npz"))
    assert len(ds) == 3 and ds.labels.tolist() == [4, 5, 6]


# -- synthetic ---------------------------------------------------------------------------------
def test_synthetic_is_seeded_and_shaped():
    a = get_dataset("synthetic:3x8x9:4:50:2")
    assert a.images.shape == (50, 3, 8, 9) and a.images.dtype == np.uint8 and set(a.labels) <= {0, 1, 2, 3}
    b = synthetic_dataset((3, 8, 9), 4, 50, 2)
    np.testing.assert_array_equal(a.images, b.images)
    c = synthetic_dataset((3, 8, 9), 4, 50, 3)
    assert not np.array_equal(a.images, c.images)
    # learnable: the nearest class template recovers most labels
    imgs, labels = synthetic.make((1, 6, 6), 5, 200, 0)
    templates = np.random.default_rng(0).integers(0, 256, size=(5, 1, 6, 6), dtype=np.uint8).astype(float)
    guess = ((imgs[:, None].astype(float) - templates[None]) ** 2).sum(axis=(2, 3, 4)).argmin(1)
    assert (guess == labels).mean() > 0.9


@pytest.mark.parametrize("spec", ["synthetic:", "synthetic:3x32", "synthetic:axbxc", "synthetic:1x2x3:1:2:3:4"])
def test_bad_synthetic_spec(spec):
    with pytest.raises(DatasetError, match="synthetic"):
        get_dataset(spec)


# -- CIFAR-10 ----------------------------------------------------------------------------------
def _cifar_bytes(n, seed):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, n).astype(np.uint8)
    pixels = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
    return np.concatenate([labels[:, None], pixels], axis=1).tobytes(), labels, pixels


def _cifar_files(folder, n=4):
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for i, name in enumerate(cifar10.FILES["train"] + cifar10.FILES["test"]):
        data, labels, pixels = _cifar_bytes(n, i)
        (folder / name).write_bytes(data)
        out[name] = (labels, pixels)
    return out


@pytest.mark.parametrize("layout", ["cifar-10-batches-bin", "flat", "archive"])
def test_cifar10_binaries(tmp_path, monkeypatch, layout):
    monkeypatch.setattr(cifar10, "_memo", {})
    src = tmp_path / "src" if layout == "archive" else tmp_path / ("" if layout == "flat" else layout)
    files = _cifar_files(src if layout != "archive" else src / "cifar-10-batches-bin")
    if layout == "archive":
        with tarfile.open(tmp_path / cifar10.ARCHIVE, "w:gz") as tar:
            tar.add(src / "cifar-10-batches-bin", arcname="cifar-10-batches-bin")
    images, labels = cifar10.load("train", tmp_path)
    assert images.shape == (20, 3, 32, 32) and images.dtype == np.uint8
    first = files["data_batch_1.bin"]
    assert labels[:4].tolist() == first[0].tolist()
    np.testing.assert_array_equal(images[0, 1], first[1][0, 1024:2048].reshape(32, 32))  # green plane
    assert cifar10.load("test", tmp_path)[0].shape == (4, 3, 32, 32)


def test_cifar10_missing_names_the_files(tmp_path, monkeypatch):
    monkeypatch.setattr(cifar10, "_memo", {})
    with pytest.raises(DatasetError) as e:
        cifar10.load("train", tmp_path)
    text = str(e.value)
    assert "data_batch_1.bin" in text and "data_batch_5.bin" in text and "cifar-10-binary.tar.gz" in text
    assert str(tmp_path) in text and "synthetic:3x32x32:10" in text


def test_cifar10_bad_record_size():
    with pytest.raises(DatasetError, match="not a whole number of CIFAR-10 records"):
        cifar10.parse_batch(b"\x00" * 3000, "x.bin")


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 13),
    batch=st.integers(1, 9),
    before=st.integers(0, 12),
    after=st.integers(1, 8),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**40),
)
def test_any_saved_position_continues_the_same_stream(n, batch, before, after, shuffle, seed):
    def reader():
        return BatchReader(
            make_dataset(n, shape=(1, 3, 3)), batch, Transformer(mirror=True, crop_size=2), shuffle=shuffle, seed=seed
        )

    stream = [lab for _, lab in take(Prefetcher(reader(), depth=0), before + after)]
    p = Prefetcher(reader(), depth=0)
    take(p, before)
    q = Prefetcher(BatchReader(make_dataset(n, shape=(1, 3, 3)), batch, shuffle=not shuffle, seed=seed + 1), depth=0)
    q.load_state_dict(p.state_dict())
    got = [lab for _, lab in take(q, after)]
    for a, b in zip(stream[before:], got):
        np.testing.assert_array_equal(a, b)
