"""A graph written unchanged, its inputs kept: where ORT's memory pattern is predicted to
raise a plain session's peak, the report says so (``rewrite.with_pattern_advice``), and ORT
measures the pattern's cost when the file turns it off (``--mem-pattern-off --check``)."""

from __future__ import annotations

import json

import onnx
import pytest
from click.testing import CliRunner

from ckpt_cli.cli import main
from conftest import SAMPLES

MLP = SAMPLES / "mlp.onnx"  # no plan lowers its peak: written unchanged
GPT = SAMPLES / "gpt.onnx"  # rewritten


def _rewrite(tmp_path, model, *args: str) -> dict:
    out = tmp_path / "out.onnx"
    result = CliRunner().invoke(main, ["rewrite", str(model), "-o", str(out), "--json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def unchanged(tmp_path_factory) -> dict:
    return _rewrite(tmp_path_factory.mktemp("advice"), MLP)


def test_the_unchanged_graph_gets_the_advice_and_keeps_its_inputs(unchanged, tmp_path):
    advice = unchanged["mem_pattern_advice"]
    assert unchanged["no_gain_reason"] and unchanged["mem_pattern_off"] is None
    assert advice["predicted_plain_with_pattern_bytes"] > advice["predicted_plain_without_pattern_bytes"] > 0
    said = [n for n in unchanged["plan_notes"] if "memory pattern raises" in n]
    assert len(said) == 1 and "enable_mem_pattern = False" in said[0] and "--mem-pattern-off" in said[0]
    written = onnx.load(unchanged["output"])
    assert [i.name for i in written.graph.input] == [i.name for i in onnx.load(MLP).graph.input]


def test_the_advice_is_what_ort_measures(tmp_path):
    """Turning the pattern off lowers what ORT's defaults hold, measured: the file that turns
    it off against the original, both under ORT's defaults."""
    report = _rewrite(tmp_path, MLP, "--mem-pattern-off", "--check")
    assert report["mem_pattern_off"] is not None and report["mem_pattern_advice"] is None
    check = report["check"]
    assert check["rewritten_ort_default"]["peak_bytes"] < check["original_ort_default"]["peak_bytes"], check


def test_a_rewritten_graph_gets_no_advice(tmp_path):
    report = _rewrite(tmp_path, GPT)
    assert report["no_gain_reason"] is None and report["mem_pattern_advice"] is None
    assert not [n for n in report["plan_notes"] if "memory pattern raises" in n]
