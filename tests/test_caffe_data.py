"""Caffe's data files: Datum bytes against caffe.proto, databases written by minicaffe's tools
(convert_imageset, convert_mnist_data, compute_image_mean) and read back by the Data layer in
key order, with transform_param as Caffe applies it; and the errors of bad input."""

import struct
from pathlib import Path

import numpy as np
import pytest

from minicaffe import backend, proto
from minicaffe.blob import Blob
from minicaffe.data import DatasetError
from minicaffe.data.datum import decode_datum, encode_datum
from minicaffe.data.db import Writer, open_db
from minicaffe.data.idx import write_idx
from minicaffe.errors import LayerError
from minicaffe.layer import create_layer
from minicaffe.tools import compute_image_mean, convert_imageset, convert_mnist_data

pytest.importorskip("lmdb", reason="the data extra (lmdb) is not installed")
Image = pytest.importorskip("PIL.Image", reason="the data extra (Pillow) is not installed")


CPU = backend.get("cpu")
NETS = Path(__file__).resolve().parent.parent / "nets"


def quiet(*_):
    pass


@pytest.fixture
def pngs(tmp_path):
    """Five colour PNGs 6x7 and their list file; -> (root, list path, RGB arrays, labels)."""
    rng = np.random.default_rng(3)
    root = tmp_path / "img"
    root.mkdir()
    arrays, labels, lines = [], [], []
    for i in range(5):
        a = rng.integers(0, 256, (6, 7, 3), dtype=np.uint8)
        Image.fromarray(a).save(root / f"im {i}.png")  # a space in the name: split at the last space
        arrays.append(a)
        labels.append(i % 3)
        lines.append(f"im {i}.png {i % 3}")
    listing = tmp_path / "list.txt"
    listing.write_text("\n".join(lines) + "\n")
    return str(root) + "/", str(listing), arrays, labels


def bgr(rgb):
    return rgb[:, :, ::-1].transpose(2, 0, 1)


def data_layer(source, batch, phase="TEST", transform="", dtype=np.float32):
    text = (
        f'name: "data" type: "Data" top: "data" top: "label" transform_param {{ {transform} }} '
        f'data_param {{ source: "{source}" batch_size: {batch} backend: LMDB }}'
    )
    layer = create_layer(proto.parse(text, "LayerParameter"), CPU, dtype=dtype, phase=phase)
    top = [Blob((), dtype=dtype, name="data"), Blob((), dtype=dtype, name="label")]
    layer.setup([], top)
    return layer, top


# -- the Datum's bytes ---------------------------------------------------------------------------
def test_raw_datum_bytes_are_what_caffes_convert_imageset_writes():
    image = np.arange(12, dtype=np.uint8).reshape(3, 2, 2)
    got = encode_datum(image, 7)
    # channels=1:3 height=2:2 width=3:2 data=4:<12 bytes> label=5:7 encoded=7:false
    assert got == bytes([0x08, 3, 0x10, 2, 0x18, 2, 0x22, 12]) + image.tobytes() + bytes([0x28, 7, 0x38, 0])
    # convert_mnist_data never sets `encoded`
    assert encode_datum(image, 7, set_encoded=False) == got[:-2]
    back, label = decode_datum(got)
    np.testing.assert_array_equal(back, image)
    assert label == 7


def test_encoded_datum_and_float_data():
    assert encode_datum(label=2, encoded_bytes=b"\x89PNG") == bytes([0x22, 4]) + b"\x89PNG" + bytes([0x28, 2, 0x38, 1])
    f = np.array([[[0.5, -1.0]]], dtype=np.float32)
    enc = encode_datum(f, 1)
    assert bytes([0x35]) + struct.pack("<f", 0.5) in enc  # float_data (6) unpacked, as caffe.proto declares it
    back, _ = decode_datum(enc)
    np.testing.assert_array_equal(back, f)


