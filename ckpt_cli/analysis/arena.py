"""A model of ONNX Runtime's CPU arena (a BFC allocator) on top of the liveness simulation.

``memory.simulate`` reproduces ORT's allocation planner: what it predicts matches the
profiler's ``mem_bytes_requested_in_use``.  What the arena really has in use
(``mem_bytes_in_use``, and what the process holds) is higher: requests are rounded up,
a chunk that is too small to split is handed out whole, and free memory is fragmented
over regions.  This module replays the planner's request sequence (``MemoryProfile.buffers``)
through a pure-python copy of ORT's ``BFCArena`` (onnxruntime/core/framework/bfc_arena.cc
and bfc_arena.h) with the defaults of the CPU arena:

- ``RoundedBytes``: a request of n > 0 bytes takes ``256 * ceil(n / 256)`` bytes
  (``kMinAllocationSize = 1 << 8``); n == 0 allocates nothing.
- Free chunks sit in 21 bins (bin b holds sizes in [256 << b, 256 << (b+1)), the last
  bin everything larger), each ordered by (size, address).  ``FindChunkPtr`` scans from
  the request's bin upwards and takes the first chunk with size >= rounded.  Because the
  bins partition the sizes in increasing order, that is exactly the smallest free chunk
  that fits, the lowest address among equal sizes: one sorted list models all bins.
- Split rule (``SplitFreeChunkFromBin``): the chunk is split only if
  ``size >= 2 * rounded`` or ``size - rounded >= max_dead_bytes_per_chunk`` (128 MiB);
  the request keeps the front, the rest goes back as a free chunk.  Otherwise the WHOLE
  chunk is in use (``stats_.bytes_in_use += chunk->size``).
- ``Free`` / ``Coalesce``: a freed chunk merges with its next and then its previous
  neighbour when they are free; neighbours only exist inside one region (regions are
  never merged).
- ``Extend`` (kNextPowerOfTwo): ``curr_region_allocation_bytes`` starts at the initial
  chunk size (1 MiB); while the request is larger it doubles; the new region has
  ``curr`` bytes; if no doubling was needed, ``curr`` doubles for next time (capped at
  ``max_power_of_two_extend_bytes``, 1 GiB).  A new region is one free chunk.
- Regions are never returned during a session (no shrinkage by default), so a second run
  starts from the first run's regions, each one free chunk once the outputs are dropped.
  ckpt's worker measures after one warm-up run: ``runs=2`` (the default) replays that.

The session-lifetime bytes ORT puts in the arena before the first run (initializers
smaller than 128 bytes, ``baseline_bytes`` in measurements) are taken with ``Reserve``
(exact size, outside the chunks; seen in ORT's verbose log): they only add a constant
(``small_initializer_bytes``).  Big initializers are not in the arena.

Allocation order within a step is buffer id order (the order kernels create outputs).
The release order does not matter (coalescing gives the same free chunks in any order).
Some kernels take temporaries from the arena; where they are taken BEFORE the outputs
they move where the outputs land.  ``kernel_plans`` models the ones measured on the
samples (Where, Conv, ConvTranspose).

Validated on ORT 1.31.1 CPU (ckpt's measurement settings: ORT_DISABLE_ALL, mem pattern
off, arena on, one thread): given the request sequence ORT's planner really makes, the
predicted ``mem_bytes_in_use`` equals the profiler's at every node of mlp/gpt/cnn, both
orders, original and rewritten, and ``held_bytes`` equals ``mem_arena_held``
(tests/test_arena.py).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING, Collection, Iterable, Sequence

import numpy as np

from ..fast import native
from ..ort.scratch import variadic_temporaries
from .shapes import sized_by

if TYPE_CHECKING:
    from ..native import Requests
    from ..graph import Graph, Node
    from .memory import MemoryProfile
    from .shapes import TensorInfo

MIN_ALLOCATION_BYTES = 256  # kMinAllocationSize
DEFAULT_INITIAL_CHUNK_SIZE_BYTES = 1 << 20  # BFCArena::DEFAULT_INITIAL_CHUNK_SIZE_BYTES
DEFAULT_MAX_DEAD_BYTES_PER_CHUNK = 128 << 20
DEFAULT_MAX_POWER_OF_TWO_EXTEND_BYTES = 1 << 30

_ADDRESS_TOP = 1 << 60  # synthetic addresses; only their order matters


def rounded_bytes(n: int) -> int:
    """``BFCArena::RoundedBytes``: multiples of 256 bytes."""
    return MIN_ALLOCATION_BYTES * ((n + MIN_ALLOCATION_BYTES - 1) // MIN_ALLOCATION_BYTES)


class BFCArena:
    """Best-fit with coalescing, as ORT's ``BFCArena`` with ``kNextPowerOfTwo`` growth.

    ``alloc(n)`` returns a chunk address (or None for n == 0); ``free(addr)`` releases it.
    ``in_use`` / ``requested_in_use`` / ``held`` mirror ``stats_.bytes_in_use``, the sum of
    requested sizes and ``stats_.total_allocated_bytes``.

    A new region lies below the earlier ones, which only decides ties between equal-size
    free chunks: glibc's mmap does so, and ckpt's worker sets MALLOC_MMAP_THRESHOLD_=65536,
    so every region is mmapped.
    """

    def __init__(self, initial_chunk_size_bytes: int = DEFAULT_INITIAL_CHUNK_SIZE_BYTES,
                 max_dead_bytes_per_chunk: int = DEFAULT_MAX_DEAD_BYTES_PER_CHUNK,
                 max_power_of_two_extend_bytes: int = DEFAULT_MAX_POWER_OF_TWO_EXTEND_BYTES):
        self.curr_region_allocation_bytes = rounded_bytes(initial_chunk_size_bytes)
        self.max_dead_bytes_per_chunk = max_dead_bytes_per_chunk
        self.max_power_of_two_extend_bytes = max_power_of_two_extend_bytes
        self.regions: list[tuple[int, int]] = []  # (base address, size) in creation order
        self._low = _ADDRESS_TOP  # lowest address used
        # chunk state, keyed by address
        self.size: dict[int, int] = {}
        self.prev: dict[int, int | None] = {}
        self.next: dict[int, int | None] = {}
        self.requested: dict[int, int] = {}  # in-use chunks only
        self.free_chunks: list[tuple[int, int]] = []  # (size, address), sorted: all bins
        self.in_use = 0
        self.requested_in_use = 0
        self.held = 0

    # -- growth -----------------------------------------------------------------------
    def _extend(self, rounded: int) -> None:
        increased = False
        while rounded > self.curr_region_allocation_bytes:
            self.curr_region_allocation_bytes *= 2
            increased = True
        nbytes = self.curr_region_allocation_bytes
        if not increased:
            cap = self.max_power_of_two_extend_bytes
            if self.curr_region_allocation_bytes < cap // 2:
                self.curr_region_allocation_bytes *= 2
            else:
                self.curr_region_allocation_bytes = cap
        self._add_region(nbytes)

    def _add_region(self, nbytes: int) -> None:
        self._low -= nbytes
        base = self._low
        self.regions.append((base, nbytes))
        self.held += nbytes
        self.size[base] = nbytes
        self.prev[base] = None
        self.next[base] = None
        insort(self.free_chunks, (nbytes, base))

    def state(self) -> tuple[object, ...]:
        """What decides where later requests land: the chunks (address, size, in use) and
        the next region's size. Equal states replay equal requests the same way."""
        chunks = tuple((ptr, size, ptr in self.requested) for ptr, size in sorted(self.size.items()))
        return chunks, self.curr_region_allocation_bytes

    # -- allocation -------------------------------------------------------------------
    def alloc(self, num_bytes: int) -> int | None:
        # Called twice per buffer per replayed run: attributes are read into locals once.
        if num_bytes <= 0:
            return None
        rounded = MIN_ALLOCATION_BYTES * ((num_bytes + MIN_ALLOCATION_BYTES - 1) // MIN_ALLOCATION_BYTES)
        free_chunks = self.free_chunks
        i = bisect_left(free_chunks, (rounded,))
        if i == len(free_chunks):
            self._extend(rounded)
            i = bisect_left(free_chunks, (rounded,))
        csize, ptr = free_chunks.pop(i)
        if csize >= 2 * rounded or csize - rounded >= self.max_dead_bytes_per_chunk:
            size, nexts = self.size, self.next
            new = ptr + rounded
            nxt = nexts[ptr]
            size[new] = rest = csize - rounded
            self.prev[new] = ptr
            nexts[new] = nxt
            if nxt is not None:
                self.prev[nxt] = new
            nexts[ptr] = new
            size[ptr] = csize = rounded
            insort(free_chunks, (rest, new))
        self.requested[ptr] = num_bytes
        self.in_use += csize
        self.requested_in_use += num_bytes
        return ptr

    def _remove_free(self, ptr: int) -> None:
        key = (self.size[ptr], ptr)
        i = bisect_left(self.free_chunks, key)
        assert self.free_chunks[i] == key
        del self.free_chunks[i]

    def free(self, ptr: int | None) -> None:
        if ptr is None:
            return
        requested, size = self.requested, self.size
        self.requested_in_use -= requested.pop(ptr)
        self.in_use -= size[ptr]
        nxt = self.next[ptr]
        if nxt is not None and nxt not in requested:  # merge next into this one
            self._remove_free(nxt)
            self._merge(ptr, nxt)
        prv = self.prev[ptr]
        if prv is not None and prv not in requested:  # merge this one into prev
            self._remove_free(prv)
            self._merge(prv, ptr)
            ptr = prv
        insort(self.free_chunks, (size[ptr], ptr))

    def _merge(self, a: int, b: int) -> None:
        nb = self.next[b]
        self.next[a] = nb
        if nb is not None:
            self.prev[nb] = a
        self.size[a] += self.size[b]
        del self.size[b], self.prev[b], self.next[b]


@dataclass(frozen=True)
class ArenaResult:
    peak_in_use_bytes: int  # max of timeline_in_use: what ORT's profiler reports as the peak
    peak_step: int  # position in the order
    timeline_in_use: tuple[int, ...]  # per step: after the node's allocations, before its frees
    timeline_requested: tuple[int, ...]  # same, exact requested bytes (mem_bytes_requested_in_use)
    held_bytes: int  # bytes of all regions the arena reserved (+ reserved bytes): what it holds
    regions: tuple[int, ...]  # region sizes in creation order

    @property
    def peak_requested_bytes(self) -> int:
        return max(self.timeline_requested, default=0)


# A kernel plan lists what one node does with the arena, in order:
#   ("out",)      allocate the node's new output buffers (all of them, in buffer id order)
#   ("tmp", n)    allocate a kernel-internal temporary of n bytes
#   ("free_tmp",) release the temporaries allocated so far
#   ("drop_tmp",) release the oldest temporary still held
# Outputs not allocated by the plan are allocated at its end; temporaries still held are
# released when the kernel returns, before the profiler reads in-use.  Without a plan a
# node allocates its outputs and nothing else.
KernelPlan = Sequence[tuple[str, *tuple[int, ...]]]


@dataclass
class RunTrace:
    in_use: list[int]
    requested: list[int]
    kernel_peak: list[int]


def _requests(buffers: Sequence[tuple[int, int, int]], steps: int) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """Per step (and one past the last), the buffers allocated there and those released
    after it; a step with none is absent (most steps of a large graph)."""
    alloc_at: dict[int, list[int]] = {}
    free_at: dict[int, list[int]] = {}
    for b, (size, first, last) in enumerate(buffers):
        if size <= 0:
            continue
        first = min(max(first, 0), steps)
        last = min(max(last, first), steps)
        alloc_at.setdefault(first, []).append(b)
        free_at.setdefault(last, []).append(b)
    return alloc_at, free_at


class _Replay:
    """A request sequence replayed through one arena, run after run: each buffer's chunk
    (``ptr``) survives from the step that allocates it to the one that releases it."""

    def __init__(self, buffers: Sequence[tuple[int, int, int]], steps: int, plans: dict[int, KernelPlan],
                 arena: BFCArena, held: Collection[int] = ()) -> None:
        self.arena = arena
        self.held = frozenset(held)
        self.held_chunks: list[int | None] = []
        self.steps = steps
        self.plans = plans
        self.sizes = [size for size, _, _ in buffers]
        self.alloc_at, self.free_at = _requests(buffers, steps)
        self.ptr: dict[int, int | None] = {}
        # an untraced run (one that only grows the arena) visits only the steps that do something
        self.busy = sorted(k for k in {*self.alloc_at, *self.free_at, *plans} if k < steps)

    def planned(self, k: int, plan: KernelPlan) -> int:
        """Run step ``k``'s kernel plan; the highest bytes in use while it ran."""
        arena, alloc, free = self.arena, self.arena.alloc, self.arena.free
        high = arena.in_use
        outs_done = False
        tmps: list[int | None] = []
        for ev in plan:
            if ev[0] == "out":
                if not outs_done:
                    self._allocate(k)
                    outs_done = True
            elif ev[0] == "tmp" and len(ev) == 2:
                tmps.append(alloc(ev[1]))
            elif ev[0] == "free_tmp":
                high = max(high, arena.in_use)
                for p in tmps:
                    free(p)
                tmps = []
            elif ev[0] == "drop_tmp":
                high = max(high, arena.in_use)
                free(tmps.pop(0))
            else:
                raise ValueError(f"unknown kernel plan event {ev!r}")
        if not outs_done:
            self._allocate(k)
        high = max(high, arena.in_use)
        for p in tmps:
            free(p)
        return high

    def _allocate(self, k: int) -> None:
        ptr, sizes, alloc = self.ptr, self.sizes, self.arena.alloc
        for b in self.alloc_at.get(k, ()):
            ptr[b] = alloc(sizes[b])

    def grow(self) -> None:
        """A run that is not traced: it only grows the arena."""
        ptr, sizes, plans, alloc_at, free_at = self.ptr, self.sizes, self.plans, self.alloc_at, self.free_at
        alloc, free = self.arena.alloc, self.arena.free
        for k in self.busy:
            plan = plans.get(k)
            if plan:
                self.planned(k, plan)
            else:
                for b in alloc_at.get(k, ()):
                    ptr[b] = alloc(sizes[b])
            for b in free_at.get(k, ()):
                free(ptr.pop(b))

    def traced(self, base: int, stop: int | None) -> tuple[RunTrace, bool]:
        """A traced run, ``base`` bytes added to every step; whether it stopped at a step
        whose bytes in use exceed ``stop`` (its trace cut there)."""
        tr = RunTrace([], [], [])
        in_use, requested, kernel_peak = tr.in_use, tr.requested, tr.kernel_peak
        ptr, sizes, plans, alloc_at, free_at = self.ptr, self.sizes, self.plans, self.alloc_at, self.free_at
        arena = self.arena
        alloc, free = arena.alloc, arena.free
        done = 0  # steps traced so far
        for k in [*self.busy, self.steps]:
            if k > done and self._idle(tr, k - done, base, stop):
                return tr, True
            if k == self.steps:
                break
            plan = plans.get(k)
            if plan:
                kernel_peak.append(self.planned(k, plan) + base)
            else:
                for b in alloc_at.get(k, ()):
                    ptr[b] = alloc(sizes[b])
                kernel_peak.append(arena.in_use + base)
            in_use.append(arena.in_use + base)
            requested.append(arena.requested_in_use + base)
            if stop is not None and arena.in_use > stop:
                return tr, True
            for b in free_at.get(k, ()):
                free(ptr.pop(b))
            done = k + 1
        return tr, False

    def _idle(self, tr: RunTrace, steps: int, base: int, stop: int | None) -> bool:
        """Trace ``steps`` steps that allocate and release nothing (most of a large graph's):
        the bytes stand as they are. Whether the run stops at the first of them."""
        now, requested = self.arena.in_use, self.arena.requested_in_use
        if stop is not None and now > stop:
            steps = 1
        tr.in_use.extend([now + base] * steps)
        tr.requested.extend([requested + base] * steps)
        tr.kernel_peak.extend([now + base] * steps)
        return stop is not None and now > stop

    def end_run(self) -> None:
        """Past the last node: what is allocated there (nothing in practice), then the graph
        outputs are released, as the caller drops them between runs."""
        self._allocate(self.steps)
        for b in self.free_at.get(self.steps, ()):
            if b in self.held:
                self.held_chunks.append(self.ptr.pop(b))
            else:
                self.arena.free(self.ptr.pop(b))


def replay(buffers: Sequence[tuple[int, int, int]], steps: int, *, runs: int = 2,
           small_initializer_bytes: int = 0, plans: dict[int, KernelPlan] | None = None,
           arena: BFCArena | None = None, last_only: bool = False,
           give_up_above: int | None = None) -> tuple[list[RunTrace], BFCArena]:
    """Replay the request sequence ``runs`` times through one arena.

    Within a step the node's new buffers are allocated in buffer id order (the order the
    kernel creates its outputs), then the buffers whose last step it is are released.
    The release order does not matter: BFC coalescing gives the same free chunks in any
    order.  Buffers that live to the end (``last_step >= steps``: graph outputs, and in
    ORT outputs nobody reads) are released between runs, as when the caller drops a run's
    outputs.  ``plans`` maps a step to its ``KernelPlan``. ``last_only``: trace the last
    run alone (the earlier ones only grow the arena; a plan search replays every order it
    judges). ``give_up_above``: the last run stops at the first step whose bytes in use
    exceed it (a caller that only needs to know the peak is higher), its trace cut there.
    """
    replayer = _Replay(buffers, steps, plans or {}, arena if arena is not None else BFCArena())
    limit = None if give_up_above is None else give_up_above - small_initializer_bytes
    traces: list[RunTrace] = []
    runs = max(1, runs)
    for run in range(runs):
        measured = run == runs - 1
        if last_only and not measured:
            replayer.grow()
        else:
            trace, stopped = replayer.traced(small_initializer_bytes, limit if measured else None)
            traces.append(trace)
            if stopped:
                return traces, replayer.arena
        replayer.end_run()
    return traces, replayer.arena


def run_holding(buffers: Sequence[tuple[int, int, int]], steps: int, plans: dict[int, KernelPlan],
                arena: BFCArena, held: Collection[int]) -> list[int | None]:
    """One untraced run of ``buffers`` through ``arena`` (``replay``'s rules) in which the
    buffers ``held``, living to the end, stay allocated past it, as a caller keeps a run's
    loss until its next run returns: their chunks, for the caller to free."""
    replayer = _Replay(buffers, steps, plans, arena, held)
    replayer.grow()
    replayer.end_run()
    return replayer.held_chunks


def arena_peak(profile: MemoryProfile, small_initializer_bytes: int = 0, *, runs: int = 2,
               plans: dict[int, KernelPlan] | None = None, arena: BFCArena | None = None,
               give_up_above: int | None = None) -> ArenaResult:
    """Predict ORT's arena numbers for a ``MemoryProfile`` (see the module doc).

    ``runs=2`` models ckpt's measurement (one warm-up run, then the measured run, in one
    session); ``runs=1`` a fresh session's first run.  ``small_initializer_bytes`` (ORT's
    ``baseline_bytes``) is added to every step.  ``plans``: kernel temporaries, from
    ``kernel_plans`` (without them Where nodes, for one, land their outputs elsewhere).
    ``give_up_above``: where the peak exceeds it, a result whose peak is the first step
    over it (higher than the bound, not the peak) and whose timelines stop there.
    """
    steps = len(profile.order)
    if runs == 2 and arena is None and native(steps):
        return _compiled_peak(profile, small_initializer_bytes, plans or {}, give_up_above)
    traces, arena = replay(profile.buffers, steps, runs=runs, small_initializer_bytes=small_initializer_bytes,
                           plans=plans, arena=arena, last_only=True, give_up_above=give_up_above)
    last = traces[-1]
    tl = last.in_use
    if tl:
        peak = max(tl)
        peak_step = tl.index(peak)
    else:
        peak, peak_step = small_initializer_bytes, 0
    return ArenaResult(peak_in_use_bytes=peak, peak_step=peak_step,
                       timeline_in_use=tuple(tl), timeline_requested=tuple(last.requested),
                       held_bytes=arena.held + small_initializer_bytes,
                       regions=tuple(s for _, s in arena.regions))


def _compiled_peak(profile: MemoryProfile, small_initializer_bytes: int, plans: dict[int, KernelPlan],
                   give_up_above: int | None) -> ArenaResult:
    """``arena_peak`` of a fresh arena, two runs, by ``native``'s kernels."""
    from ..native import new_arena, overflowed, region_sizes, replay_twice

    requests = _request_arrays(profile.buffers, len(profile.order), plans)
    allocs = len(requests.alloc_ids) + int(np.count_nonzero(requests.plan_events[:, 0] == _EVENT_CODES["tmp"]))
    config = (MIN_ALLOCATION_BYTES, DEFAULT_MAX_DEAD_BYTES_PER_CHUNK, DEFAULT_MAX_POWER_OF_TWO_EXTEND_BYTES)
    stop = _NEVER if give_up_above is None else give_up_above - small_initializer_bytes
    blocks = 16 + allocs // 256  # free chunks, by the hundred: a replay that runs out runs again with more
    while True:
        # a chunk per region and per split at most: one of each per allocation of the two runs
        arena = new_arena(4 * allocs + 4, blocks, rounded_bytes(DEFAULT_INITIAL_CHUNK_SIZE_BYTES), _ADDRESS_TOP, config)
        in_use, requested, _ = replay_twice(requests, arena, small_initializer_bytes, stop)
        if not overflowed(arena):
            break
        blocks *= 4
    peak, peak_step = (int(in_use.max()), int(in_use.argmax())) if len(in_use) else (small_initializer_bytes, 0)
    regions = region_sizes(arena)
    return ArenaResult(peak_in_use_bytes=peak, peak_step=peak_step, timeline_in_use=tuple(in_use.tolist()),
                       timeline_requested=tuple(requested.tolist()),
                       held_bytes=int(regions.sum()) + small_initializer_bytes, regions=tuple(regions.tolist()))


_NEVER = 1 << 62  # a stop no arena reaches
# native.PLAN_*, copied: importing native.py loads numba (tests/test_fast_paths.py keeps them equal)
_EVENT_CODES = {"out": 0, "tmp": 1, "free_tmp": 2, "drop_tmp": 3}


def _request_arrays(buffers: Sequence[tuple[int, int, int]], steps: int, plans: dict[int, KernelPlan]) -> Requests:
    """``_requests`` and ``plans`` as ``native.Requests``: rows by step, buffer id order within one."""
    from ..native import Requests

    table = np.fromiter(chain.from_iterable(buffers), dtype=np.int64, count=3 * len(buffers)).reshape(-1, 3)
    keep = np.flatnonzero(table[:, 0] > 0)
    first = np.clip(table[keep, 1], 0, steps)
    last = np.minimum(np.maximum(table[keep, 2], first), steps)
    planned = np.array(sorted(plans), dtype=np.int64)
    busy = np.unique(np.concatenate([first, last, planned]))
    rows = np.array([(k, *_event(ev)) for k in sorted(plans) if k < steps for ev in plans[k]],
                    dtype=np.int64).reshape(-1, 3)
    return Requests(table[:, 0].copy(), *_by_step(first, keep, steps), *_by_step(last, keep, steps), busy[busy < steps],
                    _by_step(rows[:, 0], np.arange(len(rows)), steps)[0], rows[:, 1:].copy())


def _event(ev: tuple[str, *tuple[int, ...]]) -> tuple[int, int]:
    """A kernel plan's event as (``native.PLAN_*`` kind, bytes)."""
    if ev[0] == "tmp" and len(ev) == 2:
        return _EVENT_CODES["tmp"], ev[1]
    if ev[0] in _EVENT_CODES and ev[0] != "tmp":
        return _EVENT_CODES[ev[0]], 0
    raise ValueError(f"unknown kernel plan event {ev!r}")


def _by_step(step: np.ndarray, ids: np.ndarray, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """``ids`` in rows by ``step`` (0 to ``steps``), their order kept within a row."""
    ptr = np.zeros(steps + 2, dtype=np.int64)
    np.cumsum(np.bincount(step, minlength=steps + 1), out=ptr[1:])
    return ptr, ids[np.argsort(step, kind="stable")]


# --------------------------------------------------------------------------- kernel plans

MLAS_CONV_WORKING_BUFFER_SIZE_PER_THREAD = 16384  # floats (mlas/lib/mlasi.h)
MLAS_SGEMM_THREAD_COMPLEXITY = 64 * 1024


def _static(shape: tuple[int | str, ...] | None) -> tuple[int, ...] | None:
    if shape is None:
        return None
    static = tuple(d for d in shape if isinstance(d, int))
    return static if len(static) == len(shape) else None


def _broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    n = max(len(a), len(b))
    a = (1,) * (n - len(a)) + a
    b = (1,) * (n - len(b)) + b
    return tuple(x if y == 1 else y for x, y in zip(a, b))


def _prod(xs: Iterable[int]) -> int:
    out = 1
    for x in xs:
        out *= x
    return out


def _conv_geometry(node: Node, x: tuple[int, ...], w: tuple[int, ...], y: tuple[int, ...]
                   ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...], int]:
    kernel = tuple(node.attr("kernel_shape") or w[2:])
    rank = len(kernel)
    pads = tuple(node.attr("pads") or (0,) * (2 * rank))
    strides = tuple(node.attr("strides") or (1,) * rank)
    dilations = tuple(node.attr("dilations") or (1,) * rank)
    group = int(node.attr("group") or 1)
    return kernel, pads, strides, dilations, group


def conv_working_bytes(node: Node, x: tuple[int, ...], w: tuple[int, ...], y: tuple[int, ...], threads: int = 1) -> int:
    """Bytes of the working buffer ORT's float Conv takes from the arena
    (``MlasConvPrepare`` in onnxruntime/core/mlas/lib/convolve.cpp, kernel rank 1-3)."""
    kernel, pads, strides, dilations, group = _conv_geometry(node, x, w, y)
    rank = len(kernel)
    if not 1 <= rank <= 3:  # generic im2col path: col buffer of kernel_dim * output size
        return 4 * (x[1] // group) * _prod(kernel) * _prod(y[2:])
    cin = x[1] // group
    filters = w[0] // group
    out_size = _prod(y[2:])
    k = cin * _prod(kernel)
    if all(s == 1 for s in strides) and all(p == 0 for p in pads):
        if k == cin:
            return 0  # pointwise: GEMM on the input directly
        if rank in (1, 2) and all(d == 1 for d in dilations) and cin == 1:
            in2 = x[2:] if rank == 2 else (1,) + tuple(x[2:])
            k2 = kernel if rank == 2 else (1,) + kernel
            if k2[1] == in2[1] or (k2[0] == in2[0] and k2[1] == 1):
                return 0
    if filters > out_size:
        return 4 * out_size * k
    # ExpandThenGemmSegmented: one working block per thread.  (Newer MLAS sources size it
    # by batch * group when either is > 1; ORT 1.31.1, the version modelled here, does not.)
    threads = max(1, threads)
    complexity = filters * out_size * k
    target = int(complexity / MLAS_SGEMM_THREAD_COMPLEXITY) + 1 if complexity < MLAS_SGEMM_THREAD_COMPLEXITY * 64 else 64
    return 4 * min(target, threads) * MLAS_CONV_WORKING_BUFFER_SIZE_PER_THREAD


# (domain, op type) of the kernels whose temporaries ``kernel_plans`` replays in the arena:
# a measure on the arena counts their working memory already
VARIADIC_OPS = ("Sum", "Mean", "Max", "Min")
ARENA_REPLAYED = frozenset({("", "Where"), ("", "Conv"), ("", "ConvTranspose"), *(("", op) for op in VARIADIC_OPS)})


def kernel_plans(graph: Graph, order: Sequence[int], tensors: dict[str, TensorInfo],
                 threads: int = 1) -> dict[int, KernelPlan]:
    """Kernel plans (see ``replay``) for the nodes of ``order`` whose ORT CPU kernels take
    temporaries from the arena, where the shapes are known:

    - Where (tensor/where_op.cc): X_selection = broadcast(cond, X) and Y_selection =
      broadcast(cond, Y) are allocated BEFORE the output and released after it, so they
      move where the output lands.
    - Conv (nn/conv.cc, float): output first, then the MLAS working buffer.
    - ConvTranspose (nn/conv_transpose.cc): output first, then the col buffer
      (C_out/group * kernel size * input image size floats).
    - Sum, Mean, Max, Min of three or more inputs: ``ort.scratch.variadic_temporaries``,
      each taken before the output.
    Temporaries taken after the outputs leave the free lists as they were; they only
    count when they force the arena to grow.
    """
    plans: dict[int, KernelPlan] = {}

    def shape(t: str) -> tuple[int, ...] | None:
        info = tensors.get(t)
        return _static(info.shape) if info is not None else None

    sized = sized_by(tensors)

    def elem(t: str) -> int | None:
        info = tensors.get(t)
        static = _static(info.shape) if info is not None else None
        if info is None or info.nbytes is None or static is None:  # sized: its shape is static
            return None
        n = _prod(static)
        return info.nbytes // n if n else None

    for k, i in enumerate(order):
        node = graph.nodes[i]
        op = node.op_type
        if node.domain not in ("", "ai.onnx"):
            continue
        ins = node.inputs
        if op == "Where" and len(ins) == 3:
            c, x, y = (shape(t) for t in ins)
            ex, ey = elem(ins[1]), elem(ins[2])
            if c is None or x is None or y is None or ex is None or ey is None:
                continue
            plans[k] = (("tmp", ex * _prod(_broadcast(c, x))), ("tmp", ey * _prod(_broadcast(c, y))),
                        ("out",), ("free_tmp",))
        elif op in ("Conv", "ConvTranspose") and len(ins) >= 2 and node.outputs:
            x, w, y = shape(ins[0]), shape(ins[1]), shape(node.outputs[0])
            if x is None or w is None or y is None or len(x) < 3 or elem(ins[0]) != 4:
                continue
            if op == "Conv":
                n = conv_working_bytes(node, x, w, y, threads)
            else:
                kernel, _, _, _, group = _conv_geometry(node, x, w, y)
                cout = w[1] * group  # ConvTranspose weights are [C_in, C_out/group, k...]
                n = 4 * (cout // group) * _prod(kernel) * _prod(x[2:])
            if n:
                plans[k] = (("out",), ("tmp", n))
        elif op in VARIADIC_OPS and (found := variadic_temporaries(node, sized)) is not None:
            plans[k] = variadic_plan(found[0])
    return plans


def variadic_plan(temps: list[int]) -> KernelPlan:
    """A variadic kernel's temporaries (``ort.scratch.variadic_temporaries``): each new one
    made before the one it replaces is released, the last one held while the output is made."""
    events: list[tuple[str, *tuple[int, ...]]] = [("tmp", temps[0])]
    for n in temps[1:]:
        events += [("tmp", n), ("drop_tmp",)]
    return (*events, ("out",), ("free_tmp",))


SMALL_INITIALIZER_BYTES = 128  # ORT keeps initializers below this size in the arena


def small_initializer_bytes(graph: Graph, tensors: dict[str, TensorInfo]) -> int:
    """Bytes of the initializers ORT places in the arena for the whole session (it drops
    those no node reads)."""
    read, outputs = graph.consumers, set(graph.outputs)  # looked up, not copied: a plan search replays often
    return sum(info.nbytes for t in graph.initializers
               if (t in read or t in outputs) and (info := tensors.get(t)) is not None and info.nbytes is not None
               and info.nbytes < SMALL_INITIALIZER_BYTES)


def predict_in_use(graph: Graph, profile: MemoryProfile, tensors: dict[str, TensorInfo],
                   give_up_above: int | None = None) -> ArenaResult:
    """ORT's arena figures (bytes in use, held) for one simulated order of ``graph``,
    as ckpt's check measures them (after one warm-up run); ``give_up_above``: as ``arena_peak``."""
    return arena_peak(profile, small_initializer_bytes(graph, tensors),
                      plans=kernel_plans(graph, profile.order, tensors), give_up_above=give_up_above)
