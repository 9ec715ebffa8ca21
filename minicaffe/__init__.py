"""minicaffe: a from-scratch, readable deep learning engine in the style of Caffe.

Use it as pycaffe::

    import minicaffe as caffe
    caffe.set_mode_cpu()
    net = caffe.Net("nets/lenet.prototxt", caffe.TEST)            # or (prototxt, weights, phase)
    out = net.forward(data=images)                                  # {"prob": array}
    net.blobs["data"].data[...] = images; net.forward(); net.backward()
    net.params["conv1"][0].data                                      # weights, writable in place

and pycaffe's other modules: ``caffe.NetSpec`` with ``from minicaffe import layers as L, params
as P``, ``minicaffe.proto.caffe_pb2``, ``caffe.io`` (load_image, Transformer), ``minicaffe.draw``.
docs/PYCAFFE.md says what works.
"""

# first: its exit handler must be registered before any other (minicaffe/teardown.py)
from . import teardown  # noqa: F401  (isort: skip)

# then, before numba loads LLVM: its library read in small folios (minicaffe/pagecache.py)
from . import pagecache  # noqa: F401  (isort: skip)
from . import backend as _backend
from . import io
from .blob import Blob
from .errors import LayerError, MinicaffeError, NetError, PrototxtError, SolverError, WeightsError
from .layer import LAYERS, Layer
from .net import TEST, TRAIN, Net
from .rng import set_random_seed

__version__ = "0.1.0"

__all__ = [
    "Blob",
    "Layer",
    "Net",
    "TRAIN",
    "TEST",
    "io",
    "set_mode_cpu",
    "set_mode_gpu",
    "set_device",
    "set_random_seed",
    "layer_type_list",
    "MinicaffeError",
    "PrototxtError",
    "LayerError",
    "NetError",
    "SolverError",
    "WeightsError",
    "SGDSolver",
    "NesterovSolver",
    "AdaGradSolver",
    "RMSPropSolver",
    "AdaDeltaSolver",
    "AdamSolver",
    "get_solver",
    "NetSpec",
    "layers",
    "params",
    "to_proto",
    "proto",
]


def set_mode_cpu():
    _backend.set_mode("cpu")


def set_mode_gpu():
    """Select the GPU backend (see README: GPU); a clear error where there is none."""
    _backend.set_mode("gpu")


def set_device(index):
    _backend.set_device(index)


def layer_type_list():
    from .layer import layer_class

    layer_class("Input")  # imports and registers every layer
    return sorted(LAYERS)


def __getattr__(name):
    # solvers live in their own package and are imported on first use
    if name in (
        "SGDSolver",
        "NesterovSolver",
        "AdaGradSolver",
        "RMSPropSolver",
        "AdaDeltaSolver",
        "AdamSolver",
        "get_solver",
        "Solver",
    ):
        from . import solvers

        return getattr(solvers, name)
    if name in ("NetSpec", "params", "to_proto"):  # pycaffe's net_spec (minicaffe/netspec.py)
        from . import netspec

        return getattr(netspec, name)
    if name in ("layers", "proto", "draw"):  # subpackages, imported on first use
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'minicaffe' has no attribute '{name}'")
