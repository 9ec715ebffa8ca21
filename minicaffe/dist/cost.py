"""Poseidon's HybComm cost rule: per layer, a parameter server (PS) or sufficient factors (SFB)?

A fully connected layer with an M x N weight (M outputs, N inputs) sees a batch of K rows per
node per iteration. Its weight gradient is a sum of K outer products, dW = sum_i u_i v_i^T with
u_i the top diff (M) and v_i the bottom data (N) of row i. Two ways to make every node's copy of
W see every node's gradient, counted in floats per iteration per node, sent plus received
(P1 worker nodes, P2 server shards, co-located; here P1 = P2 = P nodes):

    PS  = 2 M N (P1 + P2 - 2) / P2     push the gradient's shards to the servers, pull the
                                       fresh parameters back; as a server shard, receive the
                                       other workers' pushes and answer their pulls
    SFB = 2 K (P1 - 1) (M + N)         send u (K x M) and v (K x N) to every peer, receive
                                       theirs; each peer rebuilds sum_p U_p^T V_p itself

The rule picks SFB when SFB <= PS (Poseidon, arXiv 1512.06216, section 3.2). PS grows with
the layer's size, SFB with the batch and the number of peers, so the choice flips as P grows:
LeNet's ip1 (500 x 800, K = 64) is SFB on 2 to 8 nodes and PS from 16. Convolution layers, and
every other layer with parameters, always use PS: their gradient is not a sum of outer products
of two short vectors.

The rule is stated for the weight. A bias rides along for free with SFB (its gradient is the
column sum of u, which every peer already has) and costs 2 M (P1 + P2 - 2) / P2 floats with PS;
the predicted bytes printed below include it.

    python -m minicaffe.dist.cost lenet --nodes 4          # the per-layer choice and bytes
    python -m minicaffe.dist.cost lenet --nodes 2 4 8 16   # how the choice moves with P
"""

import argparse
import sys
from dataclasses import dataclass

from ..errors import MinicaffeError

COMM_MODES = ("ps", "sfb", "hybrid")


def ps_floats(m, n, p1, p2):
    """Poseidon's PS cost of an m x n matrix, floats per iteration per node (sent + received)."""
    return 2.0 * m * n * (p1 + p2 - 2) / p2


def sfb_floats(k, m, n, p1):
    """Poseidon's SFB cost of an m x n FC layer with k rows per node (sent + received)."""
    return 2.0 * k * (p1 - 1) * (m + n)


@dataclass
class LayerCost:
    """One layer with learnable parameters and how it is synchronized.

    ``params``: indices into ``net.learnable_params``; ``m, n, k``: the FC geometry (None for
    other layers); ``ps_rule``/``sfb_rule``: the rule's floats for the weight alone;
    ``floats``: what the chosen method moves per iteration per node, bias included.
    """

    index: int
    name: str
    type: str
    params: list
    count: int
    m: int = None
    n: int = None
    k: int = None
    transpose: bool = False
    sfb_ok: bool = False
    reason: str = ""
    ps_rule: float = 0.0
    sfb_rule: float = None
    choice: str = "ps"
    floats: float = 0.0
    itemsize: int = 4

    @property
    def bytes(self):
        return self.floats * self.itemsize


def layer_params(net):
    """Per layer index: [(learnable index, owns it?)] in the order of the layer's blobs."""
    out, flat, own = {}, 0, 0
    for i, layer in enumerate(net.layers):
        entries = []
        for _ in layer.blobs:
            owner = net.params_owner[flat]
            if owner is None:
                entries.append((own, True))
                own += 1
            else:
                entries.append((owner, False))
            flat += 1
        if entries:
            out[i] = entries
    return out


def sfb_eligibility(net, i, entries=None):
    """(True, '') if layer i can use SFB, else (False, why)."""
    layer = net.layers[i]
    if layer.type != "InnerProduct":
        what = "convolution" if layer.type in ("Convolution", "Deconvolution") else layer.type
        return False, f"{what}: gradient is not a sum of outer products"
    entries = entries if entries is not None else layer_params(net)[i]
    borrowed = any(not own for _, own in entries)
    lent = any(owner == k for k, _ in entries for owner in net.params_owner)
    if borrowed or lent:
        return False, "shares its parameters with another layer (param { name })"
    if net.params_lr[entries[0][0]] == 0:
        return False, "weight does not learn (lr_mult 0)"
    return True, ""


