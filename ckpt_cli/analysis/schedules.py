"""The node orders ONNX Runtime executes, reproduced from its graph viewer.

A schedule is a list of node indices. ORT numbers nodes by file position, so both
orders below are functions of the file alone (without graph optimizations that add
nodes).
"""

from __future__ import annotations

import heapq

import numpy as np

from ..fast import native
from ..graph import Graph
from ..ops import HIGH_PRIORITY_OPS


def priority_based(graph: Graph, file_order: list[int] | None = None) -> list[int]:
    """``ExecutionOrder.PRIORITY_BASED``: Kahn's algorithm; among ready nodes Shape and
    Size first, then the lowest file index. For a topologically sorted file this is
    the file order, apart from Shape/Size nodes moving up to where they become ready.

    With ``file_order``, the order for the graph written with its nodes in that order
    (still as indices into ``graph.nodes``)."""
    if file_order is None and not graph.inlined and native(len(graph.nodes)):
        return _compiled_priority(graph, np.arange(len(graph.nodes), dtype=np.int64))
    at = ort_numbering(graph) if file_order is None else list(file_order)  # ORT's node index -> node
    if native(len(at)):
        return _compiled_priority(graph, np.asarray(at, dtype=np.int64))
    n = len(at)
    position = [0] * n
    for p, i in enumerate(at):
        position[i] = p
    high = [node.op_type in HIGH_PRIORITY_OPS for node in graph.nodes]
    preds = graph.preds
    if _runs_as_written(at, position, preds, high):
        return at
    # one int per ready node: Shape and Size (rank 0) before the rest, then by position
    key = [position[i] + (0 if high[i] else n) for i in range(n)]
    indegree = [len(p) for p in preds]
    ready = [key[i] for i, d in enumerate(indegree) if d == 0]
    heapq.heapify(ready)
    order: list[int] = []
    succs = graph.succs
    pop, push = heapq.heappop, heapq.heappush
    while ready:
        k = pop(ready)
        i = at[k if k < n else k - n]
        order.append(i)
        for j in succs[i]:  # one entry per edge, as ORT counts them
            indegree[j] -= 1
            if indegree[j] == 0:
                push(ready, key[j])
    return order


def _compiled_priority(graph: Graph, at: np.ndarray) -> list[int]:
    from .. import native_orders

    high = np.fromiter((node.op_type in HIGH_PRIORITY_OPS for node in graph.nodes), dtype=np.bool_,
                       count=len(graph.nodes))
    order: list[int] = native_orders.priority_based(at, graph.edges, high).tolist()
    return order


def ort_numbering(graph: Graph) -> list[int]:
    """The nodes by the index ORT gives them: file order, the nodes it inlines last."""
    if not graph.inlined:
        return list(range(len(graph.nodes)))
    inlined = set(graph.inlined)
    return [i for i in range(len(graph.nodes)) if i not in inlined] + sorted(inlined)


def _runs_as_written(at: list[int], position: list[int], preds: list[list[int]], high: list[bool]) -> bool:
    """Whether Kahn's rule above gives ``at`` itself: it is topological, and no Shape or
    Size node becomes ready before the other nodes written ahead of it have run (it would
    jump the queue; only Shape and Size nodes may lie between it and its last input)."""
    last_low = -1  # position of the last node written so far that is not Shape or Size
    for k, i in enumerate(at):
        ps = preds[i]
        last = -1 if not ps else position[ps[0]] if len(ps) == 1 else max([position[p] for p in ps])
        if last >= k:
            return False
        if not high[i]:
            last_low = k
        elif last < last_low:
            return False
    return True


def ort_default(graph: Graph) -> list[int]:
    """``ExecutionOrder.DEFAULT``: ORT's reverse depth-first walk.

    Start from the leaf nodes (no consumer node), highest index first; at each node
    visit its producers highest index first; emit a node when all its producers have
    been emitted (post-order). This is ``Graph::ReverseDFSFrom`` with ``NodeCompare``,
    checked against the order ORT's profiler reports.
    """
    if native(len(graph.nodes)):
        from .. import native_orders

        walked: list[int] = native_orders.ort_default(graph.edges).tolist()
        return walked
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
