"""The timeline picture: per node, what each thread did over the first iterations of a run.

Every Node records intervals ``(lane, start, end, label)`` in seconds from its own start, over
three iterations from the run's 10th on (fewer in a short run: the first ones compile kernels,
test, and let the nodes fall into step), and its start on the wall clock (``t_origin``), so
nodes are drawn on one time axis:

    compute   each layer's forward and backward (from the Net's hooks), "wait for parameters"
    send      each GRAD frame leaving (one per bucket and shard) and each FACTOR frame of an SFB
              layer (u and v, one each per peer), as the sender threads saw it
    recv      each frame of those kinds arriving (gradients at their shard, parameters, factors)
    server    the shard's updates, and the SFB thread's rebuild + update of each SFB layer

``plot_timeline(reports, path)`` draws one row of lanes per node (layers coloured alike in
every lane), so the overlap of computation and communication, or its absence, is visible;
``draw_nodes(ax, reports, colors)`` draws every node's lanes on one axis (benchmarks/poseidon.py
puts a run per panel, to set modes side by side).
"""

import os


def plot_timeline(reports, path, max_events=4000):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = sorted(reports, key=int)
    lanes = ["compute", "send", "recv", "server"]
    labels = sorted(
        {layer_of(e[3]) for r in ranks for e in reports[r].get("timeline", []) if layer_of(e[3])},
    )
    colors = {name: f"C{k % 10}" for k, name in enumerate(labels)}
    # align the nodes on the wall clock, starting at the first recorded event
    shift = {r: reports[r].get("t_origin", 0.0) for r in ranks}
    starts = [shift[r] + e[1] for r in ranks for e in reports[r].get("timeline", [])]
    zero = min(starts) if starts else 0.0
    ends = [shift[r] + e[2] for r in ranks for e in reports[r].get("timeline", [])]
    min_width = (max(ends) - zero) / 1500 if ends else 1e-4  # short frames stay visible
    fig, axes = plt.subplots(len(ranks), 1, figsize=(12, 1.2 + 1.3 * len(ranks)), squeeze=False, sharex=True)
    for ax, r in zip(axes[:, 0], ranks):
        events = reports[r].get("timeline", [])[:max_events]
        for lane, t0, t1, label in events:
            t0, t1 = t0 + shift[r] - zero, t1 + shift[r] - zero
            y = lanes.index(lane) if lane in lanes else 0
            name = layer_of(label)
            color = colors.get(name, "0.6") if name else ("0.85" if "wait" in label else "0.6")
            width = max(t1 - t0, min_width)
            ax.barh(y, width * 1e3, left=t0 * 1e3, height=0.7, color=color, edgecolor="none")
        ax.set_yticks(range(len(lanes)))
        ax.set_yticklabels(lanes)
        ax.invert_yaxis()
        ax.set_ylabel(f"node {r}")
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("milliseconds (wall clock, from the first recorded event)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
    handles.append(plt.Rectangle((0, 0), 1, 1, color="0.85"))
    fig.legend(handles, list(colors) + ["waiting for parameters"], loc="upper right", fontsize=7, ncol=4)
    fig.suptitle("compute vs communication per layer, first iterations", x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    tmp = path + ".tmp.png"
    fig.savefig(tmp, dpi=90)
    plt.close(fig)
    os.replace(tmp, path)
    return path


def layer_of(label):
    """'forward conv1' / 'GRAD conv1/w' -> 'conv1'; other labels -> ''."""
    parts = label.split(" ")
    if len(parts) >= 2 and parts[0] in ("forward", "backward", "GRAD", "PARAM", "FACTOR", "push", "update", "rebuild"):
        return parts[1].split("/")[0]
    return ""


LANES = ("compute", "send", "recv", "server")


def layer_colors(reports_list):
    """One colour per layer name over every report of ``reports_list`` (a list of {rank: report}),
    so a layer is the same colour in every lane, node and run of a figure."""
    names = sorted({layer_of(e[3]) for reps in reports_list for rep in reps.values() for e in rep.get("timeline", [])})
    names = [n for n in names if n]
    if len(names) <= 10:
        return {name: f"C{k}" for k, name in enumerate(names)}
    import matplotlib

    tab20 = matplotlib.colormaps["tab20"]  # more layers than the 10 default colours: 20 distinct ones
    return {name: tab20(k % 20) for k, name in enumerate(names)}


def draw_nodes(ax, reports, colors, max_events=4000):
    """Every node's lanes on one axis, a group of four rows per node (node 0 on top): compute,
    send, recv, server, aligned on the wall clock from the first recorded event. -> the span
    drawn, in ms."""
    ranks = sorted(reports, key=int)
    shift = {r: reports[r].get("t_origin", 0.0) for r in ranks}
    events = {r: reports[r].get("timeline", [])[:max_events] for r in ranks}
    starts = [shift[r] + e[1] for r in ranks for e in events[r]]
    ends = [shift[r] + e[2] for r in ranks for e in events[r]]
    if not starts:
        return 0.0
    zero = min(starts)
    min_width = (max(ends) - zero) / 1500  # short frames stay visible
    step = len(LANES) + 1  # a blank row between nodes
    ticks, names = [], []
    for g, r in enumerate(ranks):
        for lane, t0, t1, label in events[r]:
            y = g * step + (LANES.index(lane) if lane in LANES else 0)
            name = layer_of(label)
            color = colors.get(name, "0.6") if name else ("0.85" if "wait" in label else "0.6")
            left = (t0 + shift[r] - zero) * 1e3
            ax.barh(y, max(t1 - t0, min_width) * 1e3, left=left, height=0.75, color=color, edgecolor="none")
        ticks += [g * step + k for k in range(len(LANES))]
        names += [f"node {r} {lane}" if k == 0 else lane for k, lane in enumerate(LANES)]
        if g:
            ax.axhline(g * step - 1, color="0.7", lw=0.5)
    ax.set_yticks(ticks, names, fontsize=6)
    ax.set_ylim(len(ranks) * step - 1, -1)
    ax.grid(axis="x", alpha=0.3)
    return (max(ends) - zero) * 1e3
