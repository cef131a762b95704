"""Bring a graph to what ONNX Runtime executes: function ops it has no kernel for expanded.

ORT expands such ops (SoftmaxCrossEntropyLoss in plain onnxruntime) into new nodes at
session creation, even at ORT_DISABLE_ALL, so a plan made on the file would simulate
nodes ORT never runs and miss the ones it does. ORT itself writes the
resolved graph (``optimized_model_filepath`` at ORT_DISABLE_ALL); its new nodes replace
the op they expand, at that op's place in the file order, named after it and carrying
its metadata. Weights never travel: ORT sees them as graph inputs.

ORT is given only the nodes whose fate it decides (a session of the whole graph is slow
on large graphs): the function ops, the ops of other domains (ORT refuses the graph
when it has no kernel for one: then nothing is expanded) and the Constant nodes (their
values can decide an expansion; the splice keeps them as nodes, as a graph ORT is not
asked about keeps them). Their inputs are typed as the graph types them. A graph this
cannot stand for exactly (model-local functions, subgraphs, untyped inputs, names ORT's
inliner could collide with) goes to ORT whole.
"""

from __future__ import annotations

import tempfile
from functools import lru_cache
from itertools import chain
from pathlib import Path
from typing import Any, Callable

import onnx

from ..background import Background
from ..graph import ABSENT, Graph, Node, embedded_bytes, weightless_copy
from . import asked_in_a_child, ort_module
from .contrib_functions import contrib_expansion

_INLINE_LIMIT = 1024  # initializers above this many bytes are passed to ORT as inputs
# Function ops ORT was seen to run as they are (it has a kernel), by op, domain, opset and
# input element types: a graph whose function ops are all here needs no ORT session.
# Whether ORT has a kernel depends on the types (its CPU provider has a float64
# ReduceSumSquare, no float16 one).
RunKey = tuple[str, str, int, tuple[int, ...]]  # op type, domain, opset, input element types
_RUN_AS_IS: set[RunKey] = set()


def _run_as_is_key(graph: Graph, opsets: dict[str, int]) -> Callable[[Node], RunKey]:
    """A node's key in _RUN_AS_IS: its input element types where the file declares them,
    else every element type the file declares (a key that only a like graph shares)."""
    g = graph.model.graph
    declared = {v.name: v.type.tensor_type.elem_type for v in chain(g.input, g.value_info, g.output)}
    declared.update((t.name, t.data_type) for t in g.initializer)
    everything = tuple(sorted(set(declared.values())))

    def key(n: Node) -> RunKey:
        types = tuple(declared.get(t, -1) for t in n.inputs if t)
        return (n.op_type, n.domain, opsets[n.domain], types if -1 not in types else everything)
    return key


@lru_cache(maxsize=None)
def _has_function(op_type: str, domain: str, opset: int) -> bool:
    try:
        schema: Any = onnx.defs.get_schema(op_type, opset, domain)  # onnx's stub lacks has_function
    except Exception:  # noqa: BLE001 - unknown op (SchemaError, or worse): nothing to expand from onnx's side
        return False
    return bool(schema.has_function or schema.has_context_dependent_function)


