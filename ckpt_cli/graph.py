"""A thin graph IR over the ONNX protobuf: nodes, tensors, producers and consumers.

We keep the original ``NodeProto`` objects and index them instead of converting the
model to another IR: converting a large graph both ways costs more than loading and
saving it, and speed against that I/O floor is a goal.
"""

from __future__ import annotations

import gc
import heapq
import math
from dataclasses import dataclass, field, replace
from functools import wraps
from itertools import chain
from pathlib import Path
from typing import Any, Callable, Iterable, NamedTuple, ParamSpec, TypeVar, cast
from sys import intern

import numpy as np
import onnx
from onnx import numpy_helper

from .errors import ModelError
from .ops import CONTROL_FLOW_OPS

# Tensors with a name of "" are absent optional inputs/outputs in ONNX.
ABSENT = ""


_P = ParamSpec("_P")
_R = TypeVar("_R")


def gc_paused(f: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run ``f`` with Python's cycle collector paused. Indexing and analysing a large graph
    allocates millions of small containers and no garbage cycles; the collections they
    trigger rescan the whole heap, again and again as it grows. Reference counting
    frees everything as usual; collection resumes when ``f`` returns."""
    @wraps(f)
    def paused(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        if not gc.isenabled():
            return f(*args, **kwargs)
        gc.disable()
        try:
            return f(*args, **kwargs)
        finally:
            gc.enable()
    return paused


@dataclass(eq=False, slots=True)
class Node:
    """One node of the graph; ``index`` is its position in the file."""

    index: int
    name: str
    op_type: str
    domain: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    proto: onnx.NodeProto
    # Outer-scope tensors its subgraphs (If/Loop/Scan bodies) read: it consumes them too,
    # though they are not in ``inputs`` (which mirrors the proto's explicit inputs).
    implicit: tuple[str, ...] = ()

    @classmethod
    def from_proto(cls, index: int, p: onnx.NodeProto) -> "Node":
        # A slice of a repeated field is a list made in one call: a third faster to copy than the
        # field. Each read of a proto's string makes a new str: interned, a tensor's name is one
        # object however many nodes read it (a fifth of a large graph's index).
        try:
            return cls(index, p.name, intern(p.op_type), p.domain, tuple(map(intern, p.input[:])),
                       tuple(map(intern, p.output[:])), p, implicit_inputs(p))
        except TypeError:  # a field that is not valid UTF-8 reads as bytes: the load's checks refuse it
            return cls(index, p.name, p.op_type, p.domain, tuple(p.input[:]), tuple(p.output[:]), p,
                       implicit_inputs(p))

    def at(self, index: int) -> "Node":
        """This node at another position (itself if it is already there)."""
        if index == self.index:
            return self
        return Node(index, self.name, self.op_type, self.domain, self.inputs, self.outputs, self.proto,
                    self.implicit)

    @property
    def reads(self) -> tuple[str, ...]:
        """Every tensor the node needs: explicit inputs, then its subgraphs' outer-scope reads."""
        return self.inputs + self.implicit if self.implicit else self.inputs

    @property
    def has_subgraph(self) -> bool:
        return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in self.proto.attribute)

    def attr(self, name: str, default: Any = None) -> Any:
        for a in self.proto.attribute:
            if a.name == name:
                return onnx.helper.get_attribute_value(a)
        return default

    def meta(self, key: str) -> str | None:
        for p in self.proto.metadata_props:
            if p.key == key:
                return cast(str, p.value)
        return None


@dataclass(frozen=True, eq=False)
class TensorIds:
    """The graph's tensor names interned to dense ints, for array-based passes."""

    names: list[str]  # id -> name
    of: dict[str, int]  # name -> id
    inputs: list[tuple[int, ...]]  # per node, its input ids; ABSENT is -1
    outputs: list[tuple[int, ...]]  # per node, its output ids; ABSENT is -1


class Csr(NamedTuple):
    """Per node, its input and its output tensor ids (-1: absent), in compressed rows:
    node ``i``'s inputs are ``in_ids[in_ptr[i]:in_ptr[i + 1]]`` (a compiled pass takes it
    as one argument)."""

    in_ptr: np.ndarray
    in_ids: np.ndarray
    out_ptr: np.ndarray
    out_ids: np.ndarray


