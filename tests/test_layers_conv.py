"""Convolution, Deconvolution, InnerProduct: forward against naive references, gradients, errors."""

import numpy as np
import pytest
from gradient_check import check_gradient
from layer_util import blob, forward, host, make_layer, run, setup

from minicaffe.errors import LayerError


def naive_conv(x, w, b, pad, stride, dil, group):
    """Direct convolution: an explicit loop over output positions (no im2col)."""
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    (ph, pw), (sh, sw), (dh, dw) = pad, stride, dil
    oh = (h + 2 * ph - (dh * (kh - 1) + 1)) // sh + 1
    ow = (wd + 2 * pw - (dw * (kw - 1) + 1)) // sw + 1
    xp = np.zeros((n, c, h + 2 * ph, wd + 2 * pw))
    xp[:, :, ph : ph + h, pw : pw + wd] = x
    y = np.zeros((n, m, oh, ow))
    mg = m // group
    for o in range(m):
        g = o // mg
        for i in range(oh):
            for j in range(ow):
                patch = xp[
                    :,
                    g * cg : (g + 1) * cg,
                    i * sh : i * sh + dh * (kh - 1) + 1 : dh,
                    j * sw : j * sw + dw * (kw - 1) + 1 : dw,
                ]
                y[:, o, i, j] = (patch * w[o]).sum(axis=(1, 2, 3))
        if b is not None:
            y[:, o] += b[o]
    return y


def naive_deconv(x, w, b, pad, stride, dil, group):
    """Transposed convolution by scattering each input value's kernel (no col2im)."""
    n, c, h, wd = x.shape
    _, mg, kh, kw = w.shape
    (ph, pw), (sh, sw), (dh, dw) = pad, stride, dil
    oh = sh * (h - 1) + dh * (kh - 1) + 1 - 2 * ph
    ow = sw * (wd - 1) + dw * (kw - 1) + 1 - 2 * pw
    full = np.zeros((n, mg * group, oh + 2 * ph, ow + 2 * pw))
    cg = c // group
    for ci in range(c):
        g = ci // cg
        for i in range(h):
            for j in range(wd):
                full[
                    :,
                    g * mg : (g + 1) * mg,
                    i * sh : i * sh + dh * (kh - 1) + 1 : dh,
                    j * sw : j * sw + dw * (kw - 1) + 1 : dw,
                ] += x[:, ci, i, j][:, None, None, None] * w[ci][None]
    y = full[:, :, ph : ph + oh, pw : pw + ow]
    if b is not None:
        y = y + b[None, :, None, None]
    return y


CONV_CASES = [
    # (N, C, H, W), num_output, geometry text, (pad), (stride), (dil), group, bias
    ((2, 3, 7, 6), 4, "kernel_size: 3", (0, 0), (1, 1), (1, 1), 1, True),
    ((1, 2, 5, 5), 3, "kernel_size: 3 pad: 1", (1, 1), (1, 1), (1, 1), 1, True),
    ((3, 4, 9, 7), 6, "kernel_size: 3 stride: 2 pad: 1", (1, 1), (2, 2), (1, 1), 2, False),
    ((2, 2, 9, 8), 2, "kernel_size: 3 dilation: 2", (0, 0), (1, 1), (2, 2), 1, True),
    (
        (2, 3, 7, 9),
        5,
        "kernel_h: 3 kernel_w: 2 pad_h: 1 pad_w: 0 stride_h: 2 stride_w: 1",
        (1, 0),
        (2, 1),
        (1, 1),
        1,
        True,
    ),
    (
        (1, 6, 5, 6),
        3,
        "kernel_size: 2 kernel_size: 3 pad: 0 pad: 1 stride: 1 stride: 2",
        (0, 1),
        (1, 2),
        (1, 1),
        3,
        True,
    ),
    ((3, 1, 6, 5), 2, "kernel_size: 1", (0, 0), (1, 1), (1, 1), 1, False),
    ((1, 4, 5, 3), 6, "kernel_size: 1", (0, 0), (1, 1), (1, 1), 2, True),  # one image: the image is col
    ((1, 3, 4, 5), 2, "kernel_size: 1 pad: 1 stride: 2", (1, 1), (2, 2), (1, 1), 1, True),
    # 16 x 3 x 3 = 144 taps at stride 1: more than the CPU's direct kernel takes, so im2col + GEMM
    ((2, 16, 5, 6), 3, "kernel_size: 3 pad: 1", (1, 1), (1, 1), (1, 1), 1, True),
]


