"""``ckpt plan --sweep``: predicted peak against recompute share over the min-cut front,
so a user can pick a budget by looking (as PyTorch's ``visualize_memory_budget_pareto``).

Each corner of the price sweep is rewritten and simulated (the real cost model): a
point's tensor peak and what ORT would hold (``--budget`` judges by that); corners that
another point beats on both peak and recompute are marked as not on the front, and the
default's rule marks the knee (``knee.py``).
"""

from __future__ import annotations

from typing import Any, Callable

from ..analysis import Analysis
from .evaluate import Rewritten, cost_of
from .knee import Point, knee_index
from .mincut import MAX_SOLVES, build, front, to_plan
from .plan import Plan, Policy

SWEEP_SOLVES_LARGE = 16
# A plan whose peak is within this of another's and recomputes more is not on the front:
# a few hundred bytes of peak are not worth any recompute.
SAME_PEAK = 0.005


def _dominates(q: dict[str, Any], p: dict[str, Any]) -> bool:
    if q is p:
        return False
    near = q["peak_bytes"] <= p["peak_bytes"] * (1 + SAME_PEAK)
    return bool((near and q["recompute_flops"] < p["recompute_flops"]) or (
        q["peak_bytes"] < p["peak_bytes"] and q["recompute_flops"] <= p["recompute_flops"]))


def sweep_points(a: Analysis, rewritten: Callable[[Plan], Rewritten], policy: Policy = Policy()) -> list[dict[str, Any]]:
    """One point per corner (plus the original, reordered), least recompute first.
    ``rewritten``: a plan's (unpinned) rewrite, as the searches judge it. A point's peak is
    the peak the default's knee is drawn in (tensors and kernel scratch); its
    ``ort_peak_bytes`` what a ``--budget`` would be judged by."""
    step_flops = max(1, a.forward_flops + a.backward_flops)
    points: list[dict[str, Any]] = []
    from .strategies import LARGE_GRAPH_NODES

    # every corner is a rewrite of the whole graph: fewer of them on large graphs
    solves = MAX_SOLVES if len(a.graph.nodes) <= LARGE_GRAPH_NODES else SWEEP_SOLVES_LARGE
    cuts = [None] + front(build(a, policy), solves)
    for cut in cuts:
        plan = Plan([], "none") if cut is None else to_plan(a, cut, "sweep")
        result = rewritten(plan)
        cost = cost_of(result)
        points.append({"price_flops_per_byte": None if cut is None else cut.price,
                       "kept_bytes": a.stashed_bytes if cut is None else cut.kept_bytes,
                       "peak_bytes": cost.peak_bytes, "ort_peak_bytes": result.after.ort_peak_bytes,
                       "recompute_flops": cost.recompute_flops,
                       "recompute_share": cost.recompute_flops / step_flops, "regions": len(plan.regions)})
    for p in points:
        p["pareto"] = not any(_dominates(q, p) for q in points)
    unique: dict[tuple[int, int], dict[str, Any]] = {}
    for p in points:
        unique.setdefault((p["peak_bytes"], p["recompute_flops"]), p)
    points = sorted(unique.values(), key=lambda p: (p["recompute_flops"], p["peak_bytes"]))
    knee = knee_index([Point(p["peak_bytes"], p["recompute_flops"]) for p in points], a.working_peak_bytes,
                      step_flops)
    for i, p in enumerate(points):
        p["knee"] = i == knee
    return points
