"""SingleCaffe on this machine: N worker threads vs one thread using every core through BLAS.

    python benchmarks/parallel.py                        # LeNet and CIFAR-10 quick, 1..3 workers
    python benchmarks/parallel.py --nets lenet --workers 1 2 --repeats 7 --iters 30
    python benchmarks/parallel.py --workers 2 --server-update --rounds 3   # sharded vs server update
    python benchmarks/parallel.py --nets lenet --workers 2 --against ../old   # A/B: the runtime rows again,
                                                         # run by another checkout's code, same rounds

Every configuration runs in its own subprocess, so that ``OPENBLAS_NUM_THREADS`` is set before
numpy loads OpenBLAS (the runtime also sets it through blas.py, but the baseline must not be
touched) and so that each peak RSS is its own.  Data are synthetic (seeded, the nets' shapes), so
nothing is downloaded.  Each subprocess warms up (numba's cache, first allocations), then times
``repeats`` runs of ``iters`` iterations and reports the median.  With ``--rounds R`` the whole
list of configurations runs R times, interleaved (a, b, c, a, b, c, ...), so that a slow minute
of a shared machine hits every row; a row's figure is the median over rounds.

Rows:
  serial BLAS=all    the Solver alone, OpenBLAS with one thread per core (Caffe's way)
  serial BLAS=1      the Solver alone, one BLAS thread
  serial + arena     the Solver alone on the planned arena (convolutions recompute im2col)
  BSP N workers      the runtime: N replica threads + the server (this thread), BLAS cores//N;
                     the reduce + SGD update sharded over the workers (parallel/shard.py)
  ... server update  (--server-update) the same, with the server reducing and updating alone
  SSP s=1 N workers  the same with staleness 1

Columns: ms per iteration (global batch), images/s, speedup over "serial BLAS=all" and over
"serial BLAS=1" (the scaling per core, free of OpenBLAS's own threading), where the
server's time goes per iteration (waiting for workers / reducing / applying the update), the
workers' mean compute time, the arena (planned) vs one allocation per buffer (naive) in MiB, and
the process's peak RSS, and "steal": the ms per iteration that the hypervisor gave the
machine's cores to other guests while the row was timed (a virtual machine's /proc/stat;
workers wait for each other every iteration, so steal on either core stalls both, and a
row with steal well above the others' was disturbed); for the runtime also each worker's mean
wait for the other workers' gradients (sync) and its share of the sharded update.  The workers' replicas keep im2col's
columns from forward to backward, as the train tool's do (the arena row recomputes them).  The plot (benchmarks/parallel_scaling.png) shows images/s against
workers for each net, with the serial baselines as horizontal lines.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
NETS = {"lenet": "lenet_solver.prototxt", "cifar10_quick": "cifar10_quick_solver.prototxt"}


def steal_ms():
    """CPU time the hypervisor gave to other guests, summed over this machine's cores, in ms
    (Linux /proc/stat; 0 where it is not reported).  Two workers wait for each other every step,
    so a core taken away from one stalls both: a row with much steal is a disturbed row."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return int(fields[8]) * 1000.0 / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def child(cfg):
    """Run one configuration in this process; print one JSON line."""
    sys.path.insert(0, ROOT)
    import numpy as np

    from minicaffe import proto
    from minicaffe.memory.planner import plan_solver
    from minicaffe.memory.report import process_peak_rss
    from minicaffe.parallel import ParallelTrainer, with_synthetic_data
    from minicaffe.solvers import get_solver, load_solver_param

    param, base = load_solver_param(os.path.join(ROOT, "nets", NETS[cfg["net"]]))
    netp = proto.parse_file(os.path.join(ROOT, "nets", param.net), "NetParameter")
    param.clear("net")
    param.net_param = with_synthetic_data(netp, count=2048)
    for f in ("test_iter", "test_interval"):
        param.clear(f)
    param.display = 0
    param.snapshot = 0
    param.snapshot_after_train = False
    solver = get_solver(param, log=lambda m: None)
    batch = solver.net.layers[0].batch_size
    out = {"cfg": cfg, "batch": batch}
    mode = cfg["mode"]
    if mode == "serial":
        run = solver.step
        if cfg.get("arena"):
            plan = plan_solver(solver, recompute=True)
            out["planned"], out["naive"] = plan.size, plan.naive
        else:
            from minicaffe.memory import plan_net
            from minicaffe.memory.planner import history_buffers

            plan = plan_net(solver.net, params=True, extra=history_buffers(solver))  # sizes only
            out["planned"], out["naive"] = None, plan.naive
    else:
        trainer = ParallelTrainer(
            solver, cfg["workers"], staleness=cfg.get("staleness", 0), shard_update=cfg.get("shard", True)
        )
        run = trainer.step
        mem = trainer.memory_summary()
        out["planned"], out["naive"] = mem["planned"], mem["naive"]
    run(cfg["warmup"])
    times, stats = [], []
    steal0 = steal_ms()
    for _ in range(cfg["repeats"]):
        t0 = time.perf_counter()
        run(cfg["iters"])
        times.append((time.perf_counter() - t0) / cfg["iters"])
        if mode != "serial":
            stats.append(trainer.stats())
    out["steal"] = (steal_ms() - steal0) / (cfg["repeats"] * cfg["iters"])
    out["ms"] = 1000 * statistics.median(times)
    out["ms_all"] = [1000 * t for t in times]
    if stats:
        med = lambda key: 1000 * statistics.median(s[key] for s in stats)  # noqa: E731
        out["server_wait"], out["server_reduce"], out["server_update"] = (
            med("server_wait"),
            med("server_reduce"),
            med("server_update"),
        )
        for key in ("worker_compute", "worker_sync", "worker_update"):
            out[key] = 1000 * statistics.median(statistics.mean(s[key]) for s in stats)
    out["rss"] = process_peak_rss()
    out["loss"] = float(solver.smoothed_loss)
    assert np.isfinite(out["loss"])
    print("RESULT " + json.dumps(out), flush=True)


