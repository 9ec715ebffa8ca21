"""The declared seams between minicaffe's parts, and a check that nothing goes around them.

Part 1 reads every module under minicaffe/ (with ``ast``) and fails on (a) a read of another
file's private attribute (``obj._x`` where ``obj`` is not ``self``/``cls`` and ``_x`` is not
defined in the same file) and (b) methods replaced on instances (``obj.forward = ...``,
``__dict__`` tricks, ``types.MethodType``).  The allow-list says why each exception is one.

Part 2 tests each seam: Solver callbacks, gradient source and updater; Net hooks and public
vectors; the DataLayer base; the layers' declarations for the memory planner.
"""

import ast
import functools
import os

import numpy as np
import pytest

import minicaffe as caffe
from minicaffe import proto
from minicaffe.errors import NetError, SolverError
from minicaffe.layers.data_base import DataLayer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "minicaffe")

#: (file or folder prefix, file whose private names it may read, why)
ALLOWED_PRIVATE = [
    (
        "minicaffe/proto/",
        "minicaffe/proto/message.py",
        "the text parser, the wire codec and the upgrader build Messages: one package, one data structure",
    ),
]
#: (file, attribute, why): single reads of a private name outside minicaffe
ALLOWED_FOREIGN = [
    (
        "minicaffe/data/mnist.py",
        "_reconstruct",
        "the MNIST pickle names numpy's array reconstructor; the safe unpickler must return exactly it",
    ),
    ("minicaffe/teardown.py", "_exit", "os._exit is public, documented API despite its underscore"),
]


def _modules():
    for folder, _, files in os.walk(PACKAGE):
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                yield os.path.relpath(path, ROOT).replace(os.sep, "/"), path


def _private(name):
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _defined_names(tree):
    """Private names a file defines: attributes it assigns on ``self``/``cls``, ``__slots__``
    entries, class attributes, methods and module-level names."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _own_object(node.value):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets
        ):
            names.update(c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant))
    return {n for n in names if isinstance(n, str) and _private(n)}


@functools.lru_cache(maxsize=1)
def _trees():
    out = {}
    for rel, path in _modules():
        with open(path, encoding="utf-8") as f:
            out[rel] = ast.parse(f.read(), filename=rel)
    return out


def _own_object(node):
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def private_reads(trees):
    """[(file:line, text)] of private attributes read across files."""
    defined = {rel: _defined_names(tree) for rel, tree in trees.items()}
    found = []
    for rel, tree in trees.items():
        mine = set(defined[rel])
        for prefix, owner, _ in ALLOWED_PRIVATE:
            if rel.startswith(prefix):
                mine |= defined[owner]
        foreign_ok = {attr for f, attr, _ in ALLOWED_FOREIGN if f == rel}
        for node in ast.walk(tree):
            attr, target = None, None
            if isinstance(node, ast.Attribute) and _private(node.attr) and not _own_object(node.value):
                attr, target = node.attr, node.value
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)
                and _private(node.args[1].value)
                and not _own_object(node.args[0])
            ):
                attr, target = node.args[1].value, node.args[0]
            if attr is None or attr in foreign_ok:
                continue
            if isinstance(target, ast.Name) and target.id.startswith("_") and attr in mine:
                continue  # a module-private alias of this file's own object
            if attr in mine:
                continue
            found.append(f"{rel}:{node.lineno}: {ast.unparse(node)[:80]}")
    return found


def _is_property(fn):
    return any(
        (isinstance(d, ast.Name) and d.id in ("property", "cached_property"))
        or (isinstance(d, ast.Attribute) and d.attr in ("setter", "getter", "deleter"))
        for d in fn.decorator_list
    )


def _methods_of(cls):
    """Names of a class's own methods (not properties)."""
    return {
        item.name
        for item in cls.body
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
        and not item.name.startswith("__")
        and not _is_property(item)
    }


def instance_patches(trees):
    """[(file:line, text)] of methods assigned onto instances and __dict__ tricks: a function,
    lambda, bound method (of a class of the same file) or partial assigned to an attribute of
    another object, or a method of a class assigned over on ``self`` inside that class."""
    found = []
    for rel, tree in trees.items():
        local_defs = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        classes = [c for c in ast.walk(tree) if isinstance(c, ast.ClassDef)]
        file_methods = set().union(*(_methods_of(c) for c in classes)) if classes else set()
        own_methods = {}  # id(assignment node) -> the methods of its enclosing class
        for c in classes:
            for node in ast.walk(c):
                own_methods[id(node)] = _methods_of(c)

        def callable_value(v):
            return (
                isinstance(v, ast.Lambda)
                or (isinstance(v, ast.Name) and v.id in local_defs)
                or (isinstance(v, ast.Attribute) and v.attr in file_methods)
                or (isinstance(v, ast.Call) and ast.unparse(v.func).split(".")[-1] in ("partial", "MethodType"))
            )

        def where(node):
            return f"{rel}:{node.lineno}: {ast.unparse(node)[:80]}"

        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in ("__dict__", "MethodType"):
                found.append(where(node))
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    if not isinstance(t, ast.Attribute):
                        continue
                    if _own_object(t.value):
                        if t.attr in own_methods.get(id(node), ()):
                            found.append(where(node))  # an instance replacing its own method
                    elif callable_value(node.value):
                        found.append(where(node))
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "setattr"
                and len(node.args) == 3
                and callable_value(node.args[2])
            ):
                found.append(where(node))
    return found


