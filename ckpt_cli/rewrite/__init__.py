"""The rewrite stage: ``Analysis + Plan -> RewriteResult`` (a new graph in its executed order)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

from ..analysis import Analysis, PeakModel, analyse_written, default_order, peak_model, schedules
from ..analysis.arena import predict_in_use
from ..analysis.memory import MemoryProfile, simulate
from ..analysis.phases import Phases, classify
from ..analysis.training_pattern import predict_module
from ..graph import Graph, gc_paused
from ..units import human_bytes
from ..planning.decision import Decision, region_decisions, settle
from ..planning.evaluate import ScheduleMemo
from ..planning.plan import Plan
from .fresh import FreshResult, unshare
from .mem_pattern import PatternOff, is_ort_artifact, pattern_off
from .apply import Surgery, apply_plan
from .pin import GUARD_MIN_OPSET, PinResult, pin as pin_schedule
from .recompute import RegionResult
from .schedule import ScheduleCache, choose_schedule, mark_early_backward
from .seeded import index_seeded, seed_order


@dataclass
class RewriteResult:
    graph: Graph  # nodes in the written order: the executed one, but for nodes seeds_kept wrote past a random node
    after: PeakModel  # the full Analysis once ``written`` analysed the graph to be written
    regions: list[RegionResult]
    recompute_nodes: int
    recompute_flops: int
    mem_reuse: bool = True  # the SessionOptions.enable_mem_reuse the written graph should run with
    pinned: PinResult | None = None  # the guards that hold the order (None: --no-pin)
    fresh: FreshResult | None = None  # tensors hidden from ORT's buffer reuse (with --pin)
    pattern_off: PatternOff | None = None  # the input that turns ORT's memory pattern off (written.py adds it)
    # for a graph written unchanged with the model's inputs kept: the memory pattern's predicted
    # cost in a plain session, where turning it off is predicted to lower its peak (advice only)
    pattern_advice: PatternOff | None = None
    no_gain: str | None = None  # why the plan was dropped for the unchanged graph (it lowered nothing)
    warning: str | None = None  # set when a user's plan raises the predicted peak
    session: str = "ckpt"  # the session the written graph is for: "ckpt" settings, or "ort_default"
    decisions: dict[str, Decision] = field(default_factory=dict)  # per stashed buffer of the input: the final word
    notes: tuple[str, ...] = ()  # what the rewrite found about the plan (regions that recompute nothing)
    mem_arena: bool = True  # ORT's CPU arena in the settings recorded (off only by the Module choice)
    # (graph, its phases) as ``written_phases`` classified them: ``written`` classifies a
    # graph once (a walk of the whole graph); kept only while ``graph`` is that graph
    classified: tuple[Graph, Phases] | None = field(default=None, repr=False, compare=False)
    # (graph, pin's guards of it without waits, their fresh tensors or None) as the
    # schedule's DEFAULT-order check made them: ``pinned`` takes them instead of making them
    # again; kept only while ``graph`` is that graph
    plain_pin: tuple[Graph, PinResult, FreshResult | None] | None = field(default=None, repr=False, compare=False)

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
            memo: ScheduleMemo | None = None) -> RewriteResult:
    """Apply ``plan`` to the analysed graph; ``plan=None`` only reorders (``--no-recompute``).
    ``pin`` adds the guards that keep the written order under any session (``rewrite/pin.py``).
    ``model_only``: the rewrite is a plan search's memory model, never written or judged
    (the floor of a large graph's structure search): its order is the one of lowest simulated
    tensor peak with ORT's buffer reuse on, without the arena replays that choose a written
    graph's order and reuse: they are slow, and a model is never written. ``memo``: a plan
    search's record of the orders chosen for the graphs it rewrote (two plans that place
    the same copies the same way, their keep sets differing only where nothing changes, share
    the choice, which is most of a rewrite's time) and of the input's reuse-off arena."""
    surgery = apply_plan(a, plan)
    forward_names = {n.name for n in a.graph.nodes if a.phases.is_forward[n.index]}
    chosen = choose_schedule(a, surgery.graph, surgery.tensors, set(surgery.copy_names), forward_names, model_only,
                             ScheduleCache(memo) if memo is not None else None)
    new = mark_early_backward(chosen.graph, forward_names)
    # The written order is its own PRIORITY_BASED order (executed_order), so the
    # simulation above is the written graph's; phase markers change no tensor.
    after = peak_model(new, surgery.tensors, chosen.profile, chosen.mem_reuse, chosen.arena)
    copies = [n for n in new.nodes if n.name in surgery.copy_names]
    # A copy costs what its source costs (same op, same shapes): the input's costs, priced once.
    source = surgery.copy_sources()
    flops = sum(a.costs[source[n.name]].flops for n in copies)
    result = RewriteResult(new, after, surgery.regions, len(copies), flops, chosen.mem_reuse,
                           decisions=_decisions(a, plan, surgery),
                           plain_pin=(new, chosen.pin, chosen.fresh) if chosen.pin is not None and new is chosen.graph
                           else None)
    return pinned(a, result) if pin else seeds_kept(a, result)


def written(a: Analysis, result: RewriteResult) -> RewriteResult:
    """``result`` with the full analysis of its graph, a rewrite of ``a``'s graph (its phases
    by the same loss and gradient outputs): for a report of the rewrite that is written."""
    known = result.classified
    phases = known[1] if known is not None and known[0] is result.graph else None
    return replace(result, after=analyse_written(result.after, a.phases.loss, list(a.phases.grad_outputs), phases))


def written_phases(a: Analysis, result: RewriteResult) -> RewriteResult:
    """``result`` with the phases of its graph, as ``written`` classifies them (and then
    reads from it): a graph left without a backward is refused here."""
    if result.classified is not None and result.classified[0] is result.graph:
        return result
    phases = classify(result.graph, a.phases.loss, list(a.phases.grad_outputs) or None)
    return replace(result, classified=(result.graph, phases))


def _decisions(a: Analysis, plan: Plan | None, surgery: Surgery) -> dict[str, Decision]:
    """Per stashed buffer of the input, the final word: the plan's intent, settled by what
    the surgery found and recomputed (a plan made by hand states no intent: its regions are it)."""
    rec = surgery.recompute
    if rec is None:
        return dict(plan.decisions) if plan is not None else {}
    assert plan is not None  # only a plan with regions recomputes
    return settle(plan.decisions or region_decisions(a, plan.regions), rec.found, rec.recomputed)


@gc_paused
def pinned(a: Analysis, result: RewriteResult, waits: bool = False) -> RewriteResult:
    """``rewrite(a, plan)`` from ``result = rewrite(a, plan, pin=False)``: its graph with
    pin's guards (a plan search's rewrite is not redone for the written one); ``waits``:
    pin's blocks also wait for their readers' older backward inputs (``rewrite/pin.py``)."""
    return seeds_kept(a, _guarded(a, result, waits))


def seeds_kept(a: Analysis, result: RewriteResult) -> RewriteResult:
    """``result`` in a file order that gives each random node ORT seeds by its node index
    the index it has in ``a``'s graph (``seeded.seed_order``), so that it draws the
    original's numbers, where ckpt simulates that no higher in ORT's PRIORITY_BASED order
    and in its DEFAULT order; else ``result`` (its note says the draws differ)."""
    targets = index_seeded(a.graph)
    order = seed_order(result.graph, targets) if targets else None
    if order is None:
        return result
    graph, tensors, reuse = result.graph.reordered(order), result.after.tensors, result.mem_reuse
    profile = simulate(graph, schedules.priority_based(graph), tensors, reuse_buffers=reuse)
    if profile.peak_bytes > result.after.priority.peak_bytes:
        return result
    default_before = simulate(result.graph, schedules.ort_default(result.graph), tensors, reuse_buffers=reuse)
    if simulate(graph, schedules.ort_default(graph), tensors, reuse_buffers=reuse).peak_bytes > default_before.peak_bytes:
        return result
    arena = predict_in_use(graph, profile, tensors) if result.after.replayed is not None else None
    return replace(result, graph=graph, after=peak_model(graph, tensors, profile, reuse, arena))


def _guarded(a: Analysis, result: RewriteResult, waits: bool) -> RewriteResult:
    """``pinned`` before the random nodes' indices are kept."""
    opset = a.graph.opset("") or 0
    if opset < GUARD_MIN_OPSET:
        why = (f"no guards at opset {opset} (their ops need {GUARD_MIN_OPSET}): the written order holds under "
               "ckpt's session settings (PRIORITY_BASED), not in a plain session")
        return replace(result, pinned=PinResult(result.graph, result.after.tensors, 0, 0, 0, 0, skipped=why))
    forward_names = {n.name for n in a.graph.nodes if a.phases.is_forward[n.index]}
    ahead = result.plain_pin
    made = None  # the fresh tensors of the guards taken ahead, where made with them
    if not waits and ahead is not None and ahead[0] is result.graph:
        guarded, made = ahead[1], ahead[2]
    else:
        guarded = pin_schedule(result.graph, result.after.tensors, forward_names, waits)
    if waits:
        guarded = _runs_split(result, guarded, forward_names)
    if not guarded.guard_nodes:
        return replace(result, pinned=guarded)
    # Only with copies: buffers parked across the recompute gap are theirs to lose.
    fresh = made or unshare(guarded.graph, guarded.tensors, result.mem_reuse, frozenset(forward_names))
    assert fresh.profile is not None and fresh.arena is not None  # unshare sets both
    after = peak_model(fresh.graph, fresh.tensors, fresh.profile, result.mem_reuse, fresh.arena)
    return replace(result, graph=fresh.graph, after=after, pinned=guarded, fresh=fresh)


