"""FLOPs of every op the zoo's training artifacts and the sample models hold, as a table:
(op, input shapes, output shapes, attributes) -> the FLOPs ckpt counts (a multiply-add is
two). The conventions, per row: matmuls and convolutions 2 per multiply-add; elementwise
ops a fixed count per output element; reductions, normalizations and losses per input
element; a gradient about twice its forward op where it has two products (ConvGrad, the
recurrent gradients); data movement 0. And a conv net's backward comes out about twice its
forward.
"""

from __future__ import annotations

import math

import pytest
from onnx import helper

from conftest import SAMPLES
from ckpt_cli import inspect_model
from ckpt_cli.analysis.cost import node_flops
from ckpt_cli.analysis.shapes import TensorInfo
from ckpt_cli.graph import Node

MS = "com.microsoft"
X = (8, 16, 32)  # an activation
E = math.prod(X)
IMG, W3 = (4, 8, 16, 16), (12, 8, 3, 3)  # NCHW input, 12 filters of 3x3 over 8 channels
Y3 = (4, 12, 16, 16)  # its output with pads 1
CONV = 2 * math.prod(Y3) * 8 * 9  # forward conv FLOPs
LSTM_X, LSTM_W, LSTM_R = (5, 4, 6), (1, 4 * 7, 6), (1, 4 * 7, 7)  # seq 5, batch 4, input 6, hidden 7
LSTM = 5 * 4 * (2 * 4 * 7 * (6 + 7) + 24 * 7)
GRU_W, GRU_R = (1, 3 * 7, 6), (1, 3 * 7, 7)
GRU = 5 * 4 * (2 * 3 * 7 * (6 + 7) + 18 * 7)


def row(op, ins, outs, expected, domain="", **attrs):
    return pytest.param(op, domain, ins, outs, attrs, expected, id=f"{domain + '.' if domain else ''}{op}")


def elementwise(op, per, domain="", n=2):
    return row(op, [X] * n, [X], per * E, domain)


