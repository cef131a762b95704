"""The budget search over tensor-level cuts (``mincut``), judged by the real cost model.

The price sweep gives the corners of the (kept bytes, recompute cost) front; each
corner becomes a plan whose real peak (rewrite + arena simulation) decides whether it
fits. Kept bytes are not the peak: recomputed tensors live in the backward too, so
recomputing the most can raise the peak again. Small graphs judge every corner, then
fill the gap between the cheapest corner that fits and its costlier neighbour that
overshoots with the byte-budget MILP (a few byte limits, bisected); large graphs, where
each judgement is a rewrite of the whole graph, guess every corner's peak on the
original's schedule, judge the richest corner guessed to fit, and from that rewrite's
memory over its schedule (each tensor a richer corner keeps adds its bytes over its
span, as in the structure search) judge only the richer corners that estimate,
calibrated by the judged ones, says fit.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from typing import Callable, Iterable, NamedTuple

import numpy as np

from ..analysis import Analysis, lowest_peak
from ..analysis.memory import with_scratch
from ..ops import SHAPE_ONLY_OPS
from .decision import REORDER, all_kept
from .descent import Rewritten, descend
from .knee import Knee, Point, hull_path, knee_index
from .mincut import MAX_SOLVES, Cut, Problem, build, front, solve_bytes, to_plan
from .plan import Plan, Policy, apply_policy
from .regions import default_regions
from .search import Intervals, PlanCost, keep_all_limit, polish_plan
from .strategies import BudgetResult, NearMiss, NoPlanFits, candidates, lowest_cost, recomputing_nothing
from ..units import human_bytes

REFINE_STEPS = 6  # byte limits tried between two corners on small graphs


def large_judgements(nodes: int) -> int:
    """Rewrites a large graph's corner search may spend: each is a rewrite of the whole
    graph, so fewer are allowed as the graph grows, to keep planning time bounded."""
    return 4 if nodes <= 20_000 else 2
LARGE_SOLVES = 16  # price sweeps on large graphs stop sooner: each max-flow solve grows with the graph


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
    leaner: Callable[[Cut, int], Plan | None]  # the cut keeping ``fewer`` bytes less


def search_cuts(a: Analysis, budget: int, evaluate: Callable[[Plan], PlanCost], *, thorough: bool,
                policy: Policy = Policy(), strategy: str = "budget", problem: Problem | None = None,
                intervals_of: Callable[[Plan], Intervals] | None = None) -> CutSearch:
    """A lean search (``thorough`` off) aims at the corners with ``intervals_of`` (a plan's
    judged rewrite with its memory over the schedule)."""
    problem = problem or build(a, policy)
    corners = front(problem, MAX_SOLVES if thorough else LARGE_SOLVES)  # most kept bytes first
    judged: dict[tuple[frozenset[int], frozenset[str]], Judged] = {}

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

    def measure(cut: Cut) -> tuple[Judged, Intervals]:
        """``judge`` with the rewrite's memory over its schedule (one rewrite for both)."""
        assert intervals_of is not None  # a lean search checks it before it measures
        plan = plan_of(cut)
        intervals = intervals_of(plan)
        judged[(cut.copied, cut.kept)] = Judged(cut, plan, intervals.cost)
        return judged[(cut.copied, cut.kept)], intervals

    def fits(j: Judged) -> bool:
        return j.cost.peak_bytes <= budget

    if thorough:
        for cut in corners:
            judge(cut)
    else:
        if intervals_of is None:
            raise ValueError("a lean cut search aims by a judged rewrite's memory: it needs intervals_of")
        sizes = {t: info.nbytes for t, info in a.tensors.items() if info.nbytes}
        _aim(corners, judge, measure, _schedule_guesses(a, problem, corners), budget, a.working_peak_bytes, sizes,
             large_judgements(len(a.graph.nodes)))
    best = _best(judged.values(), budget)
    if thorough and best is not None and best.cost.recompute_flops:
        _refine(problem, corners, best, judge, fits, budget)
        best = _best(judged.values(), budget)
    elif thorough and best is None:  # between two corners over the budget a cut can fit
        _shift_richer_corners(problem, corners, None, judge, budget)
        best = _best(judged.values(), budget)
    lowest = min((j.cost for j in judged.values()), key=lambda c: c.peak_bytes, default=None)

    def leaner(cut: Cut, fewer: int) -> Plan | None:
        shifted = solve_bytes(problem, cut.kept_bytes - fewer)
        return plan_of(shifted) if shifted is not None else None

    return CutSearch(best, list(judged.values()), lowest, leaner)


