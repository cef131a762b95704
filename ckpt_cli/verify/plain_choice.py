"""Judge the default's plans in the session a joint graph's user opens: ``InferenceSession(path)``.

Nothing set there means ORT_ENABLE_ALL's fusions, ORT's DEFAULT order, buffer reuse and
the memory pattern: from the second run on, every intermediate buffer lives in one block
that the arena serves from a power-of-two region, taken whole unless the region is at
least twice the block. A plan whose peak is low under ckpt's settings can hold as much as
the original there, when its block lands in the same region. ckpt predicts that session
from ORT's own fused graph of the written file (``verify/plain_model.py``), so the knee's
rewrite and the front's hull vertices past it are judged by it, and the knee rule is
applied again on those predictions: the default moves along the front while a step's
recompute buys at least as much plain-session peak. A plan predicted above the original
there (beyond the measurement's noise, ``PLAIN_SLACK_BYTES`` or ``PLAIN_SLACK_SHARE``) gives
way to the first judged plan that is not; where none is, the graph is written unchanged
with the figures in one line (``rewrite/select.never_worse``). The choice is recorded on the
plan.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, cast

from ..analysis import Analysis
from ..analysis.shapes import TensorInfo
from ..errors import CkptError
from ..io.external import external_tensors
from ..io.save import save_model
from ..io.written import to_model
from ..planning.budget import Planned
from ..planning.knee import MAX_SLOPE, Point, knee_index
from ..rewrite import RewriteResult, pinned, rewrite, unchanged
from ..options import DEFAULT_TIMEOUT_S
from ..units import human_bytes
from .plain_model import fused_plains

Finish = Callable[[RewriteResult], RewriteResult]

# Each judgement runs ORT's optimizer on the written file in a child process: on larger
# graphs or weights the default is not held up for it.
MAX_JUDGED_NODES = 5_000
MAX_JUDGED_WEIGHT_BYTES = 256 << 20
# A plan is above the original in a plain session where its predicted peak exceeds the
# original's by more than the larger of these: the slack the Module API's done-when allows
# a measured process peak.
PLAIN_SLACK_BYTES = 64 << 10
PLAIN_SLACK_SHARE = 0.01


@dataclass(frozen=True)
class PlainJudged:
    """One plan, judged: its recompute and predicted peaks (ckpt's settings; plain session)."""

    recompute_flops: int
    settings_peak_bytes: int
    plain_peak_bytes: int

    def to_json(self) -> dict[str, int]:
        return {"recompute_flops": self.recompute_flops, "settings_peak_bytes": self.settings_peak_bytes,
                "plain_peak_bytes": self.plain_peak_bytes}


@dataclass(frozen=True)
class PlainChoice:
    """The default's choice in a plain session: the original's predicted peak there, the
    plans judged (the knee first, then the hull vertices past it) and the one taken (None:
    every one is above the original there, and the graph is written unchanged)."""

    original_plain_bytes: int
    judged: tuple[PlainJudged, ...]
    chosen: int | None
    step_flops: int

    @property
    def moved(self) -> bool:
        return self.chosen is not None and self.chosen != 0

    def ratio(self, i: int) -> float:
        return self.judged[i].plain_peak_bytes / max(1, self.original_plain_bytes)

    def line(self) -> str:
        knee = self.judged[0]
        head = (f"in a plain InferenceSession (ORT's defaults) the knee's rewrite is predicted at "
                f"{human_bytes(knee.plain_peak_bytes)}, {self.ratio(0):.2f}x the original's "
                f"{human_bytes(self.original_plain_bytes)}")
        if self.chosen is None:
            past = (f" and the {len(self.judged) - 1} plans past it at least "
                    f"{min(j.plain_peak_bytes for j in self.judged[1:]) / max(1, self.original_plain_bytes):.2f}x"
                    if len(self.judged) > 1 else "")
            return (head + f"{past}, above it there (under ckpt's settings the knee would hold "
                    f"{human_bytes(knee.settings_peak_bytes)}: --auto min-peak or a plan of your own writes a "
                    "rewrite for those settings)")
        taken = self.judged[self.chosen]
        if not self.moved:
            if len(self.judged) == 1:
                return head
            return head + f"; none of the {len(self.judged) - 1} plans past it buys more there for its recompute"
        extra = (taken.recompute_flops - knee.recompute_flops) / max(1, self.step_flops)
        return (head + f"; the default takes the plan {self.chosen} hull step(s) further: "
                f"{human_bytes(taken.plain_peak_bytes)} there ({self.ratio(self.chosen):.2f}x), "
                f"{human_bytes(taken.settings_peak_bytes)} under ckpt's settings, for {extra:+.1%} of a step's FLOPs")

    def to_json(self) -> dict[str, Any]:
        return {"session": "InferenceSession(path), no options", "max_slope": MAX_SLOPE,
                "original_plain_peak_bytes": self.original_plain_bytes,
                "judged": [j.to_json() for j in self.judged], "chosen": self.chosen, "moved": self.moved,
                "chosen_plain_ratio": None if self.chosen is None else round(self.ratio(self.chosen), 6)}


def judged_here(a: Analysis) -> str | None:
    """Why the default is not judged in a plain session for ``a``; None when it is."""
    if len(a.graph.nodes) > MAX_JUDGED_NODES:
        return f"graphs above {MAX_JUDGED_NODES} nodes are not judged in a plain session"
    weights = sum(a.tensors[t].nbytes or 0 for t in a.graph.initializers if t in a.tensors)
    if weights > MAX_JUDGED_WEIGHT_BYTES:
        return f"models above {human_bytes(MAX_JUDGED_WEIGHT_BYTES)} of weights are not judged in a plain session"
    if external_tensors(a.graph.model):
        # each candidate would be saved with a copy of the weights (ORT refuses a link to data
        # outside the model's folder, and a hard link touches the input's inode): --force over
        # an identical output reads them once
        return "models with external data are not judged in a plain session"
    return None


def _written(a: Analysis, result: RewriteResult, folder: Path, name: str) -> Path | None:
    """``result`` written as ``folder/name.onnx``; None when it cannot be."""
    path = folder / f"{name}.onnx"
    source = a.graph.path.parent if a.graph.path is not None else None
    try:
        save_model(to_model(result), path, source_dir=source, force=True)
    except CkptError:
        return None
    return path


def _fused_peaks(models: Sequence[tuple[Path, Mapping[str, TensorInfo]]],
                 timeout: float | None = DEFAULT_TIMEOUT_S) -> list[int | None]:
    return [f.peak_in_use_bytes if f is not None else None for f in fused_plains(models, timeout)]


def choose_in_plain(a: Analysis, candidates: Sequence[RewriteResult], settings_peaks: Sequence[int],
                    recompute: Sequence[int], timeout: float | None = DEFAULT_TIMEOUT_S) -> PlainChoice | None:
    """The knee rule again, over the plain-session predictions of ``candidates`` (the knee's
    rewrite first); None when a prediction cannot be made. The original and every candidate
    are optimized by one ORT child, which may run ``timeout`` seconds (``--timeout``)."""
    results = [unchanged(a) if a.graph.path is None else None, *candidates]
    with tempfile.TemporaryDirectory(prefix="ckpt_plain_") as tmp:
        paths = [a.graph.path if r is None else _written(a, r, Path(tmp), f"plan{k}") for k, r in enumerate(results)]
        if any(p is None for p in paths):
            return None
        known = [a.tensors if r is None else r.after.tensors for r in results]
        base, *peaks = _fused_peaks([(cast(Path, p), k) for p, k in zip(paths, known)], timeout)
    if base is None or any(p is None for p in peaks):
        return None
    predicted = cast(list[int], peaks)  # none is None: checked above
    step = a.forward_flops + a.backward_flops
    points = [Point(p, f) for p, f in zip(predicted, recompute)]
    chosen = _not_above(predicted, base, knee_index(points, base, step))
    judged = tuple(PlainJudged(f, s, p) for f, s, p in zip(recompute, settings_peaks, predicted))
    return PlainChoice(base, judged, chosen, step)


def _not_above(predicted: Sequence[int], base: int, chosen: int) -> int | None:
    """``chosen``, or where its plain-session peak is above the original's ``base`` the first
    of ``predicted`` (least recompute first) that is not; None where every one is."""
    limit = base + max(PLAIN_SLACK_BYTES, int(base * PLAIN_SLACK_SHARE))
    if predicted[chosen] <= limit:
        return chosen
    return next((i for i, p in enumerate(predicted) if p <= limit), None)


def plain_judgement(a: Analysis, written: Callable[[int], RewriteResult], count: int,
                    settings_peaks: Sequence[int], recompute: Sequence[int],
                    timeout: float | None = DEFAULT_TIMEOUT_S) -> PlainChoice | None:
    """``choose_in_plain`` over ``count`` candidates written by ``written(i)``, or None
    where ``a`` is not judged (``judged_here``)."""
    if judged_here(a) is not None or count < 1:
        return None
    return choose_in_plain(a, [written(i) for i in range(count)], settings_peaks, recompute, timeout)


def judged_in_plain(a: Analysis, knee: Planned, finish: Finish | None = None,
                    timeout: float | None = DEFAULT_TIMEOUT_S) -> Planned:
    """The default's knee, or a hull vertex past it that a plain ``InferenceSession`` holds
    for less, with the judgement recorded (a choice of none where every plan judged is above
    the original there: ``never_worse`` then writes the original unchanged). ``knee`` as it
    is where there is nothing to judge: not the default's knee, or a knee without its cost
    (``make_plan`` records it, and the hull vertices past the knee where there are any).
    ``finish`` turns a pinned rewrite into the one written (the memory-pattern input);
    ``timeout``: ``--timeout``."""
    cost = knee.knee_cost if knee.knee_cost is not None else knee.cost
    if knee.plan is None or knee.knee is None or knee.user or cost is None:
        return knee
    finish = finish or (lambda r: r)
    plans = [knee.plan, *(p for p, _, _ in knee.beyond)]
    costs = [cost, *(c for _, c, _ in knee.beyond)]
    unpinned = [knee.result, *(r for _, _, r in knee.beyond)]
    written: dict[int, RewriteResult] = {0: knee.written} if knee.written is not None else {}

    def write(i: int) -> RewriteResult:
        if i not in written:
            written[i] = pinned(a, unpinned[i]) if unpinned[i] is not None else rewrite(a, plans[i], True)
        return finish(written[i])

    choice = plain_judgement(a, write, len(plans), [c.peak_bytes for c in costs], [c.recompute_flops for c in costs],
                             timeout)
    if choice is None:
        return knee
    if choice.chosen is None or not choice.moved:  # the knee stays, or none is taken
        if choice.chosen is not None:
            knee.plan.notes.append(choice.line())
        return replace(knee, plain=choice, written=written.get(0, knee.written))
    taken = plans[choice.chosen]
    taken.notes.extend((knee.knee.line(), choice.line()))
    return Planned(taken, result=unpinned[choice.chosen], knee=knee.knee, written=written[choice.chosen],
                   plain=choice)


__all__ = ["PlainChoice", "PlainJudged", "choose_in_plain", "judged_here", "judged_in_plain", "plain_judgement"]
