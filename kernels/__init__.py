"""Hand-written kernels, one module per family (see docs/ARCHITECTURE.md, "Kernels", and
docs/KERNELS.md for the ladder of versions and their measured speed).

Each family module has a float64 numpy reference (``*_reference``), numba versions in
``VERSIONS`` (public function name -> {version name -> function}) and ``DEFAULTS`` (public
function name -> version name).  ``use(family, version)`` rebinds the module's public names to
another version, so the engine (which looks kernels up at call time) runs it;
``MINICAFFE_KERNELS="gemm=v1_naive,im2col=v1_naive"`` does the same at import.

Each family module checks and times itself (``python -m kernels.gemm``: every version against
the reference, then against this machine's measured ceiling; harness in ``_bench.py``);
``python -m kernels.bench`` runs every family and writes one generated table and a plot.

This package never imports minicaffe.
"""

import importlib
import os

FAMILIES = ("gemm", "im2col", "pooling", "softmax", "elementwise", "conv", "sgd")


def family(name):
    if name not in FAMILIES:
        raise ValueError(f"unknown kernel family '{name}'; known: {', '.join(FAMILIES)}")
    return importlib.import_module(f"{__name__}.{name}")


def use(family_name, version):
    """Make ``version`` the one the engine runs for ``family_name`` ("default" restores it)."""
    mod = family(family_name)
    mod.use(version)


def _env_spec():
    """Parse MINICAFFE_KERNELS into [(family, version)], checking the family names."""
    spec = os.environ.get("MINICAFFE_KERNELS", "").strip()
    pairs = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        fam, sep, ver = item.partition("=")
        if not sep or not ver.strip():
            raise ValueError(f"MINICAFFE_KERNELS: expected family=version, got '{item}'")
        fam = fam.strip()
        if fam not in FAMILIES:
            raise ValueError(f"MINICAFFE_KERNELS: unknown kernel family '{fam}'; known: {', '.join(FAMILIES)}")
        pairs.append((fam, ver.strip()))
    return pairs


def _apply_env(only=None):
    """Apply MINICAFFE_KERNELS.  A family module calls ``_apply_env(<its name>)`` as the last
    line of its import, so the variable holds whichever family is imported first."""
    for fam, ver in _env_spec():
        if only is None or fam == only:
            try:
                use(fam, ver)
            except ValueError as e:
                raise ValueError(f"MINICAFFE_KERNELS: {e}") from None
