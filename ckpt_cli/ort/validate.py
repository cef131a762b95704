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
onnxruntime-training registers) cannot be resolved at all: there ORT is given the nodes
it registers in the ONNX domain and onnx does not know (LayerNormalization below opset
17), typed as the graph types their inputs, and onnx's checks cover the rest.
"""

from __future__ import annotations

import re
from functools import cache
from itertools import chain
from pathlib import Path
from typing import Iterator

import onnx

from ..errors import ModelError
from ..graph import ABSENT, Graph, embedded_bytes, weightless_copy
from . import ort_module, output_ir_version
from .expand import graph_types
from .registry import is_ort_only

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


def _resolve(ort, ort_state, so, model: onnx.ModelProto) -> None:
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


def _ort_only_excerpt(graph: Graph) -> onnx.ModelProto | None:
    """The ONNX-domain nodes onnx does not know and this onnxruntime registers, with their
    inputs typed as the graph types them; None when there is none or a type is unknown."""
    opset = graph.opset("") or 1
    registered = _registered()
    nodes = [n for n in graph.nodes if n.domain in _ONNX_DOMAINS and ("", n.op_type) in registered
             and is_ort_only(n.op_type, opset)]
    if not nodes:
        return None
    made = {t for n in nodes for t in n.outputs}
    needed = {t for n in nodes for t in n.inputs if t != ABSENT and t not in made}
    src = graph.model.graph
    small = [t for t in src.initializer if t.name in needed and t.data_location != onnx.TensorProto.EXTERNAL
             and embedded_bytes(t) <= _INLINE_BYTES]
    inlined = {t.name for t in small}
    big = [t for t in src.initializer if t.name in needed and t.name not in inlined]
    types = graph_types(graph, needed - {t.name for t in src.initializer})
    if types is None:
        return None
    model = onnx.ModelProto(ir_version=graph.model.ir_version)
    model.opset_import.extend(graph.model.opset_import)
    g = model.graph
    g.node.extend(n.proto for n in nodes)
    g.initializer.extend(small)
    g.input.extend(types[t] for t in sorted(types))
    g.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in big)
    # outputs as the file declares them (ORT checks a declared type against the op's)
    declared = {v.name: v for v in chain(src.value_info, src.output)}
    g.output.extend(declared.get(t) or onnx.ValueInfoProto(name=t) for t in sorted(made) if t != ABSENT)
    return model


def check_on_ort(graph: Graph, path: Path, order: list[int]) -> None:
    """Refuse (ModelError) a model ORT's CPU session refuses to load: the whole graph (in
    ckpt's topological ``order``), or where this onnxruntime cannot resolve it (training
    ops), its ONNX-domain nodes that only ORT registers, on their own."""
    model = graph.model
    ort_module()
    if ort_resolvable(model):
        light = weightless_copy(model, (model.graph.node[i] for i in order), inline_bytes=_INLINE_BYTES)
    else:
        light = _ort_only_excerpt(graph)
    if light is None:
        return
    light.ir_version = output_ir_version(model)  # the version ckpt writes: one ORT loads
    reason = _session_refusal(light, path.parent.resolve())
    if reason is not None:
        raise ModelError(f"{path}: ONNX Runtime refuses the model ({reason})")
