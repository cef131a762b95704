"""The written order of a rewritten graph and ORT's buffer reuse for it, chosen together.

Candidates are the memory-aware order, the plain executed order and, for a reorder-only
rewrite, ORT's DEFAULT order; beside recompute copies, the order whose seedless backward
nodes wait for their reader, taken where it wins by WAITING_MARGIN, the arena reserves no
more, and the graph, as written, holds no more in ORT's DEFAULT order than without it. A
written graph takes the candidate and ``enable_mem_reuse`` of lowest predicted arena peak
(then tensor bytes); a plan search's memory model (``model_only``) takes the order of
lowest simulated tensor peak, reuse on, no arena. ``ScheduleCache`` remembers the choice
per graph for one plan search.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from ..analysis import Analysis, schedules
from ..analysis.arena import ArenaResult, predict_in_use
from ..analysis.memory import MemoryProfile, buffer_roots, simulate, simulate_deferred
from ..analysis.shapes import TensorInfo
from ..analysis.phases import BACKWARD
from ..graph import Graph
from ..markers import PHASE_META
from ..planning.evaluate import ScheduleMemo
from .fresh import FreshResult, unshared
from .order import buffer_reads, executed_order, memory_aware, seedless
from .pin import GUARD_MIN_OPSET, PinResult, pin

# Turning ORT's buffer reuse off must win by this much: the arena model is exact with
# reuse on, within a few percent with it off.
MEM_REUSE_OFF_MARGIN = 0.05
# The order whose seedless backward nodes wait for their readers must win by this much (zoo
# denoiser: 10%, its Pow gradients' factors; the joint-graph samples: a few bytes or nothing).
WAITING_MARGIN = 0.01


@dataclass(frozen=True)
class Schedule:
    """A graph in its written (= executed) order, its simulation, the buffer reuse it asks
    ORT for, and the arena replay that chose it (None for a plan search's model)."""

    graph: Graph
    profile: MemoryProfile
    mem_reuse: bool
    arena: ArenaResult | None
    # pin's guards of ``graph`` (no waits, unsplit) where the DEFAULT-order check made them:
    # the written graph's own, not made again (a pin of a 100k-node graph takes a second)
    pin: PinResult | None = None
    # and ``fresh.unshare`` of that pin where the same check made it (on graphs up to
    # fresh's _GREEDY_NODES: its greedy simulates the whole graph tens of times)
    fresh: FreshResult | None = None


# A graph's nodes as a schedule cache key, and what it remembers: the chosen order (None:
# the graph's own), its simulation, ORT's buffer reuse and the arena replay.
ScheduleKey = tuple[bool, tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...]]
Chosen = tuple[Graph, MemoryProfile, bool, ArenaResult | None]


class ScheduleCache:
    """The schedules chosen for the graphs one plan search rewrote, kept in ``memo.orders``
    (the search owns ``memo``): two plans that place the same copies the same way share the
    choice, which is most of a rewrite's time."""

    def __init__(self, memo: ScheduleMemo) -> None:
        self.memo = memo

    @staticmethod
    def _key(graph: Graph, model_only: bool) -> ScheduleKey:
        return (model_only, tuple((n.name, n.inputs, n.outputs) for n in graph.nodes))

    def get(self, graph: Graph, model_only: bool) -> Schedule | None:
        known = self.memo.orders.get(self._key(graph, model_only))
        if known is None:
            return None
        written, profile, mem_reuse, arena = known
        return Schedule(graph if written is None else graph.reordered(written), profile, mem_reuse, arena)

    def put(self, graph: Graph, model_only: bool, chosen: Schedule) -> None:
        at = {n.name: k for k, n in enumerate(graph.nodes)}
        order = [at[n.name] for n in chosen.graph.nodes]
        self.memo.orders[self._key(graph, model_only)] = (None if order == list(range(len(order))) else order,
                                                         chosen.profile, chosen.mem_reuse, chosen.arena)


def choose_schedule(a: Analysis, new: Graph, tensors: dict[str, TensorInfo], copy_names: set[str], forward_names: set[str],
                    model_only: bool, cache: ScheduleCache | None = None) -> Schedule:
    """The schedule of ``new`` (the surgery's graph), from ``cache`` when it has it."""
    known = cache.get(new, model_only) if cache is not None else None
    if known is not None:
        return known
    memo = cache.memo if cache is not None else ScheduleMemo(a)  # a rewrite of its own: its own memo
    chosen = _choose(a, new, tensors, copy_names, forward_names, model_only, memo)
    if cache is not None:
        cache.put(new, model_only, chosen)
    return chosen


