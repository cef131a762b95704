"""Shape values ckpt evaluates itself (ckpt_cli/analysis/shapes.py): the numpy fast
paths agree with ONNX's reference evaluator, and folding sizes what ONNX's data
propagation cannot."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from ckpt_cli.analysis import shapes as shape_values
from ckpt_cli.analysis.shapes import infer_tensors
from ckpt_cli.graph import Graph, Node

CASES = [
    ("Add", {}, [[3, -4], [2]]), ("Sub", {}, [[3, 4], [5, 1]]), ("Mul", {}, [[3, -4], 2]),
    ("Div", {}, [[7, -7, 6, -6], [2, 2, -4, -4]]), ("Concat", {"axis": 0}, [[1, 2], [3]]),
    ("Gather", {"axis": 0}, [[5, 6, 7], 1]), ("Gather", {"axis": 0}, [[5, 6, 7], [2, 0]]),
    ("Unsqueeze", {}, [4, [0]]), ("Unsqueeze", {}, [[4, 5], [-1]]), ("Squeeze", {}, [[4], [0]]),
    ("Identity", {}, [[1, 2]]), ("Neg", {}, [[3, -4]]),
]


@pytest.mark.parametrize("op, attrs, inputs", CASES)
def test_fast_paths_match_the_reference_evaluator(op, attrs, inputs, monkeypatch):
    values = {f"i{k}": np.array(x, np.int64) for k, x in enumerate(inputs)}
    node = Node.from_proto(0, helper.make_node(op, list(values), ["y"], name="n", **attrs))
    fast = shape_values._evaluate(node, values, {}, 18)
    monkeypatch.delitem(shape_values._FAST, op)
    slow = shape_values._evaluate(node, values, {}, 18)
    assert fast.dtype == slow.dtype and fast.shape == slow.shape and np.array_equal(fast, slow)


def test_folding_sizes_a_reshape_to_divided_shape():
    """Reshape(a, Shape(a) / [2, 1] * [1, 2]): ONNX's data propagation has no int64 Div."""
    nodes = [helper.make_node("Neg", ["x"], ["a"], name="a"), helper.make_node("Shape", ["a"], ["s"], name="s"),
             helper.make_node("Div", ["s", "d"], ["h"], name="h"), helper.make_node("Mul", ["h", "m"], ["c"], name="c"),
             helper.make_node("Reshape", ["a", "c"], ["t"], name="t"), helper.make_node("Neg", ["t"], ["y"], name="y")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(np.array([2, 1], np.int64), "d"),
                           numpy_helper.from_array(np.array([1, 2], np.int64), "m")])
    graph = Graph.from_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]))
    tensors = infer_tensors(graph)
    assert tensors["t"].shape == (4, 8) and tensors["y"].nbytes == 4 * 32
    assert not tensors["t"].static_shape  # ORT does no arithmetic on whole shapes before the run
    assert tensors["a"].static_shape
