"""Tensor shapes, dtypes and byte sizes, from ONNX shape inference.

Symbolic dimensions are bound from ``--dim NAME=VALUE`` before inference. Shape
inference runs on a light copy of the model in which large initializers become typed
graph inputs, so it never serialises weights (and works with external data).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cache
from itertools import chain
from typing import Iterable, TypeGuard

import numpy as np
import onnx
from onnx import numpy_helper

from ..errors import ModelError, UsageError
from ..graph import ABSENT, Graph, Node, weightless_copy
from ..markers import FRESH_META, GUARD_META
from ..ops import ORT_FOLDABLE, ORT_SCALAR_FOLDABLE
from ..ort import shapes as ort_shapes
from ..ort.registry import onnx_knows
from .shape_values import FOLDABLE, fold

_INLINE_INITIALIZER_BYTES = 4096  # small ones may hold shapes that inference must read
_DIM_UNKNOWN = "?"
Dims = tuple[int | str, ...]  # a shape: each dimension its size, or a symbol
_DIM_MAX = 2**40  # far beyond any memory, and products of a few such dims stay exact


@dataclass(frozen=True)
class TensorInfo:
    """What is known of one tensor. ``nbytes`` is None when a dimension is unknown."""

    dtype: int
    shape: tuple[int | str, ...] | None
    nbytes: int | None
    # ORT knows the shape before the run. Its allocation planner reuses buffers and writes
    # in place only for such shapes; ONNX's data propagation finds some that ORT does not.
    static_shape: bool = True
    # Where ORT knows the shape only by symbolic dimensions (an artifact's ``unk__35``), that
    # shape: the planner still reuses and writes in place between tensors of equal symbols.
    ort_shape: tuple[int | str, ...] | None = None

    @property
    def planner_shape(self) -> tuple[int | str, ...] | None:
        """The shape ORT's allocation planner compares buffers by (None: it knows none)."""
        return self.shape if self.static_shape else self.ort_shape

    @property
    def missing(self) -> tuple[str, ...]:
        if self.shape is None:
            return (_DIM_UNKNOWN,)
        return tuple(d for d in self.shape if isinstance(d, str))

    @property
    def dtype_name(self) -> str:
        return onnx.TensorProto.DataType.Name(self.dtype).lower() if self.dtype else "?"


@cache
def itemsize(elem_type: int) -> int:
    if elem_type in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED):
        return 0
    if elem_type in (onnx.TensorProto.FLOAT4E2M1, onnx.TensorProto.INT4, onnx.TensorProto.UINT4):
        return 1
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).itemsize


# No device holds a tensor this large; the memory model sums sizes in int64, so a shape
# beyond it (a mistyped dimension) is refused rather than overflowing the sums.
MAX_TENSOR_BYTES = 1 << 48


def is_static(shape: tuple[int | str, ...]) -> TypeGuard[tuple[int, ...]]:
    """Every dimension is a number."""
    return all(isinstance(d, int) for d in shape)


def _info(elem_type: int, shape: tuple[int | str, ...] | None) -> TensorInfo:
    nbytes = None
    if shape is not None and is_static(shape):
        nbytes = math.prod(shape) * itemsize(elem_type)
        if nbytes > MAX_TENSOR_BYTES:
            raise ModelError(f"a tensor of shape {list(shape)} would take {nbytes} bytes, more than "
                             f"{MAX_TENSOR_BYTES >> 40} TiB (a dimension too large?)")
    return TensorInfo(elem_type, shape, nbytes)


def _shape_of(type_proto: onnx.TypeProto) -> tuple[int, tuple[int | str, ...] | None]:
    if not type_proto.HasField("tensor_type"):
        return 0, None
    tt = type_proto.tensor_type
    if not tt.HasField("shape"):
        return tt.elem_type, None
    dims: list[int | str] = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            dims.append(d.dim_value)
        else:
            dims.append(d.dim_param or _DIM_UNKNOWN)
    return tt.elem_type, tuple(dims)


