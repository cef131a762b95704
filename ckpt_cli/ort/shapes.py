"""Output shapes of the ONNX Runtime ops that onnx's shape inference does not know.

ORT training artifacts hold gradient and training ops (``com.microsoft`` and some in the
ONNX domain) whose outputs onnx cannot infer, and ORT itself leaves some of them unsized
until the run (``LSTMTraining``'s ``iofc``). Each rule here gives an output's element
type and shape from the node's inputs: their shapes, a shape *value* fed as an input
(``GatherGrad``'s first input is the shape of the gathered table), or the forward node
that made an input (``MaxPoolGrad``'s ``dX`` has the shape of the pooled ``X``). The
rules were checked against the arrays ORT 1.19.2's training build returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence, cast

import numpy as np
from onnx import TensorProto

from ..graph import Node
from .registry import onnx_knows

Shape = tuple[int | str, ...]  # a dimension: its size, or a symbol
Typed = tuple[int, Shape]  # (element type, shape)


@dataclass(frozen=True, slots=True)
class Inputs:
    """What a rule may read of one node: its inputs' types and shapes, shape values, the
    nodes that made its inputs, and its attributes (the shape pass hands the readers in)."""

    node: Node
    typed_of: Callable[[str], Optional[Typed]]
    value_of: Callable[[str], Optional[np.ndarray]]
    producer_of: Callable[[str], Optional[Node]]

    def typed(self, pos: int) -> Optional[Typed]:
        names = self.node.inputs
        return self.typed_of(names[pos]) if pos < len(names) and names[pos] else None

    def typed_tensor(self, name: str) -> Optional[Typed]:
        """Type and shape of any tensor of the graph (a producer's input, say)."""
        return self.typed_of(name)

    def shape(self, pos: int) -> Optional[Shape]:
        typed = self.typed(pos)
        return typed[1] if typed else None

    def dtype(self, pos: int) -> int:
        typed = self.typed(pos)
        return typed[0] if typed else 0

    def value(self, pos: int) -> Optional[np.ndarray]:
        names = self.node.inputs
        return self.value_of(names[pos]) if pos < len(names) and names[pos] else None

    def producer(self, pos: int) -> Optional[Node]:
        names = self.node.inputs
        return self.producer_of(names[pos]) if pos < len(names) and names[pos] else None

    def attr(self, name: str, default: Any = None) -> Any:
        for a in self.node.proto.attribute:
            if a.name == name:
                return a.i if a.type == a.INT else a.f if a.type == a.FLOAT else default
        return default


Rule = Callable[[Inputs], dict[int, Typed]]


def _same_as(mapping: dict[int, int]) -> Rule:
    """Output position -> the input position whose type and shape it has."""
    def rule(x: Inputs) -> dict[int, Typed]:
        return {out: found for out, src in mapping.items() if (found := x.typed(src)) is not None}
    return rule


# ckpt's guard views (a Reshape by a shape of zeros that onnx cannot read): the input itself
GUARD_VIEW: Rule = _same_as({0: 0})


def _shape_from_value(shape_pos: int, dtype_pos: int) -> Rule:
    """Gradients of gathers and slices: the output's shape is the value of an input."""
    def rule(x: Inputs) -> dict[int, Typed]:
        value = x.value(shape_pos)
        if value is None or x.dtype(dtype_pos) == 0:
            return {}
        return {0: (x.dtype(dtype_pos), tuple(int(d) for d in value.reshape(-1)))}
    return rule


def _stats_shape(shape: Shape, axis: int) -> Shape:
    axis = axis + len(shape) if axis < 0 else axis
    return tuple(shape[:axis]) + (1,) * (len(shape) - axis)


def _layer_norm(stat_outputs: Sequence[int]) -> Rule:
    """LayerNormalization (mean, inverse std) and SimplifiedLayerNormalization (inverse
    std): statistics over the axes from ``axis`` on, in ``stash_type`` (float by default)."""
    def rule(x: Inputs) -> dict[int, Typed]:
        typed = x.typed(0)
        if typed is None:
            return {}
        stats = (x.attr("stash_type", TensorProto.FLOAT), _stats_shape(typed[1], x.attr("axis", -1)))
        return {0: typed, **{pos: stats for pos in stat_outputs}}
    return rule


def _max_pool_grad(x: Inputs) -> dict[int, Typed]:
    """dX has the shape of the MaxPool input whose indices it scatters to."""
    pool = x.producer(1)
    if pool is None or pool.op_type != "MaxPool" or x.dtype(0) == 0:
        return {}
    src = x.typed_tensor(pool.inputs[0])
    return {0: (x.dtype(0), src[1])} if src else {}


def _conv_grad(x: Inputs) -> dict[int, Typed]:
    out = {pos: found for pos, src in ((0, 1), (1, 2)) if (found := x.typed(src)) is not None}
    w = x.shape(2)
    if w:
        out[2] = (x.dtype(2), (w[0],))
    return out


def _rnn_dims(x: Inputs, gates: int) -> Optional[tuple[int | str, int | str, int | str, int | str]]:
    """(seq, directions, batch, hidden) of an RNN node with layout 0 inputs."""
    xs, w, r = x.shape(0), x.shape(1), x.shape(2)
    if not (xs and w and r) or len(xs) != 3 or x.attr("layout", 0) != 0:
        return None
    hidden = x.attr("hidden_size") or r[-1]
    return xs[0], w[0], xs[1], hidden


def _rnn_training(gates: int, extra: Sequence[tuple[int, int]]) -> Rule:
    """LSTMTraining / GRUTraining: Y, Y_h (and Y_c), plus the states the gradient reads:
    ``extra`` lists (output, width in hidden units) of [seq, dirs, batch, width] outputs."""
    def rule(x: Inputs) -> dict[int, Typed]:
        dims = _rnn_dims(x, gates)
        if dims is None:
            return {}
        seq, dirs, batch, hidden = dims
        t = x.dtype(0)
        out = {0: (t, (seq, dirs, batch, hidden)), 1: (t, (dirs, batch, hidden))}
        if gates == 4:
            out[2] = (t, (dirs, batch, hidden))
        out.update({pos: (t, (seq, dirs, batch, width * hidden)) for pos, width in extra})
        return out
    return rule


def _rnn_grad(gates: int, states: Sequence[tuple[int, int]], peephole: bool) -> Rule:
    """LSTMGrad / GRUGrad: dX, dW, dR like X, W, R; dB [dirs, 2*gates*hidden]; initial
    state gradients like the states (``states``: (output, input) positions)."""
    def rule(x: Inputs) -> dict[int, Typed]:
        out = {pos: found for pos in (0, 1, 2) if (found := x.typed(pos)) is not None}
        dims = _rnn_dims(x, gates)
        if dims is not None:
            _, dirs, batch, hidden = dims
            t = x.dtype(0)
            out[3] = (t, (dirs, 2 * gates * hidden))
            out.update({pos: (t, (dirs, batch, hidden)) for pos, _ in states})
            if peephole:
                out[6] = (t, (dirs, 3 * hidden))
        return out
    return rule


def _scalar_loss(x: Inputs) -> dict[int, Typed]:
    """SoftmaxCrossEntropyLossInternal: the loss (a scalar unless reduction is none) and log_prob."""
    logits = x.typed(0)
    if logits is None:
        return {}
    reduction = next((a.s.decode() for a in x.node.proto.attribute if a.name == "reduction"), "mean")
    labels = x.shape(1)
    loss = labels if reduction == "none" else ()
    return {1: logits, **({0: (logits[0], loss)} if loss is not None else {})}


def _accumulator(x: Inputs) -> dict[int, Typed]:
    """InPlaceAccumulatorV2: a one-element flag and the accumulation buffer."""
    out: dict[int, Typed] = {0: (TensorProto.BOOL, (1,))}
    if (typed := x.typed(0)) is not None:
        out[1] = typed
    return out


def _concat_training(x: Inputs) -> dict[int, Typed]:
    """ConcatTraining (ORT's training Concat): the concatenation, and the input lengths."""
    names = [t for t in x.node.inputs if t]
    shapes = [x.typed_tensor(t) for t in names]
    out: dict[int, Typed] = {1: (TensorProto.INT64, (len(names),))}
    if names and all(s is not None for s in shapes):
        known = cast(list[Typed], shapes)  # none is None: checked above
        first = known[0][1]
        axis = x.attr("axis", 0)
        axis = axis + len(first) if axis < 0 else axis
        along = [s[1][axis] for s in known]
        if all(isinstance(d, int) for d in along):
            out[0] = (known[0][0], tuple(first[:axis]) + (sum(along),) + tuple(first[axis + 1:]))
    return out


def _split_lengths(x: Inputs, along: int, outputs: int) -> Optional[list[int]]:
    """SplitTraining's lengths: the ``split`` value, else (an artifact's gradient of a
    ConcatTraining) the lengths of that concatenation's inputs, else equal parts."""
    value = x.value(1)
    if value is not None:
        return [int(v) for v in value.reshape(-1)]
    concat = x.producer(1)
    if concat is not None and concat.op_type == "ConcatTraining" and tuple(concat.outputs[1:2]) == (x.node.inputs[1],):
        shapes = [x.typed_tensor(t) for t in concat.inputs if t]
        axis = concat.attr("axis", 0)
        if all(s is not None for s in shapes):
            lengths = [s[1][axis] for s in cast(list[Typed], shapes)]  # none is None: checked above
            return lengths if all(isinstance(d, int) for d in lengths) else None
    if len(x.node.inputs) < 2 or not x.node.inputs[1]:
        return [along // outputs] * outputs if isinstance(along, int) and along % outputs == 0 else None
    return None


def _split_training(x: Inputs) -> dict[int, Typed]:
    """SplitTraining (ORT's training Split): the input cut along ``axis`` into the given lengths."""
    typed = x.typed(0)
    if typed is None:
        return {}
    dtype, shape = typed
    axis = x.attr("axis", 0)
    axis = axis + len(shape) if axis < 0 else axis
    lengths = _split_lengths(x, shape[axis], len(x.node.outputs))
    if lengths is None or len(lengths) != len(x.node.outputs):
        return {}
    return {k: (dtype, tuple(shape[:axis]) + (n,) + tuple(shape[axis + 1:])) for k, n in enumerate(lengths)}


def broadcast_gradient_axes(a: Sequence[int], b: Sequence[int]) -> tuple[list[int], list[int]]:
    """BroadcastGradientArgs: the axes of the broadcast result that A and B are summed over
    for their gradients, last to first (onnxruntime
    orttraining/training_ops/cpu/tensor/broadcast_grad_args.cc)."""
    rank = max(len(a), len(b))
    a_axes, b_axes = [], []
    for k in range(rank - 1, -1, -1):
        i, j = k - (rank - len(a)), k - (rank - len(b))
        da, db = (a[i] if i >= 0 else None), (b[j] if j >= 0 else None)
        if da is None:
            a_axes.append(k)
        elif db is None:
            b_axes.append(k)
        elif da != db:
            if da == 1:
                a_axes.append(k)
            elif db == 1:
                b_axes.append(k)
            else:
                raise ValueError(f"shapes {list(a)} and {list(b)} do not broadcast")
    return a_axes, b_axes


def _broadcast_gradient_args(x: Inputs) -> dict[int, Typed]:
    a, b = x.value(0), x.value(1)
    if a is None or b is None:
        return {}
    try:
        axes = broadcast_gradient_axes([int(d) for d in a.reshape(-1)], [int(d) for d in b.reshape(-1)])
    except ValueError:
        return {}
    return {k: (TensorProto.INT64, (len(v),)) for k, v in enumerate(axes)}


def _reduce_sum_training(x: Inputs) -> dict[int, Typed]:
    """ReduceSumTraining(data, axes): ReduceSum with the axes as an input (a shape value)."""
    typed, axes_value = x.typed(0), x.value(1)
    if typed is None or axes_value is None:
        return {}
    dtype, shape = typed
    axes = {int(a) % len(shape) for a in axes_value.reshape(-1)} if len(shape) else set()
    if not axes and x.attr("noop_with_empty_axes", 0):
        return {0: typed}
    keep = x.attr("keepdims", 1)
    reduced = [1 if k in axes or not axes else d for k, d in enumerate(shape)]
    return {0: (dtype, tuple(reduced) if keep else tuple(d for k, d in enumerate(shape) if axes and k not in axes))}


def _broadcast(a: Shape, b: Shape) -> Optional[Shape]:
    out = []
    for x, y in zip((1,) * (len(b) - len(a)) + tuple(a), (1,) * (len(a) - len(b)) + tuple(b)):
        if x == 1 or x == y:
            out.append(y)
        elif y == 1:
            out.append(x)
        else:
            return None
    return tuple(out)


def _fused_matmul(x: Inputs) -> dict[int, Typed]:
    """FusedMatMul: alpha * op(A) @ op(B), op transposing the last two axes when asked."""
    a, b = x.shape(0), x.shape(1)
    if not a or not b or len(a) < 2 or len(b) < 2 or x.attr("transBatchA", 0) or x.attr("transBatchB", 0):
        return {}
    m = a[-1] if x.attr("transA", 0) else a[-2]
    n = b[-2] if x.attr("transB", 0) else b[-1]
    batch = _broadcast(a[:-2], b[:-2])
    return {0: (x.dtype(0), batch + (m, n))} if batch is not None else {}


# Rules for ops in domains onnx has no schemas for (com.microsoft, mostly).
CONTRIB_RULES: dict[str, Rule] = {
    "SoftmaxCrossEntropyLossGrad": _same_as({0: 1}),
    "SoftmaxCrossEntropyLossInternalGrad": _same_as({0: 1}),
    "SoftmaxCrossEntropyLossInternal": _scalar_loss,
    "BatchNormInternal": _same_as({0: 0, 1: 3, 2: 4, 3: 3, 4: 4}),
    "BatchNormalizationGrad": _same_as({0: 1, 1: 2, 2: 2}),
    "InPlaceAccumulatorV2": _accumulator,
    "ConcatTraining": _concat_training,
    "SplitTraining": _split_training,
    "BroadcastGradientArgs": _broadcast_gradient_args,
    "ReduceSumTraining": _reduce_sum_training,
    "FusedMatMul": _fused_matmul,
    "SoftmaxGrad_13": _same_as({0: 0}),
    "LogSoftmaxGrad_13": _same_as({0: 0}),
    "ConvGrad": _conv_grad,
    "GatherGrad": _shape_from_value(0, 2),
    "GatherNDGrad": _shape_from_value(0, 2),
    "GatherElementsGrad": _shape_from_value(1, 0),
    "SliceGrad": _shape_from_value(1, 0),
    "LayerNormalizationGrad": _same_as({0: 1, 1: 2, 2: 2}),
    "SimplifiedLayerNormalizationGrad": _same_as({0: 1, 1: 2}),
    "LayerNormalization": _layer_norm((1, 2)),
    "SimplifiedLayerNormalization": _layer_norm((1,)),
    "LSTMTraining": _rnn_training(4, ((3, 1), (4, 4))),
    "GRUTraining": _rnn_training(3, ((2, 3),)),
    "LSTMGrad": _rnn_grad(4, ((4, 5), (5, 6)), peephole=True),
    "GRUGrad": _rnn_grad(3, ((4, 5),), peephole=False),
    # ORT's fused forward ops (the others get their shapes from the value_info ORT writes
    # with an optimized model)
    "SkipLayerNormalization": _same_as({0: 0, 3: 0}),
    "SkipSimplifiedLayerNormalization": _same_as({0: 0, 3: 0}),
    "BiasSoftmax": _same_as({0: 0}),
}
# Elementwise gradient ops (ReluGrad, GeluGrad, ...) and these keep input 0's type and shape.
_ELEMENTWISE = frozenset({"Scale", "Gelu", "FastGelu", "BiasGelu", "QuickGelu", "BiasAdd"})

# Rules for the ONNX-domain ops ORT registers where onnx does not (see ``registry``).
ONNX_DOMAIN_RULES: dict[str, Rule] = {
    "LayerNormalization": _layer_norm((1, 2)),
    "SimplifiedLayerNormalization": _layer_norm((1,)),
    "MaxPoolGrad": _max_pool_grad,
    "ConvGrad": _conv_grad,
    "SinGrad": _same_as({0: 1}),
    "ReshapeGrad": _same_as({0: 0}),
    "TrainableDropout": _same_as({0: 0}),
}


# Ops whose output ORT's own shape inference sizes only when this input is an initializer
# (ReduceSumTraining's axes, SplitTraining's lengths: training_op_defs.cc skips them
# otherwise): ORT's planner then knows no shape for them before the run.
ORT_SIZES_FROM_CONSTANT: dict[str, int] = {"ReduceSumTraining": 1, "SplitTraining": 1}


ValueRule = Callable[[Sequence[int], Sequence[int]], tuple[list[int], list[int]]]


@dataclass(frozen=True)
class RuleTable:
    """ORT's shape facts as data, registered into ckpt's one shape pass (analysis/shapes.py),
    which looks them up rather than calling back here op by op: the rules of the ops onnx
    cannot infer, the ``com.microsoft`` ops whose outputs are shape values (their values
    from the values of their inputs), and the inputs ORT sizes outputs by only as initializers."""

    contrib: Mapping[str, Rule]  # ops in domains onnx has no schemas for
    elementwise: frozenset[str]  # contrib ops (and every *Grad) with input 0's type and shape
    onnx_domain: Mapping[str, Rule]  # ONNX-domain ops ORT registers, where onnx does not know them
    guard_view: Rule
    values: Mapping[str, ValueRule]
    sizes_from_constant: Mapping[str, int]

    def contrib_rule(self, op_type: str) -> Optional[Rule]:
        rule = self.contrib.get(op_type)
        if rule is None and (op_type.endswith("Grad") or op_type in self.elementwise):
            rule = _SAME_AS_INPUT
        return rule

    def onnx_domain_rule(self, op_type: str, opset: int) -> Optional[Rule]:
        """The rule of an ONNX-domain op that onnx does not know at ``opset`` (None if it does)."""
        rule = self.onnx_domain.get(op_type)
        return rule if rule is not None and not onnx_knows(op_type, opset) else None

    def ort_knows_outputs(self, node: Node, constant: Callable[[str], bool]) -> bool:
        """Whether ORT's shape inference sizes ``node``'s outputs before the run (as far as the
        rules here tell: an input it needs as an initializer is one)."""
        pos = self.sizes_from_constant.get(node.op_type)
        return pos is None or node.domain in ("", "ai.onnx") or (pos < len(node.inputs) and constant(node.inputs[pos]))


_SAME_AS_INPUT: Rule = _same_as({0: 0})
RULES = RuleTable(CONTRIB_RULES, _ELEMENTWISE, ONNX_DOMAIN_RULES, GUARD_VIEW,
                  {"BroadcastGradientArgs": broadcast_gradient_axes}, ORT_SIZES_FROM_CONSTANT)
