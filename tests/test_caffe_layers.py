"""ImageData, HDF5Data, HDF5Output and WindowData: small files made here, read back exactly;
the order Caffe reads them in; and one clear error for a missing image or dataset."""

import sys

import numpy as np
import pytest

from minicaffe import backend, proto
from minicaffe.blob import Blob
from minicaffe.errors import LayerError
from minicaffe.layer import create_layer
from minicaffe.layers.window_data import place_window

Image = pytest.importorskip("PIL.Image", reason="the data extra (Pillow) is not installed")
h5py = pytest.importorskip("h5py", reason="the data extra (h5py) is not installed")
CPU = backend.get("cpu")


def build(text, ntop=2, phase="TEST", bottom=()):
    layer = create_layer(proto.parse(text, "LayerParameter"), CPU, phase=phase)
    top = [Blob((), name=f"t{i}") for i in range(ntop)]
    layer.setup(list(bottom), top)
    return layer, top


def bgr(rgb):
    return rgb[:, :, ::-1].transpose(2, 0, 1)


@pytest.fixture
def image_list(tmp_path):
    rng = np.random.default_rng(1)
    (tmp_path / "im").mkdir()
    arrays = [rng.integers(0, 256, (5, 6, 3), dtype=np.uint8) for _ in range(4)]
    for i, a in enumerate(arrays):
        Image.fromarray(a).save(tmp_path / "im" / f"{i}.png")
    (tmp_path / "list.txt").write_text("".join(f"{i}.png {10 + i}\n" for i in range(4)))
    return tmp_path, arrays


def image_data(tmp, extra="", transform=""):
    return (
        f'name: "img" type: "ImageData" top: "data" top: "label" transform_param {{ {transform} }} '
        f'image_data_param {{ source: "{tmp / "list.txt"}" root_folder: "{tmp / "im"}/" batch_size: 3 {extra} }}'
    )


def test_image_data_reads_the_list_in_order_as_bgr(image_list):
    tmp, arrays = image_list
    layer, top = build(image_data(tmp, transform="scale: 0.5"))
    assert top[0].shape == (3, 3, 5, 6)
    for step in range(3):
        layer.forward([], top)
        idx = [(3 * step + j) % 4 for j in range(3)]
        np.testing.assert_array_equal(top[0].data, np.stack([bgr(arrays[i]) for i in idx]).astype(np.float32) * 0.5)
        np.testing.assert_array_equal(top[1].data, [10 + i for i in idx])
    layer.stop()


def test_image_data_gray_resize_shuffle(image_list):
    tmp, arrays = image_list
    layer, top = build(image_data(tmp, "is_color: false new_height: 4 new_width: 3 shuffle: true"), phase="TRAIN")
    assert top[0].shape == (3, 1, 4, 3)
    labels = []
    for _ in range(4):
        layer.forward([], top)
        labels += top[1].data.astype(int).tolist()
    layer.stop()
    assert sorted(labels[:4]) == [10, 11, 12, 13] and sorted(labels[4:8]) == [10, 11, 12, 13]
    assert labels[:4] != labels[4:8] or labels[4:8] != labels[8:12]  # reshuffled every epoch
    want = np.asarray(Image.fromarray(arrays[0]).convert("L").resize((3, 4), Image.BILINEAR))
    got = layer.dataset.read(0)
    np.testing.assert_array_equal(got[0], want)


def test_image_data_missing_image_names_the_list_line(image_list):
    tmp, _ = image_list
    with open(tmp / "list.txt", "a") as f:
        f.write("gone.png 3\n")
    layer, top = build(image_data(tmp))
    layer.forward([], top)
    with pytest.raises(LayerError, match=r"list.txt:5: image '.*gone.png' not found"):
        layer.forward([], top)
    layer.stop()


def write_h5(path, **arrays):
    with h5py.File(path, "w") as f:
        for k, v in arrays.items():
            f[k] = v


@pytest.fixture
def h5_files(tmp_path):
    rng = np.random.default_rng(2)
    a = rng.normal(size=(5, 2, 3)).astype(np.float32)
    b = rng.normal(size=(3, 2, 3)).astype(np.float32)
    write_h5(tmp_path / "a.h5", data=a, label=np.arange(5, dtype=np.int32))
    write_h5(tmp_path / "b.h5", data=b, label=np.arange(100, 103, dtype=np.int32))
    (tmp_path / "files.txt").write_text("a.h5\nb.h5\n")  # relative to the list's folder
    return tmp_path, np.concatenate([a, b]), np.concatenate([np.arange(5), np.arange(100, 103)])


