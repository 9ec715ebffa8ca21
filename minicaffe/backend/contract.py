"""The backend contract, written once: every name a backend module provides, with its signature
and its meaning.  ``cpu``, ``cudasim`` and ``cuda`` each define exactly these (checked by
tests/test_backend_contract.py with ``check``), so a layer written against this file runs on
all of them, and "go to definition" on ``self.backend.gemm`` lands on a real function.

Conventions, for every kernel below (the kernel families in ``kernels/`` state them in full):
arrays are C-contiguous float32 or float64 of the backend's array module ``xp`` (numpy on cpu,
the simulator's device arrays on cudasim, CuPy on cuda; a GPU kernel refuses host arrays);
geometry arguments are Python ints; the output argument, always last, is written in place and never read unless said; bad shapes raise ValueError before any
write.  Kernels are serial and release the GIL (several worker threads may call them at once).

The functions here are the specification only: calling one raises NotImplementedError.
"""

import inspect

#: the attributes besides the functions
ATTRIBUTES = {
    "name": "the backend's name: 'cpu', 'cudasim' or 'cuda'",
    "xp": "the array module of its device arrays: numpy, simcupy or cupy (layers do array arithmetic with it)",
    "host_lanes": "True when its kernels run on the calling thread, on the host's cores (cpu): lanes "
    "(minicaffe/parallel) may then split a batch across threads; False on a GPU",
}
#: what the GPU backends add: the counted host<->device copies, read by the tests and tools
GPU_ATTRIBUTES = {
    "transfers": "host<->device copies made through to_host / from_host: counts and bytes, .reset()",
    "launches": "kernel launches: numba kernels by name, and (simulator) array operations and host syncs; .reset()",
    "capturing": "capturing(what): a context in which any host<->device copy or sync raises CaptureViolation",
    "capture": "capture(what): record the launches inside as a CUDA graph (real GPU only); yields .graph",
}


# -- the bus -------------------------------------------------------------------------------------
def to_host(a):
    """A numpy array holding device array ``a``: a copy on a GPU backend (counted), ``a``
    itself on cpu.  The one sanctioned way from the device to the host."""
    raise NotImplementedError


def from_host(a, dtype=None):
    """A device array holding host array ``a`` (cast to ``dtype`` if given): a new copy on a GPU
    backend (counted).  The one sanctioned way from the host to the device."""
    raise NotImplementedError


def synchronize():
    """Wait until every kernel launched so far has finished (timing; cpu: returns at once)."""
    raise NotImplementedError


def precompile(dtype):
    """Compile the engine's kernels for arrays of ``dtype`` now rather than at their first launch
    (a GPU backend: explicit signatures, once per dtype and process; a net calls it when it is
    built).  Returns how many were compiled; cpu: 0 (its kernels compile and cache on first use)."""
    raise NotImplementedError


# -- GEMM (kernels/gemm.py) ------------------------------------------------------------------------
def gemm(trans_a, trans_b, alpha, a, b, beta, c):
    """c = alpha op(a) @ op(b) + beta c, op = transpose when trans_*; op(a) (M, K), op(b) (K, N),
    c (M, N).  beta == 0: c is not read (NaN in c does not leak).  c may alias a or b."""
    raise NotImplementedError


# -- convolution's unrolling (kernels/im2col.py) -------------------------------------------------------
def im2col(x, kh, kw, ph, pw, sh, sw, dh, dw, col):
    """x (N, C, H, W) -> col (C*kh*kw, N*OH*OW): col[(c*kh + i)*kw + j, n*OH*OW + oh*OW + ow] =
    x[n, c, oh*sh - ph + i*dh, ow*sw - pw + j*dw], 0 outside the image."""
    raise NotImplementedError


def col2im(col, kh, kw, ph, pw, sh, sw, dh, dw, x):
    """The adjoint of im2col: x (OVERWRITTEN) = the sum of every column put back at its patch.
    On the CPU (``host_lanes``) ``col`` may also be ``rows.T``, the transpose of a C-contiguous
    (N*OH*OW, C*kh*kw) array, one row per output pixel (the Convolution layer's data gradient in
    that orientation, docs/KERNELS.md); im2col accepts that layout too."""
    raise NotImplementedError


