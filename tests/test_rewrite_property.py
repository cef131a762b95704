"""Property tests of the recompute rewrite on random training graphs (tests/randgraph.py).

Random forward-node subsets are split into 1-3 regions (sometimes with ``keep`` tensors,
sometimes the sqrt(n) plan instead), rewritten, written, and then checked:

* the written model passes ``onnx.checker`` with ``full_check=True``;
* its node order is topological (and every tensor has one producer);
* every recompute copy carries its metadata and the CSE guard, copies a forward node of a
  region (never a copy), comes after its source and before its first reader, and no
  source node is copied twice;
* backward nodes no longer read the recomputed originals, and never read a copy of a kept
  tensor;
* ONNX Runtime (CPU, one thread, ORT_DISABLE_ALL, PRIORITY_BASED: ckpt's settings) gives
  bit-identical outputs for the original and the rewritten float64 graph.

A second property rewrites an already rewritten graph with another region choice.
Hypothesis runs derandomized, so CI sees the same examples every time.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np
import onnx
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ckpt_session import run_outputs as _run
from randgraph import random_feeds, training_graphs

from ckpt_cli.analysis import analyse, lowest_peak, schedules
from ckpt_cli.graph import Graph
from ckpt_cli.io.load import load_graph
from ckpt_cli.planning import sqrt_regions
from ckpt_cli.planning.plan import Plan, Region
from ckpt_cli.markers import CSE_GUARD_ATTR, FRESH_META, REGION_META, SUFFIX, is_recompute_copy, recompute_source
from ckpt_cli.rewrite import rewrite
from ckpt_cli.io.save import build_model, save_model

PROPERTY_SETTINGS = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                             suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
GRAPHS = 500  # random graphs the main property rewrites (about 70 ms each)


# --------------------------------------------------------------------------- helpers


def _meta(node: onnx.NodeProto, key: str) -> str | None:
    return next((p.value for p in node.metadata_props if p.key == key), None)


def _assert_bit_identical(expected: dict, got: dict) -> None:
    assert set(expected) == set(got)
    for name, x in expected.items():
        y = got[name]
        assert x.dtype == y.dtype and x.shape == y.shape, name
        if x.tobytes() != y.tobytes():
            diff = float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64))))
            raise AssertionError(f"output {name!r} differs (max abs diff {diff:g})")


def _write_and_reload(res, directory: str, name: str) -> tuple[onnx.ModelProto, str]:
    path = os.path.join(directory, name)
    save_model(build_model(res.graph, [n.proto for n in res.graph.nodes]), path)
    return onnx.load(path), path


def _draw_plan(data, a, label: str, extra_nodes: list[int] = ()) -> Plan:
    """1-3 regions over a random subset of the forward nodes (or the sqrt plan), and
    sometimes a few ``keep`` tensors made inside the regions."""
    fwd = [i for i in range(len(a.graph.nodes)) if a.phases.is_forward[i]]
    if data.draw(st.integers(0, 4), label=f"{label}: sqrt plan?") == 0:
        return sqrt_regions(a)
    # each node in a region with p = 3/4, producers of stashed tensors with p = 15/16 (a plan
    # that leaves them all out copies nothing)
    stashed = {s.producer for s in a.stashed}
    mask = data.draw(st.lists(st.integers(0, 15), min_size=len(fwd), max_size=len(fwd)), label=f"{label}: mask")
    chosen = [i for i, m in zip(fwd, mask) if m >= (1 if i in stashed else 4)] or fwd
    k = data.draw(st.integers(1, min(3, len(chosen))), label=f"{label}: regions")
    owner = data.draw(st.lists(st.integers(0, k - 1), min_size=len(chosen), max_size=len(chosen)),
                      label=f"{label}: owner")
    regions = [Region(f"{label}.r{r}", {i for i, o in zip(chosen, owner) if o == r}) for r in range(k)]
    regions = [r for r in regions if r.nodes]
    for i in extra_nodes:  # backward nodes handed in by mistake: must be ignored
        regions[0].nodes.add(i)
    made = sorted({t for r in regions for i in r.nodes for t in a.graph.nodes[i].outputs if t})
    if made and data.draw(st.booleans(), label=f"{label}: keep?"):
        for t in data.draw(st.lists(st.sampled_from(made), max_size=3, unique=True), label=f"{label}: keep"):
            regions[data.draw(st.integers(0, len(regions) - 1))].keep.add(t)
    return Plan(regions, "random")


def _check_written(model: onnx.ModelProto, a, plan: Plan, res, previous_copies: set[str]) -> list[onnx.NodeProto]:
    """Structural checks of a written rewrite of the graph analysed in ``a``; returns the
    copies this rewrite made (those not already in the input graph)."""
    onnx.checker.check_model(model, full_check=True)
    g = model.graph
    nodes = list(g.node)
    names = [n.name for n in nodes]
    assert len(set(names)) == len(names), "node names must stay unique"

    # topological file order, one producer per tensor
    available = {v.name for v in g.input} | {t.name for t in g.initializer}
    position: dict[str, int] = {}
    producer: dict[str, int] = {}
    consumers: dict[str, list[int]] = {}
    for k, n in enumerate(nodes):
        for t in n.input:
            if t:
                assert t in available, f"node {n.name} reads {t!r} before it is made"
                consumers.setdefault(t, []).append(k)
        for t in n.output:
            if t:
                assert t not in producer and t not in available, f"tensor {t!r} made twice"
                producer[t] = k
                available.add(t)
        position[n.name] = k

    src = a.graph
    fwd_names = {n.name for n in src.nodes if a.phases.is_forward[n.index]}
    region_names = {src.nodes[i].name for r in plan.regions for i in r.nodes if a.phases.is_forward[i]}
    source_nodes = {n.name: n.proto for n in src.nodes}
    kept = set().union(*(r.keep for r in plan.regions))

    new_copies = [n for n in nodes if is_recompute_copy(n) and n.name not in previous_copies]
    assert len(new_copies) == res.recompute_nodes
    sources = [recompute_source(n) for n in new_copies]
    assert len(sources) == len(set(sources)), "a source node was copied twice"
    for n in nodes:  # every copy, old or new, is marked the same way
        if is_recompute_copy(n):
            assert SUFFIX in n.name
            assert _meta(n, REGION_META)
            # CSE cannot merge a copy into its source: it carries the guard attribute, or (pinned)
            # reads a tensor its source does not.
            source = source_nodes.get(recompute_source(n))
            assert (any(at.name == CSE_GUARD_ATTR for at in n.attribute)
                    or source is None or list(n.input) != list(source.input)), f"{n.name} lacks the CSE guard"
    for copy, source in zip(new_copies, sources):
        assert source in fwd_names, f"{copy.name} copies {source}, not a forward node"
        assert source in region_names, f"{copy.name} copies {source}, which is in no region"
        assert source not in previous_copies, f"{copy.name} copies a copy ({source})"
        orig = source_nodes[source]
        assert (copy.op_type, copy.domain) == (orig.op_type, orig.domain)
        assert [at for at in copy.attribute if at.name != CSE_GUARD_ATTR] == list(orig.attribute)
        if source in position:
            assert position[source] < position[copy.name], f"{copy.name} runs before its source"
        readers = sorted({c for t in copy.output if t for c in consumers.get(t, ())})
        assert readers, f"{copy.name} is dead"
        assert position[copy.name] < readers[0]
        for c in readers:
            assert nodes[c].name not in fwd_names, f"forward node {nodes[c].name} reads copy {copy.name}"
        for t_copy, t_orig in zip(copy.output, orig.output):
            if t_copy and t_orig in kept:
                assert not consumers.get(t_copy), f"kept tensor {t_orig} is read from a copy"

    # the backward reads no recomputed original's data any more (only forward nodes do;
    # Shape and Size read only its shape, and PRIORITY_BASED runs them as soon as it exists)
    def readers(t: str) -> list[int]:
        """Who reads ``t``, through fresh.py's identity views (they feed one node each)."""
        return [r for c in consumers.get(t, ())
                for r in (readers(nodes[c].output[0]) if _meta(nodes[c], FRESH_META) else [c])]

    for r in res.regions:
        for t in r.recomputed:
            assert t not in kept
            late = [nodes[c].name for c in readers(t)
                    if nodes[c].name not in fwd_names and nodes[c].op_type not in ("Shape", "Size")]
            assert not late, f"{t} is still read by backward nodes {late}"
    return new_copies


