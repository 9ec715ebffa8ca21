"""The version switch: every family's VERSIONS/DEFAULTS/use() agree, kernels.use() and
MINICAFFE_KERNELS rebind the names the engine calls, and unknown names are clear errors."""
import os
import subprocess
import sys

import pytest

import kernels


@pytest.mark.parametrize("fam", kernels.FAMILIES)
def test_tables_and_defaults(fam):
    mod = kernels.family(fam)
    assert mod.__doc__ and "v1_naive" in mod.__doc__, f"{fam}: docstring lists the versions"
    for fn, table in mod.VERSIONS.items():
        assert fn in mod.DEFAULTS, f"{fam}.{fn} has no default"
        assert getattr(mod, fn) is table[mod.DEFAULTS[fn]], f"{fam}.{fn} is not its default"
        assert "v1_naive" in table, f"{fam}.{fn}: the ladder starts at v1_naive"


@pytest.mark.parametrize("fam", kernels.FAMILIES)
def test_use_rebinds_and_restores(fam):
    mod = kernels.family(fam)
    try:
        kernels.use(fam, "v1_naive")
        for fn, table in mod.VERSIONS.items():
            assert getattr(mod, fn) is table["v1_naive"]
    finally:
        kernels.use(fam, "default")
    for fn, table in mod.VERSIONS.items():
        assert getattr(mod, fn) is table[mod.DEFAULTS[fn]]


def test_unknown_names_are_clear():
    with pytest.raises(ValueError, match="unknown kernel family 'gemmm'"):
        kernels.use("gemmm", "v1_naive")
    with pytest.raises(ValueError, match="has no version 'v9'.*known: .*v1_naive"):
        kernels.use("gemm", "v9")


def test_environment_variable():
    code = ("import kernels.gemm as g, kernels.im2col as i; "
            "print(g.gemm is g.VERSIONS['gemm']['v1_naive'], "
            "i.im2col is i.VERSIONS['im2col']['v1_naive'])")
    env = dict(os.environ, MINICAFFE_KERNELS="gemm=v1_naive, im2col=v1_naive")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.dirname(__file__)))
    assert out.stdout.split() == ["True", "True"], out.stderr
    env["MINICAFFE_KERNELS"] = "gemm=nope"
    out = subprocess.run([sys.executable, "-c", "import kernels.gemm"], env=env,
                         capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.dirname(__file__)))
    assert out.returncode != 0 and "MINICAFFE_KERNELS" in out.stderr and "nope" in out.stderr
