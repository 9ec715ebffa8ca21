"""A seeded fuzzer for minicaffe's decoders: prototxt, weights (.caffemodel, .npz), snapshots
(.solverstate) and data files (IDX, raw and gzipped).

Each *target* owns a small valid corpus (built here, nothing downloaded), mutators that damage
it, and a ``run(data)`` that feeds one mutated input to minicaffe the way a user would (a file on
disk given to ``Net.copy_from``, ``Solver.restore``, ``read_idx``; a text given to ``parse`` and
then to ``Net``).  Every case is classified:

- **clean**: accepted, or refused with one of minicaffe's own errors (``MinicaffeError``);
- **ugly**: anything else escaped (a raw numpy/zipfile/json traceback): a bug;
- **hang**: slower than ``time_limit`` seconds;
- **heavy**: allocated more than the memory bound (``mem_base + mem_ratio * input size``);
- **silent**: accepted although the damage changed what was loaded, with nothing reported
  (only where it can be known: a snapshot's weights or history, an IDX file's pixels).

``tests/test_fuzz.py`` runs a few hundred cases in CI; ``tests/fuzz_campaign.py`` runs thousands
and prints the counts.
"""

import gzip
import io
import json
import math
import os
import random
import struct
import time
import tracemalloc
import zipfile

import numpy as np

import minicaffe as caffe
from minicaffe import data, proto
from minicaffe.data import idx
from minicaffe.errors import MinicaffeError

NET_TEXT = """name: "fuzz"
input: "data"
input_shape { dim: 2 dim: 3 dim: 6 dim: 6 }
input: "label"
input_shape { dim: 2 }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        param { lr_mult: 1 } param { lr_mult: 2 decay_mult: 0 }
        convolution_param { num_output: 4 kernel_size: 3 stride: 1 pad: 1
                            weight_filler { type: "xavier" } bias_filler { type: "constant" value: 0.1 } } }
layer { name: "bn" type: "BatchNorm" bottom: "conv" top: "conv" batch_norm_param { eps: 1e-5 } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" relu_param { negative_slope: 0.1 } }
layer { name: "pool" type: "Pooling" bottom: "conv" top: "pool" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "drop" type: "Dropout" bottom: "pool" top: "pool" dropout_param { dropout_ratio: 0.5 } }
layer { name: "ip" type: "InnerProduct" bottom: "pool" top: "ip"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.01 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" loss_weight: 1 }
"""

SOLVER_NET = """name: "fuzzsolver"
layer { name: "d" type: "Data" top: "data" top: "label"
        transform_param { scale: 0.00390625 }
        data_param { source: "fuzz_toy?shuffle=false" batch_size: 4 } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
        inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
"""

INTERESTING_BYTES = [0x00, 0x01, 0x7F, 0x80, 0xFF, 0xFE, 0x0A, 0x12, 0x1A, 0x22, 0x3A]
INTERESTING_TOKENS = [
    "nan",
    "inf",
    "-inf",
    "-1",
    "0",
    "1e309",
    "-1e309",
    "4294967296",
    "99999999999999999999",
    "0x7fffffff",
    "{",
    "}",
    '"',
    "'",
    ":",
    "#",
    "layer {",
    'top: "data"',
    'bottom: "data"',
    "TRAIN",
    "MAX",
    "\\x00",
    "\n",
]
INTERESTING_JSON = [-1, -50, 0, 1e30, 2**63, "x", "", [], {}, None, True, [1, 2], {"a": 1}, "../x", float("nan")]


# -- mutators ------------------------------------------------------------------------------------
def flip_bits(rng, b):
    b = bytearray(b)
    for _ in range(rng.randint(1, 8)):
        i = rng.randrange(len(b))
        b[i] ^= 1 << rng.randrange(8)
    return bytes(b)


def interesting_bytes(rng, b):
    b = bytearray(b)
    for _ in range(rng.randint(1, 4)):
        b[rng.randrange(len(b))] = rng.choice(INTERESTING_BYTES)
    return bytes(b)


def truncate(rng, b):
    return b[: rng.randrange(len(b))]


def delete_span(rng, b):
    i = rng.randrange(len(b))
    return b[:i] + b[i + rng.randint(1, 64) :]


def duplicate_span(rng, b):
    i = rng.randrange(len(b))
    j = min(len(b), i + rng.randint(1, 256))
    k = rng.randrange(len(b) + 1)
    return b[:k] + b[i:j] * rng.randint(1, 8) + b[k:]


def insert_random(rng, b):
    k = rng.randrange(len(b) + 1)
    return b[:k] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 16))) + b[k:]


