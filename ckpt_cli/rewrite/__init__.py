"""The rewrite stage: ``Analysis + Plan -> RewriteResult`` (a new graph in its executed order)."""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from ..analysis import Analysis, analyse
from ..analysis.memory import buffer_roots, simulate
from ..analysis.phases import BACKWARD, PHASE_META
from ..graph import Graph
from ..planning.plan import Plan
from .order import executed_order, interleave, memory_aware, prune_dead
from .recompute import (CSE_GUARD_ATTR, RANDOM_OPS, REGION_META, SUFFIX, RegionResult,
                        drop_unused_optional_outputs, plan_recompute, rewire_backward)


@dataclass
class RewriteResult:
    graph: Graph  # nodes in the written (= executed) order
    after: Analysis
    regions: list[RegionResult]
    recompute_nodes: int
    recompute_flops: int


def rewrite(a: Analysis, plan: Plan | None) -> RewriteResult:
    """Apply ``plan`` to the analysed graph; ``plan=None`` only reorders (``--no-recompute``)."""
    g = a.graph
    order = a.priority.order
    if plan is None or not plan.regions:
        protos = [g.nodes[i].proto for i in order]
        regions: list[RegionResult] = []
        tensors = a.tensors
        copy_names: set[str] = set()
    else:
        rec = plan_recompute(a, plan)
        rewired = rewire_backward(a, rec.renamed)
        position = {i: k for k, i in enumerate(i for i in order if not a.phases.is_forward[i])}
        forward = [rewired[i] for i in order if a.phases.is_forward[i]]
        backward = [rewired[i] for i in order if not a.phases.is_forward[i]]
        blocks = []
        for r, block in enumerate(rec.blocks):
            recomputed = {rec.renamed[t] for t in rec.regions[r].recomputed}
            readers = [position[c] for t in rec.regions[r].recomputed for c in g.consumers.get(t, ())
                       if c in position and recomputed.intersection(rewired[c].input)]
            if block and readers:
                first = min(readers)
                blocks.append((first, [rec.copies[i] for i in block]))
                rec.regions[r].placed_before = backward[first].name
        protos = interleave(forward, backward, blocks)
        regions, tensors = rec.regions, rec.tensors
        copy_names = {p.name for p in rec.copies.values()}

    protos = prune_dead(protos, set(g.outputs))
    new = g.with_nodes(protos)
    drop_unused_optional_outputs(new, copy_names)
    new = g.with_nodes([n.proto for n in new.nodes])
    forward_names = {n.name for n in g.nodes if a.phases.is_forward[n.index]}
    sizes = {t: info.nbytes for t, info in tensors.items() if info.nbytes}
    order = memory_aware(new, sizes, buffer_roots(new), [n.name not in forward_names for n in new.nodes],
                         [n.name in copy_names for n in new.nodes])
    # The memory-aware order is a heuristic: keep it only when the simulation says it
    # beats the plain order (forward, then backward with the blocks in place).
    candidates = [executed_order(g.with_nodes([new.nodes[i].proto for i in order])), executed_order(new)]
    new = min(candidates, key=lambda c: simulate(c, list(range(len(c.nodes))), tensors).peak_bytes)
    new = _mark_early_backward(new, forward_names)
    after = analyse(new, loss=a.phases.loss, grad_outputs=list(a.phases.grad_outputs), tensors=tensors)
    copies = [n for n in new.nodes if n.name in copy_names]
    return RewriteResult(new, after, regions, len(copies), sum(after.costs[n.index].flops for n in copies))


def _mark_early_backward(graph: Graph, forward_names: set[str]) -> Graph:
    """Tag backward nodes written before the last forward node (the memory-aware order
    runs some early), so that analysing the written file classifies them the same."""
    last_forward = max((n.index for n in graph.nodes if n.name in forward_names), default=-1)
    protos = []
    changed = False
    for n in graph.nodes:
        p = n.proto
        if n.index < last_forward and n.name not in forward_names and n.meta(PHASE_META) != BACKWARD:
            p = onnx.NodeProto()
            p.CopyFrom(n.proto)  # the input graph's protos are never modified
            entry = p.metadata_props.add()
            entry.key, entry.value = PHASE_META, BACKWARD
            changed = True
        protos.append(p)
    return graph.with_nodes(protos) if changed else graph


__all__ = ["rewrite", "RewriteResult", "RegionResult", "CSE_GUARD_ATTR", "RANDOM_OPS", "REGION_META", "SUFFIX"]
