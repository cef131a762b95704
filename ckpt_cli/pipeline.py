"""Glue between stages for automatic planning: a plan's cost is what the rewrite of
it predicts, so the budget search gets ``rewrite + simulate`` as its cost model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .analysis import Analysis
from .errors import BudgetUnreachable, UsageError
from .graph import gc_paused
from .markers import recompute_source
from .ops import VIEW_OPS
from .planning import Plan, choose_plan
from .planning.decision import NO_GAIN, all_kept
from .planning.explain import explain
from .planning.plan import Policy, apply_policy
from .planning.search import Intervals
from .planning.solver import optimal_plan
from .planning.cutsearch import cut_budget_plan, lowest_peak_plan, structures_only
from .planning.strategies import LARGE_GRAPH_NODES, STRATEGIES, BudgetResult, PlanCost, budget_plan, parse_budget
from .units import human_bytes, human_flops
from .rewrite import (RewriteResult, module_shortfall, original_best, original_floor, pinned, rewrite,
                      unchanged)
from .rewrite.mem_pattern import is_ort_artifact

AUTO_NAMES = ("layers", "sqrt", "balanced", "budget", "optimal")
# The exact search on the greedy's structure saved at most 21% of its FLOPs on the samples
# (gpt at 50%): a structure plan over twice the best cut's FLOPs is not searched again.
EXACT_AGAIN_WITHIN = 2.0


def _cost(result: RewriteResult) -> PlanCost:
    profile = result.after.priority
    return PlanCost(profile.peak_bytes, result.recompute_flops, profile.live_at_peak)


def plan_cost(a: Analysis, plan: Plan) -> PlanCost:
    """The cost model of plan searches: rewrite the graph and simulate its memory. Searches
    rewrite without pin: its guards change the peak by a few bytes and cost half the time."""
    return _cost(rewrite(a, plan, pin=False))


def keep_intervals(a: Analysis, plan: Plan) -> Intervals:
    """The linear model of plan searches: on the schedule of ``plan`` rewritten, the steps
    where keeping each recomputed activation would add its bytes (after its last forward
    use, before its copy is born)."""
    return intervals_of(a, rewrite(a, plan, pin=False))


def intervals_of(a: Analysis, result: RewriteResult) -> Intervals:
    """``keep_intervals`` from the plan's (unpinned) rewrite."""
    g = result.graph
    by_name = {n.name: n for n in a.graph.nodes}
    spans: dict[str, tuple[int, int]] = {}
    for node in g.nodes:
        source = recompute_source(node)
        if source is None or by_name[source].op_type in VIEW_OPS:
            continue
        for t in by_name[source].outputs:
            if not t or t not in g.producer:
                continue
            last = max([g.producer[t]] + list(g.consumers.get(t, ())))
            if last + 1 <= node.index - 1:
                spans[t] = (last + 1, node.index - 1)
    return Intervals(tuple(result.after.priority.timeline), spans, _cost(result))


@dataclass
class Planned:
    plan: Plan | None
    budget: int | None = None
    search: BudgetResult | None = None
    result: RewriteResult | None = None  # the search's own (unpinned) rewrite of ``plan``, when it has one
    user: bool = False  # regions or a strategy the user chose (--region, --plan, --auto): warned about, never dropped
    written: RewriteResult | None = None  # the pinned rewrite of ``plan``, when the budget search checked it


@gc_paused
def rewrite_plan(a: Analysis, planned: Planned | None, pin: bool = True) -> RewriteResult:
    """``rewrite(a, planned.plan, pin)``, from the search's unpinned rewrite of that plan when it has one.

    Never worse by default: a chosen plan whose predicted peak is not below the original's
    under its best order and settings is dropped for the unchanged graph, with the reason
    in ``no_gain``; a user's plan is kept with a ``warning``. A budget is the user's
    own limit and is kept as it is. An ORT training artifact's rewrite, reorder only
    included, must also be clearly lower in the Module API's own session."""
    plan = planned.plan if planned is not None else None
    if pin and planned is not None and planned.written is not None:
        result = planned.written
    elif planned is not None and planned.result is not None:
        result = pinned(a, planned.result) if pin else planned.result
    else:
        result = rewrite(a, plan, pin)
    result.after.phases  # noqa: B018 (a written graph left without a backward is refused before it is saved)
    if plan is not None:
        for r in result.regions:
            note = (f"region '{r.name}' recomputes nothing: the backward reads none of its activations, or the "
                    "plan keeps all of them")
            if not r.copies and note not in plan.notes:
                plan.notes.append(note)
    if planned is None or planned.budget is not None:
        return result
    if not planned.user and is_ort_artifact(a.graph):
        shortfall = module_shortfall(a, result)
        if shortfall is not None:
            return _unchanged(a, shortfall)
    if plan is None:
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
        result.warning = line
        return result
    return _unchanged(a, line)