BINARY_MUTATORS = [flip_bits, interesting_bytes, truncate, delete_span, duplicate_span, insert_random]


def text_mutate(rng, text):
    lines = text.split("\n")
    op = rng.randrange(6)
    if op == 0:  # insert a token
        i = rng.randrange(len(text) + 1)
        return text[:i] + " " + rng.choice(INTERESTING_TOKENS) + " " + text[i:]
    if op == 1:  # replace a number
        import re

        numbers = list(re.finditer(r"(?<![\w.])-?[0-9][0-9.e+-]*", text))
        if numbers:
            m = rng.choice(numbers)
            return text[: m.start()] + rng.choice(INTERESTING_TOKENS[:10]) + text[m.end() :]
    if op == 2:  # delete a span
        i = rng.randrange(len(text))
        return text[:i] + text[i + rng.randint(1, 40) :]
    if op == 3:  # duplicate or drop a line
        i = rng.randrange(len(lines))
        if rng.random() < 0.5:
            lines.insert(rng.randrange(len(lines) + 1), lines[i])
        else:
            del lines[i]
        return "\n".join(lines)
    if op == 4:  # swap two lines
        i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
        return "\n".join(lines)
    return flip_bits(rng, text.encode()).decode("latin-1")


def npy(array):
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.asarray(array))
    return buf.getvalue()


def npz_bytes(members, compress=False):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED) as z:
        for name, payload in members.items():
            z.writestr(name, payload)
    return buf.getvalue()


def npz_members(raw):
    with zipfile.ZipFile(io.BytesIO(raw)) as z:
        return {name: z.read(name) for name in z.namelist()}


def npy_header_mutate(rng, raw):
    """Rewrite one member's .npy header with a crafted shape or dtype (CRCs stay right)."""
    members = npz_members(raw)
    name = rng.choice(sorted(members))
    choice = rng.randrange(5)
    shape = [
        (100_000, 100_000),
        (-1, 3),
        (1,) * 40,
        (1 << 40, 1 << 40),
        (rng.randint(0, 9), rng.randint(0, 9)),
    ][choice]
    descr = rng.choice(["<f4", "<f8", "|O", "<c8", "|u1", "<f2", "|V8", "<U4"])
    fortran = rng.choice(["False", "True"])
    header = "{'descr': " + repr(descr) + ", 'fortran_order': " + fortran + ", 'shape': " + repr(shape) + ", }"
    header = header.ljust(118) + "\n"
    body = members[name]
    payload = body[128:] if body[6:8] == b"\x01\x00" else body
    members[name] = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode("latin-1") + payload
    return npz_bytes(members, compress=rng.random() < 0.3)


def npz_rename_mutate(rng, raw):
    members = npz_members(raw)
    name = rng.choice(sorted(members))
    new = rng.choice(["x.npy", "a/b/c.npy", "ip/7.npy", "ip/-1.npy", "/0.npy", "record.npy", name + "x", "conv/0"])
    members[new] = members.pop(name)
    return npz_bytes(members)


def record_mutate(rng, raw):
    """Edit the JSON record of a .solverstate (the file stays a valid zip)."""
    members = npz_members(raw)
    rec_bytes = np.load(io.BytesIO(members["record.npy"]))
    record = json.loads(bytes(rec_bytes).decode())
    key = rng.choice(sorted(record))
    if rng.random() < 0.2:
        del record[key]
    elif isinstance(record[key], dict) and record[key] and rng.random() < 0.5:
        sub = rng.choice(sorted(record[key]))
        record[key][sub] = rng.choice(INTERESTING_JSON)
    else:
        record[key] = rng.choice(INTERESTING_JSON)
    text = json.dumps(record)
    members["record.npy"] = npy(np.frombuffer(text.encode(), np.uint8))
    return npz_bytes(members)


STRUCTURED = (npy_header_mutate, npz_rename_mutate, record_mutate)


# -- targets ---------------------------------------------------------------------------------------
class Target:
    """A decoder under test: ``corpus`` (bytes or str), ``mutators``, ``run(data)``."""

    name = ""
    mutators = BINARY_MUTATORS
    time_limit = 2.0

    def mutate(self, rng):
        base = rng.choice(self.corpus)
        for step in range(rng.choice([1, 1, 1, 2, 3])):
            if len(base) == 0:
                break
            mutator = rng.choice(self.mutators)
            if mutator in STRUCTURED and step > 0:
                continue  # those read the file's structure: only on an intact one
            base = mutator(rng, base)
        return base

    def silent(self, result):
        """True if an accepted input changed what was loaded without a word."""
        return False


