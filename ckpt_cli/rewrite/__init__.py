"""The rewrite stage: ``Analysis + Plan -> RewriteResult`` (a new graph in its executed order)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import onnx

from ..analysis import Analysis, analyse, schedules
from ..analysis.arena import predict_in_use
from ..analysis.memory import buffer_roots, simulate, simulate_both
from ..analysis.phases import BACKWARD
from ..graph import Graph, Node, gc_paused
from ..markers import PHASE_META
from ..units import human_bytes
from ..planning.decision import Decision, region_decisions, settle
from ..planning.plan import Plan
from .fresh import FreshResult, unshare
from .mem_pattern import PatternOff, is_ort_artifact, pattern_off
from .order import executed_order, interleave, memory_aware, prune_dead
from .pin import GUARD_MIN_OPSET, PinResult, pin as pin_schedule
from .recompute import (RegionResult, drop_unused_optional_outputs, plan_recompute, rewire_backward)


@dataclass
class RewriteResult:
    graph: Graph  # nodes in the written (= executed) order
    after: Analysis
    regions: list[RegionResult]
    recompute_nodes: int
    recompute_flops: int
    mem_reuse: bool = True  # the SessionOptions.enable_mem_reuse the written graph should run with
    pinned: PinResult | None = None  # the guards that hold the order (None: --no-pin)
    fresh: FreshResult | None = None  # tensors hidden from ORT's buffer reuse (with --pin)
    pattern_off: PatternOff | None = None  # the input that turns ORT's memory pattern off (written.py adds it)
    no_gain: str | None = None  # why the plan was dropped for the unchanged graph (it lowered nothing)
    warning: str | None = None  # set when a user's plan raises the predicted peak
    session: str = "ckpt"  # the session the written graph is for: "ckpt" settings, or "ort_default"
    decisions: dict[str, Decision] = field(default_factory=dict)  # per stashed buffer of the input: the final word
    notes: tuple[str, ...] = ()  # what the rewrite found about the plan (regions that recompute nothing)

    @property
    def guard_nodes(self) -> int:
        return self.pinned.guard_nodes if self.pinned is not None else 0

    @property
    def no_gain_reason(self) -> str | None:
        """The one line saying the plan was dropped, why, and what was written instead."""
        if self.no_gain is None:
            return None
        but = " but for the input that turns ORT's memory pattern off" if self.pattern_off is not None else ""
        return f"{self.no_gain}; wrote the graph unchanged{but} (run it as the original, with ORT's defaults)"


@gc_paused
def rewrite(a: Analysis, plan: Plan | None, pin: bool = True, model_only: bool = False,
            memo: dict | None = None) -> RewriteResult:
    """Apply ``plan`` to the analysed graph; ``plan=None`` only reorders (``--no-recompute``).
    ``pin`` adds the guards that keep the written order under any session (``rewrite/pin.py``).
    ``model_only``: the rewrite is a plan search's memory model, never written or judged
    (the floor of a 100k-node structure search): its order is the one of lowest simulated
    tensor peak with ORT's buffer reuse on, without the arena replays that choose a written
    graph's order and reuse (the per-layer floor of a 704-layer transformer: 5.5 s against
    7.4 s, the same order and peak). ``memo``: a
    plan search's record of the orders chosen for the graphs it rewrote; two plans that
    place the same copies the same way (their keep sets differ only where nothing changes)
    share the choice, which is most of a rewrite's time (14 of gpt's 98 rewrites at a 65%
    budget, 19 of cnn's 110 at 80%)."""
    g = a.graph
    order = a.priority.order
    if plan is None or not plan.regions:
        nodes = [g.nodes[i] for i in order]
        regions: list[RegionResult] = []
        tensors = a.tensors
        copy_names: set[str] = set()
        rec = None
    else:
        rec = plan_recompute(a, plan)
        # Indexed nodes rather than protos from here on: reading protos back is slow.
        rewired = [n if p is n.proto else Node.from_proto(n.index, p)
                   for n, p in zip(g.nodes, rewire_backward(a, rec.renamed))]
        copies = {i: Node.from_proto(i, p) for i, p in rec.copies.items()}
        position = {i: k for k, i in enumerate(i for i in order if not a.phases.is_forward[i])}
        forward = [rewired[i] for i in order if a.phases.is_forward[i]]
        backward = [rewired[i] for i in order if not a.phases.is_forward[i]]
        blocks = []
        for r, block in enumerate(rec.blocks):
            recomputed = {rec.renamed[t] for t in rec.regions[r].recomputed}
            readers = [position[c] for t in rec.regions[r].recomputed for c in g.consumers.get(t, ())
                       if c in position and recomputed.intersection(rewired[c].inputs)]
            if block and readers:
                first = min(readers)
                blocks.append((first, [copies[i] for i in block]))
                rec.regions[r].placed_before = backward[first].name
        nodes = interleave(forward, backward, blocks)
        regions, tensors = rec.regions, rec.tensors
        copy_names = {n.name for n in copies.values()}

    new = g.with_node_list(prune_dead(nodes, set(g.outputs)))
    changed = drop_unused_optional_outputs(new, copy_names)
    if changed:
        new = new.replaced({i: new.nodes[i].proto for i in changed})
    forward_names = {n.name for n in g.nodes if a.phases.is_forward[n.index]}
    key, known = None, None
    if memo is not None:
        key = (model_only, tuple((n.name, n.inputs, n.outputs) for n in new.nodes))
        known = memo.get(key)
    if known is not None:
        written, profile, mem_reuse, arena = known
        chosen = new if written is None else new.reordered(written)
    else:
        chosen, profile, mem_reuse, arena = _choose(a, new, tensors, copy_names, forward_names, model_only)
        if memo is not None:
            at = {n.name: k for k, n in enumerate(new.nodes)}
            order = [at[n.name] for n in chosen.nodes]
            memo[key] = (None if order == list(range(len(order))) else order, profile, mem_reuse, arena)
    new = _mark_early_backward(chosen, forward_names)
    # The written order is its own PRIORITY_BASED order (executed_order), so the
    # simulation above is the after-analysis's; phase markers change no tensor.
    after = analyse(new, loss=a.phases.loss, grad_outputs=list(a.phases.grad_outputs), tensors=tensors,
                    priority=profile, reuse_buffers=mem_reuse, deferred=True)
    if arena is not None:
        after.remember_arena(mem_reuse, arena)
    copies = [n for n in new.nodes if n.name in copy_names]
    # A copy costs what its source costs (same op, same shapes): the input's costs, priced once.
    source = {p.name: i for i, p in rec.copies.items()} if rec is not None else {}
    flops = sum(a.costs[source[n.name]].flops for n in copies)
    decisions = dict(plan.decisions) if plan is not None else {}
    if rec is not None:
        # a plan made by hand (no strategy) states no intent: its regions are it
        decisions = settle(plan.decisions or region_decisions(a, plan.regions), rec.found, rec.recomputed)
    result = RewriteResult(new, after, regions, len(copies), flops, mem_reuse, decisions=decisions)
    return pinned(a, result) if pin else result


