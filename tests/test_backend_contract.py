"""The backend contract (minicaffe/backend/contract.py) holds on every backend: each defines
every function with the contract's parameter names, order and defaults, and the attributes.

``cpu`` and ``cudasim`` are checked in this process; ``cuda`` needs a GPU and a process of its
own (numba fixes its CUDA target once per process), so it is checked in a fresh interpreter
with NUMBA_ENABLE_CUDASIM=0, and skipped, saying why, where that backend cannot load.
"""

import os
import subprocess
import sys
import textwrap

import pytest

from minicaffe import backend as _backend
from minicaffe.backend import contract

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_contract_lists_each_function_once_with_its_meaning():
    names = [f.__name__ for f in contract.FUNCTIONS]
    assert len(names) == len(set(names))
    for f in contract.FUNCTIONS:
        assert f.__doc__ and len(f.__doc__.split()) >= 3, f"{f.__name__}: the contract says what it means"
        with pytest.raises(NotImplementedError):
            f(*([None] * f.__code__.co_argcount))


@pytest.mark.parametrize("name", ["cpu", "cudasim"])
def test_backend_keeps_the_contract(name):
    reason = _backend.why_not(name)
    if reason is not None:
        pytest.skip(f"backend {name}: {reason}")
    be = _backend.get(name)
    assert contract.check(be) == []
    assert be.name == name


def test_cuda_backend_keeps_the_contract():
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["NUMBA_ENABLE_CUDASIM"] = "0"
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    code = """
        from minicaffe import backend
        from minicaffe.backend import contract
        reason = backend.why_not("cuda")
        if reason:
            print("SKIP", reason)
        else:
            print("PROBLEMS", contract.check(backend.get("cuda")))
    """
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300
    )
    assert r.returncode == 0, r.stderr[-3000:]
    if r.stdout.startswith("SKIP"):
        pytest.skip(f"backend cuda: {r.stdout[5:].strip()}")
    assert r.stdout.strip() == "PROBLEMS []", r.stdout


def test_check_names_what_is_missing_or_different():
    import types

    fake = types.ModuleType("fake")
    fake.name, fake.xp, fake.host_lanes = "cpu", None, True
    for f in contract.FUNCTIONS:
        setattr(fake, f.__name__, f)
    assert contract.check(fake) == []
    del fake.gemm
    fake.sgd_step = lambda w, g, h, local_rate, momentum, decay: None
    problems = contract.check(fake)
    assert any("no function gemm(trans_a, trans_b, alpha, a, b, beta, c)" in p for p in problems), problems
    assert any("sgd_step(w, g, h, local_rate, momentum, decay) differs" in p for p in problems), problems


def test_backends_define_their_functions_explicitly():
    """No ``globals().update(...)``: every contract name of a backend module is written in its
    source (a def or an explicit import), so a reader's "go to definition" finds it."""
    folder = os.path.join(ROOT, "minicaffe", "backend")
    for name in ("cpu.py", "cuda.py", "cudasim.py", "_gpu_kernels.py"):
        with open(os.path.join(folder, name)) as f:
            src = f.read()
        assert "globals()" not in src, name
    for name in ("cpu.py", "cuda.py", "cudasim.py"):
        with open(os.path.join(folder, name)) as f:
            src = f.read()
        for fn in contract.FUNCTIONS:
            assert f"def {fn.__name__}(" in src or f"    {fn.__name__},\n" in src, f"{name}: {fn.__name__}"