class PrototxtTarget(Target):
    name = "prototxt"

    def __init__(self, tmp):
        self.corpus = [NET_TEXT]
        self.mutators = [text_mutate]

    def run(self, text):
        msg = proto.parse(text, "NetParameter", filename="fuzz.prototxt")
        if self.small(proto.upgrade_net(msg.copy())):
            caffe.Net(msg, caffe.TEST)

    @staticmethod
    def small(msg):
        """Build only nets that ask for little memory: a mutated 'dim: 99999' is a valid net
        that really needs its gigabytes (parsing it is still fuzzed)."""
        sizes = [math.prod(s.dim) for s in msg.input_shape] + [math.prod(msg.input_dim)]
        for lp in msg.layer:
            sizes += [math.prod(s.dim) for s in lp.input_param.shape]
            sizes += [lp.convolution_param.num_output * 1000, lp.inner_product_param.num_output * 1000]
            sizes += [k**2 * 1000 for k in lp.convolution_param.kernel_size]
        return max(sizes, default=0) <= 1_000_000


class WeightsTarget(Target):
    def __init__(self, tmp, ext):
        self.name = ext.lstrip(".")
        self.path = os.path.join(tmp, f"fuzz_w{ext}")
        caffe.set_random_seed(11)
        self.net = caffe.Net(proto.parse(NET_TEXT, "NetParameter"), caffe.TEST)
        self.net.save(self.path)
        with open(self.path, "rb") as f:
            self.corpus = [f.read()]
        if ext == ".npz":
            self.mutators = BINARY_MUTATORS + [npy_header_mutate, npy_header_mutate, npz_rename_mutate]

        self.saved = [p.data.copy() for p in self.net.learnable_params]

    def run(self, raw):
        with open(self.path, "wb") as f:
            f.write(raw)
        return self.net.copy_from(self.path, log=lambda line: None)

    def silent(self, report):
        """Values changed with every layer copied and nothing ignored: a bit flip inside float
        data, which Caffe's format cannot show (it has no checksum; snapshots carry one)."""
        if report.ignored or report.missing:
            return False
        changed = not all(np.array_equal(a, p.data) for a, p in zip(self.saved, self.net.learnable_params))
        for a, p in zip(self.saved, self.net.learnable_params):
            p.data[...] = a
        return changed


class SolverstateTarget(Target):
    """A snapshot's .solverstate (and, with ``damage='weights'``, its .caffemodel) damaged;
    ``Solver.restore`` must refuse it or restore exactly what was saved."""

    def __init__(self, tmp, damage="state"):
        self.name = {"state": "solverstate", "weights": "snapshot-caffemodel", "caffe": "caffe-solverstate"}[damage]
        self.damage = damage
        rng = np.random.default_rng(3)
        data.register_dataset("fuzz_toy", rng.integers(0, 256, (8, 1, 2, 2), dtype=np.uint8), rng.integers(0, 3, 8))
        net = os.path.join(tmp, "fuzz_solver_net.prototxt")
        with open(net, "w") as f:
            f.write(SOLVER_NET)
        solver = os.path.join(tmp, "fuzz_solver.prototxt")
        with open(solver, "w") as f:
            f.write(f'net: "{net}"\nbase_lr: 0.1\nmomentum: 0.9\nmax_iter: 10\ndisplay: 0\nrandom_seed: 1\n')
            f.write(f'snapshot_prefix: "{os.path.join(tmp, "fuzzsnap")}"\n')
        self.solver = caffe.SGDSolver(solver, log=lambda m: None)
        self.solver.step(2)
        self.weights, self.state = self.solver.snapshot()
        if damage == "caffe":  # Caffe's binary SolverState (snapshot_format: BINARYPROTO) instead
            from minicaffe.solvers import caffe_state

            caffe_state.save(self.solver, self.state, self.weights)
        self.saved = self._values()
        with open(self.weights if damage == "weights" else self.state, "rb") as f:
            self.corpus = [f.read()]
        with open(self.weights, "rb") as f:
            self.weights_bytes = f.read()
        with open(self.state, "rb") as f:
            self.state_bytes = f.read()
        if damage == "state":
            self.mutators = BINARY_MUTATORS + [record_mutate, record_mutate, npy_header_mutate, npz_rename_mutate]

    def _values(self):
        s = self.solver
        return (
            [p.data.copy() for p in s.net.learnable_params],
            [h.copy() for hist in s.history for h in hist],
            s.iter,
            list(s.losses) if self.damage != "caffe" else [],
        )

    def run(self, raw):
        with open(self.weights, "wb") as f:
            f.write(raw if self.damage == "weights" else self.weights_bytes)
        with open(self.state, "wb") as f:
            f.write(self.state_bytes if self.damage == "weights" else raw)
        s = self.solver
        for p in s.net.learnable_params:  # scribble, so that a restore that skips something shows
            p.data[...] = -7.0
        s.iter = 12345
        s.restore(self.state)
        return self._values()

    def silent(self, result):
        params, hist, it, losses = result
        ref_params, ref_hist, ref_it, ref_losses = self.saved
        same = (
            all(np.array_equal(a, b) for a, b in zip(params, ref_params))
            and all(np.array_equal(a, b) for a, b in zip(hist, ref_hist))
            and it == ref_it
            and losses == ref_losses
        )
        return not same


