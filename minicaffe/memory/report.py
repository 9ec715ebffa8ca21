"""The memory report: bytes per category, one allocation per buffer (naive) vs the plan.

    from minicaffe.memory.report import report_text
    print(report_text([("LeNet", plan)]))

``python -m minicaffe.memory lenet [--workers N] [--recompute]`` prints it for a net of nets/.
"""

import resource
import sys

CATEGORIES = (
    "params",
    "param diffs",
    "solver history",
    "activations",
    "activation diffs",
    "layer scratch",
    "worker gradients",
)
MiB = 1024.0 * 1024.0


def mib(n):
    return f"{n / MiB:9.2f}"


def process_peak_rss():
    """The process's peak resident set size in bytes (ru_maxrss: KiB on Linux, bytes on macOS)."""
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r if sys.platform == "darwin" else r * 1024


def summarize(plans):
    """{category: naive bytes}, planned bytes, peak bytes, unplanned bytes over ``plans``
    (a list of (label, NetPlan) whose sections together make the arena)."""
    cats = {}
    for _, plan in plans:
        for cat, (_, nbytes) in plan.by_category().items():
            cats[cat] = cats.get(cat, 0) + nbytes
    return {
        "categories": cats,
        "naive": sum(p.naive for _, p in plans),
        "planned": sum(p.size for _, p in plans),
        "peak": sum(p.peak for _, p in plans),
        "unplanned": sum(p.unplanned for _, p in plans),
    }


def report_text(plans, title="memory", naive_override=None):
    """A table: per category the naive bytes; then naive total, planned arena, peak, ratio."""
    s = summarize(plans)
    naive = s["naive"] if naive_override is None else naive_override
    lines = [f"{title}: bytes per category (MiB)", f"  {'category':22s} {'naive':>9s}"]
    order = [c for c in CATEGORIES if c in s["categories"]] + sorted(c for c in s["categories"] if c not in CATEGORIES)
    for cat in order:
        lines.append(f"  {cat:22s} {mib(s['categories'][cat])}")
    lines.append(f"  {'naive total':22s} {mib(naive)}   (one allocation per buffer)")
    lines.append(f"  {'planned arena':22s} {mib(s['planned'])}   ({s['planned'] / max(naive, 1):.2f} x naive)")
    lines.append(
        f"  {'peak live':22s} {mib(s['peak'])}   (the most bytes live at one step: a lower bound for any plan)"
    )
    lines.append(
        f"  {'layer internals':22s} {mib(s['unplanned'])}   (kept by layers, not planned: "
        f"e.g. SoftmaxWithLoss's probabilities)"
    )
    lines.append(f"  {'process peak RSS':22s} {mib(process_peak_rss())}   (Python, numpy, numba and all)")
    if len(plans) > 1:
        lines.append("  sections: " + ", ".join(f"{label} {p.size / MiB:.2f}" for label, p in plans))
    return "\n".join(lines)
