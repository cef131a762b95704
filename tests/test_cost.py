"""The FLOP model (ckpt_cli/analysis/cost.py) on single nodes whose count is known by hand,
with output shapes taken from ONNX Runtime (not from ckpt's shape inference)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from ckpt_cli.analysis.cost import NodeCost, element_flops, graph_costs, node_cost, node_flops
from ckpt_cli.analysis.shapes import TensorInfo
from ckpt_cli.graph import Graph


def _one_node(op: str, shapes: list[tuple[int, ...]], **attrs) -> tuple[Graph, dict[str, TensorInfo]]:
    """A graph of one float node; tensor sizes from running it on ORT."""
    names = [f"i{k}" for k in range(len(shapes))]
    node = helper.make_node(op, names, ["y"], name="n", **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
                                            for n, s in zip(names, shapes)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    feeds = {n: np.ones(s, np.float32) for n, s in zip(names, shapes)}
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = sess.run(None, feeds)
    tensors = {n: TensorInfo(TensorProto.FLOAT, tuple(s), 4 * int(np.prod(s))) for n, s in zip(names, shapes)}
    tensors["y"] = TensorInfo(TensorProto.FLOAT, tuple(y.shape), 4 * y.size)
    return Graph.from_model(model), tensors


def _flops(op, shapes, **attrs) -> int | None:
    g, tensors = _one_node(op, shapes, **attrs)
    return node_flops(g.nodes[0], tensors)


def test_matmul_counts_a_multiply_add_as_two():
    assert _flops("MatMul", [(3, 5), (5, 7)]) == 2 * 3 * 7 * 5
    assert _flops("MatMul", [(4, 3, 5), (5, 7)]) == 2 * 4 * 3 * 7 * 5  # batched


def test_gemm_with_transposes_and_bias():
    assert _flops("Gemm", [(5, 3), (5, 7)], transA=1) == 2 * 3 * 7 * 5
    assert _flops("Gemm", [(3, 5), (7, 5), (7,)], transB=1) == 2 * 3 * 7 * 5 + 3 * 7


@pytest.mark.parametrize("group", [1, 2])
def test_conv_is_output_size_times_kernel_volume(group):
    # N=2, C_in=4, 9x9 image; 6 filters of C_in/group x 3x3, stride 2, pad 1 -> 2x6x5x5 out
    x, w = (2, 4, 9, 9), (6, 4 // group, 3, 3)
    expected = 2 * (2 * 6 * 5 * 5) * (4 // group) * 3 * 3
    assert _flops("Conv", [x, w], strides=[2, 2], pads=[1, 1, 1, 1], group=group) == expected


def test_conv_transpose_is_input_size_times_filter_volume():
    # each input element scatters into C_out x 3 x 3 outputs with one multiply-add each
    x, w = (2, 4, 5, 5), (4, 3, 3, 3)
    assert _flops("ConvTranspose", [x, w]) == 2 * (2 * 4 * 5 * 5) * 3 * 3 * 3


def test_elementwise_per_output_and_reductions_per_input():
    assert _flops("Add", [(4, 1), (1, 6)]) == 4 * 6  # broadcast: counts outputs
    assert _flops("Sigmoid", [(4, 6)]) == 4 * 4 * 6
    assert _flops("ReduceSum", [(4, 6)], keepdims=0) == 4 * 6
    assert _flops("Softmax", [(4, 6)]) == 5 * 4 * 6


def test_data_movement_is_free_and_unknown_sizes_are_marked():
    assert _flops("Transpose", [(4, 6)]) == 0
    g, tensors = _one_node("MatMul", [(3, 5), (5, 7)])
    unknown = dict(tensors, y=TensorInfo(TensorProto.FLOAT, ("n", 7), None))
    assert node_flops(g.nodes[0], unknown) is None
    cost = node_cost(g.nodes[0], unknown)
    assert cost == NodeCost(0, 4 * 15 + 4 * 35, 0, False)
    known = node_cost(g.nodes[0], tensors)
    assert known.known and known.bytes_written == 4 * 21


def test_graph_costs_follow_node_order():
    from randgraph import build_random_training_graph

    from ckpt_cli.analysis.shapes import infer_tensors

    g = Graph.from_model(build_random_training_graph(7, 12, dtype=np.float32))
    tensors = infer_tensors(g)
    costs = graph_costs(g, tensors)
    assert costs == [node_cost(n, tensors) for n in g.nodes]
    matmuls = [(n, c) for n, c in zip(g.nodes, costs) if n.op_type == "MatMul"]
    assert matmuls
    for n, c in matmuls:
        a, y = tensors[n.inputs[0]].shape, tensors[n.outputs[0]].shape
        assert c.flops == 2 * a[0] * a[1] * y[1]


def test_graph_costs_price_alike_nodes_once_and_tell_what_differs():
    """Nodes with the same op and shapes share one priced cost; an attribute the count
    reads (Gemm's transA), a missing optional input (the bias) or a shape sets them apart."""
    from onnx import numpy_helper

    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    b = numpy_helper.from_array(np.ones((4,), np.float32), "b")
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["y0"], name="g0"),
             helper.make_node("Gemm", ["y0", "w", "b"], ["y1"], name="g1"),  # alike g0
             helper.make_node("Gemm", ["y1", "w", "b"], ["y2"], name="g2", transA=1),
             helper.make_node("Gemm", ["y2", "w", ""], ["y3"], name="g3"),
             helper.make_node("Gemm", ["y3", "w"], ["y4"], name="g4"),
             helper.make_node("Gemm", ["x6", "w", "b"], ["y5"], name="g5")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (4, 4)),
                                           helper.make_tensor_value_info("x6", TensorProto.FLOAT, (6, 4))],
                              [helper.make_tensor_value_info(f"y{k}", TensorProto.FLOAT, None) for k in (4, 5)],
                              [w, b])
    g = Graph.from_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    sizes = {"x": (4, 4), "x6": (6, 4), "w": (4, 4), "b": (4,), "y5": (6, 4),
             **{f"y{k}": (4, 4) for k in range(5)}}
    tensors = {t: TensorInfo(TensorProto.FLOAT, s, 4 * int(np.prod(s))) for t, s in sizes.items()}
    costs = graph_costs(g, tensors)
    assert costs == [node_cost(n, tensors) for n in g.nodes]
    assert costs[0] is costs[1]
    assert costs[2] is not costs[0] and costs[3] is not costs[0] and costs[5] is not costs[0]
    assert costs[3].matmul_flops == costs[3].flops == costs[0].flops - 16  # no bias to add
    assert costs[5].flops == 2 * 6 * 4 * 4 + 24