# --------------------------------------------------------------------------- properties


@settings(PROPERTY_SETTINGS, max_examples=GRAPHS)
@given(model=training_graphs(min_ops=3, max_ops=20), data=st.data())
def test_rewrite_random_regions(model, data):
    a = analyse(Graph.from_model(model))
    plan = _draw_plan(data, a, "plan")
    res = rewrite(a, plan)
    event(f"recompute copies: {'none' if not res.recompute_nodes else '1-3' if res.recompute_nodes < 4 else '4+'}")
    # ckpt simulated the file order: ORT's PRIORITY_BASED order must be that order (the test of
    # schedules.priority_based against ORT is tests/test_schedules.py)
    assert schedules.priority_based(res.graph) == list(range(len(res.graph.nodes)))
    with tempfile.TemporaryDirectory(prefix="ckpt_prop_") as tmp:
        written, _ = _write_and_reload(res, tmp, "rewritten.onnx")
    _check_written(written, a, plan, res, previous_copies=set())
    feeds = random_feeds(model, seed=1)
    _assert_bit_identical(_run(model, feeds), _run(written, feeds))


@PROPERTY_SETTINGS
@given(model=training_graphs(min_ops=3, max_ops=20), data=st.data())
def test_rewrite_of_rewritten_graph(model, data):
    a1 = analyse(Graph.from_model(model))
    plan1 = _draw_plan(data, a1, "first")
    res1 = rewrite(a1, plan1)
    with tempfile.TemporaryDirectory(prefix="ckpt_prop_") as tmp:
        first, first_path = _write_and_reload(res1, tmp, "first.onnx")
        first_copies = {n.name for n in first.graph.node if is_recompute_copy(n)}
        a2 = analyse(load_graph(first_path))
        # copies are backward nodes, so no plan built over forward nodes can hold one
        copy_idx = [n.index for n in a2.graph.nodes if n.name in first_copies]
        assert not any(a2.phases.is_forward[i] for i in copy_idx)
        # ...and a region that lists them anyway must not copy them
        extra = copy_idx if data.draw(st.booleans(), label="add copies to a region") else []
        plan2 = _draw_plan(data, a2, "second", extra_nodes=extra)
        res2 = rewrite(a2, plan2)
        event(f"copies: first {'yes' if res1.recompute_nodes else 'no'}, "
              f"second {'yes' if res2.recompute_nodes else 'no'}")
        second, _ = _write_and_reload(res2, tmp, "second.onnx")
    new = _check_written(second, a2, plan2, res2, previous_copies=first_copies)
    # Sources are nodes of the original graph, never copies. (They are not always forward
    # nodes of the original: see test_phases_survive_a_rewrite.)
    original_names = {n.name for n in model.graph.node}
    for n in new:
        assert recompute_source(n) in original_names
    feeds = random_feeds(model, seed=2)
    expected = _run(model, feeds)
    _assert_bit_identical(expected, _run(first, feeds))
    _assert_bit_identical(expected, _run(second, feeds))


