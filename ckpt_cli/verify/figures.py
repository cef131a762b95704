"""The check's figures and its findings: what ``stage`` measures and ``rules`` judges.

Both modules read these records; neither imports the other for them.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any, Literal, overload

from . import driver
from .records import ComparisonSummary, ModuleSessions, OrderCheck, OtherDims, OutputComparison, RunToRun

Severity = Literal["failure", "note"]


@dataclass(frozen=True)
class Finding:
    """What one rule of the verdict finds: a failure (a premise of the saving that does not
    hold) or a note, in one line. ``code`` names it in snake_case (the rule's name, with a
    suffix where a rule finds several things), and stays as the wording changes."""

    code: str
    severity: Severity
    text: str


def failure(code: str, text: str) -> Finding:
    return Finding(code, "failure", text)


def note(code: str, text: str) -> Finding:
    return Finding(code, "note", text)


@dataclass(frozen=True)
class Measurement:
    """One model measured in one session on ONNX Runtime (medians over the runs)."""

    peak_bytes: int | None
    peak_above_baseline_bytes: int | None
    peak_requested_bytes: int | None  # tensor bytes, baseline removed
    time_s: float | None
    method: str | None
    runs: list[dict[str, Any]] | None

    @overload
    @classmethod
    def of(cls, summary: driver.RunSummary) -> "Measurement": ...
    @overload
    @classmethod
    def of(cls, summary: None) -> None: ...
    @classmethod
    def of(cls, summary: driver.RunSummary | None) -> "Measurement | None":
        if summary is None:
            return None
        req, base = summary.peak_requested_bytes, summary.baseline_bytes or 0
        return cls(summary.peak_bytes, summary.peak_above_baseline_bytes,
                   (req - base) if req is not None else summary.peak_above_baseline_bytes,
                   summary.time_s, summary.method, summary.runs)


@dataclass(frozen=True)
class OutputFigures:
    """The rewritten model's outputs against the original's."""

    equal: bool  # every output bit-identical
    within_tolerance: bool
    tolerance: dict[str, Any] | None  # {"rtol", "atol"} when the check was given either
    max_abs_diff: float | None
    per_output: Mapping[str, OutputComparison]  # output name -> how it compares
    reference_level: str | None = None  # outputs compared with the original at this ORT level (--ort-optimize)
    unoptimized_vs_rewritten: ComparisonSummary | None = None  # then: the comparison with the original as it is
    run_to_run: RunToRun | None = None  # outputs that differ: the original's own spread between two runs


@dataclass(frozen=True)
class MeasuredRuns:
    """Both models measured under ckpt's settings and under ORT's defaults."""

    original: Measurement
    rewritten: Measurement
    original_ort_default: Measurement | None
    rewritten_ort_default: Measurement | None
    rewritten_ort_default_error: str | None  # why the rewrite did not run under ORT's defaults

    @classmethod
    def of(cls, pair: driver.PairRun) -> "MeasuredRuns":
        return cls(Measurement.of(pair.original.ckpt), Measurement.of(pair.rewritten.ckpt),
                   Measurement.of(pair.original.ort_default), Measurement.of(pair.rewritten.ort_default),
                   pair.rewritten.ort_default_error)


@dataclass(frozen=True)
class PlainPrediction:
    """The rewrite in a plain session (CPU: memory pattern, DEFAULT order), against the
    rewritten model's measured peak under ORT's defaults."""

    predicted: int | None = None
    error: float | None = None
    # the same model on ORT's own ORT_ENABLE_ALL graph, in the order ORT writes and runs it
    fused: int | None = None
    fused_error: float | None = None


@dataclass(frozen=True)
class PredictionFigures:
    """ckpt's predictions per side ("original", "rewritten"), and how far off the measured peaks."""

    tensor_bytes: dict[str, int]  # the live tensor bytes at the peak
    tensor_error: dict[str, float | None]  # against the measured tensor bytes
    in_use_bytes: dict[str, int | None]  # the CPU arena's bytes in use at the peak
    in_use_error: dict[str, float | None]  # against the measured peak in use
    max_error: float  # the error the check tolerates (--max-prediction-error)
    plain: PlainPrediction = PlainPrediction()
    unsized: dict[str, list[str]] = field(default_factory=dict)  # side -> tensors counted as 0 B


