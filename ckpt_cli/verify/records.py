"""The check's measured facts as typed records, each parsed once where the children's
answers and the comparisons come in (``driver``, ``compare``, ``module_runs``, ``stage``).

The rules read fields; ``to_json()`` gives each record back as the keys ``ckpt check
--json`` has always printed, in the same order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any


def _frozen(d: Mapping[str, Any] | None) -> dict[str, Any]:
    return dict(d or {})


@dataclass(frozen=True)
class ComparisonSummary:
    """Two sets of outputs compared, in four figures (``driver._comparison_summary``)."""

    all_bit_identical: bool
    all_within_tolerance: bool = False
    max_abs_diff: float | None = None
    n_failed: int = 0

    @classmethod
    def of(cls, cmp: Mapping[str, Any]) -> "ComparisonSummary":
        return cls(cmp["all_bit_identical"], cmp["all_within_tolerance"], cmp["max_abs_diff"], cmp["n_failed"])

    def to_json(self) -> dict[str, Any]:
        return {"all_bit_identical": self.all_bit_identical, "all_within_tolerance": self.all_within_tolerance,
                "max_abs_diff": self.max_abs_diff, "n_failed": self.n_failed}


@dataclass(frozen=True)
class OutputComparison:
    """One output of the rewrite against the original's (``compare.compare_one``);
    ``problem``: its shape, element type or position changed."""

    bit_identical: bool
    within_tolerance: bool
    dtype: str = ""
    shape: tuple[int, ...] = ()
    max_abs_diff: float | None = None
    max_rel_diff: float | None = None
    problem: str | None = None

    @classmethod
    def of(cls, e: Mapping[str, Any]) -> "OutputComparison":
        return cls(e["bit_identical"], e["within_tolerance"], e["dtype"], tuple(e["shape"]), e["max_abs_diff"],
                   e["max_rel_diff"], e.get("problem"))

    def to_json(self) -> dict[str, Any]:
        out = {"dtype": self.dtype, "shape": list(self.shape), "bit_identical": self.bit_identical,
               "max_abs_diff": self.max_abs_diff, "max_rel_diff": self.max_rel_diff,
               "within_tolerance": self.within_tolerance}
        return out if self.problem is None else {**out, "problem": self.problem}


def output_comparisons(per: Mapping[str, Mapping[str, Any]]) -> dict[str, OutputComparison]:
    return {name: OutputComparison.of(e) for name, e in per.items()}


@dataclass(frozen=True)
class Mismatch:
    """Where the executed order first leaves the file's (``provider``: on that device)."""

    position: int | None
    file: str | None
    executed: str | None
    provider: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"position": self.position, "file": self.file, "executed": self.executed}
        return out if self.provider is None else {**out, "provider": self.provider}


@dataclass(frozen=True)
class OrderCheck:
    """The rewritten model's executed order against the file's (``compare.order_check``)."""

    matches: bool
    compared: int = 0
    first_mismatch: Mismatch | None = None
    not_executed: tuple[str, ...] = ()  # the first 50
    n_not_executed: int = 0
    not_in_file: tuple[str, ...] = ()  # the first 50
    n_not_in_file: int = 0
    not_in_file_ops: Mapping[str, int] = field(default_factory=dict)
    provider_copies: tuple[str, ...] = ()  # the first 50
    n_provider_copies: int = 0
    nodes_per_provider: Mapping[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"matches": self.matches, "compared": self.compared,
                "first_mismatch": self.first_mismatch.to_json() if self.first_mismatch else None,
                "not_executed": list(self.not_executed), "n_not_executed": self.n_not_executed,
                "not_in_file": list(self.not_in_file), "n_not_in_file": self.n_not_in_file,
                "not_in_file_ops": _frozen(self.not_in_file_ops), "provider_copies": list(self.provider_copies),
                "n_provider_copies": self.n_provider_copies, "nodes_per_provider": _frozen(self.nodes_per_provider)}


@dataclass(frozen=True)
class OtherDims:
    """Both files run once more at other values of the symbolic dimensions: the outputs
    compared (``outputs``), or why one of them did not run."""

    dims: Mapping[str, int]
    outputs: ComparisonSummary | None = None
    original_failed: str | None = None
    rewritten_failed: str | None = None

    def to_json(self) -> dict[str, Any]:
        if self.original_failed is not None:
            said: dict[str, Any] = {"original_failed": self.original_failed}
        elif self.rewritten_failed is not None:
            said = {"rewritten_failed": self.rewritten_failed}
        else:
            said = self.outputs.to_json() if self.outputs else {}
        return {"dims": _frozen(self.dims), **said}


@dataclass(frozen=True)
class Spread:
    """One output that differs, against the original's own run-to-run spread: ``kernel``
    computes it, ``accepted`` when that kernel's spread explains the difference."""

    original_spread: float
    rewrite_diff: float
    within_tolerance: bool
    bit_identical: bool
    kernel: str | None = None
    accepted: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"original_spread": self.original_spread, "rewrite_diff": self.rewrite_diff,
                "within_tolerance": self.within_tolerance, "bit_identical": self.bit_identical,
                "kernel": self.kernel, "accepted": self.accepted}