def test_rewrite_makes_copies_at_all():
    """Guard against a vacuous property: a plan over every forward node copies something."""
    from randgraph import build_random_training_graph

    made = 0
    for seed in range(10):
        model = build_random_training_graph(seed, 10)
        a = analyse(Graph.from_model(model))
        fwd = {i for i in range(len(a.graph.nodes)) if a.phases.is_forward[i]}
        res = rewrite(a, Plan([Region("all", fwd)], "test"))
        made += res.recompute_nodes
        feeds = random_feeds(model, seed)
        written = build_model(res.graph, [n.proto for n in res.graph.nodes])
        _assert_bit_identical(_run(model, feeds), _run(written, feeds))
    assert made > 10


def test_phases_survive_a_rewrite():
    """A node's phase must not change because ckpt wrote the graph (even with no recompute)."""
    from conftest import SAMPLES

    a = analyse(load_graph(SAMPLES / "gpt.onnx"))
    res = rewrite(a, None)
    written = build_model(res.graph, [n.proto for n in res.graph.nodes])
    a2 = analyse(Graph.from_model(written))
    before = {n.name: a.phases.is_forward[n.index] for n in a.graph.nodes}
    flipped = [n.name for n in a2.graph.nodes if before[n.name] != a2.phases.is_forward[n.index]]
    assert not flipped, f"{len(flipped)} nodes changed phase, e.g. {flipped[:5]}"


@settings(max_examples=25, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(model=training_graphs(min_ops=3, max_ops=20), share=st.floats(0.7, 0.99))
def test_budget_search_meets_its_budget_or_says_it_cannot(model, share):
    """On random graphs: a plan the budget search returns fits the budget under the real
    cost model, and an unreachable budget is below the lowest floor it reports."""
    from ckpt_cli.errors import BudgetUnreachable
    from ckpt_cli.rewrite.select import keep_intervals, plan_cost
    from ckpt_cli.planning.strategies import budget_plan

    a = analyse(Graph.from_model(model))
    budget = int(a.priority.peak_bytes * share)
    try:
        result = budget_plan(a, budget, lambda p: plan_cost(a, p), lambda p: keep_intervals(a, p))
    except BudgetUnreachable as e:
        event("unreachable")
        assert "no plan goes below" in str(e)
        return
    event("planned" if result.plan.regions else "original fits")
    assert result.peak_bytes <= budget and result.peak_bytes >= lowest_peak(a).bytes
    if result.plan.regions:  # (an empty plan reports the original's peak, not its reordering's)
        assert plan_cost(a, result.plan).peak_bytes == result.peak_bytes