def conv_text(num_output, geom, group, bias, kind="Convolution"):
    return (
        f'type: "{kind}" convolution_param {{ num_output: {num_output} {geom} group: {group} '
        f'bias_term: {"true" if bias else "false"} weight_filler {{ type: "gaussian" std: 0.5 }} '
        f'bias_filler {{ type: "uniform" min: -1 max: 1 }} }}'
    )


@pytest.mark.parametrize("case", CONV_CASES, ids=[c[2] for c in CONV_CASES])
def test_convolution_forward_matches_direct_convolution(backend, rng, case):
    shape, m, geom, pad, stride, dil, group, bias = case
    x = rng.standard_normal(shape)
    layer, bottoms, tops, (y,) = run(conv_text(m, geom, group, bias), backend, [x])
    w = host(backend, layer.blobs[0].data)
    b = host(backend, layer.blobs[1].data) if bias else None
    assert w.shape == (m, shape[1] // group) + w.shape[2:]
    np.testing.assert_allclose(y, naive_conv(x, w, b, pad, stride, dil, group), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("case", CONV_CASES[:6], ids=[c[2] for c in CONV_CASES[:6]])
def test_convolution_gradient(backend, rng, case):
    shape, m, geom, pad, stride, dil, group, bias = case
    shape = (min(shape[0], 2),) + shape[1:]
    layer, bottoms, tops, _ = run(conv_text(m, geom, group, bias), backend, [rng.standard_normal(shape)])
    check_gradient(layer, bottoms, tops, max_per_blob=40)


def test_convolution_float32_matches_float64(backend, rng):
    x = rng.standard_normal((2, 3, 8, 7))
    l64, _, _, (y64,) = run(conv_text(4, "kernel_size: 3 pad: 1 stride: 2", 1, True), backend, [x])
    l32 = make_layer(conv_text(4, "kernel_size: 3 pad: 1 stride: 2", 1, True), backend, dtype=np.float32)
    b32 = [blob(backend, x, np.float32)]
    t32 = setup(l32, b32, 1, np.float32)
    for p32, p64 in zip(l32.blobs, l64.blobs):
        p32.data[...] = p64.data.astype(np.float32)
    (y32,) = forward(l32, b32, t32)
    assert y32.dtype == np.float32
    np.testing.assert_allclose(y32, y64, rtol=1e-4, atol=1e-4)


def test_convolution_multiple_bottoms_and_chunked_batch(backend, rng, monkeypatch):
    """Two bottom/top pairs share the weights; a tiny COL_LIMIT forces per-image chunks."""
    import minicaffe.layers.convolution as conv_mod

    text = conv_text(3, "kernel_size: 3 pad: 1", 1, True)
    xa, xb = rng.standard_normal((3, 2, 5, 4)), rng.standard_normal((3, 2, 5, 4))
    ref, _, _, (ya,) = run(text, backend, [xa])
    layer = make_layer(text, backend)
    bottoms = [blob(backend, xa), blob(backend, xb)]
    tops = setup(layer, bottoms, 2)
    for p, q in zip(layer.blobs, ref.blobs):
        p.data[...] = q.data
    monkeypatch.setattr(conv_mod, "COL_LIMIT", 2 * 9 * 20)  # one image's columns
    y0, y1 = forward(layer, bottoms, tops)
    w, b = host(backend, layer.blobs[0].data), host(backend, layer.blobs[1].data)
    np.testing.assert_allclose(y0, naive_conv(xa, w, b, (1, 1), (1, 1), (1, 1), 1), atol=1e-10)
    np.testing.assert_allclose(y1, naive_conv(xb, w, b, (1, 1), (1, 1), (1, 1), 1), atol=1e-10)
    check_gradient(layer, bottoms, tops, max_per_blob=25)


def test_convolution_skips_work_it_is_not_asked_for(backend, rng):
    layer, bottoms, tops, _ = run(conv_text(2, "kernel_size: 3", 1, True), backend, [rng.standard_normal((2, 2, 5, 5))])
    tops[0].diff[...] = 1.0
    bottoms[0].diff[...] = 7.0
    layer.param_propagate_down = [False, True]
    layer.backward(tops, [False], bottoms)
    assert np.all(host(backend, bottoms[0].diff) == 7.0)
    assert np.all(host(backend, layer.blobs[0].diff) == 0.0)
    np.testing.assert_allclose(host(backend, layer.blobs[1].diff), np.full(2, 2 * 9.0))


@pytest.mark.parametrize(
    "text, shape, message",
    [
        ("convolution_param { num_output: 4 kernel_size: 3 group: 2 }", (1, 3, 5, 5), "3 channels but group 2"),
        ("convolution_param { num_output: 3 kernel_size: 3 group: 2 }", (1, 4, 5, 5), "num_output 3 is not divisible"),
        ("convolution_param { num_output: 4 }", (1, 3, 5, 5), "kernel size is required"),
        ("convolution_param { num_output: 4 kernel_size: 3 kernel_h: 3 kernel_w: 3 }", (1, 3, 5, 5), "not both"),
        ("convolution_param { num_output: 4 kernel_size: 3 axis: 2 }", (1, 3, 5, 5), "only axis 1"),
        ("convolution_param { num_output: 4 kernel_size: 7 }", (1, 3, 5, 5), "smaller than the dilated kernel"),
        ("convolution_param { kernel_size: 3 }", (1, 3, 5, 5), "num_output"),
        ("convolution_param { num_output: 4 kernel_size: 3 }", (3, 5, 5), "4-d blobs"),
    ],
)
def test_convolution_errors_name_the_layer(backend, text, shape, message):
    layer = make_layer('name: "c1" type: "Convolution" ' + text, backend)
    with pytest.raises(LayerError, match=message) as info:
        setup(layer, [blob(backend, np.zeros(shape))])
    assert "c1" in str(info.value) and "Convolution" in str(info.value)


def test_convolution_rejects_reshaped_channels(backend):
    layer = make_layer('name: "c1" type: "Convolution" convolution_param { num_output: 2 kernel_size: 1 }', backend)
    bottoms = [blob(backend, np.zeros((1, 3, 4, 4)))]
    tops = setup(layer, bottoms)
    bottoms[0].reshape(1, 5, 4, 4)
    with pytest.raises(LayerError, match="5 channels"):
        layer.reshape(bottoms, tops)


# -- Deconvolution ----------------------------------------------------------------------------------
DECONV_CASES = [
    ((2, 3, 4, 5), 2, "kernel_size: 3", (0, 0), (1, 1), (1, 1), 1, True),
    ((1, 4, 3, 4), 6, "kernel_size: 4 stride: 2 pad: 1", (1, 1), (2, 2), (1, 1), 2, True),
    ((2, 2, 3, 3), 3, "kernel_h: 3 kernel_w: 2 stride_h: 2 stride_w: 1 dilation: 2", (0, 0), (2, 1), (2, 2), 1, False),
]


@pytest.mark.parametrize("case", DECONV_CASES, ids=[c[2] for c in DECONV_CASES])
def test_deconvolution_forward_and_gradient(backend, rng, case):
    shape, m, geom, pad, stride, dil, group, bias = case
    x = rng.standard_normal(shape)
    layer, bottoms, tops, (y,) = run(conv_text(m, geom, group, bias, "Deconvolution"), backend, [x])
    w = host(backend, layer.blobs[0].data)
    b = host(backend, layer.blobs[1].data) if bias else None
    assert w.shape[:2] == (shape[1], m // group)
    np.testing.assert_allclose(y, naive_deconv(x, w, b, pad, stride, dil, group), rtol=1e-10, atol=1e-10)
    check_gradient(layer, bottoms, tops, max_per_blob=30)


def test_deconvolution_bilinear_upsampling(backend):
    """The classic FCN upsampler: a bilinear-filled, grouped, stride-2 deconvolution."""
    text = (
        'type: "Deconvolution" convolution_param { num_output: 2 group: 2 kernel_size: 4 stride: 2 '
        'pad: 1 bias_term: false weight_filler { type: "bilinear" } }'
    )
    x = np.ones((1, 2, 3, 3))
    _, _, _, (y,) = run(text, backend, [x])
    assert y.shape == (1, 2, 6, 6)
    np.testing.assert_allclose(y[:, :, 1:-1, 1:-1], 1.0)  # a constant stays constant inside


# -- InnerProduct -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "shape, axis, transpose, bias",
    [
        ((3, 2, 3, 2), 1, False, True),
        ((5, 7), 1, True, True),
        ((2, 3, 5), 2, False, False),
        ((2, 3, 5), -1, True, False),
    ],
)
def test_inner_product(backend, rng, shape, axis, transpose, bias):
    text = (
        f'type: "InnerProduct" inner_product_param {{ num_output: 3 axis: {axis} '
        f"transpose: {str(transpose).lower()} bias_term: {str(bias).lower()} "
        f'weight_filler {{ type: "gaussian" }} bias_filler {{ type: "gaussian" }} }}'
    )
    x = rng.standard_normal(shape)
    layer, bottoms, tops, (y,) = run(text, backend, [x])
    a = axis % len(shape)
    x2 = x.reshape(int(np.prod(shape[:a])), -1)
    w = host(backend, layer.blobs[0].data)
    ref = x2 @ (w if transpose else w.T)
    if bias:
        ref = ref + host(backend, layer.blobs[1].data)
    assert y.shape == tuple(shape[:a]) + (3,)
    np.testing.assert_allclose(y.reshape(ref.shape), ref, rtol=1e-12, atol=1e-12)
    check_gradient(layer, bottoms, tops)


def test_inner_product_rejects_a_changed_input_size(backend):
    layer = make_layer('name: "ip" type: "InnerProduct" inner_product_param { num_output: 2 }', backend)
    bottoms = [blob(backend, np.zeros((2, 3, 4)))]
    tops = setup(layer, bottoms)
    bottoms[0].reshape(2, 5)
    with pytest.raises(LayerError, match=r"ip.*\(2,5\) has 5 inputs.*expect 12"):
        layer.reshape(bottoms, tops)


# -- random geometry (hypothesis): odd sizes, padding, stride, dilation, groups ----------------------
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st


@st.composite
def conv_geometry(draw):
    group = draw(st.sampled_from([1, 1, 2, 3]))
    c = group * draw(st.integers(1, 2))
    m = group * draw(st.integers(1, 2))
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    ph, pw = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    h = draw(st.integers(max(1, dh * (kh - 1) + 1 - 2 * ph), 9))
    w = draw(st.integers(max(1, dw * (kw - 1) + 1 - 2 * pw), 9))
    n = draw(st.integers(1, 3))
    return (n, c, h, w), m, group, (kh, kw), (ph, pw), (sh, sw), (dh, dw), draw(st.booleans())


@settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(geom=conv_geometry())
def test_convolution_random_geometry(backend, geom):
    shape, m, group, (kh, kw), (ph, pw), (sh, sw), (dh, dw), bias = geom
    text = (
        f"kernel_h: {kh} kernel_w: {kw} pad_h: {ph} pad_w: {pw} stride_h: {sh} stride_w: {sw} "
        f"dilation: {dh} dilation: {dw}"
    )
    x = np.random.default_rng(sum(shape)).standard_normal(shape)
    layer, bottoms, tops, (y,) = run(conv_text(m, text, group, bias), backend, [x])
    w = host(backend, layer.blobs[0].data)
    b = host(backend, layer.blobs[1].data) if bias else None
    np.testing.assert_allclose(y, naive_conv(x, w, b, (ph, pw), (sh, sw), (dh, dw), group), rtol=1e-10, atol=1e-10)
    check_gradient(layer, bottoms, tops, max_per_blob=12)
