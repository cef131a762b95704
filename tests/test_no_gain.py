"""Never worse by default: a default plan that lowers nothing is dropped for the unchanged
graph with a one-line reason; a user's plan is kept with a warning; ORT's DEFAULT order is
one of the orders the rewrite can write."""

from __future__ import annotations

from conftest import SAMPLES
from ckpt_cli.analysis import analyse
from ckpt_cli.io.load import load_graph
from ckpt_cli.rewrite.select import make_plan, rewrite_plan
from ckpt_cli.rewrite import original_best


def _analysis(name: str):
    return analyse(load_graph(SAMPLES / f"{name}.onnx"))


def test_default_plan_that_lowers_nothing_is_dropped_with_its_reason(tmp_path):
    """mlp: no plan's predicted peak is below the original's under its best settings (ORT's
    defaults fuse it best), so the graph is written unchanged, for ORT's default session:
    every session then runs it exactly as it runs the original (a reordered file ran 1.31x
    the original in a plain session)."""
    import ckpt_cli
    from ckpt_cli.io.written import to_model

    a = _analysis("mlp")
    result = rewrite_plan(a, make_plan(a))
    best, how = original_best(a)
    assert result.recompute_nodes == 0 and not result.regions
    assert result.no_gain_reason and how in result.no_gain_reason and "\n" not in result.no_gain_reason
    assert result.warning is None
    assert [n.name for n in result.graph.nodes] == [n.name for n in a.graph.nodes]  # unchanged
    model = to_model(result)
    assert [n.name for n in model.graph.node] == [n.name for n in a.graph.model.graph.node]
    path = tmp_path / "mlp.ckpt.onnx"
    path.write_bytes(model.SerializeToString())
    import onnxruntime as ort

    so = ckpt_cli.session_options(path)
    assert so.execution_order == ort.ExecutionOrder.DEFAULT
    assert so.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL


def test_a_users_plan_that_raises_the_peak_is_kept_with_a_warning():
    a = _analysis("mlp")
    planned = make_plan(a, patterns=["re:^node_(addmm|relu)"])
    result = rewrite_plan(a, planned)
    assert result.recompute_nodes > 0 and result.no_gain_reason is None
    assert result.warning and "not below the original's" in result.warning


def test_a_plan_that_lowers_the_peak_is_written():
    a = _analysis("gpt")
    result = rewrite_plan(a, make_plan(a))
    assert result.recompute_nodes > 0 and result.no_gain_reason is None and result.warning is None
    assert result.after.arena_in_use(result.mem_reuse) < original_best(a)[0]