def test_no_module_reads_another_files_private_attributes():
    found = private_reads(_trees())
    assert not found, "private attributes read across files (declare a public seam instead):\n" + "\n".join(found)


def test_no_module_replaces_methods_on_instances():
    found = instance_patches(_trees())
    assert not found, "methods replaced on instances (declare a seam instead):\n" + "\n".join(found)


def test_data_layers_are_found_by_type_not_by_their_insides():
    """The solver and runtimes find data layers with isinstance(layer, DataLayer) and use its
    contract; no module probes for state_dict or reaches into a layer's prefetcher."""
    found = []
    for rel, tree in _trees().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "prefetcher" and not _own_object(node.value):
                found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "hasattr"
                and len(node.args) == 2
                and isinstance(node.args[1], ast.Constant)
                and node.args[1].value in ("state_dict", "load_state_dict", "prefetcher")
            ):
                found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "data layers probed instead of found by type:\n" + "\n".join(found)


def test_the_checks_catch_what_they_forbid():
    """The two checks are not vacuous: each flags a small offending module, and lets the same
    code pass inside the file that owns the names."""
    owner = ast.parse(
        "class A:\n"
        "    __slots__ = ('_s',)\n"
        "    def forward(self):\n"
        "        self._x = 1\n"
        "    def _helper(self, other):\n"
        "        return other._x\n"
    )
    user = ast.parse("def f(net, layer):\n    net._x\n    getattr(layer, '_s')\n    layer._helper = None\n")
    assert private_reads({"minicaffe/a.py": owner}) == []
    assert [r.split(":")[0:2] for r in private_reads({"minicaffe/a.py": owner, "minicaffe/b.py": user})] == [
        ["minicaffe/b.py", "2"],
        ["minicaffe/b.py", "3"],
        ["minicaffe/b.py", "4"],
    ]
    patcher = ast.parse(
        "def f(layer, solver):\n"
        "    layer.forward = lambda b, t: None\n"
        "    solver.__dict__.pop('forward', None)\n"
        "    setattr(layer, 'forward', lambda: 0)\n"
        "    def g():\n"
        "        pass\n"
        "    layer.state = g\n"
        "    layer.state = 3\n"  # data, not a method: fine
        "class Trainer:\n"
        "    def gather(self, solver):\n"
        "        solver.forward_backward = self.gather\n"
        "        self.gather = None\n"
    )
    lines = [int(r.split(":")[1]) for r in instance_patches({"minicaffe/a.py": owner, "minicaffe/b.py": patcher})]
    assert sorted(set(lines)) == [2, 3, 4, 7, 11, 12], lines


# -- Part 2: the seams --------------------------------------------------------------------------
NET = """
name: "tiny"
layer { name: "data" type: "Input" top: "x" top: "y"
        input_param { shape { dim: 4 dim: 3 } shape { dim: 4 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "x" top: "h"
        inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "relu" type: "ReLU" bottom: "h" top: "h" }
layer { name: "ip2" type: "InnerProduct" bottom: "h" top: "z"
        param { name: "shared_w" } inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "z" bottom: "y" top: "loss" }
"""


def tiny_net():
    caffe.set_random_seed(3)
    net = caffe.Net(proto.parse(NET, "NetParameter"), caffe.TRAIN)
    net.blobs["x"].data[...] = np.random.default_rng(0).standard_normal((4, 3))
    net.blobs["y"].data[...] = [0, 1, 1, 0]
    return net


def test_public_vectors():
    net = tiny_net()
    assert net.layer_names == ["data", "ip1", "relu", "ip2", "loss"]
    assert [[b.name for b in v] for v in net.bottom_vecs] == [[], ["x"], ["h"], ["h"], ["z", "y"]]
    assert [[b.name for b in v] for v in net.top_vecs] == [["x", "y"], ["h"], ["h"], ["z"], ["loss"]]
    assert net.bottom_vecs[2][0] is net.top_vecs[2][0] is net.blobs["h"]  # in place: one Blob
    assert net.blob_names == list(net.blobs)
    # four learnable blobs: ip1 weight, bias; ip2 weight, bias
    assert net.param_layer_indices == [1, 1, 3, 3]
    assert net.layer_param_indices == [[], [0, 1], [], [2, 3], []]