def _best(judged: Iterable[Judged], budget: int) -> Judged | None:
    fitting = [j for j in judged if j.cost.peak_bytes <= budget]
    return min(fitting, key=lambda j: (j.cost.recompute_flops, j.cost.peak_bytes), default=None)


def _schedule_guesses(a: Analysis, problem: Problem, corners: list[Cut]) -> list[int]:
    """Each corner's peak as the original's own schedule has it without the stashed buffers
    the corner does not keep, each dropped from its last forward use to its first backward
    read: no rewrite. It is close for most corners, and well above the judged peak of the
    corner that keeps the most (reordering alone lowers its peak)."""
    g, order = a.graph, a.priority.order
    position = [0] * len(g.nodes)
    for k, i in enumerate(order):
        position[i] = k
    forward = a.phases.is_forward
    index = {t: u for u, t in enumerate(problem.tensors)}
    spans: dict[str, list[int]] = {}  # buffer -> [bytes, last forward use, first backward read]
    for u, t in enumerate(problem.tensors):
        span = spans.setdefault(problem.buffer[u], [0, -1, len(order)])
        span[0] = max(span[0], int(problem.nbytes[u]))
        span[1] = max([span[1], position[g.producer[t]]]
                      + [position[c] for c in g.consumers.get(t, ()) if forward[c]])
        span[2] = min([span[2]] + [position[c] for c in g.consumers.get(t, ())
                                   if not forward[c] and g.nodes[c].op_type not in SHAPE_ONLY_OPS])
    dropped = [(b, size, first, last) for b, (size, first, last) in spans.items()
               if size and first + 1 < last < len(order)]  # stashed: read by the backward
    sizes = np.asarray([d[1] for d in dropped], dtype=np.int64)
    starts = np.asarray([d[2] + 1 for d in dropped], dtype=np.int64)
    ends = np.asarray([d[3] for d in dropped], dtype=np.int64)
    timeline = np.asarray(with_scratch(a.priority.timeline, a.scratch), dtype=np.int64)
    guesses = []
    for cut in corners:
        kept = {problem.buffer[index[t]] for t in cut.kept}
        gone = np.asarray([b not in kept for b, _, _, _ in dropped], dtype=bool)
        change = np.zeros(len(timeline) + 1, dtype=np.int64)
        np.add.at(change, starts[gone], -sizes[gone])
        np.add.at(change, ends[gone], sizes[gone])
        guesses.append(int((timeline + np.cumsum(change[:-1])).max()) if len(timeline) else 0)
    return guesses


def _aim(corners: list[Cut], judge: Callable[[Cut], Judged], measure: Callable[[Cut], tuple[Judged, Intervals]],
         guesses: list[int], budget: int, original: int, sizes: dict[str, int], judgements: int) -> None:
    """The corner keeping the most bytes that fits, aimed by estimate, in a few rewrites of
    the whole graph. Recomputing all is never tried (its copies all live at once): the
    corner next to it is the floor. ``guesses``: each corner's peak on the original's
    schedule (``_schedule_guesses``). Under a loose budget (at least halfway from the
    floor's guess to the original's peak) the corner that keeps the most, whose guess is
    the loosest, is judged first. Then the richest corner guessed to fit (else the floor)
    is judged with its memory over its schedule (``measure``), and the floor when it
    overshoots. From a judged fit the search aims at the richer corners as the structure
    search does: the fit's bytes after each step, plus the bytes of every tensor a richer
    corner keeps and the fit recomputes, over its span (last forward use to the copy's
    birth), raised by the share it fell short of the last corner judged and lowered by the
    surplus of the last one that fitted; the richest corner so estimated to fit is judged
    until none is or the judgements are spent, then one estimated over the budget by less
    than twice the largest error an estimate made, and the loose test is made again,
    widened as much: the guesses err, and a fitting corner must not hide behind the error."""
    last = len(corners) - 2
    if last < 0:
        return
    spent, over = 0, -1
    ground = guesses[last]
    if last > 0 and 2 * (budget - ground) >= original - ground:
        spent += 1
        if judge(corners[0]).cost.peak_bytes <= budget:
            return
        over = 0
    start = next((k for k in range(over + 1, last) if guesses[k] <= budget), last)
    base, intervals = measure(corners[start])
    spent += 1
    error = abs(base.cost.peak_bytes - guesses[start]) / max(1, base.cost.peak_bytes)
    failed: set[int] = set()
    if base.cost.peak_bytes > budget:
        if start == last:
            return
        # real peaks need not fall with the bytes kept: a richer corner than this one may fit
        failed.add(start)
        base, intervals = measure(corners[last])
        spent += 1
        if base.cost.peak_bytes > budget:
            return
        start = last
    aiming = _Aiming(corners, judge, budget, sizes)
    left, error = _aim_richer(aiming, intervals, start, over, failed, judgements - spent, error)
    # the loose test again, by as much as the estimates erred: the richest corner's guess is the loosest
    if over < 0 < left and 2 * (budget - ground) * (1 + 2 * error) >= original - ground:
        judge(corners[0])