# The share by which a split pin must simulate lower: zoo gpt's default simulates 8 bytes
# lower split, and the Module session measured it 44.3 MiB untuned against 40.1 unsplit
# (unet, denoiser, vit and llama simulate 15-30% lower split, and measured lower).
SPLIT_GAIN = 0.01


def _runs_split(result: RewriteResult, guarded: PinResult, forward: set[str]) -> PinResult:
    """``guarded``, or the pin whose blocks are split where their copies are written apart
    (pin's ``split``) where ckpt simulates that ``SPLIT_GAIN`` lower in ORT's DEFAULT order,
    the untuned Module session's (zoo unet's descended plan: 53.2 MiB split against 75.7)."""
    split = pin_schedule(result.graph, result.after.tensors, forward, True, split=True)

    def peak(p: PinResult) -> int:
        return simulate(p.graph, schedules.ort_default(p.graph), p.tensors, reuse_buffers=result.mem_reuse).peak_bytes

    return split if peak(split) < (1 - SPLIT_GAIN) * peak(guarded) else guarded


def with_pattern_advice(result: RewriteResult) -> RewriteResult:
    """``result``, where it is the graph written unchanged for ORT's defaults and ckpt predicts
    ORT's memory pattern raises a plain session's peak, with that advice recorded and noted.
    The reason it was written unchanged compares the original run without the pattern, which
    ORT's defaults do not do: the note says what they hold and how to turn the pattern off."""
    if result.no_gain is None or result.session != "ort_default" or result.pattern_off is not None:
        return result
    off = pattern_off(result.graph, result.after.tensors)
    if off is None:
        return result
    line = (f"ORT's memory pattern raises this graph's peak in a plain session: ckpt's model of the file's graph "
            f"(ORT's fusions not simulated) predicts {human_bytes(off.with_pattern_bytes)} with it, "
            f"{human_bytes(off.without_pattern_bytes)} without; run it with so.enable_mem_pattern = False, or "
            "write it with --mem-pattern-off (an optional input nobody feeds turns the pattern off in every "
            "session) and --check to measure it")
    return replace(result, pattern_advice=off, notes=(*result.notes, line))


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


