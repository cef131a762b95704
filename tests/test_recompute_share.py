"""The recompute share a conv net's default rewrite reports, against an independent count.

The count here shares no code with ``analysis/cost.py``: ONNX's own shape inference sizes
the tensors, and the ops are counted from their definitions (a multiply-add is two FLOPs): Conv (grouped
and depthwise included), ORT training's ConvGrad (dX and dW each the forward's products,
dB one add per element of dY), Gemm and MatMul, batch norms by their textbook steps,
elementwise ops one per output element; data movement and reductions to a scalar are
left out.
"""

from __future__ import annotations

import math

import onnx
from onnx import shape_inference

from conftest import ROOT
from ckpt_cli import rewrite_model
from ckpt_cli.markers import RECOMPUTE_META

MOBILENET = ROOT / "sample_models" / "zoo" / "mobilenet_v2" / "training_model.onnx"


# ORT training ops whose first output has their first input's shape: ONNX's inference stops
# at them, so their output's shape is handed to it and inference runs again
SAME_SHAPE = {"BatchNormInternal"}


def _known(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    shapes = {init.name: tuple(init.dims) for init in model.graph.initializer}
    for v in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
        dim = v.type.tensor_type.shape.dim
        if dim and all(d.HasField("dim_value") for d in dim):
            shapes[v.name] = tuple(d.dim_value for d in dim)
    return shapes


def _shapes(model: onnx.ModelProto, dims: dict[str, int]) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape ONNX's inference gives, with the symbolic dims bound as ckpt bound them."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    for value in model.graph.input:
        for d in value.type.tensor_type.shape.dim:
            if d.dim_param in dims:
                d.dim_value = dims[d.dim_param]
    while True:
        model = shape_inference.infer_shapes(model, data_prop=True)
        shapes = _known(model)
        handed = [onnx.helper.make_tensor_value_info(n.output[0], onnx.TensorProto.FLOAT, shapes[n.input[0]])
                  for n in model.graph.node
                  if n.op_type in SAME_SHAPE and n.input[0] in shapes and n.output[0] not in shapes]
        if not handed:
            return shapes
        model.graph.value_info.extend(handed)


# FLOPs per element of a batch norm's input, from the textbook's steps. Training forward:
# the mean (1), the variance (subtract, square, add: 3), normalize (subtract, multiply: 2),
# scale and shift (2). Gradient: x-hat again (2), dgamma = sum(dy * x-hat) (2), dbeta =
# sum(dy) (1), dx = g / sigma * (dy - dbeta / N - x-hat * dgamma / N) (5).
PER_ELEMENT = {"BatchNormInternal": 8, "BatchNormalizationGrad": 10}
# one FLOP per output element
ELEMENTWISE = {"Clip", "Relu", "Add", "Sub", "Mul", "Div", "Sum", "LessOrEqual", "GreaterOrEqual", "And", "Cast"}


def _conv_products(y: tuple[int, ...], w: tuple[int, ...]) -> int:
    """Multiply-adds of a convolution: each output element reads Cin/group x kernel inputs."""
    return math.prod(y) * math.prod(w[1:])


def _conv_output(node: onnx.NodeProto, x: tuple[int, ...], w: tuple[int, ...]) -> tuple[int, ...]:
    """Conv's output shape from its definition (explicit pads; torch exports no auto_pad)."""
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    spatial = len(x) - 2
    strides = attrs.get("strides", [1] * spatial)
    dilations = attrs.get("dilations", [1] * spatial)
    pads = attrs.get("pads", [0] * 2 * spatial)
    assert attrs.get("auto_pad", b"NOTSET") in (b"NOTSET", "NOTSET")
    out = [(x[2 + i] + pads[i] + pads[spatial + i] - dilations[i] * (w[2 + i] - 1) - 1) // strides[i] + 1
           for i in range(spatial)]
    return (x[0], w[0], *out)


def _flops(node: onnx.NodeProto, shapes: dict[str, tuple[int, ...]]) -> int:
    size = shapes.get
    if node.op_type == "Conv":
        w = size(node.input[1])
        return 2 * _conv_products(_conv_output(node, size(node.input[0]), w), w)
    if node.op_type == "ConvGrad":  # (dY, X, W) -> (dX, dW, dB); dY has the forward output's shape
        w = size(node.input[2])
        dy = _conv_output(node, size(node.input[1]), w)
        bias = math.prod(dy) if len(node.output) > 2 and node.output[2] else 0
        return 2 * 2 * _conv_products(dy, w) + bias
    if node.op_type in PER_ELEMENT:  # BatchNormalizationGrad is (dY, X, ...): X is sized in the forward
        x = node.input[1] if node.op_type.endswith("Grad") else node.input[0]
        return PER_ELEMENT[node.op_type] * math.prod(size(x))
    if node.op_type in ELEMENTWISE:
        # a gradient's shape is not inferred past ORT's training ops; the elementwise op's
        # output is as large as its largest input
        # input; ORT's gradient builder names X's gradient X_grad (summed from X_grad_0, ...)
        named = [t.split("_grad")[0] for t in [*node.output[:1], *node.input] if "_grad" in t]
        known = [size(t) for t in [*node.output[:1], *node.input, *named] if size(t) is not None]
        return max(math.prod(k) for k in known)
    if node.op_type in ("MatMul", "Gemm"):
        a, y = size(node.input[0]), size(node.output[0])
        return 2 * math.prod(y) * a[-1] if a and y else 0
    return 0


def test_mobilenet_default_recompute_share_matches_an_independent_count(tmp_path):
    out = rewrite_model(MOBILENET, tmp_path / "mb.onnx")
    reported = out.report["planning"]["recompute_share_of_step"]
    dims = dict(out.analysis.dims)
    original = onnx.load(MOBILENET)
    original_shapes = _shapes(original, dims)
    step = sum(_flops(n, original_shapes) for n in original.graph.node)
    # a copy computes what the node it copies computes, on tensors of the same shapes
    by_name = {n.name: n for n in original.graph.node}
    copied = [by_name[p.value] for n in onnx.load(tmp_path / "mb.onnx").graph.node
              for p in n.metadata_props if p.key == RECOMPUTE_META]
    recomputed = sum(_flops(n, original_shapes) for n in copied)
    assert copied and step > 0 and reported > 0.05, "the default recomputes convolutions"
    assert abs(recomputed / step - reported) <= 0.10 * reported, (recomputed / step, reported)