def _resolved(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """The graph ORT runs at ORT_DISABLE_ALL on the CPU provider, or None if it cannot load
    it: asked in a forked child where one can run, so that ORT's import, environment and
    session stay out of this process, which then may never need ORT (the file's acceptance
    is decided in a child too: ``io.load.open_graph``)."""
    if not asked_in_a_child():
        return _resolved_here(model)
    return Background(lambda: _resolved_here(model)).result()


def _resolved_here(model: onnx.ModelProto) -> onnx.ModelProto | None:
    ort = ort_module()
    with tempfile.TemporaryDirectory(prefix="ckpt_expand_") as tmp:
        src, out = Path(tmp) / "model.onnx", Path(tmp) / "resolved.onnx"
        onnx.save(weightless_copy(model, inline_bytes=_INLINE_LIMIT), src)
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.optimized_model_filepath = str(out)
        so.log_severity_level = 3
        try:
            ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
        except Exception:  # noqa: BLE001 - e.g. training ops plain ORT lacks: plan on the file as it is
            return None
        return onnx.load(str(out))


def graph_types(graph: Graph, names: set[str]) -> dict[str, onnx.ValueInfoProto] | None:
    """The graph's types of ``names`` (declared, else onnx's shape inference over the nodes
    they depend on), or None when one has no element type."""
    model = graph.model
    g = model.graph
    known = {v.name: v for v in chain(g.input, g.value_info, g.output) if v.name in names}
    if len(known) < len(names):
        # Inference runs forward: the producers' ancestors decide these types (a loss's
        # inputs need the forward only, a third of a training graph).
        ancestors = graph.ancestors(t for t in names if t not in known)
        nodes = (graph.nodes[i].proto for i in graph.topological_order() if i in ancestors)
        try:
            inferred = onnx.shape_inference.infer_shapes(weightless_copy(model, nodes, inline_bytes=0)).graph
        except onnx.shape_inference.InferenceError:
            return None  # types contradicting the ops: strict inference refuses the model, naming the node
        known.update((v.name, v) for v in chain(inferred.value_info, inferred.output)
                     if v.name in names and v.name not in known)
    if len(known) < len(names) or any(not v.type.HasField("tensor_type") or not v.type.tensor_type.elem_type
                                      for v in known.values()):
        return None
    return known


def _excerpt(graph: Graph, functions: set[str]) -> tuple[onnx.ModelProto, set[str]] | None:
    """A model of the nodes ORT's resolution changes or may refuse (function ops, other
    domains, Constants), with their inputs as the graph has them, and those nodes' names;
    None when such a model cannot stand for the whole graph."""
    src = graph.model.graph
    nodes = [n for n in graph.nodes if n.name in functions or n.op_type == "Constant"
             or n.domain not in ("", "ai.onnx")]
    if graph.model.functions or any(n.implicit or n.has_subgraph for n in nodes):
        return None
    made = {t for n in nodes for t in n.outputs}
    needed = {t for n in nodes for t in n.inputs if t != ABSENT and t not in made}
    small = {t.name: t for t in src.initializer if t.name in needed
             and t.data_location != onnx.TensorProto.EXTERNAL and embedded_bytes(t) <= _INLINE_LIMIT}
    big = {t.name: t for t in src.initializer if t.name in needed and t.name not in small}
    types = graph_types(graph, needed - set(small) - set(big))
    if types is None:
        return None
    model = onnx.ModelProto(ir_version=graph.model.ir_version, producer_name=graph.model.producer_name)
    model.opset_import.extend(graph.model.opset_import)
    g = model.graph
    g.name = src.name
    g.node.extend(n.proto for n in nodes)
    g.initializer.extend(small.values())
    g.input.extend(types[t] for t in sorted(types))
    g.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in big.values())
    # what the rest of the graph reads stays used (ORT drops unused initializers, Constants included)
    read = set(graph.consumers) | set(graph.outputs)
    g.output.extend(onnx.ValueInfoProto(name=t) for t in sorted(made & read) if t != ABSENT)
    return model, {n.name for n in nodes}


def expand_functions(graph: Graph) -> Graph:
    """``graph`` with the function ops ORT expands replaced by ORT's expansion (the same
    graph when there is none). An expanded graph's model is ``graph``'s, rewritten in
    place: ``graph`` is spent. ORT training's function ops (DivGrad) come first: onnx has
    no schema for them, and plain ORT no kernel (``ort.contrib_functions``)."""
    contrib = contrib_expansion(graph)
    if not contrib:
        return _expand_onnx_functions(graph)
    made = {p.name for ps in contrib.values() for p in ps}
    graph = _expand_onnx_functions(splice_expansion(graph, contrib))
    graph.inlined = tuple(n.index for n in graph.nodes if n.name in made)
    return graph


def _expand_onnx_functions(graph: Graph) -> Graph:
    opsets = {d: graph.opset(d) or 1 for d in dict.fromkeys(n.domain for n in graph.nodes)}
    key_of = _run_as_is_key(graph, opsets)
    functions = {n.name: key for n in graph.nodes
                 if _has_function(n.op_type, n.domain, opsets[n.domain]) and (key := key_of(n)) not in _RUN_AS_IS}
    if not functions:
        return graph
    excerpt = _excerpt(graph, set(functions))
    if excerpt is not None:
        spliced = _splice(graph, functions, *excerpt)
        if spliced is not None:
            return spliced
    return _splice(graph, functions, graph.model, {n.name for n in graph.nodes}) or graph


