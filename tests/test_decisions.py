"""Decisions recorded where they are made: every stashed buffer has one, they say what
the rewrite really recomputes (read off the written graph), per-op policies state
themselves, and explanations read them (the rows the strategies gave before)."""

from __future__ import annotations

from collections import Counter

import pytest

from conftest import SAMPLES
from ckpt_cli.markers import RECOMPUTE_META
from ckpt_cli.api import plan_model
from ckpt_cli.planning.decision import (BUDGET_CODE, CHECKPOINT, CUT_KEEP, KEEP, RECOMPUTE, Decision, Reason, settle)
from ckpt_cli.planning.plan import Policy

SHAPE_READERS = ("Shape", "Size")


def recomputed_after(result, a) -> set[str]:
    """Stashed buffers of the input that the written graph recomputes: a copy of their
    producer exists and no node other than an original forward node reads the original
    (directly or through a view; shape readers need no data)."""
    g = a.graph
    forward = {n.name for n in g.nodes if a.phases.is_forward[n.index]}
    made_forward = {t for n in g.nodes if a.phases.is_forward[n.index] for t in n.outputs if t}
    held = {a.roots.get(t, t) for n in result.graph.nodes if n.name not in forward and n.op_type not in SHAPE_READERS
            for t in n.inputs if t in made_forward}
    sources = {n.meta(RECOMPUTE_META) for n in result.graph.nodes} - {None}
    copied = {t for n in g.nodes if n.name in sources for t in n.outputs if t}
    return ({s.buffer for s in a.stashed} & copied) - held


@pytest.mark.parametrize("model,options", [("gpt", {}), ("gpt", {"budget": "50%"}), ("cnn", {"auto": "sqrt"})],
                         ids=["gpt default", "gpt budget 50%", "cnn sqrt"])
def test_decisions_are_what_the_rewrite_recomputes(model, options):
    r = plan_model(SAMPLES / f"{model}.onnx", **options)
    a, decisions = r.analysis, r.decisions
    stashed = {s.buffer for s in a.stashed}
    assert set(decisions) == stashed  # one decision per stashed buffer, none for anything else
    assert all(isinstance(d, Decision) and d.tensor == t and d.action in (KEEP, RECOMPUTE) and d.reason.code
               for t, d in decisions.items())
    recomputed = {t for t, d in decisions.items() if d.action == RECOMPUTE}
    assert recomputed, "the plan recomputes something"
    assert recomputed == recomputed_after(r.rewrite, a)
    rows = r.report["explanations"]
    assert len(rows) == len(stashed) == len({row["tensor"] for row in rows})
    assert {row["tensor"] for row in rows if row["status"] == "recomputed"} == recomputed
    assert all(row["reason"] == decisions[row["tensor"]].reason.code for row in rows)


def test_keep_ops_policy_is_the_stated_reason():
    r = plan_model(SAMPLES / "gpt.onnx", policy=Policy(keep_ops=frozenset({"MatMul", "Gemm"})))
    g = r.analysis.graph
    rows = [row for row in r.report["explanations"] if g.nodes[g.producer[row["tensor"]]].op_type in ("MatMul", "Gemm")]
    assert rows, "gpt stashes Gemm outputs"
    assert all(row["status"] == "kept" for row in rows)
    assert Counter(row["reason"] for row in rows) == {"policy": len(rows)}, rows
    assert all("--keep-ops" in row["why"] for row in rows)


def test_recompute_ops_policy_is_the_stated_reason():
    r = plan_model(SAMPLES / "gpt.onnx", auto="layers", policy=Policy(recompute_ops=frozenset({"Add"})))
    g = r.analysis.graph
    adds = [row for row in r.report["explanations"] if g.nodes[g.producer[row["tensor"]]].op_type == "Add"]
    assert {row["reason"] for row in adds if row["status"] == "recomputed"} == {"policy"}


# Counts of (status, reason) the explanations gave before decisions were recorded (when
# explain rebuilt them from strategy names): the structural strategies give the same rows,
# but for one fix on gpt sqrt: getitem_36 (a LayerNorm output) was called recomputed because
# its node is copied for its other outputs, while the backward still reads it through
# view_72, the next segment's checkpoint (before: 63 recomputed, 20 checkpoints); on cnn,
# getitem and getitem_2 (MaxPool values, whose node is copied for its indices) are the next
# segment's checkpoints and read by the backward as they are (before: 2 more recomputed).
BEFORE = {
    ("gpt", "layers"): {("recomputed", "region"): 73, ("kept", "outside"): 7, ("kept", "checkpoint"): 3},
    ("gpt", "sqrt"): {("recomputed", "region"): 62, ("kept", "checkpoint"): 21},
    ("cnn", "sqrt"): {("recomputed", "region"): 23, ("kept", "checkpoint"): 11},
    ("cnn", "balanced"): {("recomputed", "region"): 22, ("kept", "compute_bound"): 6, ("kept", "outside"): 4,
                          ("kept", "checkpoint"): 2},
}


