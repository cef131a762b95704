"""Each rule of ``ckpt check``'s verdict fails the check when its premise fails.

Every test here breaks one premise on real ORT runs of the gpt sample and its rewrite
(CPU, ORT's profiler) and asserts the code of that rule's failure: removing the rule from
``verify/rules.py`` makes its test fail (checked once per rule when they were written).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from conftest import SAMPLES

from ckpt_cli import api, check_models, rewrite_model
from ckpt_cli.verify.compare import order_check
from ckpt_cli.verify.figures import CheckFigures
from ckpt_cli.verify.stage import check_files, predict

pytestmark = pytest.mark.slow
GPT = SAMPLES / "gpt.onnx"


@pytest.fixture(scope="module")
def rewritten(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("verdict") / "gpt.ckpt.onnx"
    rewrite_model(GPT, out)
    return out


def _judged(original: Path, rewritten: Path, change) -> CheckFigures:
    """A check whose rewritten prediction went through ``change``."""
    loaded = {k: api.analyse_input(api.load_input(p)) for k, p in (("original", original), ("rewritten", rewritten))}
    reuse = loaded["rewritten"].reuse_buffers
    predicted = {k: predict(a, reuse) for k, a in loaded.items()}
    predicted["rewritten"] = change(predicted["rewritten"])
    options = api.CheckOptions(provider="cpu", runs=1)
    return check_files(original, rewritten, predicted, options, enable_mem_reuse=reuse)


def test_the_unchanged_premises_pass(rewritten):
    assert _judged(GPT, rewritten, lambda p: p).failures == []


def test_a_rewrite_above_the_original_fails(rewritten):
    """The original checked as if it were the rewrite of its own rewrite: its peak is higher."""
    result = check_models(rewritten, GPT)
    assert not result.passed
    assert "peak_not_raised" in result.figures.codes, result.figures.failures
    assert result.figures.memory_lower is False


def _for_ort_defaults(src: Path, dst: Path) -> Path:
    """A copy of ``src`` that records ORT's defaults as the session it is run in."""
    import onnx

    from ckpt_cli.markers import SessionPlan

    model = onnx.load(src)
    for key, value in SessionPlan(session="ort_default").to_metadata().items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.save(model, dst)
    return dst


def test_a_rewrite_above_the_original_in_the_users_session_fails(rewritten, tmp_path):
    """The original checked as the rewrite of its rewrite, recorded as run under ORT's defaults
    (as ORT artifacts and files ckpt wrote for them are): its peak there is higher. Recorded
    for ckpt's settings, the same pair only gets the note that the defaults save nothing."""
    options = api.CheckOptions(provider="cpu", runs=1)
    judged = check_models(rewritten, _for_ort_defaults(GPT, tmp_path / "gpt.defaults.onnx"), options=options).figures
    assert judged.user_session == "ort_default"
    assert "user_session_not_raised" in judged.codes, judged.failures
    plain = check_models(rewritten, GPT, options=options).figures
    assert plain.user_session == "ckpt" and "user_session_not_raised" not in plain.codes
    assert "default_session_saving_note" in plain.codes, plain.notes


def test_another_executed_order_fails(rewritten):
    """ckpt's simulation assumed another order than the one ORT ran."""
    f = _judged(GPT, rewritten, lambda p: replace(p, order=tuple(reversed(p.order))))
    assert "order_followed" in f.codes, f.failures


def test_a_prediction_far_off_fails(rewritten):
    f = _judged(GPT, rewritten, lambda p: replace(p, tensor_bytes=int(p.tensor_bytes * 1.5)))
    assert "prediction_holds" in f.codes and any("rewritten peak prediction" in x for x in f.failures), f.failures


def test_a_node_ort_never_ran_fails(rewritten):
    """A node of the schedule ORT did not run: the schedule judged is not what ran."""
    f = _judged(GPT, rewritten, lambda p: replace(p, order=p.order + ("/never/ran",)))
    assert "ran_every_file_node" in f.codes and any("(e.g. /never/ran)" in x for x in f.failures), f.failures


def test_constants_and_unnamed_nodes_are_not_judged():
    order = order_check(["c", "", "a", "b"], ["a", "b"], kernelless={"c"})
    assert order.matches and order.n_not_executed == 0
    assert order_check(["a", "b", "x"], ["a", "b"]).not_executed == ("x",)


def test_nodes_ort_ran_outside_the_file_are_named_by_op(rewritten):
    """ORT ran nodes the schedule does not have (an expansion, a fusion): the check counts
    them per op type, as the profiler names their kernels (a note while the peak stays within
    the prediction error, test_verdict_rule_figures.py has the failing side)."""
    a = api.analyse_input(api.load_input(rewritten))
    dropped = [a.graph.nodes[i] for i in a.priority.order[-2:]]
    f = _judged(GPT, rewritten, lambda p: replace(p, order=p.order[:-2]))
    failures = f.failures + f.notes
    types = [n.op_type for n in dropped]
    ops = ", ".join(f"{op} x{types.count(op)}" for op in sorted(dict.fromkeys(types), key=lambda o: -types.count(o)))
    named = [f for f in failures if f.startswith("ONNX Runtime ran 2 nodes that are not in the file")]
    assert named and f"({ops}; e.g." in named[0], (ops, failures)
