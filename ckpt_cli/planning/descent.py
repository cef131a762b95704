"""Peak descent: lower a plan's real peak one stashed tensor at a time.

The min-cut front prices the bytes a plan keeps, not when they are live. On conv nets with
skips and norms (the artifact zoo's unet and denoiser) a recomputed activation that both a
later copy and a late backward node read is held from the first read to the last, across
the peak, while keeping the same tensor costs its bytes only from the forward to its one
backward read. So the corner that recomputes the most can peak above the original (zoo
unet at batch 64: 71.2 MiB against 67.4), and one keep away from it lies a plan far below
every corner. The descent starts from a judged plan and, at its predicted peak, tries for
each tensor the peak holds the one flip that could free it: a live recompute copy's source
kept instead, or a tensor a region keeps recomputed instead. The flip of lowest real peak
(a rewrite each) is taken while it lowers the peak. Zoo unet: 47.6 MiB -> 36.1 MiB
predicted (the corner that recomputes the most, 29 rewrites); denoiser: 76.1 -> 72.1.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from ..analysis import Analysis
from ..graph import Graph
from ..markers import recompute_source
from .decision import KEEP, PEAK_KEEP, PEAK_RECOMPUTE, RECOMPUTE, Decision
from .plan import Plan, Policy, Region
from .search import PlanCost
from ..units import human_bytes

# Rewrites the descent may spend on one graph: the starts after the first get one round of
# flips each, the best of them is then descended to its end.
DESCENT_REWRITES = 160
# Nodes rewritten in all by the descent's rewrites, at most: a rewrite takes 30-50 us a node.
DESCENT_NODE_REWRITES = 40_000
# A descended plan is offered only this far below the lowest plan it started from: a few
# percent is within what the Module session measures unlike the model (zoo bert's descended
# plan, 2.3% lower predicted, measured 36.3 MB under its settings against the front's 31.2 MB).
DESCENT_MARGIN = 0.04


@dataclass(frozen=True)
class Flip:
    """One move: ``tensor`` kept (``keep``) or recomputed, in region ``region``."""

    tensor: str
    region: int
    keep: bool


Judge = Callable[[Plan], PlanCost]
Rewritten = Callable[[Plan], Graph | None]  # the graph a judged plan was rewritten to


def flips(a: Analysis, plan: Plan, rewritten: Graph, live: tuple[str, ...], policy: Policy = Policy()) -> list[Flip]:
    """The flips that could free a tensor live at the peak of ``plan`` (rewritten as
    ``rewritten``), largest tensor first (``live``'s order); none that ``policy`` forbids."""
    owner = {i: k for k, r in enumerate(plan.regions) for i in r.nodes}
    by_name = {n.name: n for n in a.graph.nodes}
    out: list[Flip] = []
    for t in live:
        i = rewritten.producer.get(t)
        if i is None:
            continue
        node = rewritten.nodes[i]
        source = recompute_source(node)
        if source is not None and source in by_name:
            original = by_name[source]
            kept = original.outputs[list(node.outputs).index(t)]
            k = owner.get(original.index)
            if k is not None and kept not in plan.regions[k].keep and original.op_type not in policy.recompute_ops:
                out.append(Flip(kept, k, True))
            continue
        p = a.graph.producer.get(t, -1)
        k = owner.get(p)
        if k is not None and t in plan.regions[k].keep and a.graph.nodes[p].op_type not in policy.keep_ops:
            out.append(Flip(t, k, False))
    return out


def flipped(a: Analysis, plan: Plan, flip: Flip) -> Plan:
    """``plan`` with ``flip`` made, its decision for the tensor's buffer said so."""
    regions = [Region(r.name, set(r.nodes), set(r.keep)) for r in plan.regions]
    keep = regions[flip.region].keep
    if flip.keep:
        keep.add(flip.tensor)
    else:
        keep.discard(flip.tensor)
    decisions = dict(plan.decisions)
    buffer = a.roots.get(flip.tensor, flip.tensor)
    d: Decision | None = decisions.get(buffer)
    if d is not None:
        action, reason = (KEEP, PEAK_KEEP) if flip.keep else (RECOMPUTE, PEAK_RECOMPUTE)
        decisions[buffer] = replace(d, action=action, reason=reason)
    return Plan(regions, plan.strategy, list(plan.notes), decisions=decisions)


@dataclass
class Descent:
    """One graph's descent: how plans are judged and rewritten, the rewrites left, and
    the keep sets tried (each judged once)."""

    a: Analysis
    judge: Judge
    rewritten: Rewritten
    left: int
    tried: set[tuple[tuple[str, frozenset[str]], ...]]
    policy: Policy = Policy()

    def step(self, plan: Plan, cost: PlanCost) -> tuple[Plan, PlanCost] | None:
        """The flip of ``plan`` with the lowest real peak below ``cost``'s, if any."""
        graph = self.rewritten(plan)
        if graph is None:
            return None
        best: tuple[Plan, PlanCost] | None = None
        for flip in flips(self.a, plan, graph, cost.live_at_peak, self.policy):
            if self.left <= 0:
                break
            candidate = flipped(self.a, plan, flip)
            key = tuple((r.name, frozenset(r.keep)) for r in candidate.regions)
            if key in self.tried:
                continue
            self.tried.add(key)
            self.left -= 1
            judged = self.judge(candidate)
            if judged.peak_bytes < (best[1] if best is not None else cost).peak_bytes:
                best = (candidate, judged)
        return best

    def run(self, plan: Plan, cost: PlanCost, rounds: int | None = None) -> tuple[Plan, PlanCost, int]:
        """``plan`` descended while a flip lowers its peak (at most ``rounds`` flips), with
        the flips taken."""
        taken = 0
        while rounds is None or taken < rounds:
            lower = self.step(plan, cost)
            if lower is None:
                break
            (plan, cost), taken = lower, taken + 1
        return plan, cost, taken


def descend(a: Analysis, judged: list[tuple[Plan, PlanCost]], judge: Judge, rewritten: Rewritten,
            policy: Policy = Policy()) -> list[tuple[Plan, PlanCost]]:
    """The plans the descent reaches from ``judged`` (only those it lowered), each with a note:
    from the plan that recomputes the most, to its end; from each other plan with regions,
    lowest peak first, one flip; then from the lowest of those, to its end."""
    starts = [(p, c) for p, c in judged if p.regions]
    if not starts:
        return []
    budget = min(DESCENT_REWRITES, DESCENT_NODE_REWRITES // max(1, len(a.graph.nodes)))
    descent = Descent(a, judge, rewritten, budget, set(), policy)
    most = max(starts, key=lambda pc: pc[1].recompute_flops)
    reached = [(most[1], *descent.run(*most))]
    stepped = [(c, *descent.run(p, c, rounds=1)) for p, c in sorted(starts, key=lambda pc: pc[1].peak_bytes)
               if p is not most[0]]
    moved = [s for s in stepped if s[3]]
    if moved:
        start, plan, cost, taken = min(moved, key=lambda s: s[2].peak_bytes)
        plan, cost, more = descent.run(plan, cost)
        reached.append((start, plan, cost, taken + more))
    below = (1 - DESCENT_MARGIN) * min(c.peak_bytes for _, c in judged)
    reached = [r for r in reached if r[3] and r[2].peak_bytes <= below]
    for start, plan, cost, taken in reached:
        if taken:  # each plan here is a flip's own (its notes a copy): noted in place, as judged
            plan.notes.append(f"peak descent: {taken} flip(s) of a kept or recomputed tensor at the predicted peak, "
                              f"{human_bytes(start.peak_bytes)} -> {human_bytes(cost.peak_bytes)}")
    return [(plan, cost) for _, plan, cost, _ in reached]
