"""The check's figures and its findings: what ``stage`` measures and ``rules`` judges.

Both modules read these records; neither imports the other for them.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any, Literal, overload

from . import driver

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
    per_output: dict[str, Any]  # output name -> how it compares
    reference_level: str | None = None  # outputs compared with the original at this ORT level (--ort-optimize)
    unoptimized_vs_rewritten: dict[str, Any] | None = None  # then: the comparison with the original as it is
    run_to_run: dict[str, Any] | None = None  # outputs that differ: the original's own spread between two runs


@dataclass(frozen=True)
class MeasuredRuns:
    """Both models measured under ckpt's settings and under ORT's defaults."""

    original: Measurement
    rewritten: Measurement
    original_ort_default: Measurement | None
    rewritten_ort_default: Measurement | None
    rewritten_ort_default_error: str | None  # why the rewrite did not run under ORT's defaults


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


@dataclass
class CheckFigures:
    """The check's outcome; ``to_json()`` is the body of ``ckpt check --json``. The rules
    (``rules.judge``) fill in the verdict: ``memory_lower`` and the ``findings``, whose
    texts ``failures`` and ``notes`` list."""

    provider: str
    ort_version: str | None
    enable_mem_reuse: bool
    outputs: OutputFigures
    measured: MeasuredRuns
    order: dict[str, Any]  # order_check of the rewritten model's executed order
    prediction: PredictionFigures
    # the pair run again at other values of the symbolic dimensions ("dims"): outputs only
    other_dims: dict[str, Any] | None = None
    user_session: str = "ckpt"  # the session the rewrite is run in (RunsAt.user_session)
    # an ORT training artifact trained by the Module API (module_runs.module_sessions)
    module_sessions: dict[str, Any] | None = None
    memory_lower: bool = True
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)  # the failures and notes above, each with its code

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def codes(self) -> list[str]:
        return [x.code for x in self.findings]

    def add(self, findings: list[Finding]) -> None:
        """Record ``findings`` in order: each text also goes to ``failures`` or ``notes``."""
        for x in findings:
            self.findings.append(x)
            (self.failures if x.severity == "failure" else self.notes).append(x.text)

    @property
    def order_matches(self) -> bool:
        matches: bool = self.order["matches"]
        return matches

    def to_json(self) -> dict[str, Any]:
        out, runs, pred = self.outputs, self.measured, self.prediction
        body = {
            "provider": self.provider, "ort_version": self.ort_version,
            "outputs_equal": out.equal, "outputs_within_tolerance": out.within_tolerance,
            "tolerance": out.tolerance, "max_abs_diff": out.max_abs_diff, "outputs": out.per_output,
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
        # copies, as asdict() made them: the body does not change with the figures
        return {k: asdict(v) if is_dataclass(v) else copy.deepcopy(v) for k, v in body.items()}
