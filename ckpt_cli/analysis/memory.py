"""A liveness simulation that predicts the bytes in use after each node of an order, the
way ONNX Runtime places buffers (ORT 1.31 CPU). Three parts:

- ``lifetimes``: when each tensor is last read and the uses ORT's planner counts;
- ``planner``: ORT's allocation planner rules: which buffer each tensor lands in
  (views alias, in-place writes, reuse of freed buffers, graph outputs);
- ``timeline``: bytes in use per step, the peak and what is live there.

Graph inputs and initializers are resident throughout and counted in every step.
``tests/test_memory_property.py`` compares the result with ORT's profiler at every node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ..errors import ModelError
from ..graph import ABSENT, Graph
from ..ops import VIEW_OPS
from .lifetimes import lifetimes
from .planner import Buffers, plan_buffers, without_reuse
from ..ort.scratch import scratch_bytes
from .shapes import TensorInfo, sized_by
from .timeline import bytes_in_use, live_at, peak_of

__all__ = ["MemoryProfile", "buffer_roots", "profile_of", "resident_bytes", "simulate", "simulate_both",
           "simulate_deferred", "order_scratch", "peak_with_scratch", "scratch_peak", "step_scratch", "visible_peak", "mapped_bytes", "PAGE_BYTES",
           "with_scratch"]


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
    This is the order-independent part of buffer sharing. Each view names its source in
    file order, then chains are followed up (a view's source may come later in an unsorted
    file; following chains is cheaper than sorting the graph for it)."""
    roots: dict[str, str] = {}
    source: dict[str, str] = {}  # a view's output -> the tensor it views
    for node in graph.nodes:
        view = node.op_type in VIEW_OPS and node.inputs and node.inputs[0] != ABSENT
        for t in node.outputs:
            if t != ABSENT:
                if view:
                    source[t] = node.inputs[0]
                else:
                    roots[t] = t
    for t in source:
        chain = [t]
        r = source[t]
        while r in source and r not in roots:
            if len(chain) > len(source):
                raise ModelError("the graph has a cycle of views")
            chain.append(r)
            r = source[r]
        r = roots.get(r, r)
        for u in chain:
            roots[u] = r
    return roots


def resident_bytes(graph: Graph, tensors: dict[str, TensorInfo]) -> int:
    return sum((tensors[t].nbytes or 0) for t in graph.resident if t in tensors)


def simulate(graph: Graph, order: list[int] | tuple[int, ...], tensors: dict[str, TensorInfo], *,
             reuse_buffers: bool = True) -> MemoryProfile:
    """Predict the bytes in use after each node of ``order`` and the peak.

    ``reuse_buffers=False`` models ORT's ``SessionOptions.enable_mem_reuse = False``: freed
    buffers are not reused (each one is released at its last read); in-place writes stay."""
    life = lifetimes(graph, order)
    return profile_of(graph, order, tensors, plan_buffers(graph, order, tensors, life, reuse_buffers))


def simulate_both(graph: Graph, order: list[int] | tuple[int, ...],
                  tensors: dict[str, TensorInfo]) -> tuple[MemoryProfile, MemoryProfile]:
    """``simulate`` with buffer reuse on and off, for the cost of one walk of the order."""
    on, off = simulate_deferred(graph, order, tensors)
    return on, off()


def simulate_deferred(graph: Graph, order: list[int] | tuple[int, ...], tensors: dict[str, TensorInfo]
                      ) -> tuple[MemoryProfile, Callable[[], MemoryProfile]]:
    """``simulate`` with reuse on, and a call that gives the same order with reuse off
    from it (for a caller that may need both)."""
    life = lifetimes(graph, order)
    on = plan_buffers(graph, order, tensors, life, True)
    return profile_of(graph, order, tensors, on), lambda: profile_of(graph, order, tensors, without_reuse(on, life))