def _choose(a: Analysis, new: Graph, tensors: dict[str, TensorInfo], copy_names: set[str], forward_names: set[str],
            model_only: bool, memo: ScheduleMemo) -> Schedule:
    """The written order of ``new`` and ORT's buffer reuse for it."""
    candidates, waiting = _candidates(new, tensors, copy_names, forward_names, memo)
    judged = Judged()  # the second choice judges the first one's graphs again

    def choice(waiting: Graph | None) -> Chosen:
        if model_only:
            return _lowest_tensor_peak(candidates, tensors, waiting, judged)
        return choose_order_and_reuse(a, candidates, tensors, memo, waiting, judged)

    chosen = choice(waiting)
    if waiting is None or chosen[0] is not waiting:
        return Schedule(*chosen)
    other = choice(None)
    # what the pinning below holds besides chosen's and other's graphs: nothing of the choice
    judged.drop()
    candidates.clear()
    if chosen[3] is not None and other[3] is not None and chosen[3].held_bytes > other[3].held_bytes:
        # what the arena reserves is what a process holds (zoo mlp_dropout's sqrt, waiting:
        # 0.6 MB less in use, 4.2 MB more reserved)
        return Schedule(*other)
    peak = _default_order_peak(a, chosen, tensors, forward_names, not model_only)[0]
    # Marked as it is written, so that its pin is the written graph's, kept where it wins:
    # the waiting order rarely does (the synthetic transformers; chosen's pin is not kept,
    # two pinned graphs held at once would raise a large rewrite's peak). other is taken
    # only below chosen's peak: past it, its replay stops.
    other = _marked(other, forward_names)
    other_peak, pinned, fresh = _default_order_peak(a, other, tensors, forward_names, not model_only, peak)
    return Schedule(*chosen) if peak <= other_peak else Schedule(*other, pin=pinned, fresh=fresh)


def _marked(chosen: Chosen, forward_names: set[str]) -> Chosen:
    return (mark_early_backward(chosen[0], forward_names), *chosen[1:])


def mark_early_backward(graph: Graph, forward_names: set[str]) -> Graph:
    """Tag backward nodes written before the last forward node (the memory-aware order
    runs some early), so that analysing the written file classifies them the same."""
    last_forward = max((n.index for n in graph.nodes if n.name in forward_names), default=-1)
    marked: dict[int, onnx.NodeProto] = {}
    for n in graph.nodes:
        if n.index < last_forward and n.name not in forward_names and n.meta(PHASE_META) != BACKWARD:
            p = marked[n.index] = onnx.NodeProto()
            p.CopyFrom(n.proto)  # the input graph's protos are never modified
            entry = p.metadata_props.add()
            entry.key, entry.value = PHASE_META, BACKWARD
    return graph.remarked(marked) if marked else graph


def _candidates(new: Graph, tensors: dict[str, TensorInfo], copy_names: set[str], forward_names: set[str],
                memo: ScheduleMemo) -> tuple[list[Graph], Graph | None]:
    """The candidate written orders of ``new`` and its waiting order (None: not offered)."""
    sizes = {t: info.nbytes for t, info in tensors.items() if info.nbytes}
    roots, movable = buffer_roots(new), [n.name not in forward_names for n in new.nodes]
    copies = [n.name in copy_names for n in new.nodes]
    reads = buffer_reads(new, sizes, roots)  # both memory-aware orders' one pass of the graph
    order = memory_aware(new, reads, movable, copies)
    candidates = [executed_order(new, order), executed_order(new)]
    if not copy_names:
        # Reordering only: ORT's DEFAULT order is a candidate too (where the order sets the
        # peak it can beat both). With copies it would run them right after their inputs.
        candidates.append(executed_order(new, schedules.ort_default(new)))
    # only beside recompute copies: a reordering alone would displace the plans that recompute
    # (zoo mlp's, trained in the Module: 0.92x the original under its settings against 1.00x)
    unseeded = seedless(new, movable) if copy_names and memo.waiting else [False] * len(new.nodes)
    waiting = None
    if any(u and not c for u, c in zip(unseeded, copies)):
        lazy = [u or c for u, c in zip(unseeded, copies)]
        waiting = executed_order(new, memory_aware(new, reads, movable, lazy))
    return candidates, waiting


