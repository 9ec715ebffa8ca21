"""benchmarks/step_timeline.py: a step's timeline, lane by lane (CIFAR-10 quick: synthetic data,
nothing to download)."""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "benchmarks"))


@pytest.fixture
def restore():
    from minicaffe.parallel import blas, lanes, plan

    saved = lanes.count(), plan.enabled(), blas.get_threads()
    yield
    lanes.set_count(saved[0])
    plan.set_enabled(saved[1])
    if saved[2]:
        blas.set_threads(saved[2])


@pytest.mark.parametrize("arena", [False, True])
def test_timeline_places_each_lane_s_layers_and_the_calling_thread_s(restore, capsys, arena):
    import step_timeline

    extra = ["--arena"] if arena else []
    assert step_timeline.main(["--net", "cifar10_quick", "--lanes", "2", "--steps", "2", "--warmup", "1", *extra]) == 0
    out = capsys.readouterr().out
    assert "2 lane(s), step plan on" in out
    assert ("one memory arena" in out) == arena
    rows = {}
    for line in out.splitlines()[2:]:
        thread = " ".join(line.split()[:2]) if line.startswith("lane") else line.split()[0]
        rest = line[7:].split()
        rows[(thread, " ".join(rest[:-3]) if not rest[0].startswith("other") else "other")] = rest
    for k in ("lane 0", "lane 1"):
        start, end, ms = (float(v) for v in rows[(k, "conv1 forward")][-3:])
        assert 0 <= start <= end and ms >= 0
        assert (k, "conv1 backward") in rows and (k, "wait: segment conv1 backward end") in rows
    # the loss runs on the calling thread, after the forward segment and before the backward one
    loss = float(rows[("main", "loss forward")][-3])
    assert float(rows[("main", "segment conv1 forward (lanes)")][-2]) <= loss
    assert loss <= float(rows[("main", "segment conv1 backward (lanes)")][-3])
    assert ("main", "other") in rows
