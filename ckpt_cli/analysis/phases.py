"""Forward / backward classification of a training graph's nodes.

Forward is every ancestor of a forward output (the loss, and other non-gradient
outputs such as BatchNorm running statistics), plus forward-only computations that
the exporter wrote inside the forward pass; backward is everything else. This needs
no marker in the file, which PyTorch joint graphs exported to ONNX lack.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import ModelError, UsageError
from ..graph import Graph
from ..markers import PHASE_META, is_recompute_copy

FORWARD = "forward"
BACKWARD = "backward"

# PyTorch exports: "<param>_grad"; ORT artifacts: "<param>_grad.accumulation.out".
_GRAD_NAME = re.compile(r"(^|[._/:\-])grad(s|ient|ients)?($|[._/:\-\d])|_grad", re.IGNORECASE)
_LOSS_NAME = re.compile(r"loss", re.IGNORECASE)
_ORT_BACKWARD_DOC = "Backward pass"


@dataclass(frozen=True)
class Phases:
    """The phase of every node (by file index) and the outputs that decided it."""

    is_forward: tuple[bool, ...]
    loss: str
    forward_outputs: tuple[str, ...]
    grad_outputs: tuple[str, ...]

    def phase(self, index: int) -> str:
        return FORWARD if self.is_forward[index] else BACKWARD

    @property
    def forward_count(self) -> int:
        return sum(self.is_forward)

    @property
    def backward_count(self) -> int:
        return len(self.is_forward) - self.forward_count


def is_gradient_name(name: str) -> bool:
    return bool(_GRAD_NAME.search(name))


def classify(graph: Graph, loss: str | None = None, grad_outputs: list[str] | None = None) -> Phases:
    """Split the graph into forward and backward nodes.

    ``loss`` and ``grad_outputs`` override the name-based detection. Raises
    :class:`ModelError` when the graph has no backward part.
    """
    outputs = set(graph.outputs)
    for name in ([loss] if loss else []) + list(grad_outputs or []):
        if name not in outputs:
            raise UsageError(f"'{name}' is not an output of the graph "
                             f"(outputs: {', '.join(graph.outputs[:6])}{', ...' if len(graph.outputs) > 6 else ''})")
    if grad_outputs:
        named = set(grad_outputs)
        grads = [o for o in graph.outputs if o in named]
    else:
        grads = [o for o in graph.outputs if is_gradient_name(o) and o != loss]
    grad_set = set(grads)
    forward_outputs = [o for o in graph.outputs if o not in grad_set]
    if not forward_outputs:
        raise ModelError("every graph output looks like a gradient, so the loss is unknown; "
                         "name it with --loss")
    if loss is None:
        loss = next((o for o in forward_outputs if _LOSS_NAME.search(o)), forward_outputs[0])

    is_forward = [False] * len(graph.nodes)
    preds = graph.preds
    stack = [graph.producer[o] for o in forward_outputs if o in graph.producer]
    while stack:
        i = stack.pop()
        if is_forward[i]:
            continue
        is_forward[i] = True
        stack.extend(j for j in preds[i] if not is_forward[j])

    _forward_section_nodes(graph, is_forward)
    phases = Phases(tuple(is_forward), loss, tuple(forward_outputs), tuple(grads))
    if phases.backward_count == 0:
        raise ModelError("the graph has no backward part: every node feeds the forward outputs "
                         f"({', '.join(forward_outputs[:4])}); is this an inference model?")
    if phases.forward_count == 0:
        raise ModelError(f"no node computes the forward outputs ({', '.join(forward_outputs[:4])})")
    return phases


def _forward_section_nodes(graph: Graph, is_forward: list[bool]) -> None:
    """Mark forward the nodes an exporter wrote among the forward pass: before the first
    node that depends on a backward-only graph input (the loss-gradient seed), reading
    only forward tensors. PyTorch tags such nodes forward (BatchNorm statistics
    squeezes, max-pool index arithmetic): forward ops whose results only the backward
    reads. Nodes an ORT artifact marks "Backward pass" are never moved."""
    forward_reads = {t for n in graph.nodes if is_forward[n.index] for t in n.reads}
    seeds = {t for t in graph.inputs if t not in forward_reads}
    # No seed input: the loss-gradient seed is computed in the graph (a Constant 1.0 or the
    # like), so backward nodes that read nothing mark where the backward starts.
    sources = set() if seeds else {n.index for n in graph.nodes if not is_forward[n.index] and not any(n.reads)}
    depends = [False] * len(graph.nodes)
    cut = len(graph.nodes)
    preds = graph.preds
    for i in graph.topological_order():
        node = graph.nodes[i]
        if is_forward[i]:
            continue
        # set and map in C: one pass over every backward node of the graph
        depends[i] = (i in sources or not seeds.isdisjoint(node.reads)
                      or any(map(depends.__getitem__, preds[i])))
        if depends[i]:
            cut = min(cut, i)
    for i in graph.topological_order():
        node = graph.nodes[i]
        if (is_forward[i] or i >= cut or is_recompute_copy(node) or node.meta(PHASE_META) == BACKWARD
                or node.proto.doc_string == _ORT_BACKWARD_DOC):
            continue
        if all(is_forward[p] for p in preds[i]):
            is_forward[i] = True
