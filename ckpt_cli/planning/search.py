"""Searching keep sets with the real cost model.

A planner picks keep sets with a linear memory model: ``choose(limit)`` returns the
activations to keep so that the floor plan's memory, plus each kept activation's bytes
over its span, stays under ``limit`` at every step. The real cost (rewrite + simulation,
``evaluate``) differs from that estimate in both directions: chains of recompute copies
and ORT's buffer reuse make it optimistic; recompute blocks that vanish when their
outputs are kept, and a written order that changes with the keep set, make it
pessimistic.

So the search treats the limit as a knob and the real cost as the judge:

1. from the budget, tighten the limit by each overshoot until the real peak fits;
2. loosen: while the best fit leaves room under the budget, try keeping everything,
   then narrow the bracket between the largest limit that fits and the smallest above
   it that overshoots, by the secant;
3. ``thorough`` (small graphs): also tighten from limits between the floor and the
   budget (a keep set can flip ORT's buffer-reuse setting, which no linear model sees),
   sample the last bracket, and polish the best fit by keeping one more activation at
   a time.

A fit that recomputes nothing ends the search.

Every distinct keep set is evaluated once; the fitting one with the fewest recompute
FLOPs wins.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

import numpy as np

from .decision import budget_reason, kept_instead
from .plan import Plan, Region

if TYPE_CHECKING:
    from .strategies import Candidate

MAX_TIGHTENING = 8  # evaluations per start while the real peak overshoots
STARTS = 4  # thorough: starts spread between the floor and the budget
LOOSENING = 6  # thorough: secant steps above the best fit
POLISH = 16  # thorough: single activations added to the best fit
ROOM = 0.002  # stop loosening when the best fit is this close to the budget


@dataclass(frozen=True)
class PlanCost:
    """What the cost model says of a plan."""

    peak_bytes: int
    recompute_flops: int
    live_at_peak: tuple[str, ...] = ()


@dataclass(frozen=True)
class Intervals:
    """What keeping each activation costs, on the schedule of a structure's floor plan."""

    timeline: tuple[int, ...]  # predicted bytes after each step of the floor plan
    spans: dict[str, tuple[int, int]]  # tensor -> (first, last) step where keeping it adds its bytes
    cost: PlanCost  # the floor plan's own


@dataclass
class Fitted:
    plan: Plan
    cost: PlanCost
    keep: set[str]


@dataclass(frozen=True)
class KeepJudge:
    """How a search judges a keep set: added to ``structure`` (each tensor to the region
    that makes it, by ``producer``) as a plan of ``strategy``, whose real cost
    (``evaluate``) fits ``budget`` or not."""

    structure: Plan
    strategy: str
    evaluate: Callable[[Plan], PlanCost]
    budget: int
    producer: Mapping[str, int]

    def plan_with(self, keep: set[str]) -> Plan:
        return with_keep(self.structure, keep, self.strategy, self.producer)


def with_keep(plan: Plan, keep: set[str], strategy: str, producer: Mapping[str, int]) -> Plan:
    """``plan`` with ``keep`` added, each tensor to the region that makes it (a tensor
    made outside every region is already kept)."""
    home: dict[int, int] = {}
    for k, region in enumerate(plan.regions):
        for i in region.nodes:
            home.setdefault(i, k)
    extra: list[set[str]] = [set() for _ in plan.regions]
    for t in keep:
        at = home.get(producer.get(t, -1))
        if at is not None:
            extra[at].add(t)
    regions = [Region(r.name, set(r.nodes), set(r.keep) | extra[k]) for k, r in enumerate(plan.regions)]
    return Plan(regions, strategy, list(plan.notes), decisions=kept_instead(plan.decisions, keep, budget_reason))


