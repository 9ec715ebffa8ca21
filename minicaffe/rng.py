"""One seeded random source for the whole engine (fillers, Dropout, data shuffling).

``set_random_seed(s)`` (pycaffe's ``caffe.set_random_seed``) makes nets built afterwards, and
the dropout masks and shuffles drawn afterwards, reproducible.
"""

import numpy as np

_state = {"rng": np.random.default_rng(), "seed": None}


def set_random_seed(seed):
    _state["seed"] = int(seed)
    _state["rng"] = np.random.default_rng(int(seed))


def get_rng():
    return _state["rng"]


def get_seed():
    return _state["seed"]
