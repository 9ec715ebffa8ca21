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
    code = (
        "import kernels.gemm as g, kernels.im2col as i; "
        "print(g.gemm is g.VERSIONS['gemm']['v1_naive'], "
        "i.im2col is i.VERSIONS['im2col']['v1_naive'])"
    )
    env = dict(os.environ, MINICAFFE_KERNELS="gemm=v1_naive, im2col=v1_naive")
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        cwd=os.path.dirname(os.path.dirname(__file__)),
    )
    assert out.stdout.split() == ["True", "True"], out.stderr
    env["MINICAFFE_KERNELS"] = "gemm=nope"
    out = subprocess.run(
        [sys.executable, "-c", "import kernels.gemm"],
        env=env,
        capture_output=True,
        text=True,
        cwd=os.path.dirname(os.path.dirname(__file__)),
    )
    assert out.returncode != 0 and "MINICAFFE_KERNELS" in out.stderr and "nope" in out.stderr


def test_defaults_are_safe_from_several_threads():
    """The defaults are serial nogil kernels with no shared state: worker threads may call
    them at once (the prange versions may not: numba's workqueue layer is not reentrant)."""
    import threading

    import numpy as np

    from kernels import gemm, im2col, pooling

    rng = np.random.default_rng(9)
    x = rng.standard_normal((4, 3, 12, 12)).astype(np.float32)
    a = rng.standard_normal((40, 75)).astype(np.float32)
    want_col = im2col.im2col_reference(x, 5, 5, 2, 2, 1, 1, 1, 1)
    want_y, want_m = pooling.max_pool_fwd_reference(x, 2, 2, 2, 2, 0, 0, 6, 6)
    errors = []

    def work():
        try:
            for _ in range(20):
                col = np.empty(want_col.shape, np.float32)
                im2col.im2col(x, 5, 5, 2, 2, 1, 1, 1, 1, col)
                assert np.array_equal(col, want_col)
                c = np.empty((40, col.shape[1]), np.float32)
                gemm.VERSIONS["gemm"]["v3_micro"](False, False, 1.0, a, col, 0.0, c)
                assert np.allclose(c, a.astype(np.float64) @ want_col, rtol=1e-4, atol=1e-3)
                y, m = np.empty((4, 3, 6, 6), np.float32), np.empty((4, 3, 6, 6), np.int32)
                pooling.max_pool_fwd(x, 2, 2, 2, 2, 0, 0, y, m)
                assert np.array_equal(m, want_m)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
