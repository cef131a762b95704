"""The limit search behind ``budget`` and ``optimal``, on a cost model whose error against
the linear model is known, so the best answer is known too."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from ckpt_cli.planning.plan import Plan, Region
from ckpt_cli.planning.search import Intervals, KeepJudge, keep_all_limit, search_limits, with_keep

TENSORS = [f"t{i}" for i in range(10)]
PRODUCER = {t: i for i, t in enumerate(TENSORS)}
FLOOR = 1000  # the real and the linear peak with nothing kept
STEP = 100  # the linear model's bytes per kept tensor


@dataclass
class Cost:
    peak_bytes: int
    recompute_flops: int


@dataclass
class Candidate:
    tensor: str
    nbytes: int = STEP
    flops: int = 10


RANKED = [Candidate(t) for t in TENSORS]
# The floor plan: FLOOR bytes at every step; each tensor's span covers them all.
FLOOR_PLAN = Intervals((FLOOR,) * 3, {t: (0, 2) for t in TENSORS}, Cost(FLOOR, 10 * len(TENSORS)))


def structure() -> Plan:
    return Plan([Region("all", set(range(len(TENSORS))))], "test")


def judge(evaluate, budget: int) -> KeepJudge:
    return KeepJudge(structure(), "test", evaluate, budget, PRODUCER)


def choose(limit: int) -> set[str]:
    """Keep tensors in a fixed order while the linear model stays under ``limit``."""
    return set(TENSORS[:max(0, min(len(TENSORS), (limit - FLOOR) // STEP))])


def real_model(bytes_per_kept: int, calls: list[frozenset]):
    def evaluate(plan: Plan) -> Cost:
        kept = frozenset(plan.regions[0].keep)
        calls.append(kept)
        return Cost(FLOOR + bytes_per_kept * len(kept), 10 * (len(TENSORS) - len(kept)))
    return evaluate


@pytest.mark.parametrize("thorough", [True, False])
def test_a_pessimistic_linear_model_is_loosened_up_to_keeping_everything(thorough):
    calls: list[frozenset] = []
    best, evaluations = search_limits(judge(real_model(50, calls), FLOOR + 600), choose, FLOOR_PLAN, RANKED,
                                      thorough=thorough)
    assert best is not None and best.cost.recompute_flops == 0 and best.keep == set(TENSORS)
    assert evaluations == len(calls) == len(set(calls)), "each keep set is evaluated once"


def test_an_optimistic_linear_model_is_tightened_then_bracketed_to_the_best_fit():
    calls: list[frozenset] = []
    budget = FLOOR + 600
    best, _ = search_limits(judge(real_model(150, calls), budget), choose, FLOOR_PLAN, RANKED, thorough=True)
    # Real peak 1000 + 150 k: four kept tensors fit (1600), five do not (1750).
    assert best is not None and len(best.keep) == 4 and best.cost.peak_bytes <= budget
    assert max(len(k) for k in calls if FLOOR + 150 * len(k) <= budget) == 4


def test_nothing_fits_when_the_floor_overshoots():
    calls: list[frozenset] = []
    best, evaluations = search_limits(judge(real_model(150, calls), FLOOR - 1), choose, FLOOR_PLAN, RANKED,
                                      thorough=False)
    assert best is None and evaluations == len(set(calls)) > 0


def test_keep_all_limit_is_the_linear_peak_with_everything_kept():
    rng = random.Random(7)
    for _ in range(50):
        timeline = tuple(rng.randrange(1000) for _ in range(rng.randrange(1, 40)))
        spans, sizes = {}, {}
        for k in range(rng.randrange(0, 12)):
            lo = rng.randrange(len(timeline))
            spans[f"x{k}"] = (lo, rng.randrange(lo, len(timeline)))
            sizes[f"x{k}"] = rng.randrange(1, 500)
        sizes["no_span"] = 10_000  # a tensor without a span adds nothing
        brute = max(base + sum(n for t, n in sizes.items() if t in spans and spans[t][0] <= step <= spans[t][1])
                    for step, base in enumerate(timeline))
        assert keep_all_limit(timeline, spans, sizes) == brute


def test_with_keep_gives_each_region_only_the_tensors_it_makes():
    plan = Plan([Region("a", {0, 1, 2}, {"already"}), Region("b", {3, 4})], "x")
    producer = {"t1": 1, "t3": 3, "t4": 4, "outside": 9}
    kept = with_keep(plan, {"t1", "t3", "t4", "outside"}, "budget", producer)
    assert [r.keep for r in kept.regions] == [{"already", "t1"}, {"t3", "t4"}]
    assert kept.strategy == "budget" and plan.regions[0].keep == {"already"}, "the input plan is not modified"


def test_polish_keeps_one_more_activation_that_the_limit_family_never_reaches():
    # t9 saves the most FLOPs but comes last in ``choose``'s order; in reality it adds no bytes.
    ranked = RANKED[:-1] + [Candidate("t9", STEP, 100)]
    flops = {c.tensor: c.flops for c in ranked}

    def evaluate(plan: Plan) -> Cost:
        kept = plan.regions[0].keep
        return Cost(FLOOR + 150 * len(kept - {"t9"}), sum(f for t, f in flops.items() if t not in kept))

    budget = FLOOR + 650
    best, _ = search_limits(judge(evaluate, budget), choose, FLOOR_PLAN, ranked, thorough=True)
    assert best is not None and best.keep == {"t0", "t1", "t2", "t3", "t9"}
    lean, _ = search_limits(judge(evaluate, budget), choose, FLOOR_PLAN, ranked, thorough=False)
    assert lean is not None and "t9" not in lean.keep, "large graphs skip the polish"
