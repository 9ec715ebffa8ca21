"""Where a training step's time goes, lane by lane: a wall-clock timeline of the step plan.

    python benchmarks/step_timeline.py                       # LeNet, 2 lanes, 60 timed steps
    python benchmarks/step_timeline.py --net cifar10_quick --lanes 2 --steps 30

``python -m minicaffe.time`` gives each layer's time; this gives *when* it ran and on which
thread, so the waits show: the Solver's full step (forward, backward, update) as
``benchmarks/lenet_vs_pytorch.py`` times it, with the step plan's segments run by the lanes.
Every event is placed relative to the start of its step and the median over the timed steps is
printed (start, end, duration, in ms), one row per event and thread:

- ``main``: the calling thread's layers outside the segments (timed by the net's hooks);
- ``lane k``: each layer of a segment on lane k (the step plan records it: ``StepPlan.record``),
  and ``params`` -- a layer's gradient rows after the lanes met (``backward_params``);
- ``wait`` rows: how long lane k sat idle at the end of a segment, waiting for the slowest lane
  (the hand-off included), and the rest of the step on the calling thread that is no layer at
  all (the update, clearing the diffs, the Solver's Python).
"""

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--net", default="lenet", choices=("lenet", "cifar10_quick"))
    p.add_argument("--lanes", type=int, default=2)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument(
        "--arena",
        action="store_true",
        help="place the net's buffers in one memory arena first, as python -m minicaffe.train does "
        "(minicaffe.memory.plan_training)",
    )
    args = p.parse_args(argv)

    from lenet_vs_pytorch import minicaffe_solver

    from minicaffe.parallel import blas, lanes, plan

    solver = minicaffe_solver(args.net)
    lanes.set_count(args.lanes)
    plan.set_enabled(True)
    blas.set_threads(1)
    if args.arena:
        from minicaffe.memory import plan_training

        plan_training(solver, run_first=False)
    net = solver.net
    names = net.layer_names
    sp = net.step_plan() if net.uses_step_plan() else None
    clock = time.perf_counter
    calls = {}  # (layer, phase) -> (start, end) on the calling thread, this step
    opened = {}

    def before(phase):
        return lambda i: opened.__setitem__((i, phase), clock())

    def after(phase):
        return lambda i: calls.__setitem__((i, phase), (opened.pop((i, phase)), clock()))

    rows = {}  # (thread, label) -> [(start, end) relative to the step's start, one per step]
    steps = []
    if sp is not None:
        sp.record = True
    inside = {i for a, b in (sp.segments if sp else []) for i in range(a, b + 1)}
    with net.add_hooks(before("forward"), after("forward"), before("backward"), after("backward")):
        solver.step(args.warmup)
        for _ in range(args.steps):
            calls.clear()
            if sp is not None:
                sp.layer_spans.clear()
                sp.segment_spans.clear()
            t0 = clock()
            solver.step(1)
            t1 = clock()
            steps.append(t1 - t0)
            busy_main = 0.0
            for (i, phase), (a, b) in calls.items():
                if i in inside:
                    continue
                rows.setdefault(("main", f"{names[i]} {phase}"), []).append((a - t0, b - t0))
                busy_main += b - a
            seg_wall = 0.0
            for (first, phase), (a, b) in (sp.segment_spans if sp else {}).items():
                rows.setdefault(("main", f"segment {names[first]} {phase} (lanes)"), []).append((a - t0, b - t0))
                seg_wall += b - a
                last = dict(sp.segments)[first]
                for k in range(args.lanes):
                    ends = [
                        sp.layer_spans[key][k][1]
                        for key in sp.layer_spans
                        if first <= key[0] <= last and (key[1] == phase or (phase == "backward" and key[1] == "params"))
                    ]
                    done = max(ends, default=a)
                    rows.setdefault((f"lane {k}", f"wait: segment {names[first]} {phase} end"), []).append(
                        (done - t0, b - t0)
                    )
            for (i, phase), per_lane in (sp.layer_spans if sp else {}).items():
                for k, (a, b) in enumerate(per_lane):
                    rows.setdefault((f"lane {k}", f"{names[i]} {phase}"), []).append((a - t0, b - t0))
            rest = (t1 - t0) - busy_main - seg_wall
            rows.setdefault(("main", "other: update, clearing, Python (no layer)"), []).append((0.0, rest))
    med = statistics.median
    ms = 1000.0
    print(
        f"{args.net}: {args.lanes} lane(s), step plan {'on' if sp and sp.segments else 'off'}, "
        f"{'one memory arena, ' if args.arena else ''}"
        f"median step {ms * med(steps):.3f} ms over {len(steps)} steps (min {ms * min(steps):.3f})"
    )
    print(f"{'thread':<7} {'event':<48} {'start':>7} {'end':>7} {'ms':>7}")
    order = sorted(rows.items(), key=lambda kv: (med(a for a, _ in kv[1]), kv[0][0]))
    for (thread, label), spans in order:
        if label.startswith("other"):
            continue
        a = med(s for s, _ in spans)
        b = med(e for _, e in spans)
        d = med(e - s for s, e in spans)
        print(f"{thread:<7} {label:<48} {ms * a:7.3f} {ms * b:7.3f} {ms * d:7.3f}")
    other = rows.get(("main", "other: update, clearing, Python (no layer)"), [])
    if other:
        print(
            f"{'main':<7} {'other: update, clearing, Python (no layer)':<48} {'':>7} {'':>7} {ms * med(e for _, e in other):7.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
