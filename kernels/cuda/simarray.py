"""The simulator's device arrays: numpy storage that refuses to be mistaken for a host array.

On a real GPU the engine's arrays are CuPy arrays, and CuPy refuses every *implicit* crossing of
the bus: ``numpy.asarray(d)`` raises ``TypeError`` ("Implicit conversion to a NumPy array is not
allowed"), and so does any CuPy operation handed a numpy array (``d + h``, ``d[...] = h``,
``cupy.maximum(h, 0)``: "Unsupported type <class 'numpy.ndarray'>").  If the simulator's arrays
were plain numpy arrays, every one of those mix-ups would pass on a CPU-only machine and fail on
the first GPU.  So the ``cudasim`` backend keeps its data in ``SimArray``: a numpy array in a
wrapper that behaves as CuPy does --

* arithmetic, indexing, methods (``reshape``, ``sum``, ``astype``, ...), numpy's ufuncs and
  functions (through ``__array_ufunc__`` / ``__array_function__``, which CuPy implements too)
  work and return ``SimArray``; reductions and integer indexing give 0-d arrays, as CuPy's do;
* ``float(d)``, ``int(d)``, ``bool(d)`` and ``d.item()`` work (CuPy syncs and copies a scalar);
* ``d.get()`` is the explicit copy to the host (CuPy's name), ``xp.asarray(h)`` the explicit
  copy to the device, as in CuPy;
* ``numpy.asarray(d)``, ``numpy_array[...] = d`` and any operation mixing a ``SimArray`` with a
  numpy array (not a numpy scalar) raise ``TypeError`` with CuPy's messages.

``simcupy`` is the module the ``cudasim`` backend uses as ``xp``: numpy's namespace with every
function wrapped the same way (``simcupy.zeros`` makes a ``SimArray``; ``simcupy.maximum(h, 0)``
refuses a host array), plus CuPy's ``asnumpy``.  Kernel launches unwrap a ``SimArray`` into
numba's simulated device array (``_launch.py``) and refuse numpy arrays.
"""

import numbers
import threading
import types
from collections import Counter

import numpy as np

#: array operations that are a kernel launch on a GPU (CuPy launches one per element-wise
#: operation, reduction, fill or copy; views, reshapes and slices launch nothing), by name
OPS = Counter()
#: scalar reads and explicit copies that make the host wait for the device, by name
SYNCS = Counter()
#: views: what launches nothing
_VIEWS = frozenset(
    "reshape view transpose swapaxes squeeze T ravel_view expand_dims broadcast_to shape ndim size "
    "dtype may_share_memory shares_memory result_type can_cast empty empty_like atleast_1d "
    "atleast_2d atleast_3d moveaxis rollaxis get_array_module isscalar iscomplexobj isrealobj".split()
)


class CaptureViolation(RuntimeError):
    """Host work inside capture mode: a copy across the bus, a synchronization, a scalar read."""


_capture = threading.local()


def enter_capture(what):
    _capture.what = what
    return what


def leave_capture(token):
    _capture.what = None


def _sync(name):
    """A read that makes the host wait for the device: counted, and refused in capture mode."""
    what = getattr(_capture, "what", None)
    if what is not None:
        raise CaptureViolation(
            f"{name} of a device array inside {what}: the host would wait for the device in the "
            f"middle of the step (keep the value on the device, read it after the step)"
        )
    SYNCS[name] += 1


def _op(name, result=None, *sources):
    """Count an operation as a launch unless its result is a view of one of its sources."""
    if name in _VIEWS:
        return
    if (
        isinstance(result, np.ndarray)
        and result.size
        and any(isinstance(s, np.ndarray) and np.may_share_memory(result, s) for s in sources)
    ):
        return
    OPS[name] += 1


IMPLICIT = (
    "Implicit conversion to a NumPy array is not allowed. Please use `.get()` to construct a "
    "NumPy array explicitly. (minicaffe's cudasim device array refuses it as CuPy does: use "
    "backend.to_host(a) or a.get())"
)


def _refuse(x):
    raise TypeError(
        f"Unsupported type {type(x)} (a host numpy array mixed with a device array; CuPy refuses "
        f"this, so minicaffe's cudasim refuses it too: move it with backend.from_host first)"
    )


def unwrap(x):
    """The numpy storage of SimArrays inside x (lists/tuples/dicts walked); numpy arrays refused."""
    if type(x) is SimArray:
        return x._a
    if isinstance(x, np.ndarray):
        _refuse(x)
    if isinstance(x, (list, tuple)):
        return type(x)(unwrap(v) for v in x)
    if isinstance(x, dict):
        return {k: unwrap(v) for k, v in x.items()}
    return x


