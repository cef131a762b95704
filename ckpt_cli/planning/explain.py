"""Why each stashed activation of the original is kept or recomputed under a plan: the
decisions as their makers recorded them, one row per stashed buffer."""

from __future__ import annotations

from typing import Any, Mapping

from ..analysis import Analysis
from .decision import RECOMPUTE, Decision
from .plan import Plan


def explain(a: Analysis, plan: Plan, decisions: Mapping[str, Decision]) -> list[dict[str, Any]]:
    """One row per decision, largest first: ``kept`` or ``recomputed``, its bytes, what
    recomputing it costs, the reason's code and text. ``decisions``: the rewrite's final
    ones (``RewriteResult.decisions``)."""
    g = a.graph
    region_of = {i: r.name for r in plan.regions for i in r.nodes}
    rows = []
    for t, d in decisions.items():
        node = g.producer.get(t)  # the buffer's own node (a stashed view's reason is its buffer's)
        rows.append({
            "tensor": t,
            "status": "recomputed" if d.action == RECOMPUTE else "kept",
            "bytes": d.bytes,
            "recompute_flops": d.flops,
            "producer_op": g.nodes[node].op_type if node is not None else None,
            "region": region_of.get(node) if node is not None else None,
            "reason": d.reason.code,
            "why": d.reason.text,
        })
    return sorted(rows, key=lambda r: (-(r["bytes"] or 0), r["tensor"]))
