"""Draw a net's graph (pycaffe's ``caffe.draw``; the tool is ``python -m minicaffe.draw_net``).

    python -m minicaffe.draw_net nets/lenet_train_test.prototxt lenet.png --phase TRAIN
    minicaffe.draw.draw_net_to_file(net_param, "lenet.png", rankdir="LR", phase="TRAIN")

As Caffe's draw_net: layers are boxes (named, with their type and the settings that shape their
output: kernel, stride, pad, outputs), blobs are gray octagons, arrows follow the data.  A layer
computed in place (ReLU on ``ip1``) writes a new version of its blob, drawn as a blob of its own
with the same name, so the drawing stays a left-to-right flow.

Drawn with matplotlib, not graphviz: matplotlib is already a dependency, while Caffe's draw.py
needs pydot and the graphviz ``dot`` program, which pip cannot install.  The layout is the
classic layered one (Sugiyama): each node's rank is its longest path from an input, and a few
sweeps order each rank by the mean position of its neighbours, which keeps edges from crossing
on the nets people draw (chains with a few branches).
"""

import io

from .net import TEST, TRAIN, filter_layers, load_net_param

LAYER_COLORS = {
    "Convolution": "#FF5050",
    "Deconvolution": "#FF5050",
    "Pooling": "#FF9900",
    "InnerProduct": "#CC33FF",
}
DEFAULT_COLOR = "#6495ED"
BLOB_COLOR = "#E0E0E0"


def layer_label(layer, rankdir="LR"):
    """The text in a layer's box: name, type, and the settings that shape its output."""
    lines = [layer.name, f"({layer.type})"]
    if layer.type in ("Convolution", "Deconvolution"):
        p = layer.convolution_param
        k = list(p.kernel_size) or [p.kernel_h, p.kernel_w]
        lines.append(f"kernel {'x'.join(str(v) for v in k)}, out {p.num_output}")
        stride, pad = list(p.stride) or [1], list(p.pad) or [0]
        lines.append(f"stride {'x'.join(map(str, stride))}, pad {'x'.join(map(str, pad))}")
    elif layer.type == "Pooling":
        p = layer.pooling_param
        k = p.kernel_size if p.has("kernel_size") else f"{p.kernel_h}x{p.kernel_w}"
        lines.append(f"{p.pool} {'global' if p.global_pooling else k}, stride {p.stride}")
    elif layer.type == "InnerProduct":
        lines.append(f"out {layer.inner_product_param.num_output}")
    return "\n".join(lines)


def build_graph(net_param, phase=None):
    """(nodes, edges): nodes {id: (kind, label, color)}, edges [(from id, to id)], for the
    layers of ``phase`` ("TRAIN", "TEST", or None for every layer)."""
    layers = list(net_param.layer)
    if phase is not None:
        layers = filter_layers(layers, phase)
    nodes, edges, version = {}, [], {}

    def blob_node(name, new=False):
        if new or name not in version:
            version[name] = version.get(name, -1) + 1
            nodes[f"blob:{name}:{version[name]}"] = ("blob", name, BLOB_COLOR)
        return f"blob:{name}:{version[name]}"

    for name in net_param.input:  # legacy `input:` fields: blobs before any layer reads them
        blob_node(name)
    for i, layer in enumerate(layers):
        lid = f"layer:{i}:{layer.name}"
        nodes[lid] = ("layer", layer_label(layer), LAYER_COLORS.get(layer.type, DEFAULT_COLOR))
        for b in layer.bottom:
            edges.append((blob_node(b), lid))
        for t in layer.top:
            edges.append((lid, blob_node(t, new=t in layer.bottom or t in version)))
    return nodes, edges


def layout(nodes, edges, sweeps=4):
    """({id: (rank, position within rank)}, {edge: [ids of the bends]}): longest-path ranks, an
    invisible node on every rank a long edge crosses (so it is routed between the boxes, not
    through them), and barycenter ordering within ranks."""
    preds = {n: [] for n in nodes}
    for a, b in edges:
        preds[b].append(a)
    rank = {}
    for n in nodes:  # the nodes are in creation order, which is a topological order
        rank[n] = max((rank[p] + 1 for p in preds[n]), default=0)
    # a blob is drawn just before its first reader (Caffe's labels wait beside the loss)
    readers = {}
    for a, b in edges:
        readers.setdefault(a, []).append(b)
    for n, (kind, _, _) in nodes.items():
        if kind == "blob" and n in readers and preds[n]:
            rank[n] = max(rank[n], min(rank[r] for r in readers[n]) - 1)
    bends, links = {}, []
    for a, b in edges:
        chain = [a]
        for r in range(rank[a] + 1, rank[b]):
            d = f"bend:{a}->{b}:{r}"
            rank[d] = r
            chain.append(d)
        bends[(a, b)] = chain[1:]
        chain.append(b)
        links += list(zip(chain, chain[1:]))
    up = {n: [] for n in rank}
    down = {n: [] for n in rank}
    for a, b in links:
        up[b].append(a)
        down[a].append(b)
    ranks = {}
    for n in rank:
        ranks.setdefault(rank[n], []).append(n)
    order = {n: i for r in ranks.values() for i, n in enumerate(r)}
    for sweep in range(sweeps):
        downward = sweep % 2 == 0
        for r in sorted(ranks, reverse=not downward):
            neighbours = up if downward else down

            def key(n):
                around = [order[m] for m in neighbours[n]]
                return sum(around) / len(around) if around else order[n]

            ranks[r].sort(key=key)
            for i, n in enumerate(ranks[r]):
                order[n] = i
    width = max(len(r) for r in ranks.values()) if ranks else 1
    pos = {}
    for r, members in ranks.items():
        offset = (width - len(members)) / 2.0  # center each rank
        for i, n in enumerate(members):
            pos[n] = (r, offset + i)
    return pos, bends


