"""From options to the rewrite that is written.

``make_plan`` chooses the plan (user regions, a named strategy, a budget search, or by
default the knee of the predicted peak/recompute front), judging plans by their rewrite. ``rewrite_plan``
rewrites it and ``never_worse`` decides what is written: a chosen plan whose predicted peak
is not below the original's is dropped for the unchanged graph, a user's plan is kept with
a warning, and an ORT training artifact's rewrite must also be clearly lower in the Module
API's own session. Each returns new values; nothing it is given is changed.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from ..analysis import Analysis
from ..errors import UsageError
from ..graph import gc_paused
from ..planning import Plan, choose_plan
from ..planning.activation import activation_budget_plan
from ..planning.budget import BudgetSearch, Planned
from ..planning.cutsearch import lowest_peak_plan
from ..planning.decision import NO_GAIN, all_kept
from ..planning.evaluate import PlanEvaluator, cost_of, intervals_of, ort_peak
from ..planning.explain import explain
from ..options import MIN_PEAK, PlanOptions
from ..planning.plan import apply_policy
from ..planning.search import Intervals
from ..planning.strategies import LARGE_GRAPH_NODES, STRATEGIES, PlanCost, parse_budget
from ..units import human_bytes
from . import RewriteResult, module_shortfall, original_best, original_floor, pinned, rewrite, unchanged
from .mem_pattern import is_ort_artifact

def plan_cost(a: Analysis, plan: Plan) -> PlanCost:
    """The cost model of plan searches: the plan's unpinned rewrite, simulated."""
    return cost_of(rewrite(a, plan, pin=False))


def keep_intervals(a: Analysis, plan: Plan) -> Intervals:
    """The linear model of plan searches, on the schedule of ``plan`` rewritten."""
    return intervals_of(a, rewrite(a, plan, pin=False))


# make_plan's keyword form names two options as the command line's variables did
_LEGACY_KEYWORDS = {"patterns": "regions", "scope": "regions_by_scope"}


@gc_paused
def make_plan(a: Analysis, options: PlanOptions | None = None, *, progress: Callable[[str], None] | None = None,
              pin: bool = True, **keywords) -> Planned:
    """The plan for ``options`` (or its keywords): user-marked regions, a named strategy, a
    budget, or by default the knee of the peak/recompute front (``--auto min-peak``: its
    lowest peak). ``progress`` hears how a search is going (plans evaluated, best so far). The
    options' per-op policy is honoured by every strategy, and judged with it. ``pin``: the
    graph will be written pinned, so a budget is checked on that. The default's hull
    vertices past the knee are recorded for its plain-session judgement."""
    if options is None:
        options = PlanOptions.of(**{_LEGACY_KEYWORDS.get(k, k): v for k, v in keywords.items()})
    options.validate()
    policy = options.policy
    if options.searches_budget:
        ruled = lambda plan: apply_policy(plan, policy, a.graph)  # noqa: E731 - a one-line closure
        evaluator = PlanEvaluator(a, rewrite, ruled=ruled, progress=progress, measure=ort_peak)
        write = (lambda planned: rewrite_plan(a, planned)) if pin else None
        assert options.budget is not None  # validate: a budget search has one
        return BudgetSearch(evaluator, options.auto, policy, write).run(parse_budget(options.budget,
                                                                                   a.ort_peak_bytes))
    if options.activation_budget is not None:
        plan, record = activation_budget_plan(a, options.activation_budget, policy)
        return Planned(apply_policy(plan, policy, a.graph), user=True, activation=record)
    if options.auto is not None and options.auto != MIN_PEAK:
        named = STRATEGIES[options.auto](a)
        if named is None:
            raise UsageError(f"--auto {options.auto}: no repeated layers found in this graph; try --auto sqrt")
        return Planned(apply_policy(named, policy, a.graph), user=True)
    if options.manual:
        marked = choose_plan(a, list(options.regions), options.regions_by_scope, list(options.boundaries),
                             options.plan_file)
        return Planned(apply_policy(marked, policy, a.graph), user=True)
    evaluator = PlanEvaluator(a, rewrite, progress=progress, keep_results=True)
    # An ORT artifact runs in the Module API's untuned session, whose fusions must treat the
    # recompute copies as the originals for bit-identical training: measured so for the
    # lowest peak over the artifact zoo, not for the knee (zoo bert: 1e-7 apart).
    at_knee = options.auto != MIN_PEAK and not is_ort_artifact(a.graph)
    chosen = lowest_peak_plan(a, evaluator.cost, thorough=len(a.graph.nodes) <= LARGE_GRAPH_NODES,
                              policy=policy, at_knee=at_knee)
    planned = Planned(chosen.plan, result=evaluator.results.get(id(chosen.plan)), knee=chosen.knee)
    if chosen.lowest is None:
        fallbacks = tuple((p, c, evaluator.results.get(id(p))) for p, c in chosen.fallbacks)
        return replace(planned, cost=chosen.cost, fallbacks=fallbacks)
    lowest = Planned(chosen.lowest, result=evaluator.results.get(id(chosen.lowest)), knee=chosen.knee)
    planned = knee_or_lowest(a, planned, lowest, pin)
    if planned.knee is None or planned.knee.passed_over is not None:
        return planned
    # the hull vertices past the knee, for the plain-session judgement (verify/plain_choice.py)
    beyond = tuple((p, c, evaluator.results.get(id(p))) for p, c in chosen.beyond)
    return replace(planned, beyond=beyond, knee_cost=chosen.cost)


