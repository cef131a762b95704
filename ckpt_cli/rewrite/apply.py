"""The surgery of a rewrite: a plan applied to the analysed graph, before any choice of
order or session setting.

1. Copy each region's recomputed nodes (``plan_recompute``) and rewire the backward to
   read the copies (``rewire_backward``).
2. Place each region's copies right before the first backward node that reads them
   (``interleave``), and its second copies (``twice.py``) before their late readers, the
   forward and backward otherwise in the input's executed order.
3. Drop the nodes nothing needs any more and the optional outputs no one reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..analysis import Analysis
from ..analysis.shapes import TensorInfo
from ..graph import Graph, Node
from ..planning.plan import Plan
from .order import interleave, prune_dead
from .recompute import Recompute, RegionResult, drop_unused_optional_outputs, plan_recompute, rewire_backward
from .twice import NONE, Twice, second_copies


@dataclass(frozen=True)
class Surgery:
    """The rewritten graph before its order is chosen: nodes, the regions' results, the
    tensors (the copies' included), the copies' names, and the plan's recompute record."""

    graph: Graph
    regions: list[RegionResult]
    tensors: dict[str, TensorInfo]
    copy_names: frozenset[str]
    recompute: Recompute | None  # None: a reorder-only rewrite
    twice: Twice = NONE  # the second copies (``twice.py``)

    def copy_sources(self) -> dict[str, int]:
        """Each copy's name -> the index of the input node it copies."""
        if self.recompute is None:
            return {}
        late = {p.name: i for block in self.twice.blocks for i, p in zip(block.sources, block.copies)}
        return {p.name: i for i, p in self.recompute.copies.items()} | late


def apply_plan(a: Analysis, plan: Plan | None) -> Surgery:
    """``plan`` applied to ``a.graph``; ``None`` or an empty plan only reorders."""
    g = a.graph
    if plan is None or not plan.regions:
        return _pruned(a, [g.nodes[i] for i in a.priority.order], [], a.tensors, frozenset(), None)
    rec = plan_recompute(a, plan)
    twice = second_copies(a, plan, rec)
    # Indexed nodes rather than protos from here on: reading protos back is slow.
    rewired = [n if p is n.proto else Node.from_proto(n.index, p)
               for n, p in zip(g.nodes, rewire_backward(a, rec.renamed, twice.rewired))]
    copies = {i: Node.from_proto(i, p) for i, p in rec.copies.items()}
    order = a.priority.order
    forward = [rewired[i] for i in order if a.phases.is_forward[i]]
    backward = [rewired[i] for i in order if not a.phases.is_forward[i]]
    blocks = _placed_blocks(a, rec, rewired, copies, backward) + _late_blocks(g, rec, twice, backward)
    names = frozenset(n.name for n in copies.values()) | {p.name for block in twice.blocks for p in block.copies}
    return _pruned(a, interleave(forward, backward, blocks), rec.regions, rec.tensors | twice.tensors, names,
                   rec, twice)


def _placed_blocks(a: Analysis, rec: Recompute, rewired: list[Node], copies: dict[int, Node],
                   backward: list[Node]) -> list[tuple[int, list[Node]]]:
    """Each region's copies and the backward position they go before (its first reader);
    records that reader on the region's result."""
    g = a.graph
    position = {node.index: k for k, node in enumerate(backward)}
    blocks = []
    for r, block in enumerate(rec.blocks):
        recomputed = {rec.renamed[t] for t in rec.regions[r].recomputed}
        readers = [position[c] for t in rec.regions[r].recomputed for c in g.consumers.get(t, ())
                   if c in position and recomputed.intersection(rewired[c].inputs)]
        if block and readers:
            first = min(readers)
            blocks.append((first, [copies[i] for i in block]))
            rec.regions[r].placed_before = backward[first].name
    return blocks


def _late_blocks(g: Graph, rec: Recompute, twice: Twice, backward: list[Node]) -> list[tuple[int, list[Node]]]:
    """Each late block of second copies and the backward position it goes before (after
    the first blocks placed there: ``interleave`` keeps the order of equal positions);
    records them on their region's result."""
    out = []
    for block in twice.blocks:
        out.append((block.position, [Node.from_proto(i, p) for i, p in zip(block.sources, block.copies)]))
        result = rec.regions[block.region]
        result.copies.extend(g.nodes[i].name for i in block.sources)
        result.twice.extend((t, backward[block.position].name) for t in block.tensors)
    return out


def _pruned(a: Analysis, nodes: list[Node], regions: list[RegionResult], tensors: dict[str, TensorInfo],
            copy_names: frozenset[str], rec: Recompute | None, twice: Twice = NONE) -> Surgery:
    g = a.graph
    new = g.with_node_list(prune_dead(nodes, set(g.outputs)))
    changed = drop_unused_optional_outputs(new, set(copy_names))
    if changed:
        new = new.replaced({i: new.nodes[i].proto for i in changed})
    return Surgery(new, regions, tensors, copy_names, rec, twice)