def _unchanged(a: Analysis, why: str) -> RewriteResult:
    kept = unchanged(a)
    kept.no_gain = why
    kept.decisions = all_kept(a, NO_GAIN)
    return kept


@gc_paused
def make_plan(a: Analysis, auto: str | None = None, budget: str | None = None, patterns=None, scope=None,
              boundaries=None, plan_file=None, progress: Callable[[str], None] | None = None,
              policy: Policy | None = None, pin: bool = True) -> Planned:
    """The plan for these options: user-marked regions, a named strategy, or a budget.
    ``progress`` hears how a budget search is going (plans evaluated, best so far).
    ``policy`` (per-op rules) is honoured by every strategy, and judged with it. ``pin``:
    the graph will be written pinned (``rewrite_plan``), so a budget is checked on that."""
    policy = policy or Policy()

    def ruled(plan: Plan) -> Plan:
        return apply_policy(plan, policy, a.graph)
    manual = bool(patterns or scope or boundaries or plan_file)
    if budget is not None and auto not in (None, "budget", "optimal"):
        raise UsageError(f"--budget goes with --auto budget (the default) or optimal, not --auto {auto}")
    if (auto or budget) and manual:
        raise UsageError("--auto/--budget choose regions themselves; drop --region/--regions-by-scope/"
                         "--boundary/--plan")
    if budget is not None or auto in ("budget", "optimal"):
        if budget is None:
            raise UsageError(f"--auto {auto} needs --budget (e.g. --budget 2GiB or --budget 40%)")
        return _budget_planned(a, auto, parse_budget(budget, a.priority.peak_bytes), progress, ruled, policy, pin)
    if auto is not None:
        if auto not in STRATEGIES:
            raise UsageError(f"unknown --auto strategy '{auto}' (choose from {', '.join(AUTO_NAMES)})")
        plan = STRATEGIES[auto](a)
        if plan is None:
            raise UsageError(f"--auto {auto}: no repeated layers found in this graph; try --auto sqrt")
        return Planned(ruled(plan), user=True)
    if manual:
        return Planned(ruled(choose_plan(a, patterns, scope, boundaries, plan_file)), user=True)
    results: dict[int, RewriteResult] = {}
    memo: dict = {}

    def judge(plan: Plan) -> PlanCost:
        results[id(plan)] = result = rewrite(a, plan, pin=False, memo=memo)
        if progress is not None:
            progress(f"planning: {len(results)} plans evaluated")
        return _cost(result)

    plan, _ = lowest_peak_plan(a, judge, thorough=len(a.graph.nodes) <= LARGE_GRAPH_NODES, policy=policy)
    return Planned(plan, result=results.get(id(plan)))