def test_a_datum_of_the_wrong_size_is_refused_before_anything_is_allocated():
    d = proto.Message("Datum", channels=3, height=100000, width=100000, data=b"\x00" * 4, label=1)
    with pytest.raises(
        DatasetError, match=r"where: the Datum says 3 x 100000 x 100000 = 30000000000 pixels but carries 4 bytes"
    ):
        decode_datum(proto.encode(d), "where")
    with pytest.raises(DatasetError, match="rec: not a Datum record"):
        decode_datum(b"\x22\xff\xff\x01abc", "rec")  # data says 32767 bytes, 3 follow


# -- the tools -----------------------------------------------------------------------------------
def test_convert_imageset_then_the_data_layer_reads_caffes_layout(tmp_path, pngs):
    root, listing, arrays, labels = pngs
    db = str(tmp_path / "train_lmdb")
    assert convert_imageset.main([root, listing, db]) == 0
    store = open_db(db)
    assert store.keys == [f"{i:08d}_im {i}.png".encode() for i in range(5)]
    assert store.get(store.keys[2]) == encode_datum(bgr(arrays[2]), labels[2])
    layer, top = data_layer(db, 3, transform="scale: 0.5")
    seen = []
    for step in range(4):  # 12 images: key order, wrapping around at 5, at TEST and TRAIN alike
        layer.forward([], top)
        idx = [(3 * step + j) % 5 for j in range(3)]
        np.testing.assert_array_equal(top[0].data, np.stack([bgr(arrays[i]) for i in idx]).astype(np.float32) * 0.5)
        seen += top[1].data.astype(int).tolist()
    assert seen == [labels[i % 5] for i in range(12)]
    layer.stop()
    train, ttop = data_layer(db, 5, phase="TRAIN")
    train.forward([], ttop)
    assert ttop[1].data.astype(int).tolist() == labels  # no shuffle by default for a database
    train.stop()


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
def test_encoded_gray_resized_and_shuffled(tmp_path, pngs, backend):
    if backend == "leveldb":
        pytest.importorskip("plyvel", reason="the data extra (plyvel) is not installed")
    root, listing, arrays, labels = pngs
    db = str(tmp_path / "enc_db")
    args = [root, listing, db, f"--backend={backend}", "--encoded", "--shuffle", "--seed=4"]
    assert convert_imageset.main(args) == 0
    store = open_db(db)
    order = np.random.default_rng(4).permutation(5)
    assert store.keys == [f"{j:08d}_im {i}.png".encode() for j, i in enumerate(order)]
    value = store.get(store.keys[0])
    d = proto.decode(value, "Datum")
    assert d.encoded and d.data == open(f"{root}im {order[0]}.png", "rb").read()  # the file's own bytes
    image, label = decode_datum(value)
    np.testing.assert_array_equal(image, bgr(arrays[order[0]]))
    gray_db = str(tmp_path / "gray_db")
    assert convert_imageset.main([root, listing, gray_db, "--gray", "--resize_height=4", "--resize_width=5"]) == 0
    image, _ = decode_datum(open_db(gray_db).get(b"00000001_im 1.png"))
    want = np.asarray(Image.fromarray(arrays[1]).convert("L").resize((5, 4), Image.BILINEAR))
    np.testing.assert_array_equal(image, want[None])


def test_convert_imageset_skips_a_missing_image_naming_its_line(tmp_path, pngs, capsys):
    root, listing, _, _ = pngs
    with open(listing, "a") as f:
        f.write("nowhere.png 1\n")
    assert convert_imageset.main([root, listing, str(tmp_path / "db")]) == 0
    out = capsys.readouterr()
    assert f"{listing}:6: cannot read image" in out.out and "skipped" in out.err
    assert len(open_db(str(tmp_path / "db"))) == 5


