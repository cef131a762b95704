"""Bring a graph to what ONNX Runtime executes: function ops it has no kernel for expanded.

ORT expands such ops (SoftmaxCrossEntropyLoss in plain onnxruntime) into new nodes at
session creation, even at ORT_DISABLE_ALL, so a plan made on the file would simulate
nodes ORT never runs and miss the ones it does (ORT_FACTS §8). ORT itself writes the
resolved graph (``optimized_model_filepath`` at ORT_DISABLE_ALL); its new nodes replace
the op they expand, at that op's place in the file order, named after it and carrying
its metadata. Weights never travel: ORT sees them as graph inputs.
"""

from __future__ import annotations

import tempfile
from functools import lru_cache
from pathlib import Path

import onnx

from .graph import ABSENT, Graph, weightless_copy

_INLINE_LIMIT = 1024  # initializers above this many bytes are passed to ORT as inputs
# (op, domain, opset) of function ops ORT was seen to run as they are (it has a kernel):
# a graph whose function ops are all here needs no ORT session.
_RUN_AS_IS: set[tuple[str, str, int]] = set()


@lru_cache(maxsize=None)
def _has_function(op_type: str, domain: str, opset: int) -> bool:
    try:
        schema = onnx.defs.get_schema(op_type, opset, domain)
    except Exception:  # unknown op: nothing to expand from onnx's side
        return False
    return bool(schema.has_function or schema.has_context_dependent_function)


def _resolved(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """The graph ORT runs at ORT_DISABLE_ALL on the CPU provider, or None if it cannot load it."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix="ckpt_expand_") as tmp:
        src, out = Path(tmp) / "model.onnx", Path(tmp) / "resolved.onnx"
        onnx.save(weightless_copy(model, inline_bytes=_INLINE_LIMIT), src)
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.optimized_model_filepath = str(out)
        so.log_severity_level = 3
        try:
            ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
        except Exception:  # e.g. training ops plain ORT lacks: plan on the file as it is
            return None
        return onnx.load(str(out))


def expand_functions(graph: Graph) -> Graph:
    """``graph`` with the function ops ORT expands replaced by ORT's expansion (the same
    graph when there is none)."""
    functions = {n.name: key for n in graph.nodes
                 if (key := (n.op_type, n.domain, graph.opset(n.domain) or 1)) not in _RUN_AS_IS and _has_function(*key)}
    if not functions:
        return graph
    resolved = _resolved(graph.model)
    if resolved is None:
        return graph
    names = {n.name for n in graph.nodes}
    kept = {n.name for n in resolved.graph.node if n.name in names}
    _RUN_AS_IS.update(key for name, key in functions.items() if name in kept)
    removed = {n.name: r for r, n in enumerate(n for n in graph.nodes if n.name not in kept)}
    new = [p for p in resolved.graph.node if p.name not in names]
    if not removed:
        return graph
    # Each new node belongs to the removed op whose outputs it computes.
    producer = {t: k for k, p in enumerate(new) for t in p.output}
    owner: dict[int, int] = {}
    for node in graph.nodes:
        r = removed.get(node.name)
        if r is None:
            continue
        stack = [producer[t] for t in node.outputs if t in producer]
        while stack:
            k = stack.pop()
            if k in owner:
                continue
            owner[k] = r
            stack.extend(producer[t] for t in new[k].input if t in producer)
    if len(owner) != len(new):
        return graph  # nodes ORT added for no op of the file: not an expansion we understand
    protos: list[onnx.NodeProto] = []
    for node in graph.nodes:
        if node.name in kept:
            protos.append(node.proto)
            continue
        r = removed[node.name]
        for k, p in enumerate(q for j, q in enumerate(new) if owner[j] == r):
            p.name = f"{node.name}/{p.op_type}_{k}"
            p.metadata_props.extend(node.proto.metadata_props)
            protos.append(p)
    model = onnx.ModelProto()
    model.CopyFrom(graph.model)
    del model.graph.node[:]
    model.graph.node.extend(protos)
    have = {t.name for t in model.graph.initializer} | {v.name for v in model.graph.input}
    model.graph.initializer.extend(t for t in resolved.graph.initializer if t.name not in have)
    known = {v.name for v in model.graph.value_info}
    produced = {t for p in protos for t in p.output if t != ABSENT}
    model.graph.value_info.extend(v for v in resolved.graph.value_info if v.name in produced and v.name not in known)
    return Graph.from_model(model, path=graph.path)
