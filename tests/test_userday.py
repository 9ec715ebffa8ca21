"""A user's day with the train tool: runs that never clobber each other, a log that survives
kills and resumes, honest progress, one clear message per wrong file.

The tool runs in-process on a tiny net (a registered dataset), except where a signal has to
reach a real process (SIGTERM, kill -9): those start ``python -m minicaffe.train`` on a tiny
``.npz`` dataset.
"""

import hashlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest

from minicaffe import data
from minicaffe.tools import train
from minicaffe.tools.common import Eta

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

NET = """
name: "day_net"
layer { name: "d" type: "Data" top: "data" top: "label" include { phase: TRAIN }
        transform_param { scale: 0.00390625 } data_param { source: "SOURCE" batch_size: 4 } }
layer { name: "d" type: "Data" top: "data" top: "label" include { phase: TEST }
        transform_param { scale: 0.00390625 } data_param { source: "SOURCE" batch_size: 4 } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "acc" type: "Accuracy" bottom: "ip" bottom: "label" top: "accuracy" include { phase: TEST } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""

SOLVER = (
    'net: "net.prototxt"\ntest_iter: 2\ntest_interval: 5\nbase_lr: 0.5\nmomentum: 0.9\n'
    'lr_policy: "fixed"\ndisplay: 5\nmax_iter: 10\nsnapshot: 5\nsnapshot_prefix: "toy"\nrandom_seed: 4\n'
)


def toy_arrays():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, size=24)
    images = rng.integers(0, 30, size=(24, 1, 4, 4)).astype(np.uint8)
    images[np.arange(24), 0, 0, labels] = 255  # class k lights pixel (0, k): easy to learn
    return images, labels


def write_solver(directory, source, solver=SOLVER):
    (directory / "net.prototxt").write_text(NET.replace("SOURCE", source))
    (directory / "solver.prototxt").write_text(solver)
    return str(directory / "solver.prototxt")


@pytest.fixture
def solver_file(tmp_path):
    data.register_dataset("day_set", *toy_arrays())
    yield write_solver(tmp_path, "day_set")
    data.unregister_dataset("day_set")


def digest(directory):
    """{file: sha256} of every file under ``directory``."""
    out = {}
    for root, _, files in os.walk(directory):
        for f in files:
            p = os.path.join(root, f)
            out[os.path.relpath(p, directory)] = hashlib.sha256(open(p, "rb").read()).hexdigest()
    return out


# -- 1. runs never overwrite each other ----------------------------------------------------------
def test_each_run_gets_its_own_directory_and_a_latest_link(solver_file, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert train.main([solver_file, "--no-plot"]) == 0
    base = tmp_path / "runs" / "solver"
    (first,) = [d for d in os.listdir(base) if d != "latest"]
    before = digest(base / first)
    assert {"toy_iter_5.caffemodel", "toy_iter_10.solverstate", "train_log.jsonl"} <= set(before)
    assert os.readlink(base / "latest") == first
    from minicaffe.io import current_umask

    for f in ("train_log.jsonl", "toy_iter_5.caffemodel", "toy_iter_5.solverstate"):  # as any file the user makes
        assert os.stat(base / first / f).st_mode & 0o777 == 0o666 & ~current_umask(), f
    assert train.main([solver_file, "--no-plot", "--iters", "3"]) == 0  # a short trial after a long run
    runs = sorted(d for d in os.listdir(base) if d != "latest")
    assert len(runs) == 2 and runs[0] == first
    assert digest(base / first) == before  # the first run is untouched
    assert os.readlink(base / "latest") == runs[1]
    assert train.read_log(str(base / "latest"))["train"]["iter"] == [0, 1, 2]
    assert f"Run directory: {os.path.join('runs', 'solver', runs[1])}" in capsys.readouterr().out


def test_output_is_never_overwritten_without_force(solver_file, tmp_path, capsys):
    out = tmp_path / "run"
    assert train.main([solver_file, "--output", str(out), "--no-plot"]) == 0
    (out / "notes.txt").write_text("mine")
    before = digest(out)
    capsys.readouterr()
    assert train.main([solver_file, "--output", str(out), "--iters", "3", "--no-plot"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: --output: {out} already holds") and "--force" in err and err.count("\n") == 1
    assert digest(out) == before
    assert train.main([solver_file, "--output", str(out), "--iters", "3", "--no-plot", "--force"]) == 0
    files = set(os.listdir(out))
    assert "toy_iter_5.caffemodel" not in files and "toy_iter_10.solverstate" not in files  # the old run's
    assert (out / "notes.txt").read_text() == "mine"  # not a file of a run: kept
    assert train.read_log(str(out))["train"]["iter"] == [0, 1, 2]


def test_a_failed_start_leaves_nothing_behind(solver_file, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no matplotlib UserWarning (or any other) after the error
        assert train.main([solver_file, "--resume", "runs/x/toy_iter_5.solverstate"]) == 1
        assert train.main([solver_file, "--output", "o", "--weights", "nothing.caffemodel"]) == 1
        bad = tmp_path / "bad_solver.prototxt"
        bad.write_text(SOLVER.replace('lr_policy: "fixed"', 'lr_policy: "stpe"'))
        assert train.main([str(bad)]) == 1
    assert sorted(os.listdir(tmp_path)) == ["bad_solver.prototxt", "net.prototxt", "solver.prototxt"]
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "error: --resume: no such file: runs/x/toy_iter_5.solverstate"
    assert err[1] == "error: --weights: no such file: nothing.caffemodel"
    assert "unknown lr_policy 'stpe'" in err[2] and len(err) == 3


def test_wrong_kind_of_file_gets_one_clear_message(solver_file, tmp_path, capsys):
    out = tmp_path / "run"
    assert train.main([solver_file, "--output", str(out), "--no-plot", "--iters", "5"]) == 0
    capsys.readouterr()
    model, state = str(out / "toy_iter_5.caffemodel"), str(out / "toy_iter_5.solverstate")
    assert train.main([solver_file, "--output", str(tmp_path / "a"), "--resume", model]) == 1
    err = capsys.readouterr().err
    assert err == (
        f"error: --resume: {model} holds weights, not a solver state (a .solverstate written with it). "
        f"To start a new run from these weights: --weights {model}\n"
    )
    assert train.main([solver_file, "--output", str(tmp_path / "b"), "--weights", state]) == 1
    err = capsys.readouterr().err
    assert err == (
        f"error: --weights: {state} is a solver state, not weights. To continue that run: --resume {state}; "
        f"to start a new run from its weights: --weights {model}\n"
    )
    assert "allow_pickle" not in err and "record" not in err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


# -- 2. resuming continues the same log and plot -------------------------------------------------
def test_resume_from_a_run_directory_keeps_the_history(solver_file, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    full = tmp_path / "full"
    assert train.main([solver_file, "--output", str(full), "--no-plot"]) == 0
    assert train.main([solver_file, "--iters", "5"]) == 0
    (run,) = [d for d in os.listdir("runs/solver") if d != "latest"]
    # continue that run, to the solver's max_iter, naming only its directory
    assert train.main([solver_file, "--resume", "runs/solver/latest"]) == 0
    assert sorted(d for d in os.listdir("runs/solver") if d != "latest") == [run]  # the same directory
    log, ref = train.read_log(f"runs/solver/{run}"), train.read_log(str(full))
    assert log["train"]["iter"] == list(range(10)) and log["train"]["loss"] == ref["train"]["loss"]
    secs = log["train"]["seconds"]
    assert all(b >= a for a, b in zip(secs, secs[1:]))  # one time axis across the resume
    assert [t["iter"] for t in log["test"]] == [0, 5, 10]
    assert os.path.getsize(f"runs/solver/{run}/curves.png") > 10_000


# -- 3. progress: the ETA estimator on a synthetic clock -----------------------------------------
class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def simulate(total, interval, iter_s, test_s, compile_s, seed, ramp=0.0, test_cost=None, final=True):
    """Drive an Eta through a whole run on a synthetic clock; return [(iter, eta, true remaining)]."""
    rnd = random.Random(seed)
    clock = Clock()
    events = []  # (kind, duration) in order
    for it in range(total):
        if interval and it % interval == 0:
            events.append(("test", test_s * rnd.uniform(0.9, 1.1) + (compile_s if it == 0 else 0)))
        pace = iter_s * (1 + ramp * max(0.0, 1 - it / 100))  # optional slow start
        events.append(("iter", pace * rnd.uniform(0.8, 1.2) + (compile_s if it == 0 else 0)))
    if interval and final:
        events.append(("test", test_s * rnd.uniform(0.9, 1.1)))
    end = sum(d for _, d in events)
    guess = test_cost if test_cost is not None else test_s / iter_s
    eta = Eta(total, 0, interval, guess, final_test=bool(interval), clock=clock)
    eta.begin()
    done, out = 0, []
    for kind, duration in events:
        if kind == "test":
            eta.test_begin()
            clock.t += duration
            eta.test_end(done)
        else:
            clock.t += duration
            done += 1
            eta.iteration(done)
            out.append((done, eta.remaining(), end - clock.t))
    return out


@pytest.mark.parametrize(
    "case",
    [
        # LeNet on 2 cores: 18 ms per iteration, a 1.5 s test every 500, ~8 s of first compilation
        dict(total=10000, interval=500, iter_s=0.018, test_s=1.5, compile_s=8.0),
        # the guess of a test's cost is off by 2x; the pace starts 50% slower and settles
        dict(total=10000, interval=500, iter_s=0.018, test_s=1.5, compile_s=8.0, test_cost=40, ramp=0.5),
        # CIFAR-10 quick: 4000 iterations, tests every 500 that cost 40 iterations each
        dict(total=4000, interval=500, iter_s=0.1, test_s=4.0, compile_s=20.0),
        # no tests at all, a short run
        dict(total=500, interval=0, iter_s=0.05, test_s=0.0, compile_s=5.0),
    ],
)
def test_eta_is_right_within_20_percent_after_2_percent(case):
    for seed in range(3):
        trace = simulate(seed=seed, **case)
        total = case["total"]
        for done, eta, truth in trace:
            if done >= 0.02 * total and done < total:
                assert eta is not None
                assert abs(eta - truth) <= 0.2 * truth, (done, eta, truth)


def test_naive_eta_would_fail_the_same_check():
    """The check above has teeth: elapsed/done*left (what the tool printed before) misses by far."""
    rnd = random.Random(0)
    t, times = 8.0 + 8.0, []  # first test and first iteration compile
    for it in range(10000):
        t += 0.018 * rnd.uniform(0.8, 1.2) + (1.5 if it and it % 500 == 0 else 0)
        times.append(t)
    end = times[-1] + 1.5
    done = 200
    naive = times[done - 1] / done * (10000 - done)
    assert abs(naive - (end - times[done - 1])) > 0.2 * (end - times[done - 1])


def test_eta_counts_the_tests_left():
    clock = Clock()
    eta = Eta(100, 0, test_interval=30, test_cost=0, clock=clock)
    assert eta.tests_left() == 5  # at 0, 30, 60, 90 and the final one at 100
    eta.test_end(0)
    assert eta.tests_left() == 4
    eta.iteration(31)
    assert eta.tests_left() == 3
    eta = Eta(90, 0, test_interval=30, clock=clock)
    eta.iteration(60)
    eta.test_end(60)
    assert eta.tests_left() == 1  # the one at 90 is the final one
    assert Eta(90, 0, test_interval=0, clock=clock).tests_left() == 0


# -- 4. --iters N ends with a test of the trained net ---------------------------------------------
def test_iters_ends_with_a_final_test(solver_file, tmp_path, capsys):
    out = tmp_path / "run"
    assert train.main([solver_file, "--output", str(out), "--iters", "7", "--no-plot"]) == 0
    text = capsys.readouterr().out
    assert "Final test at iteration 7 (the run ended between test intervals)" in text
    assert re.search(r"Final test \(iteration 7\): accuracy = ", text)
    assert [t["iter"] for t in train.read_log(str(out))["test"]] == [0, 5, 7]


def test_step_one_loop_logs_the_real_pace(solver_file, tmp_path, monkeypatch):
    from minicaffe import get_solver

    monkeypatch.chdir(tmp_path)  # the solver snapshots to its relative prefix "toy"

    lines = []
    solver = get_solver(solver_file, log=lines.append)
    t0 = time.perf_counter()
    for _ in range(11):
        solver.step(1)
    wall = time.perf_counter() - t0
    rates = [float(m[1]) for m in (re.match(r"Iteration (?:5|10) \((\S+) iter/s", x) for x in lines) if m]
    assert len(rates) == 2 and os.path.exists(tmp_path / "toy_iter_10.caffemodel")
    for rate in rates:
        assert rate > 0 and rate >= 5 / wall / 2  # 5 iterations per display line, in at most the wall time


# -- 7. solver_mode in the file, --device on the command line ------------------------------------
def test_device_choice_is_printed(solver_file, tmp_path, capsys):
    from minicaffe import backend

    gpu = tmp_path / "gpu_solver.prototxt"
    gpu.write_text(SOLVER + "solver_mode: GPU\n")
    assert train.main([str(gpu), "--output", str(tmp_path / "a"), "--iters", "1", "--no-plot"]) == 0
    line = [x for x in capsys.readouterr().out.splitlines() if "Device: " in x][0]
    if backend.why_not("gpu") is None:
        assert line.endswith("Device: gpu (solver_mode: GPU in gpu_solver.prototxt)")
    else:
        assert "Device: cpu (solver_mode: GPU in gpu_solver.prototxt, but no GPU here: " in line
    assert train.main([str(gpu), "--output", str(tmp_path / "b"), "--iters", "1", "--no-plot", "--device", "cpu"]) == 0
    line = [x for x in capsys.readouterr().out.splitlines() if "Device: " in x][0]
    assert line.endswith("Device: cpu (--device; the solver's solver_mode: GPU is overridden)")
    backend.set_mode("cpu")


# -- issue-14 findings 4 and 6: temporaries and signals ------------------------------------------
def test_a_crash_mid_snapshot_is_never_the_last_good_snapshot(tmp_path, capsys):
    """A run whose learning rate explodes at iteration 7 stops at iteration 8; a temporary left by
    an earlier crash mid-snapshot (newer, bigger iteration) must not be named, and is removed."""
    data.register_dataset("day_set", *toy_arrays())
    try:
        diverging = SOLVER.replace('lr_policy: "fixed"', 'lr_policy: "step"\nstepsize: 7\ngamma: 1e60')
        solver = write_solver(tmp_path, "day_set", diverging)
        out = tmp_path / "run"
        assert train.main([solver, "--output", str(out), "--iters", "5", "--no-plot"]) == 0
        good = out / "toy_iter_5.solverstate"
        torn = out / ".tmp-k2x9toy_iter_9.solverstate"  # as minicaffe.io.atomic_write names them
        torn.write_bytes(good.read_bytes()[:300])
        os.utime(torn, (time.time() + 60, time.time() + 60))
        capsys.readouterr()
        with np.errstate(all="ignore"):
            assert train.main([solver, "--resume", str(good), "--no-plot"]) == 1
        text = capsys.readouterr().out
        assert f"The last good snapshot is kept: {good}" in text
        assert "Removed .tmp-k2x9toy_iter_9.solverstate" in text
        assert not torn.exists()
        assert train.last_snapshot(str(out)) == str(good)
    finally:
        data.unregister_dataset("day_set")


def test_last_snapshot_skips_incomplete_ones(tmp_path):
    (tmp_path / "a_iter_20.solverstate").write_bytes(b"PK\x03\x04 torn")  # no .caffemodel, torn zip
    (tmp_path / ".tmp-zza_iter_30.solverstate").write_bytes(b"")
    assert train.last_snapshot(str(tmp_path)) is None
    np.savez(tmp_path / "a_iter_10.solverstate", record=np.zeros(3, np.uint8))
    os.replace(tmp_path / "a_iter_10.solverstate.npz", tmp_path / "a_iter_10.solverstate")
    (tmp_path / "a_iter_10.caffemodel").write_bytes(b"")
    assert train.last_snapshot(str(tmp_path)) == str(tmp_path / "a_iter_10.solverstate")


def start_training(tmp_path, *flags):
    """python -m minicaffe.train on the toy net (a .npz dataset) in a process of its own."""
    images, labels = toy_arrays()
    np.savez(tmp_path / "toy.npz", images=images, labels=labels)
    solver = write_solver(tmp_path, str(tmp_path / "toy.npz"), SOLVER.replace("display: 5", "display: 20"))
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    cmd = [sys.executable, "-m", "minicaffe.train", solver, "--output", str(tmp_path / "run"), "--no-plot"]
    cmd += ["--iters", "1000000", "--snapshot", "0", "--test-interval", "50", *flags]
    out, err = open(tmp_path / "stdout.txt", "w"), open(tmp_path / "stderr.txt", "w")
    return subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=out, stderr=err, text=True)


def outputs(tmp_path):
    return (tmp_path / "stdout.txt").read_text(), (tmp_path / "stderr.txt").read_text()


def wait_for_iterations(proc, log, n, timeout=120):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            pytest.fail(f"the run ended early (exit status {proc.returncode})")
        if os.path.exists(log) and len(train.read_log(log)["train"]["iter"]) >= n:
            return
        time.sleep(0.2)
    proc.kill()
    pytest.fail("no progress in the log")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_sigterm_stops_like_ctrl_c_with_a_snapshot_and_the_resume_command(tmp_path, sig):
    proc = start_training(tmp_path, "--seed", "3")
    log = str(tmp_path / "run" / train.LOG_NAME)
    try:
        wait_for_iterations(proc, log, 100)
        proc.send_signal(sig)
        proc.wait(timeout=60)
    finally:
        proc.kill()
    out, err = outputs(tmp_path)
    assert proc.returncode == 130, err
    what = "SIGTERM" if sig == signal.SIGTERM else "Ctrl-C"
    assert f"{what}: stopping after this iteration and writing a snapshot (Ctrl-C again to abort)" in out
    state = train.last_snapshot(str(tmp_path / "run"))
    it = int(re.search(r"_iter_(\d+)", state)[1])
    assert f"Stopped at iteration {it}. To continue this run:" in out
    command = out.split("To continue this run:\n")[1].splitlines()[0].split(" ", 1)[1].strip()
    solver = str(tmp_path / "solver.prototxt")
    assert command == (
        f"python -m minicaffe.train {solver} --no-plot --iters 1000000 --snapshot 0 --test-interval 50 --seed 3 "
        f"--resume {state}"
    )
    end = train.read_log(log)["end"]
    assert end["status"] == "stopped" and end["iter"] == it
    # the printed command continues the run, in the same directory and log
    words = command.split()[3:]
    words[words.index("--iters") + 1] = str(it + 3)  # only a few more iterations here
    assert train.main(words) == 0
    log_after = train.read_log(log)
    assert log_after["train"]["iter"] == list(range(it + 3)) and len(log_after["runs"]) == 2


def test_the_log_survives_kill_9_up_to_the_last_display_line(tmp_path):
    proc = start_training(tmp_path)
    log = str(tmp_path / "run" / train.LOG_NAME)
    try:
        wait_for_iterations(proc, log, 150)
        proc.kill()  # SIGKILL: no handler runs
        proc.wait(timeout=60)
    finally:
        proc.kill()
    lines = open(log).read().splitlines()
    records = [json.loads(x) for x in lines[:-1]]  # every line whole, but perhaps the one being written
    try:
        records.append(json.loads(lines[-1]))
    except ValueError:
        pass
    iters = [r["iter"] for r in records if r["kind"] == "iter"]
    assert iters == list(range(len(iters))) and len(iters) >= 150
    assert records[0]["kind"] == "start" and all(r["kind"] != "end" for r in records)
    assert [r["iter"] for r in records if r["kind"] == "test"] == list(range(0, iters[-1] + 2, 50))


# -- 8. the test run itself: skip reasons, warnings, temporary files ------------------------------
def test_test_runs_leave_no_temp_dirs_and_say_why_gpu_cases_skip(pytester):
    pytester.makeconftest(open(os.path.join(ROOT, "tests", "conftest.py")).read())
    pytester.makepyfile(
        test_leaky="""
        import tempfile, numpy as np, pytest

        def test_leaks_a_directory():
            print("LEAK", tempfile.mkdtemp(prefix="lesson4-"))

        @pytest.mark.gpu
        def test_on_the_gpu():
            pass

        @pytest.mark.nan_expected
        def test_overflow_on_purpose():
            np.float32(3e38) * np.float32(10)
        """
    )
    result = pytester.runpytest_subprocess("-s", "-rs", "-W", "error::RuntimeWarning", "-p", "no:cacheprovider")
    out = result.stdout.str()
    leaked = re.search(r"LEAK (\S+)", out)[1]
    assert not os.path.exists(leaked)  # removed at the end of the run
    assert "removed what tests left in the temporary directory: lesson4-" in result.stderr.str()
    assert "already runs numba's CUDA simulator" not in out
    from conftest import _why_no_gpu

    if _why_no_gpu() is not None:
        assert "needs a real NVIDIA GPU" in out and "skipped" in out
    result.assert_outcomes(passed=3 if _why_no_gpu() is None else 2, skipped=0 if _why_no_gpu() is None else 1)


# -- 9. the README's flag table, 10. a script beside the clone --------------------------------------
def test_readme_flag_table_is_valid_markdown_and_complete():
    text = open(os.path.join(ROOT, "README.md")).read()
    section = text[text.index("## Training") :]
    rows = [line for line in section[: section.index("\n\n", section.index("| flag |"))].splitlines() if line]
    rows = [line for line in rows if line.startswith("|")]
    assert rows[0] == "| flag | meaning |" and rows[1] == "|---|---|"
    for row in rows[2:]:
        cells = re.split(r"(?<!\\)\|", row.strip())[1:-1]  # unescaped pipes separate cells
        assert len(cells) == 2, row
    documented = set(re.findall(r"--[a-z][a-z-]*", "\n".join(rows)))
    flags = set(re.findall(r"--[a-z][a-z-]*", train.build_parser().format_usage()))
    import argparse

    from minicaffe.dist import launch

    dist_parser = argparse.ArgumentParser()
    launch.add_arguments(dist_parser)  # the distributed flags: the table names the main ones, --help the rest
    dist_flags = set(re.findall(r"--[a-z][a-z-]*", dist_parser.format_usage()))
    assert flags - dist_flags - {"--help"} <= documented, flags - documented
    assert 'pip install -e ".[test]" --config-settings editable_mode=compat' in text


def test_a_script_beside_the_clone_imports_the_package(tmp_path):
    """A clone folder named minicaffe next to a script: with the clone on the path (what the
    README's editable_mode=compat install does) the package wins; without it, the folder does."""
    os.symlink(ROOT, tmp_path / "minicaffe")
    (tmp_path / "script.py").write_text("import minicaffe as caffe\ncaffe.set_mode_cpu()\nprint('ok')\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    with_path = subprocess.run(
        [sys.executable, "script.py"], cwd=tmp_path, env=dict(env, PYTHONPATH=ROOT), capture_output=True, text=True
    )
    assert with_path.stdout.strip() == "ok", with_path.stderr
    site = [p for p in sys.path if p.endswith("site-packages")]
    alone = subprocess.run(
        [sys.executable, "-S", "-c", f"import sys; sys.path[:0] = ['{tmp_path}']; sys.path += {site!r}; "
         "import minicaffe; minicaffe.set_mode_cpu()"],
        cwd=tmp_path, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert "has no attribute 'set_mode_cpu'" in alone.stderr  # the failure the install option avoids


def test_progress_line_says_the_phase_and_the_whole_run():
    from minicaffe.tools.common import Progress

    clock = Clock()
    progress = Progress(0)
    assert progress.line() == "setting up ..."
    eta = Eta(1000, 0, clock=clock)
    progress.total, progress.eta = 1000, eta
    progress.phase = "first iteration (numba compiles the kernels on a first run)"
    assert progress.line().endswith(
        "0/1000 first iteration (numba compiles the kernels on a first run), -- ms/it, ETA --"
    )
    eta.begin()
    for i in range(1, 101):
        clock.t += 5.0 if i == 1 else 0.02
        eta.iteration(i)
    progress.done, progress.phase, progress.extra = 100, "training", "loss 0.5"
    assert progress.line().endswith("100/1000 training, 20.0 ms/it, ETA 18s (run 25s) loss 0.5")


def test_resuming_from_an_earlier_snapshot_branches_instead_of_overwriting(solver_file, tmp_path, capsys):
    run = tmp_path / "run"
    assert train.main([solver_file, "--output", str(run), "--no-plot"]) == 0  # snapshots at 5 and 10
    before = digest(run)
    capsys.readouterr()
    assert train.main([solver_file, "--resume", str(run / "toy_iter_5.solverstate"), "--no-plot"]) == 1
    err = capsys.readouterr().err
    assert "holds later snapshots of this run (toy_iter_10.solverstate)" in err and "--output NEWDIR" in err
    assert digest(run) == before
    branch = tmp_path / "branch"
    assert train.main([solver_file, "--resume", str(run / "toy_iter_5.solverstate"), "--output", str(branch)]) == 0
    assert digest(run) == before
    log = train.read_log(str(branch))
    assert log["train"]["iter"] == list(range(10))  # the history up to iteration 5 came along
    assert log["train"]["loss"] == train.read_log(str(run))["train"]["loss"]


def test_a_first_run_says_it_is_fetching_mnist(tmp_path, monkeypatch, capsys):
    """MNIST missing from the data directory: the tool fetches it before building the nets, and
    says so (here from a small local wheel with the real layout; nothing is downloaded)."""
    import gzip
    import hashlib
    import pickle
    import zipfile

    from minicaffe.data import mnist, set_data_dir

    rng = np.random.default_rng(0)
    parts = tuple(
        (rng.integers(0, 256, (n, 784)).astype(np.float32) / np.float32(256), rng.integers(0, 10, n).astype(np.int64))
        for n in (30, 10, 8)
    )
    pkl_gz = gzip.compress(pickle.dumps(parts, protocol=4))
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    wheel = data_dir / mnist.WHEEL_FILENAME
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("mnist/__init__.py", "")
        z.writestr(mnist.PICKLE_MEMBER, pkl_gz)
    monkeypatch.setattr(mnist, "WHEEL_SHA256", hashlib.sha256(wheel.read_bytes()).hexdigest())
    monkeypatch.setattr(mnist, "PICKLE_SHA256", hashlib.sha256(pkl_gz).hexdigest())
    (tmp_path / "net.prototxt").write_text(
        'layer { name: "d" type: "Data" top: "data" top: "label" transform_param { scale: 0.00390625 }'
        ' data_param { source: "mnist_train" batch_size: 4 } }\n'
        'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 10 } }\n'
        'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }\n'
    )
    (tmp_path / "solver.prototxt").write_text('net: "net.prototxt"\nbase_lr: 0.1\nmax_iter: 2\n')
    try:
        args = [str(tmp_path / "solver.prototxt"), "--data-dir", str(data_dir), "--output", str(tmp_path / "r")]
        assert train.main(args + ["--no-plot"]) == 0
    finally:
        set_data_dir(None)
    out = capsys.readouterr().out
    assert f"Fetching MNIST: first use on this machine, into {data_dir / 'mnist'}" in out
    assert out.index("Fetching MNIST") < out.index("Setting up: building the nets")
    assert (data_dir / "mnist" / "mnist.npz").exists()


def test_a_killed_test_run_s_temporary_directory_is_removed_by_the_next(tmp_path):
    from conftest import _remove_stale_roots

    dead, alive = tmp_path / "minicaffe-tests-999999999-ab", tmp_path / f"minicaffe-tests-{os.getpid()}-cd"
    for d in (dead, alive):
        (d / "lesson4-x").mkdir(parents=True)
    _remove_stale_roots(str(tmp_path))
    assert not dead.exists() and alive.exists()
