"""From options to the rewrite that is written.

``make_plan`` chooses the plan (user regions, a named strategy, a budget search, or by
default the lowest predicted peak), judging plans by their rewrite. ``rewrite_plan``
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
from ..planning.budget import BudgetSearch, Planned
from ..planning.cutsearch import lowest_peak_plan
from ..planning.decision import NO_GAIN, all_kept
from ..planning.evaluate import PlanEvaluator, cost_of, intervals_of
from ..planning.explain import explain
from ..planning.plan import Policy, apply_policy
from ..planning.search import Intervals
from ..planning.strategies import LARGE_GRAPH_NODES, STRATEGIES, PlanCost, parse_budget
from ..units import human_bytes
from . import RewriteResult, module_shortfall, original_best, original_floor, pinned, rewrite, unchanged
from .mem_pattern import is_ort_artifact

AUTO_NAMES = ("layers", "sqrt", "balanced", "budget", "optimal")


def plan_cost(a: Analysis, plan: Plan) -> PlanCost:
    """The cost model of plan searches: the plan's unpinned rewrite, simulated."""
    return cost_of(rewrite(a, plan, pin=False))


def keep_intervals(a: Analysis, plan: Plan) -> Intervals:
    """The linear model of plan searches, on the schedule of ``plan`` rewritten."""
    return intervals_of(a, rewrite(a, plan, pin=False))


@gc_paused
def make_plan(a: Analysis, auto: str | None = None, budget: str | None = None, patterns=None, scope=None,
              boundaries=None, plan_file=None, progress: Callable[[str], None] | None = None,
              policy: Policy | None = None, pin: bool = True) -> Planned:
    """The plan for these options: user-marked regions, a named strategy, or a budget.
    ``progress`` hears how a search is going (plans evaluated, best so far). ``policy``
    (per-op rules) is honoured by every strategy, and judged with it. ``pin``: the graph
    will be written pinned, so a budget is checked on that."""
    policy = policy or Policy()
    manual = bool(patterns or scope or boundaries or plan_file)
    _check_plan_options(auto, budget, manual)
    if budget is not None or auto in ("budget", "optimal"):
        ruled = lambda plan: apply_policy(plan, policy, a.graph)  # noqa: E731
        evaluator = PlanEvaluator(a, rewrite, ruled=ruled, progress=progress)
        write = (lambda planned: rewrite_plan(a, planned)) if pin else None
        return BudgetSearch(evaluator, auto, policy, write).run(parse_budget(budget, a.priority.peak_bytes))
    if auto is not None:
        plan = STRATEGIES[auto](a)
        if plan is None:
            raise UsageError(f"--auto {auto}: no repeated layers found in this graph; try --auto sqrt")
        return Planned(apply_policy(plan, policy, a.graph), user=True)
    if manual:
        return Planned(apply_policy(choose_plan(a, patterns, scope, boundaries, plan_file), policy, a.graph),
                       user=True)
    evaluator = PlanEvaluator(a, rewrite, progress=progress, keep_results=True)
    plan, _ = lowest_peak_plan(a, evaluator.cost, thorough=len(a.graph.nodes) <= LARGE_GRAPH_NODES, policy=policy)
    return Planned(plan, result=evaluator.results.get(id(plan)))


def _check_plan_options(auto: str | None, budget: str | None, manual: bool) -> None:
    if budget is not None and auto not in (None, "budget", "optimal"):
        raise UsageError(f"--budget goes with --auto budget (the default) or optimal, not --auto {auto}")
    if (auto or budget) and manual:
        raise UsageError("--auto/--budget choose regions themselves; drop --region/--regions-by-scope/"
                         "--boundary/--plan")
    if budget is None and auto in ("budget", "optimal"):
        raise UsageError(f"--auto {auto} needs --budget (e.g. --budget 2GiB or --budget 40%)")
    if auto is not None and budget is None and auto not in STRATEGIES:
        raise UsageError(f"unknown --auto strategy '{auto}' (choose from {', '.join(AUTO_NAMES)})")


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
    result.after.phases  # noqa: B018 (a written graph left without a backward is refused before it is saved)
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
    if not planned.user and is_ort_artifact(a.graph):
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
