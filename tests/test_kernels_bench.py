"""The benchmark tools: each family module checks and times itself (``python -m kernels.<family>``),
the driver writes one table, a JSON file and a plot, a rate above its measured ceiling is
flagged, a wrong version is reported and never timed, and ``--help`` reads as whole sentences.

Small on purpose (one family, one version, one repeat): these test the tools, not the speed.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from kernels import _bench
from kernels import sgd as SG

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def one_blas_thread(monkeypatch):
    """The tools re-execute themselves unless OPENBLAS_NUM_THREADS is set; run them in-process."""
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", os.environ.get("OPENBLAS_NUM_THREADS", "1"))


def _sgd_case(nbytes_claimed, check=None):
    rng = np.random.default_rng(0)
    w, g, h = (rng.standard_normal(4096).astype(np.float32) for _ in range(3))

    def run(fn):
        return lambda: fn(w, g, h, 0.9, 0.01, 5e-4)

    return _bench.Case("sgd", "sgd_step", "tiny", "memory", 0, nbytes_claimed, run, check or (lambda fn: None))


def test_a_rate_above_its_ceiling_is_flagged():
    """A byte count 10^6 times too large makes the kernel 'faster than memory': flagged, not shown
    as a result."""
    rows, _ = _bench.run_case(_sgd_case(20.0 * 4096 * 1e6), {"v2_fused"}, repeats=1)
    (r,) = rows
    assert r["above_ceiling"] and r["fraction"] > 1
    assert r["ceiling"] > 0 and "stream" in r["ceiling_what"]
    assert " !" in _bench.format_case(_sgd_case(1), rows, None)[0]
    honest, _ = _bench.run_case(_sgd_case(20.0 * 4096), {"v2_fused"}, repeats=1)
    assert not honest[0]["above_ceiling"], honest


def test_a_wrong_version_is_reported_and_not_timed():
    def check(fn):
        raise AssertionError("off by one")

    rows, _ = _bench.run_case(_sgd_case(20.0 * 4096, check), {"v1_naive", "v2_fused"}, repeats=1)
    assert [r["version"] for r in rows] == ["v1_naive", "v2_fused"]
    assert all(r["error"] == "WRONG: off by one" and "median_s" not in r for r in rows)


@pytest.mark.slow  # builds every family's inputs and float64 references (~15 s)
def test_every_family_module_has_cases_for_every_public_function():
    import kernels

    for fam in kernels.FAMILIES:
        mod = kernels.family(fam)
        fns = {c.fn for c in mod.bench_cases(True, [64] if fam == "gemm" else ())}
        assert fns == set(mod.VERSIONS), (fam, fns)


def test_family_module_checks_then_times(one_blas_thread, capsys):
    assert SG.bench_cases  # python -m kernels.sgd runs family_main("sgd")
    rc = _bench.family_main("sgd", ["--quick", "--versions", "v2_fused", "--repeats", "1"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "| sgd_step | LeNet all params n=431080 | v2_fused |" in out
    assert "(vendor: numpy/BLAS)" in out


def test_driver_writes_one_table_json_and_plot(one_blas_thread, tmp_path, capsys):
    from kernels import bench

    rc = bench.main(["sgd", "--quick", "--versions", "v2_fused", "--repeats", "1", "--out", str(tmp_path)])
    assert rc == 0
    table = (tmp_path / "kernels_table.md").read_text()
    assert table.startswith("# kernels.bench") and "| sgd_step | LeNet all params n=431080 | v2_fused |" in table
    assert "load average" in table and "ceilings, measured in this run" in table
    assert "vmovups" not in capsys.readouterr().out  # the assembly only with --asm
    results = json.loads((tmp_path / "kernels_results.json").read_text())
    assert {c["fn"] for c in results["cases"]} == {"sgd_step"}
    assert (tmp_path / "kernels_ladder.png").read_bytes()[:4] == b"\x89PNG"


def test_help_is_whole_sentences():
    r = subprocess.run(
        [sys.executable, "-m", "kernels.bench", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=ROOT),
        timeout=120,
    )
    assert r.returncode == 0
    paragraphs = [
        p for p in r.stdout.split("\n\n") if p.strip() and not p.startswith(("usage", "positional", "options"))
    ]
    assert paragraphs and all(p.rstrip().endswith(".") for p in paragraphs), r.stdout
    assert "--out" in r.stdout and "--asm" in r.stdout
