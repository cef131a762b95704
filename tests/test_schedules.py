"""ckpt's copies of ORT's two execution orders against the order ORT's profiler reports.

Random training graphs (tests/fixtures/randgraph.py: Shape and Size nodes included, which
PRIORITY_BASED runs first) are written in their generated order and in a random
topological order, and run under ExecutionOrder.PRIORITY_BASED and DEFAULT with
optimizations off (ORT adds or removes no node then).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from ort_profile import node_memory
from randgraph import build_random_training_graph, random_feeds

from ckpt_cli.analysis import schedules
from ckpt_cli.graph import Graph

GRAPHS = 40


def _shuffled(model: onnx.ModelProto, seed: int) -> onnx.ModelProto:
    """The same graph with its nodes in a random topological order."""
    g = Graph.from_model(model)
    rng = np.random.default_rng(seed)
    indegree = [len(p) for p in g.preds]
    ready = [i for i, d in enumerate(indegree) if d == 0]
    order = []
    while ready:
        i = ready.pop(int(rng.integers(len(ready))))
        order.append(i)
        for j in g.succs[i]:
            indegree[j] -= 1
            if indegree[j] == 0:
                ready.append(j)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(model.graph.node[i] for i in order)
    return out


def _cases():
    for seed in range(GRAPHS):
        model = build_random_training_graph(seed, 3 + seed % 18)
        yield seed, model
        yield seed, _shuffled(model, seed)


@pytest.mark.parametrize("order", ["PRIORITY_BASED", "DEFAULT"])
def test_schedule_is_the_order_ort_executes(order):
    rule = schedules.priority_based if order == "PRIORITY_BASED" else schedules.ort_default
    differs = []
    for seed, model in _cases():
        g = Graph.from_model(model)
        predicted = [g.nodes[i].name for i in rule(g)]
        executed = list(node_memory(model, random_feeds(model, seed), order=order, runs=1).names)
        if predicted != executed:
            differs.append(seed)
    assert not differs, f"{order}: ckpt's order differs from ORT's on seeds {differs}"


def test_priority_based_runs_shape_and_size_first():
    """Among ready nodes, Shape and Size go before lower file indices."""
    model = build_random_training_graph(3, 12)
    g = Graph.from_model(model)
    order = schedules.priority_based(g)
    assert sorted(order) == list(range(len(g.nodes)))
    assert order != list(range(len(g.nodes))), "this graph has Shape/Size nodes that move up"
    position = {i: k for k, i in enumerate(order)}
    for i, node in enumerate(g.nodes):
        if node.op_type in ("Shape", "Size"):
            ready_at = max((position[p] for p in g.preds[i]), default=-1)
            assert position[i] == ready_at + 1 or all(
                g.nodes[order[k]].op_type in ("Shape", "Size") for k in range(ready_at + 1, position[i]))


def _kahn_reference(graph: Graph, file_order: list[int]) -> list[int]:
    """PRIORITY_BASED the plain way: Kahn's algorithm over (Shape/Size first, file position)."""
    import heapq

    from ckpt_cli.ops import HIGH_PRIORITY_OPS

    position = {i: p for p, i in enumerate(file_order)}
    rank = [0 if n.op_type in HIGH_PRIORITY_OPS else 1 for n in graph.nodes]
    indegree = [len(p) for p in graph.preds]
    ready = [(rank[i], position[i], i) for i, d in enumerate(indegree) if d == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)[2]
        order.append(i)
        for j in graph.succs[i]:
            indegree[j] -= 1
            if indegree[j] == 0:
                heapq.heappush(ready, (rank[j], position[j], j))
    return order


def test_priority_based_shortcut_matches_kahn():
    """priority_based returns a written order as it is when Kahn's rule would: checked
    against the plain algorithm on random graphs, in their generated order, in random
    topological orders, in their own executed order (where the shortcut applies) and in a
    non-topological order."""
    shortcut = 0
    for seed in range(GRAPHS):
        g = Graph.from_model(build_random_training_graph(seed, 10))
        generated = list(range(len(g.nodes)))
        shuffled = Graph.from_model(_shuffled(build_random_training_graph(seed, 10), seed))
        for graph in (g, shuffled):
            executed = _kahn_reference(graph, generated)
            for order in (generated, executed, generated[::-1]):
                got = schedules.priority_based(graph, order)
                assert got == _kahn_reference(graph, order), (seed, order[:5])
                shortcut += got == order
    assert shortcut >= GRAPHS  # every executed order is its own, through the shortcut
