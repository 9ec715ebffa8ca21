"""The exercises' checks, one section per lesson (run them with ``python -m tutorials.check``).

Each check gets the student's module (``tutorials/exercises/exNN.py``) or the reference solution
and raises AssertionError with a message that says what is wrong.
"""

import numpy as np

#: "NN.k" -> (title, function(module))
CHECKS = {}


def check(ex_id, title):
    def register(fn):
        CHECKS[ex_id] = (title, fn)
        return fn

    return register


def close(got, want, what, rtol=1e-5, atol=1e-6):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    if not np.allclose(got, want, rtol=rtol, atol=atol):
        i = np.unravel_index(np.argmax(np.abs(got - want)), got.shape)
        raise AssertionError(f"{what}: at index {i} got {got[i]!r}, expected {want[i]!r} (rtol {rtol}, atol {atol})")


# -- lesson 1: blobs and one layer -------------------------------------------------------------
def _layer(text, bottoms_shapes, dtype=np.float64):
    import minicaffe as caffe
    from minicaffe import proto
    from minicaffe.blob import Blob
    from minicaffe.layer import create_layer

    layer = create_layer(proto.parse(text, "LayerParameter"), caffe.backend.get("cpu"), dtype=dtype)
    bottoms = [Blob(s, dtype=dtype) for s in bottoms_shapes]
    tops = [Blob(dtype=dtype)]
    return layer, bottoms, tops


@check("01.1", "inner_product_backward matches minicaffe's InnerProduct layer")
def _(mod):
    rng = np.random.default_rng(1)
    for m, k, n in [(1, 1, 1), (3, 5, 2), (7, 4, 9)]:
        layer, (x,), (y,) = _layer(
            f'name: "ip" type: "InnerProduct" inner_product_param {{ num_output: {n} }}', [(m, k)]
        )
        layer.setup([x], [y])
        x.data[...] = rng.standard_normal(x.shape)
        layer.blobs[0].data[...] = rng.standard_normal(layer.blobs[0].shape)
        layer.forward([x], [y])
        y.diff[...] = rng.standard_normal(y.shape)
        for p in layer.blobs:
            p.diff[...] = 0
        layer.backward([y], [True], [x])
        dx, dw, db = mod.inner_product_backward(x.data.copy(), layer.blobs[0].data.copy(), y.diff.copy())
        close(dx, x.diff, f"dx for M={m} K={k} N={n}")
        close(dw, layer.blobs[0].diff, f"dw for M={m} K={k} N={n}")
        close(db, layer.blobs[1].diff, f"db for M={m} K={k} N={n}")


@check("01.2", "numeric_gradient and relative_error")
def _(mod):
    v = np.array([[0.5, -1.0, 2.0], [3.0, 0.1, -0.7]])
    before = v.copy()
    got = mod.numeric_gradient(lambda: float((v**3).sum() + np.sin(v).sum()), v, 1e-5)
    assert np.array_equal(v, before), "numeric_gradient must leave v as it found it"
    close(got, 3 * v**2 + np.cos(v), "gradient of sum(v^3 + sin v)", rtol=1e-6, atol=1e-7)
    close(mod.relative_error([1.0, 100.0, 0.0], [1.5, 101.0, 1e-3]), [0.5 / 1.5, 1 / 101, 1e-3], "relative_error")