def test_hooks_order_arguments_and_removal():
    net = tiny_net()
    calls = []
    h1 = net.add_hooks(
        before_forward=lambda i: calls.append(("bf", i)),
        after_forward=lambda i: calls.append(("af", i)),
        before_backward=lambda i: calls.append(("bb", i)),
        after_backward=lambda i: calls.append(("ab", i)),
    )
    h2 = net.add_hooks(after_backward=lambda i: calls.append(("ab2", i)))
    net.forward_backward()
    fwd = [c for c in calls if c[0] in ("bf", "af")]
    assert fwd == [(k, i) for i in range(5) for k in ("bf", "af")]
    bwd = [c for c in calls if c[0] in ("bb", "ab", "ab2")]
    # backward runs only where needed: loss, ip2, relu, ip1 (not the Input layer)
    assert bwd == [(k, i) for i in (4, 3, 2, 1) for k in ("bb", "ab", "ab2")]
    h1.remove()
    h1.remove()  # twice is harmless
    calls.clear()
    net.forward_backward()
    assert calls == [("ab2", i) for i in (4, 3, 2, 1)]
    with h2:
        pass
    calls.clear()
    net.forward_backward()
    assert calls == [] and not net._forward_hooked and not net._backward_hooked
    with pytest.raises(NetError, match="after_backward must be a function"):
        net.add_hooks(after_backward=3)


def test_after_backward_sees_the_layers_gradients_complete():
    """What wait-free backprop relies on: in after_backward(l), the gradients of the parameters
    layer l owns are final (equal to those after the whole backward)."""
    net = tiny_net()
    seen = {}

    def grab(l):
        for i in net.layer_param_indices[l]:
            seen[i] = net.learnable_params[i].diff.copy()

    with net.add_hooks(after_backward=grab):
        net.clear_param_diffs()
        net.forward_backward()
    assert sorted(seen) == [0, 1, 2, 3]
    for i, g in seen.items():
        np.testing.assert_array_equal(g, net.learnable_params[i].diff)
        assert np.abs(g).sum() > 0


def test_hooked_and_plain_loops_give_the_same_numbers():
    a, b = tiny_net(), tiny_net()
    b.add_hooks(before_forward=lambda i: None, after_backward=lambda i: None)
    la, lb = a.forward_backward(), b.forward_backward()
    assert la == lb
    for p, q in zip(a.learnable_params, b.learnable_params):
        np.testing.assert_array_equal(p.diff, q.diff)


SOLVER = """
base_lr: 0.1 momentum: 0.9 lr_policy: "fixed" max_iter: 100 display: 0 random_seed: 5
net_param {
  name: "s"
  layer { name: "d" type: "Data" top: "data" top: "label"
          data_param { source: "synthetic:1x4x4:3:64:0" batch_size: 8 } }
  layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
          inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
  layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
}
"""


def make_solver(**extra):
    param = proto.parse(SOLVER, "SolverParameter")
    for k, v in extra.items():
        setattr(param, k, v)
    return caffe.get_solver(param, log=lambda m: None)


class Recorder:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def on_start(self, solver):
        self.log.append((self.name, "start", solver.iter, _grad_sum(solver)))

    def on_gradients_ready(self, solver):
        self.log.append((self.name, "ready", solver.iter, _grad_sum(solver)))

    def on_iteration(self, solver, loss, lr):
        self.log.append((self.name, "iteration", solver.iter, lr))


def _grad_sum(solver):
    return float(sum(np.abs(p.diff).sum() for p in solver.net.learnable_params))


def test_callbacks_order_and_what_they_see():
    s = make_solver(iter_size=2)
    log = []
    a, b = Recorder("a", log), Recorder("b", log)
    s.add_callback(a)
    s.add_callback(b)
    s.on_iteration.append(lambda solver, loss, lr: log.append(("list", "iteration", solver.iter, lr)))
    s.step(2)
    kinds = [(n, k, it) for n, k, it, _ in log]
    one = lambda it: [  # noqa: E731
        ("a", "start", it),
        ("b", "start", it),
        ("a", "ready", it),
        ("b", "ready", it),
        ("a", "iteration", it + 1),
        ("b", "iteration", it + 1),
        ("list", "iteration", it + 1),
    ]
    assert kinds == one(0) + one(1)
    starts = [g for n, k, _, g in log if k == "start"]
    ready = [g for n, k, _, g in log if k == "ready"]
    assert starts == [0.0] * 4  # diffs cleared, nothing computed yet
    assert all(g > 0 for g in ready)  # the iteration's gradients, before the update
    s.remove_callback(a)
    with pytest.raises(SolverError, match="not registered"):
        s.remove_callback(a)
    with pytest.raises(SolverError, match="already registered"):
        s.add_callback(b)
    with pytest.raises(SolverError, match="defines none of"):
        s.add_callback(object())


