"""Python: a layer written in Python by the user, as pycaffe's ``python_param`` loads it.

    layer { name: "loss" type: "Python" bottom: "a" bottom: "b" top: "loss"
            python_param { module: "pyloss" layer: "EuclideanLossLayer" param_str: "..." }
            loss_weight: 1 }

``module`` is imported (from ``sys.path``, as in pycaffe) and its class ``layer`` instantiated;
the class normally subclasses ``caffe.Layer`` (= ``minicaffe.Layer``) and defines pycaffe's four
methods ``setup(bottom, top)``, ``reshape(bottom, top)``, ``forward(bottom, top)``,
``backward(top, propagate_down, bottom)``.  It sees ``self.param_str``, ``self.phase``
(``"TRAIN"``/``"TEST"``) and ``self.blobs`` (``self.blobs.add_blob(*shape)`` adds a parameter).
This wrapper runs those methods in Caffe's order; a Python layer has no loss weight unless the
prototxt gives ``loss_weight``.
"""

import importlib

from ..blob import Blob
from ..layer import Layer, register


class BlobVec(list):
    """pycaffe's ``layer.blobs``: a list of Blobs with ``add_blob(*shape)``."""

    def __init__(self, owner):
        super().__init__()
        self._owner = owner

    def add_blob(self, *shape):
        o = self._owner
        blob = Blob(shape, dtype=o.dtype, xp=o.xp, name=f"{o.name}[{len(self)}]")
        self.append(blob)
        o.param_propagate_down.append(True)
        return blob


@register
class Python(Layer):
    type = "Python"

    def __init__(self, param, backend=None, dtype=None, phase="TRAIN"):
        import numpy as np

        super().__init__(param, backend=backend, dtype=np.float32 if dtype is None else dtype, phase=phase)
        p = param.python_param
        if not p.module or not p.layer:
            raise self.error("python_param needs module and layer (the class name)")
        try:
            module = importlib.import_module(p.module)
        except ImportError as exc:
            raise self.error(f"cannot import python_param module '{p.module}': {exc}") from exc
        cls = getattr(module, p.layer, None)
        if cls is None:
            raise self.error(f"module '{p.module}' has no class '{p.layer}'")
        if not isinstance(cls, type):
            raise self.error(
                f"python_param.layer: '{p.module}.{p.layer}' is a {type(cls).__name__}, not a class; "
                f"name the class of the layer (with setup, reshape, forward, backward)"
            )
        try:
            if issubclass(cls, Layer):
                impl = cls.__new__(cls)
                Layer.__init__(impl, param, backend=self.backend, dtype=self.dtype, phase=phase)
            else:
                impl = cls()
                impl.param, impl.name, impl.phase = param, param.name, phase
        except Exception as exc:
            raise self.error(f"creating '{p.module}.{p.layer}' failed: {type(exc).__name__}: {exc}") from exc
        impl.param_str = p.param_str
        impl.phase = phase
        self.blobs = BlobVec(self)
        impl.blobs = self.blobs
        self.impl = impl

    def _call(self, what, *args):
        fn = getattr(self.impl, what, None)
        if fn is None:
            raise self.error(f"python layer class '{type(self.impl).__name__}' has no {what}() method")
        return fn(*args)

    def layer_setup(self, bottom, top):
        self._call("setup", bottom, top)

    def reshape(self, bottom, top):
        self._call("reshape", bottom, top)

    def forward(self, bottom, top):
        self._call("forward", bottom, top)

    def backward(self, top, propagate_down, bottom):
        self._call("backward", top, propagate_down, bottom)