# -- lesson 2: nets from prototxt ---------------------------------------------------------------
_SPLIT_NETS = [
    """input: "x" input_shape { dim: 2 dim: 3 }
    layer { name: "a" type: "ReLU" bottom: "x" top: "y" }
    layer { name: "b" type: "ReLU" bottom: "y" top: "y" }
    layer { name: "c" type: "Sigmoid" bottom: "y" top: "c" }
    layer { name: "d" type: "TanH" bottom: "y" top: "d" }
    layer { name: "e" type: "Eltwise" bottom: "x" bottom: "c" bottom: "d" top: "e" }""",
    """input: "x" input_shape { dim: 2 dim: 3 }
    layer { name: "a" type: "ReLU" bottom: "x" top: "a" }
    layer { name: "b" type: "Eltwise" bottom: "a" bottom: "a" top: "b" }
    layer { name: "c" type: "ReLU" bottom: "b" top: "c" }""",
    """input: "x" input_shape { dim: 2 dim: 3 }
    layer { name: "a" type: "ReLU" bottom: "x" top: "a" }
    layer { name: "b" type: "ReLU" bottom: "a" top: "b" }""",
    """input: "data" input_shape { dim: 4 dim: 1 dim: 12 dim: 12 }
    input: "label" input_shape { dim: 4 }
    layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1" convolution_param { num_output: 2 kernel_size: 5 } }
    layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
    layer { name: "ip" type: "InnerProduct" bottom: "conv1" top: "ip" inner_product_param { num_output: 3 } }
    layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
    layer { name: "acc" type: "Accuracy" bottom: "ip" bottom: "label" top: "acc" include { phase: TEST } }
    layer { name: "acc5" type: "Accuracy" bottom: "ip" bottom: "label" top: "acc5" include { phase: TRAIN } }""",
]


@check("02.1", "split_plan predicts the Split layers the Net inserts")
def _(mod):
    import minicaffe as caffe
    from minicaffe import proto
    from minicaffe.net import filter_layers

    for text in _SPLIT_NETS:
        param = proto.parse(text, "NetParameter")
        net = caffe.Net(param, caffe.TEST)
        layers = [("input", [], list(param.input))]
        layers += [(lp.name, list(lp.bottom), list(lp.top)) for lp in filter_layers(list(param.layer), caffe.TEST)]
        want, order = {}, list(net.layer_dict)
        for i, (name, layer) in enumerate(net.layer_dict.items()):
            if layer.type == "Split":
                blob = net.bottom_names[name][0]
                producer = next(n for n in reversed(order[:i]) if blob in net.top_names[n])
                want[(producer, blob)] = len(net.top_names[name])
        got = mod.split_plan(layers)
        assert got == want, f"for the net\n{text}\nexpected {want}, got {got}"


@check("02.2", "SIAMESE_MLP builds a two-tower net with shared weights")
def _(mod):
    import minicaffe as caffe
    from minicaffe import proto

    net = caffe.Net(proto.parse(mod.SIAMESE_MLP, "NetParameter"), caffe.TRAIN)
    ips = [(n, l) for n, l in net.layer_dict.items() if l.type == "InnerProduct"]
    assert len(ips) == 2, f"expected two InnerProduct layers, found {[n for n, _ in ips]}"
    (na, la), (nb, lb) = ips
    for n, l in ips:
        assert l.blobs[0].shape == (16, 8), f"{n}: weights {l.blobs[0].shape}, expected (16, 8)"
    assert np.shares_memory(la.blobs[0].data, lb.blobs[0].data), f"{na} and {nb} do not share weights"
    assert len(la.blobs) == 2 and np.shares_memory(la.blobs[1].data, lb.blobs[1].data), (
        f"{na} and {nb} do not share the bias"
    )
    assert sum(1 for l in net.layers if l.type == "ReLU") == 2, "each tower needs a ReLU"
    assert any(l.type == "EuclideanLoss" for l in net.layers), "the net needs an EuclideanLoss"
    x = np.random.default_rng(0).standard_normal((2, 8))
    out = net.forward(a=x, b=x)
    assert float(out[net.outputs[0]]) == 0.0, "the same input through shared towers must give distance 0"
    out = net.forward(a=x, b=-x)
    assert float(out[net.outputs[0]]) > 0.0, "different inputs should give a positive distance"


# -- lesson 3: convolution as im2col + GEMM ------------------------------------------------------
_GEOMS = [(1, 4, 4, 3, 1, 0), (2, 5, 7, 3, 2, 1), (3, 6, 5, 2, 1, 1), (1, 9, 9, 5, 3, 2)]  # C, H, W, k, stride, pad


@check("03.1", "im2col_strided matches kernels.im2col's reference")
def _(mod):
    from kernels.im2col import im2col_reference

    rng = np.random.default_rng(3)
    for C, H, W, k, s, p in _GEOMS:
        x = rng.standard_normal((C, H, W))
        got = mod.im2col_strided(x, k, s, p)
        close(
            got, im2col_reference(x[None], k, k, p, p, s, s, 1, 1), f"im2col of x {x.shape}, k={k}, stride={s}, pad={p}"
        )


