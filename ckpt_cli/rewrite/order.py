"""The written node order: what ORT's PRIORITY_BASED order will execute.

Forward nodes keep their order; the backward follows, each recompute block placed
right before the first backward node that reads it. Dead nodes are pruned, and the
result is normalised through ORT's own PRIORITY_BASED rule, so the file order is
exactly the executed order (Shape/Size readers included).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..analysis import schedules
from ..fast import native
from ..graph import ABSENT, Graph, Node

if TYPE_CHECKING:
    from ..native_orders import Reads


def interleave(forward: list[Node], backward: list[Node], blocks: list[tuple[int, list[Node]]]) -> list[Node]:
    """Forward nodes, then backward nodes with each block inserted before backward[k]."""
    before: dict[int, list[Node]] = {}
    for k, block in sorted(blocks, key=lambda kb: kb[0]):
        before.setdefault(k, []).extend(block)
    out = list(forward)
    for k, node in enumerate(backward):
        out.extend(before.pop(k, ()))
        out.append(node)
    for block in before.values():  # blocks nobody reads are pruned later
        out.extend(block)
    return out


def prune_dead(nodes: list[Node], graph_outputs: set[str]) -> list[Node]:
    """Drop nodes none of whose outputs is read or is a graph output (one reverse pass,
    which is exact because ``nodes`` is topologically sorted)."""
    needed = set(graph_outputs)
    needed.discard(ABSENT)  # never needed: isdisjoint below then skips it as the names do
    keep = [False] * len(nodes)
    for k in range(len(nodes) - 1, -1, -1):
        n = nodes[k]
        if not needed.isdisjoint(n.outputs):
            keep[k] = True
            needed.update(n.inputs)
            if n.implicit:
                needed.update(n.implicit)
            needed.discard(ABSENT)
    return [n for n, kept in zip(nodes, keep) if kept]


def executed_order(graph: Graph, order: list[int] | None = None) -> Graph:
    """The same graph with its nodes in the order ORT's PRIORITY_BASED will run them when
    written in ``order`` (default: as they are)."""
    executed = schedules.priority_based(graph, order)
    if executed == list(range(len(graph.nodes))):
        return graph
    return graph.reordered(executed)


@dataclass(frozen=True)
class BufferReads:
    """What ``memory_aware`` reads of a graph whatever nodes are movable or lazy (one pass
    of the graph, shared by the orders made of it): per node the distinct buffers it reads
    and the bytes it allocates, per buffer its bytes (0: never freed) and its readers."""

    reads: list[tuple[int, ...]]
    allocs: list[int]
    size: list[int]
    readers: list[list[int]]


def buffer_reads(graph: Graph, sizes: dict[str, int], roots: dict[str, str]) -> BufferReads | Reads:
    """``graph``'s ``BufferReads``, tensors of ``sizes`` bytes sharing the buffers of ``roots``
    (as arrays, ``native_orders.Reads``, where its orders are compiled)."""
    # Buffers as ints: a tensor's id is its own buffer's (roots naming no tensor come after).
    ids = graph.ids
    buffer_id = dict(ids.of)
    root = [buffer_id.setdefault(roots.get(t, t), len(buffer_id)) for t in ids.names]
    size = [sizes.get(b, 0) for b in buffer_id]
    for t in set(graph.outputs) | set(graph.resident):  # protected: never freed
        if roots.get(t, t) in buffer_id:
            size[buffer_id[roots.get(t, t)]] = 0
    own_bytes = [sizes.get(t, 0) for t in ids.names]
    if native(len(graph.nodes)):
        from .. import native_orders

        return native_orders.buffer_reads(graph.csr, np.asarray(root, dtype=np.int64),
                                          np.asarray(own_bytes, dtype=np.int64), np.asarray(size, dtype=np.int64))
    reads = [tuple({root[t] for t in ts if t >= 0}) for ts in ids.inputs]
    allocs = [sum([own_bytes[t] for t in ts if t >= 0 and root[t] == t]) for ts in ids.outputs]
    readers: list[list[int]] = [[] for _ in size]
    for i, bufs in enumerate(reads):
        for b in bufs:
            readers[b].append(i)
    return BufferReads(reads, allocs, size, readers)


def memory_aware(graph: Graph, buffers: BufferReads | Reads, movable: list[bool],
                 lazy: list[bool] | None = None) -> list[int]:
    """A topological order that runs movable nodes as soon as running them frees memory
    (``buffers``: ``buffer_reads`` of ``graph``).

    Fixed nodes keep their relative file order. Among ready nodes, one whose run frees
    at least as many bytes as it allocates (it is the last reader of stashed
    activations or gradients) goes first; otherwise the lowest file index goes, where
    a ``lazy`` node (a recompute copy) counts with the index of the first non-lazy
    node that needs it, so it runs just in time. A node's net allocation only falls
    as other readers of its inputs run, so a lazy heap with two classes keeps this
    O(n log n).
    """
    if not isinstance(buffers, BufferReads):
        return _compiled_memory_aware(graph, buffers, movable, lazy)
    nodes = graph.nodes
    preds, succs = graph.preds, graph.succs
    key = list(range(len(nodes)))
    if lazy is not None:
        for i in range(len(nodes) - 1, -1, -1):  # reverse topological: readers first
            if lazy[i]:
                needs = [key[j] for j in succs[i]]
                key[i] = min(needs) if needs else i
    reads, allocs, size, readers = buffers.reads, buffers.allocs, buffers.size, buffers.readers
    remaining = [len(r) for r in readers]  # per buffer: its readers not run yet

    def klass(i: int) -> int:
        if not movable[i]:
            return 1
        gain = -allocs[i]
        for b in reads[i]:  # a loop, not a generator: this runs per push, a few times per node
            if remaining[b] == 1:
                gain += size[b]
        return 0 if gain > 0 or (gain == 0 and not (lazy and lazy[i])) else 1

    indegree = [len(p) for p in preds]
    heap = [(klass(i), key[i], i) for i, d in enumerate(indegree) if d == 0]
    heapq.heapify(heap)
    done = [False] * len(nodes)
    order: list[int] = []
    while heap:
        k, _, i = heapq.heappop(heap)
        if done[i] or k != klass(i):
            continue
        done[i] = True
        order.append(i)
        touched: set[int] = set()
        for b in reads[i]:
            remaining[b] -= 1
            if remaining[b] == 1:
                touched.update(j for j in readers[b] if not done[j])
        for j in succs[i]:
            indegree[j] -= 1
            if indegree[j] == 0:
                touched.add(j)
        for j in touched:
            if indegree[j] == 0 and not done[j]:
                heapq.heappush(heap, (klass(j), key[j], j))
    return order


def _compiled_memory_aware(graph: Graph, buffers: Reads, movable: list[bool], lazy: list[bool] | None) -> list[int]:
    from .. import native_orders

    n = len(graph.nodes)
    lazy_nodes = np.zeros(n, dtype=np.bool_) if lazy is None else np.asarray(lazy, dtype=np.bool_)
    order: list[int] = native_orders.memory_aware(graph.edges, buffers, np.asarray(movable, dtype=np.bool_),
                                                  lazy_nodes).tolist()
    return order


def seedless(graph: Graph, movable: list[bool]) -> list[bool]:
    """The movable nodes that no graph input only they read reaches: they can wait for their
    first reader. In a joint graph that input is the loss-gradient seed, so these read forward
    tensors alone; in an ORT artifact, whose seed is an initializer, the inputs are the gradient
    accumulators, so every backward node before them is seedless (the order is a candidate,
    taken only where it is lower)."""
    fixed_reads = {t for n in graph.nodes if not movable[n.index] for t in n.reads}
    seeds = {t for t in graph.inputs if t not in fixed_reads}
    if not seeds:
        return [False] * len(graph.nodes)
    depends = [False] * len(graph.nodes)
    preds = graph.preds
    for i in graph.topological_order():
        depends[i] = not seeds.isdisjoint(graph.nodes[i].reads) or any(map(depends.__getitem__, preds[i]))
    return [m and not d for m, d in zip(movable, depends)]
