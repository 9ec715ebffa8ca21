"""Built-in layers, one file per layer type; importing this package registers them all.

Each module registers its class with ``@register`` (minicaffe.layer); adding a layer is adding a
file here and its test.

The package also answers pycaffe's ``from caffe import layers as L``: ``L.Convolution(...)`` (any
capitalized name) describes a layer for a NetSpec (minicaffe/netspec.py); the modules here are
lower-case, so the two never meet.
"""

import importlib
import pkgutil

for _info in pkgutil.iter_modules(__path__):
    if not _info.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_info.name}")


def __getattr__(name):
    if name[:1].isupper():
        from ..netspec import layers

        return getattr(layers, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
