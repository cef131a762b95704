"""Outputs that are not bit-identical pass only where the kernel computing them varies
between runs of the original itself (CUDA's nondeterministic kernels); on a
deterministic provider they still fail."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest

from ckpt_cli.verify import driver
from ckpt_cli.verify.feeds import make_feeds, save_feeds
from ckpt_cli.verify.records import OrderCheck, OutputComparison, RunToRun, Spread
from ckpt_cli.verify.rules import judge as _judge
from ckpt_cli.verify.stage import (CheckFigures, MeasuredRuns, Measurement, OutputFigures, PredictionFigures,
                                   _kernel_of, _spread_verdict)

MLP = Path(__file__).resolve().parent.parent / "sample_models" / "mlp.onnx"


@pytest.fixture(scope="module")
def mlp_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rr")
    feeds = tmp / "feeds.npz"
    save_feeds(feeds, make_feeds(onnx.load(str(MLP)), 0))
    out = tmp / "o.npz"
    driver.run_model(MLP, feeds, provider="cpu", runs=1, outputs_path=out)
    return tmp, feeds, driver._load_npz(out)


@pytest.fixture(scope="module")
def grads():
    model = onnx.load(str(MLP))
    names = [o.name for o in model.graph.output if o.name.endswith("_grad")]
    return model, names


def _judged(mlp_run, model, r_vals):
    tmp, feeds, o_vals = mlp_run
    options = driver.PairOptions(worker=driver.WorkerOptions(timeout=120))
    spread = driver._run_to_run_spread(driver._Pair(MLP, MLP, feeds, "cpu", options, str(tmp)), o_vals, r_vals)
    return _spread_verdict(spread, model)


def test_a_real_difference_on_a_deterministic_provider_is_not_excused(mlp_run, grads):
    model, names = grads
    o_vals = mlp_run[2]
    r_vals = dict(o_vals, **{names[0]: o_vals[names[0]] + np.float32(1e-7)})
    rr = _judged(mlp_run, model, r_vals)
    assert rr.unexplained == (names[0],) and not rr.accepted
    assert rr.n_varying_in_original == 0 and rr.varying_kernels == {}


def test_a_difference_from_a_kernel_that_varies_in_the_original_is_accepted(mlp_run, grads, monkeypatch):
    model, names = grads
    tmp, feeds, o_vals = mlp_run
    # Two outputs computed by the same kind of kernel; a second run of the original varies
    # only on the first (as one CUDA run does), the rewrite only on the second.
    producer = {o: n for n in model.graph.node for o in n.output}
    by_kernel: dict[str, list[str]] = {}
    for n in names:
        by_kernel.setdefault(_kernel_of(producer, n), []).append(n)
    same = next(v for v in by_kernel.values() if len(v) >= 2)
    wobble = {same[0]: o_vals[same[0]] + np.float32(2e-9)}

    def fake_run(model_path, feeds_path, *, outputs_path, **kw):
        np.savez(outputs_path, **dict(o_vals, **wobble))
        return {}

    monkeypatch.setattr(driver, "run_model", fake_run)
    rr = _judged(mlp_run, model, dict(o_vals, **{same[1]: o_vals[same[1]] + np.float32(3e-9)}))
    assert rr.accepted and rr.outputs[same[1]].accepted and rr.n_varying_in_original == 1
    # Far beyond the spread and the default tolerance: not excused.
    rr = _judged(mlp_run, model, dict(o_vals, **{same[1]: o_vals[same[1]] + np.float32(1e-3)}))
    assert rr.unexplained == (same[1],)


def _figures(rr: RunToRun) -> CheckFigures:
    run = Measurement(None, None, None, None, "profiler", [])
    return CheckFigures(
        provider="cuda", ort_version=None, enable_mem_reuse=True,
        outputs=OutputFigures(False, False, None, 2e-9, {"w_grad": OutputComparison(False, False)}, run_to_run=rr),
        measured=MeasuredRuns(run, run, None, None, None), order=OrderCheck(True),
        prediction=PredictionFigures({}, {}, {}, {}, 0.1))


def test_judge_names_the_kernel_and_fails_an_unexplained_output(grads):
    model, names = grads
    spread = {names[0]: Spread(1e-9, 2e-9, within_tolerance=True, bit_identical=False)}
    rr = _spread_verdict(spread, model)
    assert rr is not None
    kernel = rr.outputs[names[0]].kernel
    assert kernel and kernel not in ("Reshape", "Identity", "Transpose") and rr.accepted
    f = _judge(_figures(rr), tolerant=False)
    assert f.codes == ["outputs_match_within_spread"] and kernel in f.notes[0]
    f = _judge(_figures(replace(rr, unexplained=(names[0],))), tolerant=False)
    assert f.codes == ["outputs_match"] and names[0] in f.failures[0]
