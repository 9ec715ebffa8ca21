"""minicaffe/pagecache.py: LLVM's library read in small folios (a fresh install's large ones dropped).

The end-to-end case reproduces a fresh install: a copy of llvmlite whose library was just written
in one large write (as pip writes it), so the page cache holds it in large folios on kernels that
do that; a process importing minicaffe and then numba must then hold far less of LLVM than one
that keeps the cache as it is.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

from minicaffe import pagecache

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="page cache probing is Linux-only")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_in_one_go(path, data):
    if os.path.exists(path):
        os.unlink(path)
    with open(path, "wb") as f:
        f.write(data)


def test_finds_the_big_libraries():
    names = [os.path.basename(p) for p in pagecache.libraries()]
    assert "libllvmlite.so" in names
    assert any(n.startswith("_multiarray_umath") for n in names)
    assert all(os.path.getsize(p) >= pagecache.SMALLEST for p in pagecache.libraries())


def test_opt_out_by_environment(monkeypatch, tmp_path):
    f = tmp_path / "lib.so"
    write_in_one_go(f, b"\0" * (1 << 20))
    monkeypatch.setenv("MINICAFFE_KEEP_PAGE_CACHE", "1")
    out = pagecache.prefer_small_folio(str(f))
    assert out["dropped"] is False and "MINICAFFE_KEEP_PAGE_CACHE" in out["why"]


def test_a_library_already_loaded_is_left_alone(monkeypatch):
    monkeypatch.delenv("MINICAFFE_KEEP_PAGE_CACHE", raising=False)
    import llvmlite.binding  # noqa: F401  (LLVM loaded: too late to change how it was read)

    out = pagecache.prefer_small_folios()
    assert len(out) == len(pagecache.libraries()) >= 2
    assert all(o["dropped"] is False and o["why"] == "loaded already" for o in out)


def test_a_missing_file_is_reported_not_raised(monkeypatch, tmp_path):
    monkeypatch.delenv("MINICAFFE_KEEP_PAGE_CACHE", raising=False)
    out = pagecache.prefer_small_folio(str(tmp_path / "absent.so"))
    assert out["dropped"] is False and "could not probe" in out["why"] and "absent.so" in out["why"]


def test_probe_touches_and_decision_agree(monkeypatch, tmp_path):
    """A file written in one go is dropped exactly when the probe saw large folios; once dropped,
    the probe sees small ones."""
    monkeypatch.delenv("MINICAFFE_KEEP_PAGE_CACHE", raising=False)
    f = str(tmp_path / "lib.so")
    write_in_one_go(f, os.urandom(1 << 20) * 32)  # 32 MiB
    out = pagecache.prefer_small_folio(f)
    assert out["pages_per_touch"] is not None
    assert out["dropped"] == (out["pages_per_touch"] > pagecache.LARGE_FOLIO_PAGES)
    again = pagecache.prefer_small_folio(f)
    assert again["dropped"] is False and again["pages_per_touch"] <= pagecache.LARGE_FOLIO_PAGES


PROBE = """
import json, sys
import minicaffe, numba
llvm = 0
cur = False
for line in open("/proc/self/smaps"):
    head = line.split()
    if "-" in head[0] and not head[0].endswith(":"):
        cur = len(head) > 5 and head[5].endswith("libllvmlite.so")
    elif cur and head[0] == "Rss:":
        llvm += int(head[1])
print(json.dumps({"llvm_kib": llvm, "llvmlite": sys.modules["llvmlite"].__file__,
                  "at_import": minicaffe.pagecache.AT_IMPORT}))
"""


def test_fresh_install_holds_far_less_of_llvm(tmp_path):
    """A just-written llvmlite (as after pip install): with the probe, importing numba leaves less
    than half as much of LLVM resident as without it."""
    import llvmlite

    src = os.path.dirname(llvmlite.__file__)
    copy = tmp_path / "site"
    shutil.copytree(src, copy / "llvmlite", ignore=shutil.ignore_patterns("__pycache__", "tests"))
    lib = copy / "llvmlite" / "binding" / "libllvmlite.so"
    data = lib.read_bytes()
    write_in_one_go(lib, data)
    if pagecache.pages_per_touch(str(lib)) <= pagecache.LARGE_FOLIO_PAGES:
        pytest.skip("this kernel keeps a freshly written file in small folios: there is nothing to drop")

    def run(keep):
        write_in_one_go(lib, data)  # large folios again
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(copy), REPO]))
        env.pop("MINICAFFE_KEEP_PAGE_CACHE", None)
        if keep:
            env["MINICAFFE_KEEP_PAGE_CACHE"] = "1"
        out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    try:
        kept, dropped = run(keep=True), run(keep=False)
    finally:
        shutil.rmtree(copy)  # 170 MiB: not left for pytest's kept temporary folders
    assert kept["llvmlite"].startswith(str(copy)) and dropped["llvmlite"].startswith(str(copy))
    (kept_llvm,) = [o for o in kept["at_import"] if o["path"] == str(lib)]
    (dropped_llvm,) = [o for o in dropped["at_import"] if o["path"] == str(lib)]
    assert kept_llvm["dropped"] is False and dropped_llvm["dropped"] is True
    assert dropped["llvm_kib"] < kept["llvm_kib"] / 2, (kept["llvm_kib"], dropped["llvm_kib"])
