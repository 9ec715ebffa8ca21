"""Distributed training on one machine: threads vs sockets vs MPI vs an emulated cluster.

    python benchmarks/dist.py                 # LeNet and CIFAR-10 quick, every row (~15-25 min)
    python benchmarks/dist.py --nets lenet --iters 30 --no-emulate

Every row is a real ``python -m minicaffe.train`` run on synthetic data of the nets' shapes
(nothing downloaded), on the global batch of the solver, timed from its train_log.jsonl after
``--warmup`` iterations (numba compiles in the first ones):

  threads --workers 4        one process, SingleCaffe: 4 worker threads + the server thread
  sockets --nodes 4          4 node processes on loopback, minicaffe's socket transport
  MPI 4 ranks                mpiexec -n 4 ... --dist mpi (skipped where mpi4py is missing)
  emulated N nodes @ R       python -m minicaffe.dist.emulate --nodes N --bandwidth R: each node
                             in its own network namespace on a shaped link (the in-transport
                             --link limiter on loopback where namespaces are not allowed)

Columns: images/s, ms per iteration, bytes per iteration moved by node 0 (sent + received,
headers included; 0 for threads, which share memory), node 0's share of the time waiting
for parameters.  Then transport efficiency: a 64 MiB tensor between two local nodes through the
transport vs a raw socket copy in the same run (python -m minicaffe.dist.linkcheck), and the
same on an emulated 1 Gbit/s link vs the link's rate.  Writes benchmarks/dist_results.json,
benchmarks/dist_table.md and benchmarks/dist.png.  The machine's load (``uptime``) is printed
with the table: every row shares the same cores, so compare rows, not absolute rates.  Each row
runs in a session of its own (Linux's autogroup gives each session one share of a busy
machine); mpiexec starts each rank in a session of its own, so where other work competes for
the cores the MPI rows get more of them than the others.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

SOLVERS = {"lenet": "lenet_solver.prototxt", "cifar10_quick": "cifar10_quick_solver.prototxt"}


def write_synthetic_solver(net, workdir):
    """The solver of ``net`` with its Data layers reading synthetic images; no testing."""
    from minicaffe import proto
    from minicaffe.net import load_net_param
    from minicaffe.parallel.replica import with_synthetic_data
    from minicaffe.solvers import load_solver_param

    param, base = load_solver_param(os.path.join(ROOT, "nets", SOLVERS[net]))
    net_param = with_synthetic_data(load_net_param(os.path.join(base, os.path.basename(param.net))), count=2048)
    net_path = os.path.join(workdir, f"{net}_net.prototxt")
    with open(net_path, "w") as f:
        f.write(proto.to_text(net_param))
    param.net = net_path
    param.test_interval = 0
    param.clear("test_iter")
    param.snapshot = 0
    param.snapshot_after_train = False
    param.display = 10
    param.random_seed = 1
    path = os.path.join(workdir, f"{net}_solver.prototxt")
    with open(path, "w") as f:
        f.write(proto.to_text(param))
    batch = next(lp.data_param.batch_size for lp in net_param.layer if lp.type == "Data")
    return path, batch


def measure(out_dir, batch, warmup):
    """images/s, ms/iter, bytes/iter and wait share from a run's train_log.jsonl."""
    recs = [json.loads(line) for line in open(os.path.join(out_dir, "train_log.jsonl")) if line.strip()]
    its = [r for r in recs if r.get("kind") == "iter"]
    its = its[warmup:]
    span = its[-1]["seconds"] - its[0]["seconds"]
    n = its[-1]["iter"] - its[0]["iter"]
    row = {"ms_per_iter": 1000 * span / n, "images_per_s": n * batch / span, "iters_timed": n}
    dist = [r for r in recs if r.get("kind") == "dist"]
    if dist:
        node0 = dist[-1]["nodes"]["0"]
        row["bytes_per_iter"] = node0["bytes_per_iter"]
        total = node0["compute_s"] + node0["sync_s"]
        row["wait_share"] = node0["wait_s"] / total if total else 0.0
    else:
        row["bytes_per_iter"], row["wait_share"] = 0.0, 0.0
    return row


