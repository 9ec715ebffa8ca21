"""The simulator's device arrays refuse what CuPy refuses (kernels/cuda/simarray.py), and do
what CuPy does: no numba needed, so these run in milliseconds."""

import copy
import pickle

import numpy as np
import pytest

from kernels.cuda.simarray import SimArray
from kernels.cuda.simarray import simcupy as xp


def test_implicit_conversion_to_numpy_is_refused():
    d = xp.arange(6.0).reshape(2, 3)
    for convert in (np.asarray, np.array, lambda a: np.zeros((2, 3)).__setitem__(Ellipsis, a)):
        with pytest.raises(TypeError, match="Implicit conversion to a NumPy array is not allowed"):
            convert(d)
    assert type(d.get()) is np.ndarray and d.get().tolist() == [[0, 1, 2], [3, 4, 5]]
    assert type(xp.asnumpy(d)) is np.ndarray


@pytest.mark.parametrize(
    "mix",
    [
        lambda d, h: d + h,
        lambda d, h: h * d,
        lambda d, h: d.__setitem__(Ellipsis, h),
        lambda d, h: xp.maximum(h, d),
        lambda d, h: xp.add.at(d, [0], h[:1]),
        lambda d, h: np.multiply(d, h),
        lambda d, h: xp.where(d > 0, h, d),
    ],
)
def test_mixing_with_a_host_array_is_refused(mix):
    d, h = xp.ones(3), np.ones(3)
    with pytest.raises(TypeError, match=r"Unsupported type <class 'numpy.ndarray'>"):
        mix(d, h)


def test_device_arithmetic_stays_on_the_device_like_cupy():
    d = xp.asarray(np.arange(6.0).reshape(2, 3))  # the explicit way in
    for r in (d + 1, d * np.float32(2), -d, abs(d), np.exp(d), xp.sqrt(d), d.T, d[0], d.reshape(-1)):
        assert type(r) is SimArray
    s = d.sum()
    assert type(s) is SimArray and s.ndim == 0 and float(s) == 15.0  # reductions give 0-d arrays
    assert type(d[1, 2]) is SimArray and int(d[1, 2]) == 5
    d[0] = xp.zeros(3)
    d += 1
    xp.add.at(d, xp.asarray([0, 0]), 1.0)
    assert d.get().tolist() == [[3, 3, 3], [4, 5, 6]]  # row 0 twice: add.at accumulates
    assert xp.float32 is np.float32 and xp.zeros(2, xp.float32).dtype == np.float32
    d.set(np.full((2, 3), 7.0))  # explicit host->device copy
    assert float(d.max()) == 7.0
    assert copy.deepcopy(d).get().tolist() == d.get().tolist()
    assert pickle.loads(pickle.dumps(d)).get().tolist() == d.get().tolist()
