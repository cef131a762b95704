"""The budget search over tensor-level cuts (``mincut``), judged by the real cost model.

The price sweep gives the corners of the (kept bytes, recompute cost) front; each
corner becomes a plan whose real peak (rewrite + arena simulation) decides whether it
fits. Kept bytes are not the peak: recomputed tensors live in the backward too, so
recomputing the most can raise the peak again. Small graphs judge every corner, then
fill the gap between the cheapest corner that fits and its costlier neighbour that
overshoots with the byte-budget MILP (a few byte limits, bisected); large graphs
judge the corner next to recomputing all, estimate every other corner's peak from that
rewrite's memory over the schedule (each tensor a corner keeps adds its bytes over its
span, as in the structure search), and judge only the corners that estimate, calibrated
by the judged ones, says fit (each judgement is a rewrite of the whole graph).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..analysis import Analysis
from ..errors import BudgetUnreachable
from .decision import REORDER, all_kept
from .mincut import MAX_SOLVES, Cut, Policy, Problem, build, front, solve_bytes, to_plan
from .plan import Plan, apply_policy
from .regions import default_regions
from .search import Intervals, PlanCost, keep_all_limit
from .strategies import BudgetResult

REFINE_STEPS = 6  # byte limits tried between two corners on small graphs


def large_judgements(nodes: int) -> int:
    """Rewrites a large graph's corner search may spend: 0.3 s each at 10k nodes and
    5 s at 100k (bench/ section 1), to plan within 2 s at 10k and 20 s at 100k."""
    return 4 if nodes <= 20_000 else 2
LARGE_SOLVES = 16  # price sweeps on large graphs stop sooner (50 ms a max-flow at 10k nodes)


@dataclass
class Judged:
    cut: Cut
    plan: Plan
    cost: PlanCost


@dataclass
class CutSearch:
    best: Judged | None  # the fitting plan with the fewest recompute FLOPs
    judged: list[Judged]
    lowest: PlanCost | None  # the lowest real peak seen
    models: int = 0  # model rewrites the search made besides its judgements


def search_cuts(a: Analysis, budget: int, evaluate: Callable[[Plan], PlanCost], *, thorough: bool,
                policy: Policy = Policy(), strategy: str = "budget", problem: Problem | None = None,
                intervals_of: Callable[[Plan], Intervals] | None = None,
                floor_model: Callable[[Plan], Intervals] | None = None) -> CutSearch:
    """What a lean search (``thorough`` off) aims at the corners with: ``floor_model`` (a
    plan's model rewrite, never a judgement: ``pipeline`` gives the plain order's) and
    ``intervals_of`` (a plan's judged rewrite with its memory over the schedule)."""
    problem = problem or build(a, policy)
    corners = front(problem, MAX_SOLVES if thorough else LARGE_SOLVES)  # most kept bytes first
    judged: dict[tuple, Judged] = {}
    models = 0

    def plan_of(cut: Cut) -> Plan:
        plan = to_plan(a, cut, strategy)
        if policy:
            plan.notes.append(policy.describe())
        return plan

    def judge(cut: Cut) -> Judged:
        key = (cut.copied, cut.kept)
        if key not in judged:
            plan = plan_of(cut)
            judged[key] = Judged(cut, plan, evaluate(plan))
        return judged[key]

    def floor(cut: Cut) -> tuple[Judged, Intervals]:
        """``judge`` with the rewrite's memory over its schedule (one rewrite for both)."""
        plan = plan_of(cut)
        intervals = intervals_of(plan)
        judged[(cut.copied, cut.kept)] = Judged(cut, plan, intervals.cost)
        return judged[(cut.copied, cut.kept)], intervals

    def model(cut: Cut) -> Intervals:
        nonlocal models
        models += 1
        return floor_model(plan_of(cut))

    def fits(j: Judged) -> bool:
        return j.cost.peak_bytes <= budget

    if thorough:
        for cut in corners:
            judge(cut)
    else:
        if intervals_of is None or floor_model is None:
            raise ValueError("a lean cut search aims by the floor corner's model and rewrite: "
                             "it needs floor_model and intervals_of")
        sizes = {t: info.nbytes for t, info in a.tensors.items() if info.nbytes}
        _aim(corners, judge, floor, model, budget, a.priority.peak_bytes, sizes, large_judgements(len(a.graph.nodes)))
    best = _best(judged.values(), budget)
    if thorough and best is not None and best.cost.recompute_flops:
        _refine(problem, corners, best, judge, fits)
        best = _best(judged.values(), budget)
    lowest = min((j.cost for j in judged.values()), key=lambda c: c.peak_bytes, default=None)
    return CutSearch(best, list(judged.values()), lowest, models)


def _best(judged, budget: int) -> Judged | None:
    fitting = [j for j in judged if j.cost.peak_bytes <= budget]
    return min(fitting, key=lambda j: (j.cost.recompute_flops, j.cost.peak_bytes), default=None)


def _aim(corners: list[Cut], judge, floor, model, budget: int, original: int, sizes: dict[str, int],
         judgements: int) -> None:
    """The corner keeping the most bytes that fits, aimed by estimate. The corner next to
    recomputing all is the floor (recomputing all is never tried, its copies all live at
    once). Its model rewrite (the plain order only: 0.24 s at 10k nodes against 0.45 s for
    the written graph's choice of two orders) is the floor of the linear model, which
    estimates each richer corner's peak: the floor's bytes after each step, plus the bytes
    of every tensor the corner keeps and the floor recomputes, over its span (last forward
    use to the copy's birth). On a 10k-node transformer the estimate is 0.1-0.6% above the
    real peak for every corner but the richest (+40%); it is taken as an upper bound,
    raised by the share it fell short of the last corner judged: the richest corner
    estimated to fit is judged, and the bracket (richest fit, poorest overshoot) narrows
    until no corner in it is estimated to fit or the judgements are spent. There a 65%
    budget takes the model and one rewrite. The richest corner, which recomputes almost
    nothing, is where the estimate is loosest (its order is close to reordering alone):
    under a loose budget (at least halfway from the floor's peak to the original's) it is
    judged first. Where no richer corner fits by the model, the floor itself is judged;
    when its written order is lower than the model's, the search aims again from it (near
    the floor 16 KB of 29 MB decide a corner; the model was 1.0% above the floor's rewrite
    on a 2.3k-node transformer, 2.9% on a 5k-node one, 4.6% on the mlp sample)."""
    if len(corners) < 2:
        return
    spent = 0  # rewrites, the model's included
    share = 1.0  # real bytes added over the floor per estimated byte, at least 1 (raised by a shortfall)
    shift = 0  # bytes the estimates were above the real peak of a fitting corner (lowered by a surplus)
    over = -1  # corners[over] (if any) overshoots

    def aim_from(intervals: Intervals, first_rich: bool) -> bool:
        """Judge the corners ``intervals`` says fit, richest first; whether one did."""
        nonlocal spent, share, shift, over
        ground = intervals.cost.peak_bytes
        added = {k: keep_all_limit(intervals.timeline, intervals.spans,
                                   {t: sizes.get(t, 0) for t in corners[k].kept if t in intervals.spans}) - ground
                 for k in range(len(corners) - 2)}
        fit = len(corners) - 2

        def estimate(k: int) -> float:
            return ground + shift + share * added[k]

        def aim_at(k: int) -> bool:
            nonlocal spent, share, shift, over, fit
            spent += 1
            peak, guess = judge(corners[k]).cost.peak_bytes, estimate(k)
            if peak > guess and added[k] > 0:
                share = max(share, (peak - ground - shift) / added[k])
            elif peak < guess:
                shift = peak - ground - share * added[k]
            if peak <= budget:
                fit = k
            else:
                over = k
            return peak <= budget

        if first_rich and fit > 0 and 2 * (budget - ground) >= original - ground and spent < judgements:
            if aim_at(0):
                return True
        while spent < judgements:
            aimed = [k for k in range(over + 1, fit) if estimate(k) <= budget]
            if not aimed:
                break
            aim_at(aimed[0])
        return fit < len(corners) - 2

    modelled = model(corners[-2])
    spent += 1
    if modelled.cost.peak_bytes <= budget and aim_from(modelled, True):
        return
    base, intervals = floor(corners[-2])
    if base.cost.peak_bytes > budget or base.cost.peak_bytes >= modelled.cost.peak_bytes:
        return
    spent, share, shift = 1, 1.0, 0  # from the floor's rewrite, as many judgements as from its model
    aim_from(intervals, False)


def _refine(problem: Problem, corners: list[Cut], best: Judged, judge, fits) -> None:
    """Between the cheapest fitting corner and the corner before it (more kept bytes,
    less recompute, over the budget), the byte-budget MILP at bisected byte limits."""
    richer = [c for c in corners if c.kept_bytes > best.cut.kept_bytes]
    if not richer:
        return
    lo, hi = best.cut.kept_bytes, min(c.kept_bytes for c in richer)
    for _ in range(REFINE_STEPS):
        if hi - lo <= 1:
            return
        mid = (lo + hi) // 2
        cut = solve_bytes(problem, mid)
        if cut is None:
            lo = mid
            continue
        if fits(judge(cut)):
            lo = max(mid, cut.kept_bytes)
        else:
            hi = mid


# Up to this many nodes the cut search judges every corner and refines between two with
# the byte-budget MILP even when the structure search is lean (a rewrite takes ~0.1 s here):
# bisecting the corners alone recomputed 1.70x what optimal does on gpt12 (1,836 nodes) at 60%.
THOROUGH_CUTS_NODES = 2_000
# Above this many nodes only the region-structure search runs: with the two or three
# rewrites a 100k-node graph allows (5 s each), it recomputed 2.49 GFLOP at a 65% budget
# against the cuts' 3.16 (at 10k nodes, with four rewrites, the cuts recompute 15 MFLOP
# against its 175).
STRUCTURES_FIRST_NODES = 20_000


def structures_only(a: Analysis, thorough: bool) -> bool:
    """Whether a budget search skips the cuts for the region-structure search alone, whose
    floors are then the search's models, never its answer."""
    return not thorough and len(a.graph.nodes) > STRUCTURES_FIRST_NODES


def cut_budget_plan(a: Analysis, budget: int, evaluate: Callable[[Plan], PlanCost],
                    fallback: Callable[..., BudgetResult],
                    *, thorough: bool, policy: Policy = Policy(), strategy: str = "budget",
                    intervals_of: Callable[[Plan], Intervals] | None = None,
                    floor_model: Callable[[Plan], Intervals] | None = None) -> BudgetResult:
    """The fitting plan with the fewest recompute FLOPs from the tensor-level cuts and from
    ``fallback`` (the region-structure search; ``fallback(exact=True)`` adds its exact MILP):
    on small graphs both run, on large ones
    the cuts and the fallback only when no cut fits, on the largest (STRUCTURES_FIRST_NODES)
    the fallback alone. Raises BudgetUnreachable when nothing fits."""
    base = a.priority.peak_bytes
    if base <= budget:
        return fallback()  # the original fits: its empty plan, without a sweep
    old: BudgetResult | None = None
    if budget < a.lower_bound_bytes or structures_only(a, thorough):
        return fallback()  # below the bound no plan fits: the fallback says what the lowest peak is
    cuts_thorough = thorough or len(a.graph.nodes) <= THOROUGH_CUTS_NODES
    found = search_cuts(a, budget, evaluate, thorough=cuts_thorough, policy=policy, strategy=strategy,
                        intervals_of=intervals_of, floor_model=floor_model)
    free = found.best is not None and not found.best.cost.recompute_flops  # no search can recompute less
    if (thorough and not free) or found.best is None:
        try:
            # where no cut fits on a graph the cuts search thoroughly, the structure search's
            # exact MILP is worth its time: the greedy keep set recomputed 47x optimal's on resnet18
            old = fallback(exact=found.best is None and cuts_thorough)
        except BudgetUnreachable:
            if found.best is None:
                raise
    evaluations = len(found.judged) + found.models + (old.evaluations if old is not None else 0)
    if found.best is None or (old is not None and old.recompute_flops < found.best.cost.recompute_flops):
        old.evaluations = evaluations
        return old
    best = found.best
    best.plan.notes.append(f"predicted peak {best.cost.peak_bytes} <= budget {budget} bytes "
                           f"({evaluations} evaluations)")
    return BudgetResult(best.plan, best.cost.peak_bytes, best.cost.recompute_flops, [], [], evaluations)


# The default plan: the lowest predicted peak, then, among plans this close to it, the
# fewest recompute FLOPs (a near-lowest peak for far less recompute is the better trade).
NEAR_LOWEST = 0.02
LARGE_DEFAULT_CORNERS = 1  # corners judged on large graphs, next to the one that recomputes the most
# Above this the default is the per-layer plan without judging others: each judgement is a
# rewrite of the whole graph (0.4 s at 10k nodes, 5 s at 100k), and a plain rewrite should
# stay one rewrite. At 10k nodes judging the per-layer plan and a min-cut corner took the
# default plan to 2.3-2.7 s; on a 10k-node transformer the corner won with the same peak
# (-0.06%) and 11% fewer recompute FLOPs, on CNNs the per-layer plan wins (cnn, resnet18:
# the corner's peak is 15% higher).
DEFAULT_SEARCH_NODES = 5_000


def lowest_peak_plan(a: Analysis, evaluate: Callable[[Plan], PlanCost], *, thorough: bool,
                     policy: Policy = Policy()) -> tuple[Plan, PlanCost | None]:
    """The default plan: among the region structures' floors (everything recomputed) and
    the corners of the min-cut front, the lowest real peak, then among those within
    NEAR_LOWEST of it the fewest recompute FLOPs; never above the original (reordering
    alone is a candidate; on large graphs, where each judgement is a rewrite of the whole
    graph, it is taken without one when nothing beats the original's peak)."""
    from .strategies import structures

    if len(a.graph.nodes) > DEFAULT_SEARCH_NODES:
        plan = apply_policy(default_regions(a), policy, a.graph)
        plan.notes.append(f"the default on graphs above {DEFAULT_SEARCH_NODES} nodes: no search among plans")
        return plan, None
    corners = front(build(a, policy), MAX_SOLVES if thorough else LARGE_SOLVES)
    if not thorough:
        corners = corners[-1 - LARGE_DEFAULT_CORNERS:-1]
    reorder = Plan([], "none", ["reordering alone gives the lowest peak"], decisions=all_kept(a, REORDER))
    options: list[Plan] = [reorder] if thorough else []
    options += structures(a) if thorough else [default_regions(a)]
    options += [to_plan(a, c, "lowest") for c in corners]
    options = [apply_policy(p, policy, a.graph) for p in options]
    judged = [(plan, evaluate(plan)) for plan in options]
    lowest = min(cost.peak_bytes for _, cost in judged)
    if lowest > a.priority.peak_bytes:
        return reorder, None
    near = [(plan, cost) for plan, cost in judged if cost.peak_bytes <= lowest * (1 + NEAR_LOWEST)]
    plan, cost = min(near, key=lambda pc: (pc[1].recompute_flops, pc[1].peak_bytes))
    plan.notes.append(f"the default: lowest predicted peak of {len(judged)} plans ({lowest} bytes); this one is within "
                      f"{NEAR_LOWEST:.0%} of it with the fewest recompute FLOPs")
    return plan, cost