class Edges(NamedTuple):
    """``preds`` and ``succs`` in compressed rows (node ``i``'s producers are
    ``pred_idx[pred_ptr[i]:pred_ptr[i + 1]]``; one entry per read, as the lists have them),
    for the compiled orders (``native_orders.py``)."""

    pred_ptr: np.ndarray
    pred_idx: np.ndarray
    succ_ptr: np.ndarray
    succ_idx: np.ndarray


def _edges(rows: Csr, count: int) -> Edges:
    """``Edges`` from the tensor ids' rows, in numpy: each read of a tensor some node makes
    is an edge from that node; a node's successors come by ascending reader."""
    n = len(rows.in_ptr) - 1
    producer = np.full(count + 1, -1, dtype=np.int64)  # the last slot answers the absent id -1
    made = rows.out_ids >= 0
    producer[rows.out_ids[made]] = np.repeat(np.arange(n, dtype=np.int64), np.diff(rows.out_ptr))[made]
    reader = np.repeat(np.arange(n, dtype=np.int64), np.diff(rows.in_ptr))
    source = producer[rows.in_ids]
    edge = source >= 0
    pred_idx, reader = source[edge], reader[edge]
    pred_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(reader, minlength=n), out=pred_ptr[1:])
    succ_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(pred_idx, minlength=n), out=succ_ptr[1:])
    return Edges(pred_ptr, pred_idx, succ_ptr, reader[np.argsort(pred_idx, kind="stable")])


def _rows(rows: list[tuple[int, ...]]) -> tuple[np.ndarray, np.ndarray]:
    ptr = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, rows), dtype=np.int64, count=len(rows)), out=ptr[1:])
    return ptr, np.fromiter(chain.from_iterable(rows), dtype=np.int64, count=int(ptr[-1]))


@dataclass(eq=False)
class _Derived:
    """What a graph derives from its nodes on first use, kept (a Graph is not changed
    after it is built) and handed to a graph that shares the nodes' links."""

    preds: list[list[int]] | None = None
    succs: list[list[int]] | None = None
    ids: TensorIds | None = None
    csr: Csr | None = None
    edges: Edges | None = None
    topological: list[int] | None = None
    symbolic: dict[bool, frozenset[str]] = field(default_factory=dict)  # symbolic_dims, by ``outputs``


