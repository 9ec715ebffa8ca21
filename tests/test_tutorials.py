"""The course runs: every lesson in quick mode (it asserts its own claims), every exercise's
reference solution passes its checker and every unmodified stub fails it, every thought question
has an answer, and the renderer turns a lesson into a notebook and a page with its figures.

A lesson nobody runs rots (Caffe's tutorials named files that no longer existed)."""

import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TUT = os.path.join(ROOT, "tutorials")
LESSONS = sorted(f for f in os.listdir(TUT) if re.match(r"\d\d_.*\.py$", f))


def _env(tmp_path, **extra):
    scratch = tmp_path / "tmp"
    scratch.mkdir(exist_ok=True)
    env = dict(
        os.environ,
        MINICAFFE_TUTORIAL_QUICK="1",
        MINICAFFE_TUTORIAL_FIGURES=str(tmp_path / "figures"),
        TMPDIR=str(scratch),
        PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])),
    )
    env.update(extra)
    return env


def _exercises(lesson):
    """[(number, is_code, text)] of the numbered items under a lesson's '## Exercises'."""
    with open(os.path.join(TUT, lesson)) as f:
        text = f.read()
    part = text.split("# ## Exercises", 1)[1].split("# %%", 1)[0]
    items = re.findall(r"^# (\d+)\. (.*?)(?=^# \d+\. |^#\s*$|\Z)", part, flags=re.S | re.M)
    return [(int(n), "tutorials.check" in body, body) for n, body in items]


def test_the_course_has_its_lessons():
    assert [f[:2] for f in LESSONS][:9] == [f"{i:02d}" for i in range(1, 10)], LESSONS


@pytest.mark.parametrize("lesson", LESSONS)
def test_lesson_runs(lesson, tmp_path):
    """Quick mode, as a reader runs it: it finishes, draws its figures, leaves no temp files."""
    env = _env(tmp_path)
    out = subprocess.run(
        [sys.executable, os.path.join("tutorials", lesson)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, f"{lesson} failed:\n{out.stdout[-3000:]}\n{out.stderr[-4000:]}"
    assert f"lesson {int(lesson[:2])} done" in out.stdout
    figures = [f for f in os.listdir(tmp_path / "figures") if f.startswith(lesson[:2]) and f.endswith(".png")]
    assert figures, f"{lesson} drew no figure"
    left = os.listdir(tmp_path / "tmp")
    assert not left, f"{lesson} left temporary files behind: {left}"


@pytest.mark.parametrize("lesson", LESSONS)
def test_lesson_has_the_form(lesson):
    """Opens with what it teaches and needs; 2-4 exercises; a check command for each code one."""
    with open(os.path.join(TUT, lesson)) as f:
        head = f.read(1500)
    assert head.startswith("# %% [markdown]\n# # Lesson"), f"{lesson} must open with a markdown title cell"
    assert "**You will learn**" in head and "**You need**" in head, f"{lesson} must say what it teaches and assumes"
    items = _exercises(lesson)
    assert 2 <= len(items) <= 4, f"{lesson} has {len(items)} exercises"
    from tutorials.checks import CHECKS

    for n, is_code, body in items:
        ex_id = f"{lesson[:2]}.{n}"
        if is_code:
            assert f"tutorials.check {ex_id}" in body, f"{ex_id} names the wrong check: {body!r}"
            assert ex_id in CHECKS, f"{ex_id} has no check in tutorials/checks.py"


def test_every_thought_question_has_an_answer():
    with open(os.path.join(TUT, "solutions", "ANSWERS.md")) as f:
        answered = set(re.findall(r"^## (\d\d\.\d+)$", f.read(), flags=re.M))
    asked = {f"{lesson[:2]}.{n}" for lesson in LESSONS for n, is_code, _ in _exercises(lesson) if not is_code}
    assert asked <= answered, f"no answer in ANSWERS.md for {sorted(asked - answered)}"


def _check(tmp_path, *args):
    out = subprocess.run(
        [sys.executable, "-m", "tutorials.check", "all", "--json", *args],
        cwd=ROOT,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.stdout.strip(), out.stderr[-3000:]
    return {r["id"]: r for r in json.loads(out.stdout.strip().splitlines()[-1])}


def test_solutions_pass_their_checks(tmp_path):
    results = _check(tmp_path, "--solutions")
    failed = {i: r["message"] for i, r in results.items() if not r["ok"]}
    assert not failed, failed
    from tutorials.checks import CHECKS

    assert set(results) == set(CHECKS)


def test_stubs_fail_their_checks(tmp_path):
    """A checker that passes the unmodified stub checks nothing."""
    results = _check(tmp_path)
    passed = [i for i, r in results.items() if r["ok"]]
    assert not passed, f"these checks pass on the unmodified stubs: {passed}"


def test_render_a_lesson(tmp_path):
    """The one command renders a quick lesson into a notebook and a page with its figure."""
    out = subprocess.run(
        [sys.executable, "-m", "tutorials.render", "01", "--quick", "--out", str(tmp_path / "book")],
        cwd=ROOT,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    nb = json.loads((tmp_path / "book" / "01_blobs_layers.ipynb").read_text())
    assert nb["nbformat"] == 4 and nb["cells"][0]["cell_type"] == "markdown"
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert all(c["execution_count"] == i + 1 for i, c in enumerate(code))
    outputs = [o for c in code for o in c["outputs"]]
    assert any(o["output_type"] == "display_data" and "image/png" in o["data"] for o in outputs), "no figure inline"
    assert any("lesson 1 done" in "".join(o.get("text", [])) for o in outputs)
    page = (tmp_path / "book" / "01_blobs_layers.html").read_text()
    assert "<h1>Lesson 1: blobs and one layer</h1>" in page and 'src="data:image/png;base64,' in page
    assert "<script" not in page  # self-contained and inert


def test_render_reports_a_failing_cell(tmp_path):
    """A lesson whose cell raises renders up to the failure, keeps the traceback, exits non-zero."""
    from tutorials import render

    path = tmp_path / "99_broken.py"
    path.write_text('# %% [markdown]\n# # Broken\n\n# %%\nprint("before")\n\n# %%\nraise ValueError("boom")\n')
    result, ok = render.execute(str(path))
    assert not ok
    texts = [o["text"] for c in result for o in c["outputs"] if "text" in o]
    assert texts[0] == "before\n" and "ValueError: boom" in texts[1]
