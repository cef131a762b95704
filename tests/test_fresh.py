"""Fresh tensors (rewrite/fresh.py): the pinned GPT rewrite hides exactly the chosen tensors'
shapes from ORT, ckpt's re-analysis of the written file agrees, and with ORT's buffer reuse
on (its default) ckpt's model still equals ORT's profiler at every node."""

from __future__ import annotations

import functools
import json
from unittest import mock

import onnx

from conftest import SAMPLES
from ckpt_cli.analysis import analyse, schedules
from ckpt_cli.analysis.arena import predict_in_use
from ckpt_cli.analysis.memory import simulate
from ckpt_cli.io.load import load_graph
from ckpt_cli.planning import choose_plan
from ckpt_cli.rewrite import rewrite
from ckpt_cli.io.written import to_model
from ckpt_cli.markers import FRESH_META
from ckpt_cli.rewrite import fresh
from ckpt_cli.rewrite.fresh import apply
from ckpt_cli.io.save import save_model
from ckpt_cli.verify.feeds import make_feeds
from ort_profile import node_memory_in_child


@functools.lru_cache(maxsize=None)
def _gpt():
    a = analyse(load_graph(str(SAMPLES / "gpt.onnx")))
    return a, rewrite(a, choose_plan(a))


def test_fresh_tensors_are_the_ones_ort_cannot_size(tmp_path):
    _, result = _gpt()
    assert result.fresh is not None and result.fresh.fresh
    path = tmp_path / "gpt.ckpt.onnx"
    model = to_model(result)
    save_model(model, path)
    assert {p.key: p.value for p in model.metadata_props}[FRESH_META] == str(len(result.fresh.fresh))
    onnx.checker.check_model(model, full_check=True)
    # Re-analysing the file (what ckpt check does) finds the same shapes unknown to ORT.
    again = analyse(load_graph(str(path)))
    unknown = {t for t, info in result.after.tensors.items() if info.nbytes is not None and not info.static_shape}
    assert set(result.fresh.fresh) <= unknown
    assert {t for t, info in again.tensors.items() if info.nbytes is not None and not info.static_shape} == unknown


def test_fresh_lowers_the_reuse_on_peak_in_both_orders():
    _, result = _gpt()
    g, tensors = result.graph, result.after.tensors
    # The pinned graph before fresh.py: every shape known to ORT.
    pinned, known = result.pinned.graph, result.pinned.tensors
    for order_of in (lambda x: list(range(len(x.nodes))), schedules.ort_default):
        before = simulate(pinned, order_of(pinned), known, reuse_buffers=True).peak_bytes
        after = simulate(g, order_of(g), tensors, reuse_buffers=True).peak_bytes
        assert after < 0.75 * before, (after, before)
    assert apply(pinned, known, set()).guard_nodes == 0


def test_reuse_on_prediction_equals_ort_at_every_node(tmp_path):
    _, result = _gpt()
    path = tmp_path / "gpt.ckpt.onnx"
    save_model(to_model(result), path)
    g = load_graph(str(path))
    a = analyse(g)
    model = onnx.load(str(path))
    feeds = make_feeds(onnx.load(str(SAMPLES / "gpt.onnx")))
    order = schedules.priority_based(g)
    jobs, predictions = [], []
    for reuse in (True, False):
        predictions.append(predict_in_use(g, simulate(g, order, a.tensors, reuse_buffers=reuse), a.tensors))
        jobs.append((model, feeds, reuse))
    ran = [k for k, i in enumerate(order) if g.nodes[i].op_type != "Constant"]  # ORT runs no kernel for them
    for predicted, measured in zip(predictions, node_memory_in_child(jobs)):
        assert list(measured.names) == [g.nodes[order[k]].name for k in ran]
        # ORT keeps the Constant nodes' few bytes as session initializers in the arena (pin's
        # and fresh.py's zeros), where ckpt counts them as tiny buffers: under 1 KiB apart at
        # every node, where a wrong reuse decision moves a 64 KiB or larger buffer.
        offsets = {m - predicted.timeline_requested[k] for k, m in zip(ran, measured.requested)}
        assert all(0 <= d <= 1024 for d in offsets), offsets


