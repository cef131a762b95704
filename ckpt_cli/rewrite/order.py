"""The written node order: what ORT's PRIORITY_BASED order will execute.

Forward nodes keep their order; the backward follows, each recompute block placed
right before the first backward node that reads it. Dead nodes are pruned, and the
result is normalised through ORT's own PRIORITY_BASED rule, so the file order is
exactly the executed order (Shape/Size readers included).
"""

from __future__ import annotations

import heapq

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


def memory_aware(graph: Graph, sizes: dict[str, int], roots: dict[str, str], movable: list[bool],
                 lazy: list[bool] | None = None) -> list[int]:
    """A topological order that runs movable nodes as soon as running them frees memory.

    Fixed nodes keep their relative file order. Among ready nodes, one whose run frees
    at least as many bytes as it allocates (it is the last reader of stashed
    activations or gradients) goes first; otherwise the lowest file index goes, where
    a ``lazy`` node (a recompute copy) counts with the index of the first non-lazy
    node that needs it, so it runs just in time. A node's net allocation only falls
    as other readers of its inputs run, so a lazy heap with two classes keeps this
    O(n log n).
    """
    nodes = graph.nodes
    key = [n.index for n in nodes]
    if lazy is not None:
        for i in range(len(nodes) - 1, -1, -1):  # reverse topological: readers first
            if lazy[i]:
                needs = [key[j] for j in graph.successors(nodes[i])]
                key[i] = min(needs) if needs else i
    keep_alive = set(graph.outputs) | set(graph.resident)
    readers: dict[str, set[int]] = {}
    for n in nodes:
        for t in n.inputs:
            if t != ABSENT:
                readers.setdefault(roots.get(t, t), set()).add(n.index)
    remaining = {b: len(r) for b, r in readers.items()}
    protected = {roots.get(t, t) for t in keep_alive}

    def alloc(n) -> int:
        return sum(sizes.get(t, 0) for t in n.outputs if t != ABSENT and roots.get(t, t) == t)

    def frees(n) -> int:
        bufs = {roots.get(t, t) for t in n.inputs if t != ABSENT}
        return sum(sizes.get(b, 0) for b in bufs if b not in protected and remaining.get(b) == 1)

    def klass(n) -> int:
        if not movable[n.index]:
            return 1
        gain = frees(n) - alloc(n)
        return 0 if gain > 0 or (gain == 0 and not (lazy and lazy[n.index])) else 1

    indegree = [len(graph.predecessors(n)) for n in nodes]
    heap = [(klass(n), key[n.index], n.index) for n in nodes if indegree[n.index] == 0]
    heapq.heapify(heap)
    done = [False] * len(nodes)
    order: list[int] = []
    while heap:
        k, _, i = heapq.heappop(heap)
        if done[i] or k != klass(nodes[i]):
            continue
        done[i] = True
        order.append(i)
        node = nodes[i]
        touched: set[int] = set()
        for b in {roots.get(t, t) for t in node.inputs if t != ABSENT}:
            remaining[b] -= 1
            if remaining[b] == 1:
                touched.update(j for j in readers[b] if not done[j])
        for j in graph.successors(node):
            indegree[j] -= 1
            if indegree[j] == 0:
                touched.add(j)
        for j in touched:
            if indegree[j] == 0 and not done[j]:
                heapq.heappush(heap, (klass(nodes[j]), key[j], j))
    return order