@dataclass(frozen=True)
class RunToRun:
    """The differing outputs judged against the original's own spread (``stage._spread_verdict``)."""

    outputs: Mapping[str, Spread]
    unexplained: tuple[str, ...]
    varying_kernels: Mapping[str, float]
    n_varying_in_original: int

    @property
    def accepted(self) -> bool:
        return not self.unexplained

    def to_json(self) -> dict[str, Any]:
        return {"outputs": {k: s.to_json() for k, s in self.outputs.items()}, "unexplained": list(self.unexplained),
                "accepted": self.accepted, "varying_kernels": _frozen(self.varying_kernels),
                "n_varying_in_original": self.n_varying_in_original}


@dataclass(frozen=True)
class ModuleRun:
    """One training model trained in the Module API: its process peak, losses, step time;
    ``peak_runs``: every peak measured when it was trained again (``peak_bytes`` is then
    the lowest, noise only ever adding to a high-water mark)."""

    peak_bytes: int
    losses_hex: tuple[str, ...]
    time_s: float
    peak_runs: tuple[int, ...] = ()

    def again(self, peak_bytes: int) -> "ModuleRun":
        """This run with the peak of one more run of the same file folded in."""
        runs = (*(self.peak_runs or (self.peak_bytes,)), peak_bytes)
        return replace(self, peak_bytes=min(runs), peak_runs=runs)

    @property
    def spread(self) -> int:
        """How far this file's own peaks lay apart when trained again (0: trained once)."""
        return max(self.peak_runs) - min(self.peak_runs) if self.peak_runs else 0

    def to_json(self) -> dict[str, Any]:
        out = {"peak_bytes": self.peak_bytes, "losses_hex": list(self.losses_hex), "time_s": self.time_s}
        return {**out, "peak_bytes_runs": list(self.peak_runs)} if self.peak_runs else out


@dataclass(frozen=True)
class ModulePredicted:
    """ckpt's model of the untuned Module session for one file (verify/module_model.py):
    its process peak after the steps the check runs, and once the arena's placements
    settle, which they can take tens of steps to do (``settles_after``: the step from which
    every step repeats an earlier one; None: not within the replay's bound, the long-run
    figure is then the last step replayed)."""

    at_steps: int
    long_run: int
    settles_after: int | None

    @classmethod
    def of(cls, at_steps: int | None, long_run: Mapping[str, Any] | None) -> "ModulePredicted | None":
        if at_steps is None or long_run is None:
            return None
        return cls(at_steps, long_run["peak_bytes"], long_run["settles_after_steps"])

    def long_run_json(self) -> dict[str, Any]:
        return {"peak_bytes": self.long_run, "settles_after_steps": self.settles_after}


MODULE_SESSIONS = ("untuned", "settings")
MODULE_SIDES = ("original", "rewritten")
MODULE_RUN_KEYS = tuple(f"{side}_{session}" for session in MODULE_SESSIONS for side in MODULE_SIDES)


@dataclass(frozen=True)
class ModuleSessions:
    """Both training models in the Module API (``module_runs.module_sessions``): ``runs``
    keyed "<side>_<session>", ``errors`` where one did not train; or ``skipped`` and why."""

    skipped: str | None = None
    steps: int = 0
    settings: Mapping[str, Any] | None = None
    runs: Mapping[str, ModuleRun] = field(default_factory=dict)
    errors: Mapping[str, str] = field(default_factory=dict)
    # ckpt's model of the untuned session per side, None where it predicts none
    predicted: Mapping[str, ModulePredicted | None] = field(default_factory=dict)

    @classmethod
    def of(cls, d: Mapping[str, Any]) -> "ModuleSessions":
        if "skipped" in d:
            return cls(d["skipped"])
        runs = {k: ModuleRun(d[k]["peak_bytes"], tuple(d[k]["losses_hex"]), d[k]["time_s"],
                             tuple(d[k].get("peak_bytes_runs", ())))
                for k in MODULE_RUN_KEYS if k in d}
        long_run = d.get("predicted_untuned_long_run") or {}
        predicted = {side: ModulePredicted.of(p, long_run.get(side)) for side, p in (d.get("predicted_untuned") or {}).items()}
        return cls(None, d["steps"], d["settings"], runs, dict(d["errors"]), predicted)

    def prediction_error(self, side: str) -> float | None:
        """The untuned prediction against the untuned peak measured, over the same steps:
        predicted / measured - 1."""
        predicted, run = self.predicted.get(side), self.runs.get(f"{side}_untuned")
        if predicted is None or run is None or not run.peak_bytes:
            return None
        return predicted.at_steps / run.peak_bytes - 1

    def losses_identical(self, session: str) -> bool | None:
        o, r = self.runs.get(f"original_{session}"), self.runs.get(f"rewritten_{session}")
        return None if o is None or r is None else o.losses_hex == r.losses_hex

    def to_json(self) -> dict[str, Any]:
        if self.skipped is not None:
            return {"skipped": self.skipped}
        out = {"steps": self.steps, "settings": self.settings, **{k: r.to_json() for k, r in self.runs.items()},
               "errors": _frozen(self.errors),
               "losses_identical": {s: self.losses_identical(s) for s in MODULE_SESSIONS}}
        if self.predicted:
            out["predicted_untuned"] = {side: p.at_steps if p else None for side, p in self.predicted.items()}
            out["predicted_untuned_long_run"] = {side: p.long_run_json() if p else None
                                                 for side, p in self.predicted.items()}
            out["prediction_error_untuned"] = {side: self.prediction_error(side) for side in MODULE_SIDES}
        return out
