"""The knee of a peak/recompute front: where more recompute stops buying much peak.

The default plan stops there instead of at the lowest peak. Both axes are shares: the
predicted peak as a share of the original's, the recompute FLOPs as a share of one
training step's FLOPs. Walking the front's lower convex hull from the plan that recomputes
least, each step is taken while it costs at most ``MAX_SLOPE`` of a step's FLOPs per share
of the peak saved: with 1.0, one percent of step time buys at least one percent of peak.
Per-layer checkpointing of a transformer (one extra forward, a third of a step, for half
the peak or more) passes; the last few percent of peak, bought by recomputing attention
and matmuls a second time, do not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

MAX_SLOPE = 1.0


@dataclass(frozen=True)
class Point:
    """A plan's predicted peak and recompute FLOPs."""

    peak_bytes: int
    recompute_flops: int


@dataclass(frozen=True)
class Knee:
    """The default's choice, recorded where it is made: the knee plan and the lowest-peak
    plan among the same candidates, against the original's peak and a step's FLOPs."""

    original_peak: int
    step_flops: int
    chosen: Point
    lowest: Point
    candidates: int
    max_slope: float = MAX_SLOPE
    passed_over: str | None = None  # why the knee's rewrite was not written (it gained nothing), if it was not

    def saving(self, p: Point) -> float:
        return 1 - p.peak_bytes / self.original_peak if self.original_peak else 0.0

    def cost(self, p: Point) -> float:
        return p.recompute_flops / self.step_flops if self.step_flops else 0.0

    @property
    def stopped_early(self) -> bool:
        """The knee is not the lowest peak: the lowest costs more than ``max_slope`` allows."""
        return self.chosen != self.lowest

    def line(self, reorder_only: bool = False) -> str:
        """The choice in one line of the report."""
        chosen = ("reordering alone" if reorder_only else
                  f"{-self.saving(self.chosen):+.0%} working peak for {self.cost(self.chosen):+.1%} of a step's FLOPs")
        # Judged on the working peak (tensors plus kernel scratch), which can differ from the
        # tensor peak the summary line gives: the line names its figure.
        head = f"the default: the knee of {self.candidates} plans judged, {chosen}"
        if not self.stopped_early:
            return head + ", also their lowest working peak"
        return (head + f"; their lowest working peak, {-self.saving(self.lowest):+.0%}, costs "
                f"{self.cost(self.lowest):+.1%} (--auto min-peak)")

    def to_json(self) -> dict[str, Any]:
        def point(p: Point) -> dict[str, float]:
            return {"peak_bytes": p.peak_bytes, "recompute_flops": p.recompute_flops,
                    "peak_saving": round(self.saving(p), 6), "recompute_share_of_step": round(self.cost(p), 6)}

        return {"rule": f"lowest peak while each step along the front costs at most {self.max_slope:g}x "
                        "its peak share saved in step FLOPs",
                "max_slope": self.max_slope, "candidates": self.candidates, "chosen": point(self.chosen),
                "lowest_peak": point(self.lowest), "stopped_early": self.stopped_early,
                "passed_over": self.passed_over}


def knee_index(points: Sequence[Point], original_peak: int, step_flops: int, max_slope: float = MAX_SLOPE) -> int:
    """The index of the knee among ``points``: from the least recompute (lowest peak among
    ties), hop along the lower convex hull toward lower peaks while a hop's slope, in
    step-FLOPs share per peak share saved, stays within ``max_slope``."""
    at, hops = hull_path(points, original_peak, step_flops)
    for nxt, slope in hops:
        if slope > max_slope:
            return at
        at = nxt
    return at


def hull_path(points: Sequence[Point], original_peak: int, step_flops: int) -> tuple[int, list[tuple[int, float]]]:
    """The lower convex hull of ``points`` from the least recompute to the lowest peak: the
    first vertex's index, and (index, slope of the hop to it) per vertex after it."""
    x = [p.peak_bytes / max(1, original_peak) for p in points]
    y = [p.recompute_flops / max(1, step_flops) for p in points]
    at = min(range(len(points)), key=lambda i: (y[i], x[i]))
    first = at
    hops: list[tuple[int, float]] = []
    while True:
        lower = [j for j in range(len(points)) if x[j] < x[at]]
        if not lower:
            return first, hops
        # the next hull vertex: the least slope, the farthest among equal slopes
        slope = {j: max(0.0, y[j] - y[at]) / (x[at] - x[j]) for j in lower}
        at = min(lower, key=lambda j: (slope[j], x[j]))
        hops.append((at, slope[at]))
