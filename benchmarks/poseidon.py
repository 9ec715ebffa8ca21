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
for parameters, Poseidon's per-layer timeline (node 0's) and every node's timeline of its threads
(compute, send, recv, server; ``--report`` draws them per mode). Modes are {PS, SFB, hybrid} x
{WFBP off, on}.

The simulator (``minicaffe.dist.simulate``) is then given each run's own per-layer forward and
backward times (node 0's medians over the recorded iterations: they include the slowdown of P
node processes sharing this machine's cores) and the link, and predicts the seconds per
iteration; the validation table prints prediction / measurement.

Data are synthetic (seeded, the nets' shapes). The machine's cores are shared by the nodes, so
compare modes at equal node counts, not node counts with each other.
"""

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# comm x --wfbp; the last is the default of python -m minicaffe.train (hybrid, --wfbp auto)
MODES = [
    ("ps", "off"),
    ("ps", "on"),
    ("sfb", "off"),
    ("sfb", "on"),
    ("hybrid", "off"),
    ("hybrid", "on"),
    ("hybrid", "auto"),
]
DELAY = "0.1ms"


def label(comm, wfbp):
    return f"{comm}{'+WFBP' if wfbp == 'on' else '+auto' if wfbp == 'auto' else ''}"


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


def run_one(net, nodes, link, comm, wfbp, iters, workdir, use_ns, timeout, batch=None, bucket_kb=None):
    solver, batch = synthetic_solver(net, workdir, iters, batch)
    out = os.path.join(workdir, f"{net}_{nodes}_{link}_{comm}_{wfbp}")
    train = [sys.executable, "-m", "minicaffe.train", solver, "--iters", str(iters), "--test-interval", "0"]
    train += ["--no-plot", "--output", out, "--force", "--comm", comm, "--wfbp", wfbp]
    # a 58M-parameter net's start-up (node 0 sends every node all parameters) on 2 shared cores
    # can keep a node quiet for longer than the default 10 s
    train += ["--peer-timeout", "120", "--connect-timeout", "300"]
    if bucket_kb is not None:
        train += ["--bucket-kb", f"{bucket_kb:g}"]
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


def median_run(runs):
    """The run with the median seconds per iteration (the lower middle one of an even count),
    with every repetition's figure kept beside it."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[-1]
    ok.sort(key=lambda r: r["seconds_per_iter"])
    out = dict(ok[(len(ok) - 1) // 2])
    if len(runs) > 1:
        out["repeats_s"] = [r.get("seconds_per_iter") for r in runs]
    return out


def median_iteration(recs, warmup=2):
    """Seconds of the median iteration after ``warmup`` in a train_log's records: robust to other
    jobs on the machine; what the grid reports and the simulator is checked against."""
    its = [r for r in recs if r.get("kind") == "iter"]
    return statistics.median(b["seconds"] - a["seconds"] for a, b in zip(its, its[1:]) if a["iter"] >= warmup)


def parse_run(out, batch, nodes, warmup=2):
    recs = [json.loads(line) for line in open(os.path.join(out, "train_log.jsonl"))]
    dist = next(r for r in recs if r.get("kind") == "dist")
    per_iter = median_iteration(recs, warmup)
    node0 = dist["nodes"]["0"]
    pos = dist["poseidon"]
    busy = node0["compute_s"] + node0["sync_s"]
    waited = node0["wait_s"] + pos["sfb_wait_s"]
    return {
        "cpu": cpu_breakdown(dist["nodes"], warmup),
        "seconds_per_iter": per_iter,
        "images_per_s": batch / per_iter,
        "bytes_per_iter": sum(l["measured_bytes"] for l in pos["layers"].values()),
        "wfbp_on": bool(dist.get("wfbp")),  # what --wfbp resolved to (auto: cost.wfbp_auto)
        "wait_share": waited / busy if busy > 0 else 0.0,
        "layers": pos["layers"],
        "timeline": pos["timeline"],
        # every node's threads (compute, send, recv, server) over the clocks it recorded
        "node_timelines": {
            r: {"t_origin": rep["t_origin"], "timeline": rep["timeline"]}
            for r, rep in dist["nodes"].items()
            if "timeline" in rep
        },
    }


def cpu_breakdown(nodes, warmup=2):
    """Where each node's CPU time went per iteration, from its marks at the start of every clock
    (after ``warmup`` clocks): the compute thread (forward + backward, pushes), the shard's
    updates, the SFB thread (rebuild + update), the rest of the process (transport threads:
    framing, sendmsg/recv_into, TCP in the kernel), and the system share of the whole."""
    out = {}
    for rank, rep in nodes.items():
        marks = [m for m in rep.get("cpu_marks", []) if m[0] >= warmup]
        if len(marks) < 2:
            continue
        (c0, t0, u0, k0, b0, *g0), (c1, t1, u1, k1, b1, *g1) = marks[0], marks[-1]
        n = c1 - c0
        row = {"period_s": (t1 - t0) / n, "user_s": (u1 - u0) / n, "sys_s": (k1 - k0) / n}
        if g0 and g1:  # (inside the threads' figures: whichever thread allocated ran the collection)
            row["gc_s"] = (g1[0] - g0[0]) / n
        threads = 0.0
        for kind, (wall, cpu) in b1.items():
            w0, c_0 = b0.get(kind, [0.0, 0.0])
            row[f"{kind}_wall_s"] = (wall - w0) / n
            row[f"{kind}_cpu_s"] = (cpu - c_0) / n
            threads += row[f"{kind}_cpu_s"]
        row["other_cpu_s"] = max(row["user_s"] + row["sys_s"] - threads, 0.0)
        out[rank] = row
    if out:
        period = out.get("0", next(iter(out.values())))["period_s"]
        total = sum(r["user_s"] + r["sys_s"] for r in out.values())
        out["machine"] = {"cpu_s": total, "cores": os.cpu_count(), "busy_share": total / (period * os.cpu_count())}
    return out


def cpu_table(results):
    """Per run: node-average CPU seconds per iteration by thread, and how busy the machine was."""
    lines = [
        f"{'net':<16} {'P':>2} {'link':>7} {'mode':<12} {'ms/iter':>8} {'compute':>8} {'shard':>7} {'sfb':>7} "
        f"{'other':>7} {'(sys)':>7} {'cores busy':>10}"
    ]
    for key in ordered(results):
        r = results[key]
        cpu = r.get("cpu")
        if not cpu or "machine" not in cpu:
            continue
        net, nodes, link, comm, wfbp = key.split("|")
        rows = [v for k, v in cpu.items() if k != "machine"]

        def mean(field, rows=rows):
            return 1e3 * sum(x.get(field, 0.0) for x in rows) / len(rows)

        lines.append(
            f"{net:<16} {nodes:>2} {link:>7} {label(comm, wfbp):<12} {1e3 * r['seconds_per_iter']:>8.1f} "
            f"{mean('compute_cpu_s'):>8.1f} {mean('server_cpu_s'):>7.1f} {mean('sfb_cpu_s'):>7.1f} "
            f"{mean('other_cpu_s'):>7.1f} {mean('sys_s'):>7.1f} {100 * cpu['machine']['busy_share']:>9.0f}%"
        )
    return "\n".join(lines)


# -- the simulator, calibrated from measurements of its own -----------------------------------------
def _median_time(fn, repeat=5, warmup=1):
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def node_solver(net_name, nodes, batch=None):
    """A Solver of one node's share: the net on synthetic data at the per-node batch of
    ``batch`` (default the net's) split over ``nodes``. -> (solver, global batch, per-node batch)."""
    from minicaffe import proto
    from minicaffe.parallel import with_synthetic_data
    from minicaffe.parallel.replica import shard_bounds
    from minicaffe.solvers import get_solver
    from minicaffe.tools.common import resolve_net, resolve_solver

    npar = with_synthetic_data(proto.parse_file(resolve_net(net_name, "train_test"), "NetParameter"), count=1024)
    data = next(lp for lp in npar.layer if lp.type == "Data")
    global_batch = batch or data.data_param.batch_size
    per_node = max(hi - lo for lo, hi in shard_bounds(global_batch, nodes))
    for lp in npar.layer:
        if lp.type == "Data":
            lp.data_param.batch_size = per_node
    sp = proto.parse_file(resolve_solver(net_name), "SolverParameter")
    sp.clear("net")
    sp.clear("test_iter")
    sp.net_param = npar
    sp.test_interval, sp.display, sp.snapshot, sp.snapshot_after_train = 0, 0, 0, False
    return get_solver(sp, log=lambda m: None), global_batch, per_node


def calibrate_net(net_name, nodes, batch=None, iters=10):
    """One node's share of the work, measured alone on one core (no other node running):
    per-layer forward/backward at the per-node batch (``python -m minicaffe.time``'s loop),
    the rest of a Solver iteration, each FC layer's weight-gradient GEMM, and the CPU part of
    each layer's sync on ``nodes`` nodes done as the runtime does it (PS: scale the gradient,
    sum P slices, update 1/P, copy the fresh slice; SFB: the tiled rebuild + update over P
    nodes' rows). -> a dict the simulator's layers are made from."""
    import numpy as np

    from minicaffe.dist import cost
    from minicaffe.dist.sfb import rebuild_sgd_step, tile_for
    from minicaffe.parallel.replica import shard_bounds
    from minicaffe.tools.timing import time_layers

    solver, global_batch, per_node = node_solver(net_name, nodes, batch)
    net = solver.net
    be = net.backend
    fwd, bwd, _ = time_layers(net, iters, warmup=3)
    t_step = _median_time(lambda: solver.step(1), repeat=iters, warmup=2)
    geo = {c.index: c for c in cost.plan(net, nodes, comm="hybrid")}
    layers = []
    for i, layer in enumerate(net.layers):
        f, b = statistics.median(fwd[i]), statistics.median(bwd[i])
        if i == 0 and layer.type == "Data":
            f *= nodes  # a node reads the global batch and keeps its slice
        row = {"name": layer.name, "forward": f, "backward": b, "count": 0}
        c = geo.get(i)
        if c is not None:
            blobs = [net.learnable_params[k] for k in c.params]
            row.update(count=c.count, blobs=len(blobs))
            w = np.ones(c.count, np.float32)
            g, h = np.ones_like(w), np.zeros_like(w)
            row["update"] = _median_time(lambda: be.sgd_step(w, g, h, 0.9, 0.01, 5e-4))

            def ps_part(blobs=blobs):  # Node.push's scaling, the shard's _reduce + update + copy
                for blob in blobs:
                    n = blob.count
                    lo, hi = shard_bounds(n, nodes)[0]
                    full = blob.flat_diff
                    full *= 1.0
                    parts = [np.ones(hi - lo, np.float32) for _ in range(nodes)]
                    d, ws, hs = (
                        np.empty(hi - lo, np.float32),
                        np.ones(hi - lo, np.float32),
                        np.zeros(hi - lo, np.float32),
                    )

                    def run(parts=parts, d=d, ws=ws, hs=hs, full=full, lo=lo, hi=hi, blob=blob):
                        full[...] *= 1.0
                        d[...] = parts[0]
                        for q in parts[1:]:
                            d += q
                        be.sgd_step(ws, d, hs, 0.9, 0.01, 5e-4)
                        blob.flat_data[lo:hi] = ws

                    yield run

            runs = list(ps_part())
            row["sync_cpu"] = {"ps": _median_time(lambda runs=runs: [r() for r in runs])}
            if c.sfb_ok:
                m, n, k = c.m, c.n, c.k
                row.update(m=m, n=n, k=k)
                x = np.asarray(net.bottom_vecs[i][0].data).reshape(k, n)
                dy = np.asarray(net.top_vecs[i][0].diff).reshape(k, m)
                dW = np.zeros((m, n), np.float32)
                row["wgrad"] = _median_time(lambda: be.gemm(True, False, 1.0, dy, x, 1.0, dW))
                U = np.ones((nodes * k, m), np.float32) * 1e-3
                V = np.ones((nodes * k, n), np.float32)
                W, H = np.ones(m * n, np.float32), np.zeros(m * n, np.float32)
                tile = tile_for(m, n, np.float32)
                bias = np.zeros(m, np.float32)

                def sfb_part():
                    rebuild_sgd_step(U, V, W, H, 0.9, 0.01, 5e-4, be.gemm, be.sgd_step, tile)
                    bias[...] = U.sum(axis=0)

                row["sync_cpu"]["sfb"] = _median_time(sfb_part, repeat=3)
                del W, H, dW
        layers.append(row)
    layer_s = sum(r["forward"] + r["backward"] for r in layers) - (nodes - 1) * layers[0]["forward"] / nodes
    update_s = sum(r.get("update", 0.0) for r in layers)
    # a node's compute thread zeroes the gradient its backward adds into (its PS layers' part;
    # the Solver does not clear it): seconds per parameter of zeroing the whole vector
    flat = np.ones(sum(r["count"] for r in layers), np.float32)
    zero = _median_time(lambda: flat.fill(0.0), repeat=iters) / max(flat.size, 1)
    # (the Solver's own rest, step - layers - update, is a difference of large timings: kept
    # for the record; the node process's rest is measured in training runs, iteration_cpu)
    return {"net": net_name, "nodes": nodes, "global_batch": global_batch, "per_node_batch": per_node,
            "layers": layers, "overhead": 0.0, "zero_s_per_param": zero,
            "step_rest_s": max(t_step - layer_s - update_s, 0.0), "step_s": t_step}  # fmt: skip


# iterations per contention run: as many as the grid's runs of the net have (the runs the
# simulator predicts): a node's threads pay per iteration what they pay in a run that long (the
# FC head's compute thread took 46.5-47.3 ms per iteration on 2 nodes in runs of 80 iterations,
# 48-56 in the grid's of 7)
NET_RUN_ITERS = {"lenet": 150, "cifar10_quick": 40, "alexnet_fc_head": 7}


# what each contention run keeps, per node per iteration: the compute thread's CPU, the SFB
# thread's and the shard's, all the node's CPU, and the period (mean; median iteration)
NET_RUN_FIGURES = ("compute_cpu_s", "sfb_cpu_s", "server_cpu_s", "cpu_s", "period_s", "period_median_s")


def calibrate_contention(doc, nets, nodes_list, repeat=3):
    """Each net's own contention, from training runs that are not validated: the net on P
    nodes on loopback with no link limit, the default plan (hybrid) without WFBP, ``repeat``
    runs; the compute thread's CPU per iteration is kept (``doc["net_runs"]``, a call's runs
    together, the last ``KEEP_CALLS`` calls), and ``net_contention`` divides it by the net's
    compute alone for the plan those runs had; ``net_sfb_contention`` and ``net_drift`` read the
    SFB thread's CPU and the periods. (LeNet's PS runs of ``calibrate_runs`` stand in for a net
    without runs of its own.)"""
    for net in nets:
        for nodes in nodes_list:
            if nodes < 2:
                continue
            iters = NET_RUN_ITERS.get(net, 30)
            runs = [node_cpu_from_run(nodes, iters, "off", 1024, net=net, comm="hybrid") for _ in range(repeat)]
            call = {k: [r[k] for r in runs] for k in NET_RUN_FIGURES}
            call |= {
                "iters": iters,
                "sfb": runs[0]["sfb"],
                "commit": code_commit(),
                "load": os.getloadavg(),
            }
            calls = doc.setdefault("net_runs", {}).setdefault(f"{net}|{nodes}", [])
            calls.append(call)
            del calls[:-KEEP_CALLS]
            c = doc["nets"].get(f"{net}|{nodes}")
            alone = compute_alone(c, set(call["sfb"])) if c else None
            ms = ", ".join(f"{1e3 * x:.1f}" for x in call["compute_cpu_s"])
            line = f"{net} on {nodes} nodes (SFB: {','.join(call['sfb']) or '-'}, {iters} iterations): "
            line += f"the compute thread's CPU {ms} ms per iteration"
            if alone:
                line += f", alone {1e3 * alone:.1f}: x{statistics.median(call['compute_cpu_s']) / alone:.3f}"
            if c and call["sfb"]:
                ms = ", ".join(f"{1e3 * x:.1f}" for x in call["sfb_cpu_s"])
                sfb = sfb_alone(doc, c, call["sfb"])
                line += (
                    f"; the SFB thread's {ms}, alone {1e3 * sfb:.1f}: x{statistics.median(call['sfb_cpu_s']) / sfb:.3f}"
                )
            idle = [p - nodes * x / doc["cores"] for p, x in zip(call["period_median_s"], call["cpu_s"])]
            line += f"; out of step {', '.join(f'{1e3 * x:.1f}' for x in idle)} ms"
            print(line, flush=True)


def compute_alone(c, sfb=()):
    """What a node's compute thread does per iteration, timed alone (a calibrated net ``c``):
    forward and backward, less the weight gradient of the layers in ``sfb`` (rebuilt from the
    factors instead), and the zeroing of the other layers' gradients."""
    zero = c.get("zero_s_per_param", 0.0)
    out = c["overhead"]
    for r in c["layers"]:
        out += r["forward"] + r["backward"]
        if r["name"] in sfb:
            out -= r.get("wgrad") if r.get("wgrad") is not None else r["backward"] / 2
        else:
            out += zero * r["count"]
    return out


def runs_contention(calib):
    """{nodes: factor}: LeNet's compute thread's CPU per iteration in the calibration's training
    runs (medians over the calls kept) over LeNet's compute alone in the calibration's own
    per-layer timings (``calib["nets"]``): the model's LeNet computes what the runs' did. The
    runs' compute, not each call's ratio, is what is kept: a call's timing alone moves 5% from
    another call's, and the model multiplies the factor by the nets' timings, not by the call's.
    It may be below 1: the step alone includes the Solver's rest (clearing the diffs), which a
    node's compute thread does not do (the process's rest is ``iteration_cpu``)."""
    calls = calib.get("run_calls") or []
    out = {}
    for p, x in run_costs_of(calib)["contention"].items():
        runs = [
            c["contention_measured"][p] * c["compute_alone_s"][p]
            for c in calls
            if p in c.get("contention_measured", {}) and p in c.get("compute_alone_s", {})
        ]
        lenet = calib.get("nets", {}).get(f"lenet|{p}")
        out[int(p)] = statistics.median(runs) / net_alone(lenet) if runs and lenet else x
    return out


def net_contention(calib, net):
    """{nodes: factor} the simulator slows ``net``'s kernels by on ``nodes`` nodes sharing this
    machine: the net's own training runs' compute over its compute alone (``calibrate_contention``,
    the median over its calls' runs), where measured; else LeNet's (``runs_contention``)."""
    out = runs_contention(calib)
    for key, calls in calib.get("net_runs", {}).items():
        name, p = key.split("|")
        c = calib.get("nets", {}).get(key)
        if name != net or c is None or not calls:
            continue
        ratios = [x / compute_alone(c, set(call["sfb"])) for call in calls for x in call["compute_cpu_s"]]
        out[int(p)] = statistics.median(ratios)
    return out


def sfb_alone(calib, c, sfb):
    """What a node's SFB thread does per iteration, timed alone or from LeNet's runs: the rebuild
    + update of each layer in ``sfb`` (``sfb_sync_cpu``), a sync unit's handling per layer and the
    thread's own per iteration (``run_costs_of``)."""
    if not sfb:
        return 0.0
    rebuild = sfb_sync_cpu(calib, c["net"], c.get("global_batch"))
    k = run_costs_of(calib)
    return sum(rebuild.get(name, 0.0) for name in sfb) + len(sfb) * k["unit_cpu_s"] + k.get("thread_cpu_s", 0.0)


def net_sfb_contention(calib, net):
    """{nodes: factor} the simulator slows ``net``'s SFB rebuilds by on ``nodes`` nodes: the SFB
    thread's CPU per iteration in the net's own training runs (``calibrate_contention``, runs
    that kept it) over what the model charges that thread alone (``sfb_alone``). Every node
    rebuilds at the same moment, a kernel that streams 2 x 4 bytes per parameter: it shares the
    memory, not only the cores, so the compute thread's factor need not be its factor. {} where
    no run measured it (the compute thread's factor applies)."""
    out = {}
    for key, calls in calib.get("net_runs", {}).items():
        name, p = key.split("|")
        c = calib.get("nets", {}).get(key)
        if name != net or c is None:
            continue
        ratios = [
            x / sfb_alone(calib, c, call["sfb"])
            for call in calls
            if call.get("sfb") and "sfb_cpu_s" in call
            for x in call["sfb_cpu_s"]
        ]
        if ratios:
            out[int(p)] = statistics.median(ratios)
    return out


def net_drift(calib, net):
    """{nodes: seconds per iteration out of step at BSP's barrier} for ``net``: from the net's own
    training runs (``calibrate_contention``; the median iteration less the nodes' CPU over the
    cores, as ``run_drift``), where they kept both; else LeNet's PS runs' (``run_costs_of``).
    It is not one figure for every net: the scheduler's turns on shared cores are longer when a
    node's threads each run 50-100 ms at a time (the FC head) than in LeNet's 12 ms iterations."""
    out = {int(p): x for p, x in run_costs_of(calib).get("drift_s", {}).items()}
    cores = calib.get("cores") or os.cpu_count()
    for key, calls in calib.get("net_runs", {}).items():
        name, p = key.split("|")
        if name != net:
            continue
        idle = [
            max(period - int(p) * cpu / cores, 0.0)
            for call in calls
            if "period_median_s" in call
            for period, cpu in zip(call["period_median_s"], call["cpu_s"])
        ]
        if idle:
            out[int(p)] = statistics.median(idle)
    return out


def free_port_pair():
    """A port p with p + 1 free too (linkcheck's raw socket listens on the rendezvous port + 1)."""
    import socket

    for _ in range(100):
        a = socket.socket()
        a.bind(("127.0.0.1", 0))
        p = a.getsockname()[1]
        b = socket.socket()
        try:
            b.bind(("127.0.0.1", p + 1))
            return p
        except OSError:
            continue
        finally:
            a.close()
            b.close()
    raise SystemExit("no two consecutive free ports on loopback")


def tcp_cpu_per_byte(use_ns, mb=32):
    """CPU seconds per byte moved, both ends (``python -m minicaffe.dist.linkcheck``): through the
    emulated cluster's veth + bridge + tc where namespaces exist, else loopback."""
    env = dict(os.environ, PYTHONPATH=ROOT, MINICAFFE_DIST_SECRET="calibrate")
    check = [sys.executable, "-m", "minicaffe.dist.linkcheck", "--mb", str(mb), "--rounds", "5"]
    if use_ns:
        cmd = [sys.executable, "-m", "minicaffe.dist.emulate", "--nodes", "2", "--bandwidth", "10gbit", "--", *check]
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
        return json.loads(r.stdout.strip().splitlines()[-1])
    e = dict(env, MINICAFFE_WORLD_SIZE="2", MINICAFFE_RENDEZVOUS=f"127.0.0.1:{free_port_pair()}")
    p1 = subprocess.Popen(check, env=dict(e, MINICAFFE_RANK="1"), cwd=ROOT)
    r = subprocess.run(check, env=dict(e, MINICAFFE_RANK="0"), capture_output=True, text=True, timeout=300, cwd=ROOT)
    p1.wait(60)
    return json.loads(r.stdout.strip().splitlines()[-1])


def node_cpu_from_run(nodes, iters, wfbp, bucket_kb, link=None, net="lenet", comm="ps"):
    """Per node per iteration, from one run that is not part of the validation (``net``, ``comm``
    (plain PS by default), ``nodes`` nodes on loopback, no link limit or the transport's limiter
    at ``link``): the transport threads' and the rest of the process's CPU ("other"), the
    compute thread's, the shard's server thread's, all CPU, bytes, and the layers it
    synchronized by SFB."""
    with tempfile.TemporaryDirectory(prefix="poseidon-calibrate-") as work:
        solver, _ = synthetic_solver(net, work, iters)
        out = os.path.join(work, "run")
        cmd = [sys.executable, "-m", "minicaffe.train", solver, "--iters", str(iters), "--test-interval", "0"]
        cmd += ["--no-plot", "--output", out, "--force", "--comm", comm, "--wfbp", wfbp, "--nodes", str(nodes)]
        cmd += ["--bucket-kb", f"{bucket_kb:g}", "--peer-timeout", "120", "--connect-timeout", "300"]
        if link:
            cmd += ["--link", link, "--link-delay", DELAY]
        r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT), cwd=work)
        if r.returncode != 0:
            raise SystemExit(f"calibration run failed:\n{(r.stdout + r.stderr)[-2000:]}")
        recs = [json.loads(line) for line in open(os.path.join(out, "train_log.jsonl"))]
        dist = next(x for x in recs if x.get("kind") == "dist")
    means = node_means(
        cpu_breakdown(dist["nodes"]), statistics.mean(v["bytes_per_iter"] for v in dist["nodes"].values())
    )
    sfb = sorted(n for n, u in dist["poseidon"]["layers"].items() if u.get("method") == "sfb")
    return means | {"sfb": sfb, "period_median_s": median_iteration(recs)}


def node_means(cpu, nbytes):
    """The mean node's CPU seconds per iteration by thread (a ``cpu_breakdown``), and its bytes."""
    rows = [v for k, v in cpu.items() if k != "machine"]
    return {
        "transport_cpu_s": statistics.mean(v["other_cpu_s"] for v in rows),
        "compute_cpu_s": statistics.mean(v["compute_cpu_s"] for v in rows),
        "server_cpu_s": statistics.mean(v.get("server_cpu_s", 0.0) for v in rows),
        "sfb_cpu_s": statistics.mean(v.get("sfb_cpu_s", 0.0) for v in rows),
        "cpu_s": statistics.mean(v["user_s"] + v["sys_s"] for v in rows),
        "bytes": nbytes,
        "period_s": statistics.mean(v["period_s"] for v in rows),
    }


def run_costs(tcp_byte, alone, kernel, iters=150, repeat=3):
    """The CPU costs the simulator takes from training runs, none of them a validated run: LeNet,
    plain PS, on loopback, no link limit, ``repeat`` times each, round robin; medians. Runs (per
    node per iteration): ``off``, 4 nodes, every layer its own bucket (``--bucket-kb`` of one
    byte: 4 units of 4 (P-1) frames); ``on``, the same with WFBP; ``one``, 4 nodes, one bucket
    for the whole net (1 unit, 12 frames); ``limiter``, ``off`` under the transport's limiter at
    a rate no validated run uses; ``two``, ``off`` on 2 nodes (each process has a core).

    - a frame (both ends) and the rest of the process's fixed CPU per iteration (the main
      thread's loop, log and waits, the transport threads' idle wake-ups): "other" CPU - bytes'
      cost = fixed + frames / 2 x frame, solved from ``off`` (48 frames) and ``one`` (12);
    - the CPU of the thread that serves the syncs beyond its kernels (the shard's server thread;
      the SFB thread does the same per SFB layer): server CPU - the shard's kernels timed alone
      (``kernel``) = per iteration + units x per unit (waking the thread, its handler, the
      locks), solved from ``off`` (4 units) and ``one`` (1);
    - a WFBP sync: (all CPU with WFBP - all CPU without) / units, the switches between the
      node's threads that interleaving the syncs with the backward costs on shared cores;
    - the transport's limiter (``--link``, the runs' latency): (transport CPU with it - without)
      / frames sent: a lock, a sleep and its wake-up per frame and per 256 KiB piece in every sender;
    - contention at 2 and 4 nodes: the compute thread's CPU per iteration in ``two`` and
      ``off`` over ``alone[P]``, the same forward and backward (and the rest of a Solver step)
      timed alone at that node count's batch: other processes and the node's own helper
      threads share the cores and their caches, even where each process has a core."""
    runs = {"off": [], "on": [], "one": [], "limiter": [], "two": []}
    for _ in range(repeat):
        for w in ("off", "on"):
            runs[w].append(node_cpu_from_run(4, iters, w, 0.001))
        runs["one"].append(node_cpu_from_run(4, iters, "off", 1e6))
        runs["limiter"].append(node_cpu_from_run(4, iters, "off", 0.001, link=LIMITER_CALIBRATION))
        runs["two"].append(node_cpu_from_run(2, iters, "off", 0.001))
    med = {w: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for w, rs in runs.items()}
    out = {"run": f"lenet, --comm ps, on loopback, no link limit, {iters} iterations", **med, "tries": runs}
    return out | solve_run_costs(med, tcp_byte, alone, kernel)


def solve_run_costs(med, tcp_byte, alone, kernel, units=4, nodes=4, cores=None):
    """``run_costs``'s arithmetic: the costs from the runs' medians per node per iteration
    (``med``: {run: node_means}), the loopback's CPU per byte, LeNet's compute alone per node
    count and the shard's kernels alone (4 nodes)."""
    off, on, one, lim, two = (med[w] for w in ("off", "on", "one", "limiter", "two"))
    frames, one_frames = 4 * (nodes - 1) * units, 4 * (nodes - 1)
    rest = {w: med[w]["transport_cpu_s"] - med[w]["bytes"] / 2 * tcp_byte for w in ("off", "one")}
    frame = max(2 * (rest["off"] - rest["one"]) / (frames - one_frames), 0.0)
    unit = max((off["server_cpu_s"] - one["server_cpu_s"]) / (units - 1), 0.0)
    raw = {"2": two["compute_cpu_s"] / alone[2], "4": off["compute_cpu_s"] / alone[4]}
    return {
        "drift_s": run_drift(med, cores),
        "frames_per_iter": frames,
        "units_per_iter": units,
        "cpu_s_per_frame": frame,
        "iteration_cpu_s": max(rest["one"] - one_frames / 2 * frame, 0.0),
        "unit_cpu_s": unit,
        "thread_cpu_s": max(one["server_cpu_s"] - kernel - unit, 0.0),
        "shard_kernel_s": kernel,
        "wfbp_cpu_s_per_sync": max((on["cpu_s"] - off["cpu_s"]) / units, 0.0),
        "compute_alone_s": alone,
        "contention_measured": raw,  # below 1: the run's compute was faster than alone (noise)
        "contention": {p: max(x, 1.0) for p, x in raw.items()},
        "limiter_link": LIMITER_CALIBRATION,
        "limiter_cpu_s_per_frame": max((lim["transport_cpu_s"] - off["transport_cpu_s"]) / (frames / 2), 0.0),
    }


def run_drift(med, cores=None):
    """{nodes: seconds per iteration the cores sat idle at BSP's barrier} from the training
    runs' medians (``run_costs``): where nothing but the other nodes is waited for (no link
    limit), the period (``period_of``: the median iteration, as the grid's) beyond the nodes' CPU
    spread over the cores, P x CPU / cores. Runs ``two`` (2 nodes) and ``off`` (4)."""
    cores = cores or os.cpu_count()
    return {str(p): max(period_of(med[w]) - p * med[w]["cpu_s"] / cores, 0.0) for p, w in ((2, "two"), (4, "off"))}


def period_of(run):
    """A run's seconds per iteration as the grid reports it: the median iteration (the mean of
    the CPU marks' clocks for runs from before it was kept; a few slow iterations lift the mean
    0.5-1.3 ms above the median in LeNet's runs of 12-15 ms)."""
    return run.get("period_median_s", run["period_s"])


COSTS = ("cpu_s_per_byte", "cpu_s_per_frame", "round_trip_s")
LIMITER_CALIBRATION = "5gbit"  # the limiter's calibration runs: a rate the validated runs do not use
# the costs from training runs the simulator reads; each call of --calibrate-runs adds one set,
# and the simulator takes each cost's median over the calls kept (the spread is printed)
RUN_COSTS = (
    "cpu_s_per_frame",
    "iteration_cpu_s",
    "unit_cpu_s",
    "thread_cpu_s",
    "wfbp_cpu_s_per_sync",
    "limiter_cpu_s_per_frame",
)
KEEP_CALLS = 5


def net_alone(c):
    """A calibrated net's forward + backward and what a PS node adds to them (zeroing its
    gradient; a calibration from before nodes stopped clearing with the Solver: the rest of a
    Solver step), timed alone."""
    zero = c.get("zero_s_per_param", 0.0) * sum(r["count"] for r in c["layers"])
    return sum(r["forward"] + r["backward"] for r in c["layers"]) + c["overhead"] + zero


def calibrate_runs(doc):
    """The CPU costs from training runs (``run_costs``) into a calibration document; the call's
    figures join the earlier calls' (``doc["run_calls"]``, the last ``KEEP_CALLS``)."""
    from minicaffe.parallel import blas

    blas.set_threads(1)  # as each node of 2 or 4 on this machine's 2 cores (launch.blas_threads)
    # LeNet's compute alone, timed again in this call (the runs' compute is measured against it)
    lenet = {p: calibrate_net("lenet", p) for p in (2, 4)}
    alone = {p: net_alone(c) for p, c in lenet.items()}
    kernel = sum(r.get("sync_cpu", {}).get("ps", 0.0) for r in lenet[4]["layers"])
    run = run_costs(doc["tcp_loopback"]["cpu_s_per_byte"], alone, kernel)
    run["load"] = os.getloadavg()
    doc["frame_run"] = run
    calls = doc.setdefault("run_calls", [])
    keep = RUN_COSTS + ("contention", "contention_measured", "compute_alone_s", "drift_s", "load")
    calls.append({k: run[k] for k in keep} | {"commit": code_commit()})
    del calls[:-KEEP_CALLS]
    print(
        f"in training runs (medians of 3; {run['run']}): a frame {1e6 * run['cpu_s_per_frame']:.0f} us of CPU, "
        f"both ends; the rest of the process {1e3 * run['iteration_cpu_s']:.2f} ms per iteration; the serving "
        f"thread beyond the shard's kernels ({1e6 * kernel:.0f} us alone) {1e6 * run['thread_cpu_s']:.0f} us per "
        f"iteration + {1e6 * run['unit_cpu_s']:.0f} us per sync unit; "
        f"one WFBP sync {1e6 * run['wfbp_cpu_s_per_sync']:.0f} us (all CPU per node per iteration "
        f"{1e3 * run['off']['cpu_s']:.2f} ms without WFBP, {1e3 * run['on']['cpu_s']:.2f} ms with); contention "
        f"x{run['contention']['2']:.3f} on 2 nodes, x{run['contention']['4']:.3f} on 4; the limiter at "
        f"{run['limiter_link']}: {1e6 * run['limiter_cpu_s_per_frame']:.0f} us per frame sent",
        flush=True,
    )
    print(run_cost_spread(doc))


def run_cost_spread(doc):
    """Each cost from training runs: the median over the calls kept, and their range."""
    calls = doc.get("run_calls", [])
    lines = [f"the calls kept ({len(calls)}): median [min - max]"]
    for k, v in run_costs_of(doc).items():
        if k == "contention":
            for p, x in v.items():
                xs = [c["contention"][p] for c in calls if p in c.get("contention", {})]
                lines.append(f"  contention on {p} nodes: x{x:.3f} [{min(xs):.3f} - {max(xs):.3f}]")
            continue
        if k == "drift_s":
            for p, x in v.items():
                xs = [c["drift_s"][p] for c in calls if p in c.get("drift_s", {})] or [x]
                lines.append(
                    f"  out of step on {p} nodes: {1e6 * x:.0f} us [{1e6 * min(xs):.0f} - {1e6 * max(xs):.0f}]"
                )
            continue
        xs = [c.get(k, 0.0) for c in calls]
        lines.append(f"  {k}: {1e6 * v:.0f} us [{1e6 * min(xs):.0f} - {1e6 * max(xs):.0f}]")
    return "\n".join(lines)


def run_costs_of(doc):
    """The costs from training runs the simulator uses: medians over the calls kept (the
    latest call alone for a document from before calls were kept)."""
    calls = doc.get("run_calls")
    fr = doc.get("frame_run", {})
    if not calls:
        out = {k: fr.get(k, 0.0) for k in RUN_COSTS}
        c = fr.get("contention", 1.0)
        out["contention"] = c if isinstance(c, dict) else {"4": c}
        return out
    out = {k: statistics.median(c.get(k, 0.0) for c in calls) for k in RUN_COSTS}
    nodes = sorted({p for c in calls for p in c["contention"]}, key=int)
    out["contention"] = {p: statistics.median(c["contention"][p] for c in calls if p in c["contention"]) for p in nodes}
    drifts = [c["drift_s"] for c in calls if "drift_s" in c]
    if not drifts and all(w in fr for w in ("two", "off")):  # (calls from before it was kept: the latest's runs)
        drifts = [run_drift(fr, doc.get("cores"))]
    out["drift_s"] = {p: statistics.median(d[p] for d in drifts) for p in drifts[0]} if drifts else {}
    return out


BYTE_CALIBRATION = ("alexnet_fc_head", 4, "20gbit")  # a rate the validated runs do not use


def calibrate_bytes(doc, repeat=3, iters=8):
    """The transport's CPU per byte as the runs pay it: the FC head under plain PS (700 MB per node
    per iteration, sent + received, in 1 MiB buckets) on 4 nodes through the emulated cluster at
    20 Gbit/s, a rate no validated run uses (the loopback where namespaces are not allowed),
    ``repeat`` runs: 2 x ("other" CPU - the rest of the process's fixed CPU - frames / 2 x a
    frame's) / bytes, medians over the runs. (linkcheck's one stream of 32 MiB frames from one
    process to another, alone on the machine, is not what a node's senders and receivers pay
    with every process busy.)"""
    net, nodes, link = BYTE_CALIBRATION
    use_ns = namespaces_ok() is None
    costs = run_costs_of(doc)
    tries = []
    with tempfile.TemporaryDirectory(prefix="poseidon-calibrate-") as work:
        for _ in range(repeat):
            r = run_one(net, nodes, link, "ps", "off", iters, work, use_ns, 900)
            if "error" in r:
                raise SystemExit(f"calibration run failed:\n{r['error']}")
            m = node_means(r["cpu"], r["bytes_per_iter"])
            frames = 4 * (nodes - 1) * len(r["layers"])
            rest = m["transport_cpu_s"] - costs["iteration_cpu_s"] - frames / 2 * costs["cpu_s_per_frame"]
            m["cpu_s_per_byte"] = max(2 * rest / m["bytes"], 0.0)
            tries.append(m)
            print(f"  {net} PS on {nodes} nodes at {link}: {1e9 * m['cpu_s_per_byte']:.3f} ns per byte", flush=True)
    doc["byte_run"] = {
        "run": f"{net}, --comm ps, {nodes} nodes, {'namespaces + tc' if use_ns else 'loopback'} at {link}, "
        f"{iters} iterations",
        "path": "veth + bridge + tc" if use_ns else "loopback",
        "tries": tries,
        "cpu_s_per_byte": statistics.median(t["cpu_s_per_byte"] for t in tries),
        "load": os.getloadavg(),
        "commit": code_commit(),
    }
    return doc["byte_run"]


def calibrate(nets, nodes_list, batch, out, repeat=3):
    """Everything the simulator needs, measured alone (no node run in between): ``--calibrate``."""
    from minicaffe.parallel import blas

    blas.set_threads(1)  # as each node of 2 or 4 on this machine's 2 cores (launch.blas_threads)
    use_ns = namespaces_ok() is None
    doc = {"cores": os.cpu_count(), "load_before": os.getloadavg(), "nets": {}}
    for key, ns in (("tcp", use_ns), ("tcp_loopback", False)):  # the namespaces' path; the limiter's
        tries = [tcp_cpu_per_byte(ns) for _ in range(repeat)]  # these move 20-30% run to run: medians
        link = {k: statistics.median(t[k] for t in tries) for k in COSTS}
        doc[key] = {"path": "veth + bridge + tc" if ns else "loopback", **link}
        doc[key]["tries"] = [{k: t[k] for k in COSTS} for t in tries]
        print(
            f"transport CPU: {1e9 * link['cpu_s_per_byte']:.2f} ns per byte, {1e6 * link['cpu_s_per_frame']:.1f} us "
            f"per frame, both ends; round trip {1e6 * link['round_trip_s']:.0f} us ({doc[key]['path']})",
            flush=True,
        )
    calibrate_nets(doc, nets, nodes_list, batch)
    for step in (calibrate_runs, calibrate_bytes):
        with open(out, "w") as f:  # what is measured so far, should a step fail
            json.dump(doc, f, indent=1)
        step(doc)
    doc["load_after"] = os.getloadavg()
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    return doc


def code_commit():
    """The commit of the code a calibration or a run measures: git's short hash, with a '+' where
    tracked code (minicaffe/, benchmarks/*.py) has changes not committed (the results and
    calibration files a benchmark writes do not count); None outside a git checkout."""
    try:
        git = ["git", "-C", ROOT]
        head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=30)
        code = ["--", "minicaffe", "benchmarks/*.py"]
        dirty = subprocess.run(
            [*git, "status", "--porcelain", "--untracked-files=no", *code], capture_output=True, text=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+" if dirty.stdout.strip() else "")


def calibration_code(calib):
    """Every commit a calibration's figures were measured with (its nets' calls, its training
    runs' calls, its byte runs): a grid is checked like for like only against its own code."""
    found = {c.get("commit") for calls in calib.get("net_calls", {}).values() for c in calls}
    found |= {c.get("commit") for c in calib.get("run_calls", [])}
    found.add(calib.get("byte_run", {}).get("commit"))
    return sorted(c for c in found if c)


def calibration_commit(calib, git):
    """The commit of the code a calibration measured, to match runs to it: its calls' commit
    (a '+' for changes not committed dropped), the oldest where they name several (later calls
    of a calibration may come from a checkout with changes of its own, to the benchmark, that
    the runs' code never had), or ``code_commit`` for a calibration made before its calls
    recorded theirs."""
    found = sorted({c.rstrip("+") for c in calibration_code(calib)}) or [calib.get("code_commit")]
    found = [c for c in found if c and git.known(c)]
    oldest = [c for c in found if not any(o != c and git.is_ancestor(o, c) for o in found)]
    return oldest[0] if oldest else None


class Git:
    """The questions the like-for-like validation asks git about this checkout (tests give a
    stand-in of their own)."""

    def __init__(self, root=ROOT):
        self.root = root

    def _run(self, *args):
        try:
            return subprocess.run(["git", "-C", self.root, *args], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError):
            return None

    def known(self, commit):
        r = self._run("cat-file", "-e", f"{commit}^{{commit}}")
        return r is not None and r.returncode == 0

    def is_ancestor(self, a, b):
        """Is commit ``a`` in ``b``'s history (or ``b`` itself)?"""
        r = self._run("merge-base", "--is-ancestor", a, b)
        return r is not None and r.returncode == 0

    def distance(self, a, b):
        """Commits in ``b``'s history that are not in ``a``'s."""
        r = self._run("rev-list", "--count", f"{a}..{b}")
        return int(r.stdout) if r is not None and r.returncode == 0 else 1 << 30

    def head(self):
        r = self._run("rev-parse", "--short", "HEAD")
        return r.stdout.strip() if r is not None and r.returncode == 0 else None

    def history(self, path):
        """The commits that changed ``path``, newest first, each with the file's results then."""
        rel = os.path.relpath(os.path.abspath(path), self.root)
        r = self._run("log", "--format=%h", "--", rel)
        if r is None or r.returncode != 0:
            return []
        out = []
        for commit in r.stdout.split():
            shown = self._run("show", f"{commit}:{rel}")
            if shown is None or shown.returncode != 0:
                break  # (the file was renamed or removed there)
            out.append((commit, json.loads(shown.stdout).get("results", {})))
        return out


def landed_at(results, history):
    """{key: the commit that landed the run's measurement} from the results file's history
    (``Git.history``: newest first): the oldest commit from which on the file holds the same
    figure; None for a run not committed as it is now."""
    out = {}
    for key, r in results.items():
        out[key] = None
        for commit, then in history:
            if then.get(key, {}).get("seconds_per_iter") != r.get("seconds_per_iter"):
                break
            out[key] = commit
    return out


def own_calibrations(results, calibrations, git, history=()):
    """Each run's calibration of its own code: {key: (calibration path or None, code commit)}.

    A run's code is its ``code_commit`` (recorded by the runs of the grid from when it was
    added), else the commit that landed its measurement in the results file (``landed_at``;
    the code that measured it is in that commit's history), else the checkout's HEAD. Its
    calibration is, of those (``calibrations``: {path: document}) whose code is in the run's
    code's history, the one with the fewest commits between the two: the latest calibration of
    code the run's code contains. None where no calibration is that old."""
    commits = {path: calibration_commit(doc, git) for path, doc in calibrations.items()}
    landed = landed_at(results, history)
    out = {}
    for key, r in results.items():
        code = (r.get("code_commit") or "").rstrip("+")
        if not (code and git.known(code)):
            code = landed.get(key) or git.head()
        found = [(git.distance(c, code), path) for path, c in commits.items() if c and git.is_ancestor(c, code)]
        out[key] = (min(found)[1] if found else None, code)
    return out


def calibrate_nets(doc, nets, nodes_list, batch=None):
    """Each net's layers on each node count (``calibrate_net``), alone on the machine; every call
    is kept (``doc["net_calls"]``, the last ``KEEP_CALLS``) and ``doc["nets"]`` holds each
    figure's median over them (``median_net``): one timing of a layer moves 5-10% from call to call."""
    from minicaffe.parallel import blas

    blas.set_threads(1)  # as each node of 2 or 4 on this machine's 2 cores (launch.blas_threads)
    for net in nets:
        for nodes in nodes_list:
            key = f"{net}|{nodes}"
            calls = doc.setdefault("net_calls", {}).setdefault(key, [])
            calls.append(calibrate_net(net, nodes, batch) | {"commit": code_commit()})
            del calls[:-KEEP_CALLS]
            doc["nets"][key] = c = median_net(calls)
            steps = [x["step_s"] for x in calls]
            print(
                f"{net} on {nodes} nodes: {c['per_node_batch']} per node, layers "
                f"{1e3 * sum(r['forward'] + r['backward'] for r in c['layers']):.1f} ms, step {1e3 * c['step_s']:.1f} ms "
                f"(median of {len(calls)} call(s): {min(steps) * 1e3:.1f}-{max(steps) * 1e3:.1f} ms)",
                flush=True,
            )


def median_net(calls):
    """One calibrated net from several calls: every number its median over the calls."""

    def med(values):
        values = list(values)
        if isinstance(values[0], dict):
            return {k: med(v[k] for v in values) for k in values[0]}
        if all(v == values[0] for v in values) or not isinstance(values[0], (int, float)):
            return values[0]  # (shapes, names: the same in every call)
        return statistics.median(values)

    out = {k: med(c[k] for c in calls) for k in calls[0] if k not in ("layers", "commit")}
    out["layers"] = [med(layer) for layer in zip(*(c["layers"] for c in calls))]
    out["commits"] = sorted({c["commit"] for c in calls if c.get("commit")})
    return out


def sfb_sync_cpu(calib, net, global_batch):
    """Each SFB layer's rebuild + update CPU: the median over every call kept at every node count
    of the same global batch. The work depends only on the whole batch's rows (P x K: 32 for the
    FC head on 2 nodes of 16 or 4 of 8) and the layer's shape, not on P, so every timing of it
    is a sample of the same figure (one call moves 20%: the FC head's fc6 46-67 ms)."""
    samples = {}
    for key, calls in calib.get("net_calls", {}).items():
        if key.split("|")[0] != net:
            continue
        for call in calls:
            if call.get("global_batch") != global_batch:
                continue
            for r in call["layers"]:
                s = (r.get("sync_cpu") or {}).get("sfb")
                if s is not None:
                    samples.setdefault(r["name"], []).append(s)
    return {name: statistics.median(xs) for name, xs in samples.items()}


def outside_per_byte(calib):
    """CPU seconds per byte a node moves that the machine spends outside the node processes'
    clocks, from the calibration's byte runs (``calibrate_bytes``: the FC head, plain PS, 4 nodes
    at 20 Gbit/s, never a validated run): per try, the cores x the period less the nodes' CPU
    (both from the same marks), over the nodes' bytes; the median. benchmarks/poseidon_machine.py
    shows what it is: the machine busy, not idle (softirq network work, not a node's thread).
    0 where the calibration has no byte runs, or runs from before the period was kept."""
    br = calib.get("byte_run") or {}
    if br.get("path") != "veth + bridge + tc":
        return 0.0
    nodes, cores = BYTE_CALIBRATION[1], calib.get("cores") or os.cpu_count()
    xs = [
        max(cores * t["period_s"] - nodes * t["cpu_s"], 0.0) / (nodes * t["bytes"])
        for t in br.get("tries", [])
        if t.get("period_s") and t.get("bytes")
    ]
    return statistics.median(xs) if xs else 0.0


def predicted(calib, net, nodes, link, comm, wfbp, topology, latency, bucket_kb=0, sfb=None):
    """The simulator's result (a ``simulate.Result``) for one run, from the calibration alone.
    ``sfb``: the layers the run synchronized by SFB (None: the simulator chooses as the runtime
    does now, ``cost.choose`` with the runtime's host costs over this link)."""
    from minicaffe.dist import cost
    from minicaffe.dist import simulate as sim

    c = calib["nets"].get(f"{net}|{nodes}")
    if c is None:
        return None
    layers = [sim.Layer("(iteration overhead)", c["overhead"], 0.0)]
    rebuild = sfb_sync_cpu(calib, net, c.get("global_batch"))
    for r in c["layers"]:
        lay = sim.Layer(r["name"], r["forward"], r["backward"], r["count"], r.get("m"), r.get("n"), r.get("k"))
        lay.update, lay.wgrad, lay.sync_cpu = r.get("update", 0.0), r.get("wgrad"), dict(r.get("sync_cpu") or {})
        if r["name"] in rebuild:
            lay.sync_cpu["sfb"] = rebuild[r["name"]]
        lay.blobs = r.get("blobs", 2)
        lay.zero = r["count"] * c.get("zero_s_per_param", 0.0)
        layers.append(lay)
    tcp = calib["tcp_loopback" if topology == "mesh" else "tcp"]  # the limiter runs on loopback
    per_byte = tcp["cpu_s_per_byte"]
    if topology == "star" and "byte_run" in calib:  # as a training run through the namespaces pays it
        per_byte = calib["byte_run"]["cpu_s_per_byte"]
    if "frame_run" in calib:
        k = run_costs_of(calib)
        host = sim.Host(
            calib["cores"],
            per_byte,
            k["cpu_s_per_frame"],
            k["wfbp_cpu_s_per_sync"],
            net_contention(calib, net),
            k["limiter_cpu_s_per_frame"] if topology == "mesh" else 0.0,
            unit_cpu=k["unit_cpu_s"],
            iteration_cpu=k["iteration_cpu_s"],
            thread_cpu=k.get("thread_cpu_s", 0.0),
            drift=net_drift(calib, net),
            sfb_contention=net_sfb_contention(calib, net) or None,
            # (the namespaces' kernel path; the limiter's runs on loopback are not measured)
            outside_cpu_per_byte=outside_per_byte(calib) if topology == "star" else 0.0,
        )
    else:
        host = sim.Host(calib["cores"], per_byte, tcp["cpu_s_per_frame"])
    from minicaffe.dist.emulate import tbf_burst
    from minicaffe.dist.transport import TokenBucket

    rate = sim.parse_rate(link)
    # the shapers' buckets: tc tbf on each node's link (star), or the transport's per peer (mesh)
    burst = tbf_burst(rate) if topology == "star" else (nodes - 1) * TokenBucket.default_burst(rate)
    # a message's latency: the wire's (none where tc has no netem) + half linkcheck's round trip
    # of a small request through both nodes' threads
    lat = sim.parse_seconds(latency) + tcp.get("round_trip_s", 0.0) / 2
    ln = sim.Link(rate, lat, topology=topology, burst=burst)
    bucket = int(bucket_kb * 1024)
    return sim.simulate(
        layers, nodes, ln, comm, wfbp == "on", host=host, bucket_bytes=bucket, rule_host=cost.DEFAULT_HOST, sfb=sfb
    )


def run_sfb_layers(r):
    """The layers a recorded run synchronized by SFB (its per-unit report), or None."""
    units = r.get("layers")
    return {name for name, u in units.items() if u.get("method") == "sfb"} if units else None


def slim(results, clocks=2):
    """Keep what the tables and plots read: the timeline of the first ``clocks`` recorded
    iterations only (the timeline plots show two); every node's timeline as it was recorded
    (three clocks), its times in whole microseconds."""
    for r in results.values():
        ev = r.get("timeline")
        if ev:
            keep = sorted({e[4] for e in ev})[:clocks]
            r["timeline"] = [e for e in ev if e[4] in keep]
        for rep in r.get("node_timelines", {}).values():  # the clocks each node recorded, to the microsecond
            rep["timeline"] = [[lane, round(a, 6), round(b, 6), what] for lane, a, b, what in rep["timeline"]]
    return results


# -- tables and plots -----------------------------------------------------------------------------
def table(results):
    lines = [
        f"{'net':<16} {'P':>2} {'link':>7} {'mode':<12} {'images/s':>9} {'ms/iter':>9} {'MB/iter':>8} "
        f"{'waiting':>8} {'vs PS':>6}  buckets runs  WFBP  SFB layers"
    ]
    for key in ordered(results):
        r = results[key]
        net, nodes, link, comm, wfbp = key.split("|")
        if "error" in r:
            lines.append(f"{net:<16} {nodes:>2} {link:>7} {label(comm, wfbp):<12} failed: {r['error'][-120:]!r}")
            continue
        base = results.get("|".join([net, nodes, link, "ps", "off"]), {})
        ratio = r["images_per_s"] / base["images_per_s"] if "images_per_s" in base else float("nan")
        lines.append(
            f"{net:<16} {nodes:>2} {link:>7} {label(comm, wfbp):<12} {r['images_per_s']:>9.1f} "
            f"{1e3 * r['seconds_per_iter']:>9.1f} {r['bytes_per_iter'] / 1e6:>8.2f} {100 * r['wait_share']:>7.0f}% "
            f"{ratio:>5.2f}x  {bucket_tag(r):>7} {len(r.get('repeats_s') or [0]):>4}  {wfbp_tag(r, wfbp):<4}  "
            + (",".join(n for n, l in r.get("layers", {}).items() if l.get("method") == "sfb") or "-")
        )
    return "\n".join(lines)


def code_table(results):
    """Which code measured which rows: (net, nodes, link) groups per commit ('before' for rows
    from before commits were recorded), with the load beside each run."""
    by = {}
    for key in ordered(results):
        r = results[key]
        group = " ".join(key.split("|")[:3])
        by.setdefault(r.get("code_commit") or "before", {}).setdefault(group, []).append(r.get("load"))
    lines = ["code that measured the rows (commit: net nodes link, load range):"]
    for commit, groups in by.items():
        parts = []
        for group, loads in groups.items():
            known = [x for x in loads if x is not None]
            span = f"{min(known):.1f}-{max(known):.1f}" if known else "?"
            parts.append(f"{group} ({len(loads)}, load {span})")
        lines.append(f"  {commit}: " + "; ".join(parts))
    return "\n".join(lines)


def ordered(results):
    """The keys grouped by (net, nodes, link) in order of first appearance, modes as MODES."""
    groups = {}
    for key in results:
        groups.setdefault(tuple(key.split("|")[:3]), []).append(key)
    rank = {f"{c}|{w}": i for i, (c, w) in enumerate(MODES)}
    return [k for g in groups.values() for k in sorted(g, key=lambda k: rank.get("|".join(k.split("|")[3:]), 99))]


def wfbp_tag(r, wfbp):
    """'on'/'off': what the run's --wfbp resolved to (auto: cost.wfbp_auto on its node 0)."""
    if "wfbp_on" in r:
        return "on" if r["wfbp_on"] else "off"
    return wfbp if wfbp != "auto" else "?"


def bucket_tag(r):
    """'1024K': the run's --bucket-kb; 'blob': a run from before gradient buckets (a frame per blob)."""
    return f"{r['bucket_kb']:g}K" if "bucket_kb" in r else "blob"


def measured_since(results, earlier):
    """The keys of the runs measured again (or added) since ``earlier``, another version of the
    results: a grid re-run in part holds runs of two versions of the code, and each part is
    checked against a calibration of its own code."""
    return {k for k, r in results.items() if r.get("seconds_per_iter") != earlier.get(k, {}).get("seconds_per_iter")}


def results_at(commit, path):
    """A results file as it was at a git commit (``git show``)."""
    rel = os.path.relpath(os.path.abspath(path), ROOT)
    r = subprocess.run(["git", "-C", ROOT, "show", f"{commit}:{rel}"], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"--since {commit}: {r.stderr.strip()}")
    return json.loads(r.stdout)["results"]


def validation(results, only=None):
    """Predicted / measured seconds per iteration of every run (or of the keys in ``only``), the
    calibration each was predicted from (its code's commit), and how many are within 15%."""
    lines = [
        f"{'net':<16} {'P':>2} {'link':>7} {'mode':<12} {'measured':>9} {'predicted':>9} {'pred/meas':>9}  calibration"
    ]
    inside = total = differ = 0
    per = {}  # calibration -> [within, of]
    for key, r in results.items():
        if "predicted_s" not in r or (only is not None and key not in only):
            continue
        net, nodes, link, comm, wfbp = key.split("|")
        ratio = r["predicted_s"] / r["seconds_per_iter"]
        ok = abs(ratio - 1) <= 0.15
        inside, total = inside + ok, total + 1
        tag = r.get("calibration", "")
        per.setdefault(tag, [0, 0])
        per[tag][0] += ok
        per[tag][1] += 1
        flag = "" if ok else "  (outside 15%)"
        ran = run_sfb_layers(r)
        if ran is not None and "predicted_plan" in r and set(r["predicted_plan"]) != ran:
            differ += 1
            flag += f"  (plan now: SFB {'+'.join(r['predicted_plan']) or 'none'})"
        lines.append(
            f"{net:<16} {nodes:>2} {link:>7} {label(comm, wfbp):<12} {1e3 * r['seconds_per_iter']:>8.1f}ms "
            f"{1e3 * r['predicted_s']:>8.1f}ms {ratio:>9.2f}  {tag:<11}{flag}"
        )
    lines.append(f"within 15%: {inside} of {total}")
    if len(per) > 1:
        lines.append("  by calibration: " + ", ".join(f"{t or '?'} {a} of {b}" for t, (a, b) in per.items()))
    if differ:
        lines.append(
            f"{differ} run(s) synchronized other layers by SFB than the simulator's plan (cost.choose, the "
            "runtime's rule now): predicted as they ran"
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


def plot_timelines(results, keys, path):
    """Node 0's per-layer compute and communication, a panel per run of ``keys`` (the report's:
    plain PS, hybrid without WFBP, hybrid with it: what each idea changes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [(k, results[k]) for k in keys if k in results and "timeline" in results[k]]
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
    return _save_with_legend(plt, fig, colors, path, top=0.92, dpi=100)


def plot_node_timelines(results, keys, path):
    """Every node's threads, a panel per run of ``keys`` (plain PS, hybrid without WFBP, hybrid
    with it), a group of lanes per node: compute (each layer's forward and backward, waiting for
    parameters), send and recv (each GRAD, PARAM and FACTOR frame), server (the shard's updates,
    the SFB thread's rebuilds), over the clocks the nodes recorded, aligned on the wall clock."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from minicaffe.dist import timeline

    runs = [(k, results[k]["node_timelines"]) for k in keys if results.get(k, {}).get("node_timelines")]
    if not runs:
        return False
    colors = timeline.layer_colors([reps for _, reps in runs])
    rows = sum(len(reps) * (len(timeline.LANES) + 1) for _, reps in runs)
    fig, axes = plt.subplots(len(runs), 1, figsize=(11, 0.16 * rows + 0.7 * len(runs) + 0.8), squeeze=False)
    for ax, (key, reps) in zip(axes[:, 0], runs):
        timeline.draw_nodes(ax, reps, colors)
        net, nodes, link, comm, wfbp = key.split("|")
        ax.set_title(f"{net}, {nodes} nodes, {link}, {label(comm, wfbp)}: every node", fontsize=8)
    axes[-1, 0].set_xlabel("ms (wall clock, from the run's first recorded event; grey: waiting for parameters)")
    return _save_with_legend(plt, fig, colors, path, top=0.96, dpi=90)


def _save_with_legend(plt, fig, colors, path, top, dpi):
    """The timeline figures' shared ending: one legend of layer colours above the panels, saved
    to ``path`` -> True."""
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
    fig.legend(handles, list(colors), fontsize=7, ncol=min(len(colors), 8), loc="upper right")
    fig.tight_layout(rect=(0, 0, 1, top))
    fig.savefig(path, dpi=dpi)
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
    p.add_argument("--bucket-kb", type=float, help="the nodes' --bucket-kb (default: theirs, 1024)")
    p.add_argument("--repeat", type=int, default=1, help="run every mode N times, round robin; keep the median run")
    p.add_argument("--timeout", type=int, default=900)
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "poseidon_results.json"))
    p.add_argument("--report", help="print the tables and draw the plots of a results file, run nothing")
    p.add_argument(
        "--since",
        metavar="COMMIT",
        help="with --report: validate only the runs measured again since the results file at this git commit",
    )
    p.add_argument(
        "--calibration",
        help="the simulator's inputs, measured by --calibrate (default benchmarks/poseidon_calibration.json); "
        "with --report: check every run against this one instead of each against the calibration of its own "
        "code (the benchmarks/poseidon_calibration*.json whose code is the latest in the run's code's history)",
    )
    p.add_argument("--calibrate", action="store_true", help="measure the simulator's inputs for --nets x --nodes")
    p.add_argument(
        "--calibrate-runs",
        action="store_true",
        help="measure again the CPU costs taken from LeNet training runs (frame, unit, WFBP sync, contention) "
        "in --calibration; each call adds to the calls kept, the simulator takes their medians",
    )
    p.add_argument(
        "--calibrate-nets",
        action="store_true",
        help="time --nets x --nodes alone again; the simulator takes each layer's median over the calls kept",
    )
    p.add_argument(
        "--calibrate-contention",
        action="store_true",
        help="each of --nets in training runs on --nodes (hybrid, no WFBP, no link limit, as many iterations as "
        "the grid's runs): its own contention, its SFB thread's, its time out of step",
    )
    p.add_argument(
        "--calibrate-bytes",
        action="store_true",
        help="measure again the transport's CPU per byte from training runs of the FC head at 20 Gbit/s",
    )
    args = p.parse_args(argv)
    if args.calibration is None and not args.report:
        args.calibration = os.path.join(ROOT, "benchmarks", "poseidon_calibration.json")
    if args.calibrate_runs or args.calibrate_bytes or args.calibrate_nets or args.calibrate_contention:
        with open(args.calibration) as f:
            doc = json.load(f)
        print(f"load before: {os.getloadavg()}")
        if args.calibrate_nets:
            calibrate_nets(doc, args.nets, args.nodes, args.batch)
        if args.calibrate_contention:
            calibrate_contention(doc, args.nets, args.nodes)
        if args.calibrate_runs:
            calibrate_runs(doc)
            doc["runs_load"] = os.getloadavg()
        if args.calibrate_bytes:
            calibrate_bytes(doc)
        with open(args.calibration, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"wrote {args.calibration}; load after: {os.getloadavg()}")
        return 0
    if args.calibrate:
        print(f"load before: {os.getloadavg()}")
        calibrate(args.nets, args.nodes, args.batch, args.calibration)
        print(f"wrote {args.calibration}; load after: {os.getloadavg()}")
        return 0

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
        commit = code_commit()  # every row names the code that measured it (a '+': uncommitted changes)
        print(f"code: {commit or '(not a git checkout)'}")
        results = {}
        if os.path.exists(args.out):
            with open(args.out) as f:
                results = json.load(f).get("results", {})
        with tempfile.TemporaryDirectory(prefix="poseidon-bench-") as work:
            for net in args.nets:
                for nodes in args.nodes:
                    for link in args.links:
                        runs = {}  # key -> every repetition's result
                        for rep in range(args.repeat):  # round robin: drifts of the machine hit every mode
                            for mode in args.modes:
                                comm, wfbp = mode.split(":")
                                name = net + (f"@{args.batch}" if args.batch else "")
                                key = "|".join([name, str(nodes), link, comm, wfbp])
                                r = run_one(
                                    net,
                                    *(nodes, link, comm, wfbp, args.iters, work, use_ns, args.timeout, args.batch),
                                    bucket_kb=args.bucket_kb,
                                )
                                r["topology"] = "star" if use_ns else "mesh"
                                r["bucket_kb"] = 1024 if args.bucket_kb is None else args.bucket_kb
                                r["load"] = os.getloadavg()[0]
                                r["code_commit"] = commit
                                r["measured_at"] = time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime())
                                runs.setdefault(key, []).append(r)
                                msg = (
                                    r.get("error", "")[-200:]
                                    or f"{r['images_per_s']:.1f} images/s, {r['wall_s']:.0f} s"
                                )
                                print(f"{key} (run {rep + 1}): {msg}", flush=True)
                        for key, rs in runs.items():
                            results[key] = median_run(rs)
                        with open(args.out, "w") as f:
                            json.dump({"results": slim(results)}, f)
        doc = {"results": results}
    calibs, git = {}, Git()
    if args.calibration is not None:  # one calibration for every run
        if os.path.exists(args.calibration):
            with open(args.calibration) as f:
                calibs[args.calibration] = json.load(f)
        mine = {key: (args.calibration if calibs else None, None) for key in results}
    else:  # like for like: each run against the calibration of its own code
        for path in sorted(glob.glob(os.path.join(ROOT, "benchmarks", "poseidon_calibration*.json"))):
            with open(path) as f:
                calibs[path] = json.load(f)
        history = git.history(args.report) if args.report else []
        mine = own_calibrations(results, calibs, git, history)
    for key, r in results.items():
        r.pop("predicted_s", None)
        r.pop("calibration", None)
        path = mine[key][0]
        if "error" in r or path is None:
            continue
        net, nodes, link, comm, wfbp = key.split("|")
        if wfbp == "auto":  # what the run resolved it to
            wfbp = wfbp_tag(r, wfbp)
        lat = r.get("latency", DELAY)
        # (runs from before gradient buckets have no bucket_kb: every blob was its own)
        run = (calibs[path], net, int(nodes), link, comm, wfbp, r.get("topology", "star"), lat, r.get("bucket_kb", 0))
        pred = predicted(*run, sfb=run_sfb_layers(r))  # timed as the run synchronized
        if pred is not None:
            r["predicted_s"] = pred.period
            r["calibration"] = calibration_commit(calibs[path], git) or os.path.basename(path)
            own = predicted(*run)  # and the plan the simulator makes itself, as the runtime now would
            r["predicted_plan"] = sorted(n for n, m in own.methods.items() if m == "sfb")
    print(table(results))
    print(code_table(results))
    print()
    print("CPU ms per iteration, mean over nodes (compute thread, shard updates, SFB thread, the rest")
    print("of the process: transport threads and the kernel's TCP; sys = the system part of all):")
    print(cpu_table(results))
    print()
    print("simulator validation (its inputs from the calibration alone; each run as it synchronized):")
    for path, calib in calibs.items():
        code = calibration_code(calib)
        where = os.path.relpath(path, ROOT) if os.path.abspath(path).startswith(ROOT) else path
        used = sum(1 for p, _ in mine.values() if p == path)
        print(
            f"calibration {where}: measured with the code at {', '.join(code) or '(not recorded)'}"
            + (f" (matched as {calibration_commit(calib, git)})" if args.calibration is None else "")
            + f"; {used} run(s) checked against it"
        )
    missing = sorted(k for k, (p, _) in mine.items() if p is None and "error" not in results[k])
    if missing:
        print(f"{len(missing)} run(s) of code older than every calibration, not checked: {', '.join(missing)}")
    only = measured_since(results, results_at(args.since, args.report)) if args.since and args.report else None
    if only is not None:
        print(f"(the {len(only)} run(s) measured since {args.since})")
    print(validation(results, only))
    base = os.path.splitext(args.report or args.out)[0]
    plot_throughput(results, base + "_throughput.png")
    for net in {k.split("|")[0] for k in results}:
        keys = [k for k in results if k.startswith(net + "|") and "|hybrid|" in k]
        if keys:
            _, nodes, link, _, _ = sorted(keys)[-1].split("|")
            stem = "|".join([net, nodes, link])
            modes = ("|ps|off", "|hybrid|off", "|hybrid|on")
            plot_timelines(results, [stem + m for m in modes], f"{base}_timeline_{net.replace('@', '_b')}.png")
            keys = [stem + m for m in modes]
            plot_node_timelines(results, keys, f"{base}_timeline_nodes_{net.replace('@', '_b')}.png")
    if not args.report:
        with open(args.out, "w") as f:
            json.dump({"results": slim(results)}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
