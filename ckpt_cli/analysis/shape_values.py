"""Shape values: small integer tensors computed from static shapes (Shape, Size and the
arithmetic on them), evaluated before the run.

ONNX's data propagation stops at some of these ops (int64 Div; Size feeding arithmetic),
ORT's at others (Slice, Concat, Reshape). ckpt evaluates them itself with ONNX's reference
evaluator, restricted to the ops the caller names, and shape inference then reads them
as constants.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper

from typing import TYPE_CHECKING, Any, Callable, cast, overload

from ..graph import ABSENT, Graph, Node

if TYPE_CHECKING:
    from .shapes import TensorInfo

# Ops ckpt evaluates on shape values.
# Equal and Where: the exporter's shape of an ``expand`` (-1 kept from the input's shape).
FOLDABLE = frozenset({"Shape", "Size", "Constant", "Gather", "Squeeze", "Unsqueeze", "Add", "Sub", "Mul", "Div",
                      "Concat", "Slice", "Cast", "Reshape", "Identity", "Equal", "Where"})
_MAX_ELEMENTS = 64
_INTEGER = (onnx.TensorProto.INT64, onnx.TensorProto.INT32)


def fold(graph: Graph, tensors: dict[str, TensorInfo], ops: frozenset[str],
         skip: frozenset[str] = frozenset()) -> dict[str, np.ndarray]:
    """Values of node outputs computable from static shapes and small integer
    initializers through ``ops`` (outputs in ``skip`` stay unknown)."""
    values: dict[str, np.ndarray] = {
        name: numpy_helper.to_array(t) for name, t in graph.initializers.items()
        if t.data_type in _INTEGER and t.data_location != onnx.TensorProto.EXTERNAL
        and math.prod(t.dims) <= _MAX_ELEMENTS}
    made: dict[str, np.ndarray] = {}
    opset = graph.opset("") or 18
    for i in graph.topological_order():
        node = graph.nodes[i]
        if _is_concat_training(node, ops) and node.outputs[0] not in skip:
            value = _evaluate(node, values, tensors, opset, as_op="Concat")
        elif node.op_type == "BroadcastGradientArgs" and node.domain == "com.microsoft":
            for out, axes in _gradient_axes(node, values, skip).items():
                values[out] = made[out] = axes
            continue
        elif (node.op_type not in ops or node.domain not in ("", "ai.onnx") or len(node.outputs) != 1
                or node.outputs[0] in skip):
            continue
        else:
            value = _evaluate(node, values, tensors, opset)
        if value is not None and value.dtype.kind in "iub" and value.size <= _MAX_ELEMENTS:
            values[node.outputs[0]] = made[node.outputs[0]] = value
    return made


def _gradient_axes(node: Node, values: dict[str, np.ndarray], skip: frozenset[str]) -> dict[str, np.ndarray]:
    """The values of a BroadcastGradientArgs node's outputs (reduction axes of a broadcast)."""
    from ..ort.shapes import broadcast_gradient_axes

    if len(node.inputs) < 2 or any(t not in values for t in node.inputs[:2]):
        return {}
    try:
        axes = broadcast_gradient_axes(*(values[t].reshape(-1).tolist() for t in node.inputs[:2]))
    except ValueError:
        return {}
    return {out: np.array(v, np.int64) for out, v in zip(node.outputs, axes) if out != ABSENT and out not in skip}


def _is_concat_training(node: Node, ops: frozenset[str]) -> bool:
    """ORT's training transformer turns Concat into com.microsoft ConcatTraining, whose first
    output is the Concat's (its second, the input lengths, is not a shape value)."""
    return node.op_type == "ConcatTraining" and node.domain == "com.microsoft" and "Concat" in ops


def _evaluate(node: Node, values: dict[str, np.ndarray], tensors: dict[str, TensorInfo],
              opset: int, as_op: str | None = None) -> np.ndarray | None:
    if node.op_type in ("Shape", "Size"):
        info = tensors.get(node.inputs[0])
        if info is None or info.shape is None or not all(isinstance(d, int) for d in info.shape):
            return None
        if node.op_type == "Size":
            return np.array(math.prod(info.shape), np.int64)
        return np.array(info.shape[node.attr("start", 0):node.attr("end", None)], np.int64)
    names = [t for t in node.inputs if t != ABSENT]
    if any(t not in values for t in names):
        return None
    fast = _FAST.get(as_op or node.op_type)
    if as_op is not None and fast is None:
        return None
    if fast is not None and (node.op_type not in _AXES_INPUT or opset >= 13):
        try:
            return np.asarray(fast(node, *(values[t] for t in names)))
        except (ValueError, IndexError, TypeError, ZeroDivisionError):
            return None
    inputs = [helper.make_tensor_value_info(t, helper.np_dtype_to_tensor_dtype(values[t].dtype), values[t].shape)
              for t in dict.fromkeys(names)]
    g = helper.make_graph([node.proto], "fold", inputs, [helper.make_empty_tensor_value_info(node.outputs[0])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    try:
        from onnx.reference import ReferenceEvaluator

        # run answers a list unless asked for intermediate values
        outputs = cast(list[object], ReferenceEvaluator(model).run(None, {t: values[t] for t in names}))
        return np.asarray(outputs[0])
    except Exception:  # an op the evaluator rejects leaves the value unknown
        return None


def _div(node: Node, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind not in "iu" or b.dtype.kind not in "iu" or not np.all(b):
        raise ValueError("not an integer division")
    q = np.abs(a) // np.abs(b)  # C++ integer division truncates toward zero
    quotient: np.ndarray = np.where((a < 0) != (b < 0), -q, q).astype(np.result_type(a, b))
    return quotient


@overload
def _axes(a: np.ndarray, axes: np.ndarray) -> tuple[int, ...]: ...
@overload
def _axes(a: np.ndarray, axes: None = None) -> None: ...
def _axes(a: np.ndarray, axes: np.ndarray | None = None) -> tuple[int, ...] | None:
    return None if axes is None else tuple(int(x) for x in axes.reshape(-1))


# numpy for the common ops (the reference evaluator is slow for each node); from
# opset 13 on, Squeeze and Unsqueeze take their axes as an input.
_AXES_INPUT = frozenset({"Squeeze", "Unsqueeze"})
_FAST: dict[str, Callable[..., Any]] = {
    "Identity": lambda n, a: a,
    "Add": lambda n, a, b: a + b,
    "Sub": lambda n, a, b: a - b,
    "Mul": lambda n, a, b: a * b,
    "Div": _div,
    "Concat": lambda n, *xs: np.concatenate(xs, axis=n.attr("axis", 0)),
    "Gather": lambda n, a, i: np.take(a, i, axis=n.attr("axis", 0)),
    "Unsqueeze": lambda n, a, axes: np.expand_dims(a, tuple(
        x % (a.ndim + len(_axes(a, axes))) for x in _axes(a, axes))),
    "Squeeze": lambda n, a, axes=None: np.squeeze(a, _axes(a, axes)),
}
