"""ONNX Runtime training's function ops that its CPU provider has no kernel for: ORT inlines
their function body when a session starts, so the nodes it runs are the body's, not the
file's. ckpt writes the same body in their place (the expansion ``ort.expand`` makes for
ONNX-domain functions from onnx's schemas): the simulated schedule is then the one ORT
runs, and a rewritten file runs as written in every ORT build.

The bodies are ORT 1.19.2's (orttraining/orttraining/core/graph/training_op_defs.cc), in
their order; new tensors and nodes are named after the op (``<node>/<tensor>``,
``<node>/<Op>_<k>``) and carry its metadata.
"""

from __future__ import annotations

from typing import Any

import onnx
from onnx import helper

from ..graph import ABSENT, Graph, Node

MS = "com.microsoft"
# (outputs, op, inputs, domain, attributes): names of the body's formal inputs and outputs
# are the schema's, others are the body's own
BodyNode = tuple[tuple[str, ...], str, tuple[str, ...], str, dict[str, Any]]

_NOOP_EMPTY = {"noop_with_empty_axes": 1}
DIV_GRAD: tuple[BodyNode, ...] = (
    (("shape_A",), "Shape", ("A",), "", {}),
    (("shape_B",), "Shape", ("B",), "", {}),
    (("axes_A", "axes_B"), "BroadcastGradientArgs", ("shape_A", "shape_B"), MS, {}),
    (("dY_over_B",), "Div", ("dY", "B"), "", {}),
    (("reduce_dA",), "ReduceSumTraining", ("dY_over_B", "axes_A"), MS, _NOOP_EMPTY),
    (("dA",), "Reshape", ("reduce_dA", "shape_A"), "", {}),
    (("B_squared",), "Mul", ("B", "B"), "", {}),
    (("minus_A",), "Neg", ("A",), "", {}),
    (("minus_A_over_B_squared",), "Div", ("minus_A", "B_squared"), "", {}),
    (("pre_reduce_dB",), "Mul", ("dY", "minus_A_over_B_squared"), "", {}),
    (("reduce_dB",), "ReduceSumTraining", ("pre_reduce_dB", "axes_B"), MS, _NOOP_EMPTY),
    (("dB",), "Reshape", ("reduce_dB", "shape_B"), "", {}),
)

# op (com.microsoft) -> (formal inputs, formal outputs, body)
FUNCTIONS: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[BodyNode, ...]]] = {
    "DivGrad": (("dY", "A", "B"), ("dA", "dB"), DIV_GRAD),
}


def _body(node: Node, formal_in: tuple[str, ...], formal_out: tuple[str, ...],
          body: tuple[BodyNode, ...]) -> list[onnx.NodeProto]:
    """``node``'s function body as nodes of the graph."""
    names = {f: t for f, t in zip(formal_in, node.inputs)}
    names.update((f, t) for f, t in zip(formal_out, node.outputs) if t != ABSENT)
    def name(t: str) -> str:
        return names.get(t) or f"{node.name}/{t}"

    out = []
    for k, (outs, op, ins, domain, attrs) in enumerate(body):
        p = helper.make_node(op, [name(t) for t in ins], [name(t) for t in outs], name=f"{node.name}/{op}_{k}",
                             domain=domain, **attrs)
        p.metadata_props.extend(node.proto.metadata_props)
        out.append(p)
    return out


def contrib_expansion(graph: Graph) -> dict[int, list[onnx.NodeProto]]:
    """The body of every ORT training function op ORT's CPU provider inlines, by the op's
    position (empty when there is none); the model imports the domain its body uses."""
    expansion = {n.index: _body(n, *FUNCTIONS[n.op_type]) for n in graph.nodes
                 if n.domain == MS and n.op_type in FUNCTIONS}
    if expansion and not any(o.domain == MS for o in graph.model.opset_import):
        graph.model.opset_import.append(helper.make_opsetid(MS, 1))
    return expansion
