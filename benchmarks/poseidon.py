"""Poseidon's two ideas, measured on an emulated cluster, and the simulator checked against them.

    python benchmarks/poseidon.py                                   # the whole grid (long)
    python benchmarks/poseidon.py --nets alexnet_fc_head --nodes 4 --links 1gbit
    python benchmarks/poseidon.py --report benchmarks/poseidon_results.json   # tables + plots again

For every (net, nodes, link, mode) it runs ``python -m minicaffe.train`` on P nodes, each in its
own network namespace behind a tc-shaped link (``python -m minicaffe.dist.emulate``; where
namespaces are not allowed, the transport's token bucket, ``--link``), for ``--iters``
iterations, and reads node 0's train_log.jsonl: seconds per iteration after ``--warmup``
iterations (numba compiles in the first), images/s of the global batch, bytes per iteration
per node (sent + received, headers included), the share of the iteration node 0 spent waiting
for parameters, and Poseidon's per-layer timeline. Modes are {PS, SFB, hybrid} x {WFBP off, on}.

The simulator (``minicaffe.dist.simulate``) is then given each run's own per-layer forward and
backward times (node 0's medians over the recorded iterations: they include the slowdown of P
node processes sharing this machine's cores) and the link, and predicts the seconds per
iteration; the validation table prints prediction / measurement.

Data are synthetic (seeded, the nets' shapes). The machine's cores are shared by the nodes, so
compare modes at equal node counts, not node counts with each other.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

MODES = [("ps", "off"), ("ps", "on"), ("sfb", "off"), ("sfb", "on"), ("hybrid", "off"), ("hybrid", "on")]
DELAY = "0.1ms"


def label(comm, wfbp):
    return f"{comm}{'+WFBP' if wfbp == 'on' else ''}"


def synthetic_solver(net, workdir, iters, batch=None):
    """A solver prototxt (and its net) reading synthetic data: no download, same shapes;
    ``batch`` replaces the TRAIN Data layer's batch_size (the whole run's batch)."""
    from minicaffe import proto
    from minicaffe.parallel import with_synthetic_data
    from minicaffe.tools.common import resolve_net, resolve_solver

    sp = proto.parse_file(resolve_solver(net), "SolverParameter")
    npar = with_synthetic_data(proto.parse_file(resolve_net(net, "train_test"), "NetParameter"), count=1024)
    for lp in npar.layer:
        if batch and lp.type == "Data":
            lp.data_param.batch_size = batch
    net_path = os.path.join(workdir, f"{net}_net.prototxt")
    with open(net_path, "w") as f:
        f.write(proto.to_text(npar))
    sp.net = net_path
    for field in ("test_iter",):
        sp.clear(field)
    sp.test_interval, sp.display, sp.snapshot, sp.snapshot_after_train = 0, 0, 0, False
    sp.max_iter = iters
    path = os.path.join(workdir, f"{net}_solver.prototxt")
    with open(path, "w") as f:
        f.write(proto.to_text(sp))
    batch = next(lp.data_param.batch_size for lp in npar.layer if lp.type == "Data")
    return path, batch


def namespaces_ok():
    from minicaffe.dist.emulate import why_not

    return why_not()


def run_one(net, nodes, link, comm, wfbp, iters, workdir, use_ns, timeout, batch=None):
    solver, batch = synthetic_solver(net, workdir, iters, batch)
    out = os.path.join(workdir, f"{net}_{nodes}_{link}_{comm}_{wfbp}")
    train = [sys.executable, "-m", "minicaffe.train", solver, "--iters", str(iters), "--test-interval", "0"]
    train += ["--no-plot", "--output", out, "--force", "--comm", comm, "--wfbp", wfbp]
    # a 58M-parameter net's start-up (node 0 sends every node all parameters) on 2 shared cores
    # can keep a node quiet for longer than the default 10 s
    train += ["--peer-timeout", "120", "--connect-timeout", "300"]
    if use_ns:
        cmd = [sys.executable, "-m", "minicaffe.dist.emulate", "--nodes", str(nodes), "--bandwidth", link]
        cmd += ["--delay", DELAY, "--"] + train
    else:
        cmd = train + ["--nodes", str(nodes), "--link", link, "--link-delay", DELAY]
    env = dict(os.environ, PYTHONPATH=ROOT)
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=workdir)
    wall = time.time() - t0
    if r.returncode != 0:
        return {"error": (r.stdout + r.stderr)[-1500:], "wall_s": wall}
    latency = DELAY if use_ns is False or "latency is not emulated" not in r.stdout + r.stderr else "0"
    return parse_run(out, batch, nodes) | {"wall_s": wall, "batch": batch, "latency": latency}


def parse_run(out, batch, nodes, warmup=2):
    recs = [json.loads(line) for line in open(os.path.join(out, "train_log.jsonl"))]
    its = [r for r in recs if r.get("kind") == "iter"]
    dist = next(r for r in recs if r.get("kind") == "dist")
    times = [b["seconds"] - a["seconds"] for a, b in zip(its, its[1:]) if a["iter"] >= warmup]
    per_iter = statistics.median(times)  # the median iteration: robust to other jobs on the machine
    node0 = dist["nodes"]["0"]
    pos = dist["poseidon"]
    busy = node0["compute_s"] + node0["sync_s"]
    waited = node0["wait_s"] + pos["sfb_wait_s"]
    return {
        "seconds_per_iter": per_iter,
        "images_per_s": batch / per_iter,
        "bytes_per_iter": sum(l["measured_bytes"] for l in pos["layers"].values()),
        "wait_share": waited / busy if busy > 0 else 0.0,
        "layers": pos["layers"],
        "timeline": pos["timeline"],
    }


# -- the simulator, fed with each run's own per-layer times --------------------------------------
def simulated(run, net, nodes, link, comm, wfbp, topology, batch=None):
    from minicaffe import proto
    from minicaffe.dist import simulate as sim
    from minicaffe.parallel import with_synthetic_data
    from minicaffe.tools.common import resolve_net

    param = with_synthetic_data(proto.parse_file(resolve_net(net, "train_test"), "NetParameter"))
    batch = (batch or next(lp.data_param.batch_size for lp in param.layer if lp.type == "Data")) // nodes
    rows = {r["name"]: r for r in sim.flops_model(param, batch)}
    fwd, bwd = {}, {}
    for lane, name, t0, t1, _ in run["timeline"]:
        if lane in ("forward", "backward"):
            (fwd if lane == "forward" else bwd).setdefault(name, []).append(t1 - t0)
    per_param = run.get("update_s_per_param", 2e-9)
    layers = [sim.Layer("(iteration overhead)", overhead(run), 0.0)]
    for name, r in rows.items():
        lay = sim.Layer(name, statistics.median(fwd.get(name, [0.0])), statistics.median(bwd.get(name, [0.0])))
        lay.count = r["count"]
        lay.update = r["count"] * per_param
        if r["type"] == "InnerProduct":
            lay.m, lay.n, lay.k = r["m"], r["n"], r["k"]
            lay.wgrad = lay.forward  # dW over K rows: the forward's GEMM, transposed
        layers.append(lay)
    l = sim.Link(sim.parse_rate(link), sim.parse_seconds(run.get("latency", DELAY)), topology=topology)
    # P node processes share this machine's cores: a sync's CPU work comes out of the compute
    busy = nodes > (os.cpu_count() or 1) // 2
    return sim.simulate(layers, nodes, l, comm, wfbp == "on", cpu_overlap=not busy).period


def overhead(run):
    """Node 0's time per iteration outside the layers and the waits (data, the solver's loop,
    Python): the median over recorded iterations of period - layer times - waiting."""
    ev = run["timeline"]
    starts = sorted((e[4], e[2]) for e in ev if e[0] == "iteration")
    out = []
    for (c, t), (_, t_next) in zip(starts, starts[1:]):
        busy = sum(e[3] - e[2] for e in ev if e[4] == c and e[0] in ("forward", "backward", "wait"))
        out.append(t_next - t - busy)
    return max(statistics.median(out), 0.0) if out else 0.0


# -- tables and plots -----------------------------------------------------------------------------
def table(results):
    lines = [
        f"{'net':<16} {'P':>2} {'link':>7} {'mode':<12} {'images/s':>9} {'ms/iter':>9} {'MB/iter':>8} "
        f"{'waiting':>8} {'vs PS':>6}"
    ]
    for key, r in results.items():
        net, nodes, link, comm, wfbp = key.split("|")
        if "error" in r:
            lines.append(f"{net:<16} {nodes:>2} {link:>7} {label(comm, wfbp):<12} failed: {r['error'][-120:]!r}")
            continue
        base = results.get("|".join([net, nodes, link, "ps", "off"]), {})
        ratio = r["images_per_s"] / base["images_per_s"] if "images_per_s" in base else float("nan")
        lines.append(
            f"{net:<16} {nodes:>2} {link:>7} {label(comm, wfbp):<12} {r['images_per_s']:>9.1f} "
            f"{1e3 * r['seconds_per_iter']:>9.1f} {r['bytes_per_iter'] / 1e6:>8.2f} {100 * r['wait_share']:>7.0f}% "
            f"{ratio:>5.2f}x"
        )
    return "\n".join(lines)


def validation(results):
    lines = [f"{'net':<16} {'P':>2} {'link':>7} {'mode':<12} {'measured':>9} {'predicted':>9} {'pred/meas':>9}"]
    for key, r in results.items():
        if "predicted_s" not in r:
            continue
        net, nodes, link, comm, wfbp = key.split("|")
        ratio = r["predicted_s"] / r["seconds_per_iter"]
        flag = "" if abs(ratio - 1) <= 0.15 else "  (outside 15%)"
        lines.append(
            f"{net:<16} {nodes:>2} {link:>7} {label(comm, wfbp):<12} {1e3 * r['seconds_per_iter']:>8.1f}ms "
            f"{1e3 * r['predicted_s']:>8.1f}ms {ratio:>9.2f}{flag}"
        )
    return "\n".join(lines)


def plot_throughput(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({tuple(k.split("|")[:3]) for k, r in results.items() if "error" not in r})
    fig, axes = plt.subplots(1, len(groups), figsize=(3.6 * len(groups), 3.4), squeeze=False)
    for ax, (net, nodes, link) in zip(axes[0], groups):
        vals = [results.get("|".join([net, nodes, link, c, w]), {}).get("images_per_s", 0.0) for c, w in MODES]
        colors = [{"ps": "C0", "sfb": "C1", "hybrid": "C2"}[c] for c, _ in MODES]
        bars = ax.bar(range(len(MODES)), vals, color=colors)
        for b, (_, w) in zip(bars, MODES):
            if w == "on":
                b.set_hatch("//")
        ax.set_xticks(range(len(MODES)), [label(c, w) for c, w in MODES], rotation=45, ha="right", fontsize=7)
        ax.set_title(f"{net}, {nodes} nodes, {link}", fontsize=8)
        ax.set_ylabel("images/s")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_timelines(results, key_off, key_on, path):
    """Node 0's per-layer compute and communication, WFBP off above, on below."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [(k, results[k]) for k in (key_off, key_on) if k in results and "timeline" in results[k]]
    if not runs:
        return False
    names = []
    for _, r in runs:
        for e in r["timeline"]:
            if e[0] in ("forward", "backward", "sync") and e[1] not in names and not e[1].startswith("("):
                names.append(e[1])
    colors = {n: f"C{j % 10}" for j, n in enumerate(names)}
    fig, axes = plt.subplots(len(runs), 1, figsize=(11, 1.9 * len(runs) + 0.6), squeeze=False)
    lanes = {"forward": 2, "backward": 2, "wait": 1, "sync": 0}
    for ax, (key, r) in zip(axes[:, 0], runs):
        ev = [e for e in r["timeline"] if e[0] in lanes]
        clocks = sorted({e[4] for e in ev})[:2]  # two iterations
        ev = [e for e in ev if e[4] in clocks]
        t0 = min(e[2] for e in ev)
        for lane, name, a, b, _ in ev:
            color = "0.8" if lane == "wait" else colors.get(name, "0.5")
            ax.barh(lanes[lane], (b - a) * 1e3, left=(a - t0) * 1e3, color=color, edgecolor="k", linewidth=0.2)
        ax.set_yticks([0, 1, 2], ["sync", "waiting", "compute"])
        net, nodes, link, comm, wfbp = key.split("|")
        ax.set_title(f"{net}, {nodes} nodes, {link}, {label(comm, wfbp)}: node 0, two iterations", fontsize=8)
    axes[-1, 0].set_xlabel("ms")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
    fig.legend(handles, list(colors), fontsize=7, ncol=min(len(colors), 8), loc="upper right")
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nets", nargs="+", default=["lenet", "cifar10_quick", "alexnet_fc_head"])
    p.add_argument("--nodes", type=int, nargs="+", default=[2, 4])
    p.add_argument("--links", nargs="+", default=["1gbit", "10gbit"])
    p.add_argument(
        "--modes", nargs="+", default=[f"{c}:{w}" for c, w in MODES], help="comm:wfbp, e.g. ps:off hybrid:on"
    )
    p.add_argument("--iters", type=int, default=8, help="iterations per run (the first 2 are not timed)")
    p.add_argument("--batch", type=int, help="the run's batch (all nodes together) instead of the net's")
    p.add_argument("--limiter", action="store_true", help="use the transport's token bucket even where root")
    p.add_argument("--timeout", type=int, default=900)
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "poseidon_results.json"))
    p.add_argument("--report", help="print the tables and draw the plots of a results file, run nothing")
    args = p.parse_args(argv)
    from minicaffe.dist import simulate as sim

    if args.report:
        with open(args.report) as f:
            doc = json.load(f)
        results = doc["results"]
    else:
        why = None if args.limiter else namespaces_ok()
        use_ns = not args.limiter and why is None
        print(
            f"links: {'network namespaces + tc' if use_ns else 'the transport token bucket'}"
            + (f" ({why})" if why else "")
        )
        print(f"load before: {os.getloadavg()}")
        results = {}
        if os.path.exists(args.out):
            with open(args.out) as f:
                results = json.load(f).get("results", {})
        with tempfile.TemporaryDirectory(prefix="poseidon-bench-") as work:
            for net in args.nets:
                for nodes in args.nodes:
                    for link in args.links:
                        for mode in args.modes:
                            comm, wfbp = mode.split(":")
                            name = net + (f"@{args.batch}" if args.batch else "")
                            key = "|".join([name, str(nodes), link, comm, wfbp])
                            r = run_one(
                                net, nodes, link, comm, wfbp, args.iters, work, use_ns, args.timeout, args.batch
                            )
                            r["topology"] = "star" if use_ns else "mesh"
                            r["load"] = os.getloadavg()[0]
                            results[key] = r
                            msg = r.get("error", "")[-200:] or f"{r['images_per_s']:.1f} images/s, {r['wall_s']:.0f} s"
                            print(f"{key}: {msg}", flush=True)
                            with open(args.out, "w") as f:
                                json.dump({"results": results}, f)
        doc = {"results": results}
    per_param = sim.update_seconds_per_param()  # memory-bound: measured here, now
    for key, r in results.items():
        if "error" in r:
            continue
        r["update_s_per_param"] = per_param
        net, nodes, link, comm, wfbp = key.split("|")
        net = net.split("@")[0]
        r["predicted_s"] = simulated(r, net, int(nodes), link, comm, wfbp, r.get("topology", "star"), r.get("batch"))
    print(table(results))
    print()
    print("simulator validation (per-layer times from each run, the link, the WFBP schedule):")
    print(validation(results))
    base = os.path.splitext(args.report or args.out)[0]
    plot_throughput(results, base + "_throughput.png")
    for net in {k.split("|")[0] for k in results}:
        keys = [k for k in results if k.startswith(net + "|") and "|hybrid|" in k]
        if keys:
            _, nodes, link, _, _ = sorted(keys)[-1].split("|")
            stem = "|".join([net, nodes, link])
            plot_timelines(
                results, stem + "|ps|off", stem + "|hybrid|on", f"{base}_timeline_{net.replace('@', '_b')}.png"
            )
    if not args.report:
        with open(args.out, "w") as f:
            json.dump(doc, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
