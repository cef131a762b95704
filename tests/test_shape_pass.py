"""The one shape pass (``infer_shapes``): it reads the graph once, whatever rounds ORT's ops
take, and sizes ORT's ops by the rules ``ort/shapes.py`` registers as a table."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from ckpt_cli.analysis import shapes
from ckpt_cli.analysis.shapes import Shapes, infer_shapes, infer_tied
from ckpt_cli.graph import Graph
from ckpt_cli.ort import shapes as ort_shapes

F = TensorProto.FLOAT
MS = "com.microsoft"


def _chain(layers: int) -> Graph:
    """``layers`` FusedMatMul -> Relu pairs: onnx's inference stops at each FusedMatMul, so
    the pass needs a round per layer."""
    nodes, x = [], "x"
    for k in range(layers):
        nodes += [helper.make_node("FusedMatMul", [x, "w"], [f"m{k}"], domain=MS, name=f"m{k}"),
                  helper.make_node("Relu", [f"m{k}"], [f"r{k}"], name=f"r{k}")]
        x = f"r{k}"
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, ["batch", 8])],
                          [helper.make_tensor_value_info(x, F, None)],
                          initializer=[numpy_helper.from_array(np.ones((8, 8), np.float32), "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    m.ir_version = 8
    return Graph.from_model(m)


def test_the_pass_reads_the_graph_once_over_its_rounds(monkeypatch):
    graph = _chain(4)
    calls = {"topological_order": 0, "opset": 0}
    for name in calls:
        original = getattr(Graph, name)

        def counted(self, *args, _name=name, _original=original):
            calls[_name] += 1
            return _original(self, *args)
        monkeypatch.setattr(Graph, name, counted)
    result = infer_shapes(graph, {"batch": 3})
    assert result.tensors["r3"].shape == (3, 8)  # past every FusedMatMul: a round each
    assert calls == {"topological_order": 1, "opset": 1}


def test_the_result_is_frozen_and_carries_its_dims():
    result = infer_shapes(_chain(1), {"batch": 5})
    assert isinstance(result, Shapes) and result.dims == {"batch": 5}
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.dims = {}  # type: ignore[misc]
    assert infer_tied(_chain(1), {"batch": 5}, ()).dims == {"batch": 5}


def test_an_ort_rule_is_registered_as_data(monkeypatch):
    """A rule added to the table alone sizes its op: the pass calls nothing op by op."""
    m = _chain(1).model
    m.graph.node[0].op_type = "Doubled"  # an op no rule knows: its outputs stay unsized
    unsized = shapes.infer_shapes(Graph.from_model(m), {"batch": 2}).tensors.get("r0")
    assert unsized is None or unsized.nbytes is None

    def doubled(x: ort_shapes.Inputs) -> dict[int, ort_shapes.Typed]:
        dtype, shape = x.typed(0) or (0, ())
        return {0: (dtype, (2 * shape[0], shape[1]))}
    table = dataclasses.replace(ort_shapes.RULES, contrib={**ort_shapes.RULES.contrib, "Doubled": doubled})
    monkeypatch.setattr(ort_shapes, "RULES", table)
    assert shapes.infer_shapes(Graph.from_model(m), {"batch": 2}).tensors["r0"].shape == (4, 8)
