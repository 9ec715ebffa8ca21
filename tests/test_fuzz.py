"""A seeded fuzz test over minicaffe's decoders (tests/fuzz_harness.py): prototxt, weights
(.caffemodel, .npz), snapshots (minicaffe's .solverstate and a snapshot's .caffemodel; Caffe's
binary SolverState) and IDX files.

What it guarantees, per case: only minicaffe's own errors escape; no case allocates more than
16 MB + 64x its input (traced by tracemalloc); none takes longer than 2 s; a damaged snapshot is
either refused or restores exactly what was saved (Caffe's own formats carry no checksum, so a
flipped float there cannot be seen).  ~800 cases, a few seconds on a quiet core.
"""

import pytest

from tests.fuzz_harness import close_targets, make_targets, run_cases, summarize

CASES = {"prototxt": 150, "caffemodel": 100, "npz": 100, "solverstate": 120, "snapshot-caffemodel": 60}
CASES_DEFAULT = 80
SEED = 20261130


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz")
    yield {t.name: t for t in make_targets(str(tmp))}
    close_targets()


@pytest.mark.parametrize(
    "name",
    ["prototxt", "caffemodel", "npz", "solverstate", "snapshot-caffemodel", "caffe-solverstate", "idx", "idx.gz"],
)
def test_fuzz(targets, name):
    target = targets[name]
    outcomes = run_cases(target, SEED, CASES.get(name, CASES_DEFAULT))
    bad = [o for o in outcomes if o.kind in ("ugly", "hang", "heavy")]
    if target.name in ("solverstate", "snapshot-caffemodel"):
        bad += [o for o in outcomes if o.kind == "silent"]
    assert not bad, "\n".join(map(repr, bad[:10]))
    counts = summarize(outcomes)[name]
    assert counts["tried"] == len(outcomes)
    assert counts.get("refused", 0) > 0  # the mutations do reach the checks
