"""``python -m minicaffe.memory lenet [--workers N] [--recompute] [--real-data]``: the memory report.

Builds the solver of a net of nets/ (or a solver prototxt), plans it (or, with --workers N, the
parallel runtime's arena) and prints bytes per category, naive vs planned, and the peak.  Data are
synthetic of the same shape unless --real-data (which may download MNIST).
"""

import argparse
import sys


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m minicaffe.memory", description=__doc__.split("\n\n")[0])
    p.add_argument("solver", help="a short name from nets/ (lenet, cifar10_quick, ...) or a solver prototxt")
    p.add_argument("--workers", type=int, default=0, help="plan the parallel runtime with N workers")
    p.add_argument("--recompute", action="store_true", help="convolutions recompute im2col in backward")
    p.add_argument("--real-data", action="store_true", help="read the net's own data sources")
    args = p.parse_args(argv)
    from .. import proto
    from ..errors import MinicaffeError
    from ..solvers import get_solver, load_solver_param
    from ..tools.common import resolve_solver
    from .planner import plan_solver
    from .report import MiB, report_text

    try:
        param, base = load_solver_param(resolve_solver(args.solver))
        if not args.real_data and param.has("net"):
            from ..parallel import with_synthetic_data
            from ..solvers.solver import resolve_path

            netp = proto.parse_file(resolve_path(param.net, base, "solver: net"), "NetParameter")
            param.clear("net")
            param.net_param = with_synthetic_data(netp)
        for f in ("test_iter", "test_interval"):
            param.clear(f)
        solver = get_solver(param, base_dir=base, log=lambda m: None)
        if args.workers:
            from ..parallel import ParallelTrainer

            t = ParallelTrainer(solver, args.workers, recompute=args.recompute)
            s = t.memory_summary()
            print(report_text(t.plans, title=f"{solver.net.name}: {args.workers} workers, activations"))
            print(
                f"  whole arena (params once, gradients, history, worker gradients, all nets): "
                f"{s['planned'] / MiB:.2f} MiB vs naive {s['naive'] / MiB:.2f} MiB "
                f"({s['planned'] / s['naive']:.2f} x)"
            )
        else:
            plan = plan_solver(solver, recompute=args.recompute)
            print(report_text([(solver.net.name, plan)], title=solver.net.name))
    except MinicaffeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