def run(cmd, env, timeout):
    t0 = time.time()
    # each row in a session of its own: with Linux's autogroup scheduling a session gets one
    # fair share of a busy machine.  (mpiexec goes further and starts every rank in a session
    # of its own, so on a shared machine an MPI row gets one share per rank: see the docs.)
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT, start_new_session=True)
    if r.returncode != 0:
        tail = "\n".join((r.stdout + r.stderr).splitlines()[-8:])
        raise RuntimeError(f"{' '.join(cmd[:8])}... exited {r.returncode}:\n{tail}")
    return time.time() - t0


def rows_for(net, args, workdir, env, emulate_ok):
    solver, batch = write_synthetic_solver(net, workdir)
    py = sys.executable
    base = [py, "-m", "minicaffe.train", solver, "--iters", str(args.iters), "--no-plot", "--force"]
    configs = [("threads --workers 4", lambda out: base + ["--workers", "4", "--output", out])]
    configs.append(("sockets --nodes 4", lambda out: base + ["--nodes", "4", "--output", out]))
    mpiexec = shutil.which("mpiexec") or os.path.join(os.path.dirname(py), "mpiexec")
    try:
        import mpi4py  # noqa: F401

        has_mpi = os.path.exists(mpiexec)
    except ImportError:
        has_mpi = False
    if has_mpi:
        configs.append(("MPI 4 ranks", lambda out: [mpiexec, "-n", "4", *base, "--dist", "mpi", "--output", out]))
    if not args.no_emulate:
        for rate in ("1gbit", "10gbit"):
            for n in (2, 4):
                if emulate_ok:
                    label = f"emulated {n} nodes @ {rate}"
                    configs.append(
                        (
                            label,
                            lambda out, n=n, rate=rate: [
                                py, "-m", "minicaffe.dist.emulate", "--nodes", str(n), "--bandwidth", rate,
                                "--delay", "0.1ms", "--", *base, "--output", out,
                            ],
                        )
                    )  # fmt: skip
                else:
                    label = f"--link {rate}, {n} nodes"
                    configs.append(
                        (label, lambda out, n=n, rate=rate: base + ["--nodes", str(n), "--link", rate, "--output", out])
                    )
    rows = []
    for label, make in configs:
        out = os.path.join(workdir, f"{net}-{len(rows)}")
        try:
            wall = run(make(out), env, args.timeout)
            row = measure(out, batch, args.warmup)
            row["wall_s"] = wall
        except (RuntimeError, subprocess.TimeoutExpired, OSError, StopIteration, IndexError) as exc:
            row = {"error": str(exc).splitlines()[0]}
        row.update(net=net, config=label, batch=batch)
        rows.append(row)
        print(
            f"  {net:14} {label:28} " + (f"{row['images_per_s']:8.1f} img/s" if "error" not in row else row["error"]),
            flush=True,
        )
    return rows


def linkcheck(env, emulate_ok, mb):
    out = {}
    py = sys.executable
    port = 29700 + os.getpid() % 200
    e = dict(env, MINICAFFE_DIST_SECRET="bench", MINICAFFE_WORLD_SIZE="2", MINICAFFE_RENDEZVOUS=f"127.0.0.1:{port}")
    cmd = [py, "-m", "minicaffe.dist.linkcheck", "--mb", str(mb), "--rounds", "5"]
    p1 = subprocess.Popen(cmd, env=dict(e, MINICAFFE_RANK="1"), cwd=ROOT)
    r0 = subprocess.run(cmd, env=dict(e, MINICAFFE_RANK="0"), capture_output=True, text=True, cwd=ROOT, timeout=600)
    # (both ends share this script's session, as the two ends of the emulated run share theirs)
    p1.wait(60)
    out["loopback"] = json.loads(r0.stdout.strip().splitlines()[-1])
    if emulate_ok:
        r = subprocess.run(
            [py, "-m", "minicaffe.dist.emulate", "--nodes", "2", "--bandwidth", "1gbit", "--", *cmd],
            env=env, capture_output=True, text=True, cwd=ROOT, timeout=600,
        )  # fmt: skip
        res = json.loads(r.stdout.strip().splitlines()[-1])
        res["link_Bps"] = 1e9 / 8
        res["notes"] = [line for line in r.stderr.splitlines() if "netem" in line]
        out["emulated 1gbit"] = res
    return out