def test_convert_mnist_data_writes_caffes_records(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (3, 28, 28), dtype=np.uint8)
    labels = np.array([7, 2, 1], dtype=np.uint8)
    write_idx(tmp_path / "img-idx3-ubyte.gz", images)
    write_idx(tmp_path / "lab-idx1-ubyte", labels)
    db = str(tmp_path / "mnist_train_lmdb")
    assert convert_mnist_data.main([str(tmp_path / "img-idx3-ubyte.gz"), str(tmp_path / "lab-idx1-ubyte"), db]) == 0
    store = open_db(db)
    assert store.keys == [b"00000000", b"00000001", b"00000002"]
    assert store.get(b"00000001") == bytes([0x08, 1, 0x10, 28, 0x18, 28, 0x22, 0x90, 0x06]) + images[
        1
    ].tobytes() + bytes([0x28, 2])
    # a path ending in mnist_train_lmdb that exists is read as the database, not as built-in MNIST
    layer, top = data_layer(db, 3, transform="scale: 0.00390625")
    layer.forward([], top)
    np.testing.assert_array_equal(top[0].data[:, 0], images.astype(np.float32) * np.float32(0.00390625))
    np.testing.assert_array_equal(top[1].data, labels)
    layer.stop()


def test_compute_image_mean_bytes_and_its_use_as_mean_file(tmp_path, pngs):
    root, listing, arrays, labels = pngs
    db = str(tmp_path / "db")
    convert_imageset.main([root, listing, db])
    mean_path = tmp_path / "mean.binaryproto"
    assert compute_image_mean.main([db, str(mean_path)]) == 0
    stack = np.stack([bgr(a) for a in arrays]).astype(np.float32)
    mean = (stack.sum(0) / np.float32(5)).astype(np.float32)
    # num=1:1 channels=2:3 height=3:6 width=4:7 data=5:packed floats
    payload = mean.astype("<f4").tobytes()
    head = bytes([0x08, 1, 0x10, 3, 0x18, 6, 0x20, 7, 0x2A]) + bytes([len(payload) & 0x7F | 0x80, len(payload) >> 7])
    assert mean_path.read_bytes() == head + payload
    layer, top = data_layer(db, 5, transform=f'mean_file: "{mean_path}" crop_size: 4 scale: 0.25')
    layer.forward([], top)
    want = ((stack - mean)[:, :, 1:5, 1:5]) * np.float32(0.25)  # TEST: the centre crop, mean in the full frame
    np.testing.assert_array_equal(top[0].data, want)
    layer.stop()
    layer, top = data_layer(db, 5, transform="mean_value: 10 mean_value: 20 mean_value: 30")
    layer.forward([], top)
    np.testing.assert_array_equal(top[0].data, stack - np.float32([10, 20, 30])[None, :, None, None])
    layer.stop()


def test_shuffle_is_an_explicit_option_for_a_database(tmp_path, pngs):
    root, listing, _, labels = pngs
    db = str(tmp_path / "db")
    convert_imageset.main([root, listing, db])
    layer, top = data_layer(f"{db}?shuffle=true", 5, phase="TRAIN")
    epochs = []
    for _ in range(3):
        layer.forward([], top)
        epochs.append(top[1].data.astype(int).tolist())
    layer.stop()
    assert all(sorted(e) == sorted(labels) for e in epochs)
    assert len({tuple(e) for e in epochs}) > 1  # a fresh order per epoch


# -- bad input -----------------------------------------------------------------------------------
def test_a_corrupt_database_names_the_file(tmp_path):
    bad = tmp_path / "bad_lmdb"
    bad.mkdir()
    (bad / "data.mdb").write_bytes(b"\x00garbage" * 1000)
    with pytest.raises(LayerError, match="LMDB database '.*bad_lmdb' cannot be read"):
        data_layer(str(bad), 2)


def test_a_bad_record_names_the_database_and_the_key(tmp_path):
    db = str(tmp_path / "db")
    good = encode_datum(np.zeros((1, 2, 2), np.uint8), 0)
    bad = proto.encode(proto.Message("Datum", channels=1, height=2, width=2, data=b"\x01", label=1))
    with Writer(db, "LMDB") as w:
        w.put("00000000", good)
        w.put("00000001", bad)
    layer, top = data_layer(db, 1)
    layer.forward([], top)
    with pytest.raises(
        LayerError,
        match=r"LMDB database '.*db', key '00000001': the Datum says 1 x 2 x 2 = 4 pixels but carries 1 bytes",
    ):
        layer.forward([], top)
    layer.stop()