def _bind(v: onnx.ValueInfoProto, dims: dict[str, int]) -> None:
    if v.type.HasField("tensor_type"):
        for d in v.type.tensor_type.shape.dim:
            if d.HasField("dim_param") and d.dim_param in dims:
                d.dim_value = dims[d.dim_param]


# The value of a symbolic dimension no --dim names. ORT training artifacts leave the batch
# symbolic; 64 makes activations large enough to measure on the process peak (64 KiB and
# up for a 256-wide layer) while keeping a check's run short.
DEFAULT_DIM = 64


def resolve_dims(graph: Graph, given: dict[str, int]) -> tuple[dict[str, int], tuple[str, ...]]:
    """``given`` plus DEFAULT_DIM for every other symbolic dimension of the graph's inputs
    (one only on outputs is data-dependent, as NonZero's count: never guessed), and the
    names defaulted."""
    defaulted = tuple(sorted(symbolic_dims(graph, outputs=False) - set(given)))
    return {**given, **{d: DEFAULT_DIM for d in defaulted}}, defaulted


_LOSSES = frozenset({"SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLossInternal"})


def tied_dims(graph: Graph, tensors: dict[str, TensorInfo], free: tuple[str, ...]) -> dict[str, int]:
    """Values that the defaulted dimensions in ``free`` must take to fit the others: a loss's
    labels have its scores' shape without the class axis, and artifacts of language models
    declare flattened labels with a symbol of their own (``batch_x_32`` beside ``batch``)."""
    declared = {v.name: _shape_of(v.type)[1] for v in graph.model.graph.input}
    tied: dict[str, int] = {}
    for node in graph.nodes:
        if node.op_type in _LOSSES and len(node.inputs) >= 2:
            scores, labels = tensors.get(node.inputs[0]), declared.get(node.inputs[1])
            if scores is not None and scores.shape is not None and labels and len(labels) + 1 == len(scores.shape):
                _tie(tied, labels, scores.shape[:1] + scores.shape[2:], free)
        elif node.op_type in _ELEMENTWISE_LOSS_OPS and len(node.inputs) == 2:
            _tie_operands(tied, node, declared, tensors, free)
    return tied


# A regression loss compares the prediction with a target input of its shape (MSELoss: Sub):
# the exporter names the prediction's dims it could not infer, and the target's with them.
_ELEMENTWISE_LOSS_OPS = frozenset({"Sub"})


def _tie(tied: dict[str, int], dims: Dims, sizes: Dims, free: tuple[str, ...]) -> None:
    for dim, size in zip(dims, sizes):
        if dim in free and isinstance(size, int) and size > 1:
            tied.setdefault(dim, size)


def _tie_operands(tied: dict[str, int], node: Node, declared: dict[str, Dims | None], tensors: dict[str, TensorInfo],
                  free: tuple[str, ...]) -> None:
    """A graph input's defaulted dims that the other operand of ``node`` sizes."""
    for mine, other in ((node.inputs[0], node.inputs[1]), (node.inputs[1], node.inputs[0])):
        dims, info = declared.get(mine), tensors.get(other)
        if dims and other not in declared and info is not None and info.shape is not None \
                and len(info.shape) == len(dims):
            _tie(tied, dims, info.shape, free)


def symbolic_dims(graph: Graph, outputs: bool = True) -> set[str]:
    """Names of symbolic dimensions on the graph's inputs (and outputs)."""
    # read once per graph: an analysis asks several times, and a training graph's inputs
    # and outputs grow with its parameters
    cache = graph._derived.symbolic
    if False not in cache:
        cache[False] = _dim_names(graph.model.graph.input)
    if outputs and True not in cache:
        cache[True] = cache[False] | _dim_names(graph.model.graph.output)
    return set(cache[outputs])


def _dim_names(values: Iterable[onnx.ValueInfoProto]) -> frozenset[str]:
    return frozenset(_symbols_in(values) - {_DIM_UNKNOWN})


