"""The artifact bench calls a rewrite worse only when repeated runs agree."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import artifacts


class _Log:
    def log(self, _msg: str) -> None:
        pass


def _row(peaks: dict[str, int]) -> dict:
    return {"model": "m", "seconds": {}, "train": {k: {"peak_bytes": v} for k, v in peaks.items()}}


def _ctx() -> artifacts.Setup:
    return artifacts.Setup(py="py", ckpt="ckpt", out_dir=Path("."), steps=1, run=_Log(), check_env=None)


BASE = {"original/untuned": 9_000_000, "original/settings": 9_000_000,
        "rewrite/untuned": 9_000_000, "rewrite/settings": 9_000_000}


def _remeasure(monkeypatch: pytest.MonkeyPatch, first: dict[str, int], later: dict[str, int]) -> tuple[dict, list]:
    calls: list[str] = []

    def fake_train(_ctx, _art, model, settings, _row, _prio):
        key = f"{model}/{'settings' if settings is not None else 'untuned'}"
        calls.append(key)
        return {"peak_bytes": later[key]}

    monkeypatch.setattr(artifacts, "_train", fake_train)
    row = _row(first)
    artifacts._remeasure_suspects(_ctx(), Path("."), {"original": "original", "rewrite": "rewrite"},
                                  {"s": 1}, row, 0)
    return row, calls


def test_a_noisy_high_peak_is_measured_again_and_cleared(monkeypatch: pytest.MonkeyPatch) -> None:
    first = dict(BASE, **{"rewrite/untuned": 9_180_000})  # +180 KB: beyond 1% noise
    row, calls = _remeasure(monkeypatch, first, BASE)
    assert set(calls) == {"rewrite/untuned", "original/untuned"}
    assert row["train"]["rewrite/untuned"]["peak_bytes"] == 9_000_000
    assert row["train"]["rewrite/untuned"]["peak_bytes_runs"] == [9_180_000, 9_000_000]
    assert artifacts._suspect_pairs(row) == []


def test_a_steady_regression_is_still_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    worse = dict(BASE, **{"rewrite/settings": 9_500_000})
    row, calls = _remeasure(monkeypatch, worse, worse)
    assert calls.count("rewrite/settings") == artifacts.REMEASURE
    assert artifacts._suspect_pairs(row) == [("rewrite/settings", "original/settings"),
                                              ("rewrite/settings", "original/untuned")]


def test_nothing_is_run_again_when_no_side_looks_worse(monkeypatch: pytest.MonkeyPatch) -> None:
    _, calls = _remeasure(monkeypatch, BASE, BASE)
    assert calls == []