def test_fresh_never_raises_the_recorded_settings_peak_on_ort(tmp_path):
    """The cnn rewrite records enable_mem_reuse=False: fresh tensors gain nothing there, and
    shape guards held across the run split ORT's arena (4.52 -> 5.17 MiB measured before
    unshare checked the recorded settings). Written with and without them, measured."""
    import sys
    from dataclasses import replace

    from conftest import ROOT

    sys.path.insert(0, str(ROOT))
    from sessions import make_feeds as session_feeds, measure

    from ckpt_cli.rewrite.select import make_plan, rewrite_plan

    source = str(SAMPLES / "cnn.onnx")
    a = analyse(load_graph(source))
    result = rewrite_plan(a, make_plan(a), True)  # the default rewrite, as the CLI writes it
    assert not result.mem_reuse and result.fresh.fresh
    bare = replace(result, graph=result.pinned.graph, fresh=None)
    feeds = tmp_path / "feeds.npz"
    session_feeds(source, feeds)
    peaks = {}
    for tag, r in (("fresh", result), ("bare", bare)):
        save_model(to_model(r), tmp_path / f"{tag}.onnx")
        peaks[tag] = measure(tmp_path / f"{tag}.onnx", "ckpt", feeds)["peak_bytes"]
    # ORT makes the guards' Constant nodes session initializers, reserved in the arena.
    constants = sum(result.after.tensors[n.outputs[0]].nbytes for n in result.graph.nodes
                    if n.op_type == "Constant" and n.meta(FRESH_META))
    assert peaks["fresh"] <= peaks["bare"] + constants, (peaks, constants)
    assert peaks["fresh"] < 4.6 * 2**20  # bench/SESSIONS.md before fresh tensors: 4.52 MiB


