"""LLVM's code resident only while numba compiles (minicaffe/memory/jitcode.py): released pages
leave the process's resident set, kernels still run after, a compile inside ``keep_llvm_code_out``
ends with the pages released again, and the train tool's peak stays under numba's own."""

import os
import subprocess
import sys
import textwrap

import numba
import numpy as np
import pytest

from minicaffe.memory import jitcode

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc/self/smaps and calls madvise (Linux)"
)


def kept_bytes():
    """LLVM's resident bytes that no release can drop (its relocated, written-once pages)."""
    return sum(m.get("Rss", 0) for m in jitcode.llvm_mappings() if not jitcode.releasable(m)) * 1024


def fresh_kernel(k):
    """A new function each call, so numba compiles it (no cache): LLVM runs."""
    return numba.njit(lambda a: a * k + 1.0)


@linux_only
def test_llvm_code_leaves_the_resident_set_and_kernels_still_run():
    jitcode.load_jit_runtime(release=False)
    assert jitcode.llvm_mappings(), "numba's LLVM library is not mapped in this process"
    kernel = fresh_kernel(2.0)
    assert kernel(1.0) == 3.0
    assert jitcode.resident_llvm_bytes() > kept_bytes() + 4 * 2**20  # the compile touched LLVM's code
    released = jitcode.release_llvm_code()
    assert released > 4 * 2**20
    assert jitcode.resident_llvm_bytes() <= kept_bytes() + 2**20
    x = np.zeros(1)
    jitcode.first_kernel(x)  # machine code numba loaded before the release runs as before
    assert x[0] == 1.0 and kernel(2.0) == 5.0
    assert jitcode.resident_llvm_bytes() <= kept_bytes() + 2**20  # and running it needs no LLVM


@linux_only
def test_a_compile_inside_the_block_ends_with_llvm_released_and_outside_does_not():
    with jitcode.keep_llvm_code_out() as listener:
        assert jitcode.resident_llvm_bytes() <= kept_bytes() + 2**20  # released on entry
        before = listener.count
        assert fresh_kernel(3.0)(2.0) == 7.0
        assert listener.count > before  # the compile's outermost lock released the pages
        assert jitcode.resident_llvm_bytes() <= kept_bytes() + 2**20
    count = listener.count
    assert fresh_kernel(5.0)(2.0) == 11.0  # outside the block: nothing listens
    assert listener.count == count
    assert jitcode.resident_llvm_bytes() > kept_bytes() + 2**20  # LLVM ran and stays resident


def test_only_read_only_clean_mappings_are_releasable():
    text = {"start": 0, "end": 4096, "perms": "r-xp", "path": "libllvmlite.so", "Rss": 4, "Anonymous": 0}
    assert jitcode.releasable(text)
    assert not jitcode.releasable(dict(text, perms="rw-p"))  # data: written
    assert not jitcode.releasable(dict(text, perms="r--p", Anonymous=4))  # relocated, then made read-only
    assert not jitcode.releasable(dict(text, Private_Dirty=4))


def test_llvm_mappings_found_by_library_name(tmp_path):
    smaps = tmp_path / "smaps"
    smaps.write_text(
        textwrap.dedent(
            """\
            7f0000000000-7f0000400000 r-xp 00000000 08:01 12 /venv/llvmlite/binding/libllvmlite.so
            Size:               4096 kB
            Rss:                2048 kB
            Private_Dirty:         0 kB
            Anonymous:             0 kB
            7f0000400000-7f0000401000 r--p 00400000 08:01 12 /venv/llvmlite/binding/libllvmlite.so
            Rss:                   4 kB
            Private_Dirty:         4 kB
            Anonymous:             4 kB
            7f0000500000-7f0000600000 r-xp 00000000 08:01 13 /usr/lib/libpython3.11.so.1.0
            Rss:                1024 kB
            Anonymous:             0 kB
            7f0000700000-7f0000800000 rw-p 00000000 00:00 0
            Rss:                1024 kB
            """
        )
    )
    maps = jitcode.llvm_mappings(str(smaps))
    assert [(m["perms"], m["Rss"], m["Anonymous"]) for m in maps] == [("r-xp", 2048, 0), ("r--p", 4, 4)]
    assert [jitcode.releasable(m) for m in maps] == [True, False]
    assert jitcode.llvm_mappings(str(tmp_path / "absent")) == []


# A module with two cached kernels, run in fresh processes: the first run fills numba's cache, the
# second loads ``inner`` from it inside drop_linking_modules, then compiles ``outer`` (not cached),
# which calls ``inner`` and so links its module in.
LINKED = """
import numba
@numba.njit(cache=True)
def inner(x):
    return x * 2.0 + 1.0
def outer_source():
    @numba.njit
    def outer(x):
        return inner(x) - 3.0
    return outer
"""

LINK_CHECK = """
import sys
import numpy as np
from minicaffe.memory import jitcode
import linked
with jitcode.drop_linking_modules() as ok:
    assert ok, "numba's CPUCodeLibrary internals were not found"
    assert linked.inner(2.0) == 5.0
    (cres,) = linked.inner.overloads.values()
    library = cres.library
    print("loaded from cache", sum(linked.inner.stats.cache_hits.values()))
    print("parsed module kept", library._shared_module is not None)
    print("bitcode kept", len(jitcode.dropped_bitcode(library) or b""))
    outer = linked.outer_source()
    print("outer", outer(2.0))
    print("parsed back", library._shared_module is not None)
"""


