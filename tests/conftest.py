import numpy as np
import pytest

from minicaffe import backend as _backend


@pytest.fixture(params=list(_backend.BACKENDS))
def backend(request):
    """Every backend the engine has: one test definition runs on each."""
    return _backend.get(request.param)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
