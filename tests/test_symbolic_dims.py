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
