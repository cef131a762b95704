"""The budget search (``--budget``, ``--auto budget|optimal``): of the plans whose rewrite
fits the budget, the one with the fewest recompute FLOPs.

1. Search the cuts and region structures for the cheapest plan predicted under the target
   (``cut_budget_plan``), judging each plan by its unpinned rewrite (``PlanEvaluator``).
2. On a structure, the greedy keep set runs first; on small graphs the exact MILP runs on
   the structure it chose too, unless the best cut is far cheaper anyway.
3. With ``write`` (the pinned rewrite that will be written), judge the winner as written:
   pin's guards and fresh buffers move the peak ORT holds (a few bytes up, or the arena's
   chunks down by several percent), so a fit closer to the budget than that is searched
   again as far below it, and a fit still over the budget is refused; near misses of the
   search are written too, and shifted down by their overshoot where still over.

Plans are judged by ``PlanEvaluator.measure``: what ORT holds at the peak (``ort_peak``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Protocol

from ..analysis import Analysis
from ..errors import BudgetUnreachable
from ..units import human_bytes
from .cutsearch import cut_budget_plan, structures_only
from .evaluate import PlanEvaluator, Rewritten
from .knee import Knee
from .plan import Plan, Policy
from .search import Intervals, PlanCost
from .solver import optimal_plan
from .strategies import LARGE_GRAPH_NODES, BudgetResult, budget_plan

# A structure plan over this many times the best cut's FLOPs is not searched exactly again:
# the exact search on the greedy's own structure gains far less than that.
EXACT_AGAIN_WITHIN = 2.0


@dataclass(frozen=True)
class Planned:
    plan: Plan | None
    budget: int | None = None
    search: BudgetResult | None = None
    result: Any = None  # the search's own (unpinned) rewrite of ``plan``, when it has one
    user: bool = False  # regions or a strategy the user chose (--region, --plan, --auto): warned about, never dropped
    written: Any = None  # the pinned rewrite of ``plan``, when the budget search checked it
    knee: Knee | None = None  # the default's choice at the knee, against the lowest peak it passed up
    activation: Any = None  # --activation-budget's ActivationBudget record
    plain: Any = None  # the default's PlainChoice: the knee judged again in a plain InferenceSession
    beyond: tuple[tuple[Plan, PlanCost, Any], ...] = ()  # the default's (plan, cost, unpinned rewrite) of each hull vertex past the knee
    knee_cost: Any = None  # the knee's PlanCost, with ``beyond``
    cost: Any = None  # the default's PlanCost, where it has one
    fallbacks: tuple[tuple[Plan, PlanCost, Any], ...] = ()  # the default's (plan, cost, unpinned rewrite) with less recompute, lowest peak first
    module: Any = None  # the default's ModuleChoice: an ORT training artifact judged by training it

    def settled(self) -> "Planned":
        """``self`` without the search's unpinned rewrites, once the written one is made from
        them: each holds a graph of the model's size that nothing reads after (72 MiB of a
        100k-node graph's, alive while the written model is built and saved)."""
        return replace(self, result=None, beyond=tuple((p, c, None) for p, c, _ in self.beyond),
                       fallbacks=tuple((p, c, None) for p, c, _ in self.fallbacks))


class Solver(Protocol):
    """``budget_plan`` or ``optimal_plan``: the cheapest plan under ``budget`` by a search."""

    def __call__(self, a: Analysis, budget: int, evaluate: Callable[[Plan], PlanCost],
                 intervals_of: Callable[[Plan], Intervals], *, beat: int | None = None) -> BudgetResult: ...


# A near miss whose written graph is over the budget is shifted down by its overshoot this
# many times (each a pinned rewrite): the written peak moves with the kept bytes, not 1:1.
WRITTEN_SHIFTS = 2


