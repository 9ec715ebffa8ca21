"""benchmarks/poseidon.py's bookkeeping: every row names the code that measured it."""

import importlib.util
import os

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
