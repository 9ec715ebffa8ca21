"""Sufficient factors of a fully connected layer, and the gradient rebuilt from them.

An InnerProduct layer computes y = x W^T + b on a batch of K rows (``axis`` = 1; with a
larger axis the rows are every position before it). Its weight gradient is a sum of K outer
products::

    u = top diff     (K x M)          dW = u^T v = sum_i u_i v_i^T     (M x N)
    v = bottom data  (K x N)          db = sum_i u_i                   (M)

(``transpose: true`` stores W as N x M, so dW = v^T u.) A node that holds u and v of every
node can therefore rebuild the summed gradient itself with one GEMM over the concatenated
factors, ``[u_1; ...; u_P]^T [v_1; ...; v_P]``: that is sufficient factor broadcasting (SFB).
Sending u and v costs K (M + N) floats per peer; sending dW costs M N.

``FactorCapture`` records u and v through the net's declared after-backward hook (nothing in
the layer changes); ``rebuild`` writes the gradient from any number of nodes' factors.
"""

import numpy as np

from ..errors import LayerError


class SufficientFactors:
    """u (rows x M) and v (rows x N) of one layer, from one node (or several, concatenated)."""

    __slots__ = ("u", "v")

    def __init__(self, u, v):
        if u.ndim != 2 or v.ndim != 2 or u.shape[0] != v.shape[0]:
            raise ValueError(f"sufficient factors need u (K x M) and v (K x N), got {u.shape} and {v.shape}")
        self.u, self.v = u, v

    @property
    def rows(self):
        return self.u.shape[0]

    @property
    def floats(self):
        return self.u.size + self.v.size

    @staticmethod
    def concatenate(parts):
        """The factors of several nodes as one (sum_p K_p rows): the rebuild is then one GEMM."""
        parts = list(parts)
        if len(parts) == 1:
            return parts[0]
        return SufficientFactors(np.concatenate([p.u for p in parts]), np.concatenate([p.v for p in parts]))


def check_layer(net, i):
    """Raise LayerError unless layer i is an InnerProduct whose gradient SFB can rebuild."""
    layer = net.layers[i]
    if layer.type != "InnerProduct":
        raise LayerError(
            layer.name, layer.type, "sufficient factors exist for InnerProduct layers only; this layer uses PS"
        )
    if not net.layer_need_backward[i]:
        raise LayerError(layer.name, layer.type, "this layer runs no backward (not under a loss), so it has no factors")
    if len(layer.blobs) < 1 or not layer.param_propagate_down[0]:
        raise LayerError(layer.name, layer.type, "the weight does not learn (lr_mult 0): nothing to synchronize")


def factors_of(net, i, copy=True):
    """Layer i's current factors: u = top diff, v = bottom data, each read as (rows, features)."""
    layer = net.layers[i]
    m = int(layer.param.inner_product_param.num_output)
    top, bottom = net.top_vecs[i][0], net.bottom_vecs[i][0]
    rows = top.count // m
    n = bottom.count // rows
    to_host = net.backend.to_host
    u = np.asarray(to_host(top.diff)).reshape(rows, m)
    v = np.asarray(to_host(bottom.data)).reshape(rows, n)
    if copy:
        u, v = u.copy(), v.copy()
    return SufficientFactors(u, v)


def rebuild(factors, weight_grad, bias_grad=None, transpose=False, alpha=1.0, beta=0.0, gemm=None):
    """Write alpha * (the gradient of ``factors``) + beta * (what was there) into the arrays.

    ``weight_grad``: M x N (N x M with ``transpose``), ``bias_grad``: M or None. One GEMM for the
    weight over every row of every node, a column sum for the bias. ``gemm`` is a backend's
    ``gemm(trans_a, trans_b, alpha, a, b, beta, c)`` (numpy's matmul when None).
    """
    u, v = factors.u, factors.v
    m, n = u.shape[1], v.shape[1]
    want = (n, m) if transpose else (m, n)
    if tuple(weight_grad.shape) != want:
        raise ValueError(
            f"rebuild: factors u {u.shape}, v {v.shape} give a {want} gradient "
            f"({'transposed' if transpose else 'M x N'}), but the array given is {tuple(weight_grad.shape)}"
        )
    a, b = (v, u) if transpose else (u, v)
    if gemm is not None:
        gemm(True, False, alpha, a, b, beta, weight_grad)
    else:
        g = a.T @ b
        if beta == 0.0:
            np.multiply(g, alpha, out=weight_grad, casting="unsafe")
        else:
            weight_grad *= beta
            weight_grad += alpha * g
    if bias_grad is not None:
        s = u.sum(axis=0)
        if beta == 0.0:
            bias_grad[...] = alpha * s
        else:
            bias_grad *= beta
            bias_grad += alpha * s