def wrap(x):
    """numpy results back to SimArrays (numpy scalars become 0-d arrays, as CuPy's are)."""
    if isinstance(x, np.ndarray):
        return SimArray(x)
    if isinstance(x, np.generic) and not isinstance(x, (np.str_, np.bytes_)):
        return SimArray(np.asarray(x))
    if isinstance(x, tuple):
        return tuple(wrap(v) for v in x)
    if isinstance(x, list):
        return [wrap(v) for v in x]
    return x


def _binary(name):
    op = getattr(np.ndarray, name)

    def method(self, other):
        _op(name)
        return wrap(op(self._a, unwrap(other)))

    method.__name__ = name
    return method


def _inplace(name):
    op = getattr(np.ndarray, name)

    def method(self, other):
        _op(name)
        op(self._a, unwrap(other))
        return self

    method.__name__ = name
    return method


def _unary(name):
    op = getattr(np.ndarray, name)

    def method(self):
        _op(name)
        return wrap(op(self._a))

    method.__name__ = name
    return method


class SimArray:
    """A simulated device array: see the module docstring."""

    __slots__ = ("_a", "__weakref__")
    __array_priority__ = 1000

    def __init__(self, a):
        if not isinstance(a, np.ndarray):
            raise TypeError(f"SimArray wraps a numpy array, got {type(a).__name__}")
        self._a = a

    # -- the bus ------------------------------------------------------------------------------
    def __array__(self, dtype=None, copy=None):
        raise TypeError(IMPLICIT)

    def get(self, stream=None, order="C", out=None):
        """A numpy copy (CuPy's explicit device-to-host copy)."""
        _sync("get()")
        if out is not None:
            out[...] = self._a
            return out
        return np.array(self._a, copy=True, order=order)

    def set(self, arr, stream=None):
        """Copy host array ``arr`` into this array (CuPy's explicit host-to-device copy)."""
        if isinstance(arr, SimArray):
            raise TypeError("set() takes a host numpy array; use a[...] = b between device arrays")
        _sync("set()")
        self._a[...] = np.asarray(arr)

    # -- numpy protocols (CuPy implements both) -----------------------------------------------
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        inputs = unwrap(inputs)
        out = kwargs.get("out")
        if out is not None:
            kwargs["out"] = unwrap(out)
        _op(ufunc.__name__)
        return wrap(getattr(ufunc, method)(*inputs, **kwargs))

    def __array_function__(self, func, types_, args, kwargs):
        a = unwrap(args)
        r = func(*a, **unwrap(kwargs))
        _op(func.__name__, r, *a)
        return wrap(r)

    # -- attributes ----------------------------------------------------------------------------
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    itemsize = property(lambda self: self._a.itemsize)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: self._a.flags)
    T = property(lambda self: SimArray(self._a.T))
    base = property(lambda self: None if self._a.base is None else SimArray(self._a.base))

    @property
    def device(self):
        return "cudasim"

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        attr = getattr(self._a, name)  # methods: reshape, sum, astype, copy, fill, ravel, ...
        if callable(attr):
            if name in ("item", "tolist"):
                _sync(f"{name}()")

            def method(*args, **kwargs):
                r = attr(*unwrap(args), **unwrap(kwargs))
                if name not in ("item", "tolist"):
                    _op(name, r, self._a)
                return wrap(r)

            method.__name__ = name
            return method
        return wrap(attr)

    # -- indexing ------------------------------------------------------------------------------
    def __getitem__(self, key):
        r = self._a[unwrap(key)]
        if isinstance(r, np.ndarray):
            _op("getitem", r, self._a)  # basic indexing is a view; advanced indexing gathers
        return wrap(r)

    def __setitem__(self, key, value):
        _op("setitem")  # a copy or a fill kernel
        self._a[unwrap(key)] = unwrap(value)

    def __len__(self):
        return len(self._a)

    def __iter__(self):
        return (wrap(v) for v in self._a)

    # -- scalars (CuPy copies one value to the host for these) ----------------------------------
    def __float__(self):
        _sync("float()")
        return float(self._a)

    def __int__(self):
        _sync("int()")
        return int(self._a)

    def __bool__(self):
        _sync("bool()")
        return bool(self._a)

    def __complex__(self):
        _sync("complex()")
        return complex(self._a)

    def __repr__(self):
        return "cudasim." + repr(self._a)

    def __str__(self):
        return str(self._a)

    def __format__(self, spec):
        _sync("format()")
        return format(self._a.item(), spec) if self._a.size == 1 else format(str(self), spec)

    def __copy__(self):
        return SimArray(self._a.copy())

    def __deepcopy__(self, memo):
        return SimArray(self._a.copy())

    def __reduce__(self):
        return (SimArray, (self._a,))

    __hash__ = None


