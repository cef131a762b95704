"""Automatic planning strategies: each is a function ``Analysis -> Plan``, like JAX's
remat policies, so they can be swapped and compared (``ckpt plan --auto NAME``).

``budget`` is different: it searches, and needs to know what a plan costs. That cost
model (rewrite the graph, simulate its memory) is passed in as ``evaluate``, so the
search stays independent of how plans are applied (as PyTorch's partitioners keep the
cost model apart from the cut).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

from ..analysis import Analysis, lowest_peak
from ..analysis.floor import Floor
from ..errors import BudgetUnreachable, UsageError
from ..ops import EXPENSIVE_OPS, VIEW_OPS
from .decision import COMPUTE_BOUND, NOTHING, all_kept, kept_instead
from .plan import Plan, Region
from .rangemax import RangeMax
from .regions import default_regions, layer_regions, sqrt_regions
from .search import LOOSENING, Fitted, Intervals, KeepJudge, PlanCost, search_limits
from ..units import human_bytes

# Above this, searches are lean: one structure that fits, a few evaluations (each is a
# rewrite of the whole graph, and the thorough search makes many).
LARGE_GRAPH_NODES = 1_000


def _sqrt_segments(a: Analysis) -> int:
    import math

    return max(1, round(math.sqrt(sum(a.phases.is_forward))))


def structures(a: Analysis) -> list[Plan]:
    """Region structures the budget search tries: per layer (if any), then sqrt(n)
    segments and, on graphs below LARGE_GRAPH_NODES, twice as many (smaller pieces
    recomputed at a time, which can win at loose budgets; on large graphs the structures
    differ little in recompute FLOPs)."""
    return list(_structures(a))


def _structures(a: Analysis) -> Iterator[Plan]:
    """``structures``, each made when it is reached (a large graph's search stops at the first
    that fits, and making a plan of a large graph is not free)."""
    layers = layer_regions(a)
    if layers is not None:
        yield layers
    k = _sqrt_segments(a)
    yield sqrt_regions(a, k)
    if len(a.graph.nodes) <= LARGE_GRAPH_NODES:
        yield sqrt_regions(a, 2 * k)


MAX_SCANNED_SEGMENTS = 32
SCANNED_SEARCHES = 2


def scanned_segmentations(a: Analysis) -> list[Plan]:
    """Every other segmentation into k = 2 .. 2*sqrt(n) pieces (at most
    MAX_SCANNED_SEGMENTS), for budgets below the floors of ``structures``: the floor is
    not monotone in k, so no k can be skipped by looking at its neighbours."""
    k = _sqrt_segments(a)
    return [sqrt_regions(a, j) for j in range(2, min(2 * k, MAX_SCANNED_SEGMENTS) + 1) if j not in (k, 2 * k)]


StructureSearch = Callable[[Plan, Intervals], tuple["BudgetResult | None", int]]


# On graphs searched first-fit (above LARGE_GRAPH_NODES) the structures' floors lie within
# this share of each other: a floor further above the budget than this ends the scan, the
# budget being out of every structure's reach (each floor is a rewrite of the whole graph).
STRUCTURE_SPREAD = 0.05


# The other segmentations are scanned (a rewrite each, and SCANNED_SEARCHES searches) only
# where region structures compete with the cuts: within this factor of the best cut's
# recompute FLOPs. Further off, the scan costs rewrites and rarely beats the cut.
SCAN_WITHIN = 2.0


def over_structures(a: Analysis, budget: int, intervals_of: Callable[[Plan], Intervals], search: StructureSearch, options: list[Plan] | None,
                    *, first_fit: bool, beat: int | None = None) -> tuple[BudgetResult | None, PlanCost | None, int]:
    """Run ``search(structure, floor)`` on every region structure whose floor (everything
    recomputed) fits ``budget``; keep the result with the fewest recompute FLOPs (with
    ``first_fit``, the first). Small graphs also scan the other segmentations and search
    the SCANNED_SEARCHES of lowest floor that fit, unless a structure recomputes nothing
    or all recompute over SCAN_WITHIN times ``beat`` (the best cut's FLOPs). Ranking
    them by floor, not by the budget, keeps the set searched growing with the budget
    (ranked by the linear model's estimate, a looser budget can search other structures
    and recompute more). Returns (best, the lowest floor seen, evaluations)."""
    best: BudgetResult | None = None
    lowest: PlanCost | None = None
    evaluations = 0

    def floors(plans: Iterable[Plan]) -> Iterator[tuple[Plan, Intervals]]:
        nonlocal lowest, evaluations
        for structure in plans:
            floor = intervals_of(structure)
            evaluations += 1
            if lowest is None or floor.cost.peak_bytes < lowest.peak_bytes:
                lowest = floor.cost
            if floor.cost.peak_bytes <= budget:
                yield structure, floor
            elif first_fit and floor.cost.peak_bytes > budget * (1 + STRUCTURE_SPREAD):
                return  # the other structures' floors lie within STRUCTURE_SPREAD of this one

    def visit(fitting: Iterable[tuple[Plan, Intervals]]) -> None:
        nonlocal best, evaluations
        for structure, floor in fitting:
            result, spent = search(structure, floor)
            evaluations += spent
            if result is not None and (best is None or result.recompute_flops < best.recompute_flops):
                best = result
            if best is not None and (first_fit or not best.recompute_flops):
                return

    visit(floors(options or _structures(a)))
    competing = best is None or (best.recompute_flops and (beat is None or best.recompute_flops <= SCAN_WITHIN * beat))
    if options is None and len(a.graph.nodes) <= LARGE_GRAPH_NODES and competing:
        scanned = sorted(floors(scanned_segmentations(a)), key=lambda sf: sf[1].cost.peak_bytes)
        visit(scanned[:SCANNED_SEARCHES])
    return best, lowest, evaluations


def balanced(a: Analysis) -> Plan:
    """Recompute only cheap, memory-bound ops (elementwise, activations, normalisations,
    reshapes, softmax); keep every MatMul/Gemm/Conv output. The default policy of Burn
    and PyTorch's selective checkpointing, as a baseline."""
    base = default_regions(a)
    g = a.graph
    regions = []
    expensive: set[str] = set()
    for r in base.regions:
        keep = {t for i in r.nodes if g.nodes[i].op_type in EXPENSIVE_OPS for t in g.nodes[i].outputs if t}
        expensive |= keep
        regions.append(Region(r.name, set(r.nodes), keep | set(r.keep)))
    plan = Plan(regions, "balanced", list(base.notes), decisions=kept_instead(base.decisions, expensive, COMPUTE_BOUND))
    plan.notes.append("compute-bound outputs (MatMul, Gemm, Conv) are kept; cheap ops are recomputed")
    return plan


STRATEGIES: dict[str, Callable[[Analysis], Plan | None]] = {
    "layers": layer_regions,
    "sqrt": sqrt_regions,
    "balanced": balanced,
}


@dataclass(frozen=True)
class Candidate:
    """A stashed activation the budget search may keep instead of recomputing."""

    tensor: str
    nbytes: int
    flops: int  # what recomputing it costs (its producer)

    @property
    def flops_per_byte(self) -> float:
        return self.flops / self.nbytes if self.nbytes else float("inf")


def candidates(a: Analysis, plan: Plan) -> list[Candidate]:
    """Stashed activations made inside the plan's regions, most worth keeping first
    (most recompute FLOPs per byte saved)."""
    inside = {i for r in plan.regions for i in r.nodes}
    seen: set[str] = set()
    out = []
    for s in a.stashed:
        producer = a.graph.producer.get(s.buffer)  # the buffer's owner, also for stashed views
        if s.buffer in seen or producer is None or producer not in inside:
            continue
        info = a.tensors.get(s.buffer)
        if info is None or not info.nbytes or a.graph.nodes[producer].op_type in VIEW_OPS:
            continue
        seen.add(s.buffer)
        out.append(Candidate(s.buffer, info.nbytes, a.costs[a.graph.producer[s.buffer]].flops))
    return sorted(out, key=lambda c: (-c.flops_per_byte, c.nbytes, c.tensor))


Evaluate = Callable[[Plan], PlanCost]


@dataclass
class BudgetResult:
    plan: Plan
    peak_bytes: int
    recompute_flops: int
    kept: list[Candidate]
    recomputed: list[Candidate]
    evaluations: int
    structure: Plan | None = None  # the region structure whose keep set this is (None: a cut's plan, or no regions)
    near_misses: tuple["NearMiss", ...] = ()  # cuts that recompute less, just over the budget before pinning


@dataclass(frozen=True)
class NearMiss:
    """A cut just over the budget as judged unpinned (its written graph may fit), and the
    cut keeping a given number of bytes fewer, for when its written graph is over too."""

    plan: Plan
    leaner: Callable[[int], Plan | None]


def recomputing_nothing(a: Analysis, budget: int, evaluate: Evaluate, strategy: str) -> tuple[BudgetResult | None, PlanCost]:
    """The plan that recomputes nothing (the original in the rewrite's order), judged as
    any plan is: its result where it fits ``budget`` (no search needed), and its cost, whose
    peak is the top of the searched range."""
    plan = Plan([], strategy, [], decisions=all_kept(a, NOTHING))
    cost = evaluate(plan)
    if cost.peak_bytes > budget:
        return None, cost
    plan.notes.append(f"the original, in the rewrite's order, already fits the budget ({human_bytes(cost.peak_bytes)} "
                      f"<= {human_bytes(budget)})")
    return BudgetResult(plan, cost.peak_bytes, 0, [], [], 1), cost


def lowest_cost(*costs: PlanCost | None) -> PlanCost:
    """The lowest peak of those judged (the reordered original's is one: a structure's floor
    can lie above it)."""
    return min((c for c in costs if c is not None), key=lambda c: c.peak_bytes)


def parse_budget(text: str, reference_peak: int) -> int:
    """'2GiB', '512MiB', '1e9' or '40%' (of ``reference_peak``, the original's) -> bytes."""
    from ..units import parse_bytes

    text = text.strip()
    try:
        if text.endswith("%"):
            share = float(text[:-1]) / 100
            if not 0 < share < float("inf"):
                raise ValueError
            return int(reference_peak * share)
        return parse_bytes(text)
    except ValueError as e:
        raise UsageError(f"--budget '{text}' is not a size (2GiB, 512MiB) or a share of the peak (40%)") from e


def fill_greedily(ranked: list[Candidate], timeline: tuple[int, ...], spans: dict[str, tuple[int, int]],
                  limit: int) -> set[str]:
    """Keep candidates, most FLOPs per byte first, whenever the linear memory model says
    every step of their span stays under ``limit``."""
    steps = RangeMax(timeline)
    kept: set[str] = set()
    for c in ranked:
        span = spans.get(c.tensor)
        if span is None:
            continue
        lo, hi = span
        if steps.max(lo, hi) + c.nbytes <= limit:
            steps.add(lo, hi, c.nbytes)
            kept.add(c.tensor)
    return kept


def _lean_loosening(nodes: int, loose: bool) -> int:
    """Loosening steps on a large graph. Each is a rewrite of the whole graph: two up to 20k
    nodes; above, one under a ``loose`` budget (at least halfway from the floor's peak to the
    original's), none under a tighter one, to keep planning time bounded. The first step
    keeps everything, which fits only loose budgets."""
    if nodes <= 20_000:
        return 2
    return 1 if loose else 0


def _greedy_choice(ranked: list[Candidate], floor: Intervals, both_orders: bool) -> Callable[[int], set[str]]:
    """``choose(limit)`` for the limit search: the greedy fill, most FLOPs per byte first;
    with ``both_orders`` also most FLOPs first, taking whichever saves more (one order
    alone can strand a large saving behind small ones, as greedy knapsacks do)."""
    by_flops = sorted(ranked, key=lambda c: (-c.flops, c.nbytes, c.tensor)) if both_orders else None
    flops = {c.tensor: c.flops for c in ranked}

    def choose(limit: int) -> set[str]:
        keep = fill_greedily(ranked, floor.timeline, floor.spans, limit)
        if by_flops is not None:
            other = fill_greedily(by_flops, floor.timeline, floor.spans, limit)
            if sum(flops[t] for t in other) > sum(flops[t] for t in keep):
                keep = other
        return keep
    return choose


def result_of(fitted: Fitted, ranked: list[Candidate], structure: Plan, note: str) -> BudgetResult:
    plan, cost, keep = fitted.plan, fitted.cost, fitted.keep
    kept = [c for c in ranked if c.tensor in keep]
    plan.notes.append(f"{structure.strategy} structure; " + note.format(kept=len(kept), total=len(ranked)))
    return BudgetResult(plan, cost.peak_bytes, cost.recompute_flops, kept,
                        [c for c in ranked if c.tensor not in keep], 0, structure)


def budget_plan(a: Analysis, budget: int, evaluate: Evaluate, intervals_of: Callable[[Plan], Intervals],
                options: list[Plan] | None = None, beat: int | None = None) -> BudgetResult:
    """The plan with the least recompute FLOPs whose predicted peak fits ``budget``.

    For each region structure (per layer, sqrt(n) and 2*sqrt(n) segments), start from
    every stashed activation recomputed (the lowest peak that structure reaches; its
    memory over the schedule is known). Keeping an activation instead costs its bytes
    between its last forward use and its recompute, and saves its producer's FLOPs:
    keep activations, most FLOPs per byte first, wherever every step stays under a
    limit (range-max blocks make this O(n sqrt n) in vectorised steps). ``search.search_limits`` moves that
    limit until the real cost model (``evaluate``) fits the budget with the fewest
    FLOPs. Small graphs try every structure (and, below all their floors, other
    segmentations); large ones stop at the first that fits. Raises BudgetUnreachable
    when no floor fits.
    """
    fits, nothing = recomputing_nothing(a, budget, evaluate, "budget")
    if fits is not None:
        return fits
    base = nothing.peak_bytes
    exhaustive = len(a.graph.nodes) <= LARGE_GRAPH_NODES

    def search(structure: Plan, floor: Intervals) -> tuple[BudgetResult | None, int]:
        ranked = candidates(a, structure)
        ground = floor.cost.peak_bytes
        loose = 2 * (budget - ground) >= base - ground
        judge = KeepJudge(structure, "budget", evaluate, budget, a.graph.producer)
        loosening = LOOSENING if exhaustive else _lean_loosening(len(a.graph.nodes), loose)
        fitted, spent = search_limits(judge, _greedy_choice(ranked, floor, exhaustive), floor, ranked,
                                      thorough=exhaustive, loosening=loosening)
        if fitted is None:
            return None, spent
        return result_of(fitted, ranked, structure, "kept {kept} of {total} stashed activations, "
                         "chosen greedily by the recompute FLOPs they save"), spent

    # Large graphs stop at the first structure that fits (each floor and each check is a
    # rewrite, and the structures differ little there).
    best, lowest, evaluations = over_structures(a, budget, intervals_of, search, options, first_fit=not exhaustive,
                                               beat=beat)
    if best is not None:
        best.evaluations = evaluations
        best.plan.notes.append(f"predicted peak {human_bytes(best.peak_bytes)} <= budget {human_bytes(budget)} "
                               f"({evaluations} evaluations)")
        return best
    raise NoPlanFits(a, budget, lowest_cost(lowest, nothing))


class NoPlanFits(BudgetUnreachable):
    """No plan the search judged fits the budget: the lowest it saw, for a caller that saw
    lower ones to name instead. Its message names the floor (``lowest_peak``, given or
    found when the message is read: a search raises and catches this one often)."""

    def __init__(self, a: Analysis, budget: int, lowest: PlanCost, floor: Floor | None = None) -> None:
        super().__init__()
        self.a, self.budget, self.lowest, self.floor = a, budget, lowest, floor

    def __str__(self) -> str:
        return unreachable_message(self.a, self.budget, self.lowest, self.floor)


def unreachable_message(a: Analysis, budget: int, floor: PlanCost, lowest: Floor | None = None) -> str:
    from ..units import human_bytes

    live = ", ".join(floor.live_at_peak[:3])
    return (f"budget {human_bytes(budget)} is unreachable: the lowest predicted peak is "
            f"{human_bytes(floor.peak_bytes)} (largest tensors live there: {live or 'none'}); "
            f"{floor_reason(lowest or lowest_peak(a))}")


def floor_reason(floor: Floor) -> str:
    """Why no plan goes below ``floor``, in one clause."""
    resident = human_bytes(floor.resident_bytes)
    if floor.node is None:
        return (f"no plan goes below {human_bytes(floor.bytes)}, the parameters and inputs ({resident}) plus the "
                f"outputs ({human_bytes(floor.output_bytes)}: loss and gradients, all held to the end of the run)")
    scratch = f" and {human_bytes(floor.scratch_bytes)} of kernel working memory" if floor.scratch_bytes else ""
    return (f"no plan goes below {human_bytes(floor.bytes)}: node {floor.node} runs in every plan and holds "
            f"{human_bytes(floor.working_bytes)} of inputs and outputs{scratch} beside the parameters and "
            f"inputs ({resident})")