def test_a_written_file_is_sized_through_its_guards_at_any_batch(tmp_path):
    """Guard views hide their shapes from onnx and ORT (that is their job); ckpt's own
    inference reads them as the tensor they view, so a re-analysis at another batch sizes
    the recompute copies behind them."""
    from click.testing import CliRunner

    from ckpt_cli.cli import main

    out = tmp_path / "bert.onnx"
    src = SAMPLES / "zoo" / "bert17" / "training_model.onnx"
    r = CliRunner().invoke(main, ["rewrite", str(src), "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["pin"]["guard_nodes"] > 0
    for dims in ([], ["--dim", "batch=16"]):
        r = CliRunner().invoke(main, ["inspect", str(out), "--json", *dims])
        assert r.exit_code == 0 and json.loads(r.output)["unsized"] == [], r.output


def test_no_view_goes_in_front_of_a_reshape(tmp_path):
    """ORT 1.25-1.30 refuse a Reshape with a computed shape (a view) feeding a Reshape,
    Squeeze, Unsqueeze or Flatten whose shape they know: such a tensor is not made fresh."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from ckpt_cli.analysis.shapes import infer_tensors
    from ckpt_cli.rewrite.fresh import _viewed

    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Reshape", ["r", "s"], ["v"]),
             helper.make_node("Unsqueeze", ["r", "axes"], ["u"]), helper.make_node("Mul", ["v", "v"], ["y"]),
             helper.make_node("Mul", ["u", "u"], ["z"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6, 4]),
                               helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 4, 6])],
                              [numpy_helper.from_array(np.array([6, 4], np.int64), "s"),
                               numpy_helper.from_array(np.array([0], np.int64), "axes")])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    g = load_graph(str(path))
    tensors, constants = infer_tensors(g, {}), set(g.initializers)
    by_op = {n.op_type: n for n in g.nodes}
    assert _viewed(g, by_op["Relu"], tensors, constants, frozenset()) == [(by_op["Relu"], "x")]
    assert _viewed(g, by_op["Reshape"], tensors, constants, frozenset()) == []
    assert _viewed(g, by_op["Unsqueeze"], tensors, constants, frozenset()) == []


def test_unshared_is_unshare_s_graph_and_tensors_at_any_size():
    """``unshared`` skips unshare's simulation only where unshare leaves the graph as it is:
    gpt's pinned rewrite, below and (the bound lowered) above ``_GREEDY_NODES``."""
    a, result = _gpt()
    forward = frozenset(n.name for n in a.graph.nodes if a.phases.is_forward[n.index])
    pinned, known = result.pinned.graph, result.pinned.tensors
    for bound in (fresh._GREEDY_NODES, len(pinned.nodes) - 1):
        with mock.patch.object(fresh, "_GREEDY_NODES", bound):
            whole = fresh.unshare(pinned, known, result.mem_reuse, forward)
            made = fresh.unshared(pinned, known, result.mem_reuse, forward)
        # None: the graph stays as it is, as unshare leaves it
        graph, tensors = (pinned, known) if made is None else (made.graph, made.tensors)
        assert (made is None) == (bound < len(pinned.nodes))
        assert [n.proto.SerializeToString() for n in graph.nodes] == [n.proto.SerializeToString()
                                                                      for n in whole.graph.nodes]
        assert tensors == whole.tensors
    assert result.fresh is not None and result.fresh.fresh  # below the bound unshare writes guards


def test_the_fresh_tensors_made_with_a_kept_pin_are_written_as_made():
    """The schedule choice that keeps a pin (gpt's default plan, its waiting order) keeps
    the fresh tensors it made for it: pinning the rewrite takes them instead of running
    unshare's greedy again, and writes what that greedy gives."""
    from dataclasses import replace

    from ckpt_cli.rewrite import pinned
    from ckpt_cli.rewrite.select import make_plan

    a = analyse(load_graph(str(SAMPLES / "gpt.onnx")))
    result = make_plan(a).result
    assert result is not None and result.plain_pin is not None and result.plain_pin[2] is not None
    with mock.patch("ckpt_cli.rewrite.unshare", side_effect=AssertionError("made again")):
        kept = pinned(a, result)
    again = pinned(a, replace(result, plain_pin=(*result.plain_pin[:2], None)))
    assert kept.fresh is result.plain_pin[2]
    assert kept.fresh.fresh == again.fresh.fresh and kept.after.tensors == again.after.tensors
    assert [n.proto.SerializeToString() for n in kept.graph.nodes] == [
        n.proto.SerializeToString() for n in again.graph.nodes]


def test_hiding_tensors_in_the_planner_s_facts_walks_as_hiding_them_in_the_tensors():
    """The greedy hides a few more tensors each round in facts made once
    (``TensorFacts.hiding``): the planner gives the buffers it gives when the tensors
    themselves are made unknown to ORT (``unknown_to_ort``), on gpt's pinned rewrite."""
    from ckpt_cli.analysis.lifetimes import lifetimes
    from ckpt_cli.analysis.planner import plan_buffers, tensor_facts
    from ckpt_cli.analysis.shapes import unknown_to_ort

    _, result = _gpt()
    graph, tensors = result.pinned.graph, result.pinned.tensors
    order = list(range(len(graph.nodes)))
    life = lifetimes(graph, order)
    names = graph.ids.names
    backward = [t for n in graph.nodes[len(order) // 2:] for t in graph.ids.outputs[n.index] if t >= 0]
    facts = tensor_facts(graph, tensors)
    for ids in (backward[::7], backward[::3], backward):
        hidden = {**tensors, **{names[t]: unknown_to_ort(tensors[names[t]]) for t in ids if names[t] in tensors}}
        by_tensors = plan_buffers(graph, order, hidden, life)
        by_facts = plan_buffers(graph, order, facts.hiding(ids[: len(ids) // 2]).hiding(ids[len(ids) // 2:]), life)
        assert (by_facts.size, by_facts.born, by_facts.dies, by_facts.holders) == (
            by_tensors.size, by_tensors.born, by_tensors.dies, by_tensors.holders)
    assert by_tensors.size != plan_buffers(graph, order, facts, life).size  # hiding changed the buffers
