"""``ckpt check`` compares outputs as a session returns them: by position, with their element
type and shape; a change of any of these fails, named as such, not as "max |diff| 0.0"."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from conftest import SAMPLES
from onnx import TensorProto, helper

from ckpt_cli.cli import main
from ckpt_cli.verify.compare import compare_outputs

MLP = SAMPLES / "mlp.onnx"


def test_outputs_in_another_order_differ():
    a = {"loss": np.float32(1.0), "g": np.ones(3, np.float32)}
    r = compare_outputs(a, {"g": a["g"], "loss": a["loss"]}, rtol=1e-3, atol=1e-3)
    assert not r["all_within_tolerance"] and not r["all_bit_identical"]
    assert r["outputs"]["loss"]["problem"].startswith("position 0 vs 1")


@pytest.mark.parametrize("candidate, problem", [(np.ones(3, np.float64), "dtype float32 vs float64"),
                                                (np.ones((3, 1), np.float32), "shape [3] vs [3, 1]")])
def test_another_type_or_shape_differs_with_no_diff_to_report(candidate, problem):
    r = compare_outputs({"g": np.ones(3, np.float32)}, {"g": candidate}, rtol=1e-3, atol=1e-3)
    entry = r["outputs"]["g"]
    assert entry["problem"] == problem and not entry["within_tolerance"] and entry["max_abs_diff"] is None
    assert r["max_abs_diff"] is None and not r["all_within_tolerance"]


def _reordered(path) -> None:
    m = onnx.load(str(MLP))
    outputs = list(m.graph.output)
    del m.graph.output[:]
    m.graph.output.extend([outputs[1], outputs[0], *outputs[2:]])
    onnx.save(m, str(path))


def _loss_as_float64(path) -> None:
    m = onnx.load(str(MLP))
    loss = m.graph.output[0].name
    for n in m.graph.node:
        n.input[:] = [loss + "_f32" if t == loss else t for t in n.input]
        n.output[:] = [loss + "_f32" if t == loss else t for t in n.output]
    m.graph.node.append(helper.make_node("Cast", [loss + "_f32"], [loss], to=TensorProto.DOUBLE, name="cast_loss"))
    m.graph.output[0].type.tensor_type.elem_type = TensorProto.DOUBLE
    onnx.save(m, str(path))


@pytest.mark.slow
@pytest.mark.parametrize("make, words", [(_reordered, "position 0 vs 1"),
                                         (_loss_as_float64, "dtype float32 vs float64")])
def test_check_fails_a_rewrite_that_changes_its_outputs(tmp_path, make, words):
    pytest.importorskip("onnxruntime")
    changed = tmp_path / "changed.onnx"
    make(changed)
    r = CliRunner().invoke(main, ["check", str(MLP), str(changed), "--runs", "1", "--rtol", "1e-3", "--json"])
    assert r.exit_code == 1, r.output
    import json

    findings = json.loads(r.stdout)["findings"]
    assert any(x["code"] == "outputs_match_changed" and words in x["text"] for x in findings), findings


def _symbolic_chain_with_feeds(tmp_path, batch: int):
    from chain import chain_model

    m = chain_model(layers=2, batch=8, width=4)
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    path = tmp_path / "sym.onnx"
    onnx.save(m, str(path))
    rng = np.random.default_rng(0)
    feeds = {i.name: rng.standard_normal([d.dim_value or batch for d in i.type.tensor_type.shape.dim])
             .astype(np.float32) for i in m.graph.input}
    np.savez(tmp_path / "feeds.npz", **feeds)
    return path, tmp_path / "feeds.npz"


def test_feeds_at_another_batch_name_the_dimension(tmp_path):
    """Feeds at batch 8 against an analysis at ckpt's default batch: the check says so
    before anything runs, instead of failing on a prediction made for the other batch."""
    model, feeds = _symbolic_chain_with_feeds(tmp_path, batch=8)
    r = CliRunner().invoke(main, ["check", str(model), str(model), "--feeds", str(feeds), "--runs", "1"])
    assert r.exit_code == 2, r.output
    assert r.stderr.strip().endswith("input 'x' has batch = 8, but the models are analysed at batch = 64: "
                                     "give --dim batch=8")


@pytest.mark.slow
def test_feeds_at_the_given_batch_pass(tmp_path):
    pytest.importorskip("onnxruntime")
    model, feeds = _symbolic_chain_with_feeds(tmp_path, batch=8)
    r = CliRunner().invoke(main, ["check", str(model), str(model), "--feeds", str(feeds), "--runs", "1",
                                  "--dim", "batch=8"])
    assert r.exit_code == 0, r.output
