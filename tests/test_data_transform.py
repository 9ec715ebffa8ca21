"""transform_param against a per-image numpy reference written the way Caffe's
DataTransformer::Transform loops; crop and mirror at TRAIN (random) and TEST (centre, none)."""

import numpy as np
import pytest

from minicaffe import proto
from minicaffe.data import DatasetError, Transformer, load_mean_file


def reference(images, scale=1.0, mean_value=(), mean_image=None, crop=0, offsets=None, flips=None, dtype=np.float32):
    """Caffe's loop: out[n, c, h, w] = (in[n, c, h_off + h, w_off + w'] - mean) * scale, with
    w' = crop_w - 1 - w when mirrored, and the mean image read at the same input pixel."""
    n, C, H, W = images.shape
    h = w = crop or None
    h, w = (h or H), (w or W)
    out = np.empty((n, C, h, w), dtype=dtype)
    for i in range(n):
        if crop:
            ho, wo = offsets[i] if offsets is not None else ((H - crop) // 2, (W - crop) // 2)
        else:
            ho, wo = 0, 0
        for c in range(C):
            for y in range(h):
                for x in range(w):
                    xs = wo + (w - 1 - x if flips is not None and flips[i] else x)
                    v = dtype(images[i, c, ho + y, xs])
                    if mean_value:
                        v = v - dtype(mean_value[c] if len(mean_value) > 1 else mean_value[0])
                    elif mean_image is not None:
                        v = v - dtype(mean_image[c, ho + y, xs])
                    out[i, c, y, x] = v * dtype(scale)
    return out


def draws(n, H, W, crop, mirror, rng):
    """The random draws Transformer makes, in its order: crop rows, crop columns, flips."""
    offsets = flips = None
    if crop:
        hs = rng.integers(0, H - crop + 1, size=n)
        ws = rng.integers(0, W - crop + 1, size=n)
        offsets = list(zip(hs, ws))
    if mirror:
        flips = rng.integers(0, 2, size=n).astype(bool)
    return offsets, flips


@pytest.fixture
def images():
    return np.random.default_rng(0).integers(0, 256, size=(5, 3, 7, 6), dtype=np.uint8)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"scale": 0.00390625},
        {"mean_value": [128]},
        {"mean_value": [100, 110, 120], "scale": 0.017},
        {"mean": True, "scale": 0.5},
    ],
)
@pytest.mark.parametrize("crop, mirror", [(0, False), (4, False), (0, True), (5, True), (6, True)])
@pytest.mark.parametrize("phase", ["TRAIN", "TEST"])
def test_transform_matches_reference(images, dtype, kw, crop, mirror, phase):
    kw = dict(kw)
    mean_image = None
    if kw.pop("mean", False):
        mean_image = np.random.default_rng(1).uniform(0, 255, size=images.shape[1:])
        kw["mean_file"] = mean_image
    t = Transformer(crop_size=crop, mirror=mirror, phase=phase, dtype=dtype, **kw)
    got = t(images, np.random.default_rng(7))
    if phase == "TRAIN":
        offsets, flips = draws(len(images), 7, 6, crop, mirror, np.random.default_rng(7))
    else:
        offsets, flips = None, None  # TEST: centre crop, never mirrored
    want = reference(
        images, kw.get("scale", 1.0), kw.get("mean_value", ()), mean_image, crop, offsets, flips, dtype=dtype
    )
    assert got.dtype == dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_lenet_scale_is_exact():
    pixels = np.arange(256, dtype=np.uint8).reshape(1, 1, 16, 16)
    out = Transformer(scale=0.00390625)(pixels)
    assert np.array_equal(out.astype(np.float64) * 256, np.arange(256).reshape(1, 1, 16, 16))


def test_train_crops_and_flips_vary_test_is_fixed():
    x = np.arange(2 * 8 * 8, dtype=np.uint8).reshape(1, 2, 8, 8).repeat(64, axis=0)
    train = Transformer(crop_size=5, mirror=True, phase="TRAIN")(x, np.random.default_rng(3))
    test = Transformer(crop_size=5, mirror=True, phase="TEST")(x)
    assert len({a.tobytes() for a in train}) > 10  # many different crops/flips
    assert len({a.tobytes() for a in test}) == 1
    np.testing.assert_array_equal(test[0], x[0, :, 1:6, 1:6])  # (8 - 5) // 2 = 1
    flipped = [a for a in train if a[0, 0, 0] > a[0, 0, -1]]  # a mirrored row decreases
    assert flipped and len(flipped) < len(train)


