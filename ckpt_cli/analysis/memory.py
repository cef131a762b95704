"""A liveness simulation that predicts peak memory for a node order, the way ONNX
Runtime's allocation planner places buffers (measured on ORT 1.31 CPU, see
``ckpt_cli/verify/worker.py`` and ORT_FACTS.md):

- a value lives from its producer until its last reader in the order; graph outputs
  live to the end; graph inputs and initializers are resident throughout;
- view-like ops (Reshape, Squeeze, Unsqueeze, Flatten, Identity) alias their input;
- unary activations and same-type Cast write in place into an input that dies there;
- a new output takes the most recently freed buffer of the same shape and element
  size, and that buffer stays allocated in between: reuse can raise the peak above
  naive liveness, and the simulation reproduces it;
- graph outputs always get a fresh buffer; outputs nobody reads get a fresh buffer that
  is held to the end of the run unless a later output reuses it;
- ScatterElements/ScatterND write in place into a data input that dies there; views of
  graph inputs and initializers allocate nothing;
- dying buffers go to the reuse lists in the node's input order, then its outputs.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..graph import ABSENT, Graph
from .shapes import TensorInfo, itemsize

VIEW_OPS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"})
IN_PLACE_OPS = frozenset({"ScatterElements", "ScatterND", "Relu", "LeakyRelu", "Elu", "Selu", "Celu", "Sigmoid", "HardSigmoid", "Tanh",
                          "Softplus", "Softsign", "Clip", "Shrink", "ThresholdedRelu", "Softmax",
                          "LogSoftmax", "Cast"})
_VIEW, _IN_PLACE = 1, 2
_OP_KINDS = {**{op: _IN_PLACE for op in IN_PLACE_OPS}, **{op: _VIEW for op in VIEW_OPS}}


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


def simulate(graph: Graph, order: list[int] | tuple[int, ...], tensors: dict[str, TensorInfo], *,
             reuse_buffers: bool = True) -> MemoryProfile:
    """Predict the bytes in use after each node of ``order`` and the peak.

    ``reuse_buffers=False`` models ORT's ``SessionOptions.enable_mem_reuse = False``: no
    in-place outputs and no reuse of freed buffers (each one is released at its last read)."""
    ids = graph.ids
    names, node_inputs, node_outputs = ids.names, ids.inputs, ids.outputs
    count = len(names)
    steps = len(order)
    # Per tensor id: what is known of it, its size (0 if unknown) and its reuse class
    # (buffers are reused within a class; -1: never reused).
    infos = [tensors.get(t) for t in names]
    nbytes = [info.nbytes if info is not None and info.nbytes is not None else 0 for info in infos]
    classes: dict[tuple, int] = {}  # reuse key -> class
    class_of: dict[tuple | None, int] = {}  # (shape, dtype) -> class
    reuse: list[int] = []
    for info in infos:
        kind = None if info is None else (info.shape, info.dtype)
        if kind not in class_of:
            key = _reuse_key(info)
            class_of[kind] = -1 if key is None else classes.setdefault(key, len(classes))
        reuse.append(class_of[kind])
    resident = [False] * count
    for t in graph.resident:
        resident[ids.of[t]] = True

    last_read = [-1] * count  # -1: never read
    readers = [0] * count
    for k, i in enumerate(order):
        for t in node_inputs[i]:
            if t >= 0:
                last_read[t] = k
                readers[t] += 1
    is_output = [False] * count
    for t in graph.outputs:
        if t != ABSENT:
            last_read[ids.of[t]] = steps
            is_output[ids.of[t]] = True
    last_reads: list[list[int]] = [[] for _ in range(steps)]  # step -> tensors read for the last time
    for t, k in enumerate(last_read):
        if 0 <= k < steps:
            last_reads[k].append(t)

    buffer_of = [-1] * count  # tensor id -> buffer id
    owner: list[int] = []  # buffer id -> first tensor that owned it
    size: list[int] = []
    born: list[int] = []
    dies: list[int] = []  # step after which the buffer is released
    pending: list[int] = []  # values in the buffer not yet dead
    free_lists: list[list[int]] = [[] for _ in classes]
    holders: list[list[tuple[int, int]]] = []  # buffer id -> (step, tensor) assignments
    unsized: list[str] = []

    def new_buffer(t: int, k: int) -> int:
        if infos[t] is None or infos[t].nbytes is None:
            unsized.append(names[t])
        owner.append(t)
        size.append(nbytes[t])
        born.append(k)
        dies.append(-1)  # until a value in it is read: a buffer nobody reads is held to the end
        pending.append(0)
        holders.append([])
        return len(owner) - 1

    kinds = [_OP_KINDS.get(n.op_type, 0) for n in graph.nodes]
    for k, i in enumerate(order):
        kind = kinds[i]
        inputs, outputs = node_inputs[i], node_outputs[i]
        src = inputs[0] if inputs else -1
        for pos, t in enumerate(outputs):
            if t < 0:
                continue
            src_buf = buffer_of[src] if src >= 0 else -1
            if pos == 0 and kind == _VIEW and src >= 0 and resident[src] and not is_output[t]:
                resident[t] = True  # a view of a graph input or initializer allocates nothing
                continue
            if is_output[t] or last_read[t] < 0:  # measured: unread outputs never reuse a buffer
                b = new_buffer(t, k)
            elif pos == 0 and kind == _VIEW and src_buf >= 0:
                b = src_buf
            elif (reuse_buffers and pos == 0 and kind == _IN_PLACE and src_buf >= 0 and readers[src] == 1 and pending[src_buf] == 1
                  and last_read[src] == k and reuse[src] == reuse[t] >= 0 and infos[src].dtype == infos[t].dtype):
                b = src_buf
            else:
                stack = free_lists[reuse[t]] if reuse[t] >= 0 and reuse_buffers else None
                b = stack.pop() if stack else new_buffer(t, k)
            buffer_of[t] = b
            holders[b].append((k, t))
            pending[b] += 1
            if last_read[t] > dies[b]:
                dies[b] = last_read[t]
        if not reuse_buffers:
            continue  # what dies only matters to in-place writes and reuse
        # Values that die here: inputs last read here, outputs nobody reads.
        dead = [t for t in last_reads[k] if buffer_of[t] >= 0]
        dead += [t for t in outputs if t >= 0 and last_read[t] < 0]
        if not dead:
            continue
        for t in dead:
            if not resident[t]:
                pending[buffer_of[t]] -= 1
        # ORT's planner frees in the node's input order, then its outputs; that order
        # decides which same-shape buffer a later output reuses.
        dying = set(dead)
        released: list[int] = []
        for t in (*inputs, *outputs):
            if t in dying and buffer_of[t] not in released:
                released.append(buffer_of[t])
        for b in released:
            if pending[b] == 0 and reuse[owner[b]] >= 0:
                free_lists[reuse[owner[b]]].append(b)

    dies = [steps if d < 0 else d for d in dies]
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
    current = [names[next(t for k, t in reversed(holders[b]) if k <= peak_step)] for b in at_peak]
    buffers = tuple(zip(size, born, (min(d, steps) for d in dies)))
    return MemoryProfile(tuple(order), peak, peak_step, base, tuple(timeline), tuple(current), tuple(unsized),
                         buffers)