@check("03.2", "conv_by_gemm matches the definition of convolution")
def _(mod):
    from kernels.conv import conv_fwd_reference

    rng = np.random.default_rng(4)
    for C, H, W, k, s, p in _GEOMS:
        x = rng.standard_normal((2, C, H, W))
        w = rng.standard_normal((3, C, k, k))
        b = rng.standard_normal(3)
        got = mod.conv_by_gemm(x, w, b, s, p)
        close(
            got,
            conv_fwd_reference(x, w, b, p, p, s, s, 1, 1),
            f"conv of x {x.shape}, w {w.shape}, stride={s}, pad={p}",
            atol=1e-5,
        )


# -- lesson 4: the GEMM ladder ---------------------------------------------------------------------
@check("04.1", "matmul_ikj multiplies (any shapes, float32)")
def _(mod):
    rng = np.random.default_rng(5)
    for m, k, n in [(1, 1, 1), (3, 5, 2), (17, 9, 33), (64, 64, 64)]:
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        got = mod.matmul_ikj(a, b)
        assert got.dtype == np.float32, f"the result should be float32, got {got.dtype}"
        close(got, a.astype(np.float64) @ b, f"matmul_ikj of {a.shape} @ {b.shape}", rtol=1e-4, atol=1e-4)
    assert hasattr(mod.matmul_ikj, "py_func"), "decorate matmul_ikj with @numba.njit"


@check("04.2", "gemm_intensity and roofline")
def _(mod):
    close(mod.gemm_intensity(2, 2, 3), 24 / (4 * (6 + 6 + 4)), "gemm_intensity(2, 2, 3)")
    close(mod.gemm_intensity(1024, 1024, 1024), 1024 / 6, "gemm_intensity(1024, 1024, 1024)")
    close(
        mod.gemm_intensity(1, 4096, 4096),
        2 * 4096 * 4096 / (4 * (4096 + 4096 * 4096 + 4096)),
        "a matrix-vector product",
    )
    close(mod.roofline(0.25, 100e9, 20e9), 5e9, "roofline below the ridge")
    close(mod.roofline(50.0, 100e9, 20e9), 100e9, "roofline above the ridge")


# -- lesson 7: training LeNet ----------------------------------------------------------------------
@check("07.1", "learning_rate agrees with minicaffe's lr policies")
def _(mod):
    from minicaffe import proto
    from minicaffe.solvers import lr_policy

    cases = {
        "fixed": {},
        "step": {"gamma": 0.1, "stepsize": 300},
        "exp": {"gamma": 0.999},
        "inv": {"gamma": 1e-4, "power": 0.75},
        "poly": {"power": 0.5, "max_iter": 1000},
    }
    for policy, kw in cases.items():
        text = f'base_lr: 0.01 lr_policy: "{policy}" ' + " ".join(f"{k}: {v}" for k, v in kw.items())
        p = proto.parse(text, "SolverParameter")
        for it in (0, 1, 299, 300, 301, 999):
            want = lr_policy.learning_rate(p, it)
            got = mod.learning_rate(policy, 0.01, it, **kw)
            close(got, want, f"{policy} {kw} at iteration {it}", rtol=1e-9, atol=0)


@check("07.2", "sgd_momentum_step is Caffe's update")
def _(mod):
    def sgd_momentum_update_reference(w, g, h, lr, m, wd):  # Caffe: Regularize, ComputeUpdateValue, Update
        h_new = m * h + lr * (g + wd * w)
        return w - h_new, h_new

    rng = np.random.default_rng(7)
    w, g, h = (rng.standard_normal(50) for _ in range(3))
    saved = [a.copy() for a in (w, g, h)]
    for lr, m, wd in [(0.01, 0.9, 5e-4), (0.1, 0.0, 0.0), (1.0, 0.5, 0.1)]:
        got_w, got_h = mod.sgd_momentum_step(w, g, h, lr, m, wd)
        want_w, want_h = sgd_momentum_update_reference(w, g, h, lr, m, wd)
        close(got_w, want_w, f"new w (lr {lr}, momentum {m}, decay {wd})")
        close(got_h, want_h, f"new h (lr {lr}, momentum {m}, decay {wd})")
    assert all(np.array_equal(a, b) for a, b in zip((w, g, h), saved)), "the inputs must not be modified"


