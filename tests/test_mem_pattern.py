"""The input that turns ORT's memory pattern off from inside the written file
(rewrite/mem_pattern.py, opt-in with --mem-pattern-off): ORT honours it in a plain
InferenceSession, nobody has to feed it, ckpt's own tools read such files, and the
rewrite of every sample then measures below the original in a plain session. By default
the model's inputs are kept: the default plan is judged in a plain session with the
pattern on instead (verify/plain_choice.py, tests/test_plain_choice.py)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from sessions import make_feeds, measure
from conftest import SAMPLES
from ckpt_cli.analysis import analyse
from ckpt_cli.analysis.pattern import pattern_allowed, predict_plain, predict_unpatterned
from ckpt_cli.api import rewrite_model
from ckpt_cli.cli import main
from ckpt_cli.io.load import load_graph
from ckpt_cli.markers import MEM_PATTERN_META, PATTERN_OFF_INPUT
from ckpt_cli.rewrite.mem_pattern import is_ort_artifact, pattern_off
from ckpt_cli.io.session import recorded_settings
from ckpt_cli.verify.feeds import make_feeds as ckpt_feeds

SAMPLE_NAMES = ["gpt", "cnn", "mlp", "resnet18"]


@functools.lru_cache(maxsize=None)
def _written(name: str, tmp: str):
    out = Path(tmp) / f"{name}.ckpt.onnx"
    result = rewrite_model(SAMPLES / f"{name}.onnx", out, keep_mem_pattern=False)
    feeds = Path(tmp) / f"{name}.npz"
    make_feeds(SAMPLES / f"{name}.onnx", feeds)
    return out, result, feeds


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("mem_pattern"))


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_pattern_off_rewrite_turns_it_off_where_it_predicts_less(name, workdir):
    out, result, _ = _written(name, workdir)
    off = result.result.pattern_off
    # On every sample the pattern costs a plain session memory (its block takes a whole
    # power-of-two arena region), so every --mem-pattern-off rewrite turns it off, the written-unchanged
    # ones (mlp, resnet18) included.
    assert off is not None and off.without_pattern_bytes < off.with_pattern_bytes
    model = onnx.load(str(out))
    onnx.checker.check_model(model, full_check=True)
    added = [v for v in model.graph.input if v.name == off.input]
    assert off.input == PATTERN_OFF_INPUT and len(added) == 1
    assert added[0].type.WhichOneof("value") == "optional_type"
    assert not any(off.input in n.input for n in model.graph.node)  # no node reads it
    assert {p.key: p.value for p in model.metadata_props}[MEM_PATTERN_META] == off.input
    # ckpt's plain-session model knows ORT's rule: the written file predicts without the pattern
    written = analyse(load_graph(str(out)))
    assert not pattern_allowed(written.graph)
    assert predict_plain(written.graph, written.tensors) == predict_unpatterned(written.graph, written.tensors)
    assert predict_plain(written.graph, written.tensors).peak_in_use_bytes == off.without_pattern_bytes
    assert recorded_settings(out)["enable_mem_pattern"] is False


@pytest.mark.slow
@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_plain_session_measures_below_the_original(name, workdir):
    out, result, feeds = _written(name, workdir)
    original = measure(SAMPLES / f"{name}.onnx", "plain", feeds)["peak_bytes"]
    outputs = f"{workdir}/{name}.plain.npz"
    plain = measure(out, "plain", feeds, outputs=outputs)["peak_bytes"]
    # A session with the pattern off explicitly runs the same: the input did it.
    assert measure(out, "default_all", feeds)["peak_bytes"] == plain
    ratio = plain / original
    # Measured (ORT 1.31.1 CPU): gpt 0.37x (the default judged in this session takes its
    # lowest peak); every sample must be below 1.00x.
    assert ratio < (0.5 if name == "gpt" else 1.0), (name, plain, original)
    # ckpt's prediction leaves ORT_ENABLE_ALL's fusions out; on these samples they only lower
    # the peak (gpt -1.3%, resnet18 -7%, mlp -23%: Gemm fusions drop whole intermediates).
    assert plain <= 1.1 * result.result.pattern_off.without_pattern_bytes
    # the outputs are the original's, bit for bit, in the same plain session
    reference = f"{workdir}/{name}.original.npz"
    measure(SAMPLES / f"{name}.onnx", "plain", feeds, outputs=reference)
    a, b = dict(np.load(outputs)), dict(np.load(reference))
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_nobody_has_to_feed_it(workdir):
    import onnxruntime as ort

    out, _, feeds = _written("gpt", workdir)
    arrays = dict(np.load(feeds))
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    left_out = session.run(None, arrays)
    # a feed loop over session.get_inputs() that gives every input an array still runs
    fed = session.run(None, {**arrays, PATTERN_OFF_INPUT: np.zeros((), np.float32)})
    assert all(np.array_equal(x, y) for x, y in zip(left_out, fed))
    assert PATTERN_OFF_INPUT not in ckpt_feeds(onnx.load(str(out)))


def test_default_and_no_pin_add_nothing(tmp_path):
    for flags in ([], ["--keep-mem-pattern"], ["--no-pin", "--mem-pattern-off"]):
        out = tmp_path / "gpt.onnx"
        done = CliRunner().invoke(main, ["rewrite", str(SAMPLES / "gpt.onnx"), "-o", str(out), "--force", "--json",
                                         *flags])
        assert done.exit_code == 0, done.output
        assert json.loads(done.stdout)["mem_pattern_off"] is None
        model = onnx.load(str(out))
        assert [v.name for v in model.graph.input] == [v.name for v in onnx.load(str(SAMPLES / "gpt.onnx")).graph.input]
        assert MEM_PATTERN_META not in {p.key for p in model.metadata_props}


def test_report_and_session_snippet_say_so(tmp_path):
    out = tmp_path / "gpt.ckpt.onnx"
    done = CliRunner().invoke(main, ["rewrite", str(SAMPLES / "gpt.onnx"), "-o", str(out), "--json",
                                     "--mem-pattern-off"])
    off = json.loads(done.stdout)["mem_pattern_off"]
    assert off["input"] == PATTERN_OFF_INPUT
    assert off["predicted_plain_without_pattern_bytes"] < off["predicted_plain_with_pattern_bytes"]
    text = CliRunner().invoke(main, ["session", str(out)]).output
    assert PATTERN_OFF_INPUT in text and "so.enable_mem_pattern = False" in text


def test_not_for_ort_artifacts_or_graphs_that_have_it_off_already(tmp_path):
    artifact = analyse(load_graph(SAMPLES / "ort_artifact" / "training_model.onnx"))
    assert is_ort_artifact(artifact.graph)  # the Module API would count the input as a user input
    assert pattern_off(artifact.graph, artifact.tensors) is None
    a = analyse(load_graph(SAMPLES / "gpt.onnx"))
    assert pattern_off(a.graph, a.tensors) is not None
    model = onnx.load(str(SAMPLES / "gpt.onnx"))
    tensor = onnx.helper.make_tensor_type_proto(onnx.TensorProto.FLOAT, None)
    model.graph.input.append(onnx.helper.make_value_info("x_opt", onnx.helper.make_optional_type_proto(tensor)))
    onnx.save(model, tmp_path / "gpt_opt.onnx")
    b = analyse(load_graph(tmp_path / "gpt_opt.onnx"))
    assert not pattern_allowed(b.graph) and pattern_off(b.graph, b.tensors) is None


def test_no_gain_line_says_what_was_written():
    """A graph written unchanged for lack of a plan that helps says whether the switch went in."""
    with_switch = rewrite_model(SAMPLES / "mlp.onnx", keep_mem_pattern=False).result
    assert with_switch.no_gain and with_switch.pattern_off is not None
    assert "wrote the graph unchanged but for the input that turns ORT's memory pattern off" in with_switch.no_gain_reason
    without = rewrite_model(SAMPLES / "mlp.onnx").result
    assert without.pattern_off is None
    assert "wrote the graph unchanged (run it as the original" in without.no_gain_reason
    assert with_switch.no_gain_reason.startswith(without.no_gain)


@pytest.mark.slow
def test_plain_session_lowest_peak_is_half_the_original_on_gpt(workdir):
    out = Path(workdir) / "gpt.min-peak.onnx"
    rewrite_model(SAMPLES / "gpt.onnx", out, auto="min-peak", keep_mem_pattern=False)
    feeds = Path(workdir) / "gpt.min-peak.npz"
    make_feeds(SAMPLES / "gpt.onnx", feeds)
    ratio = measure(out, "plain", feeds)["peak_bytes"] / measure(SAMPLES / "gpt.onnx", "plain", feeds)["peak_bytes"]
    assert ratio < 0.5, ratio