def test_random_transform_needs_rng_and_errors_are_clear(images):
    with pytest.raises(DatasetError, match="needs an rng"):
        Transformer(mirror=True)(images)
    with pytest.raises(DatasetError, match="crop_size 8 is larger than the image 7 x 6"):
        Transformer(crop_size=8).output_shape((3, 7, 6))
    with pytest.raises(DatasetError, match="2 mean_value.*for 3 channel"):
        Transformer(mean_value=[1, 2]).output_shape((3, 7, 6))
    with pytest.raises(DatasetError, match="mean_file or mean_value, not both"):
        Transformer(mean_value=[1], mean_file=np.zeros((3, 7, 6)))
    with pytest.raises(DatasetError, match=r"mean image has shape \(3, 5, 5\) but the data images are \(3, 7, 6\)"):
        Transformer(mean_file=np.zeros((3, 5, 5))).output_shape((3, 7, 6))


def test_from_transform_param_message():
    msg = proto.parse("scale: 0.5 mirror: true crop_size: 3 mean_value: 10 mean_value: 20", "TransformationParameter")
    t = Transformer.from_param(msg, phase="TEST", dtype=np.float64)
    assert (t.scale, t.mirror, t.crop_size, t.mean_value, t.dtype) == (0.5, True, 3, [10.0, 20.0], np.float64)
    default = Transformer.from_param(proto.parse("", "LayerParameter").transform_param)
    assert (default.scale, default.mirror, default.crop_size, default.mean_value, default.mean_image) == (
        1.0,
        False,
        0,
        [],
        None,
    )


def _write_binaryproto(path, mean, legacy=False):
    blob = proto.Message("BlobProto")
    if legacy:
        blob.num, blob.channels, blob.height, blob.width = 1, *mean.shape
    else:
        blob.shape.dim.extend([1, *mean.shape])
    blob.data.extend(mean.astype(np.float32).ravel().tolist())
    path.write_bytes(proto.encode(blob))


@pytest.mark.parametrize("legacy", [False, True])
def test_mean_file_binaryproto(tmp_path, images, legacy):
    mean = np.random.default_rng(2).uniform(0, 255, size=(3, 7, 6)).astype(np.float32)
    _write_binaryproto(tmp_path / "mean.binaryproto", mean, legacy)
    loaded = load_mean_file(tmp_path / "mean.binaryproto")
    np.testing.assert_array_equal(loaded, mean)
    t = Transformer(mean_file=str(tmp_path / "mean.binaryproto"), crop_size=4, phase="TEST")
    np.testing.assert_array_equal(t(images), reference(images, mean_image=mean, crop=4))


def test_mean_file_errors(tmp_path):
    with pytest.raises(DatasetError, match="mean_file '.*nope.binaryproto' not found"):
        load_mean_file(tmp_path / "nope.binaryproto")
    (tmp_path / "bad.binaryproto").write_bytes(b"\xff\xff\xff")
    with pytest.raises(DatasetError, match="cannot decode it as a BlobProto"):
        load_mean_file(tmp_path / "bad.binaryproto")


def test_caffe_example_mean_is_computed_from_the_dataset():
    from minicaffe.data import register_dataset, registry, unregister_dataset

    x = np.random.default_rng(0).integers(0, 256, size=(10, 3, 4, 4), dtype=np.uint8)
    register_dataset("cifar10_train", x, np.zeros(10))
    try:
        mean = load_mean_file("examples/cifar10/mean.binaryproto")
        np.testing.assert_allclose(mean, x.mean(axis=0))
    finally:
        unregister_dataset("cifar10_train")
    assert "cifar10_train" not in registry._user


# -- random shapes (odd, prime, size-1) ----------------------------------------------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 5),
    c=st.integers(1, 4),
    H=st.integers(1, 9),
    W=st.integers(1, 9),
    crop_frac=st.floats(0, 1),
    mirror=st.booleans(),
    phase=st.sampled_from(["TRAIN", "TEST"]),
    use_mean=st.sampled_from(["none", "value", "image"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_transform_random_shapes(n, c, H, W, crop_frac, mirror, phase, use_mean, seed):
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(n, c, H, W), dtype=np.uint8)
    crop = int(round(crop_frac * min(H, W)))
    mean_value = list(rng.uniform(0, 255, size=c)) if use_mean == "value" else ()
    mean_image = rng.uniform(0, 255, size=(c, H, W)) if use_mean == "image" else None
    t = Transformer(scale=0.25, mean_value=mean_value, mean_file=mean_image, crop_size=crop, mirror=mirror, phase=phase)
    got = t(images, np.random.default_rng(seed + 1))
    offsets = flips = None
    if phase == "TRAIN":
        offsets, flips = draws(n, H, W, crop, mirror, np.random.default_rng(seed + 1))
    np.testing.assert_array_equal(got, reference(images, 0.25, mean_value, mean_image, crop, offsets, flips))
