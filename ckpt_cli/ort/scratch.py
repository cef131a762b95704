"""Working memory of ONNX Runtime kernels: buffers a kernel holds while it runs.

Some CPU kernels build temporaries with Eigen or ``std::vector`` while they run; others
(Conv, ConvGrad: im2col) take them from the temp-space allocator. ORT's allocation planner
and its profiler see none of them; the process does. So they count toward a process-peak
measurement (the only one ORT's training build allows). Each rule gives the bytes one
node holds while it runs, from the kernels of ORT 1.19.2
(``orttraining/training_ops/cpu/nn/layer_norm.cc``, ``.../cpu/nn/conv_grad.cc``, ``.../cpu/rnn/gru_grad_compute.cc``,
``core/providers/cpu/ml/..softmax_cross_entropy_loss``, ``core/providers/cpu/tensor/where_op.cc``,
``core/mlas/lib/convolve.cpp``, ``core/providers/cpu/math/element_wise_ops.cc``,
``core/providers/cpu/reduction/reduction_ops.cc``, ``core/providers/cpu/tensor/scatter.cc``,
``core/providers/cpu/tensor/expand.cc``), each checked against a one-node model in a
process-peak measurement.
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Union

from ..graph import Node

Dims = tuple[Union[int, str], ...]  # a str: a symbolic dimension
Sized = Callable[[str], Optional[tuple[Optional[Dims], int]]]  # tensor -> (shape, item size)
Values = Callable[[str], Optional[list[int]]]  # tensor -> its values, where it is an int constant


def _shaped(sized: Sized, tensor: str) -> tuple[Dims, int] | None:
    """``tensor``'s shape and item size, when its shape is known (dimensions may be symbolic)."""
    found = sized(tensor)
    return (found[0], found[1]) if found is not None and found[0] is not None else None


def _elements(shape: Dims) -> int | None:
    ints = [d for d in shape if isinstance(d, int)]
    return math.prod(ints) if len(ints) == len(shape) else None


def _layer_norm_grad(node: Node, sized: Sized) -> int:
    """LayerNormalizationGrad and its variants: four M x N arrays the size of X (input 1)."""
    x = _shaped(sized, node.inputs[1]) if len(node.inputs) > 1 else None
    if x is None or not (n := _elements(x[0])):
        return 0
    return 4 * n * x[1]


def _softmax_cross_entropy(node: Node, sized: Sized) -> int:
    """SoftmaxCrossEntropyLoss: the shifted logits (N x C), a transposed copy of logits of
    rank above 2, and log-probabilities of its own when the node has no log_prob output."""
    logits = _shaped(sized, node.inputs[0])
    if logits is None or not (n := _elements(logits[0])):
        return 0
    copies = 1 + (len(logits[0]) > 2) + (len(node.outputs) < 2 or not node.outputs[1])
    return copies * n * logits[1]


def broadcast(a: Dims, b: Dims) -> Dims:
    """The numpy-style broadcast of two shapes (a symbol stands where the other side is 1)."""
    rank = max(len(a), len(b))
    a, b = (1,) * (rank - len(a)) + tuple(a), (1,) * (rank - len(b)) + tuple(b)
    return tuple(y if x == 1 else x for x, y in zip(a, b))


def _broadcast_elements(a: Dims, b: Dims) -> int | None:
    return _elements(broadcast(a, b))


def variadic_temporaries(node: Node, sized: Sized) -> tuple[list[int], int] | None:
    """Sum, Mean, Max and Min of three or more inputs (the CPU kernels of opset 8 on,
    ``UntypedBroadcastVariadic`` in ``core/providers/cpu/math/element_wise_ops.cc``): the
    bytes of the temporaries the kernel takes from its allocator, in order, and of its
    output. It combines the inputs left to right, each step but the last into a new
    temporary of the broadcast shape so far; the temporary before it is released once the
    new one is made, and the last one while the output is written. None where a shape is
    unknown or there are fewer than three inputs (no temporary)."""
    shaped = [_shaped(sized, t) for t in node.inputs if t]
    if len(shaped) < 3 or any(s is None for s in shaped) or not node.outputs:
        return None
    shape, item = shaped[0][0], shaped[0][1]  # type: ignore[index]
    temps = []
    for found in shaped[1:-1]:
        shape = broadcast(shape, found[0])  # type: ignore[index]
        n = _elements(shape)
        if n is None:
            return None
        temps.append(n * item)
    out = _elements(broadcast(shape, shaped[-1][0]))  # type: ignore[index]
    return (temps, out * item) if out is not None else None


def _variadic(node: Node, sized: Sized) -> int:
    """``variadic_temporaries``, held above the output (a step's figure counts the output):
    two temporaries at once before the output is made, one while it is written."""
    found = variadic_temporaries(node, sized)
    if found is None:
        return 0
    temps, out = found
    before = max(t + (temps[i - 1] if i else 0) for i, t in enumerate(temps))
    return max(before - out, temps[-1])


