"""ORT's memory pattern (``enable_mem_pattern``, on by default) over the BFC arena model.

A plain ``InferenceSession(path)`` runs with the pattern on. Its first run allocates from
the arena as without it, while ``ExecutionFrame::TraceAllocate`` / ``TraceFree`` feed every
buffer the frame allocates itself (``kAllocate``: the planner's buffers, graph outputs
excluded, whatever ORT knew of their shape) to ``MemPatternPlanner``
(onnxruntime/core/framework/mem_pattern_planner.h). That planner places each one at an
offset of one virtual block: the best-fitting gap (least waste, the lowest offset among
equal ones) between the live blocks, the space between the highest live block and the
block's current end included, else at the end. Sizes are ``CalcMemSizeForArrayWithAlignment``
with ``kAllocAlignment`` = 256. Every later run (same input shapes) allocates the whole
block from the arena when its frame is created and serves those buffers from it; graph
outputs and kernel temporaries still come from the arena one by one. The arena meets the
block with the first run's regions, all free once the caller drops the outputs: a block
just over a power of two takes the next region size whole (a free chunk is split only when
it is at least twice the request).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass

from ..graph import Graph
from . import schedules
from .arena import SMALL_INITIALIZER_BYTES, BFCArena, kernel_plans, predict_in_use, replay, small_initializer_bytes
from .lifetimes import lifetimes
from .memory import profile_of, simulate
from .planner import Buffers, plan_buffers
from .shapes import TensorInfo

ALLOC_ALIGNMENT = 256  # kAllocAlignment


def aligned(n: int) -> int:
    return ALLOC_ALIGNMENT * ((n + ALLOC_ALIGNMENT - 1) // ALLOC_ALIGNMENT)


class MemPatternPlanner:
    """``MemPatternPlanner::TraceAllocation`` / ``TraceFree`` without program counters.

    ORT scans every live block per allocation; on large graphs, with thousands of stashed
    buffers live, that scan would be a large share of ``ckpt rewrite``. The free gaps below
    the block's end (between live blocks, and past the highest one) are kept instead, sorted
    by (length, offset): the best fit, least waste then lowest offset, is one bisection."""

    def __init__(self) -> None:
        self.offset: dict[int, int] = {}
        self.size = 0  # buffer_size_: the block's peak
        self._live: dict[int, tuple[int, int]] = {}  # key -> (offset, size)
        self._gaps: list[tuple[int, int]] = []  # (length, offset), sorted
        self._gap_at: dict[int, int] = {}  # offset -> length
        self._gap_ending: dict[int, int] = {}  # end -> offset

    def alloc(self, key: int, size: int) -> None:
        if size == 0:
            self.offset[key] = 0
            return
        i = bisect_left(self._gaps, (size, -1))
        if i < len(self._gaps):
            length, best = self._gaps[i]
            self._drop_gap(best)
            self._add_gap(best + size, length - size)
        else:  # nothing fits: at the end of the highest live block, growing the block
            best = self._gap_ending.get(self.size, self.size)
            if best != self.size:
                self._drop_gap(best)
            self.size = best + size
        self.offset[key] = best
        self._live[key] = (best, size)

    def free(self, key: int) -> None:
        if key not in self._live:
            return
        start, size = self._live.pop(key)
        end = start + size
        before = self._gap_ending.get(start)
        if before is not None:
            self._drop_gap(before)
            start = before
        after = self._gap_at.get(end)
        if after is not None:
            self._drop_gap(end)
            end += after
        self._add_gap(start, end - start)

    def _add_gap(self, offset: int, length: int) -> None:
        if length > 0:
            insort(self._gaps, (length, offset))
            self._gap_at[offset] = length
            self._gap_ending[offset + length] = offset

    def _drop_gap(self, offset: int) -> None:
        length = self._gap_at.pop(offset)
        del self._gap_ending[offset + length]
        del self._gaps[bisect_left(self._gaps, (length, offset))]


def output_buffers(graph: Graph, buffers: Buffers) -> list[bool]:
    """Per buffer: it holds a graph output (``kAllocateOutput``: never in the pattern)."""
    is_output = [False] * len(graph.ids.names)
    for t in graph.outputs:
        if t in graph.ids.of:
            is_output[graph.ids.of[t]] = True
    return [any(is_output[t] for _, t in holders) for holders in buffers.holders]


def pattern_size(buffers: Buffers, steps: int, outputs: list[bool]) -> int:
    """The pattern's peak size: the block one later run allocates for ``buffers``.

    Within a step the node's buffers are traced in buffer id order, then its releases.
    Buffers held to the end of the run are freed with the frame, untraced."""
    planner = MemPatternPlanner()
    alloc_at: list[list[int]] = [[] for _ in range(steps + 1)]
    free_at: list[list[int]] = [[] for _ in range(steps + 1)]
    for b, (size, born, dies) in enumerate(zip(buffers.size, buffers.born, buffers.dies)):
        if outputs[b] or size <= 0:
            continue
        alloc_at[min(max(born, 0), steps)].append(b)
        if dies < steps:
            free_at[max(dies, born)].append(b)
    for k in range(steps + 1):
        for b in alloc_at[k]:
            planner.alloc(b, aligned(buffers.size[b]))
        for b in free_at[k]:
            planner.free(b)
    return planner.size


def session_bytes(graph: Graph, tensors: dict[str, TensorInfo]) -> int:
    """The small initializers ORT keeps in the arena, Constant nodes included (ORT turns
    them into initializers when it loads the graph; fresh.py's guards write such nodes)."""
    used = set(graph.consumers) | set(graph.outputs)
    constants = sum(info.nbytes for n in graph.nodes if n.op_type == "Constant" for t in n.outputs
                    if t in used and (info := tensors.get(t)) is not None and info.nbytes is not None
                    and info.nbytes < SMALL_INITIALIZER_BYTES)
    return small_initializer_bytes(graph, tensors) + constants


@dataclass(frozen=True)
class PlainPrediction:
    peak_in_use_bytes: int  # the second run's peak of ``mem_bytes_in_use``, what bench.sessions reads
    block_bytes: int  # the memory pattern's block
    first_run_peak_bytes: int
    regions: tuple[int, ...]  # arena regions after the second run


def predict_pattern(graph: Graph, order: list[int], tensors: dict[str, TensorInfo],
                    reuse_buffers: bool = True, buffers: Buffers | None = None) -> PlainPrediction:
    """ORT's arena peak for ``order`` with the memory pattern on, in the second run of a
    session (the first one records the pattern). ``buffers``: the planner's for ``order``
    with ``reuse_buffers``, when the caller has them."""
    steps = len(order)
    if buffers is None:
        buffers = plan_buffers(graph, order, tensors, lifetimes(graph, order), reuse_buffers)
    requests = list(zip(buffers.size, buffers.born, buffers.dies))
    plans = kernel_plans(graph, order, tensors)
    base = session_bytes(graph, tensors)
    arena = BFCArena()
    first, arena = replay(requests, steps, runs=1, small_initializer_bytes=base, plans=plans, arena=arena)
    outputs = output_buffers(graph, buffers)
    block = pattern_size(buffers, steps, outputs)
    # the block first (the frame takes it before any node), then what stays outside it
    second = [(block, 0, steps)] + [r for r, out in zip(requests, outputs) if out]
    traces, arena = replay(second, steps, runs=1, small_initializer_bytes=base, plans=plans, arena=arena)
    peak = max(traces[-1].in_use, default=base)
    return PlainPrediction(peak, block, max(first[-1].in_use, default=base),
                           tuple(s for _, s in arena.regions))


def pattern_allowed(graph: Graph) -> bool:
    """Whether ORT can use its memory pattern for ``graph`` at all: it turns the pattern off
    when a graph input is not a tensor (``SessionState::ResolveMemoryPatternFlag``; an
    optional, sequence or map input), whatever the session options say."""
    fed = set(graph.inputs)
    return all(v.type.WhichOneof("value") in ("tensor_type", "sparse_tensor_type")
               for v in graph.model.graph.input if v.name in fed)


def predict_unpatterned(graph: Graph, tensors: dict[str, TensorInfo], order: list[int] | None = None,
                        buffers: Buffers | None = None) -> PlainPrediction:
    """ORT's arena peak for ``order`` (ORT's DEFAULT order by default) with buffer reuse on
    and the memory pattern off: every run allocates as the first one does. ``buffers``: the
    planner's for ``order`` with reuse on, when the caller has them."""
    order = schedules.ort_default(graph) if order is None else order
    profile = (simulate(graph, order, tensors, reuse_buffers=True) if buffers is None
               else profile_of(graph, order, tensors, buffers))
    peak = predict_in_use(graph, profile, tensors).peak_in_use_bytes
    return PlainPrediction(peak, 0, peak, ())


def predict_with_and_without_pattern(graph: Graph, tensors: dict[str, TensorInfo], order: list[int]
                                     ) -> tuple[PlainPrediction, PlainPrediction]:
    """``predict_pattern`` and ``predict_unpatterned`` for one ``order`` with buffer reuse
    on, from one plan of ORT's buffers (both start from the same allocation plan)."""
    buffers = plan_buffers(graph, order, tensors, lifetimes(graph, order), True)
    return (predict_pattern(graph, order, tensors, buffers=buffers),
            predict_unpatterned(graph, tensors, order, buffers))


def predict_plain(graph: Graph, tensors: dict[str, TensorInfo], order: list[int] | None = None) -> PlainPrediction:
    """``InferenceSession(path)`` with nothing set, fusions aside: ORT's DEFAULT order (or
    ``order``), buffer reuse, and the memory pattern where the graph allows it."""
    if not pattern_allowed(graph):
        return predict_unpatterned(graph, tensors, order)
    return predict_pattern(graph, schedules.ort_default(graph) if order is None else order, tensors)


__all__ = ["MemPatternPlanner", "PlainPrediction", "pattern_allowed", "pattern_size", "predict_pattern", "predict_plain",
           "predict_unpatterned", "predict_with_and_without_pattern"]