def launch(cfg, blas_threads):
    root = cfg.get("root", ROOT)  # --against: another checkout's code runs this configuration
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(blas_threads), PYTHONPATH=root)
    script = os.path.join(root, "benchmarks", "parallel.py")
    proc = subprocess.run([sys.executable, script, "--child", json.dumps(cfg)], env=env, capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"configuration {cfg} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")


def row_label(cfg):
    if cfg["mode"] == "serial":
        return "serial + arena" if cfg.get("arena") else f"serial BLAS={cfg['blas']}"
    s = cfg.get("staleness", 0)
    label = f"{'BSP' if not s else f'SSP s={s}'} {cfg['workers']} worker{'s' if cfg['workers'] > 1 else ''}"
    label += ", server update" if cfg.get("shard") is False else ""
    return label + (f" [{os.path.basename(cfg['root'].rstrip('/'))}]" if "root" in cfg else "")


def table(results, cores):
    lines = []
    for net in dict.fromkeys(r["cfg"]["net"] for r in results):
        rows = [r for r in results if r["cfg"]["net"] == net]
        base = next(
            r for r in rows if r["cfg"]["mode"] == "serial" and not r["cfg"].get("arena") and r["cfg"]["blas"] == cores
        )
        one = next(
            r for r in rows if r["cfg"]["mode"] == "serial" and not r["cfg"].get("arena") and r["cfg"]["blas"] == 1
        )
        lines.append(
            f"\n{net} (global batch {rows[0]['batch']}, synthetic data, {cores} cores; "
            f"median of {rows[0]['cfg']['repeats']} x {rows[0]['cfg']['iters']} iterations"
            + (f", median over {rows[0]['rounds']} rounds" if rows[0].get("rounds", 1) > 1 else "")
            + ")"
        )
        lines.append(
            f"  {'configuration':31s} {'ms/iter':>8s} {'img/s':>7s} {'speedup':>7s} {'vs 1thr':>7s} "
            f"{'srv wait':>8s} {'reduce':>7s} {'update':>7s} {'worker':>7s} {'w sync':>7s} {'w upd':>7s} "
            f"{'arena MiB':>9s} {'naive MiB':>9s} {'RSS MiB':>8s} {'steal':>6s}"
        )
        for r in rows:
            ips = r["batch"] / (r["ms"] / 1000)
            f = lambda k: f"{r[k]:7.2f}" if k in r else f"{'-':>7s}"  # noqa: E731
            planned = f"{r['planned'] / 2**20:9.2f}" if r.get("planned") else f"{'-':>9s}"
            lines.append(
                f"  {row_label(r['cfg']):31s} {r['ms']:8.2f} {ips:7.0f} {base['ms'] / r['ms']:6.2f}x "
                f"{one['ms'] / r['ms']:6.2f}x {f('server_wait'):>8s} {f('server_reduce')} {f('server_update')} "
                f"{f('worker_compute')} {f('worker_sync')} {f('worker_update')} "
                f"{planned} {r['naive'] / 2**20:9.2f} {r['rss'] / 2**20:8.1f} {r.get('steal', 0.0):6.2f}"
            )
    return "\n".join(lines)