def test_a_source_that_is_neither_a_database_nor_a_name(tmp_path):
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(LayerError, match="no LMDB or LevelDB database there"):
        data_layer(str(tmp_path / "empty_dir"), 2)


def test_writer_refuses_an_existing_database(tmp_path):
    (tmp_path / "db").mkdir()
    with pytest.raises(DatasetError, match="exists already"):
        Writer(str(tmp_path / "db"))


def test_leveldb_and_encoded_images_of_different_sizes(tmp_path):
    pytest.importorskip("plyvel", reason="the data extra (plyvel) is not installed")
    import io

    rng = np.random.default_rng(6)
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in ((6, 8), (9, 7), (5, 5))]
    db = str(tmp_path / "varied_leveldb")
    with Writer(db, "LEVELDB") as w:
        for i, a in enumerate(images):
            buf = io.BytesIO()
            Image.fromarray(a).save(buf, format="PNG")
            w.put(f"{i:08d}", encode_datum(label=i, encoded_bytes=buf.getvalue()))
    # a centre crop of 5 fits all three: the layer crops them one by one (Caffe's TEST crop)
    layer, top = data_layer(db, 3, transform="crop_size: 5")
    layer.forward([], top)
    for n, a in enumerate(images):
        h, w = a.shape[:2]
        t, l = (h - 5) // 2, (w - 5) // 2
        np.testing.assert_array_equal(top[0].data[n], bgr(a)[:, t : t + 5, l : l + 5])
    np.testing.assert_array_equal(top[1].data, [0, 1, 2])
    layer.stop()
    layer, top = data_layer(db, 2)  # no crop: a batch of two sizes cannot be one array
    with pytest.raises(LayerError, match=r"one batch holds images of shapes .*set crop_size"):
        layer.forward([], top)
    layer.stop()
    gray, top = data_layer(db, 1, transform="force_gray: true")
    assert top[0].shape == (1, 1, 6, 8)
    gray.stop()


def test_a_record_of_another_size_than_the_first_is_a_clear_error(tmp_path):
    db = str(tmp_path / "db")
    with Writer(db, "LMDB") as w:
        w.put("0", encode_datum(np.zeros((1, 4, 4), np.uint8), 0))
        w.put("1", encode_datum(np.zeros((1, 5, 4), np.uint8), 1))
    layer, top = data_layer(db, 1)
    layer.forward([], top)
    with pytest.raises(
        LayerError,
        match=r"a batch of images \(1, 5, 4\) after the transform, but the first record made the top \(1, 4, 4\)",
    ):
        layer.forward([], top)
    layer.stop()


def test_pycaffe_style_lmdb_writing_with_caffe_io(tmp_path):
    """The way pycaffe users write an LMDB: lmdb + caffe.io.array_to_datum + SerializeToString."""
    import lmdb

    import minicaffe as caffe
    from minicaffe.proto import caffe_pb2

    rng = np.random.default_rng(8)
    arrays = [rng.integers(0, 256, (3, 4, 4), dtype=np.uint8) for _ in range(3)]
    env = lmdb.open(str(tmp_path / "py_lmdb"), map_size=1 << 24)
    with env.begin(write=True) as txn:
        for i, a in enumerate(arrays):
            txn.put(f"{i:08d}".encode(), caffe.io.array_to_datum(a, i + 1).SerializeToString())
    env.close()
    layer, top = data_layer(str(tmp_path / "py_lmdb"), 3)
    layer.forward([], top)
    np.testing.assert_array_equal(top[0].data, np.stack(arrays))
    np.testing.assert_array_equal(top[1].data, [1, 2, 3])
    layer.stop()
    d = caffe_pb2.Datum()
    d.ParseFromString(open_db(str(tmp_path / "py_lmdb")).get(b"00000001"))
    np.testing.assert_array_equal(caffe.io.datum_to_array(d), arrays[1])
    f = caffe.io.datum_to_array(caffe.io.array_to_datum(np.full((1, 2, 2), 0.5)))
    assert f.dtype == np.float64 and f.shape == (1, 2, 2) and (f == 0.5).all()