def _default_order_peak(a: Analysis, chosen: Chosen, tensors: dict[str, TensorInfo], forward_names: set[str],
                        arena: bool, above: int | None = None
                        ) -> tuple[int, PinResult | None, FreshResult | None]:
    """The peak of ``chosen``'s graph as it is written (pinned, its fresh tensors made:
    ``rewrite/pin.py``, ``rewrite/fresh.py``) when a session runs it in ORT's DEFAULT order (a
    plain InferenceSession, the Module API untuned): the arena in use, or without ``arena``
    the live tensors. The waiting order is judged there too: what it lowers holds only in
    the file's order, and the nodes it moves can lift DEFAULT's peak (gpt12's hull plans: a
    plain session measured 174 MB against 107 MB without it; the ORT example artifact's
    min cut: 10.0 MiB predicted in the Module API's session against 9.0). With ``arena``, a
    peak above ``above`` may come back as a lower figure still above it. Also pin's
    guards of the graph (None below ``GUARD_MIN_OPSET``) and their fresh tensors (None where
    not made: no guards, or a graph above fresh's _GREEDY_NODES)."""
    graph, _, reuse, _ = chosen
    pinned = fresh = None
    if (a.graph.opset("") or 0) >= GUARD_MIN_OPSET:
        pinned = pin(graph, tensors, forward_names)
        graph, tensors = pinned.graph, pinned.tensors
        if pinned.guard_nodes:
            fresh = unshared(graph, tensors, reuse, frozenset(forward_names))
            if fresh is not None:
                graph, tensors = fresh.graph, fresh.tensors
    profile = simulate(graph, schedules.ort_default(graph), tensors)
    if not arena:
        return profile.peak_bytes, pinned, fresh
    if above is not None and profile.activation_peak_bytes > above:
        # the arena never has fewer bytes in use than the live tensors
        return profile.activation_peak_bytes, pinned, fresh
    return predict_in_use(graph, profile, tensors, above).peak_in_use_bytes, pinned, fresh


class Judged:
    """The simulations and arena replays of one ``_choose``'s candidate graphs, by graph
    (alive while it runs): its two choices, with the waiting order and without, judge the
    same candidates, and a simulation of a 100k-node graph is a walk of every node."""

    def __init__(self) -> None:
        self.reuse: dict[int, MemoryProfile] = {}
        self.no_reuse: dict[int, MemoryProfile] = {}
        self.replayed: dict[tuple[int, bool, int | None], ArenaResult] = {}

    def on(self, graph: Graph, tensors: dict[str, TensorInfo]) -> MemoryProfile:
        """``simulate`` of ``graph`` in its own order, buffer reuse on."""
        if id(graph) not in self.reuse:
            self.reuse[id(graph)] = simulate(graph, list(range(len(graph.nodes))), tensors)
        return self.reuse[id(graph)]

    def both(self, graph: Graph, tensors: dict[str, TensorInfo]) -> tuple[MemoryProfile, MemoryProfile]:
        """``simulate_both`` of ``graph`` in its own order."""
        if id(graph) not in self.no_reuse:
            on, off = simulate_deferred(graph, list(range(len(graph.nodes))), tensors)
            self.reuse[id(graph)], self.no_reuse[id(graph)] = on, off()
        return self.reuse[id(graph)], self.no_reuse[id(graph)]

    def drop(self) -> None:
        """Forget them all (a large graph's profiles are tens of MB)."""
        self.reuse.clear()
        self.no_reuse.clear()
        self.replayed.clear()

    def arena(self, graph: Graph, profile: MemoryProfile, tensors: dict[str, TensorInfo], reuse: bool,
              bound: int | None) -> ArenaResult:
        """``predict_in_use`` of ``graph``'s simulation ``profile`` (with ``reuse``) up to ``bound``."""
        key = (id(graph), reuse, bound)
        known = self.replayed.get(key)
        if known is None:
            known = self.replayed[key] = predict_in_use(graph, profile, tensors, bound)
        return known


