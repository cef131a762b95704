"""The written node order: what ORT's PRIORITY_BASED order will execute.

Forward nodes keep their order; the backward follows, each recompute block placed
right before the first backward node that reads it. Dead nodes are pruned, and the
result is normalised through ORT's own PRIORITY_BASED rule, so the file order is
exactly the executed order (Shape/Size readers included).
"""

from __future__ import annotations

import onnx

from ..analysis import schedules
from ..graph import ABSENT, Graph


def interleave(forward: list[onnx.NodeProto], backward: list[onnx.NodeProto],
               blocks: list[tuple[int, list[onnx.NodeProto]]]) -> list[onnx.NodeProto]:
    """Forward nodes, then backward nodes with each block inserted before backward[k]."""
    before: dict[int, list[onnx.NodeProto]] = {}
    for k, block in sorted(blocks, key=lambda kb: kb[0]):
        before.setdefault(k, []).extend(block)
    out = list(forward)
    for k, node in enumerate(backward):
        out.extend(before.pop(k, ()))
        out.append(node)
    for block in before.values():  # blocks nobody reads are pruned later
        out.extend(block)
    return out


def prune_dead(nodes: list[onnx.NodeProto], graph_outputs: set[str]) -> list[onnx.NodeProto]:
    """Drop nodes none of whose outputs is read or is a graph output (one reverse pass,
    which is exact because ``nodes`` is topologically sorted)."""
    needed = set(graph_outputs)
    keep = [False] * len(nodes)
    for k in range(len(nodes) - 1, -1, -1):
        n = nodes[k]
        if any(t != ABSENT and t in needed for t in n.output):
            keep[k] = True
            needed.update(t for t in n.input if t != ABSENT)
    return [n for n, kept in zip(nodes, keep) if kept]


def executed_order(graph: Graph) -> Graph:
    """The same graph with its nodes in the order ORT's PRIORITY_BASED will run them."""
    order = schedules.priority_based(graph)
    if order == list(range(len(graph.nodes))):
        return graph
    return graph.with_nodes([graph.nodes[i].proto for i in order])