def search_limits(judge: KeepJudge, choose: Callable[[int], set[str] | None], floor: Intervals,
                  ranked: Sequence[Candidate], *, thorough: bool, loosening: int = LOOSENING) -> tuple[Fitted | None, int]:
    """The keep set (from ``choose`` at some limit) with the fewest recompute FLOPs whose
    real peak fits ``judge.budget``, and the number of evaluations spent. ``floor``: the
    structure with nothing kept; ``ranked``: the candidates (``tensor``, ``nbytes``,
    ``flops``) ``choose`` picks from; ``loosening``: the most secant steps above the best
    fit (without ``thorough``, each evaluation being a rewrite of a large graph, fewer)."""
    search = _Search(judge, choose)
    budget, floor_peak = judge.budget, floor.cost.peak_bytes
    # the judged peak may be another measure than the model's (ORT's arena): the floor's
    # excess over its model starts the limits that far below the budget
    above = max(0, floor_peak - keep_all_limit(floor.timeline, floor.spans, {}))
    try:
        search.tighten(budget - above)
        top_limit = keep_all_limit(floor.timeline, floor.spans, {c.tensor: c.nbytes for c in ranked})
        for _ in range(loosening):
            limit = _next_limit(search.points, budget, top_limit)
            if limit is None:
                break
            search.attempt(limit)
        if thorough:
            for k in range(1, STARTS):
                search.tighten(budget - above - k * (budget - floor_peak) // STARTS)
            search.sample_bracket()
            search.polish(ranked)
    except _NothingToSave:  # a fit that recomputes nothing cannot be beaten
        pass
    return search.best, len(search.tried)


def polish_plan(plan: Plan, cost: PlanCost, ranked: Sequence[Candidate], evaluate: Callable[[Plan], PlanCost],
                budget: int, producer: Mapping[str, int], steps: int = POLISH) -> tuple[Fitted, int]:
    """``plan`` (which fits ``budget``) with more activations of ``ranked`` kept, one at a
    time, while the real cost model says it still fits and recomputes less, and the
    evaluations spent. Each structure's search polishes its own best fit; this goes on
    from the winner of them all, wherever it came from (a cut or a structure)."""
    search = _Search(KeepJudge(plan, plan.strategy, evaluate, budget, producer), lambda limit: None)
    search.best = search.tried[frozenset()] = Fitted(plan, cost, set())
    try:
        search.polish(ranked, steps)
    except _NothingToSave:
        pass
    return search.best, len(search.tried) - 1


class _NothingToSave(Exception):
    pass


class _Search:
    """The keep sets evaluated so far, the (limit, real peak) points seen, and the best fit."""

    def __init__(self, judge: KeepJudge, choose: Callable[[int], set[str] | None]) -> None:
        self.keep_judge, self.choose, self.budget = judge, choose, judge.budget
        self.tried: dict[frozenset[str], Fitted] = {}
        self.points: list[tuple[int, int]] = []
        self.best: Fitted | None = None

    def judge(self, keep: set[str]) -> Fitted:
        key = frozenset(keep)
        if key not in self.tried:
            plan = self.keep_judge.plan_with(keep)
            self.tried[key] = Fitted(plan, self.keep_judge.evaluate(plan), keep)
        fitted = self.tried[key]
        cost = fitted.cost
        if cost.peak_bytes <= self.budget and (self.best is None
                                               or cost.recompute_flops < self.best.cost.recompute_flops):
            self.best = fitted
            if not cost.recompute_flops:
                raise _NothingToSave
        return fitted

    def attempt(self, limit: int) -> int | None:
        """The real peak of the keep set chosen at ``limit`` (None: there is none)."""
        keep = self.choose(limit)
        if keep is None:
            return None
        self.points.append((limit, self.judge(keep).cost.peak_bytes))
        return self.points[-1][1]

    def tighten(self, limit: int) -> None:
        for _ in range(MAX_TIGHTENING):
            peak = self.attempt(limit)
            if peak is None or peak <= self.budget:
                return
            limit -= peak - self.budget

    def sample_bracket(self) -> None:
        """The real cost is not smooth in the keep set: sample between the largest limit
        that fits and the smallest above it that overshoots."""
        fits = [p for p in self.points if p[1] <= self.budget]
        if not fits:
            return
        lo = max(fits)[0]
        over = [p[0] for p in self.points if p[1] > self.budget and p[0] > lo]
        if over:
            hi = min(over)
            for k in range(1, STARTS):
                self.attempt(lo + k * (hi - lo) // STARTS)

    def polish(self, ranked: Sequence[Candidate], steps: int = POLISH) -> None:
        """Keep one more activation at a time, largest saving first. Its bytes are no
        guide: keeping one can cost far less than its size in reality. One that overshoots
        is tried again after the next gain (keeping more can lower the peak); one that saves
        nothing is not, or it would take the steps of those that do."""
        useless: set[str] = set()
        for _ in range(steps):
            if self.best is None:
                return
            keep = self.best.keep
            more = [c for c in ranked if c.flops and c.tensor not in keep and c.tensor not in useless
                    and frozenset(keep | {c.tensor}) not in self.tried]
            if not more:
                return
            tensor = max(more, key=lambda c: (c.flops, -c.nbytes)).tensor
            before = self.best.cost.recompute_flops
            if self.judge(keep | {tensor}).cost.recompute_flops >= before:
                useless.add(tensor)


def _next_limit(points: list[tuple[int, int]], budget: int, top_limit: int) -> int | None:
    """A limit between the largest that fits and the smallest above it that overshoots
    (``top_limit``, where every activation is kept, if none has), aimed by the secant at
    a real peak equal to the budget; None when the bracket is closed."""
    fits = [p for p in points if p[1] <= budget]
    if not fits:
        return None
    lo_limit, lo_peak = max(fits)
    if lo_limit >= top_limit or budget - lo_peak < ROOM * budget:
        return None
    over = [p for p in points if p[1] > budget and p[0] > lo_limit]
    if not over or max(p[0] for p in points) < top_limit:  # keeping everything is the best outcome: try it first
        return top_limit
    hi_limit, hi_peak = min(over)
    limit = lo_limit + (budget - lo_peak) * (hi_limit - lo_limit) // (hi_peak - lo_peak)
    limit = min(max(limit, lo_limit + 1), hi_limit - 1)
    return limit if lo_limit < limit < hi_limit else None


def keep_all_limit(timeline: Sequence[int], spans: Mapping[str, tuple[int, int]], sizes: Mapping[str, int]) -> int:
    """The linear model's peak with every activation in ``sizes`` kept: the smallest
    limit under which a planner keeps them all."""
    if not len(timeline):
        return 0
    change = [0] * (len(timeline) + 1)
    for t, nbytes in sizes.items():
        if t in spans:
            lo, hi = spans[t]
            change[lo] += nbytes
            change[hi + 1] -= nbytes
    # vectorised: a lean corner search prices several corners over a schedule of every step
    return max(0, int((np.asarray(timeline, dtype=np.int64) + np.cumsum(np.asarray(change[:-1], dtype=np.int64))).max()))
