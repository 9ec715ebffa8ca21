"""Every tutorial runs (quick mode), as a reader would run it: a tutorial nobody runs rots."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LESSONS = sorted(f for f in os.listdir(os.path.join(ROOT, "tutorials")) if f[:2].isdigit() and f.endswith(".py"))


def test_there_are_lessons():
    assert len(LESSONS) >= 4


@pytest.mark.parametrize("lesson", LESSONS)
def test_lesson_runs(lesson):
    env = dict(os.environ, MINICAFFE_TUTORIAL_QUICK="1")
    out = subprocess.run(
        [sys.executable, os.path.join("tutorials", lesson)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, f"{lesson} failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"
    assert f"lesson {int(lesson[:2])} done" in out.stdout