@linux_only
def test_kernels_loaded_from_the_cache_keep_bitcode_and_link_after(tmp_path):
    """Inside ``drop_linking_modules`` a kernel loaded from numba's cache keeps its linking module
    as bitcode, not parsed (the memory the train tool saves); a kernel compiled after that calls
    it parses it back, links it and computes the right value.  Outside, numba is unchanged."""
    (tmp_path / "linked.py").write_text(LINKED)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), ROOT, os.environ.get("PYTHONPATH", "")]))

    def run(code):
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
        )
        assert out.returncode == 0, out.stderr[-3000:]
        return dict(line.rsplit(" ", 1) for line in out.stdout.splitlines())

    run("import linked; assert linked.inner(1.0) == 3.0")  # fills the cache
    got = run(LINK_CHECK)
    assert got["loaded from cache"] != "0", got
    assert got["parsed module kept"] == "False" and int(got["bitcode kept"]) > 0, got
    assert float(got["outer"]) == 2.0 and got["parsed back"] == "True", got
    # outside a block, a cached load keeps numba's parsed module
    outside = run(
        "import linked\nlinked.inner(2.0)\n(c,) = linked.inner.overloads.values()\nprint('kept', c.library._shared_module is not None)"
    )
    assert outside["kept"] == "True", outside


TRAIN = """
import numpy as np, os, sys
from minicaffe.data import register_dataset
from minicaffe.tools import train
rng = np.random.default_rng(0)
register_dataset("mem_train", rng.integers(0, 256, (640, 1, 28, 28), dtype=np.uint8), rng.integers(0, 10, 640))
register_dataset("mem_test", rng.integers(0, 256, (1000, 1, 28, 28), dtype=np.uint8), rng.integers(0, 10, 1000))
sys.exit(train.main(sys.argv[1:]))
"""

# A child's ru_maxrss starts from its parent's resident size when it was spawned (Linux counts the
# parent's pages until the exec), and pytest's is larger than the budget: a small Python process
# starts the run and reports the kernel's peak of the whole child process, its exit included.
MEASURE = """
import os, subprocess, sys
proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
out = proc.stdout.read()
_, status, usage = os.wait4(proc.pid, 0)
print(out[-3000:])
print("exit", os.waitstatus_to_exitcode(status), "peak KiB", usage.ru_maxrss)
"""


# numba imported and one cached kernel loaded (numba's runtime and LLVM's JIT engine built), nothing
# released: the process every numba program is, before it holds any data
BASELINE = """
import sys
from minicaffe.memory import jitcode
jitcode.load_jit_runtime(release=False)
"""


def _peak_kib(env, cwd, *argv):
    """(exit status, ru_maxrss in KiB) of ``python argv...`` started from a small process."""
    cmd = [sys.executable, "-c", MEASURE, sys.executable, *argv]
    out = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=600).stdout
    code, peak_kib = (int(x) for x in out.split()[-4::3])
    assert code == 0, out
    return peak_kib


@linux_only
@pytest.mark.slow
def test_train_lenet_peaks_no_higher_than_numba_itself(tmp_path):
    """LeNet (batch 64, test batch 100, two lanes) through the train tool in a fresh process, numba's
    cache warm: its peak (the kernel's ru_maxrss) is no higher than that of a process that only
    imported numba and loaded one cached kernel: the nets, the arena and the data fit in the LLVM
    code given back.  On the code before the release it was 197 vs 138 MiB.  The absolute figure
    depends on the page cache (fault-around maps only pages cached already: importing numba right
    after llvmlite was installed maps 157 MiB, on a machine whose cold pages were reclaimed 90),
    so the budget is this machine's own baseline (docs/CPU_SPEED.md, "Memory")."""
    text = open(os.path.join(ROOT, "nets", "lenet_train_test.prototxt")).read()
    text = text.replace('source: "mnist_train"', 'source: "mem_train"')
    text = text.replace('source: "mnist_test"', 'source: "mem_test"')
    assert "mem_train" in text and "mem_test" in text, "nets/lenet_train_test.prototxt's sources changed"
    net = tmp_path / "lenet.prototxt"
    net.write_text(text)
    solver = open(os.path.join(ROOT, "nets", "lenet_solver.prototxt")).read()
    solver = solver.replace('net: "lenet_train_test.prototxt"', f'net: "{net}"')
    assert str(net) in solver, "nets/lenet_solver.prototxt no longer names its net as this test expects"
    (tmp_path / "solver.prototxt").write_text(solver)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    args = [str(tmp_path / "solver.prototxt"), "--iters", "30", "--test-interval", "15", "--no-plot", "--lanes", "2"]
    # the first run fills numba's cache with what this run needs that it lacks (compiling holds
    # LLVM's optimizer: ~270 MiB, documented); the second is measured
    for run in ("warm", "measured"):
        peak = _peak_kib(env, tmp_path, "-c", TRAIN, *args, "--output", str(tmp_path / run))
    baseline = _peak_kib(env, tmp_path, "-c", BASELINE)
    assert peak <= baseline, f"train lenet peaked at {peak / 1024:.1f} MiB, numba alone at {baseline / 1024:.1f}"