@dataclass(frozen=True)
class _Aiming:
    """What a lean search aims with: the corners (most kept bytes first), how one is judged,
    the budget, and each tensor's bytes (for the estimates)."""

    corners: list[Cut]
    judge: Callable[[Cut], Judged]
    budget: int
    sizes: dict[str, int]


def _aim_richer(aiming: _Aiming, intervals: Intervals, fit: int, over: int, failed: set[int], judgements: int,
                error: float) -> tuple[int, float]:
    """From ``aiming.corners[fit]``, judged and fitting, with ``intervals`` its memory over its
    schedule: judge the corners between ``over`` (overshooting, or -1) and it that its
    estimate says fit, richest first, while ``judgements`` last; then, with judgements
    left, a corner whose estimate is over the budget by less than twice the largest error
    an estimate made so far (``error`` to begin with, a share of the real peak).
    ``failed``: corners judged over the budget that do not bound the richer ones. Returns
    the judgements left and the largest error."""
    corners, budget, sizes = aiming.corners, aiming.budget, aiming.sizes
    ground = intervals.cost.peak_bytes
    model = keep_all_limit(intervals.timeline, intervals.spans, {})  # the judged peak may be another measure
    added = {k: keep_all_limit(intervals.timeline, intervals.spans,
                               {t: sizes.get(t, 0) for t in corners[k].kept if t in intervals.spans}) - model
             for k in range(over + 1, fit)}
    share = 1.0  # real bytes per estimated byte (raised by a shortfall)
    shift: float = 0  # bytes the estimate is above

    def estimate(k: int) -> float:
        return ground + shift + share * added[k]

    while judgements > 0:
        aimed = [k for k in range(over + 1, fit) if k not in failed and estimate(k) <= budget]
        if not aimed:
            close = [k for k in range(over + 1, fit) if k not in failed and estimate(k) <= budget * (1 + 2 * error)]
            if not close:
                break
            aimed = close
        k = aimed[0]
        judgements -= 1
        peak, guess = aiming.judge(corners[k]).cost.peak_bytes, estimate(k)
        error = max(error, abs(peak - guess) / max(1, peak))
        if peak > guess and added[k] > 0:
            share = max(share, (peak - ground - shift) / added[k])
        elif peak < guess:
            shift = peak - ground - share * added[k]
        if peak <= budget:
            fit = k
        else:
            over = k
    return judgements, error


def _refine(problem: Problem, corners: list[Cut], best: Judged, judge: Callable[[Cut], Judged],
            fits: Callable[[Judged], bool], budget: int) -> None:
    """Between the cheapest fitting corner and the corner before it (more kept bytes,
    less recompute, over the budget), the byte-budget MILP at bisected byte limits; then
    the richer corners shifted down to the budget (``_shift_richer_corners``)."""
    richer = [c for c in corners if c.kept_bytes > best.cut.kept_bytes]
    if not richer:
        return
    _bisect_next_richer(problem, richer, best, judge, fits)
    _shift_richer_corners(problem, richer, best, judge, budget)


