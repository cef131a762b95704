"""A thin graph IR over the ONNX protobuf: nodes, tensors, producers and consumers.

We keep the original ``NodeProto`` objects and index them instead of converting the
model to another IR: converting a 100k-node graph both ways costs more than loading
and saving it (see ``bench/``), and speed against that I/O floor is a goal.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from .errors import ModelError

# Tensors with a name of "" are absent optional inputs/outputs in ONNX.
ABSENT = ""


@dataclass(eq=False)
class Node:
    """One node of the graph; ``index`` is its position in the file."""

    index: int
    name: str
    op_type: str
    domain: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    proto: onnx.NodeProto

    @property
    def has_subgraph(self) -> bool:
        return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in self.proto.attribute)

    def attr(self, name: str, default=None):
        for a in self.proto.attribute:
            if a.name == name:
                return onnx.helper.get_attribute_value(a)
        return default

    def meta(self, key: str) -> str | None:
        for p in self.proto.metadata_props:
            if p.key == key:
                return p.value
        return None


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
        graph = Graph(self.model, _index_nodes(protos, rename=False), list(self.inputs), list(self.outputs),
                      dict(self.initializers), path=self.path)
        graph._link()
        return graph

    def _link(self) -> None:
        producer: dict[str, int] = {}
        consumers: dict[str, list[int]] = {}
        for node in self.nodes:
            for t in node.inputs:
                if t != ABSENT:
                    consumers.setdefault(t, []).append(node.index)
            for t in node.outputs:
                if t == ABSENT:
                    continue
                if t in producer:
                    raise ModelError(f"tensor '{t}' is produced by two nodes: "
                                     f"'{self.nodes[producer[t]].name}' and '{node.name}'")
                producer[t] = node.index
        self.producer, self.consumers = producer, consumers

    # ----- queries -------------------------------------------------------------------
    @property
    def resident(self) -> list[str]:
        """Tensors that exist before any node runs: graph inputs and initializers."""
        return self.inputs + list(self.initializers)

    def node_of(self, tensor: str) -> Node | None:
        i = self.producer.get(tensor)
        return None if i is None else self.nodes[i]

    def predecessors(self, node: Node) -> list[int]:
        return [self.producer[t] for t in node.inputs if t in self.producer]

    def successors(self, node: Node) -> list[int]:
        return [c for t in node.outputs for c in self.consumers.get(t, ())]

    def topological_order(self) -> list[int]:
        """Kahn's algorithm, lowest file index first; raises ModelError on a cycle.
        Computed once per graph (a Graph is not changed after it is built)."""
        cached = self.__dict__.get("_topological")
        if cached is not None:
            return cached
        indegree = [0] * len(self.nodes)
        for node in self.nodes:
            indegree[node.index] = len(set(self.predecessors(node)))
        ready = [n.index for n in self.nodes if indegree[n.index] == 0]
        heapq.heapify(ready)
        order: list[int] = []
        while ready:
            i = heapq.heappop(ready)
            order.append(i)
            for j in set(self.successors(self.nodes[i])):
                indegree[j] -= 1
                if indegree[j] == 0:
                    heapq.heappush(ready, j)
        if len(order) != len(self.nodes):
            stuck = next(n for n in self.nodes if indegree[n.index] > 0)
            raise ModelError(f"the graph has a cycle through node '{stuck.name}' ({stuck.op_type})")
        self.__dict__["_topological"] = order
        return order

    def opset(self, domain: str = "") -> int | None:
        for o in self.model.opset_import:
            if o.domain in ((domain,) if domain else ("", "ai.onnx")):
                return o.version
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
        nodes.append(Node(i, name, p.op_type, p.domain, tuple(p.input), tuple(p.output), p))
    return nodes