def rebuild_sgd_step(a, b, w, h, momentum, lr, decay, gemm, sgd_step, tile):
    """SGD's step on the gradient a^T b, formed one tile of rows at a time and never stored whole.

    a: (rows K, R), b: (K, C), w and h: flat R x C (weight and momentum history, updated in
    place), ``tile``: a (T, C) buffer. For each block of T rows, one GEMM writes that block of
    a^T b into the tile (it stays in the cache) and ``sgd_step(w, g, h, momentum, lr, decay)``
    (h = m h + lr (g + decay w); w -= h) consumes it at once: the memory traffic is the
    update's own (w and h read and written), where rebuild() + an update would also write and
    read an R x C gradient. The same arithmetic as rebuild() followed by SGDSolver's update.
    """
    rows, cols = a.shape[1], b.shape[1]
    step = len(tile)
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        t = tile[: r1 - r0]
        gemm(True, False, 1.0, a[:, r0:r1], b, 0.0, t)
        lo, hi = r0 * cols, r1 * cols
        sgd_step(w[lo:hi], t.reshape(-1), h[lo:hi], momentum, lr, decay)


def tile_for(rows, cols, dtype, tile_bytes=1 << 21):
    """A tile of whole rows of about ``tile_bytes`` (2 MiB: in the L2/L3 cache) for rebuild_sgd_step."""
    return np.empty((max(1, min(rows, tile_bytes // (np.dtype(dtype).itemsize * cols))), cols), dtype)


def rebuild_into_layer(net, i, factors, alpha=1.0):
    """Overwrite layer i's parameter diffs with the gradient of ``factors`` (weight and bias)."""
    layer = net.layers[i]
    transpose = bool(layer.param.inner_product_param.transpose)
    w = layer.blobs[0]
    bias = layer.blobs[1].diff if len(layer.blobs) > 1 and layer.param_propagate_down[1] else None
    rebuild(factors, w.diff, bias, transpose=transpose, alpha=alpha, gemm=net.backend.gemm)


class FactorCapture:
    """Record the sufficient factors of chosen FC layers after each of their backward passes.

    ``capture = FactorCapture(net, [layer indices])``: registers one after-backward hook on the
    net; after ``net.backward()``, ``capture.take(i)`` returns layer i's factors (all the rows
    since the last take: with iter_size > 1 the accumulated passes are concatenated, just as the
    layer's own diff accumulates). ``on_factors(i, factors)``, when given, is called from the
    hook the moment a layer's factors exist (where WFBP starts sending them). ``close()``
    removes the hook.
    """

    def __init__(self, net, layers, on_factors=None):
        self.net = net
        self.layers = [net.layer_names.index(l) if isinstance(l, str) else int(l) for l in layers]
        for i in self.layers:
            check_layer(net, i)
        self.on_factors = on_factors
        self._pending = {i: [] for i in self.layers}
        self._handle = net.add_hooks(after_backward=self._after_backward)

    def _after_backward(self, i):
        if i in self._pending:
            f = factors_of(self.net, i)
            self._pending[i].append(f)
            if self.on_factors is not None:
                self.on_factors(i, f)

    def take(self, i):
        parts = self._pending[i]
        if not parts:
            layer = self.net.layers[i]
            raise LayerError(layer.name, layer.type, "no factors captured since the last take (run backward first)")
        self._pending[i] = []
        return SufficientFactors.concatenate(parts)

    def clear(self):
        for i in self._pending:
            self._pending[i] = []

    def close(self):
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
