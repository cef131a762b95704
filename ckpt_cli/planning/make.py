"""From the plan options to the plan: ``make_plan``.

The plan is user regions, a named strategy, a budget search, or by default the knee of the
predicted peak/recompute front, each judged by its rewrite. Planning comes before the
rewrite stage, so that stage hands in what plans are judged by (``Rewriting``); its
``rewrite.select.make_plan`` binds its own. Each returns new values; nothing it is given
is changed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Protocol

from ..analysis import Analysis
from ..errors import UsageError
from ..graph import Graph, gc_paused
from ..options import MIN_PEAK, PlanOptions
from . import choose_plan
from .activation import activation_budget_plan
from .budget import BudgetSearch, Planned
from .cutsearch import DEFAULT_SEARCH_NODES, lowest_peak_plan
from .evaluate import PlanEvaluator, Rewriter, Rewritten, ort_peak
from .plan import Plan, apply_policy
from .strategies import LARGE_GRAPH_NODES, STRATEGIES, parse_budget
from .twice import Judged, lowest_with_twice


class Written(Rewritten, Protocol):
    """A rewrite as it would be written: ``no_gain`` says why the unchanged graph would be
    written instead, if it would."""

    @property
    def no_gain(self) -> str | None: ...


class PlanWriter(Protocol):
    """``rewrite.select.rewrite_plan``: the rewrite of a chosen plan that would be written."""

    def __call__(self, a: Analysis, planned: Planned | None, pin: bool = True) -> Written: ...


@dataclass(frozen=True)
class Rewriting:
    """What the rewrite stage lends the plan choice: ``rewrite`` judges a plan, ``write``
    gives the rewrite that would be written, and ``ort_artifact`` says the graph is an ORT
    training artifact (run by the Module API's untuned session)."""

    rewrite: Rewriter
    write: PlanWriter
    ort_artifact: bool


# make_plan's keyword form names two options as the command line's variables did
_LEGACY_KEYWORDS = {"patterns": "regions", "scope": "regions_by_scope"}


@gc_paused
def make_plan(a: Analysis, rewriting: Rewriting, options: PlanOptions | None = None, *,
              progress: Callable[[str], None] | None = None, pin: bool = True, **keywords: Any) -> Planned:
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
        def ruled(plan: Plan) -> Plan:
            return apply_policy(plan, policy, a.graph)
        evaluator = PlanEvaluator(a, rewriting.rewrite, ruled=ruled, progress=progress, measure=ort_peak,
                                  waiting=False)
        write = (lambda planned: rewriting.write(a, planned)) if pin else None
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
    return _default_plan(a, rewriting, options, progress, pin)


def _default_plan(a: Analysis, rewriting: Rewriting, options: PlanOptions,
                  progress: Callable[[str], None] | None, pin: bool) -> Planned:
    """The default: the knee of the front, or its lowest peak (``--auto min-peak``)."""
    # The waiting order is judged by pinning and simulating each rewrite in ORT's DEFAULT
    # order as well: a fifth of a large graph's default, where the searches are bounded.
    evaluator = PlanEvaluator(a, rewriting.rewrite, progress=progress, keep_results=True,
                              waiting=len(a.graph.nodes) <= DEFAULT_SEARCH_NODES)
    # An ORT artifact runs in the Module API's untuned session, whose fusions must treat the
    # recompute copies as the originals for bit-identical training: measured so for the
    # lowest peak over the artifact zoo, not for the knee (zoo bert: 1e-7 apart).
    at_knee = options.auto != MIN_PEAK and not rewriting.ort_artifact
    judged = Judged(evaluator.cost)

    def rewritten(plan: Plan) -> Graph | None:
        judged.closed = True  # the peak descent starts: its plans are not tried with second copies
        result = evaluator.results.get(id(plan))
        return result.graph if result is not None else None

    chosen = lowest_peak_plan(a, judged, thorough=len(a.graph.nodes) <= LARGE_GRAPH_NODES,
                              policy=options.policy, at_knee=at_knee, rewritten=rewritten)
    # the lowest peak's plans again with the second copies that lower them (``twice.py``):
    # each a rewrite of the whole graph more, which large graphs' bounded searches leave out
    if not at_knee and len(a.graph.nodes) <= DEFAULT_SEARCH_NODES:
        chosen = lowest_with_twice(a, evaluator, judged, chosen,
                                   lambda plan: rewriting.write(a, Planned(plan, result=evaluator.results.get(id(plan))),
                                                                pin))
    planned = Planned(chosen.plan, result=evaluator.results.get(id(chosen.plan)), knee=chosen.knee)
    if chosen.lowest is None:
        fallbacks = tuple((p, c, evaluator.results.get(id(p))) for p, c in chosen.fallbacks)
        return replace(planned, cost=chosen.cost, fallbacks=fallbacks)
    lowest = Planned(chosen.lowest, result=evaluator.results.get(id(chosen.lowest)), knee=chosen.knee)
    planned = knee_or_lowest(a, rewriting.write, planned, lowest, pin)
    if planned.knee is None or planned.knee.passed_over is not None:
        return planned
    # the hull vertices past the knee, for the plain-session judgement (verify/plain_choice.py)
    beyond = tuple((p, c, evaluator.results.get(id(p))) for p, c in chosen.beyond)
    return replace(planned, beyond=beyond, knee_cost=chosen.cost)


def knee_or_lowest(a: Analysis, write: PlanWriter, knee: Planned, lowest: Planned, pin: bool) -> Planned:
    """The knee's plan, unless its rewrite gains nothing over the original's best order:
    then the lowest peak, the default's next choice, with the reason recorded in the knee
    and in a new plan's notes."""
    written = write(a, knee, pin)
    if written.no_gain is None:
        return replace(knee, written=written if pin else None)
    assert lowest.plan is not None and knee.knee is not None  # the default passes up the lowest at a knee
    line = f"the knee gains nothing ({written.no_gain}): the default takes the lowest peak"
    plan = replace(lowest.plan, notes=[*lowest.plan.notes, line])
    return replace(lowest, plan=plan, knee=replace(knee.knee, passed_over=written.no_gain))
