"""Work-arounds for ONNX Runtime kernels known to compute wrongly (``ops.ort_kernel_defects``).

onnxruntime-training 1.19.2's CPU ConvGrad over one spatial axis with ``group`` above 1
writes past its buffers; over two axes it runs clean. A 1-D convolution is a 2-D one over
a height of 1, so each such node becomes Unsqueeze (dY, X and W at axis 2), a ConvGrad
with 2-D attributes (1 on the new axis: kernel, stride, dilation; no padding), and Squeeze
(dX and dW back at axis 2). The 2-D kernel's gradients match PyTorch's conv1d ones
(tests/test_kernel_defects.py).
"""

from __future__ import annotations

from typing import Any

import onnx
from onnx import helper

from ..graph import Graph, unique_name
from ..ops import grouped_1d_conv_grad

_AXIS = 2  # N, C, then the new unit axis before the one spatial axis


def conv_grads_in_2d(graph: Graph) -> tuple[Graph, int]:
    """``graph`` with each grouped 1-D ConvGrad in its 2-D form, and how many there were."""
    taken = {t for n in graph.nodes for t in (*n.inputs, *n.outputs, n.name)} | set(graph.inputs) | \
        set(graph.initializers)
    protos: list[onnx.NodeProto] = []
    count = 0
    for node in graph.nodes:
        if grouped_1d_conv_grad(node.proto) and _one_axis(node.proto):
            protos += _in_2d(node.proto, taken, (graph.opset("") or 1) >= 13)
            count += 1
        else:
            protos.append(node.proto)
    return (graph.with_nodes(protos) if count else graph), count


def _one_axis(node: onnx.NodeProto) -> bool:
    """Its attributes are those of one spatial axis (anything else ORT refuses as it is)."""
    lengths = {"pads": 2, "strides": 1, "dilations": 1}
    return all(len(a.ints) == lengths[a.name] for a in node.attribute if a.name in lengths) and len(node.input) >= 3


def _in_2d(node: onnx.NodeProto, taken: set[str], axes_input: bool) -> list[onnx.NodeProto]:
    base = node.name or "ConvGrad"
    out: list[onnx.NodeProto] = []
    axes: dict[str, Any] = {"axes": [_AXIS]}  # make_node's attributes
    if axes_input:  # Unsqueeze and Squeeze take their axes as an input from opset 13
        name = unique_name(f"{base}/in_2d/axes", taken)
        out.append(helper.make_node("Constant", [], [name], name=name,
                                    value=helper.make_tensor(name, onnx.TensorProto.INT64, [1], [_AXIS])))
        axes = {}

    def reshaped(op: str, src: str, dst: str) -> onnx.NodeProto:
        inputs = [src, out[0].output[0]] if axes_input else [src]
        return helper.make_node(op, inputs, [dst], name=unique_name(f"{base}/in_2d/{op}", taken), **axes)

    inputs = [unique_name(f"{t}/in_2d", taken) for t in node.input[:3]]
    out += [reshaped("Unsqueeze", t, u) for t, u in zip(node.input[:3], inputs)]
    outputs = [unique_name(f"{t}/in_2d", taken) if t and k < 2 else t for k, t in enumerate(node.output)]
    grad = onnx.NodeProto()
    grad.CopyFrom(node)
    del grad.input[:], grad.output[:], grad.attribute[:]
    grad.input.extend(inputs + list(node.input[3:]))
    grad.output.extend(outputs)
    grad.attribute.extend(_attributes_2d(node))
    out.append(grad)
    out += [reshaped("Squeeze", u, t) for t, u in zip(node.output[:2], outputs[:2]) if t]
    return out


def _attributes_2d(node: onnx.NodeProto) -> list[onnx.AttributeProto]:
    """The node's attributes over (1, L): a unit kernel, stride and dilation on the new axis, no padding."""
    out = []
    for a in node.attribute:
        b = onnx.AttributeProto()
        b.CopyFrom(a)
        if a.name in ("kernel_shape", "strides", "dilations"):
            del b.ints[:]
            b.ints.extend([1, *a.ints])
        elif a.name == "pads":
            del b.ints[:]
            b.ints.extend([0, a.ints[0], 0, a.ints[1]])
        out.append(b)
    return out
