"""Rewrites of graphs with several symbolic dimensions: each dimension keeps its own name in
the written shapes, whatever values the sizes were taken at, and the written model runs on
ONNX Runtime at values where the dimensions differ, with the original's outputs bit for bit."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from ckpt_session import run_outputs
from tokens import tokens_feeds, tokens_model

from ckpt_cli import rewrite_model


def _value(dim: onnx.TensorShapeProto.Dimension, values: dict[str, int]) -> int | None:
    """A written dimension at ``values``: a number, or a product of symbols and a number."""
    if dim.HasField("dim_value"):
        return dim.dim_value
    if not dim.dim_param:
        return None
    return math.prod(values[p] if p in values else int(p) for p in dim.dim_param.split("*"))


def _declared_vs_run(model: onnx.ModelProto, feeds: dict, values: dict[str, int]) -> list[tuple]:
    """(tensor, declared shape at ``values``, shape ORT made) for every value_info."""
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    declared = {v.name: [_value(d, values) for d in v.type.tensor_type.shape.dim] for v in model.graph.value_info}
    exposed.graph.output.extend(v for v in model.graph.value_info)
    got = run_outputs(exposed, feeds)
    return [(t, shape, list(got[t].shape)) for t, shape in declared.items()]


@pytest.mark.parametrize("dims", [None, {"batch": 8, "seq": 8}, {"batch": 6, "seq": 12}])
def test_each_symbolic_dim_keeps_its_name(tmp_path, dims):
    """Both at the default 64, or given equal: the sequence axis was written as ``batch``."""
    src = tmp_path / "tokens.onnx"
    onnx.save(tokens_model(), src)
    out = rewrite_model(src, tmp_path / "out.onnx", **({"dims": dims} if dims else {}))
    model = onnx.load(tmp_path / "out.onnx")
    assert out.result.recompute_nodes > 0 and len(model.graph.value_info) > 0
    params = {d.dim_param for v in model.graph.value_info for d in v.type.tensor_type.shape.dim}
    assert {"batch", "seq"} <= params
    for batch, seq in ((2, 3), (5, 2)):
        rows = _declared_vs_run(model, tokens_feeds(batch, seq), {"batch": batch, "seq": seq})
        wrong = [r for r in rows if r[1] != r[2]]
        assert not wrong, wrong[:3]


@pytest.mark.parametrize("batch,seq", [(2, 3), (7, 2), (4, 4)])
def test_rewrite_with_two_dims_runs_at_other_values(tmp_path, batch, seq):
    src, dst = tmp_path / "tokens.onnx", tmp_path / "out.onnx"
    onnx.save(tokens_model(), src)
    rewrite_model(src, dst)
    feeds = tokens_feeds(batch, seq)
    expected, got = run_outputs(src, feeds), run_outputs(dst, feeds)
    assert expected.keys() == got.keys()
    for name, value in expected.items():
        assert np.array_equal(value, got[name]) and value.tobytes() == got[name].tobytes(), name


def _changed_rewrite(tmp_path, change) -> tuple:
    """The tokens model, and its rewrite with ``change`` applied to the written file."""
    from onnx import helper

    src, dst = tmp_path / "tokens.onnx", tmp_path / "out.onnx"
    onnx.save(tokens_model(), src)
    rewrite_model(src, dst)
    model = onnx.load(dst)
    change(model, helper)
    onnx.save(model, dst)
    return src, dst


def _check(src, dst):
    from ckpt_cli import check_models
    from ckpt_cli.options import CheckOptions

    return check_models(src, dst, options=CheckOptions(provider="cpu", runs=1)).figures


@pytest.mark.slow
def test_check_runs_both_files_at_other_dims(tmp_path):
    """Each dimension at a value of its own, other than the analysed one: outputs compared there."""
    f = _check(*_changed_rewrite(tmp_path, lambda m, h: None))
    other = f.other_dims
    assert other is not None and other.outputs is not None
    assert other.dims["batch"] != other.dims["seq"] and 64 not in other.dims.values()
    assert other.outputs.all_bit_identical and not any(c.startswith("runs_at_other_dims") for c in f.codes)


@pytest.mark.slow
def test_a_rewrite_that_only_runs_at_the_analysed_dims_fails_the_check(tmp_path):
    """A shape baked in at the analysed values (64 x 64 tokens): the file runs there only."""
    def bake(model, helper):
        model.graph.initializer.append(onnx.numpy_helper.from_array(np.array([64, 64, 64], np.int64), "baked_shape"))
        model.graph.node.append(helper.make_node("Reshape", ["x", "baked_shape"], ["baked"], name="/baked/Reshape"))

    f = _check(*_changed_rewrite(tmp_path, bake))
    assert "runs_at_other_dims_rewritten_failed" in f.codes, f.failures
    assert any(x.startswith(f"at batch={f.other_dims.dims['batch']}, seq=") for x in f.failures), f.failures


@pytest.mark.slow
def test_outputs_that_differ_at_other_dims_fail_the_check(tmp_path):
    """The loss plus (seq - 64): the same at the analysed values, off anywhere else."""
    def shift(model, helper):
        inits = {"sixty_four": np.array(64, np.int64), "one": np.array([1], np.int64)}
        model.graph.initializer.extend(onnx.numpy_helper.from_array(v, k) for k, v in inits.items())
        out = next(o for o in model.graph.output if o.name == "loss")
        producer = next(n for n in model.graph.node if "loss" in n.output)
        producer.output[list(producer.output).index("loss")] = "loss_unshifted"
        model.graph.node.extend([
            helper.make_node("Shape", ["x"], ["xs"], name="/shift/Shape"),
            helper.make_node("Gather", ["xs", "one"], ["seq"], name="/shift/Gather"),
            helper.make_node("Sub", ["seq", "sixty_four"], ["off"], name="/shift/Sub"),
            helper.make_node("Cast", ["off"], ["offf"], to=onnx.TensorProto.FLOAT, name="/shift/Cast"),
            helper.make_node("ReduceSum", ["offf"], ["offs"], keepdims=0, name="/shift/ReduceSum"),
            helper.make_node("Add", ["loss_unshifted", "offs"], [out.name], name="/shift/Add")])

    f = _check(*_changed_rewrite(tmp_path, shift))
    assert f.outputs.equal  # at the analysed values
    assert "runs_at_other_dims" in f.codes, f.failures
