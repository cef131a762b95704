"""The node orders ONNX Runtime executes, reproduced from its graph viewer.

A schedule is a list of node indices. ORT numbers nodes by file position, so both
orders below are functions of the file alone (without graph optimizations that add
nodes).
"""

from __future__ import annotations

import heapq

from ..graph import Graph
from ..ops import HIGH_PRIORITY_OPS


def priority_based(graph: Graph, file_order: list[int] | None = None) -> list[int]:
    """``ExecutionOrder.PRIORITY_BASED``: Kahn's algorithm; among ready nodes Shape and
    Size first, then the lowest file index. For a topologically sorted file this is
    the file order, apart from Shape/Size nodes moving up to where they become ready.

    With ``file_order``, the order for the graph written with its nodes in that order
    (still as indices into ``graph.nodes``)."""
    at = list(range(len(graph.nodes))) if file_order is None else list(file_order)  # file position -> node
    position = [0] * len(at)
    for p, i in enumerate(at):
        position[i] = p
    rank = [0 if n.op_type in HIGH_PRIORITY_OPS else 1 for n in graph.nodes]
    indegree = [len(p) for p in graph.preds]
    ready = [(rank[i], position[i]) for i, d in enumerate(indegree) if d == 0]
    heapq.heapify(ready)
    order: list[int] = []
    succs = graph.succs
    while ready:
        i = at[heapq.heappop(ready)[1]]
        order.append(i)
        for j in succs[i]:  # one entry per edge, as ORT counts them
            indegree[j] -= 1
            if indegree[j] == 0:
                heapq.heappush(ready, (rank[j], position[j]))
    return order


def ort_default(graph: Graph) -> list[int]:
    """``ExecutionOrder.DEFAULT``: ORT's reverse depth-first walk.

    Start from the leaf nodes (no consumer node), highest index first; at each node
    visit its producers highest index first; emit a node when all its producers have
    been emitted (post-order). This is ``Graph::ReverseDFSFrom`` with ``NodeCompare``,
    checked against the order ORT's profiler reports.
    """
    preds = graph.preds
    has_consumer = [False] * len(preds)
    for ps in preds:
        for p in ps:
            has_consumer[p] = True
    stack: list[tuple[int, bool]] = [(i, False) for i, c in enumerate(has_consumer) if not c]
    visited = [False] * len(preds)
    order: list[int] = []
    while stack:
        i, leaving = stack.pop()
        if leaving:
            order.append(i)
            continue
        if visited[i]:
            continue
        visited[i] = True
        stack.append((i, True))
        # ORT sorts producers by ascending index and pushes them in that order, so the
        # highest index ends on top of the stack and is walked first.
        for p in sorted(preds[i]):
            if not visited[p]:
                stack.append((p, False))
    return order