TABLE = [
    # matmuls and convolutions
    row("MatMul", [(8, 16, 32), (32, 24)], [(8, 16, 24)], 2 * 8 * 16 * 24 * 32),
    row("FusedMatMul", [(8, 32, 16), (32, 24)], [(8, 16, 24)], 2 * 8 * 16 * 24 * 32, MS, transA=1),
    row("Gemm", [(16, 32), (32, 24), (24,)], [(16, 24)], 2 * 16 * 24 * 32 + 16 * 24),
    row("Conv", [IMG, W3], [Y3], CONV, pads=[1] * 4),
    row("ConvTranspose", [Y3, (12, 8, 3, 3)], [IMG], 2 * math.prod(Y3) * 8 * 9),
    # dX and dW each cost the forward conv, dB one add per element of dY
    row("ConvGrad", [Y3, IMG, W3], [IMG, W3, (12,)], 2 * CONV + math.prod(Y3), MS),
    # recurrent (ORT training's forward and gradient ops)
    row("LSTMTraining", [LSTM_X, LSTM_W, LSTM_R], [(5, 1, 4, 7)], LSTM, MS),
    row("LSTMGrad", [LSTM_X, LSTM_W, LSTM_R], [LSTM_X, LSTM_W, LSTM_R], 2 * LSTM, MS),
    row("GRUTraining", [LSTM_X, GRU_W, GRU_R], [(5, 1, 4, 7)], GRU, MS),
    row("GRUGrad", [LSTM_X, GRU_W, GRU_R], [LSTM_X, GRU_W, GRU_R], 2 * GRU, MS),
    # elementwise: per output element
    *[elementwise(op, 1) for op in ("Add", "Sub", "Mul", "Div", "Pow", "Where", "Equal", "Less", "LessOrEqual",
                                    "GreaterOrEqual", "And", "Sum")],
    *[elementwise(op, 1, n=1) for op in ("Relu", "Neg", "Reciprocal", "Not", "Cast", "Abs", "Sign")],
    elementwise("Sqrt", 2, n=1), elementwise("Clip", 2, n=1), elementwise("Exp", 4, n=1),
    elementwise("Erf", 8, n=1), elementwise("Gelu", 10, n=1), elementwise("Gelu", 10, MS, n=1),
    elementwise("Dropout", 2, n=1), elementwise("Scale", 1, MS), elementwise("QuickGelu", 5, MS, n=1),
    elementwise("Sigmoid", 4, n=1), elementwise("Tanh", 4, n=1), elementwise("Log", 4, n=1),
    elementwise("RandomNormalLike", 12, n=1), elementwise("RandomUniformLike", 2, n=1),
    elementwise("Sin", 4, n=1), elementwise("Cos", 4, n=1),
    # their gradients: per output element
    elementwise("ReluGrad", 1, MS), elementwise("GeluGrad", 12, MS), elementwise("DropoutGrad", 2, MS),
    elementwise("QuickGeluGrad", 8, MS), elementwise("SigmoidGrad", 3, MS), elementwise("TanhGrad", 3, MS),
    # reductions, normalizations, losses: per input element
    row("ReduceSum", [X, (1,)], [(8, 16, 1)], E), row("ReduceMean", [X, (1,)], [(8, 16, 1)], E),
    row("ReduceSumTraining", [X, (1,)], [(8, 16, 1)], E, MS),
    row("ReduceL2", [X], [(8, 16, 1)], 2 * E, axes=[2]),  # a square and an add per element
    row("Softmax", [X], [X], 5 * E), row("LogSoftmax", [X], [X], 5 * E),
    row("SoftmaxGrad_13", [X, X], [X], 3 * E, MS), row("LogSoftmaxGrad_13", [X, X], [X], 3 * E, MS),
    row("LayerNormalization", [X, (32,), (32,)], [X], 8 * E),
    row("LayerNormalizationGrad", [X, X, (32,), (8, 16, 1), (8, 16, 1)], [X, (32,), (32,)], 12 * E, MS),
    row("SimplifiedLayerNormalization", [X, (32,)], [X, (8, 16, 1)], 6 * E),  # ORT's, in the ONNX domain
    row("SimplifiedLayerNormalizationGrad", [X, X, (32,), (8, 16, 1)], [X, (32,)], 9 * E, MS),
    row("BatchNormInternal", [IMG, (8,), (8,), (8,), (8,)], [IMG], 7 * math.prod(IMG), MS),
    row("BatchNormalizationGrad", [IMG, IMG, (8,), (8,), (8,)], [IMG, (8,), (8,)], 10 * math.prod(IMG), MS),
    row("SoftmaxCrossEntropyLoss", [(64, 10), (64,)], [()], 6 * 640),
    row("SoftmaxCrossEntropyLossGrad", [(), (64, 10), (64,)], [(64, 10)], 3 * 640, MS),
    row("MaxPool", [IMG], [(4, 8, 8, 8)], math.prod(IMG), kernel_shape=[2, 2], strides=[2, 2]),
    row("MaxPoolGrad", [(4, 8, 8, 8), (4, 8, 8, 8)], [IMG], math.prod((4, 8, 8, 8))),
    row("GlobalAveragePool", [IMG], [(4, 8, 1, 1)], math.prod(IMG)),
    # TopK: a partial sort, two comparisons per input element
    row("TopK", [X, (1,)], [(8, 16, 2), (8, 16, 2)], 2 * E),
    row("InPlaceAccumulatorV2", [W3, W3], [(1,), W3], math.prod(W3), MS),
    # gradients of gathers: one add per element of dY
    row("GatherGrad", [(2,), (8, 16), (8, 16, 32)], [(1000, 32)], 8 * 16 * 32, MS),
    row("GatherElementsGrad", [(8, 16, 32), (3,), (8, 16, 32)], [(8, 64, 32)], 8 * 16 * 32, MS, axis=1),
    row("SliceGrad", [X, (3,), (1,), (1,)], [(8, 16, 64)], E, MS),
    # data movement and shape ops: free
    *[row(op, [X, (3,)], [X], 0) for op in ("Reshape", "Expand", "Tile", "Slice", "Pad", "Gather", "GatherElements",
                                            "ScatterElements", "ScatterND", "Squeeze", "Unsqueeze", "Transpose",
                                            "Flatten", "Identity", "Concat", "Split", "Shape", "Size",
                                            "ConstantOfShape")],
    *[row(op, [X, (2,)], [X, (2,)], 0, MS) for op in ("ConcatTraining", "SplitTraining", "BroadcastGradientArgs")],
]


def _info(shape) -> TensorInfo:
    return TensorInfo(1, tuple(shape), 4 * math.prod(shape))


@pytest.mark.parametrize("op,domain,ins,outs,attrs,expected", TABLE)
def test_flops(op, domain, ins, outs, attrs, expected):
    names_in, names_out = [f"i{k}" for k in range(len(ins))], [f"o{k}" for k in range(len(outs))]
    node = Node.from_proto(0, helper.make_node(op, names_in, names_out, name=op, domain=domain, **attrs))
    tensors = {**{t: _info(s) for t, s in zip(names_in, ins)}, **{t: _info(s) for t, s in zip(names_out, outs)}}
    assert node_flops(node, tensors) == pytest.approx(expected, rel=0.05 if op == "ConvGrad" else 0)


def test_table_covers_every_op_of_the_zoo_and_the_samples():
    from ckpt_cli.io.load import load_graph

    covered = {p.values[0] for p in TABLE}
    paths = sorted(SAMPLES.glob("zoo/*/training_model.onnx")) + sorted(SAMPLES.glob("*.onnx"))
    ops = {n.op_type for p in paths for n in load_graph(p).nodes} - {"Constant"}
    assert ops <= covered, sorted(ops - covered)


def test_a_conv_nets_backward_is_about_twice_its_forward():
    r = inspect_model(SAMPLES / "zoo" / "lenet" / "training_model.onnx").to_json()
    assert 1.5 <= r["backward_flops"] / r["forward_flops"] <= 3
