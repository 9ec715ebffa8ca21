"""A longer fuzzing campaign than CI's: ``python tests/fuzz_campaign.py --cases 1000 --seed 1``.

Runs the targets of tests/fuzz_harness.py (prototxt, .caffemodel, .npz, .solverstate, a snapshot's
.caffemodel, IDX raw and gzipped), ``--cases`` seeded cases each, and prints per target how many
were tried, accepted, refused with minicaffe's errors (clean), ugly (another exception), hang
(over the time limit; a case stuck for ``--alarm`` seconds is interrupted), heavy (over the memory
bound) and silent (accepted with damaged content and no word), with the slowest and heaviest case.
Every non-clean case is printed with its seed and number, so it can be replayed.
"""

import argparse
import json
import os
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests import fuzz_harness  # noqa: E402


class Stuck(Exception):
    pass


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=int, default=500, help="cases per target")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--targets", help="comma-separated target names (default: all)")
    p.add_argument("--alarm", type=int, default=30, help="interrupt a case stuck this long (s)")
    p.add_argument("--no-trace", action="store_true", help="skip tracemalloc (faster, no memory figures)")
    p.add_argument("--json", help="write the table here")
    args = p.parse_args(argv)

    def on_alarm(signum, frame):
        raise Stuck(f"stuck for {args.alarm} s")

    signal.signal(signal.SIGALRM, on_alarm)
    rows, worst = {}, []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        targets = fuzz_harness.make_targets(tmp)
        try:
            for target in targets:
                if args.targets and target.name not in args.targets.split(","):
                    continue
                run = target.run

                def guarded(sample, run=run):
                    signal.alarm(args.alarm)
                    try:
                        return run(sample)
                    finally:
                        signal.alarm(0)

                target.run = guarded
                outcomes = fuzz_harness.run_cases(target, args.seed, args.cases, traced=not args.no_trace)
                for o in outcomes:
                    if o.detail.startswith("Stuck"):
                        o.kind = "hang"
                rows.update(fuzz_harness.summarize(outcomes))
                worst += [o for o in outcomes if o.kind not in ("accepted", "refused")]
                print(f"{target.name}: {rows[target.name]}", flush=True)
        finally:
            fuzz_harness.close_targets()
    kinds = ["accepted", "refused", "ugly", "hang", "heavy", "silent"]
    print(f"\nseed {args.seed}, {args.cases} cases per target, {time.perf_counter() - t0:.0f} s")
    print(f"{'target':<20} {'tried':>6} " + " ".join(f"{k:>8}" for k in kinds) + f" {'max s':>7} {'max MB':>7}")
    total = {k: 0 for k in ["tried"] + kinds}
    for name, row in rows.items():
        print(
            f"{name:<20} {row['tried']:>6} "
            + " ".join(f"{row.get(k, 0):>8}" for k in kinds)
            + f" {row['max_s']:>7.3f} {row['max_mb']:>7.1f}"
        )
        for k in total:
            total[k] += row.get(k, 0)
    print(f"{'all':<20} {total['tried']:>6} " + " ".join(f"{total[k]:>8}" for k in kinds))
    clean = total["accepted"] + total["refused"]
    print(
        f"tried {total['tried']} / clean {clean} / ugly {total['ugly']} / hang {total['hang']} / "
        f"heavy {total['heavy']} / silent {total['silent']}"
    )
    for o in worst[:40]:
        print("  ", o)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"seed": args.seed, "cases": args.cases, "rows": rows}, f, indent=1)
    return 1 if total["ugly"] or total["hang"] or total["heavy"] else 0


if __name__ == "__main__":
    sys.exit(main())