def _where(node: Node, sized: Sized) -> int:
    """Where: the two branches each broadcast against the condition before the select."""
    cond, x, y = (_shaped(sized, t) for t in node.inputs[:3])
    if not (cond and x and y):
        return 0
    nx, ny = _broadcast_elements(cond[0], x[0]), _broadcast_elements(cond[0], y[0])
    return (nx + ny) * x[1] if nx is not None and ny is not None else 0


def _conv_grad(node: Node, sized: Sized) -> int:
    """ConvGrad(dY, X, W): an im2col column buffer for one image and group (input channels
    per group x kernel elements x output pixels) and a row of ones (output pixels).
    Unknown (0) where a dimension it multiplies is symbolic."""
    dy, x, w = (_shaped(sized, t) for t in node.inputs[:3])
    if not (dy and x and w):
        return 0
    pixels, kernel, channels = _elements(dy[0][2:]), _elements(w[0][2:]), x[0][1]
    if pixels is None or kernel is None or not isinstance(channels, int):
        return 0
    groups = int(node.attr("group", 1) or 1)
    return (channels // groups * kernel * pixels + pixels) * x[1]


def _conv(node: Node, sized: Sized) -> int:
    """Conv (MLAS): a pointwise conv reads its input directly; one with more filters per
    group than output pixels expands the whole im2col matrix (output pixels x input
    channels per group x kernel elements); others work in per-thread slices of 64 KiB.
    Unknown (0) where a dimension it multiplies is symbolic."""
    x, w, y = _shaped(sized, node.inputs[0]), _shaped(sized, node.inputs[1]), _shaped(sized, node.outputs[0])
    if not (x and w and y):
        return 0
    pixels, kernel, filters, channels = _elements(y[0][2:]), _elements(w[0][2:]), w[0][0], w[0][1]
    if pixels is None or not isinstance(filters, int):
        return 0
    groups = int(node.attr("group", 1) or 1)
    pointwise = kernel == 1 and set(node.attr("strides", [])) <= {1} and set(node.attr("pads", [])) <= {0}
    if pointwise or filters // groups <= pixels or kernel is None or not isinstance(channels, int):
        return 0
    return pixels * channels * kernel * x[1]


def _gru_grad(node: Node, sized: Sized) -> int:
    """GRUGrad (one direction): one step's weight gradients before it adds them into dW and dR
    (3H x input, 3H x H), the gate gradients (3H) and the reset factor (H), and zeros for
    H0 (input 5) and dH0 (output 4) where the node has none (batch x H each)."""
    x = _shaped(sized, node.inputs[0])
    r = _shaped(sized, node.inputs[2]) if len(node.inputs) > 2 else None
    if not (x and r) or _elements(x[0]) is None or len(x[0]) != 3 or _elements(r[0]) is None:
        return 0
    hidden, batch, width = int(node.attr("hidden_size") or r[0][-1]), int(x[0][1]), int(x[0][2])
    absent = sum(len(names) <= k or not names[k] for names, k in ((node.inputs, 5), (node.outputs, 4)))
    return (3 * hidden * (width + hidden) + 4 * hidden + absent * batch * hidden) * x[1]


def _scatter_indices(node: Node, sized: Sized) -> int:
    """ScatterElements (Scatter at opsets 9 and 10) and GatherElementsGrad, which scatters
    through the same code: the indices (input 1; GatherElementsGrad's input 2) are copied,
    widened and bounds-checked, into a ``std::vector<int64_t>`` before the scatter
    (``core/providers/cpu/tensor/scatter.cc``), 8 bytes per index whatever the index type
    (measured on ORT 1.19.2's training build and on ORT 1.31.1; newer sources read the
    indices in place)."""
    k = 2 if node.op_type == "GatherElementsGrad" else 1
    indices = _shaped(sized, node.inputs[k]) if len(node.inputs) > k and node.inputs[k] else None
    n = _elements(indices[0]) if indices is not None else None
    return 8 * n if n else 0


def _expand_offsets(node: Node, sized: Sized) -> int:
    """Expand: the kernel first copies the input out in runs (the input's dimensions right of
    the innermost one it expands), keeping each run's output offset in a
    ``std::vector<int64_t>`` while it then replicates them (``core/providers/cpu/tensor/expand.cc``):
    8 bytes per run (measured on ORT 1.19.2's training build and on ORT 1.31.1)."""
    x = _shaped(sized, node.inputs[0]) if node.inputs else None
    y = _shaped(sized, node.outputs[0]) if node.outputs else None
    if not (x and y) or not all(isinstance(d, int) for d in (*x[0], *y[0])) or len(x[0]) > len(y[0]):
        return 0
    out = tuple(int(d) for d in y[0])
    ins = (1,) * (len(out) - len(x[0])) + tuple(int(d) for d in x[0])
    total, run = math.prod(ins), 1
    for i in reversed(range(len(out))):
        run *= ins[i]
        if (ins[i] == 1 and out[i] > 1) or i == 0:
            break
    return 8 * (total // run) if total and run else 0


_RULES: dict[tuple[str, str], Callable[[Node, Sized], int]] = {
    ("com.microsoft", "ConvGrad"): _conv_grad,
    ("", "ConvGrad"): _conv_grad,
    ("", "Conv"): _conv,
    ("com.microsoft", "LayerNormalizationGrad"): _layer_norm_grad,
    ("com.microsoft", "SimplifiedLayerNormalizationGrad"): _layer_norm_grad,
    ("com.microsoft", "InvertibleLayerNormalizationGrad"): _layer_norm_grad,
    ("", "SoftmaxCrossEntropyLoss"): _softmax_cross_entropy,
    ("", "Where"): _where,
    ("com.microsoft", "GRUGrad"): _gru_grad,
    **{("", op): _variadic for op in ("Sum", "Mean", "Max", "Min")},
    ("", "ScatterElements"): _scatter_indices,
    ("", "Scatter"): _scatter_indices,
    ("com.microsoft", "GatherElementsGrad"): _scatter_indices,
    ("", "Expand"): _expand_offsets,
}


def _reduce_axes(node: Node, rank: int, values: Values) -> set[int] | None:
    """The axes a reduction reduces: its attribute (opset < 13) or its constant input; every
    axis where it has none (unless ``noop_with_empty_axes``: none). None where unknown."""
    axes = node.attr("axes")
    if axes is None and len(node.inputs) > 1 and node.inputs[1]:
        axes = values(node.inputs[1])
        if axes is None:
            return None
    if not axes:
        return set() if node.attr("noop_with_empty_axes", 0) else set(range(rank))
    return {a % rank for a in axes} if all(-rank <= a < rank for a in axes) else None


def _fast_reduce_shape(shape: tuple[int, ...], axes: set[int]) -> tuple[list[int], list[bool]]:
    """ORT's ``OptimizeShapeForFastReduce``: adjacent axes both reduced or both kept merged
    into one (ones included), with whether each merged axis is reduced."""
    dims: list[int] = []
    reduced: list[bool] = []
    for k, d in enumerate(shape):
        if reduced and reduced[-1] == (k in axes):
            dims[-1] *= d
        else:
            dims.append(d)
            reduced.append(k in axes)
    return dims, reduced


def _on_fast_path(dims: list[int], reduced: list[bool]) -> bool:
    """Whether ReduceSum's KR, RK, KRK or RKR kernel takes the shape, on one thread (the
    conditions of ``CommonFastReduceSwitch`` with a degree of parallelism of 1)."""
    if len(dims) == 2:
        return not reduced[0] or (dims[0] > 16 and max(dims) > 256)
    if len(dims) == 3:
        return dims[0] >= 2 if not reduced[0] else dims[1] >= 2
    return len(dims) < 2


def _reduce_sum_indices(node: Node, sized: Sized, values: Values) -> int:
    """ReduceSum off its fast paths (reduced and kept axes alternating more than KRK or RKR
    allow, as a Tile or Expand gradient's do): ``NoTransposePrepareForReduce``
    (``core/providers/cpu/reduction/reduction_ops.cc``) lists in ``int64`` vectors the input
    offset of every group of reduced elements but the last axis's, and of every output
    element but the last kept axis's."""
    x = _shaped(sized, node.inputs[0])
    if x is None or not all(isinstance(d, int) for d in x[0]) or not x[0]:
        return 0
    shape = tuple(int(d) for d in x[0])
    axes = _reduce_axes(node, len(shape), values)
    if not axes or any(shape[a] == 0 for a in axes):
        return 0
    dims, reduced = _fast_reduce_shape(shape, axes)
    if _on_fast_path(dims, reduced) or all(reduced):
        return 0
    red = [d for d, r in zip(dims, reduced) if r]
    kept = [d for d, r in zip(dims, reduced) if not r]
    projected = math.prod(red) // red[-1] if len(red) > 1 else 1
    unprojected = math.prod(kept) // kept[-1] if kept[-1] else 0
    return 8 * (projected + unprojected)


# ORT training's ReduceSumTraining (axes always an input) reduces through ReduceSum's code: one-node
# models of both held the same bytes on ORT 1.19.2, on and off the fast paths.
_REDUCE_SUMS = frozenset({("", "ReduceSum"), ("com.microsoft", "ReduceSumTraining")})


def scratch_bytes(node: Node, sized: Sized, values: Values | None = None) -> int:
    """Bytes ``node``'s kernel holds outside ORT's allocator while it runs (0 if none known).
    ``values``: the values of int constants (a reduction's axes); without it none are known."""
    key = ("" if node.domain == "ai.onnx" else node.domain, node.op_type)
    if key in _REDUCE_SUMS:
        return _reduce_sum_indices(node, sized, values or (lambda t: None))
    rule = _RULES.get(key)
    return rule(node, sized) if rule is not None else 0