def _symbols_in(values: Iterable[onnx.ValueInfoProto]) -> set[str]:
    """The symbols (and ``_DIM_UNKNOWN``) of the shapes these ValueInfos declare, each
    distinct type read once: a training graph declares thousands of tensors of a few types."""
    names: set[str] = set()
    seen: set[bytes] = set()
    for v in values:
        key = v.type.SerializeToString()
        if key not in seen:
            seen.add(key)
            names.update(d for d in _shape_of(v.type)[1] or () if isinstance(d, str))
    return names


def infer_tensors(graph: Graph, dims: dict[str, int] | None = None, strict: bool = True) -> dict[str, TensorInfo]:
    """Shape, dtype and bytes of every tensor in the graph that inference can reach. ``strict``:
    types and shapes that contradict the ops refuse the model; off for a first sizing at
    defaulted dims, which the dims tied to other tensors then correct."""
    dims = dims or {}
    for name, value in dims.items():
        if not 0 < value <= _DIM_MAX:
            raise UsageError(f"--dim {name}={value}: out of range (1 to {_DIM_MAX})")
    src = graph.model.graph
    order = graph.topological_order()  # strict inference needs it
    model = weightless_copy(graph.model, (graph.nodes[i].proto for i in order), _INLINE_INITIALIZER_BYTES)
    # Local functions stay opaque to inference: checking their bodies strictly could turn a
    # model that loads into an error.
    del model.functions[:]
    light = model.graph
    symbols = _declared_symbols(light, dims)
    unbound = None  # the file's symbols unbound: copied only where it declares any
    if symbols:
        unbound = onnx.ModelProto()
        unbound.CopyFrom(model)
    # Artifacts declare gradients with the batch dimension too: bind it wherever it is declared.
    for v in chain(light.input, light.value_info, light.output):
        _bind(v, dims)
    source = (graph.path or "model") if strict else None
    tensors = _with_shape_values(graph, model, _inferred(model, light, strict_for=source), FOLDABLE,
                                 strict_for=source)
    blind = _ort_blind_values(graph, tensors)
    if blind:
        _mark_ort_static(graph, model, tensors, blind)
    for t in src.initializer:
        tensors[t.name] = _info(t.data_type, tuple(t.dims))
    _through_ort_ops(graph, model, tensors)
    _symbols_to_ort(unbound, tensors, dims, symbols)
    return tensors


def _declared_symbols(g: onnx.GraphProto, dims: dict[str, int]) -> set[str]:
    """The symbols the graph's inputs, outputs and value_info declare that no dimension binds."""
    return _symbols_in(chain(g.input, g.value_info, g.output)) - {_DIM_UNKNOWN} - set(dims)


def _symbols_to_ort(unbound: onnx.ModelProto | None, tensors: dict[str, TensorInfo], dims: dict[str, int],
                    symbols: set[str]) -> None:
    """Tensors ORT knows only by a symbol the file declares and no dimension binds (an
    artifact's ``unk__35``): ORT's planner compares them by their symbols, whatever sizes
    ckpt found. ORT infers with the file's symbols unbound ('batch' stays a symbol), merges
    that into a declared shape keeping a declared symbol where it inferred no number, and
    carries symbols from inputs to outputs: onnx's inference without data propagation, on
    the file as it is, does the same (it has no rule for ORT's contrib ops nor reads ckpt's
    guard views: what ORT cannot size there stays unknown, unless the file declares it).
    ``unbound``: the file's model with its ``symbols`` unbound (None: it declares none)."""
    if unbound is None:
        return
    try:
        inferred = onnx.shape_inference.infer_shapes(unbound, data_prop=False).graph
    except Exception:  # best effort: the sizes stand as found
        return
    for v in chain(inferred.value_info, inferred.output):
        info, shape = tensors.get(v.name), _shape_of(v.type)[1]
        if info is None or info.shape is None or not shape or len(shape) != len(info.shape):
            continue
        bound = [dims.get(d, d) if isinstance(d, str) else d for d in shape]
        free = [d for d in bound if isinstance(d, str)]
        if free and all(d in symbols for d in free) and all(
                d == e for d, e in zip(bound, info.shape) if isinstance(d, int)):
            tensors[v.name] = replace(info, static_shape=False, ort_shape=shape)