def _choose(a: Analysis, new: Graph, tensors, copy_names: set[str], forward_names: set[str],
            model_only: bool) -> tuple:
    """The written order of ``new`` and ORT's buffer reuse for it: (graph, profile, reuse, arena)."""
    sizes = {t: info.nbytes for t, info in tensors.items() if info.nbytes}
    order = memory_aware(new, sizes, buffer_roots(new), [n.name not in forward_names for n in new.nodes],
                         [n.name in copy_names for n in new.nodes])
    candidates = [executed_order(new, order), executed_order(new)]
    if not copy_names:
        # Reordering only: ORT's DEFAULT order is a candidate too (where the order sets the
        # peak it can beat both). With copies it would run them right after their inputs.
        candidates.append(executed_order(new, schedules.ort_default(new)))
    choose = _lowest_tensor_peak if model_only else _choose_order_and_reuse
    return choose(a, candidates, tensors)


@gc_paused
def pinned(a: Analysis, result: RewriteResult) -> RewriteResult:
    """``rewrite(a, plan)`` from ``result = rewrite(a, plan, pin=False)``: its graph with
    pin's guards (a plan search's rewrite is not redone for the written one)."""
    opset = a.graph.opset("") or 0
    if opset < GUARD_MIN_OPSET:
        why = (f"no guards at opset {opset} (their ops need {GUARD_MIN_OPSET}): the written order holds under "
               "ckpt's session settings (PRIORITY_BASED), not in a plain session")
        return replace(result, pinned=PinResult(result.graph, result.after.tensors, 0, 0, 0, 0, skipped=why))
    forward_names = {n.name for n in a.graph.nodes if a.phases.is_forward[n.index]}
    guarded = pin_schedule(result.graph, result.after.tensors, forward_names)
    if not guarded.guard_nodes:
        return replace(result, pinned=guarded)
    # Only with copies: buffers parked across the recompute gap are theirs to lose.
    fresh = unshare(guarded.graph, guarded.tensors, result.mem_reuse, frozenset(forward_names))
    after = analyse(fresh.graph, loss=a.phases.loss, grad_outputs=list(a.phases.grad_outputs), tensors=fresh.tensors,
                    priority=fresh.profile, reuse_buffers=result.mem_reuse, deferred=True)
    after.remember_arena(result.mem_reuse, fresh.arena)
    return replace(result, graph=fresh.graph, after=after, pinned=guarded, fresh=fresh)