def _budget_planned(a: Analysis, auto: str | None, budget: int, progress: Callable[[str], None] | None,
                    ruled: Callable[[Plan], Plan], policy: Policy, pin: bool) -> Planned:
    """The budget search (``--budget``, ``--auto budget|optimal``): the fitting plan with the
    fewest recompute FLOPs; with ``pin``, its pinned rewrite (what is written) checked
    against ``budget`` too."""
    limit = budget
    kept: dict[str, object] = {}  # the cheapest fitting rewrite so far: the search's choice
    evaluated = 0
    memo: dict = {}  # the orders chosen for the graphs rewritten so far (rewrite's ``memo``)

    def told(what):
        nonlocal evaluated
        evaluated += 1
        if progress is not None:
            best = kept.get("result")
            progress(f"planning: {evaluated} plans evaluated; best fit so far "
                     + (f"recomputes {human_flops(best.recompute_flops)}" if best else "none"))
        return what

    def measured(plan: Plan) -> RewriteResult:
        result = rewrite(a, ruled(plan), pin=False, memo=memo)
        fits = result.after.priority.peak_bytes <= limit
        if fits and ("result" not in kept or result.recompute_flops < kept["result"].recompute_flops):
            kept["plan"], kept["result"] = plan, result
        return told(result)

    def cost(plan: Plan) -> PlanCost:
        return _cost(measured(plan))

    def intervals(plan: Plan) -> Intervals:
        if model_floors:  # a structure's floor is the search's model, never its answer
            return told(intervals_of(a, rewrite(a, ruled(plan), pin=False, model_only=True, memo=memo)))
        return intervals_of(a, measured(plan))

    solve = optimal_plan if auto == "optimal" else budget_plan
    strategy = auto or "budget"
    thorough = auto == "optimal" or len(a.graph.nodes) <= LARGE_GRAPH_NODES
    model_floors = structures_only(a, thorough)

    def structure_search(exact: bool = False, beat: int | None = None) -> BudgetResult:
        def run(solver) -> BudgetResult:
            return solver(a, limit, cost, intervals, beat=beat)

        if solve is budget_plan and not exact:
            heuristic = run(budget_plan)
            if (not thorough or not heuristic.recompute_flops or heuristic.structure is None
                    or (beat is not None and heuristic.recompute_flops > EXACT_AGAIN_WITHIN * beat)):
                return heuristic
            # The greedy keep set can miss the MILP's on the very structure it chose (gpt at
            # 50%: 38.0 against 30.0 MFLOP, cnn at 80%: 1.66 against 1.50): on small graphs
            # the exact search runs there too, unless the best cut is far cheaper anyway.
            try:
                exact_there = optimal_plan(a, limit, cost, intervals, [heuristic.structure], strategy)
            except BudgetUnreachable:
                return heuristic
            exact_there.evaluations += heuristic.evaluations
            return exact_there if exact_there.recompute_flops < heuristic.recompute_flops else heuristic
        # the exact MILP's fit, or the heuristic's where the MILP's linear model finds none
        # (it can miss a fit the greedy keep set reaches); the cheaper of the two
        try:
            exact = run(optimal_plan)
        except BudgetUnreachable:
            return run(budget_plan)
        try:
            heuristic = run(budget_plan)
        except BudgetUnreachable:
            return exact
        return exact if exact.recompute_flops <= heuristic.recompute_flops else heuristic

    def searched(target: int) -> Planned:
        nonlocal limit
        limit = target
        kept.clear()
        search = cut_budget_plan(a, limit, cost, structure_search,
                                 thorough=thorough, strategy=strategy, policy=policy, intervals_of=intervals)
        return Planned(ruled(search.plan), budget, search,
                       kept["result"] if kept.get("plan") is search.plan else None)

    planned = searched(budget)
    if not pin:
        return planned
    # Searches judge plans unpinned; pin's guards add a few bytes (at most 168 on the samples'
    # sweeps). A fit closer to the budget than that is searched again, as far below it.
    planned.written = rewrite_plan(a, planned)
    written = planned.written.after.priority.peak_bytes
    if written > budget:
        line = (f"budget {human_bytes(budget)} is unreachable: the best fit found peaks at {human_bytes(written)} "
                f"once its order is pinned ({written - planned.search.peak_bytes} bytes of guards)")
        try:
            planned = searched(budget - (written - planned.search.peak_bytes))
        except BudgetUnreachable:
            raise BudgetUnreachable(line) from None
        planned.written = rewrite_plan(a, planned)
        if planned.written.after.priority.peak_bytes > budget:
            raise BudgetUnreachable(line)
    return planned


@gc_paused
def plan_rows(a: Analysis, planned: Planned, result: RewriteResult) -> list[dict]:
    """Explanations per stashed buffer, from the decisions the rewrite settled."""
    return explain(a, planned.plan or Plan([], "none"), result.decisions)