@pytest.mark.parametrize("model,auto", list(BEFORE), ids=[f"{m}-{s}" for m, s in BEFORE])
def test_explanations_match_the_rows_before(model, auto):
    rows = plan_model(SAMPLES / f"{model}.onnx", auto=auto).report["explanations"]
    assert Counter((row["status"], row["reason"]) for row in rows) == BEFORE[model, auto]


def test_settle_keeps_the_most_fundamental_reason():
    def d(action, reason):
        return Decision("t", action, reason, 8, 100)

    budget = Reason(BUDGET_CODE, "the budget has room for it")
    # a keep set made moot by a region boundary says so; a cut's own choice stays its reason
    assert settle({"t": d(KEEP, budget)}, {"t": CHECKPOINT}, set())["t"].reason == CHECKPOINT
    assert settle({"t": d(KEEP, CUT_KEEP)}, {"t": CHECKPOINT}, set())["t"].reason == CUT_KEEP
    # the plan recomputes it, the rewrite keeps it: the rewrite's finding
    moot = settle({"t": d(RECOMPUTE, CUT_KEEP)}, {"t": CHECKPOINT}, set())["t"]
    assert (moot.action, moot.reason) == (KEEP, CHECKPOINT)
    # the plan keeps it, the rewrite recomputes it with its node's other output
    made = settle({"t": d(KEEP, budget)}, {}, {"t"})["t"]
    assert (made.action, made.reason.code) == (RECOMPUTE, "with_node")


def test_random_ops_are_kept_for_that_reason():
    from chain import chain_model
    from ckpt_cli.analysis import analyse
    from ckpt_cli.api import load_input
    from ckpt_cli.planning.mincut import build, front, to_plan

    model = chain_model(layers=4, batch=64, width=64, dropout_layer=1)
    for auto in ("layers", None):  # the region strategy, the default: the rewrite finds the Dropout
        rows = {row["tensor"]: row for row in plan_model(model, auto=auto).report["explanations"]}
        assert {(rows[t]["status"], rows[t]["reason"]) for t in ("d1", "m1")} == {("kept", "random")}, auto
    a = analyse(load_input(model).graph)
    for cut in front(build(a)):  # the min cut never copies it, and says why
        decisions = to_plan(a, cut).decisions
        assert {decisions[t].reason.code for t in ("d1", "m1")} == {"random"}


def test_decisions_match_the_rewrite_on_random_graphs():
    """Random training graphs (views, Dropout, Shape readers, Split) under random regions
    and keep sets: one decision per stashed buffer, recomputed exactly where the written
    graph no longer reads the original."""
    import numpy as np

    from randgraph import build_random_training_graph
    from ckpt_cli.analysis import analyse
    from ckpt_cli.api import load_input
    from ckpt_cli.planning.plan import Plan, Region
    from ckpt_cli.rewrite import rewrite

    reasons: Counter = Counter()
    for seed in range(60):
        rng = np.random.default_rng(seed)
        a = analyse(load_input(build_random_training_graph(seed, int(rng.integers(6, 30)))).graph)
        fwd = [i for i in range(len(a.graph.nodes)) if a.phases.is_forward[i]]
        k = int(rng.integers(1, 4))
        regions = [Region(f"r{r}", set()) for r in range(k)]
        for i in fwd:
            if rng.random() < 0.8:
                regions[int(rng.integers(k))].nodes.add(i)
        regions = [r for r in regions if r.nodes]
        made = sorted({t for r in regions for i in r.nodes for t in a.graph.nodes[i].outputs if t})
        for t in rng.choice(made, size=min(len(made), int(rng.integers(0, 3))), replace=False):
            next(r for r in regions if a.graph.producer[t] in r.nodes).keep.add(str(t))
        result = rewrite(a, Plan(regions, "random"), pin=bool(seed % 2))
        stashed = {s.buffer for s in a.stashed}
        assert set(result.decisions) == stashed, seed
        recomputed = {t for t, d in result.decisions.items() if d.action == RECOMPUTE}
        assert recomputed == recomputed_after(result, a), seed
        reasons.update(d.reason.code for d in result.decisions.values())
    # the cases the generator makes: each reason the rewrite can find occurs, and every
    # buffer the plan meant to recompute but the rewrite keeps has the reason it found
    assert {"region", "outside", "checkpoint", "random", "plan", "view_kept"} <= set(reasons), reasons
    assert "not_needed" not in reasons, reasons