@dataclass(eq=False)
class Graph:
    """An ONNX graph indexed for analysis. Node order is the file order."""

    model: onnx.ModelProto
    nodes: list[Node]
    inputs: list[str]
    outputs: list[str]
    initializers: dict[str, onnx.TensorProto]
    producer: dict[str, int] = field(default_factory=dict)
    consumers: dict[str, list[int]] = field(default_factory=dict)
    path: Path | None = None
    # Nodes ORT makes when it inlines a function op of the file at session start: it numbers
    # them after the file's nodes, which decides where its PRIORITY_BASED order runs them.
    inlined: tuple[int, ...] = ()
    _derived: _Derived = field(default_factory=_Derived, init=False, repr=False)

    @classmethod
    def from_model(cls, model: onnx.ModelProto, path: Path | None = None) -> "Graph":
        g = model.graph
        initializers = {t.name: t for t in g.initializer}
        inputs = [v.name for v in g.input if v.name not in initializers]
        outputs = [v.name for v in g.output]
        nodes = _index_nodes(list(g.node))
        graph = cls(model, nodes, inputs, outputs, initializers, path=path)
        graph._link()
        return graph

    def with_nodes(self, protos: list[onnx.NodeProto]) -> "Graph":
        """A new graph with the same inputs, outputs and initializers, and these nodes in this order."""
        return self.with_node_list(_index_nodes(protos, rename=False))

    def with_node_list(self, nodes: list[Node]) -> "Graph":
        """``with_nodes`` from already indexed nodes (renumbered by position): their protos are
        not read again, so they must not have changed since they were indexed."""
        graph = self._relinked(nodes)
        if self._derived.ids is not None:
            graph._derived.ids = self._derived_ids(nodes)
        return graph

    def _relinked(self, nodes: list[Node]) -> "Graph":
        # A derived graph has no file: nothing may mistake the original's path for its own.
        graph = Graph(self.model, [n.at(k) for k, n in enumerate(nodes)], list(self.inputs), list(self.outputs),
                      dict(self.initializers))
        graph._link()
        return graph

    def _derived_ids(self, nodes: list[Node]) -> TensorIds:
        """``ids`` of a graph of ``nodes`` with this graph's inputs, outputs and initializers:
        this graph's numbering, new tensors after it, and this graph's nodes' id tuples as
        they are (a rewrite keeps most nodes: interning them again would be wasted work).
        Names of tensors the new graph lacks keep their ids, unread."""
        ids = self.ids
        names, of = list(ids.names), dict(ids.of)
        own = self.nodes

        def intern(ts: tuple[str, ...]) -> tuple[int, ...]:
            out = []
            for t in ts:
                if t == ABSENT:
                    out.append(-1)
                    continue
                k = of.get(t)
                if k is None:
                    k = of[t] = len(names)
                    names.append(t)
                out.append(k)
            return tuple(out)

        inputs, outputs = [], []
        for n in nodes:
            i = n.index
            if i < len(own) and own[i] is n:
                inputs.append(ids.inputs[i])
                outputs.append(ids.outputs[i])
            else:
                inputs.append(intern(n.reads))
                outputs.append(intern(n.outputs))
        return TensorIds(names, of, inputs, outputs)

    def reordered(self, order: list[int]) -> "Graph":
        """This graph's nodes in ``order`` (node ``k`` of the result is ``self.nodes[order[k]]``)."""
        graph = self._relinked([self.nodes[i] for i in order])
        ids = self._derived.ids
        if ids is not None:  # the same tensors: keep their numbers
            graph._derived.ids = TensorIds(ids.names, ids.of, [ids.inputs[i] for i in order], [ids.outputs[i] for i in order])
        return graph

    def replaced(self, protos: dict[int, onnx.NodeProto]) -> "Graph":
        """This graph with the nodes at these indices made from these protos, the others kept."""
        return self.with_node_list([Node.from_proto(n.index, protos[n.index]) if n.index in protos else n
                                    for n in self.nodes])

    def remarked(self, protos: dict[int, onnx.NodeProto]) -> "Graph":
        """``replaced(protos)`` for protos that differ from the nodes' own only in metadata
        or attributes (same name, op, inputs and outputs): the links and tensor ids are
        kept, not rebuilt (rebuilding them is slow on large graphs, and nothing they index changed)."""
        nodes = list(self.nodes)
        for i, p in protos.items():
            n = nodes[i]
            assert (p.name, p.op_type, tuple(p.input), tuple(p.output)) == (n.name, n.op_type, n.inputs, n.outputs)
            nodes[i] = Node(i, n.name, n.op_type, n.domain, n.inputs, n.outputs, p, n.implicit)
        graph = Graph(self.model, nodes, list(self.inputs), list(self.outputs), dict(self.initializers),
                      self.producer, self.consumers)
        graph._derived = replace(self._derived)
        return graph

    def _link(self) -> None:
        producer: dict[str, int] = {}
        consumers: dict[str, list[int]] = {}
        add = consumers.setdefault
        for node in self.nodes:
            i = node.index
            for t in (node.inputs + node.implicit if node.implicit else node.inputs):
                if t:  # ABSENT is ""
                    add(t, []).append(i)
            for t in node.outputs:
                if not t:
                    continue
                if t in producer:
                    raise ModelError(f"tensor '{t}' is produced by two nodes: "
                                     f"'{self.nodes[producer[t]].name}' and '{node.name}'")
                producer[t] = i
        self.producer, self.consumers = producer, consumers

    # ----- queries -------------------------------------------------------------------
    @property
    def resident(self) -> list[str]:
        """Tensors that exist before any node runs: graph inputs and initializers."""
        return self.inputs + list(self.initializers)

    def int_constant(self, name: str) -> list[int] | None:
        """The values of a small int64 initializer or Constant output (its ``value`` tensor or
        ``value_ints``: a reduction's axes); None for any other tensor."""
        t = self.initializers.get(name)
        if t is None and name in self.producer and (node := self.nodes[self.producer[name]]).op_type == "Constant":
            ints = node.attr("value_ints")
            if ints is not None:
                return [int(v) for v in ints] if len(ints) <= 64 else None
            t = node.attr("value")
        if (not isinstance(t, onnx.TensorProto) or t.data_type != onnx.TensorProto.INT64
                or t.data_location == onnx.TensorProto.EXTERNAL or math.prod(t.dims) > 64):
            return None
        return [int(v) for v in numpy_helper.to_array(t).reshape(-1)]

    def predecessors(self, node: Node) -> list[int]:
        return [self.producer[t] for t in node.reads if t in self.producer]

    def successors(self, node: Node) -> list[int]:
        return [c for t in node.outputs for c in self.consumers.get(t, ())]

    @property
    def preds(self) -> list[list[int]]:
        """``predecessors`` of every node, by index (computed once)."""
        if self._derived.preds is None:
            producer = self.producer
            self._derived.preds = [[producer[t] for t in n.reads if t in producer] for n in self.nodes]
        return self._derived.preds

    def ancestors(self, tensors: Iterable[str]) -> set[int]:
        """The nodes producing ``tensors`` and every node those depend on."""
        wanted = [self.producer[t] for t in tensors if t in self.producer]
        found = set(wanted)
        preds = self.preds
        while wanted:
            for p in preds[wanted.pop()]:
                if p not in found:
                    found.add(p)
                    wanted.append(p)
        return found

    @property
    def succs(self) -> list[list[int]]:
        """``successors`` of every node, by index (computed once)."""
        if self._derived.succs is None:
            consumers = self.consumers
            self._derived.succs = [[c for t in n.outputs for c in consumers.get(t, ())] for n in self.nodes]
        return self._derived.succs

    @property
    def ids(self) -> TensorIds:
        """Every tensor name (resident, node inputs and outputs, graph outputs) as an int, in an
        arbitrary order fixed for the graph (computed once)."""
        if self._derived.ids is None:
            self._derived.ids = self._intern_all()
        return self._derived.ids

    @property
    def csr(self) -> Csr:
        """``ids``' node inputs and outputs as flat arrays, for the compiled passes
        (``native.py``; computed once)."""
        if self._derived.csr is None:
            ids = self.ids
            self._derived.csr = Csr(*_rows(ids.inputs), *_rows(ids.outputs))
        return self._derived.csr

    @property
    def edges(self) -> Edges:
        """``preds`` and ``succs`` as flat arrays, for the compiled orders (computed once)."""
        if self._derived.edges is None:
            self._derived.edges = _edges(self.csr, len(self.ids.names))
        return self._derived.edges

    def _intern_all(self) -> TensorIds:
        names = [t for t in dict.fromkeys(chain(self.resident, self.outputs, self.producer, self.consumers))
                 if t != ABSENT]
        of = {t: i for i, t in enumerate(names)}
        lookup = {**of, ABSENT: -1}.__getitem__
        return TensorIds(names, of, [tuple(map(lookup, n.reads)) for n in self.nodes],
                         [tuple(map(lookup, n.outputs)) for n in self.nodes])

    def topological_order(self) -> list[int]:
        """Kahn's algorithm, lowest file index first; raises ModelError on a cycle.
        Computed once per graph (a Graph is not changed after it is built)."""
        cached = self._derived.topological
        if cached is not None:
            return cached
        preds = self.preds
        if all(p < i for i, ps in enumerate(preds) for p in ps):  # sorted: Kahn's gives the file order
            order = list(range(len(preds)))
        else:
            order = self._kahn()
        self._derived.topological = order
        return order

    def _kahn(self) -> list[int]:
        indegree = [len(set(ps)) for ps in self.preds]
        ready = [i for i, d in enumerate(indegree) if d == 0]
        heapq.heapify(ready)
        order: list[int] = []
        succs = self.succs
        while ready:
            i = heapq.heappop(ready)
            order.append(i)
            for j in set(succs[i]):
                indegree[j] -= 1
                if indegree[j] == 0:
                    heapq.heappush(ready, j)
        if len(order) != len(self.nodes):
            stuck = next(n for n in self.nodes if indegree[n.index] > 0)
            raise ModelError(f"the graph has a cycle through node '{stuck.name}' ({stuck.op_type})")
        return order

    def opset(self, domain: str = "") -> int | None:
        for o in self.model.opset_import:
            if o.domain in ((domain,) if domain else ("", "ai.onnx")):
                return cast(int, o.version)
        return None


