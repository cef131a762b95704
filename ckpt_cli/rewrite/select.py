"""From options to the rewrite that is written.

``make_plan`` chooses the plan (``planning.make``), judging plans by this stage's rewrite.
``rewrite_plan`` rewrites it and ``never_worse`` decides what is written: a chosen plan whose predicted peak
is not below the original's is dropped for the unchanged graph, a user's plan is kept with
a warning, and an ORT training artifact's rewrite must also be clearly lower in the Module
API's own session. Each returns new values; nothing it is given is changed.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, cast

from ..analysis import Analysis, default_order
from ..analysis.memory import MemoryProfile
from ..graph import gc_paused
from ..options import PlanOptions
from ..planning import Plan
from ..planning import make as planning_make
from ..planning.budget import Planned
from ..planning.decision import NO_GAIN, all_kept
from ..planning.evaluate import ScheduleMemo, cost_of, intervals_of
from ..planning.explain import explain
from ..planning.make import Rewriting
from ..planning.search import Intervals, PlanCost
from ..units import human_bytes
from . import (ModulePeaks, RewriteResult, alternatives, module_shortfall, original_best, original_floor, pinned,
               rewrite, unchanged, written_phases)
from .mem_pattern import is_ort_artifact
from .seeded import moved_seeds


def plan_cost(a: Analysis, plan: Plan) -> PlanCost:
    """The cost model of budget searches: the plan's unpinned rewrite, simulated, as a budget
    search rewrites it (no waiting order: ``ScheduleMemo``)."""
    return cost_of(rewrite(a, plan, pin=False, memo=ScheduleMemo(a, waiting=False)))


def keep_intervals(a: Analysis, plan: Plan) -> Intervals:
    """The linear model of budget searches, on the schedule of ``plan`` rewritten as
    ``plan_cost`` rewrites it."""
    return intervals_of(a, rewrite(a, plan, pin=False, memo=ScheduleMemo(a, waiting=False)))


def make_plan(a: Analysis, options: PlanOptions | None = None, *, progress: Callable[[str], None] | None = None,
              pin: bool = True, **keywords: Any) -> Planned:
    """``planning.make.make_plan``, its plans judged by this stage's rewrite."""
    rewriting = Rewriting(rewrite, rewrite_plan, is_ort_artifact(a.graph))
    return planning_make.make_plan(a, rewriting, options, progress=progress, pin=pin, **keywords)


@gc_paused
def rewrite_plan(a: Analysis, planned: Planned | None, pin: bool = True,
                 module_peaks: ModulePeaks | None = None) -> RewriteResult:
    """The rewrite of ``planned.plan`` that is written, ``never_worse``; from the search's
    own rewrite of that plan when it has one."""
    return judged_rewrite(a, planned, planned_rewrite(a, planned, pin), module_peaks)


@gc_paused
def planned_rewrite(a: Analysis, planned: Planned | None, pin: bool = True) -> RewriteResult:
    """The rewrite of ``planned.plan``, not yet judged: the search's own rewrite of that
    plan (pinned with ``pin``) when it has one. Its caller may then let go of the search's
    rewrites (``Planned.settled``) before ``judged_rewrite``."""
    if pin and planned is not None and planned.written is not None:
        return cast(RewriteResult, planned.written)
    if planned is not None and planned.result is not None:
        return pinned(a, planned.result) if pin else planned.result
    return rewrite(a, planned.plan if planned is not None else None, pin)


@gc_paused
def judged_rewrite(a: Analysis, planned: Planned | None, result: RewriteResult,
                   module_peaks: ModulePeaks | None = None) -> RewriteResult:
    """``rewrite_plan`` of the ``planned_rewrite`` ``result``: what is written.
    ``module_peaks``: as for ``never_worse``."""
    result = written_phases(a, result)  # a graph left without a backward is refused before it is saved
    if planned is not None and planned.plan is not None:
        result = replace(result, notes=empty_region_notes(result))
    result = never_worse(a, planned, result, module_peaks)
    moved = moved_seeds(a.graph, result.graph)  # of the graph written, the unchanged one included
    return replace(result, notes=result.notes + moved) if moved else result


def empty_region_notes(result: RewriteResult) -> tuple[str, ...]:
    return tuple(f"region '{r.name}' recomputes nothing: the backward reads none of its activations, or the "
                 "plan keeps all of them" for r in result.regions if not r.copies)


