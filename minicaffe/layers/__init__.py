"""Built-in layers, one file per layer type; importing this package registers them all.

Each module registers its class with ``@register`` (minicaffe.layer); adding a layer is adding a
file here and its test.
"""

import importlib
import pkgutil

for _info in pkgutil.iter_modules(__path__):
    if not _info.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_info.name}")
