"""Function ops ORT has no kernel for are planned as ORT runs them (ckpt_cli/expand.py):
the synthetic transformer's SoftmaxCrossEntropyLoss is expanded at load, so the written
order is the executed order and the prediction holds."""

from __future__ import annotations

import onnx
import pytest

from conftest import SAMPLES
from ckpt_cli.analysis import analyse
from ckpt_cli.load import load_graph
from ckpt_cli.planning import choose_plan
from ckpt_cli.rewrite import rewrite
from ckpt_cli.written import to_model
from ckpt_cli.save import save_model

from bench.sessions import make_feeds, measure
from bench.synthetic import build_transformer

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