def without_mem_pattern(result: RewriteResult) -> RewriteResult:
    """``result``, to be written with the input that turns ORT's memory pattern off where
    ckpt predicts that lowers a plain session's peak (``rewrite/mem_pattern.py``)."""
    return replace(result, pattern_off=pattern_off(result.graph, result.after.tensors))


def unchanged(a: Analysis) -> RewriteResult:
    """The input graph as it is: what ckpt writes when no plan lowers the peak. Every
    session then runs it exactly as it runs the original, so it is never worse. A file
    out of topological order is sorted (onnx's checker requires it). An ORT training artifact
    in a topological order keeps it even where PRIORITY_BASED would run another: the Module
    API's session runs it by node position in its DEFAULT order, and re-sorted it can run
    worse there. PRIORITY_BASED runs either as ckpt
    simulates it."""
    order = list(a.priority.order)
    in_file_order = list(range(len(order)))
    sorted_file = a.graph.topological_order() == in_file_order
    keep = order == in_file_order or (sorted_file and is_ort_artifact(a.graph))
    return RewriteResult(a.graph if keep else a.graph.reordered(order), a, [], 0, 0, session="ort_default")


def original_best(a: Analysis) -> tuple[int, str]:
    """The original's lowest predicted arena peak over the orders and buffer-reuse settings a
    user can pick (ORT's defaults included; fusions are not simulated), and which it is."""
    from ..analysis.arena import predict_in_use

    return min((a.arena_in_use(True), "its file order"),
               (a.arena_in_use(False), "its file order with enable_mem_reuse=False"),
               (predict_in_use(a.graph, a.default, a.tensors).peak_in_use_bytes, "ORT's DEFAULT order"))


# ORT training artifacts run in the Module API's session: ORT's defaults (DEFAULT order, its
# arena, the memory pattern on). ckpt's arena model of that session misses small graphs by
# a few percent either way, so a rewrite of an artifact is written only where it is
# predicted this much lower there (the measurements are in the commit that set it).
MODULE_MARGIN = 0.10


