"""The guard nodes pin and fresh write: small int64 chains that end in a ``Reshape`` view of
a tensor by a shape of zeros (a zero entry copies the input's dimension, so the view is
the tensor itself, with no copy). What makes the shape a guard is where it comes from:
pin computes it from ``Size`` of a tensor written just before a recompute block (the block
cannot run before it), fresh passes it through a ``Slice`` so that ORT cannot know its
value (nor the view's shape).

Every guard node is a backward node (also when a re-analysis of the written file reads
it), carries its writer's mark, gets a name no tensor or node of the graph has, and has
its output's size recorded.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx

from ..analysis.phases import BACKWARD
from ..analysis.shapes import TensorInfo
from ..graph import Graph, Node, unique_name
from ..markers import FRESH_META, GUARD_META, PHASE_META
from ..ops import ORT_FUSED_CHAINS, ort_may_fuse

INT64 = onnx.TensorProto.INT64


class GuardNodes:
    """Makes guard nodes for one graph; records their outputs in ``tensors`` (changed in place)."""

    def __init__(self, graph: Graph, tensors: dict[str, TensorInfo], mark_key: str) -> None:
        self.taken = set(graph.producer) | set(graph.resident) | {n.name for n in graph.nodes}
        self.tensors = tensors
        self.mark_key = mark_key

    def name(self, base: str) -> str:
        return unique_name(base, self.taken)

    def node(self, op: str, inputs: list[str], output: str, mark: str, **attrs: Any) -> onnx.NodeProto:
        """A node named as its one output, marked and a backward node."""
        p = onnx.helper.make_node(op, inputs, [output], name=output, **attrs)
        for key, value in ((self.mark_key, mark), (PHASE_META, BACKWARD)):
            entry = p.metadata_props.add()
            entry.key, entry.value = key, value
        return p

    def int64(self, output: str, shape: tuple[int, ...]) -> str:
        self.tensors[output] = TensorInfo(INT64, shape, 8 * math.prod(shape))
        return output

    def size(self, source: str, output: str, mark: str) -> onnx.NodeProto:
        """``Size(source)``: a scalar that exists only once ``source`` does."""
        self.int64(output, ())
        return self.node("Size", [source], output, mark)

    def constant(self, output: str, values: list[int], mark: str) -> onnx.NodeProto:
        self.int64(output, (len(values),))
        return self.node("Constant", [], output, mark, value=onnx.numpy_helper.from_array(np.array(values, np.int64)))

    def view(self, x: str, shape: str, output: str, mark: str, info: TensorInfo) -> onnx.NodeProto:
        """``Reshape(x, shape)`` with ``shape`` all zeros: ``x`` itself, read through a guard."""
        self.tensors[output] = info
        return self.node("Reshape", [x, shape], output, mark)


def _is_view(node: Node) -> bool:
    """A view pin or fresh wrote: the edge it stands on is the edge behind it."""
    return node.op_type == "Reshape" and (node.meta(GUARD_META) is not None or node.meta(FRESH_META) is not None)


def _producer(graph: Graph, x: str) -> Node | None:
    """The node that makes ``x``, behind ckpt's views; None for a graph input or initializer."""
    while x in graph.producer:
        p = graph.nodes[graph.producer[x]]
        if not _is_view(p):
            return p
        x = p.inputs[0]
    return None


def _readers(graph: Graph, t: str) -> list[Node]:
    """The nodes that read ``t``, behind ckpt's views."""
    out, todo = [], list(graph.consumers.get(t, ()))
    while todo:
        c = graph.nodes[todo.pop()]
        if _is_view(c):
            todo.extend(graph.consumers.get(c.outputs[0], ()))
        else:
            out.append(c)
    return out


def _fuses(graph: Graph, p: Node, c: Node) -> bool:
    """Whether ORT may fuse ``p`` into its reader ``c``: a pair it fuses, or an edge of a
    chain it fuses whole, found in the graph around the edge."""
    if ort_may_fuse(p.op_type, c.op_type):
        return True
    return any(chain[i] == p.op_type and chain[i + 1] == c.op_type and _chain_before(graph, p, chain[:i])
               and _chain_after(graph, c, chain[i + 2:])
               for chain in ORT_FUSED_CHAINS for i in range(len(chain) - 1))


def _chain_before(graph: Graph, node: Node, ops: tuple[str, ...]) -> bool:
    if not ops:
        return True
    return any(q is not None and q.op_type == ops[-1] and _chain_before(graph, q, ops[:-1])
               for q in (_producer(graph, x) for x in node.inputs if x))


def _chain_after(graph: Graph, node: Node, ops: tuple[str, ...]) -> bool:
    if not ops:
        return True
    return any(r.op_type == ops[0] and _chain_after(graph, r, ops[1:]) for t in node.outputs for r in _readers(graph, t))


def fused_edge(graph: Graph, x: str, reader: Node) -> bool:
    """Whether ORT may fuse the node that makes ``x`` (behind ckpt's views) into ``reader``:
    a view put on that edge would stop the fusion."""
    p = _producer(graph, x)
    return p is not None and _fuses(graph, p, reader)


def read_by_fusion(graph: Graph, t: str) -> bool:
    """Whether ORT may fuse the node that makes ``t`` into one of its readers (behind
    ckpt's views): one more reader of ``t`` (a guard's ``Size``) would stop the fusion."""
    if t not in graph.producer:
        return False
    p = graph.nodes[graph.producer[t]]
    return any(_fuses(graph, p, c) for c in _readers(graph, t))
