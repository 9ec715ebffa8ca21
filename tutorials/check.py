"""Check your answers to the lessons' exercises.

    python -m tutorials.check 05        every code exercise of lesson 5
    python -m tutorials.check 05.1      one exercise
    python -m tutorials.check all       every exercise of every lesson

You write your answer in ``tutorials/exercises/exNN.py`` (each function there starts as a stub
that raises NotImplementedError); the checker imports it and tests it against minicaffe's own
code or a known answer.  ``--solutions`` checks the reference solutions in
``tutorials/solutions/`` instead (the tests do this, and that every stub fails).  Answers to the
questions that ask for thought, not code, are in ``tutorials/solutions/ANSWERS.md``.
"""

import argparse
import importlib
import json
import os
import sys
import traceback

# Lesson 6's exercises are CUDA kernels run by numba's simulator, which is chosen once per process
# at the first import of numba.cuda: choose it before anything imports it.
os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")


from .checks import CHECKS  # noqa: E402  (one section per lesson)


def load(lesson, solutions):
    return importlib.import_module(f"tutorials.{'solutions' if solutions else 'exercises'}.ex{lesson}")


def select(keys):
    ids = sorted(CHECKS)
    if not keys or keys == ["all"]:
        return ids
    out = []
    for key in keys:
        key = key.strip()
        if "." in key:
            lesson, _, k = key.partition(".")
            key = f"{lesson.zfill(2)}.{k}"
            if key not in CHECKS:
                raise SystemExit(f"error: no code exercise {key}; known: {', '.join(ids)}")
            out.append(key)
        else:
            hit = [i for i in ids if i.startswith(key.zfill(2) + ".")]
            if not hit:
                raise SystemExit(f"error: lesson {key} has no code exercises; known: {', '.join(ids)}")
            out += hit
    return out


def run(ids, solutions=False):
    """[(id, title, ok, message)] for the exercises ``ids``."""
    results = []
    for ex_id in ids:
        title, fn = CHECKS[ex_id]
        try:
            fn(load(ex_id[:2], solutions))
            results.append((ex_id, title, True, "ok"))
        except NotImplementedError:
            results.append((ex_id, title, False, "not written yet (the stub raises NotImplementedError)"))
        except AssertionError as e:
            results.append((ex_id, title, False, str(e) or "a check failed"))
        except Exception as e:  # noqa: BLE001  (a student's bug: show where it is)
            tb = traceback.extract_tb(e.__traceback__)
            where = next(
                (
                    f"{os.path.relpath(f.filename)}:{f.lineno}"
                    for f in reversed(tb)
                    if "exercises" in f.filename or "solutions" in f.filename
                ),
                "",
            )
            results.append((ex_id, title, False, f"{type(e).__name__}: {e}" + (f" (at {where})" if where else "")))
    return results


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m tutorials.check", description=__doc__.split("\n\n")[0])
    ap.add_argument("ids", nargs="*", help="'05' (a lesson), '05.1' (one exercise) or 'all'")
    ap.add_argument("--solutions", action="store_true", help="check the reference solutions instead")
    ap.add_argument("--json", action="store_true", help="print the results as JSON (for the tests)")
    args = ap.parse_args(argv)
    results = run(select(args.ids), args.solutions)
    if args.json:
        print(json.dumps([{"id": i, "ok": ok, "message": m} for i, _, ok, m in results]))
    else:
        for ex_id, title, ok, message in results:
            print(f"{ex_id} {'PASS' if ok else 'FAIL'}  {title}" + ("" if ok else f"\n      {message}"))
        n = sum(ok for *_, ok, _ in results)
        print(f"{n}/{len(results)} passed")
    return 0 if all(ok for *_, ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