def infer_tied(graph: Graph, bound: dict[str, int], free: tuple[str, ...]
               ) -> tuple[dict[str, TensorInfo], dict[str, int]]:
    """``infer_tensors`` at ``bound``, with the dims of ``free`` that other tensors tie (a
    loss's flattened labels, a regression target) set to the values they tie to; the
    tensors and the dims they were sized at. A value given to a free dim can contradict
    its tie, so where the strict sizing refuses, a lenient one finds the ties first."""
    dims = dict(bound)
    try:
        tensors = infer_tensors(graph, dims)
    except ModelError:
        if not _retie(graph, infer_tensors(graph, dims, strict=False), dims, free):
            raise
        return infer_tensors(graph, dims), dims
    return (infer_tensors(graph, dims), dims) if _retie(graph, tensors, dims, free) else (tensors, dims)


def _retie(graph: Graph, tensors: dict[str, TensorInfo], dims: dict[str, int], free: tuple[str, ...]) -> bool:
    tied = {d: v for d, v in tied_dims(graph, tensors, free).items() if dims.get(d) != v}
    dims.update(tied)
    return bool(tied)


def _ort_blind_values(graph: Graph, tensors: dict[str, TensorInfo]) -> list[str]:
    """Shape values that ONNX's data propagation computes and ORT does not: outputs of other
    ops whose inputs are all shape values (or initializers)."""
    derived: set[str] = set()  # computed from Shape or Size
    blind: list[str] = []
    if not any(n.op_type in ("Shape", "Size") for n in graph.nodes):
        return blind
    # ORT turns Constant nodes into initializers before it infers shapes.
    consts = set(graph.initializers) | {t for n in graph.nodes if n.op_type == "Constant" for t in n.outputs}
    nodes = graph.nodes
    for i in graph.topological_order():
        node = nodes[i]
        if node.op_type in ("Shape", "Size"):
            derived.update(t for t in node.outputs if t != ABSENT)
            continue
        if derived.isdisjoint(node.inputs):  # most nodes: none of its inputs is a shape value
            continue
        ins = [t for t in node.inputs if t != ABSENT]
        if ins and all(t in derived or t in consts for t in ins) and any(t in derived for t in ins):
            outs = [t for t in node.outputs if t != ABSENT]
            derived.update(outs)
            scalar = node.op_type in ORT_SCALAR_FOLDABLE and all(
                t in tensors and tensors[t].shape == () for t in outs)
            if node.op_type not in ORT_FOLDABLE and not scalar:
                blind.extend(outs)
    return blind


def _mark_ort_static(graph: Graph, model: onnx.ModelProto, tensors: dict[str, TensorInfo], blind: list[str]) -> None:
    """Infer again with ``blind`` values unknown and only ORT's value propagation: what is
    no longer sized there, ORT's planner does not know before the run."""
    cut = set(blind)
    light = model.graph
    m = onnx.ModelProto(ir_version=model.ir_version)
    g = m.graph  # filled in place: ModelProto(graph=g) would serialize and parse it
    g.name = light.name
    g.node.extend(n for n in light.node if not cut.intersection(n.output))
    g.input.extend(light.input)
    g.input.extend(onnx.helper.make_tensor_value_info(t, tensors[t].dtype, list(tensors[t].shape or ()))
                   for t in blind if t in tensors and tensors[t].shape is not None)
    g.initializer.extend(light.initializer)
    g.output.extend(light.output)
    # ORT merges the file's value_info into what it infers: a declared shape stays known.
    g.value_info.extend(v for v in light.value_info if v.name not in cut)
    m.opset_import.extend(model.opset_import)
    seen = _with_shape_values(graph, m, _inferred(m, g), FOLDABLE, frozenset(cut))
    for t, info in tensors.items():
        if info.nbytes is not None and t not in cut and (t not in seen or seen[t].shape != info.shape):
            tensors[t] = unknown_to_ort(info)


