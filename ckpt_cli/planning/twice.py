"""Which recomputed tensors a plan makes twice: its rewrite's peak decides.

A region's copies form one block before the first backward reader of any of them; a
copy whose readers lie far apart can hold the peak where it only waits for a late
reader. ``Region.twice`` asks the rewrite for a second copy of such a tensor right before
its late readers (``rewrite/twice.py``).

``SecondCopies.improved`` tries, on a plan a search judged, second copies of the first
copies that wait across its rewrite's peak (not read there, read later), the largest
first, and takes the one whose rewrite has the lowest peak, round after round, while the
peak goes down: a new plan, whose notes say which and by how much. ``lowest_with_twice``
gives the lowest-peak default the plans its search judged (``Judged``) so improved, and
takes their choice, by the default's own rule (the lowest peak, then within NEAR_LOWEST
of it the fewest recompute FLOPs), only where one is clearly lower, by NEAR_LOWEST, than
every plan without second copies: within that margin the default prefers the plan that
recomputes less, and a second copy is more recompute (zoo bert: a plan 1.9% lower with
them and half the recompute, whose predicted arena, and measured Module peak, are higher).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Protocol

from ..analysis import Analysis
from ..analysis.memory import with_scratch
from ..graph import Graph
from ..markers import BLOCK_META, recompute_source
from ..units import human_bytes
from .cutsearch import NEAR_LOWEST, DefaultPlan, lowest_note
from .evaluate import PlanEvaluator, Rewritten, cost_of, ort_peak
from .plan import Plan, Region
from .search import PlanCost

ROUNDS = 3  # second copies added to one plan at most, one per round
TRIES = 2  # candidates rewritten per round
PLATEAU = 0.01  # steps this close below the peak hold it too: a copy waiting there is a candidate


@dataclass(frozen=True)
class Candidate:
    region: int
    tensor: str  # the original tensor recomputed
    nbytes: int


class Written(Rewritten, Protocol):
    """A rewrite as it would be written (``make.Written``): ``no_gain`` says why the
    unchanged graph would be written instead, if it would."""

    @property
    def no_gain(self) -> str | None: ...


class Judged:
    """A search's cost function that records each plan judged, its cost and its notes as
    the search made them (the default adds its own to its choice afterwards). Once
    ``closed`` (the peak descent starts: ``descent.py``), plans are recorded as judged but
    not tried with second copies: the descent judges up to 160 flips of the front's plans,
    and trying each again would take most of the default's time (zoo unet: 3 s -> 13 s)."""

    def __init__(self, cost: Callable[[Plan], PlanCost]) -> None:
        self._cost = cost
        self.plans: list[tuple[Plan, PlanCost, list[str]]] = []  # the plans tried with second copies
        self.others: list[tuple[Plan, PlanCost]] = []  # judged after ``closed``
        self.closed = False

    def __call__(self, plan: Plan) -> PlanCost:
        cost = self._cost(plan)
        if self.closed:
            self.others.append((plan, cost))
        else:
            self.plans.append((plan, cost, list(plan.notes)))
        return cost


def lowest_with_twice(a: Analysis, evaluator: PlanEvaluator, judged: Judged, chosen: DefaultPlan,
                      write: Callable[[Plan], Written] | None = None) -> DefaultPlan:
    """The lowest-peak default ``chosen`` from ``judged``'s plans, or, where second copies
    make one clearly lower than all of them (and than the original), the default's choice
    among the plans with them: its rewrite in ``evaluator.results``. ``write``: the graph
    that would be written for a plan (pinned, and judged as ``rewrite.select`` judges it);
    with it, second copies are taken only where that graph is kept where ``chosen``'s is
    and ORT is predicted to hold less for it (arena in use, kernel scratch): the search
    judges unpinned rewrites by their live tensors, and pin's guards and fresh buffers, or
    the arena's, can undo what second copies save (zoo denoiser: 9% lower in tensors
    unpinned, higher pinned, 21% higher measured under ckpt's settings)."""
    twice = _with_twice(a, evaluator, judged, chosen)
    if twice is chosen or write is None:
        return twice
    more, once = write(twice.plan), write(chosen.plan)
    if more.no_gain is not None or (once.no_gain is None and ort_peak(more.after) >= ort_peak(once.after)):
        return chosen
    return twice


def _with_twice(a: Analysis, evaluator: PlanEvaluator, judged: Judged, chosen: DefaultPlan) -> DefaultPlan:
    if chosen.knee is not None or chosen.cost is None or not judged.plans:
        return chosen
    search = SecondCopies(evaluator)
    options = [search.improved(plan, cost, notes) or (plan, cost) for plan, cost, notes in judged.plans]
    options += judged.others
    without = min([cost.peak_bytes for _, cost, _ in judged.plans] + [cost.peak_bytes for _, cost in judged.others])
    lowest = min(cost.peak_bytes for _, cost in options)
    if lowest >= without * (1 - NEAR_LOWEST) or lowest > a.working_peak_bytes:
        return chosen
    near = [k for k, (_, cost) in enumerate(options) if cost.peak_bytes <= lowest * (1 + NEAR_LOWEST)]
    plan, cost = options[min(near, key=lambda k: (options[k][1].recompute_flops, options[k][1].peak_bytes))]
    plan.notes.append(lowest_note(options, cost))  # a plan of its own: made by ``improved``
    # then the choice without second copies and its own fallbacks: a session that refuses
    # the second copies (the Module API's, ``verify/module_choice.py``) goes on as before
    return DefaultPlan(plan, cost, fallbacks=((chosen.plan, chosen.cost), *chosen.fallbacks))


