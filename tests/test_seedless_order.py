"""Backward nodes that read forward tensors alone wait for their first reader
(``rewrite/order.py``'s ``seedless``): ORT's gradient builder writes some of them at the
backward's start (a Pow's gradient factor, ``2 * x``), where they hold a buffer across it."""

from __future__ import annotations

import ckpt_cli
import ckpt_cli.rewrite.schedule as schedule
from ckpt_cli.analysis import analyse
from ckpt_cli.graph import Graph
from ckpt_cli.planning.plan import Plan, Region
from ckpt_cli.rewrite import rewrite
from ckpt_cli.rewrite.order import seedless

from chain import chain_model

EARLY = ("/layers.0/Greater_grad", "/layers.0/Cast_grad")  # layer 0's Relu mask, read last
RECOMPUTED = "/layers.2/Relu"  # the waiting order is offered beside recompute copies only


def _early_mask_model():
    """The 4-layer chain with layer 0's Relu mask written right after the loss gradient's seed."""
    model = chain_model(layers=4)
    nodes = list(model.graph.node)
    early = [n for n in nodes if n.name in EARLY]
    rest = [n for n in nodes if n.name not in EARLY]
    at = next(k for k, n in enumerate(rest) if n.name == "/loss_grad/Expand") + 1
    del model.graph.node[:]
    model.graph.node.extend(rest[:at] + early + rest[at:])
    return model


def _position(result, name: str) -> int:
    return [n.name for n in result.graph.nodes].index(name)


def test_only_backward_nodes_the_seed_does_not_reach_are_seedless():
    g = Graph.from_model(_early_mask_model())
    a = analyse(g)
    movable = [not f for f in a.phases.is_forward]
    free = {g.nodes[i].name for i, s in enumerate(seedless(g, movable)) if s}
    assert set(EARLY) <= free
    assert not free & {"/loss_grad/Expand", "/layers.0/Mul_grad", "/layers.3/MatMul_wgrad"}
    assert not any(seedless(g, [False] * len(g.nodes)))


def _plan(a) -> Plan:
    return Plan([Region("r", {i for i, n in enumerate(a.graph.nodes) if n.name == RECOMPUTED})], "test")


def test_a_seedless_mask_waits_for_its_reader_and_the_peak_falls(monkeypatch):
    model = _early_mask_model()
    a = analyse(Graph.from_model(model))
    waited = rewrite(a, _plan(a))
    assert waited.recompute_flops > 0
    assert _position(waited, EARLY[1]) + 1 == _position(waited, "/layers.0/Mul_grad")
    with monkeypatch.context() as m:
        m.setattr(schedule, "seedless", lambda graph, movable: [False] * len(graph.nodes))
        early = rewrite(a, _plan(a))
    # 3.08 MB against 3.28 MB with the mask made at the backward's start (the file: 3.74 MB)
    assert waited.after.working_peak_bytes < early.after.working_peak_bytes < a.working_peak_bytes
    assert early.after.working_peak_bytes - waited.after.working_peak_bytes >= 256 * 256 * 4 // 2


def test_without_copies_the_order_is_not_offered():
    a = analyse(Graph.from_model(_early_mask_model()))
    reordered = rewrite(a, None)
    assert _position(reordered, EARLY[1]) + 1 < _position(reordered, "/layers.0/Mul_grad")


def test_the_waiting_order_measures_lower_on_ort_with_the_same_outputs(monkeypatch):
    model = _early_mask_model()
    options = ckpt_cli.CheckOptions(runs=1)
    waited = ckpt_cli.rewrite_model(model, regions=[RECOMPUTED])
    with monkeypatch.context() as m:
        m.setattr(schedule, "seedless", lambda graph, movable: [False] * len(graph.nodes))
        early = ckpt_cli.rewrite_model(model, regions=[RECOMPUTED])
    checks = [ckpt_cli.check_models(model, r.model, options=options).to_json() for r in (waited, early)]
    assert all(c["passed"] and c["outputs_equal"] for c in checks)
    assert checks[0]["rewritten"]["peak_bytes"] < checks[1]["rewritten"]["peak_bytes"]
