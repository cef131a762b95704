"""Ops in the ONNX domain that ONNX Runtime registers and onnx does not know.

ORT's training build registers some gradient ops without a domain, so ORT training
artifacts hold them in the ONNX domain (``MaxPoolGrad`` after a MaxPool). ORT's contrib
schemas register ``LayerNormalization`` from version 1, where onnx has it only from
opset 17, and ORT's training fusion rebuilds it in graphs exported at opsets 14-16.
onnx's checker refuses all of these ("No Op registered for ..."); ckpt accepts a node
that ORT registers at the node's opset and leaves every other unknown op to the checker.
Accepted here is not valid: ORT itself then checks such nodes (ort/validate.py).
"""

from __future__ import annotations

from collections import Counter
from functools import cache
from typing import Iterable

import onnx

ONNX_DOMAINS = ("", "ai.onnx")

# The training build's ONNX-domain schemas (onnxruntime orttraining/core/graph/training_op_defs.cc),
# each with the version it is registered from.
TRAINING_OPS: dict[str, int] = {
    "MaxPoolGrad": 9, "AveragePoolGrad": 9, "ConvGrad": 9, "SinGrad": 9, "ReshapeGrad": 9,
    "SparseSoftmaxCrossEntropy": 9, "SparseSoftmaxCrossEntropyGrad": 9, "TrainableDropout": 9,
    "HorovodAllReduce": 9, "HorovodBarrier": 9, "GatherND": 1,
}
# ORT's contrib schemas in the ONNX domain (core/graph/contrib_ops), which onnx adds later or never.
CONTRIB_OPS: dict[str, int] = {"LayerNormalization": 1, "SimplifiedLayerNormalization": 1}
_TENSORRT_PLUGIN = "_TRT"  # suffix of the plugin schemas ORT registers for its TensorRT provider


@cache
def _installed_schemas() -> dict[str, int]:
    """ONNX-domain schemas of the installed onnxruntime (op -> lowest version), where it
    lists them (1.19's training wheel does not)."""
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as ort_state
        schemas = ort_state.get_all_operator_schema()
    except (ImportError, AttributeError, RuntimeError):
        return {}
    lowest: dict[str, int] = {}
    for s in schemas:
        # TensorRT plugin schemas: only ORT's TensorRT provider runs them, never the CPU one
        if s.domain in ONNX_DOMAINS and not s.name.endswith(_TENSORRT_PLUGIN):
            lowest[s.name] = min(s.since_version, lowest.get(s.name, s.since_version))
    return lowest


def onnx_knows(op_type: str, opset: int) -> bool:
    return onnx.defs.has(op_type, opset, "")


def ort_registers(op_type: str, opset: int) -> bool:
    """ORT has a schema for this ONNX-domain op at this opset."""
    since = TRAINING_OPS.get(op_type) or CONTRIB_OPS.get(op_type)
    if since is None:
        since = _installed_schemas().get(op_type)
    return since is not None and since <= opset


def is_ort_only(op_type: str, opset: int) -> bool:
    """An ONNX-domain op onnx does not know at ``opset`` and ORT registers."""
    return not onnx_knows(op_type, opset) and ort_registers(op_type, opset)


def onnx_opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ONNX_DOMAINS), 0)


def ort_only_nodes(model: onnx.ModelProto, nodes: Iterable[onnx.NodeProto] | None = None) -> list[onnx.NodeProto]:
    """Nodes in the ONNX domain that onnx does not know at the model's opset and ORT registers."""
    opset = onnx_opset(model)
    unknown: dict[str, bool] = {}
    out = []
    for node in model.graph.node if nodes is None else nodes:
        if node.domain not in ONNX_DOMAINS:
            continue
        accepted = unknown.get(node.op_type)
        if accepted is None:
            accepted = unknown[node.op_type] = is_ort_only(node.op_type, opset)
        if accepted:
            out.append(node)
    return out


def ort_only_ops(model: onnx.ModelProto) -> dict[str, int]:
    """Op type -> count of the nodes ``ort_only_nodes`` accepts, for reports."""
    return dict(sorted(Counter(n.op_type for n in ort_only_nodes(model)).items()))
