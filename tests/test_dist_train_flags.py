"""python -m minicaffe.train's distributed flags on a run of one process.

--comm, --wfbp, --bucket-kb and --link shape how nodes talk; one process has no nodes. A run
without --nodes > 1 still trains (a sweep over --nodes 1 2 4 passes the same flags to its
one-process baseline) and says in one line which of them it ignores; the defaults say nothing.
"""

import numpy as np
import pytest

from minicaffe import data
from minicaffe.tools import train

NET = """
name: "flags_net"
layer { name: "d" type: "Data" top: "data" top: "label"
        transform_param { scale: 0.00390625 } data_param { source: "flags_set" batch_size: 4 } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


@pytest.fixture
def solver_file(tmp_path):
    rng = np.random.default_rng(0)
    data.register_dataset("flags_set", rng.integers(0, 255, size=(8, 1, 4, 4)).astype(np.uint8), rng.integers(0, 3, 8))
    (tmp_path / "net.prototxt").write_text(NET)
    (tmp_path / "solver.prototxt").write_text(
        'net: "net.prototxt"\nbase_lr: 0.1\nlr_policy: "fixed"\nmax_iter: 2\nsnapshot_prefix: "f"\nrandom_seed: 1\n'
    )
    yield str(tmp_path / "solver.prototxt")
    data.unregister_dataset("flags_set")


NOTE = "apply only to a distributed run (--nodes > 1); this one-process run ignores them"


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--comm", "sfb", "--wfbp", "on"], "--comm, --wfbp"),
        (["--comm", "hybrid"], "--comm"),  # the default, but given: still ignored here
        (["--bucket-kb", "64", "--link", "1gbit", "--nodes", "1"], "--bucket-kb, --link"),
    ],
)
def test_one_process_run_names_the_distributed_flags_it_ignores(solver_file, tmp_path, capsys, flags, named):
    out = tmp_path / "run"
    assert train.main([solver_file, "--output", str(out), "--no-plot", *flags]) == 0
    err = capsys.readouterr().err
    assert f"note: {named} {NOTE}" in err and err.count(NOTE) == 1
    assert train.read_log(str(out))["train"]["iter"] == [0, 1]  # and it trained


def test_no_note_without_distributed_flags(solver_file, tmp_path, capsys):
    assert train.main([solver_file, "--output", str(tmp_path / "run"), "--no-plot", "--workers", "2"]) == 0
    assert NOTE not in capsys.readouterr().err


def test_staleness_help_names_both_kinds_of_run():
    text = train.build_parser().format_help()
    assert "with --workers or --nodes: bounded staleness" in " ".join(text.split())


def test_a_distributed_run_uses_them():
    for extra in (["--nodes", "2"], ["--rank", "1", "--world-size", "2", "--rendezvous", "127.0.0.1:1"]):
        argv = ["lenet", "--comm", "sfb", "--wfbp", "on", *extra]
        assert train.ignored_dist_flags(train.build_parser().parse_args(argv), argv) == []