class BudgetSearch:
    """One budget search over ``evaluator``'s graph; ``run(budget)`` gives the ``Planned``."""

    def __init__(self, evaluator: PlanEvaluator, auto: str | None, policy: Policy,
                 write: Callable[[Planned], Rewritten] | None = None) -> None:
        a = evaluator.a
        self.evaluator = evaluator
        self.policy = policy
        self.write = write
        self.exact_only = auto == "optimal"
        self.strategy = auto or "budget"
        self.thorough = auto == "optimal" or len(a.graph.nodes) <= LARGE_GRAPH_NODES
        evaluator.model_floors = structures_only(a, self.thorough)

    @property
    def a(self) -> Analysis:
        return self.evaluator.a

    def peak(self, result: Rewritten) -> int:
        """A rewrite's peak as the budget bounds it."""
        return self.evaluator.measure(result.after)

    def run(self, budget: int) -> Planned:
        planned = self.searched(budget, budget)
        if self.write is None:
            return planned
        planned = replace(planned, written=self.write(planned))
        assert planned.search is not None  # ``searched`` always records its search
        guards = self.peak(planned.written) - planned.search.peak_bytes
        if self.peak(planned.written) <= budget:
            return self.cheaper_as_written(planned, budget)
        line = (f"budget {human_bytes(budget)} is unreachable: the best fit found peaks at "
                f"{human_bytes(self.peak(planned.written))} once its order is pinned "
                f"({'+' if guards >= 0 else '-'}{human_bytes(abs(guards))} against the search's unpinned rewrite)")
        try:
            planned = self.searched(budget - guards, budget)
        except BudgetUnreachable as e:
            raise BudgetUnreachable(line) from e
        planned = replace(planned, written=self.write(planned))
        if self.peak(planned.written) > budget:
            raise BudgetUnreachable(line)
        return planned

    def cheaper_as_written(self, planned: Planned, budget: int) -> Planned:
        """A near miss of the search whose written (pinned) graph fits and recomputes less
        than ``planned``'s, if one does: the search judged it unpinned. A near miss whose
        written graph is over by ``d`` bytes is tried again keeping ``d`` bytes fewer."""
        assert planned.search is not None and self.write is not None  # called by ``run`` with both
        for miss in planned.search.near_misses:
            plan = miss.plan
            fewer = 0
            for _ in range(1 + WRITTEN_SHIFTS):
                written = self.write(Planned(plan, budget))
                peak = self.peak(written)
                if written.recompute_flops >= planned.written.recompute_flops:
                    break
                if peak <= budget:
                    return self._as_written(planned, plan, written, budget)
                fewer += peak - budget
                leaner = miss.leaner(fewer)
                if leaner is None:
                    break
                plan = leaner
        return planned

    def _as_written(self, planned: Planned, plan: Plan, written: Rewritten, budget: int) -> Planned:
        peak = self.peak(written)
        assert planned.search is not None  # as in ``cheaper_as_written``
        plan.notes.append(f"pinned, its written peak {human_bytes(peak)} <= budget {human_bytes(budget)} (the search's "
                          "unpinned rewrite was over)")
        search = replace(planned.search, plan=plan, peak_bytes=peak, recompute_flops=written.recompute_flops,
                         kept=[], recomputed=[], structure=None, near_misses=())
        return Planned(plan, budget, search, written=written)

    def searched(self, target: int, budget: int) -> Planned:
        """The cheapest plan predicted under ``target`` (the user's ``budget`` is recorded)."""
        ev = self.evaluator
        ev.restart(target)
        search = cut_budget_plan(self.a, target, ev.cost, self.structure_search, thorough=self.thorough,
                                 strategy=self.strategy, policy=self.policy, intervals_of=ev.intervals)
        if ev.best_plan is search.plan:
            result = ev.best_result
        else:  # the plan recomputing nothing is rewritten once, whichever plan object asked
            result = ev.unchanged if not search.plan.regions else None
        return Planned(ev.ruled(search.plan), budget, search, result)

    def structure_search(self, exact: bool = False, beat: int | None = None) -> BudgetResult:
        """The cheapest fit on the region structures: the greedy keep set, the exact MILP,
        or both where the greedy may have missed the MILP's fit on its own structure."""
        if not self.exact_only and not exact:
            return self._greedy_then_exact(beat)
        try:  # the MILP's linear model can miss a fit the greedy keep set reaches
            exact_fit = self._solve(optimal_plan, beat)
        except BudgetUnreachable:
            return self._solve(budget_plan, beat)
        try:
            heuristic = self._solve(budget_plan, beat)
        except BudgetUnreachable:
            return exact_fit
        return exact_fit if exact_fit.recompute_flops <= heuristic.recompute_flops else heuristic

    def _greedy_then_exact(self, beat: int | None) -> BudgetResult:
        heuristic = self._solve(budget_plan, beat)
        if (not self.thorough or not heuristic.recompute_flops or heuristic.structure is None
                or (beat is not None and heuristic.recompute_flops > EXACT_AGAIN_WITHIN * beat)):
            return heuristic
        ev = self.evaluator
        assert ev.limit is not None  # ``searched`` set it before any structure search
        try:
            exact_there = optimal_plan(self.a, ev.limit, ev.cost, ev.intervals, [heuristic.structure], self.strategy)
        except BudgetUnreachable:
            return heuristic
        exact_there.evaluations += heuristic.evaluations
        return exact_there if exact_there.recompute_flops < heuristic.recompute_flops else heuristic

    def _solve(self, solver: Solver, beat: int | None) -> BudgetResult:
        ev = self.evaluator
        assert ev.limit is not None  # ``searched`` set it before any structure search
        return solver(self.a, ev.limit, ev.cost, ev.intervals, beat=beat)
