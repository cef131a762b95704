"""Working memory of ONNX Runtime kernels, allocated outside ORT's allocator.

Some CPU kernels build temporaries with Eigen or ``std::vector`` while they run. ORT's
allocation planner and its profiler never see them; the process does. So they count
toward a process-peak measurement (the only one ORT's training build allows) and not
toward ORT's arena. Each rule gives the bytes one node holds while it runs, from the
kernels of ORT 1.19.2 (``orttraining/training_ops/cpu/nn/layer_norm.cc``,
``core/providers/cpu/ml/..softmax_cross_entropy_loss``, ``core/providers/cpu/tensor/where_op.cc``),
each checked against a one-node model in a process-peak measurement.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

Shape = Optional[tuple]
Sized = Callable[[str], Optional[tuple[Shape, int]]]  # tensor -> (shape, item size)


def _elements(shape: Shape) -> int | None:
    if shape is None or not all(isinstance(d, int) for d in shape):
        return None
    return math.prod(shape)


def _layer_norm_grad(node, sized: Sized) -> int:
    """LayerNormalizationGrad and its variants: four M x N arrays the size of X (input 1)."""
    x = sized(node.inputs[1]) if len(node.inputs) > 1 else None
    n = _elements(x[0]) if x else None
    return 4 * n * x[1] if n else 0


def _softmax_cross_entropy(node, sized: Sized) -> int:
    """SoftmaxCrossEntropyLoss: the shifted logits (N x C), a transposed copy of logits of
    rank above 2, and log-probabilities of its own when the node has no log_prob output."""
    logits = sized(node.inputs[0])
    n = _elements(logits[0]) if logits else None
    if not n:
        return 0
    copies = 1 + (len(logits[0]) > 2) + (len(node.outputs) < 2 or not node.outputs[1])
    return copies * n * logits[1]


def _broadcast_elements(a: Shape, b: Shape) -> int | None:
    if a is None or b is None:
        return None
    rank = max(len(a), len(b))
    a, b = (1,) * (rank - len(a)) + tuple(a), (1,) * (rank - len(b)) + tuple(b)
    dims = [y if x == 1 else x for x, y in zip(a, b)]
    return _elements(tuple(dims))


def _where(node, sized: Sized) -> int:
    """Where: the two branches each broadcast against the condition before the select."""
    cond, x, y = (sized(t) for t in node.inputs[:3])
    if not (cond and x and y):
        return 0
    nx, ny = _broadcast_elements(cond[0], x[0]), _broadcast_elements(cond[0], y[0])
    return (nx + ny) * x[1] if nx is not None and ny is not None else 0


_RULES: dict[tuple[str, str], Callable] = {
    ("com.microsoft", "LayerNormalizationGrad"): _layer_norm_grad,
    ("com.microsoft", "SimplifiedLayerNormalizationGrad"): _layer_norm_grad,
    ("com.microsoft", "InvertibleLayerNormalizationGrad"): _layer_norm_grad,
    ("", "SoftmaxCrossEntropyLoss"): _softmax_cross_entropy,
    ("", "Where"): _where,
}


def scratch_bytes(node, sized: Sized) -> int:
    """Bytes ``node``'s kernel holds outside ORT's allocator while it runs (0 if none known)."""
    rule = _RULES.get(("" if node.domain == "ai.onnx" else node.domain, node.op_type))
    return rule(node, sized) if rule is not None else 0
