"""The floor of every plan: a peak no execution order or recompute plan goes below.

Two facts bound it from below, whatever ckpt recomputes:
- the graph's inputs and initializers are held for the whole run, and its outputs (loss,
  gradients) from when they are made to its end, so all of them at its last step;
- a kernel runs with its inputs and outputs allocated at once (ORT frees an input after the
  node that reads it last, and writes an output into an input's buffer only for a view or
  an op whose kernel says ``MayInplace(0, 0)``). A node that feeds a graph output runs in
  every plan, as itself or as a recompute copy reading and writing tensors of its sizes,
  so the largest such working set, beside the resident tensors, is a floor too. A kernel
  that holds working memory outside ORT's buffers (``ort.scratch``: a LayerNormalizationGrad,
  a GRUGrad, a ConvGrad's columns) holds it then as well.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..graph import ABSENT, Graph, Node
from ..ops import IN_PLACE_OPS, SHAPE_ONLY_OPS
from ..ort.scratch import scratch_bytes
from .shapes import TensorInfo, sized_by


@dataclass(frozen=True)
class Floor:
    """The floor and the node whose working set sets it (None: the resident bytes and
    outputs set it)."""

    bytes: int
    resident_bytes: int
    output_bytes: int
    node: str | None = None
    working_bytes: int = 0  # the node's inputs and outputs, outside the resident tensors
    scratch_bytes: int = 0  # its kernel's working memory outside ORT's buffers


def _live_nodes(graph: Graph) -> list[int]:
    """The nodes a graph output depends on: every plan runs them (or their copies)."""
    return sorted(graph.ancestors(graph.outputs))


def _working_buffers(node: Node, roots: dict[str, str], resident: set[str]) -> set[str]:
    """The buffers a node holds while it runs, outside the resident tensors: a view's
    output is its input's buffer, an in-place op's output 0 may be its input 0's."""
    owned = {roots.get(t, t) for t in node.inputs if t != ABSENT}
    first = roots.get(node.inputs[0], node.inputs[0]) if node.inputs and node.inputs[0] != ABSENT else None
    if node.op_type in IN_PLACE_OPS and node.outputs and first is not None and first not in resident:
        outputs = node.outputs[1:]  # output 0 may take input 0's buffer (a resident one never)
    else:
        outputs = node.outputs
    owned |= {roots.get(t, t) for t in outputs if t != ABSENT}
    return owned - resident


def plan_floor(graph: Graph, tensors: dict[str, TensorInfo], roots: dict[str, str], resident_bytes: int,
               output_bytes: int) -> Floor:
    """The higher of the two floors (module docstring). Sizes unknown count as 0, so the
    floor stays a floor."""
    sized = sized_by(tensors)

    resident = set(graph.resident)
    best: Floor = Floor(resident_bytes + output_bytes, resident_bytes, output_bytes)
    for k in _live_nodes(graph):
        node = graph.nodes[k]
        if node.op_type in SHAPE_ONLY_OPS:
            continue  # ORT folds or hoists a shape read; the tensor need not be live for it
        working = sum(tensors[b].nbytes or 0 for b in _working_buffers(node, roots, resident) if b in tensors)
        scratch = scratch_bytes(node, sized, graph.int_constant)
        if resident_bytes + working + scratch > best.bytes:
            best = Floor(resident_bytes + working + scratch, resident_bytes, output_bytes, node.name, working,
                         scratch)
    return best
