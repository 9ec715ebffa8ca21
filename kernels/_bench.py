"""The benchmark harness every kernel family shares: validate, time, compare with a ceiling.

A family module (``kernels/gemm.py``, ...) defines ``bench_cases(quick, sizes)``: a list of
``Case`` objects, each with inputs built once, a runner per version, a check against the float64
reference, and the work it does (FLOPs, or the bytes it must at least read and write once).
``python -m kernels.<family>`` (``family_main``) and the driver ``python -m kernels.bench``
(all families, one generated table and a plot) both run cases through ``run_case``:

1. every version runs once (numba compiles) and is checked against the reference; a wrong one
   is reported ``WRONG: ...`` and never timed;
2. then each is warmed up and timed (at least ``repeats`` calls and 0.2 s), median and spread;
3. its rate is compared with a CEILING measured in the same run, at this case's own size, with
   the same clock, and taking the best time (a ceiling is the best the machine did):

   * compute-bound cases (gemm, conv): the larger of OpenBLAS SGEMM (n = 1024) and the fastest
     call of the vendor on this very shape (its baseline row and its own rung), where it has one;
   * memory-bound cases: the fastest of four compiled streams over the case's byte count -- a
     read (sum), a copy, an add (2 reads, 1 write) and an in-place add -- because which of them
     is fastest depends on the size (caches or DRAM) and on the mix of reads and writes, and a
     kernel may have any mix;
   * a ``prange`` version runs on all numba threads: its ceiling is the one-thread ceiling times
     the thread count (an upper estimate: bandwidth does not scale that well).

   A rate above its ceiling is a measurement error (a loaded machine, a wrong byte count), never
   a result: it is flagged ``!`` in the table and counted at the end.

Time is the calling thread's CPU time by default (on a shared machine a descheduled thread is
not a slow kernel); ``prange`` versions are timed by the wall clock.  BLAS runs on one thread
(``OPENBLAS_NUM_THREADS=1``: the tools re-execute themselves with it when it is unset).
"""

import argparse
import os
import platform
import subprocess
import sys
import time

import numpy as np

from . import FAMILIES

F32 = np.float32

# -- timing ---------------------------------------------------------------------------------------
CLOCKS = {"cpu": time.thread_time, "wall": time.perf_counter}
_clock = ["cpu"]


def set_clock(name):
    """Time serial versions by ``name``: "cpu" (the thread's CPU time) or "wall"."""
    if name not in CLOCKS:
        raise ValueError(f"unknown clock {name!r}; known: {', '.join(CLOCKS)}")
    _clock[0] = name


def _time(fn, repeats, min_time=0.2, max_time=3.0, clock=None):
    """Median, interquartile spread / median, count and fastest call (seconds) of fn(); fn has
    been warmed up.

    The default clock is the calling thread's CPU time: on a shared machine (this one has
    2 cores and several users) a descheduled thread does not count as a slow kernel.  prange
    versions run on other threads too, so they are always timed by the wall clock."""
    tick = CLOCKS[clock or _clock[0]]
    ts = []
    t_start = time.perf_counter()
    while True:
        t0 = tick()
        fn()
        ts.append(tick() - t0)
        el = time.perf_counter() - t_start
        if (len(ts) >= repeats and el >= min_time) or el >= max_time:
            break
    ts = np.array(ts)
    q1, med, q3 = np.percentile(ts, [25, 50, 75])
    return float(med), float((q3 - q1) / med) if med > 0 else 0.0, len(ts), float(ts.min())


def _warm(fn, n=2):
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    for _ in range(n if first < 0.5 else 0):
        fn()
    return first


# -- ceilings ------------------------------------------------------------------------------------
def sgemm_peak(n=1024, repeats=5):
    a = np.random.default_rng(0).standard_normal((n, n)).astype(F32)
    b = a.copy()
    c = np.empty_like(a)
    _warm(lambda: np.matmul(a, b, out=c))
    best = _best(lambda: np.matmul(a, b, out=c), repeats)
    return 2 * n**3 / best / 1e9