def test_gradients_ready_holds_the_sum_over_iter_size():
    """on_gradients_ready sees the gradients summed over iter_size (normalized later, in the update)."""
    s = make_solver(iter_size=2)
    seen = []

    class Grab:
        def on_gradients_ready(self, solver):
            seen.append([p.diff.copy() for p in solver.net.learnable_params])

    s.add_callback(Grab())
    ref = make_solver(iter_size=1)
    total = None
    for _ in range(2):
        ref.net.clear_param_diffs()
        ref.net.forward_backward()
        g = [p.diff.copy() for p in ref.net.learnable_params]
        total = g if total is None else [x + y for x, y in zip(total, g)]
    s.step(1)
    for got, want in zip(seen[0], total):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_gradient_source_and_updater():
    s, ref = make_solver(), make_solver()
    calls = []

    def source():
        calls.append("source")
        return s.net.forward_backward()

    def updater(solver, rate):
        calls.append(("update", rate))
        solver.local_update(rate)

    s.set_gradient_source(source)
    s.set_updater(updater)
    s.step(3)
    ref.step(3)
    assert calls == ["source", ("update", 0.1)] * 3
    for p, q in zip(s.net.learnable_params, ref.net.learnable_params):
        np.testing.assert_array_equal(p.data, q.data)  # the same steps, through the seams
    s.set_gradient_source(None)
    s.set_updater(None)
    s.step(1)
    assert len(calls) == 6  # the defaults are back

    # an updater that does nothing leaves the parameters as they were
    frozen = make_solver()
    before = [p.data.copy() for p in frozen.net.learnable_params]
    frozen.set_updater(lambda solver, rate: None)
    frozen.step(2)
    for p, b in zip(frozen.net.learnable_params, before):
        np.testing.assert_array_equal(p.data, b)
    with pytest.raises(SolverError, match="expected a function"):
        frozen.set_gradient_source(3)


def test_data_layer_state_round_trip_and_position_source():
    s = make_solver()
    layer = s.net.layers[0]
    assert isinstance(layer, DataLayer) and layer.batch_size == 8
    s.step(3)
    state = layer.state_dict()
    assert state == layer.position() and state["index"] == 24
    want = [np.array(a) for a in layer.next_batch()]
    layer.load_state_dict(state)
    got = layer.next_batch()
    assert len(got) == 2
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a, b)
    # a runtime declares the position a snapshot records
    layer.set_position_source(lambda l: {"from": "runtime", "name": l.name})
    assert layer.state_dict() == {"from": "runtime", "name": "d"}
    layer.set_position_source(None)
    assert layer.state_dict() == layer.position()


def test_memory_data_is_a_data_layer():
    param = proto.parse(
        'name: "m" layer { name: "m" type: "MemoryData" top: "data" top: "label" '
        "memory_data_param { batch_size: 2 channels: 1 height: 1 width: 1 } }",
        "NetParameter",
    )
    net = caffe.Net(param, caffe.TEST)
    layer = net.layers[0]
    assert isinstance(layer, DataLayer)
    net.set_input_arrays(np.arange(4, dtype=np.float32).reshape(4, 1, 1, 1), np.arange(4, dtype=np.float32))
    net.forward()
    layer.load_state_dict({"pos": 2})
    net.forward()
    np.testing.assert_array_equal(net.blobs["data"].data.ravel(), [2, 3])
    assert layer.state_dict() == {"pos": 0}


def test_layers_declare_what_the_planner_needs():
    from minicaffe.layer import LAYERS, Layer, Scratch

    for cls in LAYERS.values():
        assert cls.backward_reads in ("bottom", "top", "both", "none"), cls
    caffe.set_random_seed(1)
    net = caffe.Net(os.path.join(ROOT, "nets", "lenet_train_test.prototxt"), caffe.TRAIN)
    net.layers[0].stop()
    conv, pool = net.layer_dict["conv2"], net.layer_dict["pool1"]
    assert [s.name for s in pool.scratch()] == ["mask"] and pool.scratch()[0].span == "layer"
    assert [s.name for s in conv.scratch()] == ["col", "out"]  # sized at reshape, so a plan made before a run sees them
    net.forward_backward()
    spans = {s.name: s.span for s in conv.scratch()}
    assert spans == {"col": "layer", "out": "call"}
    assert net.layer_dict["conv1"].scratch() == []  # one input channel: the CPU's direct kernel, no columns
    conv.recompute = True
    assert {s.name: s.span for s in conv.scratch()}["col"] == "call"
    s = conv.scratch()[0]
    assert isinstance(s, Scratch)
    flat = np.zeros_like(s.array)
    s.attach(flat)
    assert conv.scratch()[0].array is flat
    assert Layer.scratch(net.layer_dict["ip1"]) == []
