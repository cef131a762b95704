"""A liveness simulation that predicts peak memory for a node order, the way ONNX
Runtime's allocation planner places buffers (measured on ORT 1.31 CPU, see
``ckpt_cli/runtime/worker.py`` and ORT_FACTS.md):

- a value lives from its producer until its last reader in the order; graph outputs
  live to the end; graph inputs and initializers are resident throughout;
- view-like ops (Reshape, Squeeze, Unsqueeze, Flatten, Identity) alias their input;
- unary activations and same-type Cast write in place into an input that dies there;
- a new output takes the most recently freed buffer of the same shape and element
  size, and that buffer stays allocated in between: reuse can raise the peak above
  naive liveness, and the simulation reproduces it;
- graph outputs always get a fresh buffer.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..graph import ABSENT, Graph
from .shapes import TensorInfo, itemsize

VIEW_OPS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"})
IN_PLACE_OPS = frozenset({"Relu", "LeakyRelu", "Elu", "Selu", "Celu", "Sigmoid", "HardSigmoid", "Tanh",
                          "Softplus", "Softsign", "Clip", "Shrink", "ThresholdedRelu", "Softmax",
                          "LogSoftmax", "Cast"})


@dataclass(frozen=True)
class MemoryProfile:
    """Result of one simulation. Byte counts include the resident bytes."""

    order: tuple[int, ...]
    peak_bytes: int
    peak_step: int  # position in ``order``
    resident_bytes: int
    timeline: tuple[int, ...]  # bytes in use after each step, resident included
    live_at_peak: tuple[str, ...]  # tensors holding the buffers live at the peak, largest first
    unsized: tuple[str, ...]  # tensors of unknown size, counted as 0
    # One entry per buffer: (size, first step, last step). A buffer is allocated when the
    # node at its first step runs and released after the node at its last step (``len(order)``
    # for graph outputs). Buffer ids (positions) follow allocation order. This is the
    # request sequence an allocator sees, for models of the arena on top of it.
    buffers: tuple[tuple[int, int, int], ...] = ()

    @property
    def activation_peak_bytes(self) -> int:
        return self.peak_bytes - self.resident_bytes


def buffer_roots(graph: Graph) -> dict[str, str]:
    """Map each tensor to the tensor whose buffer it uses through views (itself if none).
    This is the order-independent part of buffer sharing."""
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


def _reuse_key(info: TensorInfo | None):
    if info is None or info.shape is None or not info.shape or not all(isinstance(d, int) for d in info.shape):
        return None
    return (info.shape, itemsize(info.dtype))


def simulate(graph: Graph, order: list[int] | tuple[int, ...], tensors: dict[str, TensorInfo],
             roots: dict[str, str] | None = None) -> MemoryProfile:
    """Predict the bytes in use after each node of ``order`` and the peak."""
    del roots  # buffer sharing depends on the order here; kept for API compatibility
    resident = set(graph.resident)
    outputs = set(graph.outputs)
    steps = len(order)

    last_read: dict[str, int] = {}
    readers: dict[str, int] = {}
    for k, i in enumerate(order):
        for t in graph.nodes[i].inputs:
            if t != ABSENT:
                last_read[t] = k
                readers[t] = readers.get(t, 0) + 1
    for t in outputs:
        last_read[t] = steps

    buffer_of: dict[str, int] = {}  # tensor -> buffer id
    owner: list[str] = []  # buffer id -> first tensor that owned it
    size: list[int] = []
    born: list[int] = []
    dies: list[int] = []  # step after which the buffer is released
    pending: list[int] = []  # values in the buffer not yet dead
    free_lists: dict[tuple, list[int]] = {}
    holders: list[list[tuple[int, str]]] = []  # buffer id -> (step, tensor) assignments
    unsized: list[str] = []

    def new_buffer(t: str, k: int) -> int:
        info = tensors.get(t)
        if info is None or info.nbytes is None:
            unsized.append(t)
        owner.append(t)
        size.append(info.nbytes if info is not None and info.nbytes is not None else 0)
        born.append(k)
        dies.append(k)
        pending.append(0)
        holders.append([])
        return len(owner) - 1

    for k, i in enumerate(order):
        node = graph.nodes[i]
        for pos, t in enumerate(node.outputs):
            if t == ABSENT:
                continue
            src = node.inputs[0] if node.inputs else ABSENT
            src_buf = buffer_of.get(src)
            if t in outputs or t not in last_read:  # measured: unread outputs never reuse a buffer
                b = new_buffer(t, k)
            elif pos == 0 and node.op_type in VIEW_OPS and src_buf is not None:
                b = src_buf
            elif (pos == 0 and node.op_type in IN_PLACE_OPS and src_buf is not None and readers.get(src) == 1
                  and pending[src_buf] == 1
                  and last_read.get(src) == k and _reuse_key(tensors.get(src)) == _reuse_key(tensors.get(t))
                  and _reuse_key(tensors.get(t)) is not None and tensors[src].dtype == tensors[t].dtype):
                b = src_buf
            else:
                key = _reuse_key(tensors.get(t))
                stack = free_lists.get(key) if key is not None else None
                b = stack.pop() if stack else new_buffer(t, k)
            buffer_of[t] = b
            holders[b].append((k, t))
            pending[b] += 1
            dies[b] = max(dies[b], last_read.get(t, k))
        released = {buffer_of[t] for t in node.inputs if t in buffer_of and last_read.get(t) == k}
        released |= {buffer_of[t] for t in node.outputs if t in buffer_of and t not in last_read}
        for t in set(node.inputs) | set(node.outputs):
            if t in buffer_of and last_read.get(t, k) == k and t not in resident:
                pending[buffer_of[t]] -= 1
        for b in sorted(released):
            if pending[b] == 0:
                key = _reuse_key(tensors.get(owner[b]))
                if key is not None:
                    free_lists.setdefault(key, []).append(b)

    alloc = [0] * (steps + 1)
    free = [0] * (steps + 1)
    for b in range(len(owner)):
        alloc[born[b]] += size[b]
        free[min(dies[b], steps)] += size[b]

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

    at_peak = sorted((b for b in range(len(owner)) if born[b] <= peak_step <= dies[b]), key=lambda b: -size[b])
    current = [next(t for k, t in reversed(holders[b]) if k <= peak_step) for b in at_peak]
    buffers = tuple(zip(size, born, (min(d, steps) for d in dies)))
    return MemoryProfile(tuple(order), peak, peak_step, base, tuple(timeline), tuple(current), tuple(unsized),
                         buffers)