# Richer corners shifted down to the budget, and shifts tried per corner.
SHIFTED_CORNERS = 6
SHIFTS = 2


def _shift_richer_corners(problem: Problem, richer: list[Cut], best: Judged | None, judge: Callable[[Cut], Judged],
                          budget: int) -> None:
    """The peak is not monotone in the kept bytes: it climbs with them while the copied
    set stays, and drops where the set changes. A richer corner over the budget by ``d``
    bytes usually fits once it keeps ``d`` bytes fewer, recomputing little more: the
    byte-budget MILP at that limit, for the corners closest to fitting."""
    def over(c: Cut) -> int:
        return judge(c).cost.peak_bytes - budget

    near = sorted((c for c in richer if over(c) > 0
                   and (best is None or judge(c).cost.recompute_flops < best.cost.recompute_flops)), key=over)
    for corner in near[:SHIFTED_CORNERS]:
        cut = corner
        for _ in range(SHIFTS):
            shifted = solve_bytes(problem, cut.kept_bytes - over(cut))
            if shifted is None or over(shifted) <= 0:
                break
            cut = shifted


def _bisect_next_richer(problem: Problem, richer: list[Cut], best: Judged, judge: Callable[[Cut], Judged],
                        fits: Callable[[Judged], bool]) -> None:
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
# the byte-budget MILP even when the structure search is lean: rewrites are cheap at this
# size, and bisecting the corners alone recomputes well above what optimal does.
THOROUGH_CUTS_NODES = 4_000
# Above this many nodes only the region-structure search runs: with the two or three
# rewrites such a graph allows, it finds plans that recompute less than the cuts' (below
# this size the cuts win).
STRUCTURES_FIRST_NODES = 20_000


def structures_only(a: Analysis, thorough: bool) -> bool:
    """Whether a budget search skips the cuts for the region-structure search alone, whose
    floors are then the search's models, never its answer."""
    return not thorough and len(a.graph.nodes) > STRUCTURES_FIRST_NODES


def cut_budget_plan(a: Analysis, budget: int, evaluate: Callable[[Plan], PlanCost],
                    fallback: Callable[..., BudgetResult],
                    *, thorough: bool, policy: Policy = Policy(), strategy: str = "budget",
                    intervals_of: Callable[[Plan], Intervals] | None = None) -> BudgetResult:
    """The fitting plan with the fewest recompute FLOPs from the tensor-level cuts and from
    ``fallback`` (the region-structure search; ``fallback(exact=True)`` adds its exact MILP,
    ``beat`` is the recompute FLOPs of the best cut, which its plan must beat to be taken):
    on small graphs both run, on large ones
    the cuts and the fallback only when no cut fits, on the largest (STRUCTURES_FIRST_NODES)
    the fallback alone. Raises BudgetUnreachable when nothing fits."""
    if recomputing_nothing(a, budget, evaluate, strategy)[0] is not None:
        return fallback()  # the original fits: its empty plan, without a sweep
    old: BudgetResult | None = None
    floor = lowest_peak(a)
    if budget < floor.bytes or structures_only(a, thorough):
        try:
            return fallback()  # below the bound no plan fits: the fallback says what the lowest peak is
        except NoPlanFits as e:
            raise NoPlanFits(a, budget, e.lowest, floor) from e
    cuts_thorough = thorough or len(a.graph.nodes) <= THOROUGH_CUTS_NODES
    found = search_cuts(a, budget, evaluate, thorough=cuts_thorough, policy=policy, strategy=strategy,
                        intervals_of=intervals_of)
    free = found.best is not None and not found.best.cost.recompute_flops  # no search can recompute less
    if (thorough and not free) or found.best is None:
        try:
            # where no cut fits on a graph the cuts search thoroughly, the structure search's
            # exact MILP is worth its time: the greedy keep set can recompute many times optimal's
            old = fallback(exact=found.best is None and cuts_thorough,
                           beat=found.best.cost.recompute_flops if found.best is not None else None)
        except NoPlanFits as e:
            if found.best is None:
                raise NoPlanFits(a, budget, lowest_cost(e.lowest, found.lowest), floor) from e
    evaluations = len(found.judged) + (old.evaluations if old is not None else 0)
    polish = thorough or len(a.graph.nodes) <= FINAL_POLISH_NODES
    if found.best is None or (old is not None and old.recompute_flops < found.best.cost.recompute_flops):
        assert old is not None  # with no cut found, the fallback answered or raised
        old.evaluations = evaluations
        old.near_misses = _near_misses(found, budget, old.recompute_flops) if cuts_thorough else ()
        return polished(a, old, evaluate, budget, policy) if polish else old
    best = found.best
    best.plan.notes.append(f"predicted peak {human_bytes(best.cost.peak_bytes)} <= budget {human_bytes(budget)} "
                           f"({evaluations} evaluations)")
    result = BudgetResult(best.plan, best.cost.peak_bytes, best.cost.recompute_flops, [], [], evaluations,
                          near_misses=_near_misses(found, budget, best.cost.recompute_flops) if cuts_thorough else ())
    return polished(a, result, evaluate, budget, policy) if polish else result


