"""Validation by ONNX Runtime itself: a model ckpt accepts is one ORT loads.

onnx's checker knows neither the ops ORT adds to the ONNX domain nor ORT's own rules, so
ckpt loads a weight-free copy of the graph in a CPU session (optimizations off, nothing
run) and refuses the model with ORT's reason. Weights above a few bytes travel as typed
graph inputs, so the cost is ORT's graph resolution (schemas, types, ORT's own shape
inference), plus, for graphs up to 2,000 nodes, its kernels' creation (about 40 ms for a
650-node training graph, 90 ms for 1,800 nodes).

An op the CPU provider has no kernel for is not the model's fault (bfloat16 arithmetic:
the model is valid, a CUDA session runs it) and passes. A graph holding ops this
onnxruntime has no schema for (an ORT training artifact's gradient ops, which only
onnxruntime-training registers) cannot be resolved whole: there ORT is given every node
it registers, with what the others make typed as the file declares it (onnx's strict
inference misses type errors after an op of a domain it does not know). An op of ORT's
own domains (com.microsoft) that neither this onnxruntime nor onnxruntime-training
registers is refused: no ORT build loads it.
"""

from __future__ import annotations

import re
from functools import cache
from itertools import chain
from pathlib import Path
from types import ModuleType
from typing import Iterator

import onnx

from ..errors import ModelError
from ..graph import ABSENT, Graph, Node, embedded_bytes, weightless_copy
from ..ops import ORT_TRAINING_SCHEMAS
from . import ort_module, output_ir_version

_INLINE_BYTES = 1024  # initializers above this many bytes reach ORT as typed graph inputs
_INITIALIZE_MAX_NODES = 2_000  # ORT creates the kernels of graphs up to this size (0.1 s) too
_ONNX_DOMAINS = ("", "ai.onnx")
# ORT's message prefixes: its status code and, for some errors, the C++ source location
_PREFIX = re.compile(r"^(\[ONNXRuntimeError\] : \d+ : \w+ : )?(Load model from .*? failed:)?"
                     r"(/\S+:\d+ [^\[]*?\)\s*)?")


@cache
def _registered() -> frozenset[tuple[str, str]]:
    """(domain, op) of every schema the installed onnxruntime registers."""
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

    try:
        schemas = ort_state.get_all_operator_schema()
    except (AttributeError, RuntimeError):
        return frozenset()
    return frozenset(("" if s.domain in _ONNX_DOMAINS else s.domain, s.name) for s in schemas)


