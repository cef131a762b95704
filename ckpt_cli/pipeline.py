"""Glue between stages for automatic planning: a plan's cost is what the rewrite of
it predicts, so the budget search gets ``rewrite + simulate`` as its cost model."""

from __future__ import annotations

from dataclasses import dataclass

from .analysis import Analysis
from .analysis.memory import VIEW_OPS
from .errors import UsageError
from .planning import Plan, choose_plan
from .planning.explain import explain
from .analysis.phases import RECOMPUTE_META
from .planning.solver import Intervals, optimal_plan
from .planning.strategies import STRATEGIES, BudgetResult, PlanCost, budget_plan, parse_budget
from .rewrite import RewriteResult, rewrite

AUTO_NAMES = ("layers", "sqrt", "balanced", "budget", "optimal")


_LAST: list[tuple[Plan, RewriteResult]] = []  # the latest rewrite a plan search made


def rewrite_plan(a: Analysis, plan: Plan | None) -> RewriteResult:
    """``rewrite(a, plan)``, reusing the search's own rewrite of the plan it returned."""
    if _LAST and _LAST[0][0] is plan and _LAST[0][1].after.graph.model is a.graph.model:
        return _LAST[0][1]
    return rewrite(a, plan)


def plan_cost(a: Analysis, plan: Plan) -> PlanCost:
    result = rewrite(a, plan)
    _LAST[:] = [(plan, result)]
    return PlanCost(result.after.priority.peak_bytes, result.recompute_flops, result.after.priority.live_at_peak)


def keep_intervals(a: Analysis, plan: Plan) -> Intervals:
    """For the exact solver: on the schedule of ``plan`` rewritten, the steps where keeping
    each recomputed activation would add its bytes (after its last forward use, before
    its copy is born)."""
    result = rewrite(a, plan)
    g = result.graph
    by_name = {n.name: n for n in a.graph.nodes}
    spans: dict[str, tuple[int, int]] = {}
    for node in g.nodes:
        source = node.meta(RECOMPUTE_META)
        if source is None or by_name[source].op_type in VIEW_OPS:
            continue
        for t in by_name[source].outputs:
            if not t or t not in g.producer:
                continue
            last = max([g.producer[t]] + list(g.consumers.get(t, ())))
            if last + 1 <= node.index - 1:
                spans[t] = (last + 1, node.index - 1)
    profile = result.after.priority
    return Intervals(tuple(profile.timeline), spans,
                     PlanCost(profile.peak_bytes, result.recompute_flops, profile.live_at_peak))


@dataclass
class Planned:
    plan: Plan | None
    budget: int | None = None
    search: BudgetResult | None = None


def make_plan(a: Analysis, auto: str | None = None, budget: str | None = None, patterns=None, scope=None,
              boundaries=None, plan_file=None) -> Planned:
    """The plan for these options: user-marked regions, a named strategy, or a budget."""
    manual = bool(patterns or scope or boundaries or plan_file)
    if budget is not None and auto not in (None, "budget", "optimal"):
        raise UsageError(f"--budget goes with --auto budget (the default) or optimal, not --auto {auto}")
    if (auto or budget) and manual:
        raise UsageError("--auto/--budget choose regions themselves; drop --region/--regions-by-scope/"
                         "--boundary/--plan")
    if budget is not None or auto in ("budget", "optimal"):
        if budget is None:
            raise UsageError(f"--auto {auto} needs --budget (e.g. --budget 2GiB or --budget 40%)")
        limit = parse_budget(budget, a.priority.peak_bytes)
        if auto == "optimal":
            search = optimal_plan(a, limit, lambda p: plan_cost(a, p), lambda p: keep_intervals(a, p))
        else:
            search = budget_plan(a, limit, lambda p: plan_cost(a, p), lambda p: keep_intervals(a, p))
        return Planned(search.plan, limit, search)
    if auto is not None:
        if auto not in STRATEGIES:
            raise UsageError(f"unknown --auto strategy '{auto}' (choose from {', '.join(AUTO_NAMES)})")
        plan = STRATEGIES[auto](a)
        if plan is None:
            raise UsageError(f"--auto {auto}: no repeated layers found in this graph; try --auto sqrt")
        return Planned(plan)
    return Planned(choose_plan(a, patterns, scope, boundaries, plan_file))


def plan_rows(a: Analysis, planned: Planned, result: RewriteResult) -> list[dict]:
    """Explanations per stashed buffer; a buffer counts as recomputed when the node that
    owns it was copied (a recomputed view of a kept buffer costs nothing)."""
    by_name = {n.name: n for n in a.graph.nodes}
    recomputed = {t for r in result.regions for name in r.copies for t in by_name[name].outputs
                  if by_name[name].op_type not in VIEW_OPS}
    return explain(a, planned.plan or Plan([], "none"), recomputed)