def plot(results, path, cores):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nets = list(dict.fromkeys(r["cfg"]["net"] for r in results))
    fig, axes = plt.subplots(1, len(nets), figsize=(5.5 * len(nets), 4), squeeze=False)
    for ax, net in zip(axes[0], nets):
        rows = [r for r in results if r["cfg"]["net"] == net]
        ips = lambda r: r["batch"] / (r["ms"] / 1000)  # noqa: E731
        for s, style in ((0, "o-"), (1, "s--")):
            pts = sorted(
                (r["cfg"]["workers"], ips(r))
                for r in rows
                if r["cfg"]["mode"] == "parallel"
                and r["cfg"].get("staleness", 0) == s
                and r["cfg"].get("shard", True)
                and "root" not in r["cfg"]
            )
            if pts:
                ax.plot(*zip(*pts), style, label="BSP" if s == 0 else f"SSP s={s}")
        for r, color in zip([r for r in rows if r["cfg"]["mode"] == "serial"], ("k", "gray", "tab:green")):
            ax.axhline(ips(r), color=color, ls=":", label=row_label(r["cfg"]))
        ax.set_xlabel("worker threads")
        ax.set_ylabel("images / s")
        ax.set_title(f"{net} ({cores} cores)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nets", nargs="+", default=list(NETS), choices=list(NETS))
    p.add_argument("--workers", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--ssp", action="store_true", help="also run SSP with staleness 1 at 2 workers")
    p.add_argument(
        "--server-update", action="store_true", help="also run 2 workers with the server's own reduce and update"
    )
    p.add_argument("--rounds", type=int, default=1, help="interleaved rounds of every configuration")
    p.add_argument(
        "--against",
        metavar="DIR",
        help="another checkout of minicaffe: its code also runs every runtime row, in the same rounds (A/B)",
    )
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--plot", default=os.path.join(HERE, "parallel_scaling.png"))
    p.add_argument("--json", default=os.path.join(HERE, "parallel_results.json"))
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return 0
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    common = {"iters": args.iters, "repeats": args.repeats, "warmup": args.warmup}
    cfgs = []
    for net in args.nets:
        it = dict(common)
        if net == "cifar10_quick":  # about 4x LeNet's work per iteration
            it["iters"] = max(3, args.iters // 3)
        cfgs += [
            ({"net": net, "mode": "serial", "blas": cores, **it}, cores),
            ({"net": net, "mode": "serial", "blas": 1, **it}, 1),
            ({"net": net, "mode": "serial", "blas": 1, "arena": True, **it}, 1),
        ]
        cfgs += [({"net": net, "mode": "parallel", "workers": n, **it}, max(1, cores // n)) for n in args.workers]
        if args.server_update:
            cfgs.append(({"net": net, "mode": "parallel", "workers": 2, "shard": False, **it}, max(1, cores // 2)))
        if args.ssp:
            cfgs.append(({"net": net, "mode": "parallel", "workers": 2, "staleness": 1, **it}, max(1, cores // 2)))
        if args.against:
            root = os.path.abspath(args.against)
            cfgs += [({**c, "root": root}, t) for c, t in list(cfgs) if c["net"] == net and c["mode"] == "parallel"]
    print(f"load average at the start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    runs = [[] for _ in cfgs]
    for rnd in range(args.rounds):
        for (cfg, threads), got in zip(cfgs, runs):
            r = launch(cfg, threads)
            print(
                f"  round {rnd + 1} {cfg['net']:14s} {row_label(cfg):31s} {r['ms']:8.2f} ms/iter  (runs: "
                f"{', '.join(f'{x:.1f}' for x in r['ms_all'])}; steal {r.get('steal', 0.0):.2f} ms/iter)",
                flush=True,
            )
            got.append(r)
    results = []
    for got in runs:  # the round whose median is the median of the rounds' (the upper middle one)
        r = dict(sorted(got, key=lambda r: r["ms"])[len(got) // 2])
        r["ms_rounds"], r["rounds"] = [g["ms"] for g in got], len(got)
        results.append(r)
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(table(results, cores))
    with open(args.json, "w") as f:
        json.dump({"cores": cores, "results": results}, f, indent=1)
    plot(results, args.plot, cores)
    print(f"\nplot: {os.path.relpath(args.plot)}  data: {os.path.relpath(args.json)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