# -- lesson 5: memory-bound kernels -----------------------------------------------------------------
@check("05.1", "softmax_rows is right and does not overflow")
def _(mod):
    from kernels import softmax

    rng = np.random.default_rng(8)
    for x in (rng.standard_normal((4, 10)), rng.standard_normal((3, 7)).astype(np.float32) * 5):
        close(
            mod.softmax_rows(x.copy()),
            softmax.REFERENCES["softmax_fwd"](x[:, :, None])[:, :, 0],
            f"softmax of {x.shape}",
            rtol=1e-5,
        )
    big = np.array([[1000.0, 1001.0, 999.0], [-1000.0, -1000.0, -1000.0]], np.float32)
    with np.errstate(over="raise", invalid="raise"):
        got = mod.softmax_rows(big)
    assert got.dtype == np.float32, f"float32 in should give float32 out, got {got.dtype}"
    close(got, softmax.REFERENCES["softmax_fwd"](big[:, :, None])[:, :, 0], "softmax of scores near 1000", rtol=1e-5)


@check("05.2", "max_pool_2x2 matches kernels.pooling's reference, mask included")
def _(mod):
    import inspect

    from kernels import pooling

    rng = np.random.default_rng(9)
    for shape in [(1, 1, 2, 2), (2, 3, 4, 6), (3, 2, 8, 8)]:
        x = rng.standard_normal(shape).astype(np.float32)
        x[0, 0, 0, :2] = x[0, 0, 1, :2] = 5.0  # a tie: the first in row-major order wins
        y, mask = mod.max_pool_2x2(x)
        ry, rmask = pooling.REFERENCES["max_pool_fwd"](x, 2, 2, 2, 2, 0, 0, shape[2] // 2, shape[3] // 2)
        close(y, ry, f"y of {shape}")
        assert np.array_equal(mask, rmask), f"mask of {shape}: got\n{mask[0, 0]}\nexpected\n{rmask[0, 0]}"
    src = inspect.getsource(mod.max_pool_2x2)
    assert src.count("for ") <= 1, "use reshapes, not loops over pixels"


# -- lesson 6: GPU kernels in the simulator -------------------------------------------------------
def _kernel(mod, name):
    k = getattr(mod, name)
    if not hasattr(k, "__getitem__"):
        import inspect

        k(*([None] * len(inspect.signature(k).parameters)))  # a stub raises NotImplementedError here
        raise AssertionError(f"{name} must be a CUDA kernel: decorate it with @cuda.jit")
    return k


@check("06.1", "scale_kernel covers every element for any launch size")
def _(mod):
    k = _kernel(mod, "scale_kernel")
    x = np.arange(37, dtype=np.float32)
    for blocks, threads in [(1, 1), (2, 3), (3, 4), (5, 8), (20, 2)]:
        out = np.full_like(x, np.nan)
        k[blocks, threads](x, np.float32(2.5), out)
        close(out, 2.5 * x, f"scale_kernel[{blocks}, {threads}] on 37 elements")


@check("06.2", "block_max reduces any length with one block of 8 threads")
def _(mod):
    k = _kernel(mod, "block_max")
    rng = np.random.default_rng(6)
    for n in (1, 5, 8, 29):
        x = rng.standard_normal(n).astype(np.float32) - 10.0
        out = np.zeros(1, np.float32)
        k[1, 8](x, out)
        close(out[0], x.max(), f"block_max of {n} numbers (all negative)")


# -- lesson 8: the memory arena ------------------------------------------------------------------------
def _random_lifetimes(rng, n, steps):
    sizes = [int(s) for s in rng.integers(1, 20, n) * 64]
    intervals = []
    for _ in range(n):
        a = int(rng.integers(0, steps))
        intervals.append((a, int(rng.integers(a, steps))))
    return sizes, intervals


@check("08.1", "place_first_fit never overlaps two live buffers and packs like the planner")
def _(mod):
    from minicaffe import memory

    rng = np.random.default_rng(8)
    cases = [([400, 800, 800, 800, 800], [(0, 5), (0, 4), (1, 3), (3, 4), (4, 5)])]
    cases += [_random_lifetimes(rng, n, 12) for n in (1, 3, 8, 20, 40)]
    for sizes, intervals in cases:
        offs = mod.place_first_fit(sizes, intervals)
        assert len(offs) == len(sizes), f"one offset per buffer: got {len(offs)} for {len(sizes)}"
        for i in range(len(sizes)):
            assert offs[i] >= 0, f"buffer {i} at a negative offset {offs[i]}"
            for j in range(i):
                live = intervals[i][0] <= intervals[j][1] and intervals[j][0] <= intervals[i][1]
                apart = offs[i] + sizes[i] <= offs[j] or offs[j] + sizes[j] <= offs[i]
                assert not live or apart, (
                    f"buffers {j} {intervals[j]} and {i} {intervals[i]} are live together and overlap"
                )
        bufs = [
            memory.Buffer(str(i), "x", s // 4, np.float32, [iv], None)
            for i, (s, iv) in enumerate(zip(sizes, intervals))
        ]
        want = memory.place(bufs, align=64)
        got = max(o + s for o, s in zip(offs, sizes))
        assert got <= want, f"your arena takes {got} bytes, first fit by size takes {want}"


@check("08.2", "peak_live is the most bytes live at one step")
def _(mod):
    from minicaffe import memory

    rng = np.random.default_rng(9)
    for n in (1, 5, 30):
        sizes, intervals = _random_lifetimes(rng, n, 10)
        bufs = [
            memory.Buffer(str(i), "x", s // 4, np.float32, [iv], None)
            for i, (s, iv) in enumerate(zip(sizes, intervals))
        ]
        want = memory.peak_bytes(bufs, 10)
        got = mod.peak_live(sizes, intervals, 10)
        assert got == want, f"{n} buffers: got {got}, expected {want}"


# -- lesson 9: SingleCaffe --------------------------------------------------------------------------------
@check("09.1", "may_start (BSP and SSP) and shard_bounds agree with the runtime")
def _(mod):
    from minicaffe.parallel import shard_bounds

    for clock, applied, s, want in [
        (0, 0, 0, True),
        (1, 0, 0, False),
        (1, 1, 0, True),
        (3, 1, 2, True),
        (4, 1, 2, False),
        (5, 5, 3, True),
    ]:
        got = mod.may_start(clock, applied, s)
        assert bool(got) == want, f"may_start(clock={clock}, applied={applied}, staleness={s}) = {got}, expected {want}"
    for batch, n in [(64, 1), (64, 2), (10, 3), (7, 7), (100, 8)]:
        got = [tuple(int(v) for v in b) for b in mod.shard_bounds(batch, n)]
        assert got == shard_bounds(batch, n), f"shard_bounds({batch}, {n}) = {got}, expected {shard_bounds(batch, n)}"


@check("09.2", "reduce_gradients gives the whole batch's gradient")
def _(mod):
    rng = np.random.default_rng(10)
    X = rng.standard_normal((10, 3))
    y = rng.standard_normal(10)
    w = rng.standard_normal(3)

    def grad(rows):  # mean squared error's gradient over some rows
        Xs, ys = X[rows], y[rows]
        return Xs.T @ (Xs @ w - ys) / len(ys)

    for bounds in ([(0, 10)], [(0, 5), (5, 10)], [(0, 4), (4, 7), (7, 10)], [(0, 1), (1, 10)]):
        grads = [grad(slice(lo, hi)) for lo, hi in bounds]
        sizes = [hi - lo for lo, hi in bounds]
        close(mod.reduce_gradients(grads, sizes), grad(slice(0, 10)), f"shards {bounds}")


# -- lesson 10: sockets --------------------------------------------------------------------------------
@check("10.1", "recv_exactly survives partial reads and reports a closed peer")
def _(mod):
    import socket
    import threading

    data = bytes(range(256)) * 40
    a, b = socket.socketpair()
    try:

        def trickle():  # many small sends: the receiver sees partial reads
            for i in range(0, len(data), 97):
                a.sendall(data[i : i + 97])

        t = threading.Thread(target=trickle, daemon=True)
        t.start()
        got = mod.recv_exactly(b, 5000)
        rest = mod.recv_exactly(b, len(data) - 5000)
        t.join(10)
        assert bytes(got) == data[:5000] and bytes(rest) == data[5000:], "the bytes differ from what was sent"
        a.sendall(b"abc")
        a.close()
        try:
            mod.recv_exactly(b, 10)
        except ConnectionError:
            pass
        else:
            raise AssertionError("a peer that closes after 3 of 10 bytes must raise ConnectionError")
    finally:
        a.close()
        b.close()


@check("10.2", "ps_bytes_per_clock follows the sharded server's rule")
def _(mod):
    counts = [500, 20, 25000, 50, 400000, 500, 5000, 10]  # LeNet's blobs
    for P, want in [(2, 2 * 4 * sum(counts) * 1 / 2), (4, 2 * 4 * sum(counts) * 3 / 4), (1, 0.0)]:
        close(mod.ps_bytes_per_clock(counts, P), want, f"LeNet's blobs over {P} nodes", rtol=1e-6)


# -- lesson 11: Poseidon ----------------------------------------------------------------------------------
@check("11.1", "choose agrees with minicaffe.dist.cost's rule")
def _(mod):
    from minicaffe.dist import cost

    for m, n, k in [(500, 800, 64), (10, 500, 64), (4096, 9216, 32), (1000, 4096, 256), (3, 3, 1)]:
        for P in (1, 2, 3, 4, 8, 9, 10, 16, 32):
            want = "sfb" if cost.sfb_floats(k, m, n, P) <= cost.ps_floats(m, n, P, P) else "ps"
            got = mod.choose(m, n, k, P)
            assert got == want, f"choose(m={m}, n={n}, k={k}, P={P}) = {got!r}, expected {want!r}"


@check("11.2", "sfb_gradient rebuilds the summed gradient (and uses one matrix product)")
def _(mod):
    import inspect

    rng = np.random.default_rng(11)
    for rows in ([3], [2, 5], [4, 4, 1]):
        us = [rng.standard_normal((r, 6)) for r in rows]
        vs = [rng.standard_normal((r, 7)) for r in rows]
        want = sum(np.einsum("ki,kj->ij", u, v) for u, v in zip(us, vs))
        close(mod.sfb_gradient(us, vs), want, f"factors of {len(rows)} nodes with rows {rows}")
    src = inspect.getsource(mod.sfb_gradient)
    assert "for " not in src, "one matrix product over the concatenated factors, no loop over nodes"


# -- lesson 12: scale on paper --------------------------------------------------------------------------
@check("12.1", "speedup is weak scaling, as the simulator computes it")
def _(mod):
    from minicaffe.dist import simulate

    layers = [
        simulate.Layer("a", 0.01, 0.02, count=10_000),
        simulate.Layer("b", 0.002, 0.004, count=2_000_000, m=1000, n=2000, k=32),
    ]
    link = simulate.Link(simulate.parse_rate("1gbit"), 1e-4)
    for P in (1, 2, 4, 8):
        want, r = simulate.speedup(layers, P, link, "ps", True)
        got = mod.speedup(simulate.one_node_time(layers), r.period, P)
        close(got, want, f"{P} nodes", rtol=1e-9)


@check("12.2", "sync_seconds agrees with the simulator's sync cost")
def _(mod):
    from minicaffe.dist import simulate

    lay = simulate.Layer("fc", 0.001, 0.002, count=4_000_000, m=1000, n=4000, k=32)
    for rate, lat, P in [("1gbit", 5e-5, 2), ("10gbit", 1e-4, 8), ("40gbit", 0.0, 16)]:
        link = simulate.Link(simulate.parse_rate(rate), lat)
        net_s, _, nbytes = simulate.sync_cost(lay, "ps", P, link)
        close(mod.sync_seconds(nbytes, 2, link.bandwidth, lat), net_s, f"PS sync over {rate}, {P} nodes", rtol=1e-9)
        net_s, _, nbytes = simulate.sync_cost(lay, "sfb", P, link)
        close(mod.sync_seconds(nbytes, 1, link.bandwidth, lat), net_s, f"SFB sync over {rate}, {P} nodes", rtol=1e-9)