def knee_or_lowest(a: Analysis, knee: Planned, lowest: Planned, pin: bool) -> Planned:
    """The knee's plan, unless its rewrite gains nothing over the original's best order:
    then the lowest peak, the default's next choice, with the reason recorded in the knee."""
    written = rewrite_plan(a, knee, pin)
    if written.no_gain is None:
        return replace(knee, written=written if pin else None)
    assert lowest.plan is not None and knee.knee is not None  # the default passes up the lowest at a knee
    lowest.plan.notes.append(f"the knee gains nothing ({written.no_gain}): the default takes the lowest peak")
    return replace(lowest, knee=replace(knee.knee, passed_over=written.no_gain))


@gc_paused
def rewrite_plan(a: Analysis, planned: Planned | None, pin: bool = True) -> RewriteResult:
    """The rewrite of ``planned.plan`` that is written, ``never_worse``; from the search's
    own rewrite of that plan when it has one."""
    if pin and planned is not None and planned.written is not None:
        result = planned.written
    elif planned is not None and planned.result is not None:
        result = pinned(a, planned.result) if pin else planned.result
    else:
        result = rewrite(a, planned.plan if planned is not None else None, pin)
    result.after.phases  # noqa: B018 - evaluated: a graph left without a backward is refused before it is saved
    if planned is not None and planned.plan is not None:
        result = replace(result, notes=empty_region_notes(result))
    return never_worse(a, planned, result)


def empty_region_notes(result: RewriteResult) -> tuple[str, ...]:
    return tuple(f"region '{r.name}' recomputes nothing: the backward reads none of its activations, or the "
                 "plan keeps all of them" for r in result.regions if not r.copies)


def never_worse(a: Analysis, planned: Planned | None, result: RewriteResult) -> RewriteResult:
    """``result``, ``result`` with a warning (a user's plan), or the unchanged graph with the
    reason in ``no_gain``. A budget is the user's own limit and is kept as it is."""
    if planned is None or planned.budget is not None:
        return result
    if planned.module is not None and planned.module.chosen is None:
        return _unchanged(a, planned.module.line(), result.notes)
    if not planned.user and planned.module is None and is_ort_artifact(a.graph):
        shortfall = module_shortfall(a, result)
        if shortfall is not None:
            return _unchanged(a, shortfall, result.notes)
    if planned.plan is None:
        return result
    peak = result.after.arena_in_use(result.mem_reuse)
    if peak < original_floor(a):  # below the original however it runs: no replay of it needed
        return result
    best, how = original_best(a)
    if peak < best:
        return result
    line = (f"the plan's predicted peak {human_bytes(peak)} is not below the original's "
            f"{human_bytes(best)} under {how}")
    if planned.user:
        return replace(result, warning=line)
    return _unchanged(a, line, result.notes)


def _unchanged(a: Analysis, why: str, notes: tuple[str, ...]) -> RewriteResult:
    return replace(unchanged(a), no_gain=why, decisions=all_kept(a, NO_GAIN), notes=notes)


def plan_notes(plan: Plan | None, result: RewriteResult) -> list[str]:
    """What the plan's choice and its rewrite noted, for the report."""
    notes = list(plan.notes) if plan is not None else []
    return notes + [n for n in result.notes if n not in notes]


@gc_paused
def plan_rows(a: Analysis, planned: Planned, result: RewriteResult) -> list[dict]:
    """Explanations per stashed buffer, from the decisions the rewrite settled."""
    return explain(a, planned.plan or Plan([], "none"), result.decisions)
