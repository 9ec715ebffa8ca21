"""Blob: Caffe's n-d array pair (data, diff).

A Blob holds two arrays of the same shape: ``data`` (values flowing forward) and ``diff``
(gradients flowing backward).  As in Caffe, memory is kept by *capacity*: reshaping to a shape
that fits in what is already allocated reuses the allocation (no copy, contents undefined), so a
net can be reshaped every batch without churning memory.

The arrays belong to the blob's backend (numpy on ``cpu`` and ``cudasim``, CuPy on ``cuda``).
``data`` and ``diff`` return views of the storage in the blob's current shape; writing into them
(``blob.data[...] = x``) writes the blob, as in pycaffe.

Storage may also be *attached* from outside (``attach``): the memory planner (minicaffe.memory)
places every blob of a net inside one arena allocation that way.
"""

import numpy as np

from .errors import MinicaffeError


def _as_shape(shape):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    try:
        shape = tuple(int(d) for d in shape)
    except (TypeError, ValueError):
        raise MinicaffeError(f"blob shape must be a sequence of integers, got {shape!r}") from None
    if any(d < 0 for d in shape):
        raise MinicaffeError(f"blob shape has a negative dimension: {shape}")
    return shape


class Blob:
    __slots__ = (
        "name",
        "xp",
        "dtype",
        "_shape",
        "_count",
        "_data_buf",
        "_diff_buf",
        "_data_view",
        "_diff_view",
        "_capacity",
        "_attached",
    )

    def __init__(self, shape=(), dtype=np.float32, xp=np, name=""):
        self.name = name
        self.xp = xp
        self.dtype = np.dtype(dtype)
        self._data_buf = None
        self._diff_buf = None
        self._capacity = 0
        self._attached = False
        self._shape = ()
        self._count = 1
        self._data_view = self._diff_view = None
        self.reshape(shape)

    # -- shape -------------------------------------------------------------------------------
    @property
    def shape(self):
        return self._shape

    @property
    def count(self):
        return self._count

    @property
    def num_axes(self):
        return len(self._shape)

    def canonical_axis(self, axis):
        """Caffe's CanonicalAxisIndex: -1 is the last axis; out of range is an error."""
        n = len(self._shape)
        if not -n <= axis < max(n, 1):
            raise MinicaffeError(f"axis {axis} out of range for blob '{self.name}' of shape {self._shape}")
        return axis + n if axis < 0 else axis

    def count_range(self, start, end=None):
        """Product of dimensions [start, end)."""
        end = len(self._shape) if end is None else end
        c = 1
        for d in self._shape[start:end]:
            c *= d
        return c

    # pycaffe's legacy 4-d accessors
    num = property(lambda self: self._legacy(0))
    channels = property(lambda self: self._legacy(1))
    height = property(lambda self: self._legacy(2))
    width = property(lambda self: self._legacy(3))

    def _legacy(self, i):
        if len(self._shape) > 4:
            raise MinicaffeError(f"blob '{self.name}' has {len(self._shape)} axes; num/channels/height/width need <= 4")
        s = self._shape + (1,) * (4 - len(self._shape))
        return s[i]

    def reshape(self, *shape):
        """Change the shape; keep the allocation if it is large enough (contents then undefined)."""
        shape = _as_shape(shape)
        count = 1
        for d in shape:
            count *= d
        self._shape = shape
        self._count = count
        if count > self._capacity or self._data_buf is None:
            if self._attached and count > self._capacity:
                raise MinicaffeError(
                    f"blob '{self.name}' lives in a planned arena of {self._capacity} elements and cannot "
                    f"grow to shape {shape} ({count} elements); re-plan the net's memory after reshaping"
                )
            self._capacity = count
            self._data_buf = self.xp.zeros(count, dtype=self.dtype)
            self._diff_buf = self.xp.zeros(count, dtype=self.dtype)
        self._data_view = self._diff_view = None

    def reshape_like(self, other):
        self.reshape(other.shape)

    def attach(self, data_buf, diff_buf):
        """Use the given flat arrays (views into an arena) as this blob's storage."""
        if data_buf.size < self._count or (diff_buf is not None and diff_buf.size < self._count):
            raise MinicaffeError(f"blob '{self.name}': attached storage smaller than its count {self._count}")
        self._data_buf = data_buf
        self._diff_buf = diff_buf if diff_buf is not None else self.xp.zeros(self._count, self.dtype)
        self._capacity = min(data_buf.size, self._diff_buf.size)
        self._attached = True
        self._data_view = self._diff_view = None

    # -- data / diff -------------------------------------------------------------------------
    @property
    def data(self):
        v = self._data_view
        if v is None:
            v = self._data_view = self._data_buf[: self._count].reshape(self._shape)
        return v

    @data.setter
    def data(self, value):
        self._assign(self.data, value, "data")

    @property
    def diff(self):
        v = self._diff_view
        if v is None:
            v = self._diff_view = self._diff_buf[: self._count].reshape(self._shape)
        return v

    @diff.setter
    def diff(self, value):
        self._assign(self.diff, value, "diff")

    def _assign(self, dst, value, what):
        value = self.xp.asarray(value)
        if value.shape != self._shape and value.size != self._count:
            raise MinicaffeError(
                f"cannot assign an array of shape {value.shape} to {what} of blob "
                f"'{self.name}' with shape {self._shape}"
            )
        dst[...] = value.reshape(self._shape)

    @property
    def flat_data(self):
        return self._data_buf[: self._count]

    @property
    def flat_diff(self):
        return self._diff_buf[: self._count]

    def share_data(self, other):
        """Use other's data storage (Caffe's ShareData); shapes must have equal counts."""
        if other.count != self._count:
            raise MinicaffeError(
                f"share_data: blob '{self.name}' {self._shape} and '{other.name}' {other.shape} differ in count"
            )
        self._data_buf = other._data_buf
        self._capacity = min(self._capacity, other._capacity) if self._diff_buf is not None else other._capacity
        self._data_view = None

    def share_diff(self, other):
        if other.count != self._count:
            raise MinicaffeError(
                f"share_diff: blob '{self.name}' {self._shape} and '{other.name}' {other.shape} differ in count"
            )
        self._diff_buf = other._diff_buf
        self._diff_view = None

    @property
    def data_storage(self):
        """The flat array that holds the data (its capacity, not just ``count`` elements): the
        memory planner groups blobs by it; ``attach`` and ``share_data`` change it."""
        return self._data_buf

    @property
    def diff_storage(self):
        """The flat array that holds the diff (see data_storage)."""
        return self._diff_buf

    @property
    def nbytes(self):
        """Bytes of both storages (data and diff, at capacity)."""
        return self._data_buf.nbytes + self._diff_buf.nbytes

    def shares_data_with(self, other):
        return self._data_buf is other._data_buf

    def asum_data(self):
        return float(self.xp.abs(self.flat_data).sum())

    def asum_diff(self):
        return float(self.xp.abs(self.flat_diff).sum())

    def __repr__(self):
        return f"Blob({self.name!r}, shape={self._shape}, dtype={self.dtype.name})"