# Cuts this close over the budget before pinning are worth a few pinned rewrites each: the
# written graph's fresh buffers can bring its peak under (bert_base's cut at PyTorch's 1.0
# point: 7.5% lower pinned; resnet18_224's corners, as ORT holds them: up to 10% lower).
NEAR_MISS = 0.10
NEAR_MISSES = 2


def _near_misses(found: CutSearch, budget: int, flops: int) -> tuple[NearMiss, ...]:
    """The cuts that recompute least among those under ``flops`` and just over the budget."""
    over = [j for j in found.judged if budget < j.cost.peak_bytes <= budget * (1 + NEAR_MISS)
            and j.cost.recompute_flops < flops]
    return tuple(NearMiss(j.plan, partial(found.leaner, j.cut))
                 for j in sorted(over, key=lambda j: j.cost.recompute_flops)[:NEAR_MISSES])


# Evaluations the winner's polish may spend. Each structure's search polishes its own best
# fit (search.POLISH); going on from the winner of them all keeps --budget monotone in the
# budget: without it a looser budget can recompute more than a tighter one.
FINAL_POLISH = 16
# Graphs polished even where the search is lean: on small graphs the polish cuts recompute
# FLOPs a lot for little time; on larger ones its rewrites multiply the command's time.
FINAL_POLISH_NODES = 2_000


def polished(a: Analysis, result: BudgetResult, evaluate: Callable[[Plan], PlanCost], budget: int,
             policy: Policy) -> BudgetResult:
    """``result`` with more activations kept, one at a time, while the real cost model
    says it still fits ``budget`` and recomputes less (``search.polish_plan``); never one
    the policy recomputes."""
    if not result.recompute_flops or not result.plan.regions:
        return result
    kept = {t for r in result.plan.regions for t in r.keep}
    ranked = [c for c in candidates(a, result.plan) if c.tensor not in kept
              and a.graph.nodes[a.graph.producer[c.tensor]].op_type not in policy.recompute_ops]
    fitted, spent = polish_plan(result.plan, PlanCost(result.peak_bytes, result.recompute_flops), ranked, evaluate,
                                budget, a.graph.producer, FINAL_POLISH)
    evaluations = result.evaluations + spent
    if not fitted.keep:
        return replace(result, evaluations=evaluations)
    plan, cost = fitted.plan, fitted.cost
    plan.notes.append(f"then kept {len(fitted.keep)} more, one at a time, each checked by the real cost model: "
                      f"predicted peak {human_bytes(cost.peak_bytes)} <= budget {human_bytes(budget)} "
                      f"({evaluations} evaluations)")
    return replace(result, plan=plan, peak_bytes=cost.peak_bytes, recompute_flops=cost.recompute_flops,
                   kept=result.kept + [c for c in ranked if c.tensor in fitted.keep],
                   recomputed=[c for c in result.recomputed if c.tensor not in fitted.keep],
                   evaluations=evaluations)