def draw_net(net_param, rankdir="LR", ext="png", phase=None):
    """The drawing of ``net_param`` as bytes of an image file of type ``ext`` (png, svg, pdf)."""
    # a Figure of its own with the Agg canvas: no pyplot, so a notebook's backend is left alone
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyArrowPatch

    if rankdir not in ("LR", "RL", "TB", "BT"):
        raise ValueError(f"rankdir must be LR, RL, TB or BT, got {rankdir!r}")
    nodes, edges = build_graph(net_param, phase)
    pos, bends = layout(nodes, edges)
    n_ranks = max((r for r, _ in pos.values()), default=0) + 1
    width = max((p for _, p in pos.values()), default=0) + 1
    step_r, step_p = 2.2, 1.6  # inches between ranks, between nodes of a rank

    def xy(n):
        r, p = pos[n]
        r = r if rankdir in ("LR", "TB") else n_ranks - 1 - r
        return (r * step_r, -p * step_p) if rankdir in ("LR", "RL") else (p * step_r, -r * step_p)

    horizontal = rankdir in ("LR", "RL")
    fig_w = (n_ranks if horizontal else width) * step_r + 1
    fig_h = (width if horizontal else n_ranks) * step_p + 1
    fig = Figure(figsize=(min(fig_w, 200), min(fig_h, 200)))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_axis_off()
    boxes = {}
    for n, (kind, label, color) in nodes.items():
        x, y = xy(n)
        style = "round,pad=0.3" if kind == "layer" else "round4,pad=0.25"
        boxes[n] = ax.text(
            x, y, label, ha="center", va="center", fontsize=8, zorder=3,
            bbox=dict(boxstyle=style, facecolor=color, edgecolor="0.25", lw=0.8),
        )  # fmt: skip
    fig.canvas.draw()  # sizes the boxes, so that arrows can end at their edges
    for a, b in edges:
        points = [xy(a)] + [xy(d) for d in bends[(a, b)]] + [xy(b)]
        for k, (p, q) in enumerate(zip(points, points[1:])):
            last = k == len(points) - 2
            ax.add_patch(
                FancyArrowPatch(
                    posA=p, posB=q, patchA=boxes[a].get_bbox_patch() if k == 0 else None,
                    patchB=boxes[b].get_bbox_patch() if last else None,
                    arrowstyle="-|>" if last else "-", mutation_scale=12, color="0.3", lw=0.8, zorder=2,
                    shrinkA=0 if k else 2, shrinkB=2 if last else 0,
                )
            )  # fmt: skip
    xs = [xy(n)[0] for n in pos] or [0]
    ys = [xy(n)[1] for n in pos] or [0]
    ax.set_xlim(min(xs) - 1.2, max(xs) + 1.2)
    ax.set_ylim(min(ys) - 0.9, max(ys) + 0.9)
    title = net_param.name + (f" ({phase})" if phase else "")
    ax.set_title(title, fontsize=10)
    buf = io.BytesIO()
    fig.savefig(buf, format=ext, dpi=100, bbox_inches="tight")
    return buf.getvalue()


def draw_net_to_file(caffe_net, filename, rankdir="LR", phase=None, display_lrm=False):
    """pycaffe's ``caffe.draw.draw_net_to_file``: ``caffe_net`` is a NetParameter (or a prototxt
    path); the file type follows ``filename``'s extension.  ``display_lrm`` is accepted and ignored."""
    import os

    from .io import atomic_write

    if isinstance(caffe_net, (str, os.PathLike)):
        caffe_net = load_net_param(caffe_net)
    ext = os.path.splitext(os.fspath(filename))[1][1:].lower() or "png"
    phase = {None: None, "ALL": None, "TRAIN": TRAIN, "TEST": TEST, 0: TRAIN, 1: TEST}.get(phase, phase)
    data = draw_net(caffe_net, rankdir, ext, phase)
    atomic_write(filename, lambda f: f.write(data))
