"""minicaffe/teardown.py: a command ends with its status, its output and every atexit handler run."""

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="os._exit is used on Linux only")


def _run(body, tmp_path):
    script = textwrap.dedent(
        """
        import atexit, sys, threading, time
        import minicaffe
        from minicaffe.teardown import exit_without_teardown
        """
    ) + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=120)


def test_status_output_and_handlers_survive(tmp_path):
    done = tmp_path / "handler.txt"
    proc = _run(
        f"""
        atexit.register(lambda: open({str(done)!r}, "w").write("ran"))  # registered after minicaffe's
        def late():
            time.sleep(0.2)
            open({str(done)!r} + ".thread", "w").write("joined")
        threading.Thread(target=late).start()  # non-daemon: Python waits for it before atexit
        sys.stdout.write("no newline, still buffered")
        sys.stderr.write("to stderr")
        exit_without_teardown(3)
        """,
        tmp_path,
    )
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == "no newline, still buffered"
    assert proc.stderr == "to stderr"
    assert done.read_text() == "ran"
    assert (tmp_path / "handler.txt.thread").read_text() == "joined"


def test_none_is_zero_and_a_message_is_printed_as_sys_exit_does(tmp_path):
    assert _run("exit_without_teardown(None)", tmp_path).returncode == 0
    proc = _run("exit_without_teardown('error: bad')", tmp_path)
    assert (proc.returncode, proc.stderr.strip()) == (1, "error: bad")


def test_a_process_that_never_calls_it_exits_as_usual(tmp_path):
    proc = _run("print('plain'); sys.exit(5)", tmp_path)
    assert (proc.returncode, proc.stdout) == (5, "plain\n")


def test_the_train_entry_still_reports_errors_with_its_status(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "minicaffe.train", "no_such_net"], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode != 0
    assert "no_such_net" in proc.stderr