def _index_nodes(protos: list[onnx.NodeProto], rename: bool = True) -> list[Node]:
    nodes: list[Node] = []
    seen: set[str] = set()
    for i, p in enumerate(protos):
        name = p.name
        if rename and (not name or name in seen):
            base = name or f"{p.op_type}_{i}"
            name, k = base, 1
            while name in seen:
                name, k = f"{base}_{k}", k + 1
            p.name = name
        seen.add(name)
        nodes.append(Node.from_proto(i, p))
    return nodes


_SUBGRAPH_TYPES = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)


def implicit_inputs(p: onnx.NodeProto) -> tuple[str, ...]:
    """Outer-scope tensors read by the node's subgraphs, in first-read order."""
    if p.op_type not in CONTROL_FLOW_OPS and p.domain in ("", "ai.onnx"):
        return ()
    graphs = [g for a in p.attribute if a.type in _SUBGRAPH_TYPES for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH
                                                                            else a.graphs)]
    if not graphs:
        return ()
    explicit = set(p.input)
    reads: dict[str, None] = {}
    for g in graphs:
        for t in _outer_reads(g):
            if t not in explicit:
                reads[t] = None
    return tuple(reads)


def _outer_reads(g: onnx.GraphProto) -> list[str]:
    """Names a subgraph (and its nested subgraphs) reads but does not define."""
    defined = {v.name for v in g.input} | {t.name for t in g.initializer}
    defined.update(s.values.name for s in g.sparse_initializer)
    for n in g.node:
        defined.update(n.output)
    reads: dict[str, None] = {}
    for n in g.node:
        for t in chain(n.input, implicit_inputs(n)):
            if t != ABSENT and t not in defined:
                reads[t] = None
    for v in g.output:  # an output may be an outer tensor passed through
        if v.name not in defined:
            reads[v.name] = None
    return list(reads)


