"""Forward / backward classification of a training graph's nodes.

Forward is every ancestor of a forward output (the loss, and other non-gradient
outputs such as BatchNorm running statistics); backward is everything else. This
needs no marker in the file, which PyTorch joint graphs exported to ONNX lack.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import ModelError, UsageError
from ..graph import Graph

FORWARD = "forward"
BACKWARD = "backward"

# PyTorch exports: "<param>_grad"; ORT artifacts: "<param>_grad.accumulation.out".
_GRAD_NAME = re.compile(r"(^|[._/:\-])grad(s|ient|ients)?($|[._/:\-\d])|_grad", re.IGNORECASE)
_LOSS_NAME = re.compile(r"loss", re.IGNORECASE)


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
    for name in ([loss] if loss else []) + list(grad_outputs or []):
        if name not in graph.outputs:
            raise UsageError(f"'{name}' is not an output of the graph "
                             f"(outputs: {', '.join(graph.outputs[:6])}{', ...' if len(graph.outputs) > 6 else ''})")
    if grad_outputs:
        grads = [o for o in graph.outputs if o in set(grad_outputs)]
    else:
        grads = [o for o in graph.outputs if is_gradient_name(o) and o != loss]
    forward_outputs = [o for o in graph.outputs if o not in set(grads)]
    if not forward_outputs:
        raise ModelError("every graph output looks like a gradient, so the loss is unknown; "
                         "name it with --loss")
    if loss is None:
        loss = next((o for o in forward_outputs if _LOSS_NAME.search(o)), forward_outputs[0])

    is_forward = [False] * len(graph.nodes)
    stack = [graph.producer[o] for o in forward_outputs if o in graph.producer]
    while stack:
        i = stack.pop()
        if is_forward[i]:
            continue
        is_forward[i] = True
        stack.extend(j for j in graph.predecessors(graph.nodes[i]) if not is_forward[j])

    phases = Phases(tuple(is_forward), loss, tuple(forward_outputs), tuple(grads))
    if phases.backward_count == 0:
        raise ModelError("the graph has no backward part: every node feeds the forward outputs "
                         f"({', '.join(forward_outputs[:4])}); is this an inference model?")
    if phases.forward_count == 0:
        raise ModelError(f"no node computes the forward outputs ({', '.join(forward_outputs[:4])})")
    return phases