def test_the_peer_comparison_notions():
    """matmul-only FLOPs and element counts, the two narrower notions PyTorch's side uses."""
    matmul, tensors = _one_node("MatMul", [(3, 5), (5, 7)])
    assert node_cost(matmul.nodes[0], tensors).matmul_flops == 2 * 3 * 7 * 5
    assert element_flops(matmul.nodes[0], tensors) == 2 * 3 * 7 * 5
    sigmoid, tensors = _one_node("Sigmoid", [(4, 6)])
    assert node_cost(sigmoid.nodes[0], tensors).matmul_flops == 0
    assert element_flops(sigmoid.nodes[0], tensors) == 4 * 6  # one per output element, not 4
    flatten, tensors = _one_node("Flatten", [(4, 6)])
    assert element_flops(flatten.nodes[0], tensors) == 0  # a view computes nothing



def test_a_gemms_matmul_flops_leave_its_bias_add_out_as_torchs_addmm_does():
    gemm, tensors = _one_node("Gemm", [(3, 5), (5, 7), (7,)])
    cost = node_cost(gemm.nodes[0], tensors)
    assert cost.flops == 2 * 3 * 7 * 5 + 3 * 7 and cost.matmul_flops == 2 * 3 * 7 * 5
    assert element_flops(gemm.nodes[0], tensors) == 2 * 3 * 7 * 5


def _conv_grad_flops(outputs: list[str]) -> int | None:
    """ConvGrad(dY, X, W) as ORT's training build writes it, sized by ckpt's rule for it."""
    from ckpt_cli.analysis.shapes import infer_tensors

    x, w, dy = (2, 3, 10, 10), (4, 3, 3, 3), (2, 4, 8, 8)
    node = helper.make_node("ConvGrad", ["dy", "x", "w"], outputs, name="g", domain="com.microsoft")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
                                            for n, s in (("dy", dy), ("x", x), ("w", w))],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs if o])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    g = Graph.from_model(model)
    tensors = infer_tensors(g)
    assert tensors["dw"].shape == w  # the premise: ckpt's shape rule sizes the node
    return node_flops(g.nodes[0], tensors)


def test_conv_grad_flops_are_twice_the_forward_conv_counted_from_the_weight_input_2():
    """ConvGrad's inputs are dY, X, W: dX and dW each cost the forward conv, 2 * |dY| *
    C_in * kH * kW (W is input 2; X, input 1, is no weight), and dB one add per dY element."""
    forward = 2 * (2 * 4 * 8 * 8) * (3 * 3 * 3)
    assert _flops("Conv", [(2, 3, 10, 10), (4, 3, 3, 3)]) == forward  # the premise: the forward count
    assert _conv_grad_flops(["dx", "dw", "db"]) == 2 * forward + 2 * 4 * 8 * 8
    assert _conv_grad_flops(["", "dw", "db"]) == forward + 2 * 4 * 8 * 8  # no dX wanted: not computed
    assert _conv_grad_flops(["dx", "dw"]) == 2 * forward