def hdf5_data(tmp, batch=3, extra=""):
    return f'name: "h" type: "HDF5Data" top: "data" top: "label" hdf5_data_param {{ source: "{tmp / "files.txt"}" batch_size: {batch} {extra} }}'


def test_hdf5_data_reads_file_after_file(h5_files):
    tmp, data, labels = h5_files
    layer, top = build(hdf5_data(tmp))
    assert top[0].shape == (3, 2, 3) and top[1].shape == (3,)
    for step in range(4):  # 12 rows of 8: wraps to the first file
        layer.forward([], top)
        idx = [(3 * step + j) % 8 for j in range(3)]
        np.testing.assert_array_equal(top[0].data, data[idx])
        np.testing.assert_array_equal(top[1].data, labels[idx])
    layer.stop()


def test_hdf5_data_shuffle_keeps_rows_within_their_file(h5_files):
    tmp, data, labels = h5_files
    layer, top = build(hdf5_data(tmp, batch=8, extra="shuffle: true"), phase="TRAIN")
    layer.forward([], top)
    got = top[1].data.astype(int).tolist()
    layer.stop()
    assert sorted(got) == sorted(labels.tolist())
    first_file = [v < 100 for v in got]
    assert first_file in ([True] * 5 + [False] * 3, [False] * 3 + [True] * 5)  # files are blocks


def test_hdf5_data_missing_dataset_names_the_file(h5_files):
    tmp, _, _ = h5_files
    write_h5(tmp / "b.h5", data=np.zeros((3, 2, 3), np.float32))
    with pytest.raises(
        LayerError, match=r"HDF5 file '.*b.h5' \(listed in .*files.txt\) has no dataset 'label' \(it has: data\)"
    ):
        build(hdf5_data(tmp))


def test_hdf5_output_appends_every_batch_and_round_trips(h5_files, tmp_path):
    tmp, data, labels = h5_files
    src, top = build(hdf5_data(tmp, batch=4))
    out_path = tmp_path / "out.h5"
    out, _ = build(f'name: "o" type: "HDF5Output" hdf5_output_param {{ file_name: "{out_path}" }}', ntop=0, bottom=top)
    for _ in range(2):
        src.forward([], top)
        out.forward(top, [])
    out.stop()
    src.stop()
    with h5py.File(out_path, "r") as f:
        assert f["data"].shape == (8, 2, 3, 1) and f["label"].shape == (8, 1, 1, 1)  # Caffe's 4-d legacy shape
        np.testing.assert_array_equal(f["data"][...][..., 0], data)
        np.testing.assert_array_equal(f["label"][...].ravel(), labels)
    (tmp_path / "list2.txt").write_text(str(out_path))  # minicaffe -> file -> minicaffe
    back, btop = build(
        f'name: "h" type: "HDF5Data" top: "data" top: "label" hdf5_data_param {{ source: "{tmp_path / "list2.txt"}" batch_size: 8 }}'
    )
    back.forward([], btop)
    np.testing.assert_array_equal(btop[0].data[..., 0], data)
    back.stop()


# -- WindowData ----------------------------------------------------------------------------------
def test_place_window_follows_caffes_arithmetic():
    img = np.zeros((3, 40, 50), np.uint8)
    # no context: the box itself warped to the full crop
    w, ph, pw = place_window(img, (5, 5, 24, 14), 16, 0, False, False)
    assert w.shape == (3, 16, 16) and (ph, pw) == (0, 0)
    # context_pad 2 at crop 16: scale 16/12; box 10..29 x 10..19 -> expanded, inside the image
    w, ph, pw = place_window(img, (10, 10, 29, 19), 16, 2, False, False)
    assert w.shape[1:] == (16, 16) and (ph, pw) == (0, 0)
    # a box at the corner: the expansion is clipped and the warp is placed at the padding offset
    w, ph, pw = place_window(img, (0, 0, 11, 11), 16, 2, False, False)
    # half 6, centre 6, scale 4/3: x1 = round(6 - 8) = -2, x2 = 14; clipped 0..14, unclipped 17
    # -> warped width round(15 * 16/17) = 14, pad round(2 * 16/17) = 2
    assert (ph, pw) == (2, 2) and w.shape[1:] == (14, 14)
    _, ph, pw = place_window(img, (0, 0, 11, 11), 16, 2, False, True)  # mirrored: the right padding
    assert pw == 0