# The default plan: the lowest predicted peak, then, among plans this close to it, the
# fewest recompute FLOPs (a near-lowest peak for far less recompute is the better trade).
NEAR_LOWEST = 0.02
LARGE_DEFAULT_CORNERS = 1  # corners judged on large graphs, next to the one that recomputes the most
# Above this the default's searches judge a bounded number of plans: each judgement is a
# rewrite of the whole graph. A min-cut corner can beat the per-layer plan on transformers,
# though not on CNNs.
DEFAULT_SEARCH_NODES = 5_000
# Above DEFAULT_SEARCH_NODES the knee's rewrites are bounded by the nodes they rewrite in
# all, to keep the default plan within its targets (2 s at 10k nodes, 15 s at 100k; the
# command without the knee takes 1.1 s and 10 s there): a rewrite takes 30-50 us a node.
# So the corners' peaks are estimated on the original's schedule, and only the corner at
# their knee is judged, then the per-layer plan and the knee's hull neighbours while the
# bound allows (two plans at 10k nodes, one above 12.5k).
KNEE_JUDGED_NODES = 25_000


class DefaultPlan(NamedTuple):
    """The default's choice: its plan and cost, and at the knee the record of the choice
    and the lowest-peak plan it passed up (None where the knee is the lowest)."""

    plan: Plan
    cost: PlanCost | None = None
    knee: Knee | None = None
    lowest: Plan | None = None
    # (plan, cost) of the front's hull vertices past the knee, toward the lowest peak
    beyond: tuple[tuple[Plan, PlanCost], ...] = ()
    # (plan, cost) of the plans with less recompute than ``plan``, lowest peak first
    fallbacks: tuple[tuple[Plan, PlanCost], ...] = ()


