"""A FLOP and memory-traffic cost model per node.

This is ckpt's one FLOP source: every recompute FLOP figure (plans, rewrite, reports,
compare) sums ``node_cost(...).flops``. FLOPs count a multiply-add as two. Ops whose size
is unknown cost 0 and are marked ``known=False`` so reports can say how much was not priced.

Two narrower notions exist on purpose, for comparing with PyTorch's partitioner, which
weighs only matmuls: ``NodeCost.matmul_flops`` (2·M·N·K of ``MATMUL_OPS`` as torch counts
it, without a Gemm's bias add; also the min-cut's exact objective) and ``element_flops``
(matmul FLOPs plus one per output element of every other op that computes data).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

from ..graph import ABSENT, Graph, Node
from ..ops import MATMUL_OPS, SHAPE_ONLY_OPS, VIEW_OPS
from .shapes import TensorInfo

# Elementwise-style ops: FLOPs per output element.
_PER_OUTPUT = {
    "Add": 1, "Sub": 1, "Mul": 1, "Div": 1, "Pow": 1, "Max": 1, "Min": 1, "Mod": 1,
    "Relu": 1, "LeakyRelu": 2, "Elu": 3, "Selu": 3, "Celu": 3, "PRelu": 2, "Sigmoid": 4,
    "HardSigmoid": 3, "HardSwish": 4, "Tanh": 4, "Exp": 4, "Log": 4, "Sqrt": 2, "Reciprocal": 1,
    "Neg": 1, "Abs": 1, "Erf": 8, "Gelu": 10, "FastGelu": 10, "Softplus": 6, "Mish": 10,
    "Where": 1, "Equal": 1, "Less": 1, "Greater": 1, "LessOrEqual": 1, "GreaterOrEqual": 1,
    "Not": 1, "And": 1, "Or": 1, "Xor": 1, "Sign": 1, "Clip": 2, "Floor": 1, "Ceil": 1,
    "Round": 1, "Cast": 1, "Sin": 4, "Cos": 4, "IsNaN": 1, "IsInf": 1, "BitShift": 1,
    "Sum": 1, "Mean": 1, "Scale": 1, "ReluGrad": 1, "GeluGrad": 12, "FastGeluGrad": 12,
    "SigmoidGrad": 3, "TanhGrad": 3, "Dropout": 2, "BiasGelu": 11, "QuickGelu": 5, "BiasAdd": 2,
    "DropoutGrad": 2,  # dY scaled where the mask kept it
    "QuickGeluGrad": 8,  # the sigmoid again (5), then dY * (s + a*x*s*(1-s))
    # an engine step and a scale per uniform; a normal draws two uniforms, a log and a sqrt
    "RandomUniform": 2, "RandomUniformLike": 2, "RandomNormal": 12, "RandomNormalLike": 12,
}
# Ops that read their whole input once: FLOPs per input element.
_PER_INPUT = {
    "ReduceSum": 1, "ReduceMean": 1, "ReduceMax": 1, "ReduceMin": 1, "ReduceProd": 1,
    "ReduceL1": 2, "ReduceL2": 2, "ReduceSumSquare": 2, "ReduceLogSumExp": 5, "ReduceLogSum": 2,
    "ArgMax": 1, "ArgMin": 1, "Softmax": 5, "LogSoftmax": 5, "SoftmaxGrad": 3,
    "LayerNormalization": 8, "SimplifiedLayerNormalization": 6, "BatchNormalization": 5,
    "BatchNormInternal": 7, "InstanceNormalization": 8, "GroupNormalization": 8,
    "LpNormalization": 3, "MeanVarianceNormalization": 8, "LayerNormalizationGrad": 12,
    "SimplifiedLayerNormalizationGrad": 9,  # LayerNormalizationGrad without the mean's terms
    "BatchNormalizationGrad": 10, "SoftmaxCrossEntropyLoss": 6, "NegativeLogLikelihoodLoss": 1,
    "SoftmaxCrossEntropyLossInternal": 6, "SoftmaxCrossEntropyLossGrad": 3,
    "SoftmaxCrossEntropyLossInternalGrad": 3, "MaxPool": 1, "AveragePool": 1,
    "GlobalAveragePool": 1, "GlobalMaxPool": 1, "MaxPoolGrad": 1, "TopK": 2,
    "CumSum": 1, "InPlaceAccumulatorV2": 1, "SkipLayerNormalization": 10,
    "SkipSimplifiedLayerNormalization": 8, "BiasSoftmax": 6,
    "SoftmaxGrad_13": 3, "LogSoftmaxGrad": 3, "LogSoftmaxGrad_13": 3, "ReduceSumTraining": 1,
}
# Per-input ops whose counted input is not the first: the losses' gradients read the
# log-probabilities (input 1); their first input is the loss's scalar gradient.
_INPUT_AT = {"SoftmaxCrossEntropyLossGrad": 1, "SoftmaxCrossEntropyLossInternalGrad": 1}
# Gradients of gathers: one add per element of dY (their input ``_DY_INPUT``), scattered.
_DY_INPUT = {"GatherGrad": 2, "GatherNDGrad": 2, "GatherElementsGrad": 0, "SliceGrad": 0}
# Recurrent ops (ORT training's LSTM/GRU): gates, and FLOPs per hidden unit and step for
# their activations and state updates (LSTM: 4 activations of 4, cell and hidden updates 8;
# GRU: 3 activations of 4, the candidate's reset and the blend 6). The gradient op computes
# dX, dW, dR and the previous state's gradient: twice the forward's matmuls and updates.
_RECURRENT = {"LSTMTraining": (4, 24, 1), "GRUTraining": (3, 18, 1), "LSTMGrad": (4, 24, 2), "GRUGrad": (3, 18, 2)}


@dataclass(frozen=True)
class NodeCost:
    flops: int
    bytes_read: int
    bytes_written: int
    known: bool
    matmul_flops: int = 0  # ``flops`` when the op is one of MATMUL_OPS, else 0


def _elems(info: TensorInfo | None) -> int | None:
    if info is None or info.shape is None or not all(isinstance(d, int) for d in info.shape):
        return None
    return math.prod(cast(tuple[int, ...], info.shape))  # every dim an int: checked above


def _shape(info: TensorInfo | None) -> tuple[int, ...] | None:
    if info is None or info.shape is None or not all(isinstance(d, int) for d in info.shape):
        return None
    return info.shape  # type: ignore[return-value]


def node_flops(node: Node, tensors: dict[str, TensorInfo]) -> int | None:
    """FLOPs of one node, or None when the shapes it needs are unknown."""
    op = node.op_type
    get = tensors.get
    out = get(node.outputs[0]) if node.outputs and node.outputs[0] != ABSENT else None
    if op in ("MatMul", "FusedMatMul", "MatMulInteger"):
        a, y = _shape(get(node.inputs[0])), _elems(out)
        if a is None or y is None:
            return None
        # FusedMatMul (ORT's MatMul with transposed inputs and a scale) reads A transposed
        k = a[-2] if len(a) > 1 and node.attr("transA", 0) else a[-1]
        return 2 * y * k
    if op in ("Gemm", "FusedGemm"):
        a, y = _shape(get(node.inputs[0])), _elems(out)
        if a is None or y is None:
            return None
        k = a[0] if node.attr("transA", 0) else a[-1]
        activation = y if op == "FusedGemm" else 0  # a pointwise activation on the result
        bias = y if len(node.inputs) > 2 and node.inputs[2] != ABSENT else 0  # an empty name: no bias
        return 2 * y * k + bias + activation
    if op in ("Conv", "FusedConv"):
        w, y = _shape(get(node.inputs[1])), _elems(out)
        if w is None or y is None:
            return None
        return 2 * y * math.prod(w[1:])  # per output: C_in/group * kernel multiply-adds
    if op == "ConvGrad":
        return _conv_grad_flops(node, tensors)
    if op == "ConvTranspose":
        x, w = _elems(get(node.inputs[0])), _shape(get(node.inputs[1]))
        if x is None or w is None:
            return None
        group = int(node.attr("group", 1))
        return 2 * x * (w[1] * math.prod(w[2:])) // max(group, 1) * group
    if op in _RECURRENT:
        return _recurrent_flops(node, tensors)
    if op in _DY_INPUT:
        dy = _elems(get(node.inputs[_DY_INPUT[op]])) if len(node.inputs) > _DY_INPUT[op] else None
        return dy
    if op in _PER_OUTPUT:
        y = _elems(out)
        return None if y is None else _PER_OUTPUT[op] * y
    if op in _PER_INPUT:
        x = _elems(get(node.inputs[_INPUT_AT.get(op, 0)]))
        return None if x is None else _PER_INPUT[op] * x
    return 0  # data movement: Reshape, Transpose, Gather, Concat, Slice, Shape, ...


def _conv_grad_flops(node: Node, tensors: dict[str, TensorInfo]) -> int | None:
    """ConvGrad(dY, X, W) -> dX, dW, dB, each computed only when the node has it: dX and
    dW each cost the forward conv (2 * |dY| * C_in/group * kernel, from the weight W),
    dB one add per element of dY."""
    dy, w = _elems(tensors.get(node.inputs[0])), _shape(tensors.get(node.inputs[2]))
    if dy is None or w is None:
        return None
    wanted = [i < len(node.outputs) and node.outputs[i] != ABSENT for i in range(3)]
    return 2 * dy * math.prod(w[1:]) * (wanted[0] + wanted[1]) + dy * wanted[2]


def _recurrent_flops(node: Node, tensors: dict[str, TensorInfo]) -> int | None:
    """X [seq, batch, input], W [dirs, gates*hidden, input]: per step and direction the input
    and recurrent matmuls (2*gates*hidden*(input+hidden) per batch row) and the updates."""
    x, w = _shape(tensors.get(node.inputs[0])), _shape(tensors.get(node.inputs[1]))
    if x is None or w is None or len(x) != 3 or len(w) != 3:
        return None
    gates, per_unit, factor = _RECURRENT[node.op_type]
    hidden = w[1] // gates
    steps = x[0] * w[0] * x[1]  # seq x dirs x batch
    return factor * steps * (2 * gates * hidden * (x[2] + hidden) + per_unit * hidden)


def node_cost(node: Node, tensors: dict[str, TensorInfo]) -> NodeCost:
    try:
        flops = node_flops(node, tensors)
    except (IndexError, TypeError, ValueError):  # shapes that do not fit the op (a rank-0 MatMul input)
        flops = None
    get = tensors.get
    read = sum(info.nbytes or 0 for info in map(get, node.inputs) if info is not None)
    written = sum(info.nbytes or 0 for info in map(get, node.outputs) if info is not None)
    known, flops = flops is not None, flops or 0
    return NodeCost(flops, read, written, known, _matmul_part(node, flops, tensors))


def _matmul_part(node: Node, flops: int, tensors: dict[str, TensorInfo]) -> int:
    """2*M*N*K of a matmul-class op, as torch's flop counter counts it: a Gemm's bias add
    is not counted (addmm's is not either), other ops 0."""
    if node.op_type not in MATMUL_OPS:
        return 0
    if node.op_type == "Gemm" and len(node.inputs) > 2 and node.inputs[2] != ABSENT:
        return flops - (_elems(tensors.get(node.outputs[0])) or 0)
    return flops


def element_flops(node: Node, tensors: dict[str, TensorInfo]) -> int:
    """The peer comparison's count: a matmul's FLOPs, one per output element of any other
    op that computes data, nothing for views and shape reads."""
    if node.op_type in MATMUL_OPS:
        return node_cost(node, tensors).matmul_flops
    if node.op_type in VIEW_OPS or node.op_type in SHAPE_ONLY_OPS:
        return 0
    return _elems(tensors.get(node.outputs[0])) or 0


# The attributes ``node_flops`` reads, per op; everything else it reads is the op and the
# shapes and sizes of the node's tensors.
_COST_ATTRS = {"MatMul": ("transA",), "FusedMatMul": ("transA",), "MatMulInteger": ("transA",),
               "Gemm": ("transA",), "FusedGemm": ("transA",), "ConvTranspose": ("group",)}


def graph_costs(graph: Graph, tensors: dict[str, TensorInfo]) -> list[NodeCost]:
    """Cost of every node, indexed like ``graph.nodes``. Nodes alike in op, attributes read
    and tensor shapes share one cost, priced once: a model repeats its layers, so few of
    its nodes have a cost of their own."""
    get = tensors.get
    priced: dict[tuple[object, ...], NodeCost] = {}

    def facts(names: tuple[str, ...]) -> tuple[object, ...]:
        return tuple(ABSENT if t == ABSENT else None if (i := get(t)) is None else (i.shape, i.nbytes) for t in names)

    out = []
    for n in graph.nodes:
        attrs = _COST_ATTRS.get(n.op_type)
        key = (n.op_type, facts(n.inputs), facts(n.outputs), tuple(n.attr(a) for a in attrs) if attrs else ())
        c = priced.get(key)
        if c is None:
            c = priced[key] = node_cost(n, tensors)
        out.append(c)
    return out
