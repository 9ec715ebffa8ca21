"""Loading a run's kernels before its arrays exist (minicaffe/memory/preload.py): what a run loaded
is written down, a later process loads exactly that before calling anything, an entry whose source
changed or a damaged file is skipped, and where a module cannot link its code nothing is loaded.
Each case runs in a fresh process: a kernel already loaded would hide what is measured."""

import os
import pickle
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# argv: the directory standing for numba's cache directory, the run's key, what to do
CHILD = """
import sys
import numpy as np
from minicaffe.memory import preload
from kernels import elementwise
preload._directory = lambda: sys.argv[1]
what = sys.argv[3]
relu = elementwise.relu_fwd_v2_typed
if what == "run":
    print("fresh before", preload.fresh())
    x = np.ones(8, np.float32)
    relu(x, 0.0, x)
    print("fresh after", preload.fresh())
    print("saved", preload.save(sys.argv[2]))
    print("saved again", preload.save(sys.argv[2]))
else:
    if what == "no-link":
        import kernels.cblas
        kernels.cblas.preload_prepare = lambda: False
    print("before", len(relu.signatures))
    print("loaded", preload.load(sys.argv[2]))
    print("after", len(relu.signatures))
"""


def child(tmp_path, what, key="k"):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path), key, what], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return dict(line.rsplit(" ", 1) for line in out.stdout.splitlines())


def test_what_a_run_loaded_is_loaded_first_by_the_next(tmp_path):
    """A process is ``fresh`` until a kernel loads; a save lists what it loaded (the second save
    finds them all listed already); the next process with the key has them before any call."""
    got = child(tmp_path, "run")
    assert got == {"fresh before": "True", "fresh after": "False", "saved": "True", "saved again": "False"}
    with open(tmp_path / "preload-k.pkl", "rb") as f:
        entries = pickle.load(f)["kernels"]
    assert ("kernels.elementwise", "relu_fwd_v2_typed") in {(e[0], e[1]) for e in entries}
    got = child(tmp_path, "load")
    assert got["before"] == "0" and got["after"] == "1" and int(got["loaded"]) >= 1, got
    assert child(tmp_path, "load", key="other") == {"before": "0", "loaded": "0", "after": "0"}


def test_a_changed_source_or_a_damaged_file_loads_nothing(tmp_path):
    child(tmp_path, "run")
    path = tmp_path / "preload-k.pkl"
    with open(path, "rb") as f:
        data = pickle.load(f)
    data["kernels"] = [(n, a, (0, 0), s) for n, a, _, s in data["kernels"]]  # every file "changed"
    with open(path, "wb") as f:
        pickle.dump(data, f)
    assert child(tmp_path, "load") == {"before": "0", "loaded": "0", "after": "0"}
    path.write_bytes(b"not a pickle")
    assert child(tmp_path, "load") == {"before": "0", "loaded": "0", "after": "0"}


def test_nothing_is_loaded_where_a_module_cannot_link_its_code(tmp_path):
    """kernels/cblas.py registers the BLAS symbols its compiled code calls; where it says it could
    not, loading that code would abort the process, so nothing is preloaded."""
    child(tmp_path, "run")
    assert child(tmp_path, "no-link") == {"before": "0", "loaded": "0", "after": "0"}


def test_the_key_covers_what_picks_the_kernels():
    from minicaffe.memory import preload

    assert preload.key("net", "cpu", 2) == preload.key("net", "cpu", 2)
    assert len({preload.key("net", "cpu", 2), preload.key("net", "cpu", 1), preload.key("net2", "cpu", 2)}) == 3


TRAIN = """
import sys
import numpy as np
from minicaffe.data import register_dataset
from minicaffe.tools import train
rng = np.random.default_rng(0)
register_dataset("pre_train", rng.integers(0, 256, (128, 1, 28, 28), dtype=np.uint8), rng.integers(0, 10, 128))
register_dataset("pre_test", rng.integers(0, 256, (200, 1, 28, 28), dtype=np.uint8), rng.integers(0, 10, 200))
sys.exit(train.main(sys.argv[1:]))
"""


def test_the_train_tool_writes_its_list_and_the_next_run_loads_it_first(tmp_path):
    """``python -m minicaffe.train`` as a fresh process: the first run of a net has no list and
    writes one; the second loads those kernels before building the nets (and says so)."""
    text = open(os.path.join(ROOT, "nets", "lenet_train_test.prototxt")).read()
    text = text.replace('source: "mnist_train"', 'source: "pre_train"').replace(
        'source: "mnist_test"', 'source: "pre_test"'
    )
    (tmp_path / "net.prototxt").write_text(text)
    solver = open(os.path.join(ROOT, "nets", "lenet_solver.prototxt")).read()
    solver = solver.replace('net: "lenet_train_test.prototxt"', f'net: "{tmp_path / "net.prototxt"}"')
    (tmp_path / "solver.prototxt").write_text(solver)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    args = [str(tmp_path / "solver.prototxt"), "--iters", "2", "--test-interval", "2", "--no-plot"]
    logs = []
    for run in ("first", "second"):
        out = subprocess.run(
            [sys.executable, "-c", TRAIN, *args, "--output", str(tmp_path / run)],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]
        logs.append(out.stdout + out.stderr)
    assert "loaded before the nets" not in logs[0]
    assert re.search(r"Kernels: ([1-9][0-9]*) loaded before the nets", logs[1]), logs[1][-2000:]
