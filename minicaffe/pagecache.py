"""Big libraries read in small pieces: a fresh install's page cache costs 60 MiB of resident code.

numba brings LLVM as one shared library, ``libllvmlite.so`` (~170 MiB, ~80 of machine code).  A
process maps it, and every page it touches is read through the page cache.  How much a touch
brings into the process depends on how the page cache holds the file:

* read from disk as the program runs (the usual case for a library installed a while ago), the
  file sits in small folios and a fault maps its page plus the cached neighbours around it
  (fault-around, 64 KiB): importing numba leaves ~37 MiB of LLVM resident;
* written a moment ago by ``pip install`` (large writes), the file sits in large folios, up to
  2 MiB each, and the kernel (Linux 6.x) maps a whole folio at a fault: importing numba leaves
  ~107 MiB of LLVM resident, and loading one cached kernel ~120 MiB.  Same file, same code.

numpy's core extension (10 MiB) and the OpenBLAS its wheel ships (25 MiB) behave the same way, on a
smaller scale.  So right after an install ``import numba`` alone peaks at ~155 MiB instead of ~90,
and ``python -m minicaffe.train lenet`` at ~194 instead of ~146 (docs/CPU_SPEED.md, "Memory").

:func:`prefer_small_folios` runs once, when minicaffe is imported, before numpy and numba are
(its result is ``minicaffe.pagecache.AT_IMPORT``).  For each of these libraries (:func:`libraries`)
not mapped into the process yet, it maps the file, touches a few of its pages and counts how
many pages each touch brought in.  Where a touch brings in far more than fault-around's 16 (a
large folio), it drops the file's clean cached pages with ``posix_fadvise(POSIX_FADV_DONTNEED)``;
the kernel then reads back, in small folios, only the parts a process touches (a fraction of a
second from disk, once: the probe finds small folios the next time and does nothing).  Nothing is
hidden from a measurement: the process really maps fewer pages.  Pages another running process
has mapped stay where they are.

``MINICAFFE_KEEP_PAGE_CACHE=1`` in the environment turns it off.  Linux only; elsewhere, and
whenever a library or ``/proc`` cannot be read, it does nothing and says why in its result.
"""

import glob
import importlib.util
import mmap
import os
import sys

PAGE = mmap.PAGESIZE
TOUCHES = 8  # pages touched by the probe, spread over the file
# fault-around maps at most 16 pages (64 KiB) around a fault, and the probe reads a page that is not
# cached alone (MADV_RANDOM); a touch that brings in more than 128 pages met a large folio
LARGE_FOLIO_PAGES = 128
SMALLEST = 1 << 20  # smaller libraries are not worth a probe


def _package_folders(name):
    try:
        spec = importlib.util.find_spec(name)  # finds the package without importing it
    except (ImportError, ValueError):
        return []
    return list(spec.submodule_search_locations or []) if spec else []


def libraries():
    """The big shared libraries a minicaffe process loads, found without importing their packages:
    LLVM (llvmlite's ``libllvmlite.so``), numpy's core extension and the libraries numpy's wheel
    ships beside it (OpenBLAS, gfortran).  Files under 1 MiB are left out."""
    found = []
    for folder in _package_folders("llvmlite"):
        found.append(os.path.join(folder, "binding", "libllvmlite.so"))
    for folder in _package_folders("numpy"):
        found += glob.glob(os.path.join(folder, "_core", "_multiarray_umath*.so"))
        found += glob.glob(os.path.join(folder, "core", "_multiarray_umath*.so"))  # numpy 1.x
        found += glob.glob(os.path.join(os.path.dirname(folder), "numpy.libs", "*.so*"))
    return [p for p in found if os.path.isfile(p) and os.path.getsize(p) >= SMALLEST]


def _mapped_files():
    """Real paths of the files this process has mapped now (``/proc/self/maps``)."""
    try:
        with open("/proc/self/maps") as f:
            return {
                os.path.realpath(line.split(None, 5)[5].strip()) for line in f if line.count(" ") >= 5 and "/" in line
            }
    except OSError:
        return set()


def _resident_pages():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1])


def pages_per_touch(path, touches=TOUCHES):
    """Map ``path`` read-only, read one byte of ``touches`` pages spread over it, and return the
    pages the process gained per touch (its resident set before and after, ``/proc/self/statm``)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < PAGE * touches:
            return 0.0
        m = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
        try:
            m.madvise(mmap.MADV_RANDOM)  # a page not cached is read alone, without read-around
            before = _resident_pages()
            for i in range(touches):
                m[(size * (2 * i + 1) // (2 * touches)) // PAGE * PAGE]  # noqa: B018 (the touch)
            after = _resident_pages()
        finally:
            m.close()
    return (after - before) / touches


def prefer_small_folio(path):
    """Drop ``path``'s cached pages if the page cache holds it in large folios (the module's text).
    Returns what it did, for a report: {"path", "pages_per_touch", "dropped", "why"}."""
    out = {"path": path, "pages_per_touch": None, "dropped": False, "why": ""}
    if os.environ.get("MINICAFFE_KEEP_PAGE_CACHE", "") not in ("", "0"):
        out["why"] = "MINICAFFE_KEEP_PAGE_CACHE is set"
        return out
    if not sys.platform.startswith("linux") or not hasattr(os, "posix_fadvise"):
        out["why"] = "not Linux"
        return out
    try:
        per_touch = out["pages_per_touch"] = pages_per_touch(path)
        if per_touch <= LARGE_FOLIO_PAGES:
            out["why"] = f"{per_touch:.0f} pages per touch: small folios"
            return out
        fd = os.open(path, os.O_RDONLY)
        try:
            # a file written moments ago may still be dirty, and dirty pages cannot be dropped:
            # have them written first (at once, as the kernel would within half a minute)
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    except (OSError, ValueError) as e:
        out["why"] = f"could not probe or advise {path}: {e}"
        return out
    out["dropped"] = True
    out["why"] = f"{per_touch:.0f} pages per touch: large folios, cached pages dropped"
    return out


def prefer_small_folios(paths=None):
    """:func:`prefer_small_folio` for each of ``paths`` (default: :func:`libraries`) that this
    process has not mapped yet (a library already loaded was read as it was: too late)."""
    paths = libraries() if paths is None else paths
    mapped = _mapped_files() if paths else set()
    out = []
    for path in paths:
        if os.path.realpath(path) in mapped:
            out.append({"path": path, "pages_per_touch": None, "dropped": False, "why": "loaded already"})
        else:
            out.append(prefer_small_folio(path))
    return out


AT_IMPORT = prefer_small_folios()  # minicaffe/__init__.py imports this module before numpy and numba