def unknown_to_ort(info: TensorInfo) -> TensorInfo:
    """``info`` with a shape ORT's planner does not know before the run, not even by symbols."""
    return replace(info, static_shape=False, ort_shape=None)


def _with_shape_values(graph: Graph, model: onnx.ModelProto, tensors: dict[str, TensorInfo], ops: frozenset[str],
                       skip: frozenset[str] = frozenset(), strict_for: object = None) -> dict[str, TensorInfo]:
    """Where tensors are unsized, evaluate shape values through ``ops`` and infer again with
    them as constants (a few rounds: a value can size the input of the next Shape). With
    ``strict_for``, shapes those values contradict make an invalid model: ORT meets them at
    run time (an Expand to a shape its input does not broadcast to)."""
    made = [t for n in graph.nodes for t in n.outputs if t != ABSENT]
    folded: dict[str, np.ndarray] = {}
    for _ in range(4):
        if all(t in tensors and tensors[t].nbytes is not None for t in made):
            break
        values = fold(graph, tensors, ops, skip)
        if values.keys() <= folded.keys():
            break
        folded.update(values)
        m = onnx.ModelProto(ir_version=model.ir_version)
        g = m.graph
        g.CopyFrom(model.graph)
        del g.node[:]
        g.node.extend(n for n in model.graph.node if not folded.keys() & set(n.output))
        g.initializer.extend(numpy_helper.from_array(v, t) for t, v in folded.items())
        m.opset_import.extend(model.opset_import)
        tensors = {**tensors, **{t: info for t, info in _inferred(m, g, strict_for).items()
                                 if info.nbytes is not None and (t not in tensors or tensors[t].nbytes is None)}}
    return tensors


def _inferred(model: onnx.ModelProto, light: onnx.GraphProto, strict_for: object = None) -> dict[str, TensorInfo]:
    """Inferred tensor types. With ``strict_for`` (the model's name), types and shapes that
    contradict the ops (the file's or inferred) make an invalid model."""
    try:
        strict = strict_for is not None
        inferred = onnx.shape_inference.infer_shapes(model, check_type=strict, strict_mode=strict, data_prop=True).graph
    except onnx.shape_inference.InferenceError as e:
        if strict_for is None:
            inferred = light
        else:
            first = next((line for line in str(e).splitlines() if line.strip()), "")
            raise ModelError(f"{strict_for}: types or shapes do not fit the ops ({first[:300]})") from e
    except Exception:  # inference is best effort otherwise: fall back to what the file declares
        inferred = light
    tensors: dict[str, TensorInfo] = {}
    by_type: dict[bytes, TensorInfo] = {}  # a graph has few distinct tensor types
    for v in chain(inferred.value_info, inferred.input, inferred.output):
        key = v.type.SerializeToString()
        info = by_type.get(key)
        if info is None:
            info = by_type[key] = _info(*_shape_of(v.type))
        name = v.name
        if name not in tensors or tensors[name].nbytes is None:
            tensors[name] = info
    return tensors


def _ort_rule(node: Node, opset: int) -> ort_shapes.Rule | None:
    """The shape rule of a node onnx cannot infer, or None."""
    if _is_guard_view(node):
        return ort_shapes.GUARD_VIEW
    if node.domain not in ("", "ai.onnx"):
        return ort_shapes.contrib_rule(node.op_type)
    rule = ort_shapes.ONNX_DOMAIN_RULES.get(node.op_type)
    return rule if rule is not None and not onnx_knows(node.op_type, opset) else None