def _all_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    for node in graph.node:
        yield node
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _all_nodes(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    yield from _all_nodes(g)


def ort_resolvable(model: onnx.ModelProto) -> bool:
    """Whether this onnxruntime has a schema (or the model a function) for every node."""
    registered = _registered()
    if not registered:
        return False
    local = {(f.domain, f.name) for f in model.functions}
    nodes = list(_all_nodes(model.graph))
    for f in model.functions:
        nodes.extend(f.node)
    for node in nodes:
        domain = "" if node.domain in _ONNX_DOMAINS else node.domain
        if (domain, node.op_type) not in registered and (node.domain, node.op_type) not in local:
            return False
    return True


def ort_reason(error: Exception) -> str:
    """ORT's message without its status prefix and source location, one line."""
    first = next((line for line in str(error).splitlines() if line.strip()), type(error).__name__)
    # "In Node, (<every input and output>) , Error <what>": the what names the node
    first = first.split(" , Error ", 1)[-1]
    return _PREFIX.sub("", first.strip(), count=1)[:300] or first[:300]


def _resolve(ort: ModuleType, ort_state: ModuleType, so: object, model: onnx.ModelProto) -> None:
    """Load ``model`` in ORT; raises what ORT raises. Loading resolves the graph (schemas,
    types, ORT's shape inference): 0.7 s at 13k nodes. Initializing (kernels, allocation
    plan) costs 9 times that: only small graphs get it."""
    data = model.SerializeToString()
    try:
        session = ort_state.InferenceSession(so, data, False, False)  # what ort.InferenceSession wraps
    except TypeError:  # another binding's signature: the whole session
        ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
        return
    if len(model.graph.node) <= _INITIALIZE_MAX_NODES:
        session.initialize_session(["CPUExecutionProvider"], [{}], set())


def _session_refusal(model: onnx.ModelProto, folder: Path) -> str | None:
    """ORT's reason for refusing ``model`` in a CPU session (None: it loads, or only lacks a
    CPU kernel for an op, which another provider may have)."""
    ort = ort_module()
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 4
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    # Tensors kept as external data (Constant values) lie beside the model, wherever ckpt runs.
    so.add_session_config_entry("session.model_external_initializers_file_folder_path", str(folder))
    try:
        _resolve(ort, ort_state, so, model)
    except ort_state.NotImplemented:
        return None
    except Exception as e:  # noqa: BLE001 - any other refusal is the model's
        return ort_reason(e)
    return None


def _unknown_op(model: onnx.ModelProto) -> str | None:
    """The first op of a domain this onnxruntime registers ops in (com.microsoft...) that it
    does not register, that is no local function and none of onnxruntime-training's ops
    (``ORT_TRAINING_SCHEMAS``): ORT refuses it in any build. None: there is none, or this
    onnxruntime does not list its schemas."""
    registered = _registered()
    owned = {d for d, _ in registered} - {""}  # the ONNX domain's unknown ops are onnx.checker's
    local = {(f.domain, f.name) for f in model.functions}
    for node in chain(_all_nodes(model.graph), (n for f in model.functions for n in f.node)):
        key = (node.domain, node.op_type)
        if node.domain in owned and key not in registered and key not in local \
                and ORT_TRAINING_SCHEMAS.get(node.op_type, ("", False))[0] != node.domain:
            return f"{node.domain}:{node.op_type}"
    return None


def _resolvable_nodes(graph: Graph) -> list[Node]:
    """The nodes this onnxruntime resolves on their own, in topological order: registered ops
    (local functions of registered ops) whose subgraphs hold only such ops, reading what the
    graph types or such nodes make. A tensor an unregistered op (a training op) makes is
    typed where the file declares it."""
    registered = _registered()
    model = graph.model
    functions = {(f.domain, f.name) for f in model.functions
                 if all(_key(n) in registered for n in f.node)}

    def resolvable(proto: onnx.NodeProto) -> bool:
        if _key(proto) not in registered and (proto.domain, proto.op_type) not in functions:
            return False
        return all(_key(n) in registered or (n.domain, n.op_type) in functions for n in _subgraph_nodes(proto))

    src = model.graph
    typed = {v.name for v in chain(src.input, src.value_info, src.output) if _elem_type(v)}
    typed |= {t.name for t in src.initializer} | {ABSENT}
    kept = []
    for i in graph.topological_order():
        node = graph.nodes[i]
        if resolvable(node.proto) and all(t in typed for t in node.reads):
            kept.append(node)
            typed.update(node.outputs)
    return kept


def _key(node: onnx.NodeProto) -> tuple[str, str]:
    return "" if node.domain in _ONNX_DOMAINS else node.domain, node.op_type


def _subgraph_nodes(node: onnx.NodeProto) -> Iterator[onnx.NodeProto]:
    for a in node.attribute:
        for g in [a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs:
            yield from _all_nodes(g)


def _elem_type(v: onnx.ValueInfoProto) -> int:
    return v.type.tensor_type.elem_type if v.type.HasField("tensor_type") else 0


def _rank_only(v: onnx.ValueInfoProto) -> onnx.ValueInfoProto:
    """``v``'s element type and rank: the sizes a training op makes are ORT's to infer, and it
    merges a declared size that contradicts them leniently."""
    out = onnx.ValueInfoProto()
    out.CopyFrom(v)
    tt = out.type.tensor_type
    if tt.HasField("shape"):
        for d in tt.shape.dim:
            d.Clear()
    return out


def _resolvable_excerpt(graph: Graph) -> onnx.ModelProto | None:
    """For a graph this onnxruntime cannot resolve whole (an ORT training artifact's gradient
    ops, which only onnxruntime-training registers): the nodes it can (``_resolvable_nodes``),
    with what the others make as typed graph inputs; None when there is none."""
    nodes = _resolvable_nodes(graph)
    if not nodes:
        return None
    src = graph.model.graph
    made = {t for n in nodes for t in n.outputs if t != ABSENT}
    needed = {t for n in nodes for t in n.reads if t != ABSENT and t not in made}
    declared = {v.name: v for v in chain(src.value_info, src.output)}
    inputs = {v.name: v for v in src.input}
    initializers = {t.name: t for t in src.initializer}
    small = [t for name, t in initializers.items() if name in needed and t.data_location != onnx.TensorProto.EXTERNAL
             and embedded_bytes(t) <= _INLINE_BYTES]
    inlined = {t.name for t in small}
    model = onnx.ModelProto(ir_version=graph.model.ir_version)
    model.opset_import.extend(graph.model.opset_import)
    used = {(n.domain, n.op_type) for n in nodes}
    model.functions.extend(f for f in graph.model.functions if (f.domain, f.name) in used)
    g = model.graph
    g.node.extend(n.proto for n in nodes)
    g.initializer.extend(small)
    for t in sorted(needed - inlined):
        if t in inputs:
            g.input.append(inputs[t])
        elif t in initializers:
            g.input.append(onnx.helper.make_tensor_value_info(t, initializers[t].data_type,
                                                              list(initializers[t].dims)))
        else:
            g.input.append(_rank_only(declared[t]))
    # made tensors as the file declares them (ORT checks a declared type against the op's)
    g.output.extend(declared.get(t) or onnx.ValueInfoProto(name=t) for t in sorted(made))
    return model


def check_on_ort(graph: Graph, path: Path, order: list[int]) -> None:
    """Refuse (ModelError) a model ORT's CPU session refuses to load: the whole graph (in
    ckpt's topological ``order``), or where this onnxruntime cannot resolve it (training
    ops), its ONNX-domain nodes that only ORT registers, on their own."""
    model = graph.model
    ort_module()
    light: onnx.ModelProto | None
    if ort_resolvable(model):
        light = weightless_copy(model, (model.graph.node[i] for i in order), inline_bytes=_INLINE_BYTES)
    else:
        unknown = _unknown_op(model)
        if unknown is not None:
            raise ModelError(f"{path}: ONNX Runtime refuses the model ({unknown} is an op neither onnxruntime "
                             f"{ort_module().__version__} nor onnxruntime-training registers)")
        light = _resolvable_excerpt(graph)
    if light is None:
        return
    light.ir_version = output_ir_version(model)  # the version ckpt writes: one ORT loads
    reason = _session_refusal(light, path.parent.resolve())
    if reason is not None:
        raise ModelError(f"{path}: ONNX Runtime refuses the model ({reason})")