_PACKED_TYPES = {onnx.TensorProto.INT4, onnx.TensorProto.UINT4, onnx.TensorProto.FLOAT4E2M1}
_NO_FIXED_SIZE = {onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED}


def expected_bytes(t: onnx.TensorProto) -> int | None:
    """Bytes the tensor's dims and type need, or None for types of no fixed size."""
    if t.data_type in _NO_FIXED_SIZE:
        return None
    count: int = math.prod(t.dims)
    if t.data_type in _PACKED_TYPES:
        return (count + 1) // 2
    try:
        return count * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    except (KeyError, TypeError, ValueError):
        return None


def embedded_bytes(t: onnx.TensorProto) -> int:
    """The bytes an embedded tensor's ``raw_data`` holds, as its dims and type fix them
    (reading ``raw_data`` from Python copies it, which is slow for a large weight); 0 for a
    tensor whose values sit in typed fields."""
    if not t.HasField("raw_data"):
        return 0
    need = expected_bytes(t)
    return len(t.raw_data) if need is None else need


def weightless_copy(model: onnx.ModelProto, nodes: Iterable[onnx.NodeProto] | None = None,
                    inline_bytes: int | None = None) -> onnx.ModelProto:
    """``model`` without weight bytes, for the checker, shape inference and ORT: external
    initializers, and with ``inline_bytes`` embedded ones of more raw bytes, become typed
    graph inputs. ``nodes`` replaces the file's node list (a sorted order)."""
    src = model.graph
    light = onnx.ModelProto(ir_version=model.ir_version, producer_name=model.producer_name)
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    g = light.graph
    g.name = src.name
    g.node.extend(src.node if nodes is None else nodes)
    g.input.extend(src.input)
    g.output.extend(src.output)
    g.value_info.extend(src.value_info)
    g.sparse_initializer.extend(src.sparse_initializer)
    declared = {v.name for v in src.input}
    for t in src.initializer:
        if t.data_location != onnx.TensorProto.EXTERNAL and (inline_bytes is None or embedded_bytes(t) <= inline_bytes):
            g.initializer.append(t)
        elif t.name not in declared:
            g.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return light


def unique_name(name: str, taken: set[str]) -> str:
    """``name``, or ``name_2``, ``name_3``, ... the first not in ``taken``; added to it."""
    out, k = name, 2
    while out in taken:
        out, k = f"{name}_{k}", k + 1
    taken.add(out)
    return out