def plan(net, nodes, servers=None, comm="hybrid", workers=1, iter_size=1, global_batch=False):
    """The per-layer synchronization plan of ``net`` on ``nodes`` nodes: a list of LayerCost.

    ``workers`` threads per node and ``iter_size`` accumulate their rows into one node's batch,
    so K = rows per forward x workers x iter_size. ``global_batch``: the net's batch is the
    whole run's (as ``python -m minicaffe.train --nodes`` reads it), so a node has 1/P of it.
    """
    if comm not in COMM_MODES:
        raise MinicaffeError(f"--comm must be one of {', '.join(COMM_MODES)}, got '{comm}'")
    if nodes < 1:
        raise MinicaffeError(f"nodes must be >= 1, got {nodes}")
    p1, p2 = int(nodes), int(servers or nodes)
    itemsize = net.dtype.itemsize
    out = []
    for i, entries in layer_params(net).items():
        layer = net.layers[i]
        own = [k for k, mine in entries if mine]
        if not own or all(net.params_lr[k] == 0 for k in own):
            continue  # nothing to synchronize here (shared from elsewhere, or frozen)
        count = sum(net.learnable_params[k].count for k in own)
        lc = LayerCost(i, layer.name, layer.type, own, count)
        lc.itemsize = itemsize
        lc.sfb_ok, lc.reason = sfb_eligibility(net, i, entries)
        if layer.type == "InnerProduct":
            ipp = layer.param.inner_product_param
            lc.m, lc.transpose = int(ipp.num_output), bool(ipp.transpose)
            lc.n = net.learnable_params[own[0]].count // lc.m
            rows = net.top_vecs[i][0].count // lc.m
            lc.k = rows * workers * iter_size
            if global_batch:
                lc.k = -(-lc.k // p1)  # the largest node's share
            lc.ps_rule = ps_floats(lc.m, lc.n, p1, p2)
            lc.sfb_rule = sfb_floats(lc.k, lc.m, lc.n, p1)
        else:
            lc.ps_rule = ps_floats(count, 1, p1, p2)
        if comm == "ps" or not lc.sfb_ok:
            lc.choice = "ps"
        elif comm == "sfb":
            lc.choice = "sfb"
        else:
            lc.choice = "sfb" if lc.sfb_rule <= lc.ps_rule else "ps"
        lc.floats = lc.sfb_rule if lc.choice == "sfb" else ps_floats(count, 1, p1, p2)
        out.append(lc)
    return out


def _num(x):
    return "-" if x is None else f"{x:,.0f}"


def format_plan(costs, nodes, servers=None, comm="hybrid"):
    """The start-up table: one line per layer with the rule's numbers and the choice."""
    p2 = servers or nodes
    lines = [
        f"HybComm plan ({comm}): P1 = {nodes} worker nodes, P2 = {p2} server shards; "
        "floats per iteration per node, sent + received",
        f"  {'layer':<10} {'type':<13} {'M':>6} {'N':>6} {'K':>5} {'PS (rule)':>13} {'SFB (rule)':>13}"
        f"  {'choice':<6} {'predicted':>11}",
    ]
    total = 0.0
    for c in costs:
        why = "" if c.sfb_ok or c.choice == "sfb" else f"  ({c.reason})"
        lines.append(
            f"  {c.name:<10} {c.type:<13} {_num(c.m):>6} {_num(c.n):>6} {_num(c.k):>5} {_num(c.ps_rule):>13} "
            f"{_num(c.sfb_rule):>13}  {c.choice.upper():<6} {c.bytes / 1e6:>8.3f} MB{why}"
        )
        total += c.bytes
    lines.append(f"  total {total / 1e6:.3f} MB per iteration per node (weights and biases; headers not counted)")
    return "\n".join(lines)


def build_parser():
    p = argparse.ArgumentParser(prog="python -m minicaffe.dist.cost", description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="a short name from nets/ or a net prototxt")
    p.add_argument("--nodes", type=int, nargs="+", default=[4], help="P1 = P2 = nodes (several values: one table each)")
    p.add_argument("--comm", choices=COMM_MODES, default="hybrid")
    p.add_argument("--workers", type=int, default=1, help="threads per node (their rows add up to K)")
    p.add_argument(
        "--batch-per-node",
        action="store_true",
        help="the net's batch is each node's K (Poseidon's convention); by default it is the whole "
        "run's batch, split over the nodes as python -m minicaffe.train --nodes does",
    )
    p.add_argument("--synthetic", action="store_true", help="Data layers read synthetic images (no download)")
    return p


def main(argv=None):
    from .. import proto
    from ..net import Net
    from ..parallel import with_synthetic_data
    from ..tools.common import resolve_net

    args = build_parser().parse_args(argv)
    try:
        param = proto.parse_file(resolve_net(args.model, "train_test"), "NetParameter")
        if args.synthetic:
            param = with_synthetic_data(param, count=256)
        net = Net(param, "TRAIN")
        for nodes in args.nodes:
            costs = plan(net, nodes, comm=args.comm, workers=args.workers, global_batch=not args.batch_per_node)
            print(format_plan(costs, nodes, comm=args.comm))
            print()
        return 0
    except MinicaffeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