def _splice(graph: Graph, functions: dict[str, RunKey], model: onnx.ModelProto,
            names: set[str]) -> Graph | None:
    """``graph`` with ORT's resolution of ``model`` (the nodes ``names`` of it) spliced in;
    None when ``model`` is an excerpt ORT refuses or whose expansion uses a name the rest of
    the graph has."""
    resolved = _resolved(model)
    if resolved is None:  # an excerpt ORT refuses goes whole: ORT may refuse the graph, or only the excerpt
        return graph if model is graph.model else None
    _strip_inserted_casts(resolved.graph)
    # The file's Constant nodes stay as they are: ORT makes them initializers at load in every
    # session, expanded or not, and a graph with no function op left to expand (none, or all
    # known to run as they are) is never given to ORT, so keeping ORT's version here made the
    # same file load differently with the process's history.
    constants = [n for n in graph.nodes if n.op_type == "Constant" and n.domain in ("", "ai.onnx")]
    kept = ({n.name for n in resolved.graph.node if n.name in names} | ({n.name for n in graph.nodes} - names)
            | {n.name for n in constants})
    _RUN_AS_IS.update(key for name, key in functions.items() if name in kept)
    removed = {n.name: r for r, n in enumerate(n for n in graph.nodes if n.name not in kept)}
    new = [p for p in resolved.graph.node if p.name not in names]
    if not removed:
        return graph
    if model is not graph.model and _collides(graph, model, resolved, new, kept, constants):
        return None
    owner = _owners(graph, removed, new)
    if len(owner) != len(new):
        return graph  # nodes ORT added for no op of the file: not an expansion we understand
    expansion = _expansion(graph, removed, new, owner)
    _splice_in(graph.model, expansion)
    _adopt_resolved(graph, expansion, resolved.graph)
    return _indexed(graph.model, graph, expansion)


def _collides(graph: Graph, model: onnx.ModelProto, resolved: onnx.ModelProto, new: list[onnx.NodeProto],
              kept: set[str], constants: list[Node]) -> bool:
    """Whether the expansion of the excerpt ``model`` makes a tensor the rest of the graph has."""
    own = {t for n in graph.nodes if n.name not in kept for t in n.outputs}
    # ORT's initializer copies of the kept Constants are dropped (_adopt_resolved): not a collision
    made = ({t for p in new for t in p.output} | {t.name for t in resolved.graph.initializer}) - {
        t for n in constants for t in n.outputs}
    taken = (set(graph.producer) | set(graph.consumers) | set(graph.initializers) | set(graph.inputs)) - own
    return bool(made & taken - {t.name for t in model.graph.initializer} - {v.name for v in model.graph.input})


def _owners(graph: Graph, removed: dict[str, int], new: list[onnx.NodeProto]) -> dict[int, int]:
    """Each new node belongs to the removed op whose outputs it computes: new node -> that op's
    rank among the removed."""
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
    return owner


def _expansion(graph: Graph, removed: dict[str, int], new: list[onnx.NodeProto],
               owner: dict[int, int]) -> dict[int, list[onnx.NodeProto]]:
    """A removed op's position -> its new nodes, named after it and carrying its metadata."""
    expansion: dict[int, list[onnx.NodeProto]] = {}
    for node in graph.nodes:
        r = removed.get(node.name)
        if r is None:
            continue
        expansion[node.index] = [q for j, q in enumerate(new) if owner[j] == r]
        for k, p in enumerate(expansion[node.index]):
            p.name = f"{node.name}/{p.op_type}_{k}"
            p.metadata_props.extend(node.proto.metadata_props)
    return expansion


def _splice_in(model: onnx.ModelProto, expansion: dict[int, list[onnx.NodeProto]]) -> None:
    """Each removed op of ``model`` gives way to its expansion where it stood."""
    # In place: the graph's model is ckpt's own (load's, or load_input's copy of a caller's),
    # and a copy would hold its weights twice and take time to make. The last op goes first
    # (positions before it stay valid); the kept protos are neither copied nor read back,
    # which is slow on large graphs. The graph given is spent: the model is the new graph's.
    node_list = model.graph.node
    for position in sorted(expansion, reverse=True):
        del node_list[position]
        for k, p in enumerate(expansion[position]):
            node_list.insert(position + k, p)


