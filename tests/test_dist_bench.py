"""benchmarks/poseidon.py's bookkeeping: every row names the code that measured it."""

import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def bench():
    spec = importlib.util.spec_from_file_location("poseidon_bench", os.path.join(ROOT, "benchmarks", "poseidon.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_code_table_names_the_commit_of_every_row():
    b = bench()
    results = {
        "lenet|4|1gbit|ps|off": {"code_commit": "abc1234", "load": 2.0},
        "lenet|4|1gbit|hybrid|on": {"code_commit": "abc1234", "load": 3.5},
        "lenet|2|1gbit|ps|off": {"load": 1.0},  # a row from before commits were recorded
        "cifar10_quick|4|1gbit|ps|off": {"code_commit": "def5678+", "load": None},
    }
    text = b.code_table(results)
    assert "abc1234: lenet 4 1gbit (2, load 2.0-3.5)" in text
    assert "before: lenet 2 1gbit (1, load 1.0-1.0)" in text
    assert "def5678+: cifar10_quick 4 1gbit (1, load ?)" in text


def test_code_commit_is_this_checkout():
    commit = bench().code_commit()
    assert commit is None or commit.rstrip("+").isalnum()


def test_the_machine_per_iteration_is_the_long_run_less_the_short_one():
    """benchmarks/poseidon_machine.py: start-up cancels in the difference of two runs; what the
    cores did beyond the nodes' own CPU is split into busy (softirq, system), idle and steal."""
    spec = importlib.util.spec_from_file_location(
        "poseidon_machine", os.path.join(ROOT, "benchmarks", "poseidon_machine.py")
    )
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    zero = dict.fromkeys(m.FIELDS, 0.0)
    start = zero | {"user": 5.0, "system": 3.0, "idle": 2.0}  # the start-up, in both runs
    per = zero | {"user": 0.6, "system": 0.2, "softirq": 0.25, "idle": 0.02, "steal": 0.01}  # per iteration
    short = {"iters": 8, "machine": {k: start[k] + 8 * per[k] for k in m.FIELDS}}
    long = {"iters": 24, "machine": {k: start[k] + 24 * per[k] for k in m.FIELDS}}
    long |= {"node_cpu_s": 0.25, "period_s": 0.54, "bytes": 7e8}
    got = m.per_iteration(short, long, nodes=4)
    assert got["machine_s"]["user"] == pytest.approx(0.6) and got["machine_s"]["softirq"] == pytest.approx(0.25)
    assert got["busy_s"] == pytest.approx(1.05) and got["nodes_cpu_s"] == pytest.approx(1.0)
    assert got["outside_nodes_s"] == pytest.approx(0.05)
    assert got["idle_s"] == pytest.approx(0.02) and got["steal_s"] == pytest.approx(0.01)
