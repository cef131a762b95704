"""Tensor shapes, dtypes and byte sizes: one pass, ``infer_shapes``, per graph and dims.

The pass runs ONNX shape inference, evaluates shape values itself where ONNX's data
propagation stops, and sizes ORT's own ops by the rules ``ort/shapes.py`` registers as a
table (``RULES``), reading the graph once. Symbolic dimensions are bound from ``--dim
NAME=VALUE`` before inference. Shape inference runs on a light copy of the model in which
large initializers become typed graph inputs, so it never serialises weights (and works
with external data).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cache
from itertools import chain
from typing import Any, Callable, Iterable, TypeGuard, cast, overload

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import ModelError, UsageError
from ..graph import ABSENT, Graph, Node, weightless_copy
from ..markers import FRESH_META, GUARD_META
from ..ops import ORT_FOLDABLE, ORT_SCALAR_FOLDABLE
from ..ort import shapes as ort_shapes

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


def sized_by(tensors: dict[str, TensorInfo]) -> Callable[[str], tuple[tuple[int | str, ...], int] | None]:
    """A tensor's (shape, item size) where its shape is known: what ``ort.scratch``'s rules read."""
    def sized(t: str) -> tuple[tuple[int | str, ...], int] | None:
        info = tensors.get(t)
        return (info.shape, itemsize(info.dtype)) if info is not None and info.shape is not None else None
    return sized


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


@dataclass(frozen=True)
class Shapes:
    """One graph sized at ``dims`` by ``infer_shapes``: every tensor that ONNX's rules, the
    shape values ckpt evaluates and ORT's op rules reach. ``tensors`` is handed on as it is
    (an analysis keeps it as its own): it is built for the caller, never shared."""

    tensors: dict[str, TensorInfo]
    dims: dict[str, int]  # the values sized at


@dataclass(frozen=True)
class _Read:
    """What the pass reads of the graph, read once: its nodes' order and opset, ORT's rules
    for the nodes onnx cannot infer (by node), and the names the rounds go over."""

    graph: Graph
    order: list[int]
    opset: int | None  # the ONNX domain's
    rules: dict[int, ort_shapes.Rule]
    guards: frozenset[int]  # ckpt's guard views (onnx cannot read their shapes)
    constants: frozenset[str]  # ORT turns Constant nodes into initializers before it infers shapes
    made: list[str]  # every node output


def _read(graph: Graph) -> _Read:
    order = graph.topological_order()  # strict inference needs it
    opset = graph.opset("")
    nodes = graph.nodes
    guards = frozenset(i for i, n in enumerate(nodes) if _is_guard_view(n))
    constants = frozenset(graph.initializers).union(t for n in nodes if n.op_type == "Constant" for t in n.outputs)
    made = [t for n in nodes for t in n.outputs if t != ABSENT]
    return _Read(graph, order, opset, _ort_rules(graph, opset or 0, guards), guards, constants, made)


def _is_guard_view(node: Node) -> bool:
    return node.op_type == "Reshape" and any(node.meta(key) is not None for key in (GUARD_META, FRESH_META))


def _ort_rules(graph: Graph, opset: int, guards: frozenset[int]) -> dict[int, ort_shapes.Rule]:
    """Node index -> ORT's shape rule for a node onnx cannot infer, looked up in the table
    ``ort/shapes.py`` registers (each op type once)."""
    table = ort_shapes.RULES
    by_op: dict[tuple[bool, str], ort_shapes.Rule | None] = {}
    rules: dict[int, ort_shapes.Rule] = {}
    for i, node in enumerate(graph.nodes):
        if i in guards:
            rules[i] = table.guard_view
            continue
        key = (node.domain not in ("", "ai.onnx"), node.op_type)
        if key not in by_op:
            by_op[key] = table.contrib_rule(key[1]) if key[0] else table.onnx_domain_rule(key[1], opset)
        rule = by_op[key]
        if rule is not None:
            rules[i] = rule
    return rules


def infer_shapes(graph: Graph, dims: dict[str, int] | None = None, strict: bool = True) -> Shapes:
    """Shape, dtype and bytes of every tensor in the graph that inference can reach, in one
    pass over the graph read once: ONNX's inference, the shape values ckpt evaluates, ORT's
    op rules, rounds until nothing more is sized. ``strict``: types and shapes that
    contradict the ops refuse the model; off for a first sizing at defaulted dims, which the
    dims tied to other tensors then correct."""
    dims = dims or {}
    for name, value in dims.items():
        if not 0 < value <= _DIM_MAX:
            raise UsageError(f"--dim {name}={value}: out of range (1 to {_DIM_MAX})")
    src = graph.model.graph
    read = _read(graph)
    model = weightless_copy(graph.model, (graph.nodes[i].proto for i in read.order), _INLINE_INITIALIZER_BYTES)
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
    tensors = _with_shape_values(read, model, _inferred(model, light, strict_for=source), FOLDABLE,
                                 strict_for=source)
    blind = _ort_blind_values(read, tensors)
    if blind:
        _mark_ort_static(read, model, tensors, blind)
    for t in src.initializer:
        tensors[t.name] = _info(t.data_type, tuple(t.dims))
    _through_ort_ops(read, model, tensors)
    _symbols_to_ort(unbound, tensors, dims, symbols)
    return Shapes(tensors, dict(dims))


def infer_tensors(graph: Graph, dims: dict[str, int] | None = None, strict: bool = True) -> dict[str, TensorInfo]:
    """The tensors of ``infer_shapes`` alone (for scripts and tests that want only them)."""
    return infer_shapes(graph, dims, strict).tensors


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
    except Exception:  # noqa: BLE001 - onnx's inference fails many ways; best effort: the sizes stand as found
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


def infer_tied(graph: Graph, bound: dict[str, int], free: tuple[str, ...]) -> Shapes:
    """``infer_shapes`` at ``bound``, with the dims of ``free`` that other tensors tie (a
    loss's flattened labels, a regression target) set to the values they tie to (the
    result's ``dims``). A value given to a free dim can contradict its tie, so where the
    strict sizing refuses, a lenient one finds the ties first."""
    dims = dict(bound)
    try:
        shapes = infer_shapes(graph, dims)
    except ModelError:
        if not _retie(graph, infer_shapes(graph, dims, strict=False).tensors, dims, free):
            raise
        return infer_shapes(graph, dims)
    return infer_shapes(graph, dims) if _retie(graph, shapes.tensors, dims, free) else shapes


def _retie(graph: Graph, tensors: dict[str, TensorInfo], dims: dict[str, int], free: tuple[str, ...]) -> bool:
    tied = {d: v for d, v in tied_dims(graph, tensors, free).items() if dims.get(d) != v}
    dims.update(tied)
    return bool(tied)


def _ort_blind_values(read: _Read, tensors: dict[str, TensorInfo]) -> list[str]:
    """Shape values that ONNX's data propagation computes and ORT does not: outputs of other
    ops whose inputs are all shape values (or initializers)."""
    derived: set[str] = set()  # computed from Shape or Size
    blind: list[str] = []
    nodes = read.graph.nodes
    if not any(n.op_type in ("Shape", "Size") for n in nodes):
        return blind
    consts = read.constants
    for i in read.order:
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


def _mark_ort_static(read: _Read, model: onnx.ModelProto, tensors: dict[str, TensorInfo], blind: list[str]) -> None:
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
    seen = _with_shape_values(read, m, _inferred(m, g), FOLDABLE, frozenset(cut))
    for t, info in tensors.items():
        if info.nbytes is not None and t not in cut and (t not in seen or seen[t].shape != info.shape):
            tensors[t] = unknown_to_ort(info)


def unknown_to_ort(info: TensorInfo) -> TensorInfo:
    """``info`` with a shape ORT's planner does not know before the run, not even by symbols."""
    return replace(info, static_shape=False, ort_shape=None)


def _with_shape_values(read: _Read, model: onnx.ModelProto, tensors: dict[str, TensorInfo], ops: frozenset[str],
                       skip: frozenset[str] = frozenset(), strict_for: object = None) -> dict[str, TensorInfo]:
    """Where tensors are unsized, evaluate shape values through ``ops`` and infer again with
    them as constants (a few rounds: a value can size the input of the next Shape). With
    ``strict_for``, shapes those values contradict make an invalid model: ORT meets them at
    run time (an Expand to a shape its input does not broadcast to)."""
    folded: dict[str, np.ndarray] = {}
    for _ in range(4):
        if all(t in tensors and tensors[t].nbytes is not None for t in read.made):
            break
        values = _fold(read, tensors, ops, skip)
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
    except Exception:  # noqa: BLE001 - best effort otherwise: fall back to what the file declares
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


def _fill_ort_op_shapes(read: _Read, tensors: dict[str, TensorInfo]) -> list[str]:
    """Size the outputs of ORT's own ops by their rules; returns the tensors sized here."""
    if not read.rules:
        return []
    graph = read.graph
    values: dict[str, np.ndarray] | None = None  # shape values, folded on first use (only a few rules read them)

    def typed(name: str) -> ort_shapes.Typed | None:
        info = tensors.get(name)
        return (info.dtype, info.shape) if info is not None and info.shape is not None else None

    def value(name: str) -> np.ndarray | None:
        nonlocal values
        if values is None:
            values = _fold(read, tensors, FOLDABLE)
        return values.get(name)

    def producer(name: str) -> Node | None:
        i = graph.producer.get(name)
        return graph.nodes[i] if i is not None else None

    sized = []
    for i in read.order:
        rule = read.rules.get(i)
        if rule is None:
            sized += _through_onnx_node(read, graph.nodes[i], tensors, value)
            continue
        node = graph.nodes[i]
        known = ort_shapes.RULES.ort_knows_outputs(node, read.constants.__contains__)
        for pos, (dtype, shape) in rule(ort_shapes.Inputs(node, typed, value, producer)).items():
            out = node.outputs[pos] if pos < len(node.outputs) else ABSENT
            if out == ABSENT or shape is None or (out in tensors and tensors[out].nbytes is not None):
                continue
            tensors[out] = _info(dtype or (tensors[out].dtype if out in tensors else 0), tuple(shape))
            if not known:
                tensors[out] = unknown_to_ort(tensors[out])
            if tensors[out].nbytes is not None:
                sized.append(out)
    return sized


def _through_onnx_node(read: _Read, node: Node, tensors: dict[str, TensorInfo],
                       value: Callable[[str], np.ndarray | None]) -> list[str]:
    """Size an ONNX-domain node's unsized outputs by onnx's rule for that one node, where its
    inputs are sized (what the next whole-graph round would find): a chain that alternates
    ORT's ops and ONNX's (a backward pass: ReluGrad, Gemm, SliceGrad, Mul, ...) is then sized
    in one walk instead of one round per ORT op. Outputs of inputs ORT cannot size before
    the run stay unknown to it."""
    if node.domain not in ("", "ai.onnx") or read.opset is None:
        return []
    outs = [t for t in node.outputs if t != ABSENT and (t not in tensors or tensors[t].nbytes is None)]
    inputs = [tensors.get(t) for t in node.inputs if t != ABSENT]
    if not outs or any(info is None or info.nbytes is None or not info.dtype for info in inputs):
        return []
    try:
        schema = onnx.defs.get_schema(node.op_type, read.opset, "")
        types = {t: helper.make_tensor_type_proto(tensors[t].dtype, list(tensors[t].shape or ()))
                 for t in node.inputs if t != ABSENT}
        data = {t: numpy_helper.from_array(v, t) for t in node.inputs
                if t != ABSENT and (v := value(t)) is not None}
        found = onnx.shape_inference.infer_node_outputs(
            schema, node.proto, types, data, opset_imports=[helper.make_opsetid("", read.opset)])
    except Exception:  # noqa: BLE001 - an op onnx cannot infer alone is left to the rounds
        return []
    blind = any(not tensors[t].static_shape for t in node.inputs if t != ABSENT)
    sized = []
    for t in outs:
        if t not in found:
            continue
        info = _info(*_shape_of(found[t]))
        if info.nbytes is None:
            continue
        tensors[t] = unknown_to_ort(info) if blind else info
        sized.append(t)
    return sized


def _through_ort_ops(read: _Read, model: onnx.ModelProto, tensors: dict[str, TensorInfo]) -> None:
    """Size ORT's own ops, then infer again past them with their outputs declared, until
    nothing more is sized: onnx's inference stops at every op it does not know."""
    declared: dict[str, TensorInfo] = {}
    file_declared = {v.name for v in model.graph.value_info}
    for _ in range(_MAX_ROUNDS):
        sized = _fill_ort_op_shapes(read, tensors)
        if not sized or all(t in tensors and tensors[t].nbytes is not None for t in read.made):
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
        _merge_sized(tensors, _with_shape_values(read, m, dict(tensors), FOLDABLE))
        now = {t for t, i in tensors.items() if i.nbytes is not None}
        producer = read.graph.producer
        if any(producer[t] in read.guards for t in sized if t in producer):
            _unknown_to_ort(tensors, (now - before) | set(sized), file_declared)
        if now == before:
            return


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


# Shape values: small integer tensors computed from static shapes (Shape, Size and the
# arithmetic on them), evaluated before the run, in the same pass. ONNX's data propagation
# stops at some of these ops (int64 Div; Size feeding arithmetic), ORT's at others (Slice,
# Concat, Reshape). ckpt evaluates them itself with ONNX's reference evaluator, restricted
# to the ops the caller names, and shape inference then reads them as constants.

# Ops ckpt evaluates on shape values.
# Equal and Where: the exporter's shape of an ``expand`` (-1 kept from the input's shape).
# Neg: ORT's gradient of ``Pad`` pads by the negated pads (a crop).
FOLDABLE = frozenset({"Shape", "Size", "Constant", "Gather", "Squeeze", "Unsqueeze", "Add", "Sub", "Mul", "Div",
                      "Concat", "Slice", "Cast", "Reshape", "Identity", "Equal", "Where", "Neg"})
_MAX_ELEMENTS = 64
_INTEGER = (onnx.TensorProto.INT64, onnx.TensorProto.INT32)


def _fold(read: _Read, tensors: dict[str, TensorInfo], ops: frozenset[str],
          skip: frozenset[str] = frozenset()) -> dict[str, np.ndarray]:
    """Values of node outputs computable from static shapes and small integer
    initializers through ``ops`` (outputs in ``skip`` stay unknown)."""
    graph = read.graph
    values: dict[str, np.ndarray] = {
        name: numpy_helper.to_array(t) for name, t in graph.initializers.items()
        if t.data_type in _INTEGER and t.data_location != onnx.TensorProto.EXTERNAL
        and math.prod(t.dims) <= _MAX_ELEMENTS}
    made: dict[str, np.ndarray] = {}
    opset = read.opset or 18
    value_rules = ort_shapes.RULES.values
    for i in read.order:
        node = graph.nodes[i]
        if _is_concat_training(node, ops) and node.outputs[0] not in skip:
            value = _evaluate(node, values, tensors, opset, as_op="Concat")
        elif node.op_type in value_rules and node.domain == "com.microsoft":
            for out, axes in _values_by_rule(value_rules[node.op_type], node, values, skip).items():
                values[out] = made[out] = axes
            continue
        elif (node.op_type not in ops or node.domain not in ("", "ai.onnx") or len(node.outputs) != 1
                or node.outputs[0] in skip):
            continue
        else:
            value = _evaluate(node, values, tensors, opset)
            if value is None and node.op_type == "Mul":
                value = _times_zero(node, values, tensors)
        if value is not None and value.dtype.kind in "iub" and value.size <= _MAX_ELEMENTS:
            values[node.outputs[0]] = made[node.outputs[0]] = value
    return made


def _times_zero(node: Node, values: dict[str, np.ndarray], tensors: dict[str, TensorInfo]) -> np.ndarray | None:
    """A ``Mul`` by an integer tensor of zeros is zeros whatever the other factor holds, when
    its shape is known: ckpt's order pins compute a shape as (sizes of the tensors waited
    for) x 0, and a recompute copy's shape arithmetic behind such a pin stays computable."""
    if len(node.inputs) != 2:
        return None
    for zero, other in (node.inputs, reversed(node.inputs)):
        value, info = values.get(zero), tensors.get(other)
        if (value is not None and value.dtype.kind in "iu" and not value.any() and info is not None
                and info.shape is not None and all(isinstance(d, int) for d in info.shape)):
            try:
                shape = np.broadcast_shapes(value.shape, tuple(int(d) for d in info.shape))
            except ValueError:
                return None
            return np.zeros(shape, value.dtype)
    return None


def _values_by_rule(rule: ort_shapes.ValueRule, node: Node, values: dict[str, np.ndarray], skip: frozenset[str]
                    ) -> dict[str, np.ndarray]:
    """The values of an ORT op's outputs by its rule (BroadcastGradientArgs: the reduction
    axes of a broadcast)."""
    if len(node.inputs) < 2 or any(t not in values for t in node.inputs[:2]):
        return {}
    try:
        axes = rule(*(values[t].reshape(-1).tolist() for t in node.inputs[:2]))
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
    except Exception:  # noqa: BLE001 - an op the evaluator rejects, any way, leaves the value unknown
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
    "Neg": lambda n, a: -a,
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
