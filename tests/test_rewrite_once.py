"""A rewrite's work is done once: the default plan's written graph is made from the plan
search's own rewrite of that plan (pinned, never rewritten again), and the written graph's
phases are classified once (refusing a graph left without a backward, then analysing it
for the report). Each is a full walk of a graph of the model's size (issue 47)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from conftest import SAMPLES

import ckpt_cli
import ckpt_cli.analysis as analysis
import ckpt_cli.rewrite as rewrite_stage
import ckpt_cli.rewrite.select as select
from ckpt_cli.planning.plan import Plan


def test_the_default_plan_written_is_the_searchs_own_rewrite_of_it(monkeypatch):
    judged: list[Plan | None] = []
    pinned_from_scratch: list[Plan | None] = []
    own = select.rewrite

    def counted(a, plan, pin=True, *args: Any, **kwargs: Any):
        (pinned_from_scratch if pin else judged).append(plan)
        return own(a, plan, pin, *args, **kwargs)

    monkeypatch.setattr(select, "rewrite", counted)
    result = ckpt_cli.rewrite_model(SAMPLES / "gpt.onnx")
    planned = result.planned
    assert planned is not None and planned.plan is not None and planned.plan.regions
    assert not pinned_from_scratch, "the plan written was rewritten again instead of pinning the search's rewrite"
    # the written plan is one the search judged (by identity: the decision is that value)
    assert any(p is planned.plan or (p is not None and p.regions is planned.plan.regions) for p in judged)
    assert result.result.recompute_nodes > 0


def test_the_written_graph_is_classified_once(monkeypatch):
    seen: Counter[int] = Counter()
    graphs: list[object] = []  # held, so that no id is reused by another graph

    def counting(classify):
        def wrapped(graph, *args: Any, **kwargs: Any):
            seen[id(graph)] += 1
            graphs.append(graph)
            return classify(graph, *args, **kwargs)
        return wrapped

    monkeypatch.setattr(analysis, "classify", counting(analysis.classify))
    monkeypatch.setattr(rewrite_stage, "classify", counting(rewrite_stage.classify))
    result = ckpt_cli.rewrite_model(SAMPLES / "gpt.onnx")
    assert result.result.recompute_nodes > 0
    assert seen[id(result.result.graph)] == 1
    assert max(seen.values()) == 1


def test_the_searchs_rewrites_are_let_go_before_the_written_one_is_judged(monkeypatch):
    """The written rewrite is judged (never_worse), analysed and saved with the search's
    unpinned rewrites already dropped: a 100k-node graph's held 60 MiB through the judging."""
    import ckpt_cli.api as api

    seen = []
    judged = api.judged_rewrite

    def judging(a, planned, result, module_peaks=None):
        seen.append(planned)
        return judged(a, planned, result, module_peaks)

    monkeypatch.setattr(api, "judged_rewrite", judging)
    result = ckpt_cli.rewrite_model(SAMPLES / "gpt.onnx")
    assert result.result.recompute_nodes > 0
    assert len(seen) == 1 and seen[0] is not None
    assert seen[0].result is None
    assert all(r is None for _, _, r in (*seen[0].beyond, *seen[0].fallbacks))
