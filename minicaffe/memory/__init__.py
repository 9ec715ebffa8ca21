"""The memory arena: plan when each buffer of a net is live, place them in one allocation.

    from minicaffe.memory import plan_memory, report_text
    plan = plan_memory(net)                  # every blob, scratch array and parameter now in one arena
    print(report_text([("my net", plan)]))   # bytes per category, naive vs planned, peak

See lifetimes.py (the schedule and the rules), planner.py (placement, poison), flat.py (flat
parameter vectors), report.py (the report), and docs/PARALLEL.md.
"""

from .flat import ParamLayout, attach_history
from .lifetimes import Buffer, net_buffers
from .planner import (
    Arena,
    NetPlan,
    TrainingPlan,
    dry_run,
    history_buffers,
    peak_bytes,
    place,
    plan_memory,
    plan_net,
    plan_solver,
    plan_training,
)
from .report import report_text

__all__ = [
    "plan_memory",
    "plan_net",
    "NetPlan",
    "Arena",
    "Buffer",
    "place",
    "peak_bytes",
    "dry_run",
    "net_buffers",
    "ParamLayout",
    "attach_history",
    "history_buffers",
    "plan_solver",
    "plan_training",
    "TrainingPlan",
    "report_text",
]