def _fill_ort_op_shapes(graph: Graph, tensors: dict[str, TensorInfo]) -> list[str]:
    """Size the outputs of ORT's own ops by their rules; returns the tensors sized here."""
    opset = graph.opset("") or 0
    rules = {i: r for i, r in ((i, _ort_rule(n, opset)) for i, n in enumerate(graph.nodes)) if r is not None}
    if not rules:
        return []
    values: dict[str, np.ndarray] | None = None  # shape values, folded on first use (only a few rules read them)

    def typed(name: str) -> ort_shapes.Typed | None:
        info = tensors.get(name)
        return (info.dtype, info.shape) if info is not None and info.shape is not None else None

    def value(name: str) -> np.ndarray | None:
        nonlocal values
        if values is None:
            values = fold(graph, tensors, FOLDABLE)
        return values.get(name)

    def producer(name: str) -> Node | None:
        i = graph.producer.get(name)
        return graph.nodes[i] if i is not None else None

    # ORT turns Constant nodes into initializers before it infers shapes
    constants = set(graph.initializers) | {t for n in graph.nodes if n.op_type == "Constant" for t in n.outputs}
    sized = []
    for i in graph.topological_order():
        if i not in rules:
            continue
        node = graph.nodes[i]
        known = ort_shapes.ort_knows_outputs(node, constants.__contains__)
        for pos, (dtype, shape) in rules[i](ort_shapes.Inputs(node, typed, value, producer)).items():
            out = node.outputs[pos] if pos < len(node.outputs) else ABSENT
            if out == ABSENT or shape is None or (out in tensors and tensors[out].nbytes is not None):
                continue
            tensors[out] = _info(dtype or (tensors[out].dtype if out in tensors else 0), tuple(shape))
            if not known:
                tensors[out] = unknown_to_ort(tensors[out])
            if tensors[out].nbytes is not None:
                sized.append(out)
    return sized


def _through_ort_ops(graph: Graph, model: onnx.ModelProto, tensors: dict[str, TensorInfo]) -> None:
    """Size ORT's own ops, then infer again past them with their outputs declared, until
    nothing more is sized: onnx's inference stops at every op it does not know."""
    declared: dict[str, TensorInfo] = {}
    file_declared = {v.name for v in model.graph.value_info}
    for _ in range(_MAX_ROUNDS):
        sized = _fill_ort_op_shapes(graph, tensors)
        if not sized or all(t in tensors and tensors[t].nbytes is not None
                            for n in graph.nodes for t in n.outputs if t != ABSENT):
            return
        declared.update((t, tensors[t]) for t in sized)
        m = onnx.ModelProto(ir_version=model.ir_version)
        g = m.graph
        g.CopyFrom(model.graph)
        kept = [v for v in g.value_info if v.name not in declared]
        del g.value_info[:]
        g.value_info.extend(kept)
        g.value_info.extend(onnx.helper.make_tensor_value_info(t, i.dtype, list(i.shape or ()))
                              for t, i in declared.items())
        m.opset_import.extend(model.opset_import)
        before = {t for t, i in tensors.items() if i.nbytes is not None}
        _merge_sized(tensors, _inferred(m, g))
        # shapes past ORT's ops may size Shape nodes whose values size the next Reshape
        _merge_sized(tensors, _with_shape_values(graph, m, dict(tensors), FOLDABLE))
        now = {t for t, i in tensors.items() if i.nbytes is not None}
        if any(_is_guard_view(graph.nodes[graph.producer[t]]) for t in sized if t in graph.producer):
            _unknown_to_ort(tensors, (now - before) | set(sized), file_declared)
        if now == before:
            return


def _is_guard_view(node: Node) -> bool:
    return node.op_type == "Reshape" and (node.meta(GUARD_META) is not None or node.meta(FRESH_META) is not None)


def _unknown_to_ort(tensors: dict[str, TensorInfo], names: set[str], declared: set[str]) -> None:
    """Sized past a guard view: ORT knows these shapes before the run only where the file
    declares them (it has no rule for ckpt's guards)."""
    for t in names - declared:
        if t in tensors:
            tensors[t] = unknown_to_ort(tensors[t])


def _merge_sized(tensors: dict[str, TensorInfo], new: dict[str, TensorInfo]) -> None:
    tensors.update((t, info) for t, info in new.items()
                   if info.nbytes is not None and (t not in tensors or tensors[t].nbytes is None))


_MAX_ROUNDS = 32  # each round passes one more layer of ORT ops; deep graphs need a few rounds per layer
