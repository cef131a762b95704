"""Never worse by default: a default plan that lowers nothing is dropped for the reordered
graph with a one-line reason; a user's plan is kept with a warning; ORT's DEFAULT order is
one of the orders the rewrite can write."""

from __future__ import annotations

from conftest import SAMPLES
from ckpt_cli.analysis import analyse
from ckpt_cli.analysis.arena import predict_in_use
from ckpt_cli.load import load_graph
from ckpt_cli.pipeline import make_plan, rewrite_plan
from ckpt_cli.rewrite import original_best


def _analysis(name: str):
    return analyse(load_graph(SAMPLES / f"{name}.onnx"))


def test_default_plan_that_lowers_nothing_is_dropped_with_its_reason():
    a = _analysis("mlp")  # per-layer recompute predicts 964 KiB against 908 KiB with buffer reuse off
    planned = make_plan(a)
    assert planned.plan.regions
    result = rewrite_plan(a, planned)
    best, how = original_best(a)
    assert result.recompute_nodes == 0 and not result.regions
    assert result.no_gain_reason and how in result.no_gain_reason and "\n" not in result.no_gain_reason
    assert result.warning is None
    # The reordered graph is no worse than ORT's DEFAULT order of the original.
    assert result.after.arena_in_use(result.mem_reuse) <= predict_in_use(a.graph, a.default, a.tensors).peak_in_use_bytes


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