def test_encoded_images_decode_with_opencvs_native_channels():
    import io

    from minicaffe.data.datum import decode_image

    rng = np.random.default_rng(9)
    rgba = rng.integers(0, 256, (3, 4, 4), dtype=np.uint8)
    grey = rng.integers(0, 256, (3, 4), dtype=np.uint8)

    def png(array, mode, fmt="PNG"):
        buf = io.BytesIO()
        Image.fromarray(array, mode).save(buf, format=fmt)
        return buf.getvalue()

    native = decode_image(png(rgba, "RGBA"))  # IMREAD_UNCHANGED: BGRA
    np.testing.assert_array_equal(native, rgba[:, :, [2, 1, 0, 3]].transpose(2, 0, 1))
    np.testing.assert_array_equal(decode_image(png(grey, "L")), grey[None])
    np.testing.assert_array_equal(decode_image(png(grey, "L"), is_color=True), np.stack([grey] * 3))
    rgb = rgba[:, :, :3].copy()
    jpeg = png(rgb, "RGB", "JPEG")
    with Image.open(io.BytesIO(jpeg)) as im:
        np.testing.assert_array_equal(decode_image(jpeg), bgr(np.asarray(im.convert("RGB"))))
    with pytest.raises(DatasetError, match="where: cannot decode the image"):
        decode_image(b"\x89PNG\r\n\x1a\n garbage", "where")


def test_a_database_converted_again_at_the_same_path_is_read_afresh(tmp_path):
    import shutil

    db = str(tmp_path / "db")
    for round_ in range(2):
        if round_:
            shutil.rmtree(db)
        with Writer(db, "LMDB") as w:
            for i in range(2 + round_):
                w.put(f"{i:08d}", encode_datum(np.full((1, 2, 2), 10 * round_ + i, np.uint8), i))
        layer, top = data_layer(db, 3)
        layer.forward([], top)
        assert top[0].data[:, 0, 0, 0].tolist() == ([0, 1, 0] if round_ == 0 else [10, 11, 12])
        layer.stop()


def test_a_corrupt_leveldb_names_the_file(tmp_path):
    pytest.importorskip("plyvel", reason="the data extra (plyvel) is not installed")
    db = tmp_path / "bad_leveldb"
    with Writer(str(db), "LEVELDB") as w:
        w.put("0", encode_datum(np.zeros((1, 2, 2), np.uint8), 0))
    (db / "CURRENT").write_text("MANIFEST-999999\n")
    with pytest.raises(
        LayerError, match=r"LevelDB database '.*bad_leveldb' cannot be read: Corruption: .*corrupt database"
    ):
        data_layer(str(db), 1)