def lowest_peak_plan(a: Analysis, evaluate: Callable[[Plan], PlanCost], *, thorough: bool,
                     policy: Policy = Policy(), at_knee: bool = False, rewritten: Rewritten | None = None) -> DefaultPlan:
    """The default plan: among the region structures' floors (everything recomputed) and
    the corners of the min-cut front, the lowest real peak, then among those within
    NEAR_LOWEST of it the fewest recompute FLOPs; never above the original (reordering
    alone is a candidate; on large graphs, where each judgement is a rewrite of the whole
    graph, it is taken without one when nothing beats the original's peak). ``at_knee``:
    the knee of the same candidates instead (``knee.py``), with the choice recorded.
    ``rewritten``: the graph a judged plan was rewritten to; with it the lowest peak of a
    small graph also takes the plans the peak descent reaches (``descent.py``)."""
    judgements = max(1, KNEE_JUDGED_NODES // max(1, len(a.graph.nodes)))
    if len(a.graph.nodes) > DEFAULT_SEARCH_NODES and not at_knee:
        reorder, judged = _aimed_lowest(a, evaluate, policy, judgements)
    elif at_knee and not thorough:
        reorder, judged = _aimed_knee(a, evaluate, policy, judgements)
    else:
        reorder, judged = _judged_defaults(a, evaluate, thorough, policy, every_corner=at_knee)
    front = judged
    if thorough and not at_knee and rewritten is not None:
        judged = front + descend(a, front, evaluate, rewritten, policy)
    if min(cost.peak_bytes for _, cost in judged) > a.working_peak_bytes:
        return DefaultPlan(reorder)
    best = _near_lowest(judged)
    if at_knee:
        return _at_knee(a, judged, best)
    plan, cost = judged[best]
    plan.notes.append(lowest_note(judged, cost))
    if best < len(front):
        return DefaultPlan(plan, cost, fallbacks=_fallbacks(front, cost))
    # a session that refuses the descent's plan gets the front's own choice next, then its
    # fallbacks, as before the descent: the front's choice may recompute more (zoo bert's, which
    # measures 0.42x the original under its settings where the descended plan measures 0.48x)
    own = front[_near_lowest(front)]
    fallbacks = ((own,) if own[0].strategy != "none" else ()) + _fallbacks(front, own[1])
    return DefaultPlan(plan, cost, fallbacks=fallbacks)


def _near_lowest(judged: list[tuple[Plan, PlanCost]]) -> int:
    """The plan within NEAR_LOWEST of the lowest peak of ``judged`` with the fewest recompute FLOPs."""
    lowest = min(cost.peak_bytes for _, cost in judged)
    near = [i for i, (_, cost) in enumerate(judged) if cost.peak_bytes <= lowest * (1 + NEAR_LOWEST)]
    return min(near, key=lambda i: (judged[i][1].recompute_flops, judged[i][1].peak_bytes))


def _fallbacks(judged: list[tuple[Plan, PlanCost]], chosen: PlanCost) -> tuple[tuple[Plan, PlanCost], ...]:
    """The plans that recompute less than ``chosen``, each below every plan before it in
    recompute: the front from the lowest peak toward the original, for a session that
    refuses the lowest (an ORT training artifact's, judged by training it)."""
    out, least = [], chosen.recompute_flops
    for plan, cost in sorted(judged, key=lambda pc: (pc[1].peak_bytes, pc[1].recompute_flops)):
        if cost.recompute_flops < least and plan.strategy != "none":
            out.append((plan, cost))
            least = cost.recompute_flops
    return tuple(out)


def lowest_note(judged: list[tuple[Plan, PlanCost]], cost: PlanCost) -> str:
    return (f"the lowest predicted peak of {len(judged)} plans ({human_bytes(min(c.peak_bytes for _, c in judged))}); "
            f"this one is within {NEAR_LOWEST:.0%} of it with the fewest recompute FLOPs")


def _judged_defaults(a: Analysis, evaluate: Callable[[Plan], PlanCost], thorough: bool, policy: Policy,
                     every_corner: bool, corners: list[Cut] | None = None) -> tuple[Plan, list[tuple[Plan, PlanCost]]]:
    """The reordering-only plan, and the default's candidates with their costs. A knee
    needs the front between its ends, so ``every_corner`` judges all corners on large
    graphs too (one rewrite each). ``corners``: the front, when it is drawn already."""
    from .strategies import structures

    if corners is None:
        corners = front(build(a, policy), MAX_SOLVES if thorough else LARGE_SOLVES)
    if not thorough and not every_corner:
        corners = corners[-1 - LARGE_DEFAULT_CORNERS:-1]
    reorder = Plan([], "none", ["reordering alone gives the lowest peak"], decisions=all_kept(a, REORDER))
    options: list[Plan] = [reorder] if thorough else []
    options += structures(a) if thorough else [default_regions(a)]
    options += [to_plan(a, c, "mincut") for c in corners]
    options = [apply_policy(p, policy, a.graph) for p in options]
    return reorder, [(plan, evaluate(plan)) for plan in options]


def _aimed_knee(a: Analysis, evaluate: Callable[[Plan], PlanCost], policy: Policy,
                judgements: int) -> tuple[Plan, list[tuple[Plan, PlanCost]]]:
    """``_judged_defaults`` for the knee: every candidate up to DEFAULT_SEARCH_NODES or
    while ``judgements`` rewrites suffice, else that many of the corners nearest the knee
    of their estimated peaks (``_knee_first``), the per-layer plan second, each judged."""
    problem = build(a, policy)
    corners = front(problem, LARGE_SOLVES)
    if len(a.graph.nodes) <= DEFAULT_SEARCH_NODES or judgements > len(corners) or len(corners) < 2:
        return _judged_defaults(a, evaluate, False, policy, every_corner=True, corners=corners)
    reorder = Plan([], "none", ["reordering alone gives the lowest peak"], decisions=all_kept(a, REORDER))
    options = _nearest_knee(a, problem, corners, policy, judgements)
    plans = len(corners) + 1
    # the cut problem and its front are done with: freed, they leave room for the rewrites
    # judged (at 100k nodes 30 MiB of a rewrite's peak)
    del problem, corners
    judged = [(plan, evaluate(plan)) for plan in options]
    cuts = len(options) - (len(options) > 1)
    note = (f"{len(options)} of {plans} plans judged: the {cuts} min-cut corner(s) nearest the knee of "
            "their peaks estimated on the original's schedule" + (", and the per-layer plan" if cuts < len(options) else ""))
    for plan, _ in judged:
        plan.notes.append(note)
    return reorder, judged


def _aimed_lowest(a: Analysis, evaluate: Callable[[Plan], PlanCost], policy: Policy,
                  judgements: int) -> tuple[Plan, list[tuple[Plan, PlanCost]]]:
    """The lowest peak's candidates above DEFAULT_SEARCH_NODES, each judged: the per-layer
    plan, then, while ``judgements`` rewrites suffice, the corners of lowest peak estimated
    on the original's schedule (a corner can match the per-layer peak for far less
    recompute on transformers; on CNNs the per-layer plan wins)."""
    reorder = Plan([], "none", ["reordering alone gives the lowest peak"], decisions=all_kept(a, REORDER))
    options = [default_regions(a)]
    if judgements > 1:  # the front takes seconds at 100k nodes: not for corners left unjudged
        problem = build(a, policy)
        aimed = front(problem, LARGE_SOLVES)[:-1]  # recomputing all: see _nearest_knee
        guesses = _schedule_guesses(a, problem, aimed)
        del problem  # let go before the rewrites judged, as _aimed_knee does
        lowest = sorted(range(len(aimed)), key=lambda k: (guesses[k], aimed[k].flops))
        options += [to_plan(a, aimed[k], "mincut") for k in lowest[:judgements - 1]]
    options = [apply_policy(p, policy, a.graph) for p in options]
    judged = [(plan, evaluate(plan)) for plan in options]
    note = (f"{len(judged)} plan(s) judged on a graph above {DEFAULT_SEARCH_NODES} nodes: the per-layer plan"
            + (f" and the {len(judged) - 1} min-cut corner(s) of lowest peak estimated on the original's schedule"
               if len(judged) > 1 else ""))
    for plan, _ in judged:
        plan.notes.append(note)
    return reorder, judged


def _nearest_knee(a: Analysis, problem: Problem, corners: list[Cut], policy: Policy, judgements: int) -> list[Plan]:
    """The ``judgements`` plans ``_aimed_knee`` judges: the corners nearest the knee of
    their peaks estimated on the original's schedule, the per-layer plan second."""
    # recomputing all is left out: its copies all live at once, which no guess on the original's schedule sees
    aimed = corners[:-1]
    guesses = _schedule_guesses(a, problem, aimed)
    points = [Point(g, c.flops) for g, c in zip(guesses, aimed)]
    order = _knee_first(points, a.working_peak_bytes, a.forward_flops + a.backward_flops)
    options = [to_plan(a, aimed[k], "mincut") for k in order[:judgements]]
    if judgements > 1:  # finding the layers takes a second at 100k nodes: not for a plan left unjudged
        options.insert(1, default_regions(a))
    return [apply_policy(p, policy, a.graph) for p in options[:judgements]]


def _knee_first(points: list[Point], original: int, step: int) -> list[int]:
    """Indices of ``points`` on their lower convex hull, the knee first, then its hull
    neighbours outward, the one past it (toward lower peaks) before the one before it;
    the points off the hull last, least recompute first."""
    first, hops = hull_path(points, original, step)
    path = [first, *(v for v, _ in hops)]
    at = path.index(knee_index(points, original, step))
    order = [path[at]]
    for d in range(1, len(path)):
        order += [path[i] for i in (at + d, at - d) if 0 <= i < len(path)]
    return order + sorted(set(range(len(points))) - set(path), key=lambda k: points[k].recompute_flops)


def _at_knee(a: Analysis, judged: list[tuple[Plan, PlanCost]], lowest: int) -> DefaultPlan:
    """The knee of ``judged``, recorded against its lowest-peak plan (index ``lowest``),
    which is kept, with its note, for when the knee gains nothing."""
    points = [Point(cost.peak_bytes, cost.recompute_flops) for _, cost in judged]
    step = a.forward_flops + a.backward_flops
    i = knee_index(points, a.working_peak_bytes, step)
    knee = Knee(a.working_peak_bytes, step, points[i], points[lowest], len(points))
    plan, cost = judged[i]
    first, hops = hull_path(points, a.working_peak_bytes, step)
    path = [first, *(v for v, _ in hops)]
    beyond = tuple(judged[v] for v in path[path.index(i) + 1:]) if i in path else ()
    reorder_only = plan.strategy == "none"
    if reorder_only:
        plan.notes.clear()
    plan.notes.append(knee.line(reorder_only))
    if i == lowest:
        return DefaultPlan(plan, cost, knee)
    passed_up, its_cost = judged[lowest]
    passed_up.notes.append(lowest_note(judged, its_cost))
    return DefaultPlan(plan, cost, knee, passed_up, beyond)