class IdxTarget(Target):
    def __init__(self, tmp, gz):
        self.name = "idx.gz" if gz else "idx"
        self.path = os.path.join(tmp, "fuzz-images-idx3-ubyte" + (".gz" if gz else ""))
        rng = np.random.default_rng(5)
        self.array = rng.integers(0, 256, (20, 28, 28), dtype=np.uint8)
        raw = bytes([0, 0, 8, 3]) + struct.pack(">3I", 20, 28, 28) + self.array.tobytes()
        self.corpus = [gzip.compress(raw, mtime=0) if gz else raw]
        self.max_bytes = 4 * len(raw)

    def run(self, raw):
        with open(self.path, "wb") as f:
            f.write(raw)
        return idx.read_idx(self.path, max_bytes=self.max_bytes)

    def silent(self, result):
        return result.shape == self.array.shape and not np.array_equal(result, self.array)


def make_targets(tmp):
    return [
        PrototxtTarget(tmp),
        WeightsTarget(tmp, ".caffemodel"),
        WeightsTarget(tmp, ".npz"),
        SolverstateTarget(tmp, "state"),
        SolverstateTarget(tmp, "weights"),
        SolverstateTarget(tmp, "caffe"),
        IdxTarget(tmp, gz=False),
        IdxTarget(tmp, gz=True),
    ]


def close_targets():
    data.unregister_dataset("fuzz_toy")


# -- running -----------------------------------------------------------------------------------------
class Outcome:
    def __init__(self, target, case, kind, seconds, peak, size, detail=""):
        self.target, self.case, self.kind = target, case, kind
        self.seconds, self.peak, self.size, self.detail = seconds, peak, size, detail

    def __repr__(self):
        return (
            f"{self.target} case {self.case}: {self.kind} ({self.seconds:.3f} s, {self.peak / 1e6:.1f} MB "
            f"for {self.size} bytes) {self.detail}"
        )


def run_cases(target, seed, n, mem_base=16 << 20, mem_ratio=64, traced=True):
    """Run ``n`` seeded cases of ``target``; a list of Outcome (kind: accepted / refused / ugly /
    hang / heavy / silent)."""
    rng = random.Random(f"{target.name}:{seed}")
    out = []
    for case in range(n):
        sample = target.mutate(rng)
        size = len(sample)
        if traced:
            tracemalloc.start()
        t0 = time.perf_counter()
        kind, detail, result = "accepted", "", None
        try:
            result = target.run(sample)
        except MinicaffeError as exc:
            kind, detail = "refused", str(exc).splitlines()[0][:200]
        except Exception as exc:  # noqa: BLE001 - what the fuzzer is looking for
            kind, detail = "ugly", f"{type(exc).__name__}: {exc}"[:300]
        seconds = time.perf_counter() - t0
        peak = 0
        if traced:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        if kind == "accepted" and target.silent(result):
            kind = "silent"
        elif kind != "ugly" and seconds > target.time_limit:
            kind, detail = "hang", detail
        elif kind != "ugly" and peak > mem_base + mem_ratio * size:
            kind = "heavy"
        out.append(Outcome(target.name, case, kind, seconds, peak, size, detail))
    return out


def summarize(outcomes):
    """{target: {kind: count}} plus the slowest and heaviest case of each."""
    table = {}
    for o in outcomes:
        row = table.setdefault(o.target, {"tried": 0, "max_s": 0.0, "max_mb": 0.0})
        row["tried"] += 1
        row[o.kind] = row.get(o.kind, 0) + 1
        row["max_s"] = max(row["max_s"], o.seconds)
        row["max_mb"] = max(row["max_mb"], o.peak / 1e6)
    return table
