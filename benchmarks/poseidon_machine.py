"""Where the machine's time goes beyond the node processes' own CPU, under heavy traffic.

    python benchmarks/poseidon_machine.py                       # the FC head, PS, 4 nodes, 20 Gbit/s
    python benchmarks/poseidon_machine.py --out benchmarks/poseidon_machine.json

The simulator charges every node's CPU (its compute, its shard's updates, its transport threads)
and, where the cores are full, spreads it over them: period = P x CPU / cores, plus a small
"out of step" time at BSP's barrier measured where little moves. Under plain PS the FC head
moves 704 MB per node per iteration, and its runs last longer than that. This measures what
the rest is, in runs that are not part of the validation (a rate no validated run uses): the
whole machine's /proc/stat (user, system, softirq, idle, steal) over a run of ``--iters`` and
one of 3 x ``--iters`` iterations, the difference divided by the iterations between (start-up
and the numba compiles cancel out), beside the node processes' own CPU from their marks. Their
difference is time the node processes' clocks do not see: kernel work done outside them
(softirq, ksoftirqd), cores left idle, time the hypervisor took (steal).
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def machine_seconds():
    """The machine's CPU seconds so far by kind, all cores together (/proc/stat's first line)."""
    with open("/proc/stat") as f:
        parts = f.readline().split()[1 : 1 + len(FIELDS)]
    tick = os.sysconf("SC_CLK_TCK")
    return {k: int(v) / tick for k, v in zip(FIELDS, parts)}


def measured(net, nodes, link, iters, work, use_ns):
    import poseidon as bench

    before, t0 = machine_seconds(), time.perf_counter()
    r = bench.run_one(net, nodes, link, "ps", "off", iters, work, use_ns, 900)
    after, wall = machine_seconds(), time.perf_counter() - t0
    if "error" in r:
        raise SystemExit(f"run failed:\n{r['error']}")
    node = bench.node_means(r["cpu"], r["bytes_per_iter"])
    return {"iters": iters, "wall_s": wall, "machine": {k: after[k] - before[k] for k in FIELDS}} | {
        "node_cpu_s": node["cpu_s"],
        "period_s": node["period_s"],
        "median_iteration_s": r["seconds_per_iter"],
        "bytes": r["bytes_per_iter"],
    }


def per_iteration(short, long, nodes):
    """Machine seconds per iteration by kind (the long run less the short one), and what the
    node processes' clocks saw of them."""
    n = long["iters"] - short["iters"]
    m = {k: (long["machine"][k] - short["machine"][k]) / n for k in FIELDS}
    busy = sum(v for k, v in m.items() if k not in ("idle", "iowait", "steal"))
    nodes_cpu = nodes * long["node_cpu_s"]  # all nodes' CPU per iteration (their marks)
    return {
        "machine_s": m,
        "busy_s": busy,
        "nodes_cpu_s": nodes_cpu,
        "outside_nodes_s": busy - nodes_cpu,  # kernel work and other processes the nodes' clocks miss
        "idle_s": m["idle"] + m["iowait"],
        "steal_s": m["steal"],
        "period_s": long["period_s"],
        "bytes_per_node": long["bytes"],
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--net", default="alexnet_fc_head")
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--link", default="20gbit", help="a rate no validated run uses")
    p.add_argument("--iters", type=int, default=8, help="the short run's iterations (the long one: 3x)")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--out", help="write the figures here (JSON)")
    args = p.parse_args(argv)
    import poseidon as bench

    use_ns = bench.namespaces_ok() is None
    print(
        f"load before: {os.getloadavg()}; code {bench.code_commit()}; links: {'namespaces + tc' if use_ns else 'limiter'}"
    )
    tries = []
    with tempfile.TemporaryDirectory(prefix="poseidon-machine-") as work:
        for _ in range(args.repeat):
            short = measured(args.net, args.nodes, args.link, args.iters, work, use_ns)
            long = measured(args.net, args.nodes, args.link, 3 * args.iters, work, use_ns)
            t = per_iteration(short, long, args.nodes)
            tries.append({"short": short, "long": long, **t})
            ms = {k: round(1e3 * v, 1) for k, v in t["machine_s"].items()}
            print(
                f"per iteration: period {1e3 * t['period_s']:.1f} ms; machine {ms} ms (2 cores: "
                f"{2e3 * t['period_s']:.0f} ms); busy {1e3 * t['busy_s']:.1f}, of which the node processes "
                f"{1e3 * t['nodes_cpu_s']:.1f}, outside them {1e3 * t['outside_nodes_s']:.1f}; idle "
                f"{1e3 * t['idle_s']:.1f}; steal {1e3 * t['steal_s']:.1f}",
                flush=True,
            )
    keys = ("period_s", "busy_s", "nodes_cpu_s", "outside_nodes_s", "idle_s", "steal_s", "bytes_per_node")
    doc = {
        "run": f"{args.net}, --comm ps, {args.nodes} nodes, {args.link}, {args.iters} and {3 * args.iters} iterations",
        "code": bench.code_commit(),
        "load_after": os.getloadavg(),
        "median": {k: statistics.median(t[k] for t in tries) for k in keys},
        "tries": tries,
    }
    print("medians:", {k: round(v * (1 if k == "bytes_per_node" else 1e3), 1) for k, v in doc["median"].items()})
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