def choose_order_and_reuse(a: Analysis, candidates: list[Graph], tensors: dict[str, TensorInfo],
                           memo: ScheduleMemo | None = None, waiting: Graph | None = None,
                           judged: Judged | None = None) -> Chosen:
    """Pick the written order (the memory-aware one or the plain one) and ORT's
    ``enable_mem_reuse`` together, by the predicted arena peak, then the tensor bytes.

    ORT's planner keeps a freed buffer allocated until a later tensor of the same shape
    reuses it; with reuse off every buffer is released at its last read (and nothing runs
    in place). Reuse off is only taken where it also keeps the rewrite clearly below the
    original under that setting, which is what ``ckpt check`` compares.

    The arena replay costs as much as the simulation, and the arena never has fewer bytes
    in use than the live tensors: options are replayed from the lowest tensor peak up, and
    one whose tensor peak already exceeds the best arena peak found is not replayed.
    ``waiting``: the order whose seedless backward nodes wait for their readers, taken only
    where it wins by WAITING_MARGIN (an order a few bytes lower is not worth a new file).
    ``judged``: the candidates' simulations and replays so far."""
    judged = judged if judged is not None else Judged()
    simulated: list[tuple[float, int, Graph, MemoryProfile, bool, float]] = []
    for graph in _distinct(candidates + ([waiting] if waiting is not None else [])):
        for reuse, profile in zip((True, False), judged.both(graph, tensors)):
            scale = (1.0 if reuse else 1 / (1 - MEM_REUSE_OFF_MARGIN)) / (1 - WAITING_MARGIN * (graph is waiting))
            simulated.append((profile.activation_peak_bytes * scale, len(simulated), graph, profile, reuse, scale))
    best: tuple[float, int, int, Graph, MemoryProfile, bool, ArenaResult] | None = None

    original = memo if memo is not None else ScheduleMemo(a)  # for the input's reuse-off arena

    def clearly_lower() -> float:
        return original.no_reuse_in_use() * (1 - MEM_REUSE_OFF_MARGIN)

    for bound, k, graph, profile, reuse, scale in sorted(simulated, key=lambda o: o[:2]):
        if best is not None and bound > best[0]:
            break  # sorted by bound: no later option can win either
        # The original's own arena with reuse off (a replay of the input) is only needed
        # where a reuse-off option would win: a losing one is known from its own replay.
        if not reuse and (best is None or original.no_reuse_known) and profile.activation_peak_bytes > clearly_lower():
            continue
        # an option whose arena passes the best one's is lost: its replay stops there
        # (replaying a loser to its end costs time and changes nothing)
        arena = judged.arena(graph, profile, tensors, reuse, None if best is None else int(best[0] / scale))
        in_use = arena.peak_in_use_bytes
        option = (in_use * scale, profile.peak_bytes, k, graph, profile, reuse, arena)
        if best is not None and option[:3] >= best[:3]:
            continue
        if not reuse and max(in_use, profile.activation_peak_bytes) > clearly_lower():
            continue
        best = option
    assert best is not None  # each candidate's reuse-on option is taken unless a better one was
    return best[3:]


def _distinct(candidates: list[Graph]) -> list[Graph]:
    """The candidate orders, each once (the heuristic order can be the plain one)."""
    seen: set[tuple[str, ...]] = set()
    out = []
    for graph in candidates:
        names = tuple(n.name for n in graph.nodes)
        if names not in seen:
            seen.add(names)
            out.append(graph)
    return out


def _lowest_tensor_peak(candidates: list[Graph], tensors: dict[str, TensorInfo],
                        waiting: Graph | None = None, judged: Judged | None = None) -> Chosen:
    """``_choose_order_and_reuse`` for a ``model_only`` rewrite: reuse on, the order of lowest
    simulated tensor peak (first on ties; ``waiting`` by WAITING_MARGIN), no arena."""
    judged = judged if judged is not None else Judged()
    options = [(judged.on(graph, tensors), k, graph)
               for k, graph in enumerate(_distinct(candidates + ([waiting] if waiting is not None else [])))]
    profile, _, graph = min(options, key=lambda o: (o[0].peak_bytes / (1 - WAITING_MARGIN * (o[2] is waiting)), o[1]))
    return graph, profile, True, None