def _sgemm_peak_subprocess(env):
    code = "from kernels.bench import sgemm_peak; print(sgemm_peak())"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    try:
        return float(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None


def _best(fn, repeats, clock=None):
    """The fastest of ``repeats`` timed calls (at least 0.05 s in all): a ceiling's time."""
    tick = CLOCKS[clock or _clock[0]]
    best = float("inf")
    t_start = time.perf_counter()
    n = 0
    while n < repeats or time.perf_counter() - t_start < 0.05:
        t0 = tick()
        fn()
        best = min(best, tick() - t0)
        n += 1
        if time.perf_counter() - t_start > 2.0:
            break
    return best


_stream_kernels = {}


def _streams():
    """The four compiled streams.  ``z`` (0 at run time) keeps LLVM from turning the copy into
    a memcpy call (whose large-size path uses non-temporal stores) and the sums from being
    folded; ``reps`` repeats the pass inside the compiled loop, so no call overhead counts."""
    if not _stream_kernels:
        from numba import njit

        @njit(nogil=True, cache=True, fastmath=True)
        def read(a, b, c, z, reps):
            s = z
            for _ in range(reps):
                for i in range(a.size):
                    s += a[i]
            c[0] = s

        @njit(nogil=True, cache=True)
        def copy(a, b, c, z, reps):
            for _ in range(reps):
                for i in range(a.size):
                    c[i] = a[i] + z

        @njit(nogil=True, cache=True)
        def add(a, b, c, z, reps):
            for _ in range(reps):
                for i in range(a.size):
                    c[i] = a[i] + b[i] + z

        @njit(nogil=True, cache=True)
        def inplace(a, b, c, z, reps):
            for _ in range(reps):
                for i in range(a.size):
                    b[i] += a[i] + z

        # name -> (kernel, bytes counted per element)
        _stream_kernels.update(read=(read, 4), copy=(copy, 8), add=(add, 12), inplace=(inplace, 12))
    return _stream_kernels


_stream_cache = {}


def stream_bandwidth(nbytes):
    """GB/s: the fastest of the four streams (read, copy, add, in-place add) moving about
    ``nbytes`` in all (the same working set as the kernel: small -> caches, large -> DRAM), and
    which one it was."""
    nbytes = min(int(nbytes), 64 << 20)  # beyond 64 MB every stream runs from DRAM alike
    key = max(nbytes // 4096, 1)
    if key not in _stream_cache:
        best = (0.0, "")
        for name, (fn, per) in _streams().items():
            n = max(nbytes // per, 512)
            a = np.ones(n, F32)
            b = np.ones(n if name in ("add", "inplace") else 1, F32)
            c = np.ones(n if name in ("copy", "add") else 1, F32)
            reps = max(1, (32 << 20) // (per * n))  # at least ~32 MB moved per timing
            fn(a, b, c, F32(0), 1)
            t = _best(lambda fn=fn, a=a, b=b, c=c, reps=reps: fn(a, b, c, F32(0), reps), 3)
            rate = per * n * reps / t / 1e9
            best = max(best, (rate, name))
        _stream_cache[key] = best
    return _stream_cache[key]


def threads_of(version):
    """How many cores a version uses: numba's thread count for prange versions, else 1."""
    if "prange" not in version:
        return 1
    import numba

    return numba.get_num_threads()


class Case:
    def __init__(self, family, fn, name, kind, flops, nbytes, run, check, baseline=None, flops_of=None):
        self.family, self.fn, self.name, self.kind = family, fn, name, kind
        self.flops, self.nbytes = flops, nbytes
        # a version that does less arithmetic for the same result (Winograd): its own count,
        # so that its rate is of the work it does and stays comparable with the ceiling
        self.flops_of = flops_of or {}
        self.run = run  # version function -> zero-arg callable
        self.check = check  # (version fn) -> None, or AssertionError (after a run)
        self.baseline = baseline  # zero-arg callable (vendor / numpy), or None

    @property
    def module(self):
        import importlib

        return importlib.import_module(f"kernels.{self.family}")


def close(got, ref, tol, what):
    got = np.asarray(got, dtype=np.float64)
    err = np.abs(got - ref)
    bad = ~(err <= tol)
    if bad.any():
        i = tuple(int(v) for v in np.argwhere(bad)[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.size} off; at {i} got "
            f"{got[i]!r} expected {ref[i]!r} "
            f"(tol {np.broadcast_to(tol, ref.shape)[i]:.3g})"
        )


def sum_tol(n, mag, dtype=F32):
    return (n + 4) * float(np.finfo(dtype).eps) * mag + 1e-30


# -- running a case ------------------------------------------------------------------------------
def run_case(case, versions=(), repeats=7, quick=False, peak=None):
    """Check every version, then time them: (rows, vendor row or None); each timed row has the
    rate, its ceiling and the fraction (``above_ceiling`` when the fraction exceeds 1)."""
    mod = case.module
    chosen = [(v, f) for v, f in mod.VERSIONS[case.fn].items() if not versions or v in versions]
    rows, ready = [], []
    for ver, fn in chosen:  # 1. validate every version before anything is timed
        if ver.startswith("v1_naive") and case.kind == "compute" and case.flops > (3e8 if quick else 3e9):
            rows.append(dict(version=ver, skipped="too slow for this size"))
            continue
        call = case.run(fn)
        t0 = time.perf_counter()
        call()
        first = time.perf_counter() - t0
        try:
            case.check(fn)
        except AssertionError as e:
            rows.append(dict(version=ver, error=f"WRONG: {e}"))
            continue
        ready.append((ver, call, first))
    base = None
    if case.baseline is not None:
        _warm(case.baseline)
        med, spread, _, best = _time(case.baseline, repeats)
        base = dict(median_s=med, spread=spread, best_s=min(best, _best(case.baseline, 3)))
    timed = []
    for ver, call, first in ready:  # 2. time them
        if first < 0.5:
            _warm(call, 2)
        med, spread, n, best = _time(
            call,
            repeats if first < 0.5 else 1,
            max_time=3.0 if first < 0.5 else 0,
            clock="wall" if "prange" in ver else None,
        )
        timed.append((ver, med, spread, n, best))
    if case.kind == "compute":  # the vendor's best on this shape (its own rung included), or SGEMM n=1024
        vendor = [best for ver, _, _, _, best in timed if ver in VENDOR_VERSIONS]
        if base is not None:
            vendor.append(base["best_s"])
        ceiling = max([peak or sgemm_peak()] + [case.flops / t / 1e9 for t in vendor])
        ceiling_what = "SGEMM n=1024 / vendor at this shape"
    else:
        ceiling, ceiling_what = stream_bandwidth(case.nbytes)
        ceiling_what = f"{ceiling_what} stream, same bytes"
    for ver, med, spread, n, _ in timed:
        threads = threads_of(ver)
        r = dict(version=ver, median_s=med, spread=spread, n=n, threads=threads)
        work = case.flops_of.get(ver, case.flops)
        rate = work / med / 1e9 if case.kind == "compute" else case.nbytes / med / 1e9
        r["gflops" if case.kind == "compute" else "gbs"] = rate
        if work != case.flops:
            r["flops"] = work
        r["ceiling"] = ceiling * threads
        r["ceiling_what"] = ceiling_what + (f" x {threads} threads" if threads > 1 else "")
        r["fraction"] = rate / r["ceiling"]
        r["above_ceiling"] = r["fraction"] > 1.0
        if base is not None:
            r["x_vendor"] = base["median_s"] / med
        rows.append(r)
    if base is not None:
        rate = case.flops / base["median_s"] / 1e9 if case.kind == "compute" else case.nbytes / base["median_s"] / 1e9
        base.update(rate=rate, ceiling=ceiling, fraction=rate / ceiling, above_ceiling=rate > ceiling)
    return rows, base


#: versions that ARE the vendor library (their times count toward the compute ceiling)
VENDOR_VERSIONS = ("blas",)


TABLE_HEAD = [
    "| kernel | case | version | median ms | spread | rate | % of ceiling | x vendor |",
    "|---|---|---|---|---|---|---|---|",
]


def format_case(case, rows, base):
    """Markdown rows; a rate above its ceiling is flagged with ``!``."""
    unit = "GFLOP/s" if case.kind == "compute" else "GB/s"
    lines = []
    for r in rows:
        if "skipped" in r or "error" in r:
            lines.append(f"| {case.fn} | {case.name} | {r['version']} | {r.get('skipped') or r.get('error')} | | | | |")
            continue
        rate = r["gflops"] if case.kind == "compute" else r["gbs"]
        flag = " !" if r["above_ceiling"] else ""
        xv = f"{r['x_vendor']:.2f}x" if "x_vendor" in r else "-"
        ver = r["version"] + (f" ({r['threads']} threads)" if r["threads"] > 1 else "")
        if "flops" in r:  # its own (smaller) operation count
            ver += f" ({r['flops'] / case.flops:.2f}x the FLOPs)"
        lines.append(
            f"| {case.fn} | {case.name} | {ver} | {r['median_s'] * 1e3:.3f} | {100 * r['spread']:.0f}% | "
            f"{rate:.1f} {unit} | {100 * r['fraction']:.0f}%{flag} | {xv} |"
        )
    if base is not None:
        flag = " !" if base["above_ceiling"] else ""
        lines.append(
            f"| {case.fn} | {case.name} | (vendor: numpy/BLAS) | {base['median_s'] * 1e3:.3f} | "
            f"{100 * base['spread']:.0f}% | {base['rate']:.1f} {unit} | {100 * base['fraction']:.0f}%{flag} | 1.00x |"
        )
    return lines


def case_record(case, rows, base):
    return dict(
        family=case.family,
        fn=case.fn,
        name=case.name,
        kind=case.kind,
        flops=case.flops,
        bytes=case.nbytes,
        rows=rows,
        vendor=base,
    )


def flagged(records):
    """How many timed rows (vendor rows included) exceed their ceiling."""
    n = 0
    for c in records:
        n += sum(1 for r in c["rows"] if r.get("above_ceiling"))
        n += bool(c["vendor"] and c["vendor"].get("above_ceiling"))
    return n


def header_lines(info, clock):
    out = [
        f"# on {info.get('cpu', '?')} ({info.get('cpus')} cpus, {'+'.join(info.get('simd', []))}), numpy "
        f"{info['numpy']}, numba {info.get('numba')} ({info.get('numba_threads')} threads), load average "
        f"{info.get('loadavg', ('?',))[0]:.2f} at the start, clock {clock}"
    ]
    if info.get("loadavg") and info["loadavg"][0] > 0.5 * (info.get("cpus") or 1):
        out.append("# NOTE: the machine is busy (load average above half the core count): timings are noisy and low")
    return out


def reexec_single_blas(module, argv):
    """Run ``python -m module argv`` again with OPENBLAS_NUM_THREADS=1 unless it is set: every
    number is one core's (returns the exit code, or None when already set)."""
    if "OPENBLAS_NUM_THREADS" in os.environ:
        return None
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    return subprocess.call([sys.executable, "-m", module] + list(argv), env=env)


def family_main(family, argv=None):
    """``python -m kernels.<family>``: check every version against the reference, then time them."""
    import importlib

    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(
        prog=f"python -m kernels.{family}",
        description=f"Check every version of the {family} kernels against the float64 reference, then time "
        f"them against this machine's measured ceilings (see kernels/_bench.py).",
    )
    ap.add_argument("--quick", action="store_true", help="fewer cases and repeats")
    ap.add_argument("--versions", default="", help="comma-separated version names (default: all)")
    ap.add_argument("--sizes", default="", help="gemm: comma-separated square sizes")
    ap.add_argument("--repeats", type=int, default=0, help="minimum timed calls per version")
    ap.add_argument("--asm", action="store_true", help="gemm: print the v3_micro micro-kernel's hot loop")
    args = ap.parse_args(argv)
    rc = reexec_single_blas(f"kernels.{family}", argv)
    if rc is not None:
        return rc
    mod = importlib.import_module(f"kernels.{family}")
    info = machine_info()
    for line in header_lines(info, _clock[0]):
        print(line)
    versions = set(filter(None, args.versions.split(",")))
    sizes = [int(s) for s in args.sizes.split(",") if s]
    peak = sgemm_peak()
    print(f"# SGEMM ceiling: {peak:.1f} GFLOP/s (OpenBLAS, n=1024, 1 thread)\n")
    print("\n".join(TABLE_HEAD))
    records = []
    for case in mod.bench_cases(args.quick, sizes):
        rows, base = run_case(case, versions, args.repeats or (3 if args.quick else 7), args.quick, peak)
        print("\n".join(format_case(case, rows, base)), flush=True)
        records.append(case_record(case, rows, base))
    n = flagged(records)
    if n:
        print(f"\n! {n} rate(s) above their ceiling: a measurement error (a busy machine?), not a result; rerun")
    if args.asm and family == "gemm":
        print_simd(simd_report())
    wrong = sum(1 for c in records for r in c["rows"] if "error" in r)
    return 1 if wrong else 0


def print_simd(rep):
    for dt in ("float32", "float64"):
        r = rep[dt]
        print(
            f"# v3_micro hot loop, {dt}: {r['loop_body_instructions']} instructions, {r['packed_ymm_fma']} packed "
            f"FMAs, {r['packed_ymm_loads']} packed loads, zmm used: {r['zmm_used']}"
        )
    print("\n".join("    " + ln for ln in rep["float32_loop_body"]))


def simd_report():
    """What the compiler made of the GEMM micro-kernel (v3_micro): the packed FMAs and loads in
    its hot loop, and the loop itself (``--asm``)."""
    import re

    from numba import njit

    from kernels import gemm as G

    # numba cannot show the assembly of cache-loaded code: compile a private, uncached copy
    opts = {k: v for k, v in G._gemm_micro_cols.targetoptions.items() if k not in ("cache", "nopython")}
    fn = njit(**opts)(G._gemm_micro_cols.py_func)
    for dt in (np.float32, np.float64):
        a = np.ones((8, 8), dt)
        fn(dt(1), a, False, a, False, np.zeros_like(a), 0, 8)
    out = {}
    for sig in fn.signatures:
        asm = fn.inspect_asm(sig)
        blocks = re.split(r"\n(?=\.LBB)", asm)
        hot = max(blocks, key=lambda b: len(re.findall(r"vfmadd\w+p[sd]\s+%ymm", b)))
        body = []
        for ln in hot.splitlines()[1:]:  # the loop body: up to its backward branch
            if ln.startswith("\t") and not ln.startswith("\t."):
                body.append(ln.strip())
                if re.match(r"j\w+\s+\.LBB", ln.strip()):
                    break
        key = str(sig[1].dtype)
        out[key] = dict(
            loop_body_instructions=len(body),
            packed_ymm_fma=sum(bool(re.match(r"vfmadd\w+p[sd]\s+%ymm", b)) for b in body),
            packed_ymm_loads=sum(bool(re.match(r"vmovu?p[sd]\s+\(.*%ymm", b)) for b in body),
            zmm_used="zmm" in asm,
        )
        if key == "float32":
            out["float32_loop_body"] = body
    return out


def machine_info():
    info = dict(python=platform.python_version(), numpy=np.__version__, machine=platform.machine(), cpus=os.cpu_count())
    try:
        import numba

        info["numba"] = numba.__version__
        info["numba_threads"] = numba.get_num_threads()
    except Exception:  # pragma: no cover
        pass
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
            f.seek(0)
            flags = next((ln for ln in f if ln.startswith("flags")), "")
            info["simd"] = [x for x in ("avx2", "fma", "avx512f") if f" {x}" in flags]
    except OSError:
        pass
    try:
        info["loadavg"] = os.getloadavg()
    except OSError:
        pass
    for k in ("OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        info[k] = os.environ.get(k)
    return info


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fams = [f for f in FAMILIES if any(r["family"] == f for r in results["cases"])]
    n = len(fams) + 1
    cols = 2
    rows_ = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows_, cols, figsize=(15, 4.2 * rows_))
    axes = np.atleast_1d(axes).ravel()
    peak = results["ceilings"]["sgemm_gflops"]
    # roofline: every timed point at its arithmetic intensity
    ax = axes[0]
    ai = np.logspace(-2, 3, 100)
    bw = results["ceilings"]["stream_gbs_large"]
    ax.loglog(ai, np.minimum(peak, ai * bw), "k-", lw=1.5, label=f"roof: {peak:.0f} GFLOP/s, {bw:.1f} GB/s")
    markers = dict(zip(FAMILIES, "osD^v<>"))
    for c in results["cases"]:
        if c["flops"] <= 0:
            continue
        for r in c["rows"]:
            if "median_s" in r:
                work = r.get("flops", c["flops"])
                ax.loglog(
                    work / c["bytes"],
                    work / r["median_s"] / 1e9,
                    markers.get(c["family"], "o"),
                    ms=4,
                    alpha=0.6,
                    color=f"C{_vidx(r['version'])}",
                )
    ax.set_xlabel("arithmetic intensity (FLOP/byte, compulsory traffic)")
    ax.set_ylabel("GFLOP/s")
    ax.set_title("roofline (gemm o, conv s; colour = version rung)")
    ax.legend(fontsize=7)
    for ax, fam in zip(axes[1:], fams):
        cases = [c for c in results["cases"] if c["family"] == fam]
        labels, series = [], {}
        for i, c in enumerate(cases):
            labels.append(f"{c['fn']}\n{c['name'][:28]}")
            for r in c["rows"]:
                if "median_s" not in r:
                    continue
                frac = r["fraction"]
                series.setdefault(r["version"], {})[i] = frac
        width = 0.8 / max(len(series), 1)
        for k, (ver, pts) in enumerate(sorted(series.items(), key=lambda kv: _vidx(kv[0]))):
            xs = [i + k * width for i in pts]
            ax.bar(xs, [100 * v for v in pts.values()], width, label=ver, color=f"C{_vidx(ver)}")
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(cases))])
        ax.set_xticklabels(labels, fontsize=6, rotation=30, ha="right")
        unit = "% of its ceiling"
        ax.set_ylabel(unit)
        ax.set_title(f"{fam}: the ladder")
        ax.legend(fontsize=7, ncol=2)
    for ax in axes[n:]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _vidx(ver):
    if ver == "blas":
        return 0
    try:
        return int(ver.split("_")[0][1:])
    except ValueError:
        return 9
