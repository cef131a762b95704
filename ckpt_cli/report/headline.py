"""The headline: the figure a user runs a command for, in one shape for every report
(schema.json's ``headline``) and as the first line of every text report.

Reports keep their older keys for the same figure (``peak_bytes``, ``peak_bytes_before``,
``before.peak_bytes``, a check's ``original.peak_bytes``): tools read them. The headline
repeats one of them, named by ``source``: measured on ONNX Runtime when a check ran,
predicted otherwise."""

from __future__ import annotations

from typing import Any

from ..units import human_bytes, percent


def headline(before: int, after: int | None = None, measured: bool = False,
             time_before: float | None = None, time_after: float | None = None) -> dict[str, Any]:
    """The one builder: the peak before (and after) the rewrite, and the step-time ratio
    when both times were measured."""
    return {
        "figure": "peak_bytes",
        "source": "measured" if measured else "predicted",
        "before": before,
        "after": after,
        "ratio": after / before if after is not None and before else None,
        "step_time_ratio": time_after / time_before if time_before and time_after is not None else None,
    }


def _measured(check: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The original's and the rewrite's runs under ckpt's settings, when both have a peak."""
    o, w = check.get("original"), check.get("rewritten")
    if o is None or w is None or o.get("peak_bytes") is None or w.get("peak_bytes") is None:
        return None
    return o, w


def check_headline(check: dict[str, Any], predicted: tuple[int, int] | None = None) -> dict[str, Any]:
    """A check's figures: measured; ``predicted`` (else the check's own prediction) when
    ORT gave no peak."""
    runs = _measured(check)
    if runs is not None:
        o, w = runs
        return headline(o["peak_bytes"], w["peak_bytes"], True, o.get("time_s"), w.get("time_s"))
    before, after = predicted or (check["predicted"]["original"], check["predicted"]["rewritten"])
    return headline(before, after)


def compare_headline(first: dict[str, Any], last: dict[str, Any] | None) -> dict[str, Any] | None:
    """First input against the last one (alone: the first): measured where both have a
    measured peak, else predicted; None when the inputs share no peak figure."""
    other = last if last is not None else first
    if first.get("measured_peak_bytes") is not None and other.get("measured_peak_bytes") is not None:
        after = last["measured_peak_bytes"] if last is not None else None
        times = (first.get("step_time_s"), last.get("step_time_s")) if last is not None else (None, None)
        return headline(first["measured_peak_bytes"], after, True, *times)
    if first.get("peak_bytes") is not None and other.get("peak_bytes") is not None:
        return headline(first["peak_bytes"], last["peak_bytes"] if last is not None else None)
    return None


def headline_text(h: dict[str, Any] | None) -> str | None:
    """``peak memory (measured on ONNX Runtime): 7.3 MiB -> 2.5 MiB (-65.4%), step time +39.8%``."""
    if h is None:
        return None
    where = "measured on ONNX Runtime" if h["source"] == "measured" else "predicted"
    text = f"peak memory ({where}): {human_bytes(h['before'])}"
    if h["after"] is not None:
        text += f" -> {human_bytes(h['after'])} ({_signed(h['after'] - h['before'], h['before'])})"
    if h["step_time_ratio"] is not None:
        text += f", step time {_signed(h['step_time_ratio'] - 1.0, 1.0)}"
    return text


def _signed(part: float, whole: float) -> str:
    text = percent(part, whole)
    return text if text.startswith(("-", "n/a")) else "+" + text