def never_worse(a: Analysis, planned: Planned | None, result: RewriteResult,
                module_peaks: ModulePeaks | None = None) -> RewriteResult:
    """``result``, ``result`` with a warning (a user's plan), or the unchanged graph with the
    reason in ``no_gain``. A budget is the user's own limit and is kept as it is. A plan
    the Module trials took is written as taken. An artifact no Module trial judged is
    judged by ``module_peaks`` (ckpt's model of the untuned Module session) where it
    predicts both graphs, its figures kept in the notes; without ``module_peaks`` (no ORT
    training interpreter) by the coarser arena model, which the notes say."""
    if planned is None or planned.budget is not None:
        return result
    if planned.module is not None:
        # Trained in the user's session and under its settings beside the original under the
        # same settings: what the runs measured stands over ckpt's model of its settings.
        return result if planned.module.chosen is not None else _unchanged(a, planned.module.line(), result.notes)
    default = None  # ORT's DEFAULT order of the original, simulated once where it is read
    if not planned.user and planned.module is None and is_ort_artifact(a.graph):
        default = default_order(a)
        peaks = module_peaks(result) if module_peaks is not None and planned.plan is not None else None
        shortfall = module_shortfall(a, result, default, peaks)
        coarse = (COARSE_MODULE_NOTE,) if module_peaks is None and planned.plan is not None else ()
        if shortfall is not None:
            return _unchanged(a, shortfall, (*result.notes, *coarse))
        result = replace(result, notes=(*result.notes, *((module_line(peaks),) if peaks is not None else coarse)))
    if planned.plan is None:
        return result
    line = _not_lower(a, result, default)
    if line is not None and planned.user:
        return replace(result, warning=line)
    if line is None and planned.plain is not None and planned.plain.chosen is None:
        line = planned.plain.line()  # lower under its settings, above the original in a plain session
    return result if line is None else _unchanged(a, line, result.notes)


def _not_lower(a: Analysis, result: RewriteResult, default: MemoryProfile | None) -> str | None:
    """Why ``result``'s predicted peak under its settings is not below the original's best
    (``alternatives``: its orders and settings); None where it is."""
    peak = result.after.arena_in_use(result.mem_reuse)
    alt = alternatives(a, default)
    if peak < original_floor(alt):  # below the original however it runs: no replay of it needed
        return None
    best, how = original_best(a, alt)
    if peak < best:
        return None
    return (f"the plan's predicted peak {human_bytes(peak)} is not below the original's "
            f"{human_bytes(best)} under {how}")


# Without an ORT training interpreter, the guard above has only ckpt's models of the file's
# graph (its arena peak, and the memory pattern's rise): ORT's fusions are not in them, and on
# architectures the zoo was not tuned to they misjudged the Module session both ways (a rewrite
# written that trained above the original, rewrites left out that trained at a third of it).
COARSE_MODULE_NOTE = ("judged for the Module API's untuned session by ckpt's models of this file's graph "
                      "alone (ORT's fusions are not in them); --python PY, an interpreter with "
                      "onnxruntime-training, judges the default by training it")


def module_line(peaks: tuple[int, int]) -> str:
    after, before = peaks
    return (f"ckpt's model of the Module API's own session (ORT's defaults, untuned) predicts the rewrite's peak "
            f"{human_bytes(after)} against the original's {human_bytes(before)} ({after / before:.2f}x), once the arena's "
            "placements settle")


def _unchanged(a: Analysis, why: str, notes: tuple[str, ...]) -> RewriteResult:
    return replace(unchanged(a), no_gain=why, decisions=all_kept(a, NO_GAIN), notes=notes)


def plan_notes(plan: Plan | None, result: RewriteResult) -> list[str]:
    """What the plan's choice and its rewrite noted, for the report."""
    notes = list(plan.notes) if plan is not None else []
    return notes + [n for n in result.notes if n not in notes]


@gc_paused
def plan_rows(a: Analysis, planned: Planned, result: RewriteResult) -> list[dict[str, Any]]:
    """Explanations per stashed buffer, from the decisions the rewrite settled."""
    return explain(a, planned.plan or Plan([], "none"), result.decisions)
