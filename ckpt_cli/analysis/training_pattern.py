"""The memory of an untuned ``onnxruntime.training.api.Module`` session (ORT's training build).

A training build (``ENABLE_TRAINING``) does not record its memory pattern from a first
run the way an inference build does (``pattern.py``): ``SessionState::GetMemoryPatternGroup``
plans it statically when the first frame is created (``GeneratePatternGroupCache``), and
that first run already allocates the whole block from the arena before any node runs.

Which buffers the block holds: every ``kAllocate`` buffer (the planner's own, not a graph
output, not a reuse of another buffer, not a string tensor) whose shape ORT resolves before
the run: every dimension a positive value or a symbol bound by a graph input
(``TryResolveShape``); a tensor whose shape ORT cannot resolve statically is allocated from
the arena when its node runs, and so is every buffer that reuses it.

Where: ``MemPatternPlanner::TraceAllocation`` with program counters. Each buffer carries
its program counter, the intervals [first step, last step] of every tensor that holds it
(the planner adds one interval per reuse). The buffers are traced node by node in the
executed order, a node's outputs in output order, then the buffers released after it are
dropped from the live list. A new buffer goes into the gap (between live buffers, or past
the highest one up to the block's current size) that wastes least, the lowest such gap
among equal waste; a live buffer whose counter does not overlap the new one (intervals
touching at one step overlap) is no obstacle. Sizes are
``CalcMemSizeForArrayWithAlignment<kAllocAlignment>``: multiples of 256 bytes.

The arena, measured (1.19.2 CPU, process peak above the loaded state): the peak after one
step is the block and what the first run allocated beside it; the second step adds a
region for a second block (frozen_backbone at batch 64: 25.5 MiB after one step, 46.5 after
two and after ten), as if the first run's block were still held when the second run
allocates its own. The model replays it so: run one allocates the block, then its dynamic
buffers and kernel temporaries; run two allocates a second block before the first is
released, then its dynamic buffers. A region's pages count once touched (the arena never
gives them back and every region is mmapped under MALLOC_MMAP_THRESHOLD_=65536), so the
peak predicted is the bytes of the arena's chunks ever handed out, over both runs.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from ..graph import Graph
from .arena import BFCArena, KernelPlan, conv_working_bytes, kernel_plans, replay
from .lifetimes import Lifetimes, lifetimes
from .pattern import aligned, output_buffers, session_bytes
from .planner import Buffers, plan_buffers
from .shapes import TensorInfo

RUNS = 3  # the arena's placements repeat from the third run on (measured: 2, 3 and 10 steps agree)
Counter = list[tuple[int, int]]  # sorted, disjoint [start, end] steps


def overlapping(a: Counter, b: Counter) -> bool:
    """``MemPatternPlanner::OverlappingTimeSchedules``: two sorted interval lists share a
    step (an interval ending where the other starts overlaps it)."""
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i][0] <= b[j][0]:
            if a[i][1] >= b[j][0]:
                return True
            i += 1
        else:
            if b[j][1] >= a[i][0]:
                return True
            j += 1
    return False


def counters(buffers: Buffers, life: Lifetimes) -> list[Counter]:
    """Per buffer its program counter: per holder [the step that writes it, its last read]
    (a graph output or a buffer held to the end: the run's end), touching intervals merged."""
    out: list[Counter] = []
    for b, holders in enumerate(buffers.holders):
        spans: Counter = []
        for step, t in holders:
            end = max(step, life.last_read[t])
            if spans and step <= spans[-1][1] + 1:
                spans[-1] = (spans[-1][0], max(spans[-1][1], end))
            else:
                spans.append((step, end))
        if spans:
            spans[-1] = (spans[-1][0], max(spans[-1][1], min(buffers.dies[b], life.steps)))
        out.append(spans)
    return out


class CounterPatternPlanner:
    """``MemPatternPlanner`` with program counters (``using_counters``): the live buffers
    sorted by offset, each new one placed by best fit past the buffers whose counters it
    overlaps."""

    def __init__(self) -> None:
        self.size = 0  # buffer_size_: the block
        self.offset: dict[int, int] = {}
        self._blocks: list[tuple[int, int, int]] = []  # (offset, size, key), ORT's list order
        self._counter: dict[int, Counter] = {}

    def alloc(self, key: int, counter: Counter, size: int) -> None:
        if size == 0:
            self.offset[key] = 0
            return
        current, waste, best = 0, None, None
        for offset, bsize, other in self._blocks:
            if not overlapping(counter, self._counter[other]):
                continue
            if offset >= current:
                gap = offset - current
                if gap >= size and (waste is None or gap - size < waste):
                    waste, best = gap - size, current
            current = max(current, offset + bsize)
        if current < self.size:
            gap = self.size - current
            if gap >= size and (waste is None or gap - size < waste):
                best = current
        if best is None:
            best = current
        self.size = max(self.size, best + size)
        self.offset[key] = best
        self._counter[key] = counter
        at = len(self._blocks)  # before the first block above it, or of its offset and no smaller
        for i, (offset, bsize, _) in enumerate(self._blocks):
            if offset > best or (offset == best and bsize >= size):
                at = i
                break
        self._blocks.insert(at, (best, size, key))

    def free(self, key: int) -> None:
        for i, (_, _, other) in enumerate(self._blocks):
            if other == key:
                del self._blocks[i]
                return


def resolved_statically(info: TensorInfo | None) -> bool:
    """ORT's ``TryResolveShape`` before the run: a shape it knows (not only by symbols the
    inputs do not bind), every dimension a positive number once the inputs' are bound."""
    return (info is not None and info.static_shape and info.shape is not None
            and all(isinstance(d, int) and d > 0 for d in info.shape))


def in_block(graph: Graph, tensors: dict[str, TensorInfo], buffers: Buffers,
             static: Collection[str] | None = None) -> list[bool]:
    """Per buffer: the static pattern holds it (the module doc's rule). ``static``: the
    tensors whose shapes ORT resolves before the run, where ORT said so (else ckpt's
    ``static_shape``)."""
    outputs = output_buffers(graph, buffers)
    names = graph.ids.names

    def resolved(t: str) -> bool:
        return t in static if static is not None else resolved_statically(tensors.get(t))

    return [bool(holders) and not out and size > 0 and resolved(names[holders[0][1]])
            for holders, out, size in zip(buffers.holders, outputs, buffers.size)]


def static_block(buffers: Buffers, life: Lifetimes, held: list[bool]) -> int:
    """The block ``GeneratePatternGroupCache`` plans for the buffers ``held`` marks."""
    steps = life.steps
    counter = counters(buffers, life)
    alloc_at: list[list[int]] = [[] for _ in range(steps + 1)]
    free_at: list[list[int]] = [[] for _ in range(steps + 1)]
    for b, keep in enumerate(held):
        if keep:
            alloc_at[min(max(buffers.born[b], 0), steps)].append(b)
            if buffers.dies[b] < steps:
                free_at[max(buffers.dies[b], buffers.born[b])].append(b)
    planner = CounterPatternPlanner()
    for k in range(steps + 1):
        for b in alloc_at[k]:
            planner.alloc(b, counter[b], aligned(buffers.size[b]))
        for b in free_at[k]:
            planner.free(b)
    return planner.size


class TouchingArena(BFCArena):
    """A ``BFCArena`` that remembers every chunk it handed out: the pages a process has
    touched in its regions."""

    def __init__(self) -> None:
        super().__init__()
        self.handed: list[tuple[int, int]] = []

    def alloc(self, num_bytes: int) -> int | None:
        ptr = super().alloc(num_bytes)
        if ptr is not None:
            self.handed.append((ptr, ptr + num_bytes))  # a chunk's pages past the request stay untouched
        return ptr

    def touched(self) -> int:
        total, end = 0, None
        for lo, hi in sorted(self.handed):
            if end is None or lo > end:
                total += hi - lo
                end = hi
            elif hi > end:
                total += hi - end
                end = hi
        return total


def _static_shape(tensors: dict[str, TensorInfo], t: str) -> tuple[int, ...] | None:
    info = tensors.get(t)
    if info is None or info.shape is None or not all(isinstance(d, int) for d in info.shape):
        return None
    return tuple(int(d) for d in info.shape)


def _prod(xs: Iterable[int]) -> int:
    out = 1
    for x in xs:
        out *= x
    return out


def training_kernel_plans(graph: Graph, order: list[int], tensors: dict[str, TensorInfo]) -> dict[int, KernelPlan]:
    """``kernel_plans`` and the arena temporaries of two more float kernels a training graph
    runs at ORT_ENABLE_ALL:

    - FusedConv (com.microsoft, Conv with its activation fused): Conv's kernel, so Conv's
      MLAS working buffer after the output.
    - ConvGrad (orttraining/training_ops/cpu/nn/conv_grad.cc): a col buffer of
      C/group * kernel size * output image size floats and a bias multiplier of output
      image size floats, both taken before dB and dX, released when it returns."""
    plans = kernel_plans(graph, order, tensors)
    for k, i in enumerate(order):
        node = graph.nodes[i]
        if node.domain != "com.microsoft" or len(node.inputs) < 2 or not node.outputs:
            continue
        if node.op_type == "FusedConv":
            x, w, y = (_static_shape(tensors, t) for t in (node.inputs[0], node.inputs[1], node.outputs[0]))
            if x is not None and w is not None and y is not None and len(x) >= 3:
                n = conv_working_bytes(node, x, w, y)
                if n:
                    plans[k] = (("out",), ("tmp", n))
        elif node.op_type == "ConvGrad" and len(node.inputs) >= 3:
            dy, x, w = (_static_shape(tensors, t) for t in node.inputs[:3])
            if dy is not None and x is not None and w is not None and len(x) >= 3:
                group = int(node.attr("group") or 1)
                kernel = tuple(node.attr("kernel_shape") or w[2:])
                out_image = _prod(dy[2:])
                plans[k] = (("tmp", 4 * (x[1] // group) * _prod(kernel) * out_image), ("tmp", 4 * out_image),
                            ("out",), ("free_tmp",))
    return plans


@dataclass(frozen=True)
class ModulePrediction:
    peak_bytes: int  # the arena's touched bytes after two runs: the process peak above the loaded state
    block_bytes: int  # the static memory pattern's block
    first_run_bytes: int  # touched after the first run
    dynamic_buffers: int  # buffers outside the block (graph outputs included)
    regions: tuple[int, ...]


def predict_module(graph: Graph, tensors: dict[str, TensorInfo], order: list[int],
                   static: Collection[str] | None = None) -> ModulePrediction:
    """The untuned Module session's arena for ``order`` (the graph ORT runs, in the order it
    runs it): the static block, then ``RUNS`` runs as the module doc describes. ``static``:
    as for ``in_block``."""
    life = lifetimes(graph, order)
    buffers = plan_buffers(graph, order, tensors, life, True)
    held = in_block(graph, tensors, buffers, static)
    block = static_block(buffers, life, held)
    steps = len(order)
    plans = training_kernel_plans(graph, order, tensors)
    dynamic = [(size, born, dies) for size, born, dies, keep in
               zip(buffers.size, buffers.born, buffers.dies, held) if not keep]
    arena = TouchingArena()
    loaded = arena.alloc(session_bytes(graph, tensors))  # the small initializers: before the baseline
    base = arena.touched()
    first = 0
    for run in range(RUNS):
        held_block = arena.alloc(block)  # by the frame, before any node runs
        replay(dynamic, steps, runs=1, plans=plans, arena=arena)
        arena.free(held_block)  # with the frame
        if run == 0:
            first = arena.touched() - base
    del loaded
    return ModulePrediction(arena.touched() - base, block, first, len(dynamic), tuple(s for _, s in arena.regions))


__all__ = ["CounterPatternPlanner", "ModulePrediction", "counters", "in_block", "overlapping", "predict_module",
           "resolved_statically", "static_block"]