def test_a_truncated_lmdb_is_refused_before_a_page_past_its_end_is_read(tmp_path):
    """A half-copied data.mdb: reading its pages through the memory map would kill the process
    with SIGBUS; the meta page says how long the file must be, so the layer refuses it first."""
    db = tmp_path / "full_lmdb"
    with Writer(str(db), "LMDB") as w:
        for i in range(200):
            w.put(f"{i:08d}", encode_datum(np.full((1, 28, 28), i % 256, np.uint8), 0))
    cut = tmp_path / "cut_lmdb"
    cut.mkdir()
    data = (db / "data.mdb").read_bytes()
    (cut / "data.mdb").write_bytes(data[: len(data) // 2])
    with pytest.raises(LayerError, match=r"LMDB database '.*cut_lmdb' is truncated: its pages need \d+ bytes"):
        data_layer(str(cut), 1)


@pytest.mark.slow
def test_lenet_trains_the_same_from_a_converted_mnist_lmdb(tmp_path, monkeypatch):
    """Real MNIST through Caffe's workflow: IDX files -> convert_mnist_data -> LMDB -> Caffe's
    lenet_train_test.prototxt (sources examples/mnist/mnist_*_lmdb). Every loss and test output
    equals the same run on the built-in MNIST read in order: the database adds nothing and loses
    nothing (slow: MNIST is fetched once, 70,000 records are converted)."""
    from minicaffe.data import load_mnist
    from minicaffe.solvers import get_solver

    mnist = load_mnist()
    monkeypatch.chdir(tmp_path)
    os_dir = tmp_path / "examples" / "mnist"
    os_dir.mkdir(parents=True)
    for split in ("train", "test"):
        images, labels = mnist[split]
        write_idx(tmp_path / f"{split}-images", images[:, 0])
        write_idx(tmp_path / f"{split}-labels", labels.astype(np.uint8))
        assert (
            convert_mnist_data.main([f"{split}-images", f"{split}-labels", f"examples/mnist/mnist_{split}_lmdb"]) == 0
        )
    net_text = open(NETS / "lenet_train_test.prototxt").read()
    runs = {}
    for kind, train_src, test_src in (
        ("lmdb", "examples/mnist/mnist_train_lmdb", "examples/mnist/mnist_test_lmdb"),
        ("memory", "mnist_train?shuffle=false", "mnist_test"),
    ):
        (tmp_path / f"{kind}.prototxt").write_text(
            net_text.replace('source: "mnist_train"', f'source: "{train_src}"').replace(
                'source: "mnist_test"', f'source: "{test_src}"'
            )
        )
        (tmp_path / f"{kind}_solver.prototxt").write_text(
            f'net: "{kind}.prototxt" base_lr: 0.01 momentum: 0.9 weight_decay: 0.0005 lr_policy: "inv" '
            "gamma: 0.0001 power: 0.75 max_iter: 30 test_iter: 3 test_interval: 15 display: 0 random_seed: 1\n"
        )
        solver = get_solver(f"{kind}_solver.prototxt", log=lambda m: None)
        losses, tests = [], []
        solver.on_iteration.append(lambda s, loss, lr: losses.append(loss))
        solver.on_test.append(lambda s, i, result: tests.append(result))
        solver.step(30)
        runs[kind] = (losses, tests)
    assert runs["lmdb"] == runs["memory"]
    assert len(runs["lmdb"][0]) == 30 and len(runs["lmdb"][1]) == 2


def test_a_leveldb_open_in_another_process_says_so(tmp_path):
    pytest.importorskip("plyvel", reason="the data extra (plyvel) is not installed")
    import subprocess
    import sys

    db = tmp_path / "busy_leveldb"
    with Writer(str(db), "LEVELDB") as w:
        w.put("0", encode_datum(np.zeros((1, 2, 2), np.uint8), 0))
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import plyvel, sys; d = plyvel.DB({str(db)!r}); print('open', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "open"
        with pytest.raises(LayerError, match="another process has it open: LevelDB allows one process at a time"):
            data_layer(str(db), 1)
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)


def test_leveldbs_at_one_relative_path_in_two_directories(tmp_path, monkeypatch):
    """LevelDB's in-process lock table is keyed by the path string: the same relative path in two
    working directories must not look like one database (Caffe's example paths are relative)."""
    pytest.importorskip("plyvel", reason="the data extra (plyvel) is not installed")
    for k, where in enumerate(("a", "b")):
        (tmp_path / where).mkdir()
        monkeypatch.chdir(tmp_path / where)
        with Writer("examples/pairs_leveldb", "LEVELDB") as w:
            w.put("0", encode_datum(np.full((1, 2, 2), k, np.uint8), k))
        layer, top = data_layer("examples/pairs_leveldb", 1)
        layer.forward([], top)
        assert top[1].data.tolist() == [k]
        layer.stop()


def test_the_converters_report_bad_input_in_one_error_line(tmp_path, capsys):
    missing = str(tmp_path / "nowhere")
    cases = [
        (convert_imageset.main, [str(tmp_path), missing, str(tmp_path / "db1")], "list file"),
        (convert_mnist_data.main, [missing + "-images", missing + "-labels", str(tmp_path / "db2")], "nowhere"),
        (compute_image_mean.main, [missing], "nowhere"),
    ]
    for main, args, word in cases:
        assert main(args) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and word in err[0], err
    assert not (tmp_path / "db1").exists() and not (tmp_path / "db2").exists()
