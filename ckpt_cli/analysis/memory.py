"""A liveness simulation that predicts peak memory for a node order.

A tensor's buffer lives from its producer until its last consumer in the order; graph
outputs live to the end; graph inputs and initializers are resident throughout.
View-like ops alias their input's buffer instead of allocating one.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..graph import ABSENT, Graph
from .shapes import TensorInfo

VIEW_OPS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"})


@dataclass(frozen=True)
class MemoryProfile:
    """Result of one simulation. Byte counts include the resident bytes."""

    order: tuple[int, ...]
    peak_bytes: int
    peak_step: int  # position in ``order``
    resident_bytes: int
    timeline: tuple[int, ...]  # bytes in use after each step, resident included
    live_at_peak: tuple[str, ...]  # buffers (by producing tensor) live at the peak, largest first
    unsized: tuple[str, ...]  # tensors of unknown size, counted as 0

    @property
    def activation_peak_bytes(self) -> int:
        return self.peak_bytes - self.resident_bytes


def buffer_roots(graph: Graph) -> dict[str, str]:
    """Map each tensor to the tensor whose buffer it uses (itself unless a view)."""
    roots: dict[str, str] = {}
    for i in graph.topological_order():  # a view's source may come later in an unsorted file
        node = graph.nodes[i]
        for t in node.outputs:
            if t == ABSENT:
                continue
            if node.op_type in VIEW_OPS and node.inputs and node.inputs[0] != ABSENT:
                src = node.inputs[0]
                roots[t] = roots.get(src, src)
            else:
                roots[t] = t
    return roots


def resident_bytes(graph: Graph, tensors: dict[str, TensorInfo]) -> int:
    return sum((tensors[t].nbytes or 0) for t in graph.resident if t in tensors)


def simulate(graph: Graph, order: list[int], tensors: dict[str, TensorInfo],
             roots: dict[str, str] | None = None) -> MemoryProfile:
    """Predict the bytes in use after each node of ``order`` and the peak."""
    roots = roots if roots is not None else buffer_roots(graph)
    resident = set(graph.resident)
    steps = len(order)
    last_use: dict[str, int] = {}
    born: dict[str, int] = {}
    unsized: list[str] = []
    for k, i in enumerate(order):
        node = graph.nodes[i]
        for t in node.outputs:
            if t == ABSENT:
                continue
            root = roots.get(t, t)
            if root == t:
                born[t] = k
            if root not in resident:
                last_use[root] = max(last_use.get(root, k), k)
        for t in node.inputs:
            root = roots.get(t, t)
            if root in born:
                last_use[root] = max(last_use.get(root, k), k)
    for t in graph.outputs:
        root = roots.get(t, t)
        if root in born:
            last_use[root] = steps

    alloc = [0] * (steps + 1)
    free = [0] * (steps + 1)
    for root, k in born.items():
        info = tensors.get(root)
        size = info.nbytes if info is not None and info.nbytes is not None else 0
        if info is None or info.nbytes is None:
            unsized.append(root)
        alloc[k] += size
        free[last_use.get(root, k)] += size

    base = resident_bytes(graph, tensors)
    live = base
    timeline: list[int] = []
    peak, peak_step = base, 0
    for k in range(steps):
        live += alloc[k]
        timeline.append(live)
        if live > peak:
            peak, peak_step = live, k
        live -= free[k]

    at_peak = sorted(
        (r for r, b in born.items() if b <= peak_step <= last_use.get(r, b)),
        key=lambda r: -(tensors[r].nbytes or 0) if r in tensors else 0)
    return MemoryProfile(tuple(order), peak, peak_step, base, tuple(timeline), tuple(at_peak), tuple(unsized))