for _n in (
    "add sub mul truediv floordiv mod pow matmul and or xor lshift rshift "
    "radd rsub rmul rtruediv rfloordiv rmod rpow rmatmul rand ror rxor eq ne lt le gt ge"
).split():
    setattr(SimArray, f"__{_n}__", _binary(f"__{_n}__"))
for _n in "iadd isub imul itruediv ifloordiv imod ipow iand ior ixor".split():
    setattr(SimArray, f"__{_n}__", _inplace(f"__{_n}__"))
for _n in "neg pos abs invert".split():
    setattr(SimArray, f"__{_n}__", _unary(f"__{_n}__"))


# -- simcupy: the cudasim backend's ``xp`` ------------------------------------------------------
def _to_device(a, dtype=None, copy=None, order=None, **kwargs):
    """cupy.asarray / cupy.array: a device array from a host or device value (a host value is
    copied to the device, as CuPy does)."""
    if type(a) is SimArray:
        out = np.array(a._a, dtype=dtype, copy=bool(copy), order=order or "K")
        if out is a._a:
            return a
        _op("asarray")  # a copy or a cast on the device
        return SimArray(out)
    if isinstance(a, (list, tuple)) and any(type(v) is SimArray for v in a):
        a = unwrap(a)
    elif isinstance(a, (np.ndarray, list, tuple)):
        _sync("asarray(host)")  # a copy from the host
    return SimArray(np.array(a, dtype=dtype, copy=True, order=order or "K"))


def _array(a, dtype=None, copy=True, order="K", **kwargs):
    return _to_device(a, dtype=dtype, copy=copy, order=order)


def _ascontiguousarray(a, dtype=None):
    if type(a) is SimArray:
        out = np.ascontiguousarray(a._a, dtype=dtype)
        if out is a._a:
            return a
        _op("ascontiguousarray")
        return SimArray(out)
    return _to_device(a, dtype=dtype, order="C")


def _asnumpy(a, stream=None, order="C", out=None):
    """cupy.asnumpy: the explicit device-to-host copy (host values pass through)."""
    if type(a) is SimArray:
        return a.get(order=order, out=out)
    return np.asarray(a, order=order)


def _wrap_function(f):
    name = getattr(f, "__name__", "function")

    def function(*args, **kwargs):
        a = unwrap(args)
        r = f(*a, **unwrap(kwargs))
        _op(name, r, *a)
        return wrap(r)

    function.__name__ = getattr(f, "__name__", "function")
    function.__doc__ = getattr(f, "__doc__", None)
    return function


class _SimUfunc:
    """A numpy ufunc on device arrays (call, ``at``, ``reduce``, ``accumulate``, ``outer``), as
    CuPy's ufuncs are."""

    def __init__(self, ufunc):
        self._u = ufunc
        self.__name__ = ufunc.__name__
        self.nin, self.nout = ufunc.nin, ufunc.nout

    def __call__(self, *args, **kwargs):
        _op(self.__name__)
        return wrap(self._u(*unwrap(args), **unwrap(kwargs)))

    def __getattr__(self, name):
        method = getattr(self._u, name)
        if not callable(method):
            return method

        def call(*args, **kwargs):
            return wrap(method(*unwrap(args), **unwrap(kwargs)))

        return call


class _SimCupy(types.ModuleType):
    """numpy's namespace, every function taking and giving device arrays (see module docstring)."""

    ndarray = SimArray
    asarray = staticmethod(_to_device)
    array = staticmethod(_array)
    ascontiguousarray = staticmethod(_ascontiguousarray)
    asnumpy = staticmethod(_asnumpy)

    def __getattr__(self, name):
        attr = getattr(np, name)
        if isinstance(attr, (type, numbers.Number, np.dtype, types.ModuleType)) or not callable(attr):
            return attr  # dtypes (float32, int64), constants (pi, inf, newaxis)
        f = _SimUfunc(attr) if isinstance(attr, np.ufunc) else _wrap_function(attr)
        setattr(self, name, f)
        return f

    def get_array_module(self, *args):
        return self


simcupy = _SimCupy("simcupy", "numpy's namespace on cudasim device arrays (see kernels/cuda/simarray.py)")


def is_device(a):
    return type(a) is SimArray