@dataclass(frozen=True)
class Alternatives:
    """The original run as a user may run it instead of ckpt's rewrite: its PRIORITY_BASED
    order with ORT's buffer reuse on and off, and ORT's DEFAULT order (simulated once for
    ``original_floor`` and ``original_best``)."""

    reuse: MemoryProfile
    no_reuse: MemoryProfile
    default: MemoryProfile


def alternatives(a: Analysis, default: MemoryProfile | None = None) -> Alternatives:
    """``a``'s alternatives; ``default``: its DEFAULT order, where simulated already."""
    return Alternatives(a.profile(True), a.profile(False), default or default_order(a))


def original_best(a: Analysis, alt: Alternatives | None = None) -> tuple[int, str]:
    """The original's lowest predicted arena peak over the orders and buffer-reuse settings a
    user can pick (ORT's defaults included; fusions are not simulated), and which it is."""
    alt = alternatives(a) if alt is None else alt

    def in_use(profile: MemoryProfile) -> int:
        if profile is a.priority:
            return a.arena_in_use(a.reuse_buffers)
        return predict_in_use(a.graph, profile, a.tensors).peak_in_use_bytes

    return min((in_use(alt.reuse), "its file order"),
               (in_use(alt.no_reuse), "its file order with enable_mem_reuse=False"),
               (in_use(alt.default), "ORT's DEFAULT order"))