def _adopt_resolved(graph: Graph, expansion: dict[int, list[onnx.NodeProto]], resolved: onnx.GraphProto) -> None:
    """Add to ``graph``'s model the initializers and value_info of ORT's resolution that the
    expansion reads or makes."""
    model = graph.model
    have = {t.name for t in model.graph.initializer} | {v.name for v in model.graph.input}
    produced = {t for n in graph.nodes if n.index not in expansion for t in n.outputs}
    produced.update(t for ps in expansion.values() for p in ps for t in p.output)
    produced.discard(ABSENT)
    # a kept Constant's output is its value, not ORT's initializer copy of it
    model.graph.initializer.extend(t for t in resolved.initializer if t.name not in have and t.name not in produced)
    known = {v.name for v in model.graph.value_info}
    model.graph.value_info.extend(v for v in resolved.value_info if v.name in produced and v.name not in known)


_INSERTED_CAST = "InsertedPrecisionFreeCast_"


def _strip_inserted_casts(g: onnx.GraphProto) -> None:
    """Remove the Casts ORT's CPU provider inserts around nodes it has no float16 kernel
    for (outputs named ``InsertedPrecisionFreeCast_<tensor>``), with the value_info they
    change. They belong to the session, not to the expansion: ORT inserts them again when
    it loads the written file, and a file holding them already is refused ("Duplicate
    definition of name")."""
    casts = [p for p in g.node if p.op_type == "Cast" and len(p.input) == 1 and len(p.output) == 1]
    # before a node: Cast(x) -> Inserted..._x, read in x's place; after it: the node writes
    # Inserted..._y and a Cast makes y, so the node writes y itself
    source = {p.output[0]: p.input[0] for p in casts if p.output[0].startswith(_INSERTED_CAST)}
    target = {p.input[0]: p.output[0] for p in casts if p.input[0].startswith(_INSERTED_CAST)
              and not p.output[0].startswith(_INSERTED_CAST)}
    if not source and not target:
        return
    dropped = set(source) | set(target.values())
    kept = [p for p in g.node if not (p in casts and p.output[0] in dropped)]
    for p in kept:
        for k, t in enumerate(p.input):
            while t in source:
                t = source[t]
            p.input[k] = target.get(t, t)
        for k, t in enumerate(p.output):
            p.output[k] = target.get(t, t)
    del g.node[:]
    g.node.extend(kept)
    # the expansion's tensors ran in float32 there: their types are inferred again from the file
    del g.value_info[:]


def splice_expansion(graph: Graph, expansion: dict[int, list[onnx.NodeProto]]) -> Graph:
    """``graph`` with each node at a position of ``expansion`` replaced by its new nodes
    (in place: ``graph`` is spent)."""
    _splice_in(graph.model, expansion)
    return _indexed(graph.model, graph, expansion)


def _indexed(model: onnx.ModelProto, graph: Graph, expansion: dict[int, list[onnx.NodeProto]]) -> Graph:
    """``Graph.from_model(model)`` for ``graph``'s model with ``expansion`` spliced in: only
    the new nodes are read, the kept ones keep their Node (moved where they now stand;
    indexing every proto again is slow on large graphs)."""
    node_list = model.graph.node
    nodes: list[Node] = []
    for n in graph.nodes:
        if n.index in expansion:
            at = len(nodes)
            nodes.extend([Node.from_proto(k, node_list[k]) for k in range(at, at + len(expansion[n.index]))])
        else:
            nodes.append(n.at(len(nodes)))
    if len({n.name for n in nodes}) < len(nodes) or not all(n.name for n in nodes):
        return Graph.from_model(model, path=graph.path)  # names from_model makes unique
    g = model.graph
    initializers = {t.name: t for t in g.initializer}
    new = Graph(model, nodes, [v.name for v in g.input if v.name not in initializers], [v.name for v in g.output],
                initializers, path=graph.path)
    new._link()
    return new
