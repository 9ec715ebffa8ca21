"""What the two GPU backends share: the flat kernel functions of the backend contract, bound to a
launcher (``kernels/cuda/_launch.py``), and the checks that say why a GPU backend cannot load.

``cuda`` and ``cudasim`` are the same code: the kernels are the same ``@cuda.jit`` functions;
the backends differ only in the array module (CuPy / numpy) and in how a kernel is launched,
which is the launcher's business.  Each function looks its kernel up at call time, so
``kernels.cuda.use(family, version)`` switches what the engine runs.

numba decides ONCE per process, at the first ``import numba.cuda``, whether ``numba.cuda`` is the
real CUDA target or the simulator (``NUMBA_ENABLE_CUDASIM=1``).  So a process can run ``cuda`` or
``cudasim``, never both; the checks below say so instead of failing inside numba.
"""

import os
import sys

from ..errors import MinicaffeError

INSTALL = 'pip install -e ".[cuda]"  (CuPy for CUDA 12: cupy-cuda12x)'


def simulator_requested():
    """NUMBA_ENABLE_CUDASIM=1 in the environment: numba's own switch for its simulator."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0").strip() not in ("", "0")


def _numba_cuda_mode():
    """None if numba.cuda is not imported yet, else "simulator" or "real"."""
    if "numba.cuda" not in sys.modules:
        return None
    from numba.core import config

    return "simulator" if config.ENABLE_CUDASIM else "real"


def why_not(name):
    """None if backend ``name`` ('cuda' or 'cudasim') can load in this process, else the reason
    (checked without importing numba.cuda, so asking does not fix the process's CUDA target)."""
    mode = _numba_cuda_mode()
    if name == "cudasim":
        if mode is None and os.environ.get("NUMBA_ENABLE_CUDASIM", "").strip() == "0":
            return (
                "NUMBA_ENABLE_CUDASIM=0 is set: this process asked numba for its real CUDA "
                "target, and numba picks real-or-simulator once per process"
            )
        if mode == "real":
            return (
                "numba's real CUDA target is already loaded in this process, and numba picks "
                "real-or-simulator once per process: set NUMBA_ENABLE_CUDASIM=1 before starting "
                "Python to use the simulator"
            )
        return None
    if name != "cuda":
        return f"'{name}' is not a GPU backend"
    if mode == "simulator" or (mode is None and simulator_requested()):
        return (
            "this process already runs numba's CUDA simulator (chosen by NUMBA_ENABLE_CUDASIM=1 "
            "or by loading the cudasim backend), and numba picks real-or-simulator once per "
            "process: start a new process without NUMBA_ENABLE_CUDASIM for the cuda backend"
        )
    try:
        import cupy
    except ImportError as e:
        return f"CuPy is not installed ({e}); install the GPU extra: {INSTALL}"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # CUDARuntimeError, or a missing driver library
        return f"CuPy is installed but sees no usable NVIDIA GPU ({type(e).__name__}: {e})"
    if n < 1:
        return "CuPy is installed but there is no NVIDIA GPU on this machine"
    return None


def require(name):
    reason = why_not(name)
    if reason is not None:
        hint = (
            (
                "; without a GPU, NUMBA_ENABLE_CUDASIM=1 makes the GPU mode run the same kernels in "
                "numba's CUDA simulator (slow: for testing)"
            )
            if name == "cuda"
            else ""
        )
        raise MinicaffeError(f"the {name} backend cannot be used: {reason}{hint}")
    if name == "cudasim" and _numba_cuda_mode() is None:
        # Asking for the simulator is asking numba for it: the switch numba reads when
        # numba.cuda is first imported (what NUMBA_ENABLE_CUDASIM=1 would have set).
        from numba.core import config

        config.ENABLE_CUDASIM = 1


def bind(L):
    """The backend contract's kernel functions, launched by ``L``."""
    import kernels.cuda as kc
    from kernels.cuda import elementwise, pooling, sgd, softmax
    from kernels.cuda import gemm as _gemm
    from kernels.cuda import im2col as _im2col

    kc.apply_env()

    def gemm(trans_a, trans_b, alpha, a, b, beta, c):
        """c = alpha * op(a) @ op(b) + beta * c."""
        _gemm.gemm(L, trans_a, trans_b, alpha, a, b, beta, c)

    def im2col(x, kh, kw, ph, pw, sh, sw, dh, dw, col):
        _im2col.im2col(L, x, kh, kw, ph, pw, sh, sw, dh, dw, col)

    def col2im(col, kh, kw, ph, pw, sh, sw, dh, dw, x):
        _im2col.col2im(L, col, kh, kw, ph, pw, sh, sw, dh, dw, x)

    def max_pool_fwd(x, kh, kw, sh, sw, ph, pw, y, mask):
        pooling.max_pool_fwd(L, x, kh, kw, sh, sw, ph, pw, y, mask)

    def max_pool_bwd(dy, mask, dx):
        pooling.max_pool_bwd(L, dy, mask, dx)

    def ave_pool_fwd(x, kh, kw, sh, sw, ph, pw, y):
        pooling.ave_pool_fwd(L, x, kh, kw, sh, sw, ph, pw, y)

    def ave_pool_bwd(dy, kh, kw, sh, sw, ph, pw, dx):
        pooling.ave_pool_bwd(L, dy, kh, kw, sh, sw, ph, pw, dx)

    def softmax_fwd(x, y):
        softmax.softmax_fwd(L, x, y)

    def softmax_bwd(y, dy, dx):
        softmax.softmax_bwd(L, y, dy, dx)

    def softmax_loss_fwd(prob, label, ignore_label, has_ignore):
        """(loss_sum, count) as Python numbers: one counted 24-byte device->host copy."""
        return softmax.softmax_loss_fwd(L, prob, label, ignore_label, has_ignore)

    def softmax_loss_bwd(prob, label, ignore_label, has_ignore, scale, dx):
        softmax.softmax_loss_bwd(L, prob, label, ignore_label, has_ignore, scale, dx)

    def softmax_xent_fwd(x, label, ignore_label, has_ignore, prob):
        """Fused softmax + cross-entropy: prob = softmax(x) and (loss_sum, count) in one kernel."""
        return softmax.softmax_xent_fwd(L, x, label, ignore_label, has_ignore, prob)

    def relu_fwd(x, slope, y):
        elementwise.relu_fwd(L, x, slope, y)

    def relu_bwd(x, dy, slope, dx):
        elementwise.relu_bwd(L, x, dy, slope, dx)

    def sigmoid_fwd(x, y):
        elementwise.sigmoid_fwd(L, x, y)

    def sigmoid_bwd(y, dy, dx):
        elementwise.sigmoid_bwd(L, y, dy, dx)

    def tanh_fwd(x, y):
        elementwise.tanh_fwd(L, x, y)

    def tanh_bwd(y, dy, dx):
        elementwise.tanh_bwd(L, y, dy, dx)

    def sgd_update(g, h, momentum, local_rate):
        """h = momentum*h + local_rate*g; g = h (one pass)."""
        sgd.sgd_update(L, g, h, momentum, local_rate)

    def sgd_step(w, g, h, momentum, local_rate, decay):
        """L2 decay + momentum + weight update fused: g += decay*w; h = m*h + lr*g; w -= h; g = h."""
        sgd.sgd_step(L, w, g, h, momentum, local_rate, decay)

    return {
        f.__name__: f
        for f in (
            gemm,
            im2col,
            col2im,
            max_pool_fwd,
            max_pool_bwd,
            ave_pool_fwd,
            ave_pool_bwd,
            softmax_fwd,
            softmax_bwd,
            softmax_loss_fwd,
            softmax_loss_bwd,
            softmax_xent_fwd,
            relu_fwd,
            relu_bwd,
            sigmoid_fwd,
            sigmoid_bwd,
            tanh_fwd,
            tanh_bwd,
            sgd_update,
            sgd_step,
        )
    }
