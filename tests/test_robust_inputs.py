"""Malformed plan files, gates and comparisons are refused with one line (issue 11, item 18)."""

import json

import pytest
from click.testing import CliRunner

from ckpt_cli.cli import main
from ckpt_cli.errors import UsageError
from ckpt_cli.report.conditions import parse_condition

from conftest import SAMPLES


def ckpt(*args) -> tuple[int, str]:
    r = CliRunner().invoke(main, [str(a) for a in args])
    assert "Traceback" not in r.output, r.output
    return r.exit_code, r.output


@pytest.mark.parametrize("plan,message", [
    ({"ckpt_plan": True, "regions": [{"match": "/layers.0/*"}]}, "not supported"),
    ({"ckpt_plan": 1.0, "regions": [{"match": "/layers.0/*"}]}, "not supported"),
    ({"regions": [{"nodes": "/layers.0/MatMul"}]}, "list of names"),
    ({"regions": [{"nodes": ["/layers.0/MatMul"], "keep": "z0"}]}, "list of names"),
    ({"regions": [{"match": ["/layers.0/*"]}]}, "must be a string"),
    ({"regions": [{"nodes": ["/layers.0/MatMul", "/layers.0/Relu"], "keep": ["a1"]}]}, "outside the region"),
    ({"regions": [{"nodes": [1, 2]}]}, "list of names"),
])
def test_malformed_plan_files(chain_path, tmp_path, plan, message):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    code, text = ckpt("rewrite", chain_path, "--plan", path, "-o", tmp_path / "o.onnx")
    assert code == 2 and message in text and text.count("\n") == 1, text
    assert not (tmp_path / "o.onnx").exists()


def test_plan_file_that_is_a_folder(chain_path, tmp_path):
    code, text = ckpt("rewrite", chain_path, "--plan", tmp_path, "-o", tmp_path / "o.onnx")
    assert code == 2, text


def test_keep_inside_the_region_is_accepted(chain_path, tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"regions": [{"nodes": ["/layers.0/MatMul", "/layers.0/Relu"], "keep": ["z0"]}]}))
    assert ckpt("rewrite", chain_path, "--plan", path, "-o", tmp_path / "o.onnx", "-q")[0] == 0


@pytest.mark.parametrize("text", ["x>1e999", "peak_bytes>1e999GiB", "x<-1e400", "ratio(x)>1e999%"])
def test_infinite_gate_values_are_refused(text):
    with pytest.raises(UsageError, match="out of range"):
        parse_condition(text)


def test_compare_refuses_different_models():
    code, text = ckpt("compare", SAMPLES / "mlp.onnx", SAMPLES / "cnn.onnx")
    assert code == 2 and "different models" in text and "sha256" in text


def test_compare_accepts_a_model_and_its_rewrite(tmp_path):
    out = tmp_path / "mlp.ckpt.onnx"
    report = tmp_path / "rewrite.json"
    assert ckpt("rewrite", SAMPLES / "mlp.onnx", "-o", out, "--report", report, "-q")[0] == 0
    code, text = ckpt("compare", SAMPLES / "mlp.onnx", out, report, "-q")
    assert code == 0, text
