"""--budget's two guarantees: the search writes no plan whose pinned rewrite is over the
budget, and ``rewrite --budget --check`` fails (exit 1) when the measured peak is over it."""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from conftest import SAMPLES

from ckpt_cli.cli import main
from ckpt_cli.errors import BudgetUnreachable
from ckpt_cli.planning.budget import BudgetSearch, Planned
from ckpt_cli.units import human_bytes
from ckpt_cli.verify import stage

BUDGET = 100_000


def _search(guards: list[int], refit_unreachable: bool = False) -> BudgetSearch:
    """A budget search whose search fits 10 bytes under its target, and whose pinned rewrite
    (``write``) adds ``guards[k]`` bytes on its k-th call: pin's guard nodes move the peak."""
    search = BudgetSearch.__new__(BudgetSearch)
    search.evaluator = SimpleNamespace(measure=lambda after: after)
    calls = iter(guards)

    def searched(target: int, budget: int) -> Planned:
        if target < budget and refit_unreachable:
            raise BudgetUnreachable("no plan goes below the target")
        fit = SimpleNamespace(peak_bytes=target - 10, near_misses=())
        return Planned(SimpleNamespace(target=target), budget, fit)

    search.searched = searched
    search.write = lambda planned: SimpleNamespace(after=planned.search.peak_bytes + next(calls), recompute_flops=0)
    return search


def test_budget_search_writes_a_fit_pinned_within_the_budget():
    planned = _search([50, 50]).run(BUDGET)  # over by 40 once pinned: searched again 50 bytes lower
    assert planned.plan.target == BUDGET - 50 and planned.written.after == BUDGET - 10


def test_budget_search_refuses_a_refit_still_over_the_budget_once_pinned():
    with pytest.raises(BudgetUnreachable, match=r"peaks at .* once its order is pinned \(\+50 B"):
        _search([50, 100]).run(BUDGET)  # the refit's guards move the peak more: over again


def test_budget_search_refuses_a_fit_over_the_budget_once_pinned_when_no_refit_exists():
    with pytest.raises(BudgetUnreachable, match="once its order is pinned"):
        _search([50], refit_unreachable=True).run(BUDGET)


@pytest.mark.slow
def test_rewrite_budget_check_exits_1_when_the_measured_peak_is_over_the_budget(tmp_path, monkeypatch):
    """``budget_held`` applied end to end: cnn rewritten under 5.1 MB (what ORT holds: 5.05 MB
    predicted, as measured), with ORT's arena in use measured one byte over the budget
    before the inputs outside it are even added: ``rewrite --budget --check`` fails with
    exit 1, that its only failure (the peak is still below the original's)."""
    budget = 5_100_000
    measured_runs = stage._measured_runs

    def over_the_budget(pair):
        runs = measured_runs(pair)
        return replace(runs, rewritten=replace(runs.rewritten, peak_bytes=budget + 1))

    monkeypatch.setattr(stage, "_measured_runs", over_the_budget)
    r = CliRunner().invoke(main, ["rewrite", str(SAMPLES / "cnn.onnx"), "-o", str(tmp_path / "cnn.ckpt.onnx"),
                                  "--budget", str(budget), "--check", "--provider", "cpu", "--runs", "1", "--json"])
    report = json.loads(r.output)
    assert report["planning"]["budget_met"] and report["planning"]["ort_peak_bytes_after"] <= budget
    failed = [x for x in report["check"]["findings"] if x["severity"] == "failure"]
    assert r.exit_code == 1 and [x["code"] for x in failed] == ["budget_held"], r.output
    assert f"arena in use {human_bytes(budget + 1)} plus" in failed[0]["text"]  # the figure judged
