"""Bad input and faults: weights, snapshots and data files that are damaged, crafted or simply
the wrong kind of file, and parameters that make no sense.  Each case gets one clear error in
minicaffe's own types (naming the file and what is wrong), is bounded in memory and time before
anything is allocated, and leaves what was already loaded or saved untouched."""

import gzip
import io
import json
import os
import stat
import struct
import time
import tracemalloc
import zipfile

import numpy as np
import pytest

import minicaffe as caffe
from minicaffe import data, proto
from minicaffe.data import DatasetError, idx
from minicaffe.errors import LayerError, MinicaffeError, PrototxtError, SolverError, WeightsError

TINY = """
name: "tiny"
input: "data"
input_shape { dim: 2 dim: 3 dim: 5 dim: 5 }
input: "label"
input_shape { dim: 2 }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 4 kernel_size: 3 pad: 1 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""

SOLVER_NET = """
name: "toy"
layer { name: "d" type: "Data" top: "data" top: "label"
        transform_param { scale: 0.00390625 }
        data_param { source: "rel_toy?shuffle=false" batch_size: 4 } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
        inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
"""


def make(text=TINY, phase=caffe.TEST):
    return caffe.Net(proto.parse(text, "NetParameter", filename="test.prototxt"), phase)


def params_of(net):
    return {name: [b.data.copy() for b in blobs] for name, blobs in net.params.items()}


def assert_unchanged(net, before):
    for name, blobs in net.params.items():
        for a, b in zip(before[name], blobs):
            np.testing.assert_array_equal(a, b.data)


def _call(fn):
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - returned for the test to judge
        return exc


def peak_bytes(fn):
    """(result or exception, peak bytes traced while fn ran, seconds of a second, untraced run)."""
    tracemalloc.start()
    out = _call(fn)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    t0 = time.perf_counter()
    _call(fn)
    return out, peak, time.perf_counter() - t0


@pytest.fixture
def saved(tmp_path):
    """A tiny net and its weights saved in both formats."""
    caffe.set_random_seed(5)
    net = make()
    paths = {ext: str(tmp_path / f"w{ext}") for ext in (".caffemodel", ".npz")}
    for p in paths.values():
        net.save(p)
    return net, paths


@pytest.fixture
def toy_solver(tmp_path):
    rng = np.random.default_rng(3)
    data.register_dataset("rel_toy", rng.integers(0, 256, (8, 1, 2, 2), dtype=np.uint8), rng.integers(0, 3, 8))
    (tmp_path / "toy.prototxt").write_text(SOLVER_NET)
    text = f'net: "{tmp_path}/toy.prototxt"\nbase_lr: 0.1\nmomentum: 0.9\nmax_iter: 20\ndisplay: 0\n'
    text += f'random_seed: 1\nsnapshot_prefix: "{tmp_path}/snap"\n'
    (tmp_path / "solver.prototxt").write_text(text)

    def build():
        return caffe.SGDSolver(str(tmp_path / "solver.prototxt"), log=lambda m: None)

    yield build
    data.unregister_dataset("rel_toy")


def layer_records(msg):
    """[(layer name, encoded NetParameter holding only that layer)] of a NetParameter."""
    out = []
    for lp in msg.layer:
        one = proto.Message("NetParameter")
        one.layer.append(lp)
        out.append((lp.name, proto.encode(one)))
    return out


# -- 1. weights that do not cover the net ---------------------------------------------------------
def test_empty_caffemodel_is_refused(saved, tmp_path):
    net, _ = saved
    before = params_of(net)
    empty = tmp_path / "empty.caffemodel"
    empty.write_bytes(b"")
    with pytest.raises(WeightsError, match=r"empty\.caffemodel.*fills none of the net's 2 layers with parameters"):
        net.copy_from(str(empty))
    assert_unchanged(net, before)


def test_truncated_caffemodel_reports_missing_layers(saved, tmp_path):
    net, paths = saved
    msg = proto.decode(open(paths[".caffemodel"], "rb").read(), "NetParameter")
    records = dict(layer_records(msg))
    cut = tmp_path / "cut.caffemodel"
    cut.write_bytes(records["input"] + records["conv"])  # truncated at a layer boundary, before 'ip'
    lines = []
    report = make().copy_from(str(cut), log=lines.append)
    assert report.copied == ["conv"] and report.missing == ["ip"] and report.ignored == []
    assert any("'ip'" in line and "keeps its initial" in line for line in lines), lines


def test_flipped_bit_in_a_layer_name_reports_both_directions(saved, tmp_path):
    net, paths = saved
    raw = bytearray(open(paths[".caffemodel"], "rb").read())
    at = raw.find(b"\x0a\x02ip")  # field 1 (name), length 2, "ip"
    raw[at + 2] ^= 0x04  # 'i' -> 'm'
    flipped = tmp_path / "flipped.caffemodel"
    flipped.write_bytes(bytes(raw))
    lines = []
    report = make().copy_from(str(flipped), log=lines.append)
    assert report.ignored == ["mp"] and report.missing == ["ip"]
    text = "\n".join(lines)
    assert "Ignoring source layer 'mp'" in text and "did you mean 'ip'" in text
    assert "'ip'" in text and "not in" in text


def test_copy_from_returns_its_report_and_iterates_the_ignored_names(saved, tmp_path):
    net, paths = saved
    bigger = make(
        TINY.replace('name: "ip"', 'name: "ip_new"')
        .replace('bottom: "ip"', 'bottom: "ip_new"')
        .replace('top: "ip"', 'top: "ip_new"')
    )
    report = bigger.copy_from(paths[".npz"], log=lambda m: None)
    assert report is not None
    assert list(report) == ["ip"] and report.missing == ["ip_new"] and report.copied == ["conv"]


# -- 2. damaged weight and state files: one clear error, no raw traceback --------------------------
def test_npz_with_a_bad_crc(saved, tmp_path):
    net, paths = saved
    raw = bytearray(open(paths[".npz"], "rb").read())
    with zipfile.ZipFile(paths[".npz"]) as z:
        info = z.getinfo("conv/0.npy")
    data_at = info.header_offset + 30 + len(info.filename) + len(info.extra) + 200
    raw[data_at] ^= 0xFF
    bad = tmp_path / "crc.npz"
    bad.write_bytes(bytes(raw))
    before = params_of(net)
    with pytest.raises(WeightsError, match=r"crc\.npz.*conv/0.*(CRC|damaged)"):
        net.copy_from(str(bad))
    assert_unchanged(net, before)


def npy_bytes(array):
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.asarray(array))
    return buf.getvalue()


def npz_with_header(path, member, shape, dtype="<f4", payload=b""):
    """An .npz whose member's .npy header declares ``shape`` but holds only ``payload``
    (and a good bias 'ip/1', so that only the header is wrong)."""
    header = {"descr": dtype, "fortran_order": False, "shape": tuple(shape)}
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, header)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(member, buf.getvalue() + payload)
        z.writestr("ip/1.npy", npy_bytes(np.zeros(3, np.float32)))


def test_npz_header_asking_for_37_gib(saved, tmp_path):
    net, _ = saved
    bad = tmp_path / "huge.npz"
    npz_with_header(bad, "ip/0.npy", (100_000, 100_000))
    assert os.path.getsize(bad) < 600
    out, peak, _ = peak_bytes(lambda: net.copy_from(str(bad)))
    assert isinstance(out, WeightsError), repr(out)
    assert "huge.npz" in str(out) and "ip" in str(out) and "(100000, 100000)" in str(out)
    assert peak < 2 << 20


@pytest.mark.parametrize(
    "shape, why",
    [((-1, -1), "negative"), ((1,) * 100, "100 dimensions"), ((1 << 40, 1 << 40), r"\(1099511627776")],
)
def test_crafted_blob_shapes_in_a_caffemodel(saved, tmp_path, shape, why):
    net, _ = saved
    msg = proto.Message("NetParameter", name="tiny")
    bp = msg.add("layer", name="ip", type="InnerProduct").add("blobs")
    bp.get_or_create("shape").dim.extend(shape)
    bp.data = np.zeros(3, np.float32)
    msg.layer[0].add("blobs", shape={"dim": [3]}).data = np.zeros(3, np.float32)
    bad = tmp_path / "shape.caffemodel"
    bad.write_bytes(proto.encode(msg))
    with pytest.raises(WeightsError, match=rf"shape\.caffemodel: layer 'ip' blob 0.*{why}"):
        net.copy_from(str(bad))


def test_solverstate_given_as_weights_and_caffemodel_given_as_state(toy_solver):
    s = toy_solver()
    weights, state = s.snapshot()
    with pytest.raises(WeightsError, match=r"\.solverstate.*is a solver state, not weights.*--resume"):
        s.net.copy_from(state)
    with pytest.raises(SolverError, match=r"\.caffemodel.*is a weights file, not a solver state.*--weights"):
        toy_solver().restore(weights)


def rewrite_state(path, edit_record=None, edit_arrays=None, raw_record=None):
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    record = json.loads(bytes(arrays["record"]).decode())
    if edit_record:
        edit_record(record)
    if edit_arrays:
        edit_arrays(arrays)
    text = raw_record if raw_record is not None else json.dumps(record)
    arrays["record"] = np.frombuffer(text.encode(), np.uint8)
    with open(path, "wb") as f:
        np.savez(f, **arrays)


@pytest.mark.parametrize(
    "edit, message",
    [
        (dict(edit_record=lambda r: r.pop("param_shapes")), "record has no 'param_shapes'"),
        (dict(raw_record="[1, 2, 3]"), "record is not a JSON object"),
        (dict(edit_record=lambda r: r.update(iter=-50)), r"'iter' is -50"),
        (dict(edit_record=lambda r: r.update(iter=1e30)), r"'iter' is 1e\+30"),
        (dict(edit_record=lambda r: r.update(losses="x")), r"'losses'"),
        (dict(edit_record=lambda r: r.update(losses=[1, 2])), r"'losses' is \[1, 2\].*average_loss = 1"),
        (dict(edit_record=lambda r: r.update(iter=0)), r"'iter' is 0.*snap_iter_2\.caffemodel"),
        (dict(edit_record=lambda r: r.update(smoothed_loss=-50)), r"record does not match its sha256: it was edited"),
        (dict(edit_record=lambda r: r.update(losses=[])), r"record does not match its sha256"),
        (dict(edit_record=lambda r: r.pop("weights_sha256")), r"record does not match its sha256"),
        (dict(edit_record=lambda r: r.update(learned_net="../../etc/passwd")), "learned_net"),
        (dict(edit_arrays=lambda a: a.update({"history/0": np.zeros((2, 2), np.float32)})), r"history/0.*\(2, 2\)"),
        (dict(edit_arrays=lambda a: a.pop("history/1")), "history/1.*missing"),
    ],
)
def test_edited_solverstate_records(toy_solver, edit, message):
    s = toy_solver()
    s.step(2)
    _, state = s.snapshot()
    rewrite_state(state, **edit)
    fresh = toy_solver()
    before = params_of(fresh.net)
    with pytest.raises(SolverError, match=message):
        fresh.restore(state)
    assert_unchanged(fresh.net, before)
    assert fresh.iter == 0


def test_solverstate_with_a_bad_crc(toy_solver):
    s = toy_solver()
    _, state = s.snapshot()
    raw = bytearray(open(state, "rb").read())
    with zipfile.ZipFile(state) as z:
        info = z.getinfo("history/0.npy")
    raw[info.header_offset + 30 + len(info.filename) + len(info.extra) + 130] ^= 0x10
    open(state, "wb").write(bytes(raw))
    with pytest.raises(SolverError, match=r"\.solverstate.*history/0.*(CRC|damaged)"):
        toy_solver().restore(state)


def test_idx_dimension_product_overflow(tmp_path):
    bad = tmp_path / "overflow-idx3-ubyte"
    bad.write_bytes(bytes([0, 0, 8, 4]) + struct.pack(">4I", 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF))
    with pytest.raises(DatasetError, match=r"overflow-idx3-ubyte.*header says shape \(4294967295") as err:
        idx.read_idx(bad)
    assert f"{4294967295**4 + 20} bytes" in str(err.value)  # the true size, not an int64 that wrapped


def test_idx_zlib_error_is_a_dataset_error(tmp_path):
    good = gzip.compress(bytes([0, 0, 8, 1]) + struct.pack(">I", 1000) + bytes(1000))
    damaged = bytearray(good)
    damaged[10] ^= 0xFF  # the first byte of the deflate stream: zlib.error "invalid code lengths set"
    bad = tmp_path / "bad-idx1-ubyte.gz"
    bad.write_bytes(bytes(damaged))
    with pytest.raises(DatasetError, match=r"bad-idx1-ubyte\.gz.*(damaged|corrupt|invalid|CRC)"):
        idx.read_idx(bad)


# -- 3. small files that would take huge memory -----------------------------------------------------
def zip_bomb(path, member, shape, chunk=1 << 22):
    """An .npz whose member is a valid .npy of zeros, deflated (1000x smaller than it unpacks)."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        with z.open(member, "w", force_zip64=True) as f:
            header = {"descr": "<f4", "fortran_order": False, "shape": tuple(shape)}
            np.lib.format.write_array_header_1_0(f, header)
            left = int(np.prod(shape)) * 4
            zeros = bytes(chunk)
            while left:
                n = min(left, chunk)
                f.write(zeros[:n])
                left -= n
        if member == "ip/0.npy":
            z.writestr("ip/1.npy", npy_bytes(np.zeros(3, np.float32)))


def test_zip_bomb_npz_is_refused_before_it_is_unpacked(saved, tmp_path):
    net, _ = saved
    bomb = tmp_path / "bomb.npz"
    zip_bomb(bomb, "ip/0.npy", (3, 8_000_000))  # 96 MB unpacked
    assert os.path.getsize(bomb) < 200_000
    out, peak, seconds = peak_bytes(lambda: net.copy_from(str(bomb)))
    assert isinstance(out, WeightsError) and "(3, 8000000)" in str(out) and "(3, 100)" in str(out), repr(out)
    assert peak < 2 << 20 and seconds < 1.0


def test_zip_bomb_under_a_layer_the_net_lacks_is_never_unpacked(saved, tmp_path):
    net, paths = saved
    bomb = tmp_path / "bomb2.npz"
    with np.load(paths[".npz"]) as z:
        good = {k: z[k] for k in z.files}
    zip_bomb(bomb, "elsewhere/0.npy", (25_000_000,))  # 100 MB unpacked
    with zipfile.ZipFile(bomb, "a") as zf:
        for key, arr in good.items():
            zf.writestr(key + ".npy", npy_bytes(arr))
    out, peak, seconds = peak_bytes(lambda: make().copy_from(str(bomb), log=lambda m: None))
    assert not isinstance(out, Exception), repr(out)
    assert out.ignored == ["elsewhere"] and out.missing == []
    assert peak < 2 << 20 and seconds < 1.0


def test_gzip_bomb_idx_is_bounded(tmp_path):
    bomb = tmp_path / "train-images-idx3-ubyte.gz"
    with gzip.open(bomb, "wb") as f:
        f.write(bytes([0, 0, 8, 3]) + struct.pack(">3I", 200_000, 28, 28))
        zeros = bytes(1 << 22)
        for _ in range(200_000 * 784 // len(zeros)):
            f.write(zeros)
    assert os.path.getsize(bomb) < 300_000
    out, peak, seconds = peak_bytes(lambda: idx.read_idx(bomb, max_bytes=60_000 * 784 + 16))
    assert isinstance(out, DatasetError) and "200000" in str(out), repr(out)
    assert peak < 2 << 20 and seconds < 1.0


def test_caffemodel_of_empty_records_is_cheap(saved, tmp_path):
    net, _ = saved
    bad = tmp_path / "empty_records.caffemodel"
    bad.write_bytes(b"\xa2\x06\x00" * 300_000)  # 300,000 empty 'layer' records, 900 KB
    out, peak, seconds = peak_bytes(lambda: net.copy_from(str(bad)))
    assert isinstance(out, WeightsError), repr(out)
    assert peak < 4 * os.path.getsize(bad) and seconds < 1.5, (peak, seconds)


def test_nesting_depth_is_bounded():
    """caffe.proto has no recursive message, so real files nest a few levels; the decoder refuses
    more than its limit (protobuf's is 100) instead of running out of Python stack."""
    from minicaffe.proto import wire

    msg = proto.Message("NetParameter", name="n")
    lp = msg.add("layer", name="a", type="Convolution")
    lp.get_or_create("convolution_param").get_or_create("weight_filler").std = 1.0
    raw = proto.encode(msg)
    with pytest.raises(PrototxtError, match="nested deeper than 2"):
        wire.Decoder(raw, max_depth=2).decode_message("NetParameter", 0, len(raw))
    assert wire.decode(raw, "NetParameter").layer[0].convolution_param.weight_filler.std == 1.0


def test_wire_decoder_message_budget():
    raw = b"\xa2\x06\x00" * 50_000  # 50,000 empty layers in 150 KB
    with pytest.raises(PrototxtError, match="more than .* messages"):
        proto.decode(raw, "NetParameter", filename="many.caffemodel")


# -- 7. unbounded prefetch ----------------------------------------------------------------------------
def test_absurd_prefetch_is_refused():
    data.register_dataset("rel_pf", np.zeros((4, 1, 2, 2), np.uint8), np.zeros(4, np.int64))
    try:
        text = (
            'layer { name: "d" type: "Data" top: "x" data_param { source: "rel_pf" batch_size: 2 prefetch: 1000000 } }'
        )
        with pytest.raises(LayerError, match=r"layer 'd' \(type Data\): data_param.prefetch 1000000.*at most 64"):
            make(text, caffe.TRAIN)
    finally:
        data.unregister_dataset("rel_pf")


# -- 8. nonsense parameters ---------------------------------------------------------------------------
IN_PLACE_POOL = """
input: "data" input_shape { dim: 1 dim: 1 dim: 6 dim: 6 }
layer { name: "pool" type: "Pooling" bottom: "data" top: "data" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
"""


def test_in_place_pooling_is_refused():
    with pytest.raises(LayerError, match=r"layer 'pool' \(type Pooling\).*in place.*\(1, 1, 6, 6\) to \(1, 1, 3, 3\)"):
        make(IN_PLACE_POOL)


@pytest.mark.parametrize(
    "layer, field",
    [
        (
            'type: "InnerProduct" bottom: "data" top: "y" loss_weight: nan inner_product_param { num_output: 2 }',
            "loss_weight",
        ),
        (
            'type: "InnerProduct" bottom: "data" top: "y" loss_weight: inf inner_product_param { num_output: 2 }',
            "loss_weight",
        ),
        (
            'type: "InnerProduct" bottom: "data" top: "y" param { lr_mult: nan } inner_product_param { num_output: 2 }',
            r"param\[0\]\.lr_mult",
        ),
        (
            'type: "InnerProduct" bottom: "data" top: "y" param { lr_mult: 1 } param { decay_mult: -inf } '
            "inner_product_param { num_output: 2 }",
            r"param\[1\]\.decay_mult",
        ),
        ('type: "BatchNorm" bottom: "data" top: "y" batch_norm_param { eps: -1 }', "batch_norm_param.eps"),
        ('type: "BatchNorm" bottom: "data" top: "y" batch_norm_param { eps: 1e309 }', "batch_norm_param.eps"),
        ('type: "BatchNorm" bottom: "data" top: "y" batch_norm_param { eps: 0 }', "batch_norm_param.eps"),
        (
            'type: "InnerProduct" bottom: "data" top: "y" inner_product_param { num_output: 0 }',
            "inner_product_param.num_output",
        ),
        ('type: "DummyData" top: "y" dummy_data_param { shape { dim: 2 dim: 0 } }', "dim 1 is 0"),
    ],
)
def test_nonsense_parameters_are_refused_with_the_field_named(layer, field):
    text = f'input: "data" input_shape {{ dim: 2 dim: 3 dim: 4 dim: 4 }}\nlayer {{ name: "L" {layer} }}'
    with pytest.raises(LayerError, match=rf"layer 'L'.*{field}"):
        make(text, caffe.TRAIN)


def test_zero_size_input_dims_are_refused():
    with pytest.raises(MinicaffeError, match=r"input_param.shape.*dim 0 is 0"):
        make('input: "data" input_shape { dim: 0 dim: 3 }', caffe.TRAIN)


# -- 9. smaller things ----------------------------------------------------------------------------------
def test_python_layer_naming_a_non_class(tmp_path):
    text = (
        'input: "data" input_shape { dim: 1 }\nlayer { name: "py" type: "Python" bottom: "data" top: "y" '
        'python_param { module: "os" layer: "path" } }'
    )
    with pytest.raises(LayerError, match=r"layer 'py' \(type Python\).*'os.path' is a module, not a class"):
        make(text)
    text = text.replace('layer: "path"', 'layer: "getcwd"')
    with pytest.raises(LayerError, match=r"'os.getcwd' is a builtin_function_or_method, not a class"):
        make(text)


def test_ten_megabyte_quoted_string_parses_fast():
    text = 'name: "' + "a" * 10_000_000 + '"'
    t0 = time.perf_counter()
    msg = proto.parse(text, "NetParameter")
    assert len(msg.name) == 10_000_000
    assert time.perf_counter() - t0 < 2.0
    esc = 'name: "' + "ab\\n" * 1_000_000 + '"'
    assert proto.parse(esc, "NetParameter").name == "ab\n" * 1_000_000


def test_one_file_permission_policy(toy_solver, tmp_path):
    """Snapshots, logs and the dataset cache are created like any file the user writes:
    0666 masked by the umask (0644 under the usual umask 022; 0640 under 027, as here)."""
    from minicaffe.data import _util
    from minicaffe.io import atomic_write

    old = os.umask(0o027)
    try:
        weights, state = toy_solver().snapshot()
        atomic_write(tmp_path / "log.json", lambda f: f.write(b"{}"))
        _util.atomic_write(tmp_path / "cache.npz", lambda f: f.write(b"x"))
    finally:
        os.umask(old)
    for p in (weights, state, tmp_path / "log.json", tmp_path / "cache.npz"):
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o640, p


# -- checksums of minicaffe's own snapshots ----------------------------------------------------------
def test_resume_verifies_the_weights_checksum(toy_solver):
    s = toy_solver()
    s.step(2)
    weights, state = s.snapshot()
    raw = bytearray(open(weights, "rb").read())
    raw[-3] ^= 0x01  # one bit of the last float
    open(weights, "wb").write(bytes(raw))
    fresh = toy_solver()
    before = params_of(fresh.net)
    with pytest.raises(SolverError, match=r"_iter_2\.caffemodel.*sha256.*does not match.*solver state"):
        fresh.restore(state)
    assert_unchanged(fresh.net, before)


def test_resume_refuses_weights_that_miss_layers(toy_solver, tmp_path):
    s = toy_solver()
    weights, state = s.snapshot()
    msg = proto.decode(open(weights, "rb").read(), "NetParameter")
    kept = proto.Message("NetParameter", name=msg.name)
    kept.layer.append(msg.layer[1])
    open(weights, "wb").write(proto.encode(kept))

    def old_state(record):  # as written before states carried checksums
        record.pop("weights_sha256")
        record.pop("record_sha256")

    rewrite_state(state, edit_record=old_state)
    with pytest.raises(SolverError, match=r"does not hold layer\(s\) 'ip2'"):
        toy_solver().restore(state)


def test_resume_still_bit_exact(toy_solver):
    full = toy_solver()
    full.step(3)
    _, state = full.snapshot()
    full.step(3)
    again = toy_solver()
    again.restore(state)
    again.step(3)
    for a, b in zip(full.net.learnable_params, again.net.learnable_params):
        np.testing.assert_array_equal(a.data, b.data)


def test_nan_loss_says_where_it_came_from(toy_solver, tmp_path):
    s = toy_solver()
    s.net.params["ip2"][0].data[0, 0] = np.inf  # as if the last update diverged
    with pytest.raises(
        SolverError,
        match=r"loss is nan at iteration 0: training diverged: parameter blob\(s\) \[0\] of layer 'ip2'.*base_lr",
    ):
        s.step(1)
    data.register_dataset("rel_nan", np.full((4, 1, 2, 2), np.nan, np.float32), np.zeros(4, np.int64))
    try:
        (tmp_path / "toy.prototxt").write_text(SOLVER_NET.replace("rel_toy", "rel_nan"))
        with pytest.raises(SolverError, match=r"the parameters are finite, but the input data made by layer 'd'"):
            toy_solver().step(1)
    finally:
        data.unregister_dataset("rel_nan")


def test_caffes_binary_solverstate_given_as_weights(toy_solver):
    from minicaffe.solvers import caffe_state

    s = toy_solver()
    weights, state = s.snapshot()
    caffe_state.save(s, state, weights)  # Caffe's SolverState protobuf, not an .npz
    with pytest.raises(WeightsError, match=r"\.solverstate is a solver state, not weights.*--resume"):
        s.net.copy_from(state)


def test_zip_asking_for_an_unknown_version(saved, toy_solver, tmp_path):
    """zipfile raises NotImplementedError for a 'version needed to extract' it lacks."""

    def bump(raw):
        raw = bytearray(raw)
        at = raw.find(b"PK\x01\x02")  # the first central directory entry
        raw[at + 6 : at + 8] = (148).to_bytes(2, "little")  # version needed: 14.8
        return bytes(raw)

    net, paths = saved
    bad = tmp_path / "v.npz"
    bad.write_bytes(bump(open(paths[".npz"], "rb").read()))
    with pytest.raises(WeightsError, match=r"v\.npz: not a readable \.npz archive \(zip file version 14\.8\)"):
        net.copy_from(str(bad))
    s = toy_solver()
    _, state = s.snapshot()
    raw = open(state, "rb").read()
    open(state, "wb").write(bump(raw))
    with pytest.raises(SolverError, match=r"zip file version 14\.8"):
        toy_solver().restore(state)


def test_zip_bomb_read_without_a_net_is_bounded_by_its_ratio(tmp_path):
    from minicaffe.io import read_weight_arrays

    bomb = tmp_path / "bomb3.npz"
    zip_bomb(bomb, "ip/0.npy", (3, 8_000_000))  # 96 MB from ~100 KB
    out, peak, _ = peak_bytes(lambda: read_weight_arrays(str(bomb)))
    assert isinstance(out, WeightsError) and "more than" in str(out), repr(out)
    assert peak < 2 << 20


@pytest.mark.parametrize("shape, it", [((-1, -3), 3), ((1,) * 40, 3), ((3,), -50)])
def test_caffe_solverstate_crafted_shapes_and_iter(shape, it):
    from minicaffe.solvers import caffe_state

    st = proto.Message("SolverState", iter=it)
    blob = st.add("history")
    blob.get_or_create("shape").dim.extend(shape)
    blob.data = np.zeros(3, np.float32)
    with pytest.raises(SolverError, match=r"x\.solverstate: .*a corrupt state"):
        caffe_state.decode_state(proto.encode(st), "x.solverstate")