def conv_direct(channels, kh, kw, sh, sw):
    """Whether this backend convolves ``channels`` input channels with a (kh, kw) kernel at stride
    (sh, sw) (one group) faster directly, without a column matrix, than by im2col + GEMM: then
    a Convolution layer runs ``conv_direct_fwd`` and ``conv_direct_bwd_filter`` for it.  A
    backend without direct kernels always says False (and never has them called)."""
    raise NotImplementedError


def conv_direct_fwd(x, w, bias, ph, pw, sh, sw, dh, dw, y):
    """y (N, M, OH, OW) = x (N, C, H, W) convolved with w (M, C, kh, kw), plus bias (M,) (size 0:
    none), with no column matrix.  Only for a geometry ``conv_direct`` accepts."""
    raise NotImplementedError


def conv_direct_bwd_filter(x, dy, ph, pw, sh, sw, dh, dw, dwt, db):
    """dwt (M, C, kh, kw) += the weight gradient and db (M,) += the bias gradient (size 0: none)
    of that convolution, from its input x and top diff dy, with no column matrix.  Only for a
    geometry ``conv_direct`` accepts."""
    raise NotImplementedError


# -- pooling (kernels/pooling.py) -------------------------------------------------------------------
def max_pool_fwd(x, kh, kw, sh, sw, ph, pw, y, mask):
    """x (N, C, H, W) -> y, mask (N, C, PH, PW); mask int32 = h*W + w of each window's maximum
    (ties: the first in row-major order); a window wholly in the padding: y = 0, mask = -1.
    PH, PW come from y's shape (Caffe's ceil rounding is the layer's job)."""
    raise NotImplementedError


def max_pool_bwd(dy, mask, kh, kw, sh, sw, ph, pw, dx):
    """dx (N, C, H, W, OVERWRITTEN) = the sum of dy at each window's maximum.  The geometry
    lets a GPU gather (one thread per input pixel over the windows covering it: deterministic,
    no atomics) instead of scattering; a CPU may use the mask alone."""
    raise NotImplementedError


def ave_pool_fwd(x, kh, kw, sh, sw, ph, pw, y):
    """y = each window's sum over the image divided by the window clipped to the padded image
    (Caffe's AVE divisor)."""
    raise NotImplementedError


def ave_pool_bwd(dy, kh, kw, sh, sw, ph, pw, dx):
    """dx (OVERWRITTEN) = dy / divisor spread over each window's part inside the image."""
    raise NotImplementedError


# -- softmax (kernels/softmax.py) -------------------------------------------------------------------------
def softmax_fwd(x, y):
    """x, y (outer, C, inner): y[o, :, k] = exp(x[o, :, k] - max) / sum."""
    raise NotImplementedError


def softmax_bwd(y, dy, dx):
    """dx = y * (dy - sum_c dy * y), y the forward output."""
    raise NotImplementedError


def softmax_loss_fwd(prob, label, ignore_label, has_ignore):
    """(loss_sum, count) as Python numbers: the sum over non-ignored positions of
    -log(max(prob[o, label, k], FLT_MIN)) and their number; label (outer*inner values, floats
    truncated to int).  A label outside [0, C) that is not ignored raises ValueError naming it
    and its position.  On a GPU: one counted 24-byte device->host copy."""
    raise NotImplementedError


def softmax_loss_bwd(prob, label, ignore_label, has_ignore, scale, dx):
    """dx = scale * (prob - onehot(label)), 0 at ignored positions.  ``scale``: a number, or the
    pair (top_diff, status) of 1-element and 4-element arrays of the backend's: then scale =
    top_diff[0] / status[3], read where the arrays live (no host round trip on a GPU)."""
    raise NotImplementedError


def softmax_xent_fwd(x, label, ignore_label, has_ignore, normalizer, prob, status, loss):
    """SoftmaxWithLoss's forward, fused, with nothing read by the host: prob = softmax(x) (x, prob
    (outer, C, inner)); status (4 float64) = [sum of -log(max(prob at the label, FLT_MIN)),
    count of non-ignored positions, first bad label's flat position (o*inner + k) or inf,
    normalizer used]; loss (1 value) = sum / normalizer, where ``normalizer`` <= 0 means the
    count (at least 1: Caffe's VALID); NaN if a label is bad (outside [0, C), not ignored).
    The caller reads status when it must know (a GPU: one small copy, when it chooses)."""
    raise NotImplementedError