def profile_of(graph: Graph, order: list[int] | tuple[int, ...], tensors: dict[str, TensorInfo],
               buffers: Buffers) -> MemoryProfile:
    """``simulate``'s result from the planner's buffers for ``order``."""
    base = resident_bytes(graph, tensors)
    steps = len(order)
    tl = bytes_in_use(buffers, steps, base)
    peak, peak_step = peak_of(tl, base)
    return MemoryProfile(tuple(order), peak, peak_step, base, tuple(tl),
                         live_at(buffers, peak_step, graph.ids.names), tuple(buffers.unsized),
                         tuple(zip(buffers.size, buffers.born, buffers.dies)))


def peak_with_scratch(profile: MemoryProfile, graph: Graph, tensors: dict[str, TensorInfo]) -> int:
    """The simulation's peak with the working memory each kernel holds outside ORT's
    allocator while it runs (``ort.scratch``), resident bytes included."""
    return scratch_peak(profile.peak_bytes, step_scratch(profile, graph, tensors), profile.timeline)


def with_scratch(timeline: Sequence[int], scratch: dict[int, int]) -> tuple[int, ...]:
    """``timeline`` with each step's kernel working memory (``step_scratch``) added."""
    return tuple(b + scratch.get(k, 0) for k, b in enumerate(timeline))


# A process-peak measurement runs with MALLOC_MMAP_THRESHOLD_ at one page: glibc then maps
# every block of a page or more on its own. ORT's CPU allocator asks posix_memalign for
# 64-byte alignment, which puts the data 64 bytes into the mapping; the kernel writes it
# all, so the block costs its mapping, whole pages.
PAGE_BYTES = 4096
MMAP_DATA_OFFSET = 64


def mapped_bytes(size: int) -> int:
    """The resident bytes of one mmapped block of ``size`` bytes."""
    return -(-(size + MMAP_DATA_OFFSET) // PAGE_BYTES) * PAGE_BYTES


def visible_peak(profile: MemoryProfile, graph: Graph, tensors: dict[str, TensorInfo], min_bytes: int) -> int:
    """``peak_with_scratch`` as a process-peak measurement sees it, above the resident bytes:
    only blocks of ``min_bytes`` or more, each its whole mapping (``mapped_bytes``). A block
    under glibc's mmap threshold comes from the heap, which the loaded model left with room:
    it does not raise the process's peak."""
    steps = len(profile.order)
    alloc, free = np.zeros(steps + 1, np.int64), np.zeros(steps + 1, np.int64)
    for size, born, dies in profile.buffers:
        if size >= min_bytes:
            alloc[born] += mapped_bytes(size)
            free[dies] += mapped_bytes(size)
    timeline = (np.cumsum(alloc[:steps]) - (np.cumsum(free[:steps]) - free[:steps])).tolist()
    scratch = {k: mapped_bytes(b) for k, b in step_scratch(profile, graph, tensors).items() if b >= min_bytes}
    return scratch_peak(max(timeline, default=0), scratch, timeline)


def step_scratch(profile: MemoryProfile, graph: Graph, tensors: dict[str, TensorInfo],
                 skip: frozenset[tuple[str, str]] = frozenset()) -> dict[int, int]:
    """Per step of ``profile.order`` with a kernel that holds working memory outside ORT's
    buffers (``ort.scratch``): its bytes. ``skip``: (domain, op type) pairs left out."""
    return order_scratch(graph, tensors, profile.order, skip)


def order_scratch(graph: Graph, tensors: dict[str, TensorInfo], order: Sequence[int],
                  skip: frozenset[tuple[str, str]] = frozenset()) -> dict[int, int]:
    """``step_scratch`` for the steps of ``order``."""
    sized = sized_by(tensors)
    out = {}
    for step, i in enumerate(order):
        node = graph.nodes[i]
        if skip and (("" if node.domain == "ai.onnx" else node.domain), node.op_type) in skip:
            continue
        extra = scratch_bytes(node, sized, graph.int_constant)
        if extra:
            out[step] = extra
    return out


def scratch_peak(peak: int, scratch: dict[int, int], timeline: Sequence[int]) -> int:
    """``peak``, or a step's bytes in use plus its kernel's scratch where that is higher."""
    return max([peak, *(timeline[step] + extra for step, extra in scratch.items())])
