"""Blob: Caffe's n-d array pair (data, diff), with Caffe's host/device semantics.

A Blob holds two arrays of the same shape: ``data`` (values flowing forward) and ``diff``
(gradients flowing backward).  As in Caffe, memory is kept by *capacity*: reshaping to a shape
that fits in what is already allocated reuses the allocation (no copy, contents undefined), so a
net can be reshaped every batch without churning memory.

**Where the numbers live (Caffe's SyncedMemory).**  On the ``cpu`` backend there is one array
per data/diff and every accessor returns (a view of) it: no state, no copy.  On a GPU backend
(``cuda``, ``cudasim``) each of data and diff is a ``SyncedMemory``: a device array, a host
mirror allocated on first use, and a *head* saying which side was written last -- at host, at
device, or synced -- and the other side is brought up to date lazily, by one counted copy
(``backend.transfers``), only when it is asked for:

* ``blob.data`` / ``blob.diff`` -- pycaffe's idiom, for user code -- are **host numpy arrays on
  every backend**.  Asking for one is taken as a write (pycaffe's ``.data`` is Caffe's
  ``mutable_cpu_data``): it copies the device to the host if the device is newer, and moves the
  head to the host, so ``net.blobs["data"].data[...] = images`` reaches the next forward.
* ``blob.dev_data`` / ``blob.dev_diff`` (and ``dev_flat_data`` / ``dev_flat_diff``, the flat
  storage in the current count) are **what the engine and the kernels use**: the backend's
  arrays (numpy on ``cpu``, device arrays on a GPU).  Asking for one is taken as a write too: it
  copies the host to the device if the host is newer, and moves the head to the device.  Every
  layer, the net and the solvers use only these, so a training step copies nothing but the batch
  in and the loss out.
* Caffe's own names are here for readers who know them: ``cpu_data()`` / ``gpu_data()`` (read:
  sync, head becomes synced), ``mutable_cpu_data()`` / ``mutable_gpu_data()`` (write), and the
  same for diff.  On ``cpu`` the ``gpu_*`` ones raise (there is no device).

Keep no host array across an engine call and write into it afterwards: the write lands on a
mirror the engine has since moved past (as in Caffe, where a host pointer goes stale the same way).
Ask ``blob.data`` again instead.

Storage may also be *attached* from outside (``attach``): the memory planner (minicaffe.memory)
places every blob of a net inside one arena allocation that way (device arrays on a GPU; the
host mirrors are allocated per blob, on first use).
"""

import numpy as np

from .errors import MinicaffeError

#: SyncedMemory heads (Caffe's SyncedHead): both sides zero (fresh), host newer, device newer, equal
UNINITIALIZED, HEAD_AT_HOST, HEAD_AT_DEVICE, SYNCED = "uninitialized", "at host", "at device", "synced"


class SyncedMemory:
    """One flat device array and its host mirror, synced lazily by which was written last."""

    __slots__ = ("dev", "host", "head", "bus")

    def __init__(self, dev, bus, head=UNINITIALIZED):
        self.dev = dev  # the device array (flat)
        self.host = None  # the numpy mirror, allocated on first host access
        self.head = head
        self.bus = bus  # the launcher: counted copies between the two

    def _host(self):
        h = self.host
        if h is None:
            h = self.host = np.zeros(self.dev.size, dtype=self.dev.dtype)
        if self.head == HEAD_AT_DEVICE:
            self.bus.copy_to_host(self.dev, h)
            self.head = SYNCED
        elif self.head == UNINITIALIZED:
            self.head = SYNCED  # both zero
        return h

    def _dev(self):
        if self.head == HEAD_AT_HOST:
            self.bus.copy_from_host(self.host, self.dev)
            self.head = SYNCED
        elif self.head == UNINITIALIZED:
            self.head = SYNCED
        return self.dev

    def overwrite_cpu(self):
        """The host array, to be overwritten whole: no copy from the device (head: at host)."""
        if self.host is None:
            self.host = np.zeros(self.dev.size, dtype=self.dev.dtype)
        self.head = HEAD_AT_HOST
        return self.host

    def cpu(self):
        return self._host()

    def mutable_cpu(self):
        h = self._host()
        self.head = HEAD_AT_HOST
        return h

    def gpu(self):
        return self._dev()

    def mutable_gpu(self):
        d = self._dev()
        self.head = HEAD_AT_DEVICE
        return d