# ORT training artifacts run in the Module API's session: ORT's defaults (DEFAULT order, its
# arena, the memory pattern on). ckpt's arena model of that session misses small graphs by
# a few percent either way, so a rewrite of an artifact is written only where it is
# predicted this much lower there (the measurements are in the commit that set it). Zoo BERT
# (predicted 0.90x, measured 0.87x) and enc_dropout_bce (predicted in the same band, measured
# 1.11x) are not told apart by that model: the margin stays where neither is worse.
MODULE_MARGIN = 0.10


# Where ckpt's model of the untuned Module session (verify/module_model.py, with an ORT
# training interpreter) predicts both graphs, a rewrite is written where it is predicted
# this much lower: over the zoo's 42 artifacts that model is within 3.7% of the measured
# peak for 83 of 84 graphs, mostly low (the one left: -12.2%); the DEFAULT-order arena
# peak below needs 10%.
MODULE_MODEL_MARGIN = 0.02

# Without an ORT training interpreter, a rewrite the DEFAULT-order arena peak passes is still
# left out where the Module session's model (its static memory pattern and arena replayed to
# settle), run on the file's graph since ORT's fused graph cannot be had, puts it this much
# above the original: that model misses ORT's fusions and can rank a transformer's rewrite
# wrongly, while the arena peak misses the static block a rewrite's copies join. Only a
# clear rise overrules the arena peak (the measurements are in the commit that set it).
UNFUSED_MODULE_RISE = 0.05

ModulePeaks = Callable[["RewriteResult"], "tuple[int, int] | None"]  # (rewrite's, original's) predicted peaks


def module_shortfall(a: Analysis, result: RewriteResult, default: MemoryProfile | None = None,
                     peaks: tuple[int, int] | None = None) -> str | None:
    """Why ``result`` may not be lower than the original in the Module API's own session,
    or None: its predicted peak there (``peaks``: ckpt's model of that session, the
    rewrite's and the original's; else the arena peak in ORT's DEFAULT order) is not
    MODULE_MODEL_MARGIN (MODULE_MARGIN) below the original's, or, without ``peaks``, that
    session's model on the file's graph puts it UNFUSED_MODULE_RISE above."""
    if peaks is not None:
        after, before = peaks
        if after <= before * (1 - MODULE_MODEL_MARGIN):
            return None
        return (f"ckpt's model of the Module API's own session (ORT's defaults, untuned) predicts the rewrite's "
                f"peak {human_bytes(after)}, not {MODULE_MODEL_MARGIN:.0%} below the original's {human_bytes(before)}, once "
                "the arena's placements settle")
    graph, tensors = result.graph, result.after.tensors
    written_order = schedules.ort_default(graph)
    original = default or default_order(a)
    after = predict_in_use(graph, simulate(graph, written_order, tensors), tensors).peak_in_use_bytes
    before = predict_in_use(a.graph, original, a.tensors).peak_in_use_bytes
    if after > before * (1 - MODULE_MARGIN):
        return (f"in the Module API's own session (ORT's defaults, DEFAULT order) the rewrite's predicted peak "
                f"{human_bytes(after)} is not {MODULE_MARGIN:.0%} below the original's {human_bytes(before)}")
    return _pattern_rise(a, result, written_order, list(original.order))


def _pattern_rise(a: Analysis, result: RewriteResult, written_order: list[int], original_order: list[int]) -> str | None:
    """Why the rewrite may be above the original in the Module session by its memory pattern
    (``UNFUSED_MODULE_RISE``), modelled on the file's graph; None where it is not."""
    after = predict_module(result.graph, result.after.tensors, written_order).peak_bytes
    before = predict_module(a.graph, a.tensors, original_order).peak_bytes
    if after <= before * (1 + UNFUSED_MODULE_RISE):
        return None
    return (f"ckpt's model of the Module API's untuned session on this file's graph (its memory pattern and arena; "
            f"ORT's fusions not simulated) predicts the rewrite's peak {human_bytes(after)}, above the original's "
            f"{human_bytes(before)}")


def original_floor(alt: Alternatives) -> int:
    """A lower bound of ``original_best`` without its arena replays (slow on large graphs):
    the arena never has fewer bytes in use than the live tensors."""
    return min(alt.reuse.activation_peak_bytes, alt.no_reuse.activation_peak_bytes,
               alt.default.activation_peak_bytes)


__all__ = ["ModulePeaks", "MODULE_MODEL_MARGIN", "rewrite", "pinned", "written", "written_phases", "with_pattern_advice",
           "without_mem_pattern", "RewriteResult", "RegionResult", "PatternOff"]