@dataclass(frozen=True)
class CheckFigures:
    """The check's outcome; ``to_json()`` is the body of ``ckpt check --json``. The rules
    (``rules.judge``) give the verdict: the ``findings``, whose texts ``failures`` and
    ``notes`` list, and ``memory_lower``; ``judge`` returns the figures with them."""

    provider: str
    ort_version: str | None
    enable_mem_reuse: bool
    outputs: OutputFigures
    measured: MeasuredRuns
    order: OrderCheck  # the rewritten model's executed order against its file's
    prediction: PredictionFigures
    # the pair run again at other values of the symbolic dimensions: outputs only
    other_dims: OtherDims | None = None
    user_session: str = "ckpt"  # the session the rewrite is run in (RunsAt.user_session)
    # an ORT training artifact trained by the Module API (module_runs.module_sessions)
    module_sessions: ModuleSessions | None = None
    memory_lower: bool = True
    findings: tuple[Finding, ...] = ()  # the verdict, failures and notes, each with its code

    @property
    def failures(self) -> list[str]:
        return [x.text for x in self.findings if x.severity == "failure"]

    @property
    def notes(self) -> list[str]:
        return [x.text for x in self.findings if x.severity == "note"]

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def codes(self) -> list[str]:
        return [x.code for x in self.findings]

    @property
    def order_matches(self) -> bool:
        return self.order.matches

    def to_json(self) -> dict[str, Any]:
        out, runs, pred = self.outputs, self.measured, self.prediction
        body = {
            "provider": self.provider, "ort_version": self.ort_version,
            "outputs_equal": out.equal, "outputs_within_tolerance": out.within_tolerance,
            "tolerance": out.tolerance, "max_abs_diff": out.max_abs_diff,
            "outputs": {k: e.to_json() for k, e in out.per_output.items()},
            "original": runs.original, "rewritten": runs.rewritten,
            "original_ort_default": runs.original_ort_default, "rewritten_ort_default": runs.rewritten_ort_default,
            "rewritten_ort_default_error": runs.rewritten_ort_default_error,
            "order_matches": self.order_matches, "order": self.order,
            "predicted": pred.tensor_bytes, "prediction_error": pred.tensor_error,
            "predicted_in_use": pred.in_use_bytes, "prediction_error_in_use": pred.in_use_error,
            "max_prediction_error": pred.max_error, "memory_lower": self.memory_lower,
            "enable_mem_reuse": self.enable_mem_reuse, "reference_level": out.reference_level,
            "unoptimized_vs_rewritten": out.unoptimized_vs_rewritten, "run_to_run": out.run_to_run,
            "predicted_plain": pred.plain.predicted, "prediction_error_plain": pred.plain.error,
            "predicted_plain_fused": pred.plain.fused, "prediction_error_plain_fused": pred.plain.fused_error,
            "unsized": pred.unsized, "other_dims": self.other_dims, "user_session": self.user_session,
            "module_sessions": self.module_sessions,
            "failures": self.failures, "notes": self.notes, "passed": self.passed,
            "findings": [asdict(x) for x in self.findings],
        }
        # copies: the body does not change with the figures
        return {k: _json(v) for k, v in body.items()}


def _json(v: object) -> object:
    """A record as its JSON (its ``to_json()``, or its fields), anything else copied."""
    to_json = getattr(v, "to_json", None)
    if to_json is not None:
        return copy.deepcopy(to_json())
    return asdict(v) if is_dataclass(v) and not isinstance(v, type) else copy.deepcopy(v)
