"""A small hand-built training graph with a known structure, for exact tests.

``h{i+1} = Relu(h{i} @ W{i})`` for ``layers`` layers, ``loss = ReduceSum(h{L})``, and
its backward: ``dz = dh * (z > 0)``, ``dW = h^T @ dz``, ``dh = dz @ W^T``. Every
activation is ``batch x width`` float32, so liveness is easy to compute by hand.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper


def chain_model(layers: int = 4, batch: int = 256, width: int = 256, scoped: bool = True,
                dropout_layer: int | None = None) -> onnx.ModelProto:
    def name(i: int, op: str) -> str:
        return f"/layers.{i}/{op}" if scoped else f"node_{op.lower()}_{i}"

    nodes = []
    h = "x"
    for i in range(layers):
        nodes.append(helper.make_node("MatMul", [h, f"layers.{i}.weight"], [f"z{i}"], name=name(i, "MatMul")))
        nodes.append(helper.make_node("Relu", [f"z{i}"], [f"a{i}"], name=name(i, "Relu")))
        out = f"a{i}"
        if dropout_layer == i:
            nodes.append(helper.make_node("Dropout", [out, "ratio", "training"], [f"d{i}", f"m{i}"],
                                          name=name(i, "Dropout"), seed=7))
            out = f"d{i}"
        h = out
    nodes.append(helper.make_node("ReduceSum", [h], ["loss"], name="/loss/ReduceSum", keepdims=0))
    # backward
    nodes.append(helper.make_node("Shape", [h], ["h_shape"], name="/loss_grad/Shape"))
    nodes.append(helper.make_node("Expand", ["tangent_loss", "h_shape"], ["dh_out"], name="/loss_grad/Expand"))
    dh = "dh_out"
    for i in reversed(range(layers)):
        if dropout_layer == i:
            nodes.append(helper.make_node("Cast", [f"m{i}"], [f"mf{i}"], to=TensorProto.FLOAT,
                                          name=name(i, "Cast_dropgrad")))
            nodes.append(helper.make_node("Mul", [dh, f"mf{i}"], [f"dd{i}"], name=name(i, "Mul_dropgrad")))
            nodes.append(helper.make_node("Div", [f"dd{i}", "keep"], [f"da{i}"], name=name(i, "Div_dropgrad")))
            dh = f"da{i}"
        nodes.append(helper.make_node("Greater", [f"z{i}", "zero"], [f"pos{i}"], name=name(i, "Greater_grad")))
        nodes.append(helper.make_node("Cast", [f"pos{i}"], [f"posf{i}"], to=TensorProto.FLOAT, name=name(i, "Cast_grad")))
        nodes.append(helper.make_node("Mul", [dh, f"posf{i}"], [f"dz{i}"], name=name(i, "Mul_grad")))
        src = "x" if i == 0 else _act(i - 1, dropout_layer)
        nodes.append(helper.make_node("Transpose", [src], [f"hT{i}"], perm=[1, 0], name=name(i, "Transpose_grad")))
        nodes.append(helper.make_node("MatMul", [f"hT{i}", f"dz{i}"], [f"layers.{i}.weight_grad"],
                                      name=name(i, "MatMul_wgrad")))
        if i > 0:
            nodes.append(helper.make_node("Transpose", [f"layers.{i}.weight"], [f"WT{i}"], perm=[1, 0],
                                          name=name(i, "TransposeW_grad")))
            nodes.append(helper.make_node("MatMul", [f"dz{i}", f"WT{i}"], [f"dh{i - 1}"], name=name(i, "MatMul_dgrad")))
            dh = f"dh{i - 1}"
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, width])]
    inputs += [helper.make_tensor_value_info(f"layers.{i}.weight", TensorProto.FLOAT, [width, width])
               for i in range(layers)]
    inputs.append(helper.make_tensor_value_info("tangent_loss", TensorProto.FLOAT, []))
    outputs = [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])]
    outputs += [helper.make_tensor_value_info(f"layers.{i}.weight_grad", TensorProto.FLOAT, [width, width])
                for i in range(layers)]
    inits = [helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])]
    if dropout_layer is not None:
        inits += [helper.make_tensor("ratio", TensorProto.FLOAT, [], [0.25]),
                  helper.make_tensor("keep", TensorProto.FLOAT, [], [0.75]),
                  helper.make_tensor("training", TensorProto.BOOL, [], [True])]
    graph = helper.make_graph(nodes, "chain", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _act(i: int, dropout_layer: int | None) -> str:
    return f"d{i}" if dropout_layer == i else f"a{i}"


def chain_feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for v in model.graph.input:
        shape = [d.dim_value for d in v.type.tensor_type.shape.dim]
        feeds[v.name] = np.array(1.0, np.float32) if v.name == "tangent_loss" else (
            rng.standard_normal(shape).astype(np.float32) * 0.1)
    return feeds
