"""Why each stashed activation of the original is kept or recomputed under a plan."""

from __future__ import annotations

from ..analysis import Analysis
from ..ops import EXPENSIVE_OPS, RANDOM_OPS, is_recomputable
from .plan import Plan



def explain(a: Analysis, plan: Plan, recomputed: set[str]) -> list[dict]:
    """One row per stashed buffer of the original, largest first: ``kept`` or
    ``recomputed``, its bytes, what recomputing it costs, and why.

    ``recomputed`` is the set of tensors the rewrite really recomputes under ``plan``.
    """
    g = a.graph
    region_of = {i: r for r in plan.regions for i in r.nodes}
    # by buffer: a view another region reads keeps the buffer under it
    region_inputs = {a.roots.get(t, t) for r in plan.regions for i in r.nodes for t in g.nodes[i].inputs
                     if t in g.producer and region_of.get(g.producer[t]) is not r}
    rows: dict[str, dict] = {}
    for s in a.stashed:
        if s.buffer in rows:
            continue
        node = g.nodes[s.producer]
        info = a.tensors.get(s.buffer)
        nbytes = info.nbytes if info is not None else None
        flops = a.costs[g.producer[s.buffer]].flops if s.buffer in g.producer else 0
        region = region_of.get(s.producer)
        done = s.buffer in recomputed
        if done:
            why = "recomputed from the region's kept inputs"
        elif not plan.regions:
            why = "no recompute needed: the original already fits"
        elif plan.tensor_level and is_recomputable(node):
            why = "min cut: recomputing it (and the inputs it needs) costs more than its bytes are worth here"
        elif region is None:
            why = "outside every region"
        elif node.op_type in RANDOM_OPS:
            why = "random op: a recompute would draw different numbers"
        elif node.has_subgraph:
            why = "node with a subgraph (If/Loop/Scan) is never recomputed"
        elif not is_recomputable(node):
            why = f"{node.domain} op {node.op_type} is not known to be deterministic: never recomputed"
        elif s.buffer in region_inputs:
            why = "region boundary: another region recomputes from it (checkpoint)"
        elif s.buffer in region.keep and plan.strategy == "balanced" and node.op_type in EXPENSIVE_OPS:
            why = "compute-bound output (balanced policy keeps these)"
        elif s.buffer in region.keep and plan.strategy in ("budget", "optimal"):
            why = (f"the budget has room for it (recomputing costs {flops / nbytes:.1f} FLOP per byte)"
                   if nbytes else "kept within the budget")
        elif s.buffer in region.keep:
            why = "kept by the plan"
        else:
            why = "not needed by the backward after the rewrite"
        rows[s.buffer] = {
            "tensor": s.buffer,
            "status": "recomputed" if done else "kept",
            "bytes": nbytes,
            "recompute_flops": flops,
            "producer_op": node.op_type,
            "region": region.name if region is not None else None,
            "why": why,
        }
    return sorted(rows.values(), key=lambda r: (-(r["bytes"] or 0), r["tensor"]))
