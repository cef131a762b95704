"""``optimal``: the budget problem as a mixed-integer program (HiGHS), to measure
how far the ``budget`` heuristic is from the best keep set.

Model: start from a region structure with every stashed activation recomputed (the
floor plan, whose memory over the schedule is known). Keeping activation t instead
costs its bytes on the steps between its last forward use and the point where its
recompute copy would be born, and saves its producer's FLOPs. Choose the kept set
that saves the most FLOPs while every step stays under the budget. The model is
linear (it ignores chains of copies, buffer reuse and the written order changing with
the keep set), so the MILP is solved at the limits ``search.search_limits`` picks and each
chosen set is checked with the real cost model, as the ``budget`` heuristic's are: the
two differ only in how they choose a set for a limit.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..analysis import Analysis
from .plan import Plan
from .search import Intervals, KeepJudge, search_limits
from .strategies import (BudgetResult, Candidate, Evaluate, candidates, over_structures,
                         recomputing_nothing, result_of, lowest_cost, NoPlanFits)

MAX_CANDIDATES = 2000  # beyond this the MILP is slow; optimal is for graphs of a few hundred nodes


IntervalsOf = Callable[[Plan], Intervals]


def _solve(ranked: list[Candidate], spans: dict[str, tuple[int, int]], timeline: tuple[int, ...],
           limit: int) -> set[str] | None:
    from .milp import Triples, solve_binary

    usable = [c for c in ranked if c.tensor in spans]
    if not usable:
        return set()
    room = limit - np.asarray(timeline, dtype=float)
    if (room < 0).any():
        return None
    lo = np.array([spans[c.tensor][0] for c in usable])
    hi = np.array([spans[c.tensor][1] for c in usable])
    # One row per stretch of steps where the same activations are kept, at its least room:
    # the same constraints as one row per step, in far fewer rows and nonzeros, so the MILPs
    # solve faster.
    starts = np.unique(np.concatenate([[0], lo, hi + 1]))
    starts = starts[starts < len(room)]
    room = np.minimum.reduceat(room, starts)
    first = np.searchsorted(starts, lo)
    counts = np.searchsorted(starts, hi + 1) - first
    col = np.repeat(np.arange(len(usable)), counts)
    row = np.repeat(first - np.cumsum(counts) + counts, counts) + np.arange(int(counts.sum()))
    val = np.repeat(np.array([float(c.nbytes) for c in usable]), counts)
    if (np.bincount(row, weights=val, minlength=len(room)) <= room).all():
        return {c.tensor for c in usable if c.flops}  # everything fits: what the objective below would keep
    # Saved FLOPs first; among equal savings, fewer kept bytes (under one FLOP in all).
    tie_break = np.array([float(c.nbytes) for c in usable]) / (1.0 + sum(c.nbytes for c in usable))
    x = solve_binary(tie_break - np.array([float(c.flops) for c in usable]), Triples(row, col, val),
                     np.full(len(room), -np.inf), room, time_limit=60)
    if x is None:
        return None
    return {c.tensor for c, v in zip(usable, x) if v > 0.5}


def optimal_plan(a: Analysis, budget: int, evaluate: Evaluate, intervals_of: IntervalsOf,
                 options: list[Plan] | None = None, strategy: str = "optimal", beat: int | None = None
                 ) -> BudgetResult:
    """The keep set with the most recompute FLOPs saved under ``budget`` (exact for the
    linear model above, verified with ``evaluate``), over the same structures as ``budget``
    (or over ``options``); ``strategy`` names the plans it makes; ``beat``: see
    ``over_structures``."""
    fits, nothing = recomputing_nothing(a, budget, evaluate, strategy)
    if fits is not None:
        return fits

    def search(structure: Plan, floor: Intervals) -> tuple[BudgetResult | None, int]:
        ranked = candidates(a, structure)[:MAX_CANDIDATES]

        def solve(limit: int, r: list[Candidate] = ranked, f: Intervals = floor) -> set[str] | None:
            return _solve(r, f.spans, f.timeline, limit)

        fitted, spent = search_limits(
            KeepJudge(structure, strategy, evaluate, budget, a.graph.producer), solve, floor, ranked, thorough=True)
        if fitted is None:
            return None, spent
        return result_of(fitted, ranked, structure, "MILP keeps {kept} of {total} stashed activations"), spent

    best, lowest, evaluations = over_structures(a, budget, intervals_of, search, options, first_fit=False, beat=beat)
    if best is None:
        raise NoPlanFits(a, budget, lowest_cost(lowest, nothing))
    best.evaluations = evaluations
    return best