class SecondCopies:
    """Gives the plans a search judged the second copies their rewrites' peaks go down with."""

    def __init__(self, evaluator: PlanEvaluator) -> None:
        self.evaluator = evaluator

    def improved(self, plan: Plan, cost: PlanCost, notes: list[str] | None = None) -> tuple[Plan, PlanCost] | None:
        """``plan`` (of ``cost``, its notes ``notes`` where they have changed since) with the
        second copies that lower its peak, as a new plan, and its cost; its rewrite in the
        evaluator's results. None where no second copy lowers it."""
        ev = self.evaluator
        if not plan.regions:
            return None
        result = ev.results.get(id(plan)) or ev.measured(plan)
        lines, regions = [], plan.regions
        for _ in range(ROUNDS):
            best = self._best_trial(replace(plan, regions=regions), result, cost)
            if best is None:
                break
            trial, result, lower, candidate = best
            lines.append(f"'{candidate.tensor}' is recomputed a second time, right before its late backward "
                         f"readers: the predicted peak goes {human_bytes(cost.peak_bytes - lower.peak_bytes)} "
                         f"down, to {human_bytes(lower.peak_bytes)}")
            regions, cost = trial.regions, lower
        if not lines:
            return None
        new = replace(plan, regions=regions, notes=[*(plan.notes if notes is None else notes), *lines])
        ev.results[id(new)] = result
        return new, cost

    def _best_trial(self, plan: Plan, result: Rewritten,
                    cost: PlanCost) -> tuple[Plan, Rewritten, PlanCost, Candidate] | None:
        """The candidate whose second copy lowers the peak most, its plan, rewrite and cost."""
        ev = self.evaluator
        best = None
        for candidate in waiting_copies(ev.a.graph, plan, result)[:TRIES]:
            trial = with_twice(plan, candidate)
            trial_result = ev.measured(trial)
            ev.results.pop(id(trial), None)  # a trial is kept only as the plan's own
            trial_cost = cost_of(trial_result, ev.measure)
            if trial_cost.peak_bytes < (best[2] if best is not None else cost).peak_bytes:
                best = (trial, trial_result, trial_cost, candidate)
        return best


def with_twice(plan: Plan, candidate: Candidate) -> Plan:
    """``plan`` with ``candidate`` recomputed a second time by its region."""
    regions = [Region(r.name, r.nodes, r.keep, r.twice | {candidate.tensor}) if k == candidate.region else r
               for k, r in enumerate(plan.regions)]
    return replace(plan, regions=regions)


def waiting_copies(graph: Graph, plan: Plan, result: Rewritten) -> list[Candidate]:
    """The first copies in ``result`` (``plan``'s rewrite of ``graph``) that wait across its
    peak: made before a step within PLATEAU of the peak (kernel scratch counted), read
    after it and not at it; the largest first."""
    after, g = result.after, result.graph
    timeline = with_scratch(after.priority.timeline, after.scratch)
    top = max(timeline, default=0)
    step_of = {i: k for k, i in enumerate(after.priority.order)}
    peaks = [k for k, b in enumerate(timeline) if b >= top * (1 - PLATEAU)]
    home = {t: k for k, r in enumerate(plan.regions) for i in r.nodes for t in graph.nodes[i].outputs if t}
    by_name = {n.name: n for n in graph.nodes}
    found: dict[str, Candidate] = {}
    for node in g.nodes:
        source = by_name.get(recompute_source(node) or "")
        if source is None or node.meta(BLOCK_META) is not None:
            continue
        born = step_of[node.index]
        for y, t in zip(node.outputs, source.outputs):
            region = home.get(t)
            info = after.tensors.get(y)
            if region is None or t in plan.regions[region].twice or info is None or not info.nbytes:
                continue
            if any(born < k and _waits(g, step_of, y, k) for k in peaks):
                found[t] = Candidate(region, t, info.nbytes)
    return sorted(found.values(), key=lambda c: (-c.nbytes, c.tensor))


def _waits(g: Graph, step_of: dict[int, int], y: str, k: int) -> bool:
    """Whether ``y``, or what a reader made of it before step ``k``, is read after ``k`` and
    not at it: a first copy waiting across the step, or a reader that the written order ran
    early, where it frees more than it makes (a ReLU mask), whose output waits instead."""
    readers = [step_of[c] for c in g.consumers.get(y, ())]
    if k in readers:
        return False
    if any(r > k for r in readers):
        return True
    made = [t for c in g.consumers.get(y, ()) for t in g.nodes[c].outputs if t]
    return any(_read_across(g, step_of, t, k) for t in made)


def _read_across(g: Graph, step_of: dict[int, int], t: str, k: int) -> bool:
    steps = [step_of[c] for c in g.consumers.get(t, ())]
    return k not in steps and any(s > k for s in steps)