def test_window_data_batches(tmp_path):
    rng = np.random.default_rng(3)
    Image.fromarray(rng.integers(0, 256, (40, 50, 3), dtype=np.uint8)).save(tmp_path / "a.png")
    (tmp_path / "w.txt").write_text(
        "# 0\na.png\n3\n40\n50\n4\n1 0.8 5 5 30 30\n2 0.6 0 0 49 39\n0 0.1 10 10 20 20\n3 0.3 1 1 9 9\n"
    )
    text = (
        'name: "w" type: "WindowData" top: "data" top: "label" '
        "transform_param { crop_size: 16 mirror: true mean_value: 100 } "
        f'window_data_param {{ source: "{tmp_path / "w.txt"}" root_folder: "{tmp_path}/" batch_size: 8 '
        "context_pad: 2 fg_fraction: 0.25 }"
    )
    layer, top = build(text, phase="TRAIN")
    assert top[0].shape == (8, 3, 16, 16)
    layer.forward([], top)
    labels = top[1].data.astype(int).tolist()
    assert labels[:6] == [0] * 6 and set(labels[6:]) <= {1, 2}  # background first, then int(8 * 0.25) = 2 fg
    assert np.abs(top[0].data).max() <= 155  # pixel - 100 for pixels in 0..255, 0 where padded
    layer.stop()
    (tmp_path / "w2.txt").write_text("# 0\na.png\n3\n40\n50\n1\n1 0.8 5 5 30 30\n")
    with pytest.raises(LayerError, match="1 foreground and 0 background windows"):
        build(text.replace("w.txt", "w2.txt"))


@pytest.mark.parametrize(
    "hide, make, expect",
    [
        ("lmdb", "lmdb", "pip install lmdb"),
        ("plyvel", "leveldb", "pip install plyvel"),
        ("h5py", "hdf5", "pip install h5py"),
        ("PIL", "images", "pip install Pillow"),
    ],
)
def test_a_missing_package_is_named(tmp_path, monkeypatch, image_list, hide, make, expect):
    tmp, _ = image_list
    if make in ("lmdb", "leveldb"):
        pytest.importorskip("lmdb" if make == "lmdb" else "plyvel", reason=f"the data extra ({make}) is not installed")
        from minicaffe.data.datum import encode_datum
        from minicaffe.data.db import Writer

        with Writer(tmp_path / "db", make) as w:
            w.put("0", encode_datum(np.zeros((1, 2, 2), np.uint8), 0))
        text = f'name: "d" type: "Data" top: "data" data_param {{ source: "{tmp_path / "db"}" batch_size: 1 }}'
    elif make == "hdf5":
        write_h5(tmp_path / "a.h5", data=np.zeros((2, 3), np.float32))
        (tmp_path / "files.txt").write_text(str(tmp_path / "a.h5"))
        text = f'name: "h" type: "HDF5Data" top: "data" hdf5_data_param {{ source: "{tmp_path / "files.txt"}" batch_size: 1 }}'
    else:
        text = image_data(tmp)
    monkeypatch.setitem(sys.modules, hide, None)  # `import hide` now raises ImportError
    with pytest.raises(LayerError, match=expect):
        build(text, ntop=1 if make != "images" else 2)


def test_the_file_layers_on_every_backend(backend, image_list, h5_files, tmp_path):
    """The layers hand host batches to the base class, which copies them to the device once."""
    tmp, arrays = image_list
    h5_tmp, data, labels = h5_files
    for text, want in (
        (image_data(tmp), np.stack([bgr(a) for a in arrays[:3]]).astype(np.float32)),
        (hdf5_data(h5_tmp), data[:3]),
    ):
        layer = create_layer(proto.parse(text, "LayerParameter"), backend, phase="TEST")
        top = [Blob((), xp=backend.xp, name=f"t{i}") for i in range(2)]
        layer.setup([], top)
        layer.forward([], top)
        np.testing.assert_array_equal(np.asarray(backend.to_host(top[0].data)), want)
        layer.stop()
