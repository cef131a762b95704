"""Library calls with ordinary bad arguments: one clear TypeError or ValueError at the call,
before any work, never an AttributeError from deep inside or a silent misreading."""

from __future__ import annotations

import onnx
import pytest
from click.testing import CliRunner
from conftest import SAMPLES

import ckpt_cli
from ckpt_cli.cli import main

MLP = SAMPLES / "mlp.onnx"

BAD_CALLS = {
    "regions of a number": (lambda: ckpt_cli.rewrite_model(MLP, regions=[5]), TypeError, "regions: expected a string"),
    "regions as one string": (lambda: ckpt_cli.rewrite_model(MLP, regions="layers*"), TypeError,
                              "expected a list of strings, got str"),
    "boundaries as one string": (lambda: ckpt_cli.plan_model(MLP, boundaries="x:y"), TypeError, "list of strings"),
    "grad_outputs as one string": (lambda: ckpt_cli.inspect_model(MLP, grad_outputs="head.weight_grad"), TypeError,
                                   "list of strings"),
    "dims as a list": (lambda: ckpt_cli.inspect_model(MLP, dims=["batch=2"]), TypeError, "mapping"),
    "negative timeout": (lambda: ckpt_cli.check_models(MLP, MLP, options=ckpt_cli.CheckOptions(timeout=-5)),
                         ValueError, "--timeout -5"),
    "negative timeout of rewrite's check": (
        lambda: ckpt_cli.rewrite_model(MLP, check=ckpt_cli.CheckOptions(timeout=-5)), ValueError, "--timeout"),
    "negative timeout of --ort-optimize": (lambda: ckpt_cli.rewrite_model(MLP, ort_optimize="cpu", timeout=-5),
                                           ValueError, "--timeout -5"),
    "no runs": (lambda: ckpt_cli.check_models(MLP, MLP, options=ckpt_cli.CheckOptions(runs=0)), ValueError, "--runs"),
    "unknown provider": (lambda: ckpt_cli.check_models(MLP, MLP, options=ckpt_cli.CheckOptions(provider="tpu")),
                         ValueError, "provider 'tpu'"),
    "a number for the model": (lambda: ckpt_cli.inspect_model(5), TypeError, "path or an onnx.ModelProto"),
    "options for the output": (lambda: ckpt_cli.rewrite_model(MLP, ckpt_cli.PlanOptions()), TypeError,
                               "output: expected a path"),
    "check of another type": (lambda: ckpt_cli.rewrite_model(MLP, check="yes"), TypeError, "check:"),
}


@pytest.mark.parametrize("call, error, words", BAD_CALLS.values(), ids=BAD_CALLS.keys())
def test_bad_arguments_raise_one_clear_error(call, error, words):
    with pytest.raises(error, match=None) as info:
        call()
    assert words in str(info.value) and "\n" not in str(info.value)


def test_session_options_of_a_model_proto_names_the_type_not_the_model():
    pytest.importorskip("onnxruntime")
    with pytest.raises(TypeError) as info:
        ckpt_cli.session_options(onnx.load(str(MLP)))
    assert len(str(info.value)) < 100 and "ModelProto" in str(info.value)


def test_a_budget_in_bytes_is_a_number_of_bytes():
    peak = ckpt_cli.inspect_model(MLP).report["peak_bytes"]
    with pytest.raises(ckpt_cli.errors.BudgetUnreachable, match="976.6 KiB"):
        ckpt_cli.plan_model(MLP, budget=1000000)
    assert ckpt_cli.plan_model(MLP, budget=peak).planned.budget == peak


@pytest.mark.parametrize("option", [["--region", "re:\udcff"], ["--region", "layers\udcff*"],
                                    ["--regions-by-scope", "a(\udcff)"]])
def test_patterns_that_are_not_utf8_are_usage_errors(tmp_path, option):
    """A command-line word in another encoding reaches Python with its bytes as surrogates."""
    r = CliRunner().invoke(main, ["rewrite", str(MLP), "-o", str(tmp_path / "o.onnx"), *option])
    assert r.exit_code == 2, r.output
    assert r.stderr.splitlines() == [f"ckpt: error: {option[0]} '{option[1].replace(chr(0xdcff), chr(92) + 'xff')}'"
                                     " is not UTF-8 text; node and tensor names are"]
