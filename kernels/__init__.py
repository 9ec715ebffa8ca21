"""Hand-written kernels, one module per family (see docs/ARCHITECTURE.md, "Kernels").

Each family module has a float64 numpy reference, numba versions in ``VERSIONS`` and
``DEFAULTS`` (public function name -> version name).  ``use(family, version)`` rebinds the
module's public names to another version, so the engine (which looks kernels up at call time)
runs it; ``MINICAFFE_KERNELS="gemm=v1_naive,im2col=v1_naive"`` does the same at import.

This package never imports minicaffe.
"""
import importlib
import os

FAMILIES = ("gemm", "im2col", "pooling", "softmax", "elementwise")


def family(name):
    if name not in FAMILIES:
        raise ValueError(f"unknown kernel family '{name}'; known: {', '.join(FAMILIES)}")
    return importlib.import_module(f"{__name__}.{name}")


def use(family_name, version):
    """Make ``version`` the one the engine runs for ``family_name``."""
    mod = family(family_name)
    mod.use(version)


def _apply_env():
    spec = os.environ.get("MINICAFFE_KERNELS", "").strip()
    for item in filter(None, (s.strip() for s in spec.split(","))):
        fam, sep, ver = item.partition("=")
        if not sep:
            raise ValueError(f"MINICAFFE_KERNELS: expected family=version, got '{item}'")
        use(fam.strip(), ver.strip())
