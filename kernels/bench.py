"""The kernel ladder benchmark, every family at once: each version is checked against the
float64 reference, then timed against a ceiling this machine reaches at the same size; the
results go to ONE generated table, a JSON file and a plot.

    python -m kernels.bench [family ...] [--quick] [--versions v1_naive,v3_micro]
                            [--sizes 512,1024] [--repeats N] [--clock cpu|wall]
                            [--out DIR] [--asm]

Families: gemm, conv, im2col, pooling, softmax, elementwise, sgd (default: all).  This file is
only the driver: each family's cases live in its own module, which runs alone as
``python -m kernels.<family>``, and the harness (validation, timing, ceilings; how each is
measured) is kernels/_bench.py.  Writes DIR/kernels_table.md, DIR/kernels_results.json and
DIR/kernels_ladder.png (DIR defaults to ./kernels_bench); ``--out benchmarks`` regenerates the
table docs/KERNELS.md links to.  ``--asm`` adds the assembly of the GEMM micro-kernel's hot loop.
"""

import argparse
import datetime
import json
import os
import sys

from . import FAMILIES, _bench
from ._bench import sgemm_peak, stream_bandwidth  # noqa: F401  (the ceilings, for python -m minicaffe.time)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    doc = __doc__.split("\n\n")
    ap = argparse.ArgumentParser(
        prog="python -m kernels.bench",
        description=doc[0],
        epilog="\n\n".join(doc[2:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("families", nargs="*", help=f"kernel families: {', '.join(FAMILIES)} (default: all)")
    ap.add_argument("--quick", action="store_true", help="fewer cases and repeats (about a minute per family)")
    ap.add_argument("--versions", default="", help="comma-separated version names to run (default: all)")
    ap.add_argument("--sizes", default="", help="gemm: comma-separated square sizes")
    ap.add_argument("--repeats", type=int, default=0, help="minimum timed calls per version")
    ap.add_argument(
        "--clock",
        choices=sorted(_bench.CLOCKS),
        default="cpu",
        help="cpu: the thread's CPU time (default; robust on a shared machine); wall: elapsed time. "
        "prange versions always use wall.",
    )
    ap.add_argument("--out", default="kernels_bench", help="directory for the table, JSON and plot")
    ap.add_argument("--asm", action="store_true", help="also print the GEMM micro-kernel's hot loop (assembly)")
    args = ap.parse_args(argv)
    families = args.families or list(FAMILIES)
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        ap.error(
            f"unknown famil{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}; known: {', '.join(FAMILIES)}"
        )
    rc = _bench.reexec_single_blas("kernels.bench", argv)
    if rc is not None:
        return rc
    import importlib

    _bench.set_clock(args.clock)
    versions = set(filter(None, args.versions.split(",")))
    sizes = [int(s) for s in args.sizes.split(",") if s]
    repeats = args.repeats or (3 if args.quick else 7)
    info = _bench.machine_info()
    command = "python -m kernels.bench " + " ".join(argv)
    head = [f"# kernels.bench, {datetime.date.today().isoformat()}: `{command}`"] + _bench.header_lines(
        info, args.clock
    )
    peak = _bench.sgemm_peak()
    large, large_kind = _bench.stream_bandwidth(64 << 20)
    head.append(
        f"# ceilings, measured in this run: SGEMM {peak:.1f} GFLOP/s (OpenBLAS, n=1024, 1 thread), or the vendor on the "
        f"case's own shape if faster; memory: the fastest of read/copy/add/in-place streams over each case's bytes "
        f"({large:.1f} GB/s at 64 MB, {large_kind}); prange rows: x threads"
    )
    head.append("# a rate above its ceiling is flagged ! (a measurement error, not a result)")
    for line in head:
        print(line)
    print()
    print("\n".join(_bench.TABLE_HEAD))
    body = list(_bench.TABLE_HEAD)
    records = []
    for fam in families:
        mod = importlib.import_module(f"kernels.{fam}")
        for case in mod.bench_cases(args.quick, sizes if fam == "gemm" else ()):
            rows, base = _bench.run_case(case, versions, repeats, args.quick, peak)
            lines = _bench.format_case(case, rows, base)
            print("\n".join(lines), flush=True)
            body += lines
            records.append(_bench.case_record(case, rows, base))
    tail = []
    n = _bench.flagged(records)
    if n:
        tail.append(f"! {n} rate(s) above their ceiling: measurement errors (a busy machine?), not results; rerun")
    results = dict(
        machine=info,
        command=command,
        ceilings=dict(sgemm_gflops=peak, stream_gbs_large=large, stream_large_kind=large_kind),
        cases=records,
    )
    if args.asm and "gemm" in families:
        results["simd"] = _bench.simd_report()
        _bench.print_simd(results["simd"])
    os.makedirs(args.out, exist_ok=True)
    paths = [os.path.join(args.out, f) for f in ("kernels_table.md", "kernels_results.json", "kernels_ladder.png")]
    with open(paths[0], "w") as f:
        f.write("\n".join(head + [""] + body + [""] + tail) + "\n")
    with open(paths[1], "w") as f:
        json.dump(results, f, indent=1, default=float)
    _bench.plot(results, paths[2])
    for line in tail:
        print(line)
    print(f"# wrote {', '.join(paths)}")
    return 1 if any("error" in r for c in records for r in c["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())