def bias_bwd(dy, db, dout):
    """db (M,) += the sum of dy (N, M, S) over N and S (a bias gradient).  ``dout`` None, or an
    (M, N*S) array that receives dy transposed, dout[m, n*S + s] = dy[n, m, s], in the same pass."""
    raise NotImplementedError


# -- activations (kernels/elementwise.py): flat 1-d arrays, in place allowed ---------------------------
def relu_fwd(x, slope, y):
    """y = x if x > 0 else slope * x."""
    raise NotImplementedError


def relu_bwd(x, dy, slope, dx):
    """dx = dy * ((x > 0) + slope * (x <= 0))  (Caffe's formula)."""
    raise NotImplementedError


def sigmoid_fwd(x, y):
    """y = 1 / (1 + exp(-x))."""
    raise NotImplementedError


def sigmoid_bwd(y, dy, dx):
    """dx = dy * y * (1 - y), y the forward output."""
    raise NotImplementedError


def tanh_fwd(x, y):
    """y = tanh(x)."""
    raise NotImplementedError


def tanh_bwd(y, dy, dx):
    """dx = dy * (1 - y * y), y the forward output."""
    raise NotImplementedError


# -- the solver's update (kernels/sgd.py) ---------------------------------------------------------------
def sgd_step(w, g, h, momentum, local_rate, decay):
    """One SGD iteration of one flat parameter, fused (L2 decay, momentum, update):
    h = momentum * h + local_rate * (g + decay * w);  w -= h.  g is only read.  ``local_rate``:
    a number, or a 1-element array of the backend's (read where it lives: a captured CUDA graph
    replays with the rate written there before each replay)."""
    raise NotImplementedError


def sgd_step_segments(w, g, h, offsets, momentum, rates, decays):
    """sgd_step for every parameter at once (one launch on a GPU): w, g, h are the flat vectors
    of all parameters, parameter s the slice [offsets[s], offsets[s+1]) with its own rate and
    decay; offsets (n+1 int64), rates and decays (n) are arrays of the backend's, read where they
    live."""
    raise NotImplementedError


#: every function of the contract, in the order above
FUNCTIONS = (
    to_host,
    from_host,
    synchronize,
    precompile,
    gemm,
    im2col,
    col2im,
    conv_direct,
    conv_direct_fwd,
    conv_direct_bwd_filter,
    max_pool_fwd,
    max_pool_bwd,
    ave_pool_fwd,
    ave_pool_bwd,
    softmax_fwd,
    softmax_bwd,
    softmax_loss_fwd,
    softmax_loss_bwd,
    softmax_xent_fwd,
    bias_bwd,
    relu_fwd,
    relu_bwd,
    sigmoid_fwd,
    sigmoid_bwd,
    tanh_fwd,
    tanh_bwd,
    sgd_step,
    sgd_step_segments,
)


def check(backend):
    """The ways ``backend`` (a module) breaks the contract, as sentences; [] when it keeps it."""
    problems = []
    names = dict(ATTRIBUTES)
    if getattr(backend, "name", None) in ("cudasim", "cuda"):
        names.update(GPU_ATTRIBUTES)
    for attr in names:
        if not hasattr(backend, attr):
            problems.append(f"{backend.__name__} has no attribute '{attr}' ({names[attr]})")
    for spec in FUNCTIONS:
        fn = getattr(backend, spec.__name__, None)
        if fn is None or not callable(fn):
            problems.append(f"{backend.__name__} has no function {spec.__name__}{inspect.signature(spec)}")
            continue
        want, got = inspect.signature(spec), inspect.signature(fn)
        if [(p.name, p.default) for p in want.parameters.values()] != [
            (p.name, p.default) for p in got.parameters.values()
        ]:
            problems.append(
                f"{backend.__name__}.{spec.__name__}{got} differs from the contract's {spec.__name__}{want}"
            )
    return problems