def module_shortfall(a: Analysis, result: RewriteResult) -> str | None:
    """Why ``result`` may not be lower than the original in the Module API's own session,
    or None: its predicted arena peak in ORT's DEFAULT order is not MODULE_MARGIN below the
    original's there."""
    graph, tensors = result.graph, result.after.tensors
    after = predict_in_use(graph, simulate(graph, schedules.ort_default(graph), tensors), tensors).peak_in_use_bytes
    before = predict_in_use(a.graph, a.default, a.tensors).peak_in_use_bytes
    if after <= before * (1 - MODULE_MARGIN):
        return None
    return (f"in the Module API's own session (ORT's defaults, DEFAULT order) the rewrite's predicted peak "
            f"{human_bytes(after)} is not {MODULE_MARGIN:.0%} below the original's {human_bytes(before)}")


def original_floor(a: Analysis) -> int:
    """A lower bound of ``original_best`` without its arena replays (3.5 s of a 100k-node
    plan): the arena never has fewer bytes in use than the live tensors."""
    return min(a.profile(True).activation_peak_bytes, a.profile(False).activation_peak_bytes,
               a.default.activation_peak_bytes)


# Turning ORT's buffer reuse off must win by this much: the arena model is exact with
# reuse on, within a few percent with it off.
MEM_REUSE_OFF_MARGIN = 0.05


def _choose_order_and_reuse(a: Analysis, candidates: list[Graph], tensors) -> tuple:
    """Pick the written order (the memory-aware one or the plain one) and ORT's
    ``enable_mem_reuse`` together, by the predicted arena peak, then the tensor bytes.

    ORT's planner keeps a freed buffer allocated until a later tensor of the same shape
    reuses it; with reuse off every buffer is released at its last read (and nothing runs
    in place). Reuse off is only taken where it also keeps the rewrite clearly below the
    original under that setting, which is what ``ckpt check`` compares.

    The arena replay costs as much as the simulation, and the arena never has fewer bytes
    in use than the live tensors: options are replayed from the lowest tensor peak up, and
    one whose tensor peak already exceeds the best arena peak found is not replayed."""
    simulated = []
    for graph in _distinct(candidates):
        for reuse, profile in zip((True, False), simulate_both(graph, list(range(len(graph.nodes))), tensors)):
            scale = 1.0 if reuse else 1 / (1 - MEM_REUSE_OFF_MARGIN)
            simulated.append((profile.activation_peak_bytes * scale, len(simulated), graph, profile, reuse, scale))
    best = None

    def clearly_lower() -> float:
        return a.arena_in_use(False) * (1 - MEM_REUSE_OFF_MARGIN)

    for bound, k, graph, profile, reuse, scale in sorted(simulated, key=lambda o: o[:2]):
        if best is not None and bound > best[0]:
            break  # sorted by bound: no later option can win either
        # The original's own arena with reuse off (a replay of the input) is only needed
        # where a reuse-off option would win: a losing one is known from its own replay.
        if not reuse and (best is None or a.knows_arena(False)) and profile.activation_peak_bytes > clearly_lower():
            continue
        # an option whose arena passes the best one's is lost: its replay stops there
        # (a losing reuse-off replay of a 10k-node rewrite: 65 ms)
        arena = predict_in_use(graph, profile, tensors, None if best is None else int(best[0] / scale))
        in_use = arena.peak_in_use_bytes
        option = (in_use * scale, profile.peak_bytes, k, graph, profile, reuse, arena)
        if best is not None and option[:3] >= best[:3]:
            continue
        if not reuse and max(in_use, profile.activation_peak_bytes) > clearly_lower():
            continue
        best = option
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


def _lowest_tensor_peak(a: Analysis, candidates: list[Graph], tensors) -> tuple:
    """``_choose_order_and_reuse`` for a ``model_only`` rewrite: reuse on, the order of lowest
    simulated tensor peak (first on ties), no arena."""
    options = [(simulate(graph, list(range(len(graph.nodes))), tensors), k, graph)
               for k, graph in enumerate(_distinct(candidates))]
    profile, _, graph = min(options, key=lambda o: (o[0].peak_bytes, o[1]))
    return graph, profile, True, None


def _mark_early_backward(graph: Graph, forward_names: set[str]) -> Graph:
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


__all__ = ["rewrite", "pinned", "without_mem_pattern", "RewriteResult", "RegionResult", "PatternOff"]