def table(rows, links, load):
    lines = [
        f"load average before / after: {load[0]} / {load[1]} (2 cores; every row shares them)",
        "",
        "| net | configuration | images/s | ms/iter | MB/iter (node 0) | waiting |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['net']} | {r['config']} | failed: {r['error'][:60]} | | | |")
            continue
        lines.append(
            f"| {r['net']} | {r['config']} | {r['images_per_s']:.1f} | {r['ms_per_iter']:.1f} | "
            f"{r['bytes_per_iter'] / 1e6:.3f} | {100 * r['wait_share']:.0f}% |"
        )
    lines += [
        "",
        "| transport efficiency (64 MiB tensor) | transport MB/s | reference MB/s | ratio |",
        "|---|---:|---:|---:|",
    ]
    lo = links.get("loopback")
    if lo:
        lines.append(
            f"| loopback, vs raw socket copy (same run) | {lo['transport_Bps'] / 1e6:.0f} | {lo['raw_Bps'] / 1e6:.0f} "
            f"| {lo['ratio']:.2f} |"
        )
    em = links.get("emulated 1gbit")
    if em:
        lines.append(
            f"| emulated 1 Gbit/s link, vs the link rate | {em['transport_Bps'] / 1e6:.1f} | "
            f"{em['link_Bps'] / 1e6:.1f} | {em['transport_Bps'] / em['link_Bps']:.2f} |"
        )
        lines.append(
            f"| emulated 1 Gbit/s link, vs raw socket copy | {em['transport_Bps'] / 1e6:.1f} | "
            f"{em['raw_Bps'] / 1e6:.1f} | {em['ratio']:.2f} |"
        )
    return "\n".join(lines)


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nets = sorted({r["net"] for r in rows})
    fig, axes = plt.subplots(2, len(nets), figsize=(6 * len(nets), 7), squeeze=False)
    for j, net in enumerate(nets):
        rs = [r for r in rows if r["net"] == net and "error" not in r]
        labels = [r["config"] for r in rs]
        for i, (key, scale, title) in enumerate(
            (("images_per_s", 1, "images/s"), ("bytes_per_iter", 1e-6, "MB per iteration (node 0)"))
        ):
            ax = axes[i][j]
            ax.barh(range(len(rs)), [r[key] * scale for r in rs], color=[f"C{k % 10}" for k in range(len(rs))])
            ax.set_yticks(range(len(rs)))
            ax.set_yticklabels(labels, fontsize=8)
            ax.invert_yaxis()
            ax.set_xlabel(title)
            ax.set_title(f"{net}: {title}")
            ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nets", nargs="+", default=list(SOLVERS), choices=list(SOLVERS))
    p.add_argument("--iters", type=int, default=40)
    p.add_argument("--warmup", type=int, default=10, help="iterations left out of the timing")
    p.add_argument("--timeout", type=int, default=900)
    p.add_argument("--no-emulate", action="store_true", help="skip the emulated-cluster rows")
    p.add_argument("--mb", type=float, default=64, help="tensor size of the transport check (MiB)")
    p.add_argument("--out", default=HERE)
    args = p.parse_args()
    from minicaffe.dist import emulate

    why = emulate.why_not()
    emulate_ok = why is None
    if not emulate_ok:
        print(f"emulated cluster: {why}; using the in-transport limiter (--link) instead", flush=True)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    load0 = os.getloadavg()
    workdir = tempfile.mkdtemp(prefix="minicaffe-bench-dist-")
    rows = []
    try:
        for net in args.nets:
            rows += rows_for(net, args, workdir, env, emulate_ok)
        links = linkcheck(env, emulate_ok, args.mb)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    load1 = os.getloadavg()
    load = (" ".join(f"{x:.1f}" for x in load0), " ".join(f"{x:.1f}" for x in load1))
    text = table(rows, links, load)
    print(text)
    cmd = "python benchmarks/" + os.path.basename(__file__) + " " + " ".join(sys.argv[1:])
    with open(os.path.join(args.out, "dist_results.json"), "w") as f:
        json.dump({"command": cmd.strip(), "load": load, "rows": rows, "links": links}, f, indent=1)
    with open(os.path.join(args.out, "dist_table.md"), "w") as f:
        f.write(f"Made by `{cmd.strip()}`\n\n{text}\n")
    plot(rows, os.path.join(args.out, "dist.png"))


if __name__ == "__main__":
    main()
