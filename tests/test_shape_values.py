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


def _graph(nodes, inputs, initializers=(), opsets=(("", 18),)):
    g = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT,
                                                                             None)], list(initializers))
    return Graph.from_model(helper.make_model(g, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets]))


def test_a_shape_times_zero_is_known_whatever_the_other_factor():
    """ckpt's order pins reshape a tensor by (sizes waited for) x 0: a slice bound behind such
    a pin keeps its value, so the slice's output stays sized (zoo flow's recompute copies)."""
    nodes = [helper.make_node("Size", ["x"], ["n"], name="n"), helper.make_node("Max", ["n", "n"], ["gate"], name="m"),
             helper.make_node("Unsqueeze", ["gate", "axis0"], ["gate1"], name="u"),
             helper.make_node("Mul", ["gate1", "zero"], ["shape"], name="z"),
             helper.make_node("Reshape", ["end", "shape"], ["pinned"], name="p"),
             helper.make_node("Slice", ["x", "start", "pinned", "axis1"], ["y"], name="y")]
    ints = {"axis0": [0], "zero": [0], "end": [2], "start": [0], "axis1": [1]}
    graph = _graph(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5])],
                   [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in ints.items()])
    tensors = infer_tensors(graph)
    assert tensors["y"].shape == (3, 2) and tensors["y"].nbytes == 24
    assert tensors["gate"].nbytes == 8  # sized, its value unknown: only the product is


def test_a_chain_of_ort_and_onnx_ops_longer_than_the_rounds_is_sized():
    """A backward chain alternating ORT's ops (ReluGrad) and ONNX's (Neg): each round of
    whole-graph inference passes one ORT op, and 40 of them are past the rounds' cap."""
    nodes, g = [], "g0"
    for k in range(40):
        nodes += [helper.make_node("ReluGrad", [g, "x"], [f"r{k}"], name=f"r{k}", domain="com.microsoft"),
                  helper.make_node("Neg", [f"r{k}"], [f"g{k + 1}"], name=f"n{k}")]
        g = f"g{k + 1}"
    inputs = [helper.make_tensor_value_info(t, TensorProto.FLOAT, [4, 6]) for t in ("g0", "x")]
    tensors = infer_tensors(_graph(nodes, inputs, opsets=(("", 18), ("com.microsoft", 1))))
    assert all(tensors[t].shape == (4, 6) and tensors[t].nbytes == 96 for n in nodes for t in n.output)
