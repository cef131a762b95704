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

Where: ``MemPatternPlanner::TraceAllocation``, best fit. The buffers are traced node by
node in the executed order, a node's outputs in output order, then the buffers released
after it are dropped from the live list. A new buffer goes into the gap (between live
buffers, or past the highest one up to the block's current size) that wastes least, the
lowest such gap among equal waste. Sizes are ``CalcMemSizeForArrayWithAlignment
<kAllocAlignment>``: multiples of 256 bytes. The training build passes program counters,
and a live buffer whose counter misses the new one's would be no obstacle, but none ever
misses: ``ComputeProgramCounter`` starts a counter only for the value that allocates the
buffer (not for the values that reuse it) and ends it once, at the buffer's release, so a
buffer still live spans the step being traced. Measured: the block this gives is ORT's to
the byte (its arena's extend request at the first step) on the zoo's gpt, bert, tagger and
frozen_backbone; a counter per holder gave up to 13% less.

The arena, measured (1.19.2 CPU, process peak above the loaded state): the peak after one
step is the block and what the first run allocated beside it; the second step adds a
region for a second block (frozen_backbone at batch 64: 25.5 MiB after one step, 46.5 after
two and after ten). The model replays runs: each allocates the block when its
frame is made, then its dynamic buffers and kernel temporaries, and frees the block with
the frame; a later run's block can land in another free chunk than the first's (the best
fit, the newer region of two equal ones), which is the second block measured. The free
chunks a run leaves decide where the next one's chunks land, so placements can move for
several runs before they settle (the zoo's mixer rewrite touches 4 MiB more at its fifth
step, and none after): the replay goes on until the arena ends a run in a state
it ended one in before. From there every run repeats runs already replayed, so the pages
touched are those of any number of steps; past ``MAX_RUNS`` runs (or
``MAX_REPLAYED_REQUESTS`` buffers and temporaries replayed) it stops where it is. The loss a
run returns stays where it was allocated until the next run returns (a training loop holds
it: ``loss = module(...)``), so a later block cannot take the region it sits in whole
(measured on the zoo's llama: 89.2 MiB with the loss dropped at once, 97.0 MiB held). A region's
pages count once touched (the arena never gives them back and every region is mmapped
under MALLOC_MMAP_THRESHOLD_=65536), so the peak predicted is the bytes of the arena's
chunks ever handed out, over the runs, and on
top the regions' bookkeeping (``region_handles``), the largest working memory one kernel
takes from the heap (``heap_scratch``) and what the process adds as its first step runs
(``FIRST_STEP_PROCESS_BYTES``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from ..graph import Graph
from .arena import ARENA_REPLAYED, BFCArena, KernelPlan, conv_working_bytes, kernel_plans, run_holding
from .lifetimes import Lifetimes, lifetimes
from .pattern import output_buffers, pattern_size, session_bytes
from .planner import Buffers, plan_buffers
from .memory import mapped_bytes, order_scratch
from .shapes import TensorInfo

# Bounds on the replay only: placements can take tens of runs to settle (bench/MODULE_MODEL.md).
MAX_RUNS = 256
MAX_REPLAYED_REQUESTS = 250_000  # about a second of replay
MMAP_THRESHOLD = 65536  # the Module child's MALLOC_MMAP_THRESHOLD_: smaller heap blocks come from room the heap has
# What the process adds beside ORT's allocators as the first step runs: the pages of ORT's
# library its kernels run from for the first time (measured: 0.6-1.0 MiB of file-backed
# resident pages on the zoo's mlp and gpt) and the heap's growth. Of the zoo's 73
# predictions of this model without it, the measured peak was 0.65-1.5 MiB above 55, and
# 0.65-11.5 MiB above all (median 1.19 MiB).
FIRST_STEP_PROCESS_BYTES = 1 << 20


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
    """The block ``GeneratePatternGroupCache`` plans for the buffers ``held`` marks: every
    live buffer an obstacle (the module doc says why its program counters never free one)."""
    return pattern_size(buffers, life.steps, [not keep for keep in held])


class TouchingArena(BFCArena):
    """A ``BFCArena`` that remembers every chunk it handed out: the pages a process has
    touched in its regions."""

    def __init__(self) -> None:
        super().__init__()
        self.handed: set[tuple[int, int]] = set()  # a chunk handed out again in a later run counts once

    def alloc(self, num_bytes: int) -> int | None:
        ptr = super().alloc(num_bytes)
        if ptr is not None:
            self.handed.add((ptr, ptr + num_bytes))  # a chunk's pages past the request stay untouched
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
    peak_bytes: int  # the process peak above the loaded state: the arena's touched bytes, its handles,
    # a kernel's heap scratch and FIRST_STEP_PROCESS_BYTES
    block_bytes: int  # the static memory pattern's block
    first_run_bytes: int  # touched after the first run
    dynamic_buffers: int  # buffers outside the block (graph outputs included)
    regions: tuple[int, ...]
    scratch_bytes: int = 0  # the largest heap scratch one kernel maps while it runs
    handle_bytes: int = 0  # the bookkeeping of the regions the runs make
    # the peak after each run replayed; ``peak_bytes`` is the last. Settled: the arena ended
    # the last run in a state it ended one in before, so every later step keeps that peak
    step_peaks: tuple[int, ...] = ()
    settled: bool = True

    def after(self, steps: int) -> int:
        """The peak ``steps`` training steps reach (the last replayed run's for more steps)."""
        if not self.step_peaks or steps < 1:
            return self.peak_bytes
        return self.step_peaks[min(steps, len(self.step_peaks)) - 1]


# The kernels whose temporaries come from the temp-space allocator, the arena: the arena
# replay holds them (``kernel_plans``, ``training_kernel_plans``), the heap does not.
ARENA_TEMPORARIES = ARENA_REPLAYED | frozenset({("com.microsoft", "ConvGrad"), ("", "ConvGrad"), ("com.microsoft", "FusedConv")})


def heap_scratch(graph: Graph, tensors: dict[str, TensorInfo], order: list[int]) -> int:
    """The largest working memory one kernel of ``order`` takes from the heap while it runs
    (``ort.scratch``: Eigen arrays, ``std::vector``), as the process maps it: blocks of
    ``MMAP_THRESHOLD`` or more, each its whole mapping. The arena's touched bytes stay
    resident while it runs."""
    scratch = order_scratch(graph, tensors, order, ARENA_TEMPORARIES).values()
    return max((mapped_bytes(n) for n in scratch if n >= MMAP_THRESHOLD), default=0)


def region_handles(regions: list[int]) -> int:
    """The resident bytes of the arena's bookkeeping for the regions it makes while the steps
    run: each ``AllocationRegion`` holds one ``ChunkHandle`` (8 bytes) per 256 bytes of the
    region, every one written when the region is made; those of ``MMAP_THRESHOLD`` or more
    are their own mappings (measured on the zoo's gpt: 1, 1, 2 and 4 MiB beside its regions
    of 32, 32, 64 and 128 MiB)."""
    return sum(mapped_bytes(n) for n in (size // 256 * 8 for size in regions) if n >= MMAP_THRESHOLD)


def gradient_buffers(graph: Graph, tensors: dict[str, TensorInfo]) -> list[int]:
    """The bytes of each gradient buffer (``*.accumulation.buffer`` inputs) in input order:
    the Module allocates them from its session's arena and zeroes them when it is made
    (measured: those regions are resident before the first step), so they decide where the
    first run's block lands but add nothing above the loaded state."""
    return [info.nbytes for t in graph.inputs if t.endswith(".accumulation.buffer")
            and (info := tensors.get(t)) is not None and info.nbytes]


def user_outputs(graph: Graph, buffers: Buffers) -> list[bool]:
    """Per buffer: it holds an output ``Module.__call__`` returns (the loss), which a training
    loop keeps (``loss = module(...)``) until its next call returns, so it sits in the arena
    through the next run. The gradients' ``*.accumulation.out`` flags are dropped in the call."""
    returned = {graph.ids.of[t] for t in graph.outputs if t in graph.ids.of and not t.endswith(".accumulation.out")}
    return [any(t in returned for _, t in holders) for holders in buffers.holders]


def predict_module(graph: Graph, tensors: dict[str, TensorInfo], order: list[int],
                   static: Collection[str] | None = None) -> ModulePrediction:
    """The untuned Module session's peak for ``order`` (the graph ORT runs, in the order it
    runs it): the static block, then runs as the module doc describes until the arena's
    placements settle, and the largest heap scratch on top (a settled run touches no new
    arena pages, so the scratch of any of its kernels lands on the arena's final touched
    bytes). ``static``: as for ``in_block``."""
    life = lifetimes(graph, order)
    buffers = plan_buffers(graph, order, tensors, life, True)
    held = in_block(graph, tensors, buffers, static)
    block = static_block(buffers, life, held)
    steps = len(order)
    plans = training_kernel_plans(graph, order, tensors)
    outside = [b for b, keep in enumerate(held) if not keep]
    dynamic = [(buffers.size[b], buffers.born[b], buffers.dies[b]) for b in outside]
    returned = user_outputs(graph, buffers)
    kept = [k for k, b in enumerate(outside) if returned[b]]
    arena = TouchingArena()
    loaded = [arena.alloc(n) for n in (session_bytes(graph, tensors), *gradient_buffers(graph, tensors))]
    base, loaded_regions = arena.touched(), len(arena.regions)
    scratch = heap_scratch(graph, tensors, order)
    peaks: list[int] = []
    first = handles = 0
    last_outputs: list[int | None] = []
    seen: set[tuple[object, ...]] = set()
    settled = False
    runs = max(1, min(MAX_RUNS, MAX_REPLAYED_REQUESTS // max(1, len(dynamic) + len(plans))))
    while not settled and len(peaks) < runs:
        held_block = arena.alloc(block)  # by the frame, before any node runs
        outputs = run_holding(dynamic, steps, plans, arena, kept)
        arena.free(held_block)  # with the frame
        for chunk in last_outputs:  # the caller's loss of the run before, replaced as this one returns
            arena.free(chunk)
        last_outputs = outputs
        handles = region_handles([size for _, size in arena.regions[loaded_regions:]])
        first = first if peaks else arena.touched() - base
        peaks.append(arena.touched() - base + handles + scratch + FIRST_STEP_PROCESS_BYTES)
        state = (arena.state(), tuple(outputs))
        settled = state in seen
        seen.add(state)
    del loaded
    return ModulePrediction(peaks[-1], block, first, len(dynamic),
                            tuple(s for _, s in arena.regions), scratch, handles, tuple(peaks), settled)


__all__ = ["ARENA_TEMPORARIES", "FIRST_STEP_PROCESS_BYTES", "ModulePrediction", "gradient_buffers", "heap_scratch", "region_handles", "in_block", "predict_module",
           "resolved_statically", "static_block", "user_outputs"]
