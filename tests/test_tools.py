"""The command-line tools, run in-process on a tiny net with a registered dataset."""

import os

import numpy as np
import pytest

from minicaffe import data
from minicaffe.tools import score, timing, train

NET = """
name: "tool_net"
layer { name: "d" type: "Data" top: "data" top: "label" include { phase: TRAIN }
        transform_param { scale: 0.00390625 } data_param { source: "tool_set" batch_size: 4 } }
layer { name: "d" type: "Data" top: "data" top: "label" include { phase: TEST }
        transform_param { scale: 0.00390625 } data_param { source: "tool_set" batch_size: 4 } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "acc" type: "Accuracy" bottom: "ip" bottom: "label" top: "accuracy" include { phase: TEST } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


@pytest.fixture
def solver_file(tmp_path):
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, size=24)
    images = rng.integers(0, 30, size=(24, 1, 4, 4)).astype(np.uint8)
    images[np.arange(24), 0, 0, labels] = 255  # class k lights pixel (0, k): easy to learn
    data.register_dataset("tool_set", images, labels)
    (tmp_path / "net.prototxt").write_text(NET)
    (tmp_path / "solver.prototxt").write_text(
        'net: "net.prototxt"\ntest_iter: 2\ntest_interval: 5\nbase_lr: 0.5\nmomentum: 0.9\n'
        'lr_policy: "fixed"\ndisplay: 5\nmax_iter: 10\nsnapshot: 5\nsnapshot_prefix: "toy"\nrandom_seed: 4\n'
    )
    yield str(tmp_path / "solver.prototxt")
    data.unregister_dataset("tool_set")


def test_train_writes_snapshots_log_and_curves(solver_file, tmp_path, capsys):
    out = tmp_path / "run"
    assert train.main([solver_file, "--output", str(out)]) == 0
    files = set(os.listdir(out))
    assert {
        "toy_iter_5.caffemodel",
        "toy_iter_5.solverstate",
        "toy_iter_10.caffemodel",
        "toy_iter_10.solverstate",
        "train_log.jsonl",
        "curves.png",
    } <= files
    log = train.read_log(str(out))
    assert log["train"]["iter"] == list(range(10))
    assert [t["iter"] for t in log["test"]] == [0, 5, 10]
    assert log["test"][-1]["outputs"]["accuracy"] > 0.5
    assert log["runs"][0]["versions"]["numpy"] == np.__version__
    text = capsys.readouterr().out
    assert "Iteration 5 (" in text and "Test net output #0: accuracy = " in text
    assert "Trained 10 iterations in" in text


def test_resume_continues_exactly(solver_file, tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    assert train.main([solver_file, "--output", str(full), "--no-plot"]) == 0
    assert train.main([solver_file, "--output", str(part), "--iters", "5", "--no-plot"]) == 0
    assert (
        train.main([solver_file, "--output", str(part), "--resume", str(part / "toy_iter_5.solverstate"), "--no-plot"])
        == 0
    )
    a, b = train.read_log(str(full)), train.read_log(str(part))
    # one log for the whole run: the history before the resume point is kept
    assert b["train"]["iter"] == list(range(10))
    assert b["train"]["loss"] == a["train"]["loss"]
    assert [(t["iter"], t["outputs"]) for t in b["test"]] == [(t["iter"], t["outputs"]) for t in a["test"]]
    assert [r["resumed_at"] for r in b["runs"]] == [None, 5]
    from minicaffe.io import read_weight_arrays

    for layer, blobs in read_weight_arrays(str(full / "toy_iter_10.caffemodel")).items():
        for x, y in zip(blobs, read_weight_arrays(str(part / "toy_iter_10.caffemodel"))[layer]):
            np.testing.assert_array_equal(x, y)


def test_diverging_run_stops_and_keeps_snapshot(solver_file, tmp_path, capsys):
    out = tmp_path / "nan"
    text = open(solver_file).read().replace("base_lr: 0.5", "base_lr: 1e38")
    bad = tmp_path / "bad_solver.prototxt"
    bad.write_text(text)
    assert train.main([str(bad), "--output", str(out), "--no-plot"]) == 1
    printed = capsys.readouterr().out
    assert "ERROR: loss is" in printed and "training diverged" in printed
    assert "train_log.jsonl" in os.listdir(out)


def test_train_errors_are_one_line(tmp_path, capsys):
    assert train.main(["no_such_net"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: no solver 'no_such_net'") and "lenet" in err
    bad = tmp_path / "s.prototxt"
    bad.write_text('net: "missing.prototxt"\n')
    assert train.main([str(bad), "--output", str(tmp_path / "o")]) == 1
    assert "'missing.prototxt' not found" in capsys.readouterr().err
    bad.write_text('net: "missing.prototxt"\nbase_lr: 0.1\nlr_policy: "stpe"\n')
    assert train.main([str(bad), "--output", str(tmp_path / "o")]) == 1
    assert "unknown lr_policy 'stpe'" in capsys.readouterr().err
    bad.write_text('nett: "x"\n')
    assert train.main([str(bad)]) == 1
    assert "s.prototxt:1:1: unknown field 'nett'" in capsys.readouterr().err


def test_score_and_time_tools(solver_file, tmp_path, capsys):
    out = tmp_path / "run"
    assert train.main([solver_file, "--output", str(out), "--no-plot"]) == 0
    net = os.path.join(os.path.dirname(solver_file), "net.prototxt")
    capsys.readouterr()
    assert score.main([net, "--weights", str(out / "toy_iter_10.caffemodel"), "--iterations", "3"]) == 0
    text = capsys.readouterr().out
    assert "Batch 2, accuracy = " in text and "\nI" in text and "accuracy = " in text.splitlines()[-3]
    assert timing.main([net, "--iterations", "3", "--warmup", "1"]) == 0
    text = capsys.readouterr().out
    assert "ip InnerProduct" in text and "Average Forward-Backward:" in text
    assert score.main([net, "--weights", str(tmp_path / "none.caffemodel")]) == 1
    assert "weights file not found" in capsys.readouterr().err


def test_train_with_worker_threads(solver_file, tmp_path, capsys):
    out = tmp_path / "workers"
    assert train.main([solver_file, "--output", str(out), "--workers", "2", "--no-plot"]) == 0
    text = capsys.readouterr().out
    assert "Training with 2 worker thread(s) (BSP)" in text and "Parallel: 10 iterations" in text
    log = train.read_log(str(out))
    assert log["train"]["iter"] == list(range(10))
    assert log["test"][-1]["outputs"]["accuracy"] > 0.5
    assert train.main([solver_file, "--output", str(out), "--workers", "0"]) == 1
    assert "--workers must be >= 1" in capsys.readouterr().err


def test_train_weights_reports_what_it_copied_once_in_the_log(solver_file, tmp_path, capsys):
    out = tmp_path / "run"
    assert train.main([solver_file, "--output", str(out), "--no-plot", "--iters", "5"]) == 0
    weights = str(out / "toy_iter_5.caffemodel")
    capsys.readouterr()
    assert (
        train.main([solver_file, "--output", str(tmp_path / "b"), "--no-plot", "--iters", "1", "--weights", weights])
        == 0
    )
    captured = capsys.readouterr()
    assert captured.out.count(f"Copied 1 layer(s) from {weights}") == 1
    assert f"Initialized from {weights}" in captured.out
    assert "Copied" not in captured.err  # the report goes to the tool's log, not around it