def _bus(xp):
    """The launcher that copies between host and device for arrays of module ``xp`` (None: cpu)."""
    if xp is np:
        return None
    from kernels.cuda import _launch

    return _launch.launcher()


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
        "_data_mem",
        "_diff_mem",
        "_data_dview",
        "_diff_dview",
        "_bus",
        "_capacity",
        "_attached",
    )

    def __init__(self, shape=(), dtype=np.float32, xp=np, name=""):
        self.name = name
        self.xp = xp
        self.dtype = np.dtype(dtype)
        self._bus = _bus(xp)
        self._data_buf = None  # cpu: the arrays; GPU: the device arrays (also in the SyncedMemory)
        self._diff_buf = None
        self._data_mem = None  # GPU only: SyncedMemory of data and of diff
        self._diff_mem = None
        self._capacity = 0
        self._attached = False
        self._shape = ()
        self._count = 1
        self._forget_views()
        self.reshape(shape)

    def _forget_views(self):
        self._data_view = self._diff_view = self._data_dview = self._diff_dview = None

    def _set_storage(self, data_buf, diff_buf, head=UNINITIALIZED):
        self._data_buf, self._diff_buf = data_buf, diff_buf
        if self._bus is not None:
            self._data_mem = SyncedMemory(data_buf, self._bus, head)
            self._diff_mem = SyncedMemory(diff_buf, self._bus, head)
        self._forget_views()

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
        """Change the shape; keep the allocation if it is large enough (contents then undefined).
        The shape it already has changes nothing, and costs nothing: a net reshapes every layer
        before every forward, and the views the engine took stay valid."""
        if self._data_buf is not None and (
            shape == self._shape or (len(shape) == 1 and type(shape[0]) is tuple and shape[0] == self._shape)
        ):
            return
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
            self._set_storage(self.xp.zeros(count, dtype=self.dtype), self.xp.zeros(count, dtype=self.dtype))
        self._forget_views()

    def reshape_like(self, other):
        self.reshape(other.shape)

    def attach(self, data_buf, diff_buf):
        """Use the given flat arrays (views into an arena; the backend's arrays) as this blob's
        storage; their contents are taken as they are (on a GPU: the device side is the newer)."""
        if data_buf.size < self._count or (diff_buf is not None and diff_buf.size < self._count):
            raise MinicaffeError(f"blob '{self.name}': attached storage smaller than its count {self._count}")
        if diff_buf is None:
            diff_buf = self.xp.zeros(self._count, self.dtype)
        kept = {"data": data_buf is self._data_buf, "diff": diff_buf is self._diff_buf}
        old = (self._data_mem, self._diff_mem)
        self._set_storage(data_buf, diff_buf, HEAD_AT_DEVICE)
        if self._bus is not None:  # storage handed back unchanged keeps its host side and head
            self._data_mem = old[0] if kept["data"] and old[0] is not None else self._data_mem
            self._diff_mem = old[1] if kept["diff"] and old[1] is not None else self._diff_mem
        self._capacity = min(data_buf.size, diff_buf.size)
        self._attached = True

    # -- data / diff for user code: host numpy arrays on every backend ------------------------
    @property
    def data(self):
        """The data as a host numpy array (pycaffe's ``blob.data``; taken as written: see above)."""
        m = self._data_mem
        if m is None:  # cpu: one array, the engine's view is the user's
            v = self._data_dview
            if v is None:
                v = self._data_dview = self._data_buf[: self._count].reshape(self._shape)
            return v
        h = m.mutable_cpu()
        v = self._data_view
        if v is None:
            v = self._data_view = h[: self._count].reshape(self._shape)
        return v

    @data.setter
    def data(self, value):
        self._assign(value, "data")

    @property
    def diff(self):
        """The diff as a host numpy array (pycaffe's ``blob.diff``)."""
        m = self._diff_mem
        if m is None:  # cpu: one array, the engine's view is the user's
            v = self._diff_dview
            if v is None:
                v = self._diff_dview = self._diff_buf[: self._count].reshape(self._shape)
            return v
        h = m.mutable_cpu()
        v = self._diff_view
        if v is None:
            v = self._diff_view = h[: self._count].reshape(self._shape)
        return v

    @diff.setter
    def diff(self, value):
        self._assign(value, "diff")

    @property
    def flat_data(self):
        """The data as a flat host numpy array of ``count`` elements."""
        return self.data.reshape(-1)

    @property
    def flat_diff(self):
        return self.diff.reshape(-1)

    def _assign(self, value, what):
        """``blob.data = value``: a host array is written on the host, a device array on the
        device; either overwrites the whole blob, so nothing is first copied from the other side
        (unlike ``blob.data[...] = value``, which syncs the host first if the device is newer)."""
        on_device = self._bus is not None and not isinstance(value, np.ndarray) and hasattr(value, "shape")
        if not on_device:
            value = np.asarray(value)
        if value.shape != self._shape and value.size != self._count:
            raise MinicaffeError(
                f"cannot assign an array of shape {value.shape} to {what} of blob "
                f"'{self.name}' with shape {self._shape}"
            )
        if on_device:
            dst = self.dev_data if what == "data" else self.dev_diff
        else:
            m = self._data_mem if what == "data" else self._diff_mem
            if m is None:
                dst = self.data if what == "data" else self.diff
            else:
                dst = m.overwrite_cpu()[: self._count].reshape(self._shape)
        dst[...] = value.reshape(self._shape)

    # -- data / diff for the engine: the backend's arrays ---------------------------------------
    @property
    def dev_data(self):
        """The data as the backend's array (numpy on cpu, the device array on a GPU), the one
        the engine and the kernels use (taken as written: the device side becomes the newer)."""
        v = self._data_dview
        if v is None:
            v = self._data_dview = self._data_buf[: self._count].reshape(self._shape)
        m = self._data_mem
        if m is not None and m.head != HEAD_AT_DEVICE:
            m.mutable_gpu()
        return v

    @property
    def dev_diff(self):
        v = self._diff_dview
        if v is None:
            v = self._diff_dview = self._diff_buf[: self._count].reshape(self._shape)
        m = self._diff_mem
        if m is not None and m.head != HEAD_AT_DEVICE:
            m.mutable_gpu()
        return v

    @property
    def dev_flat_data(self):
        """dev_data, flat (``count`` elements)."""
        m = self._data_mem
        if m is not None and m.head != HEAD_AT_DEVICE:
            m.mutable_gpu()
        return self._data_buf[: self._count]

    @property
    def dev_flat_diff(self):
        m = self._diff_mem
        if m is not None and m.head != HEAD_AT_DEVICE:
            m.mutable_gpu()
        return self._diff_buf[: self._count]

    # -- Caffe's names ----------------------------------------------------------------------------
    def _mem(self, which, device):
        m = self._data_mem if which == "data" else self._diff_mem
        if m is None and device:
            raise MinicaffeError(
                f"blob '{self.name}' lives on the cpu backend, which has no device copy "
                f"(backend-neutral engine code uses blob.dev_{which})"
            )
        return m

    def _host_view(self, which, mutable):
        m = self._mem(which, False)
        if m is None:
            return self.data if which == "data" else self.diff
        h = m.mutable_cpu() if mutable else m.cpu()
        return h[: self._count].reshape(self._shape)

    def _dev_view(self, which, mutable):
        m = self._mem(which, True)
        d = m.mutable_gpu() if mutable else m.gpu()
        return d[: self._count].reshape(self._shape)

    def cpu_data(self):
        """Caffe's cpu_data: the host array, synced (head becomes synced; do not write it)."""
        return self._host_view("data", False)

    def mutable_cpu_data(self):
        return self._host_view("data", True)

    def gpu_data(self):
        return self._dev_view("data", False)

    def mutable_gpu_data(self):
        return self._dev_view("data", True)

    def cpu_diff(self):
        return self._host_view("diff", False)

    def mutable_cpu_diff(self):
        return self._host_view("diff", True)

    def gpu_diff(self):
        return self._dev_view("diff", False)

    def mutable_gpu_diff(self):
        return self._dev_view("diff", True)

    @property
    def head(self):
        """(data head, diff head) on a GPU backend ("at host", "at device", "synced",
        "uninitialized"); None on cpu, where there is one array and nothing to sync."""
        if self._data_mem is None:
            return None
        return self._data_mem.head, self._diff_mem.head

    # -- sharing and storage ------------------------------------------------------------------
    def share_data(self, other):
        """Use other's data storage (Caffe's ShareData); shapes must have equal counts."""
        if other.count != self._count:
            raise MinicaffeError(
                f"share_data: blob '{self.name}' {self._shape} and '{other.name}' {other.shape} differ in count"
            )
        self._data_buf = other._data_buf
        self._data_mem = other._data_mem
        self._capacity = min(self._capacity, other._capacity) if self._diff_buf is not None else other._capacity
        self._data_view = self._data_dview = None

    def share_diff(self, other):
        if other.count != self._count:
            raise MinicaffeError(
                f"share_diff: blob '{self.name}' {self._shape} and '{other.name}' {other.shape} differ in count"
            )
        self._diff_buf = other._diff_buf
        self._diff_mem = other._diff_mem
        self._diff_view = self._diff_dview = None

    @property
    def data_storage(self):
        """The flat backend array that holds the data (its capacity, not just ``count``
        elements; the device array on a GPU): the memory planner groups blobs by it; ``attach``
        and ``share_data`` change it.  Reading it does not sync; use dev_data to compute."""
        return self._data_buf

    @property
    def diff_storage(self):
        """The flat array that holds the diff (see data_storage)."""
        return self._diff_buf

    @property
    def nbytes(self):
        """Bytes of both storages (data and diff, at capacity; on a GPU the device arrays)."""
        return self._data_buf.nbytes + self._diff_buf.nbytes

    def shares_data_with(self, other):
        return self._data_buf is other._data_buf

    def asum_data(self):
        return float(self.xp.abs(self.dev_flat_data).sum())

    def asum_diff(self):
        return float(self.xp.abs(self.dev_flat_diff).sum())

    def __repr__(self):
        return f"Blob({self.name!r}, shape={self._shape}, dtype={self.dtype.name})"
