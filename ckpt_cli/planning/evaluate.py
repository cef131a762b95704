"""What a plan costs: its rewrite's predicted peak and recompute FLOPs.

The cost model of every plan search is the rewrite itself followed by the liveness
simulation of its schedule. Planning comes before the rewrite stage, so the rewrite is
handed in as a function (``Rewriter``), and a ``PlanEvaluator`` holds what one search
shares across the plans it judges: the orders already chosen for rewritten graphs and the
input's reuse-off arena peak (``ScheduleMemo``), the number of plans judged, and the
cheapest rewrite that fits the search's limit.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from ..analysis import Analysis, PeakModel
from ..analysis.arena import ARENA_REPLAYED
from ..analysis.memory import with_scratch
from ..graph import Graph
from ..markers import recompute_source
from ..ops import VIEW_OPS
from ..units import human_flops
from .plan import Plan
from .search import Intervals, PlanCost


class Rewritten(Protocol):
    """What a plan search reads of a rewrite (``rewrite.RewriteResult``)."""

    @property
    def graph(self) -> Graph: ...

    @property
    def after(self) -> PeakModel: ...

    @property
    def recompute_flops(self) -> int: ...


class ScheduleMemo:
    """What one plan search keeps for the rewrite stage between the plans it judges.

    ``orders``: the orders that stage chose for the graphs rewritten so far (its keys and
    values are that later stage's, opaque here). ``no_reuse_in_use()``: the searched graph's
    arena peak in use with ORT's buffer reuse off, which only a reuse-off option close to
    winning needs: a replay of the whole input (0.46 s of a 1.2 s budget search on a 10k-node
    transformer, where no rewrite needs it), so it is replayed on first use, once a search.
    ``waiting``: whether that stage may write the waiting order (backward nodes no forward
    seed reaches run just before their reader), judged by simulating each rewrite pinned in
    ORT's DEFAULT order as well: the default's searches take it, a budget search does not
    (it doubles to triples the search's time: gpt `--budget 50%` 7.4 -> 17.1 s)."""

    def __init__(self, a: PeakModel, waiting: bool = True) -> None:
        self.a = a
        self.waiting = waiting
        self.orders: dict[Any, Any] = {}
        self._no_reuse_in_use: int | None = None

    @property
    def no_reuse_known(self) -> bool:
        """The input's reuse-off arena is replayed already (reading it costs nothing)."""
        return self._no_reuse_in_use is not None

    def no_reuse_in_use(self) -> int:
        if self._no_reuse_in_use is None:
            self._no_reuse_in_use = self.a.arena_in_use(False)
        return self._no_reuse_in_use


class Rewriter(Protocol):
    """``rewrite.rewrite``: a plan applied to the analysed graph, as a ``RewriteResult``."""

    def __call__(self, a: Analysis, plan: Plan | None, pin: bool = True, model_only: bool = False,
                 memo: ScheduleMemo | None = None) -> Rewritten: ...


PeakMeasure = Callable[[PeakModel], int]  # which predicted peak of an analysed graph a search compares


def working_peak(a: PeakModel) -> int:
    """The peak of the tensors live under ORT's order with each kernel's working memory at
    its step: what the default's front is drawn in. Kernel scratch counts because a plan
    that lowers the tensors can leave the peak at a ConvGrad's im2col buffer."""
    return a.working_peak_bytes


def _outside_arena_scratch(a: PeakModel) -> dict[int, int]:
    """Per step, the working memory of the kernels the arena model does not replay itself
    (``a.scratch`` less theirs)."""
    nodes, order = a.graph.nodes, a.priority.order

    def replayed(step: int) -> bool:
        node = nodes[order[step]]
        return (("" if node.domain == "ai.onnx" else node.domain), node.op_type) in ARENA_REPLAYED

    return {k: b for k, b in a.scratch.items() if not replayed(k)}


def ort_peak(a: PeakModel) -> int:
    """What ORT holds (arena in use plus inputs), with the working memory of the kernels the
    arena model does not replay at their steps: what a --budget bounds, "does it fit"."""
    scratch = _outside_arena_scratch(a)
    if not scratch:
        return a.ort_peak_bytes
    arena = a.arena(a.reuse_buffers)  # replayed once here: a model's is not replayed before
    outside = a.outside_arena_bytes
    in_use = arena.timeline_in_use
    top = max(in_use[k] + b for k, b in scratch.items() if k < len(in_use))
    return max(arena.peak_in_use_bytes + outside, top + outside)


def cost_of(result: Rewritten, measure: PeakMeasure = working_peak) -> PlanCost:
    """A rewrite's cost: its predicted peak by ``measure``, recompute FLOPs and what is
    live at the tensor peak."""
    return PlanCost(measure(result.after), result.recompute_flops, result.after.priority.live_at_peak)


def intervals_of(a: Analysis, result: Rewritten, measure: PeakMeasure = working_peak) -> Intervals:
    """On the schedule of a plan's (unpinned) rewrite, the steps where keeping each
    recomputed activation would add its bytes: after its last forward use, before its copy
    is born. The linear model of the plan searches."""
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
    after = result.after
    # the scratch the measure counts: an arena measure replays some kernels' temporaries itself
    scratch = after.scratch if measure is working_peak else _outside_arena_scratch(after)
    return Intervals(with_scratch(after.priority.timeline, scratch), spans, cost_of(result, measure))


class PlanEvaluator:
    """Judges plans for one search by rewriting them unpinned (pin's guards barely change
    the peak and slow every rewrite).

    ``limit``: the search's byte budget; the cheapest rewrite that fits it is kept as
    ``best_plan``/``best_result``. ``ruled``: the per-op policy applied before rewriting.
    ``keep_results``: remember every rewrite by plan (the default search returns its
    winner's). ``model_floors``: intervals come from structure floors, never measured.
    ``measure``: the peak plans are judged by. ``waiting``: ``ScheduleMemo``'s."""

    def __init__(self, a: Analysis, rewriter: Rewriter, *, limit: int | None = None,
                 ruled: Callable[[Plan], Plan] | None = None, progress: Callable[[str], None] | None = None,
                 keep_results: bool = False, measure: PeakMeasure = working_peak, waiting: bool = True) -> None:
        self.a = a
        self.rewriter = rewriter
        self.measure = measure
        self.limit = limit
        self.ruled = ruled or (lambda plan: plan)
        self.progress = progress
        self.keep_results = keep_results
        self.model_floors = False
        self.memo = ScheduleMemo(a, waiting)  # the orders chosen so far, the input's reuse-off arena once needed
        self.evaluations = 0
        self.results: dict[int, Rewritten] = {}
        self.best_plan: Plan | None = None
        self.best_result: Rewritten | None = None
        self.unchanged: Rewritten | None = None  # the rewrite of the plan that recomputes nothing

    def restart(self, limit: int) -> None:
        """A new search over the same graph (orders stay cached): no fit found yet."""
        self.limit = limit
        self.best_plan = self.best_result = None

    def rewritten(self, plan: Plan, model_only: bool = False) -> Rewritten:
        return self.rewriter(self.a, self.ruled(plan), pin=False, model_only=model_only, memo=self.memo)

    def measured(self, plan: Plan) -> Rewritten:
        """The plan's rewrite, counted, and kept when it is the cheapest fit so far. The
        plan that recomputes nothing is rewritten once: every budget search judges it first."""
        again = not plan.regions and self.unchanged is not None
        result = self.unchanged if again and self.unchanged is not None else self.rewritten(plan)
        if not plan.regions:
            self.unchanged = result
        if self.keep_results:
            self.results[id(plan)] = result
        fits = self.limit is not None and self.measure(result.after) <= self.limit
        if fits and (self.best_result is None or result.recompute_flops < self.best_result.recompute_flops):
            self.best_plan, self.best_result = plan, result
        if not again:
            self._counted()
        return result

    def cost(self, plan: Plan) -> PlanCost:
        return cost_of(self.measured(plan), self.measure)

    def intervals(self, plan: Plan) -> Intervals:
        if self.model_floors:  # a structure's floor is the search's model, never its answer
            result = self.rewritten(plan, model_only=True)
            self._counted()
            return intervals_of(self.a, result, self.measure)
        return intervals_of(self.a, self.measured(plan), self.measure)

    def _counted(self) -> None:
        self.evaluations += 1
        if self.progress is None:
            return
        if self.limit is None:
            self.progress(f"planning: {self.evaluations} plans evaluated")
            return
        best = self.best_result
        self.progress(f"planning: {self.evaluations} plans evaluated; best fit so far "
                      + (f"recomputes {human_flops(best.recompute_flops)}" if best else "none"))
