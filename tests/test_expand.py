"""Function ops ORT has no kernel for are planned as ORT runs them (ckpt_cli/ort/expand.py):
the synthetic transformer's SoftmaxCrossEntropyLoss is expanded at load, so the written
order is the executed order and the prediction holds."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper
import pytest

from conftest import SAMPLES
from ckpt_cli.analysis import analyse
from ckpt_cli.io.load import load_graph
from ckpt_cli.planning import choose_plan
from ckpt_cli.rewrite import rewrite
from ckpt_cli.io.written import to_model
from ckpt_cli.io.save import save_model

from sessions import make_feeds, measure
from synthetic import build_transformer

LOSS = "/loss/SoftmaxCrossEntropyLoss"


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    path = tmp_path_factory.mktemp("expand") / "synthetic.onnx"
    onnx.save(build_transformer(2), path)
    return path


def test_loss_function_is_expanded_where_it_was(synthetic):
    original = onnx.load(str(synthetic))
    ops = [n.op_type for n in original.graph.node]
    g = load_graph(synthetic)
    assert "SoftmaxCrossEntropyLoss" in ops and "SoftmaxCrossEntropyLoss" not in [n.op_type for n in g.nodes]
    expanded = [n for n in g.nodes if n.name.startswith(LOSS + "/")]
    assert len(expanded) == len(g.nodes) - len(ops) + 1 > 1
    at = ops.index("SoftmaxCrossEntropyLoss")
    assert [n.index for n in expanded] == list(range(at, at + len(expanded)))  # in the op's place
    assert "loss" in {t for n in expanded for t in n.outputs}


def test_graphs_ort_runs_as_they_are_stay_the_same():
    g = load_graph(SAMPLES / "gpt.onnx")
    assert [n.name for n in g.nodes] == [n.name for n in onnx.load(str(SAMPLES / "gpt.onnx")).graph.node]


@pytest.mark.slow
def test_expanded_rewrite_runs_in_the_written_order(synthetic, tmp_path):
    a = analyse(load_graph(synthetic))
    result = rewrite(a, choose_plan(a))
    out, feeds = tmp_path / "r.onnx", tmp_path / "feeds.npz"
    save_model(to_model(result), out)
    make_feeds(synthetic, feeds)
    measured = measure(out, "ckpt", feeds)
    assert measured["executed"] == [n.name for n in result.graph.nodes if n.op_type != "Constant"]
    predicted = result.after.arena_in_use(result.mem_reuse)
    assert abs(measured["peak_bytes"] - predicted) <= 0.10 * measured["peak_bytes"]


def _two_losses_and_a_constant() -> onnx.ModelProto:
    h, T = onnx.helper, onnx.TensorProto
    nodes = [h.make_node("Constant", [], ["c"], value=h.make_tensor("v", T.FLOAT, [], [2.0]), name="k"),
             h.make_node("Mul", ["x", "c"], ["y"], name="m"),
             h.make_node("SoftmaxCrossEntropyLoss", ["y", "lab"], ["loss", "lp"], name="sce"),
             h.make_node("SoftmaxCrossEntropyLoss", ["y", "lab"], ["loss2"], name="sce2", reduction="sum"),
             h.make_node("Relu", ["lp"], ["r"], name="relu")]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [4, 3]),
                                  h.make_tensor_value_info("lab", T.INT64, [4])],
                     [h.make_tensor_value_info(t, T.FLOAT, None) for t in ("loss", "loss2", "r")])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("which", ["synthetic", "constant"])
def test_the_excerpt_expands_as_the_whole_graph(which, synthetic, monkeypatch):
    """ORT resolves only the function ops (and Constants, other domains) for speed: the
    result is byte for byte what resolving the whole graph gives."""
    from ckpt_cli.ort import expand
    from ckpt_cli.graph import Graph

    model = onnx.load(str(synthetic)) if which == "synthetic" else _two_losses_and_a_constant()

    def expanded() -> bytes:
        expand._RUN_AS_IS.clear()
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        return expand.expand_functions(Graph.from_model(copy)).model.SerializeToString(deterministic=True)

    resolved = []
    real = expand._resolved
    monkeypatch.setattr(expand, "_resolved", lambda m: resolved.append(len(m.graph.node)) or real(m))
    fast = expanded()
    assert len(resolved) == 1 and resolved[0] < len(model.graph.node), "one ORT session, of an excerpt"
    monkeypatch.setattr(expand, "_excerpt", lambda graph, functions: None)
    assert fast == expanded() != model.SerializeToString(deterministic=True)


def test_what_ort_runs_as_it_is_is_remembered_per_element_type(tmp_path):
    """ORT's CPU provider has a float64 ReduceSumSquare kernel and no float16 one: after a
    float64 graph, a float16 graph in the same process must still get ORT's expansion (the
    cache of ops ORT runs as they are was keyed without the type, and the float16 file was
    written differently from what a fresh process writes)."""
    from ckpt_cli.graph import Graph
    from ckpt_cli.ort import expand

    def reduce_sum_square(dtype: int) -> onnx.ModelProto:
        g = helper.make_graph([helper.make_node("ReduceSumSquare", ["x"], ["y"], name="rss", keepdims=0)], "g",
                              [helper.make_tensor_value_info("x", dtype, [4, 4])],
                              [helper.make_tensor_value_info("y", dtype, [])])
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)

    def ops(dtype: int) -> list[str]:
        return [n.op_type for n in expand.expand_functions(Graph.from_model(reduce_sum_square(dtype))).nodes]

    expand._RUN_AS_IS.clear()
    alone = ops(TensorProto.FLOAT16)
    assert alone != ["ReduceSumSquare"], "ORT expands the float16 op: the case under test"
    assert ops(TensorProto.DOUBLE) == ["ReduceSumSquare"]
    assert ops(TensorProto.FLOAT16) == alone
