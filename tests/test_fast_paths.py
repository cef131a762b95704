"""The vectorized passes against the plain-Python paths they fall back to
(``CKPT_PURE_PYTHON=1``, ckpt_cli/fast.py): identical results on the samples and on
random training graphs: the min cut's blocking flows (``planning/maxflow.py``), and the
compiled kernels of ``native.py`` (ORT's planner walk, lifetimes, reuse taken apart, the
BFC arena's replay) and of ``native_orders.py`` (ORT's two node orders, the memory-aware one)."""

from __future__ import annotations

import os
from unittest import mock

import numpy as np
import pytest
from randgraph import build_random_training_graph

from conftest import SAMPLES
from ckpt_cli.analysis import Analysis, analyse
from ckpt_cli import fast
from ckpt_cli.analysis import arena
from ckpt_cli.analysis.arena import ArenaResult, arena_peak, kernel_plans, small_initializer_bytes
from ckpt_cli.analysis.lifetimes import Lifetimes, lifetimes
from ckpt_cli.analysis.planner import Buffers, FlatHolders, FlatTakes, plan_buffers, tensor_facts, without_reuse
from ckpt_cli.fast import vectorized
from ckpt_cli.graph import Graph
from ckpt_cli.analysis import schedules
from ckpt_cli.analysis.memory import buffer_roots
from ckpt_cli.io.load import load_graph
from ckpt_cli.planning import maxflow, mincut
from ckpt_cli.rewrite import order as orders


def _both(make):
    """``make()`` on the vectorized path and on the plain-Python one."""
    out = []
    for pure in ("0", "1"):
        with mock.patch.dict(os.environ, {"CKPT_PURE_PYTHON": pure}):
            assert vectorized() == (pure == "0")
            out.append(make())
    return out


def _front(a: Analysis) -> tuple[list[mincut.Cut], list[mincut.Cut]]:
    problem = mincut.build(a)
    fast, pure = _both(lambda: mincut.front(problem))
    return fast, pure


@pytest.mark.parametrize("sample", ["mlp", "cnn", "gpt", "resnet18"])
def test_the_front_is_the_same_both_ways_on_the_samples(sample):
    fast, pure = _front(analyse(load_graph(SAMPLES / f"{sample}.onnx")))
    assert fast == pure
    assert len(fast) > 1  # a front with corners between the ends: the flows had work to do


@pytest.mark.parametrize("seed", range(12))
def test_the_front_is_the_same_both_ways_on_random_graphs(seed):
    a = analyse(Graph.from_model(build_random_training_graph(seed, 24)))
    fast, pure = _front(a)
    assert fast == pure


def test_every_capacity_of_a_sample_cuts_the_same_both_ways():
    """Random capacities on gpt's cut network (its real shape: long chains of views and
    shared reads), the waves cut to one wave so the depth-first search finishes phases."""
    p = mincut.build(analyse(load_graph(SAMPLES / "gpt.onnx")))
    net = p.network
    arcs = len(p.nodes) + len(p.tensors) + len(p.heads) + len(p.read_backward)  # as ``solve`` gives them
    rng = np.random.default_rng(0)
    for _ in range(20):
        caps = rng.integers(0, 50, size=arcs)
        caps[net._infinite] = mincut.INFINITE
        with mock.patch.object(maxflow, "WAVES", int(rng.integers(1, 3))):
            fast, pure = _both(lambda: net.source_side(caps))
        assert fast.tolist() == pure.tolist()
    assert arcs > 100


# -- the compiled passes (ckpt_cli/native.py) ------------------------------------------------


@pytest.fixture
def compiled_everywhere(monkeypatch):
    """Every pass takes its compiled kernel, however short the order (the samples are)."""
    pytest.importorskip("numba")
    monkeypatch.setattr(fast, "NATIVE_MIN_STEPS", 0)


def _walks(a: Analysis) -> list[tuple[Lifetimes, Buffers, Buffers]]:
    """Per order ORT may run (PRIORITY_BASED, the file's) and per planner facts (as they
    are, and a third of the tensors hidden from ORT's reuse, as ``fresh`` hides them): the
    lifetimes, the planner's buffers with reuse on and off, and ``without_reuse`` of them."""
    g = a.graph
    facts = tensor_facts(g, a.tensors)
    hidden = facts.hiding(range(0, len(g.ids.names), 3))
    out = []
    for order in (list(a.priority.order), list(range(len(g.nodes)))):
        life = lifetimes(g, order)
        for f in (facts, hidden):
            on = plan_buffers(g, order, f, life, True)
            out.append((life, on, plan_buffers(g, order, f, life, False), without_reuse(on, life)))
    return out


def _assert_same_walks(a: Analysis) -> None:
    compiled, pure = _both(lambda: _walks(a))
    assert compiled == pure
    _, on, off, apart = compiled[0]
    assert isinstance(on.holders, FlatHolders) and isinstance(apart.takes, FlatTakes)  # the kernels ran
    assert off == apart  # the shortcut for reuse off is the walk with reuse off
    assert [list(h) for h in on.holders] == [list(h) for h in pure[0][1].holders]


@pytest.mark.parametrize("sample", ["mlp", "cnn", "gpt", "resnet18", "gpt12"])
def test_the_compiled_planner_walk_is_the_same_on_the_samples(sample, compiled_everywhere):
    _assert_same_walks(analyse(load_graph(SAMPLES / f"{sample}.onnx")))


@pytest.mark.parametrize("seed", range(12))
def test_the_compiled_planner_walk_is_the_same_on_random_graphs(seed, compiled_everywhere):
    _assert_same_walks(analyse(Graph.from_model(build_random_training_graph(seed, 24))))


def test_a_whole_analysis_is_the_same_compiled(compiled_everywhere):
    """Every simulation an analysis runs, through the kernels: the same profiles."""
    compiled, pure = _both(lambda: analyse(load_graph(SAMPLES / "gpt.onnx")))
    for reuse in (True, False):
        assert compiled.profile(reuse) == pure.profile(reuse)
    assert compiled.arena_in_use(True) == pure.arena_in_use(True)


def _orders(a: Analysis, seed: int) -> list[list[int]]:
    """ORT's PRIORITY_BASED order of the file and of the file shuffled (Kahn's queue then
    works), its DEFAULT order, and the memory-aware order with random movable nodes, with
    and without random lazy ones, over the analysis's sizes and the views' shared buffers."""
    g = a.graph
    rng = np.random.default_rng(seed)
    shuffled = rng.permutation(len(g.nodes)).tolist()
    sizes = {t: info.nbytes for t, info in a.tensors.items() if info.nbytes}
    reads = orders.buffer_reads(g, sizes, buffer_roots(g))
    movable, lazy = (rng.random(len(g.nodes)) < 0.6).tolist(), (rng.random(len(g.nodes)) < 0.3).tolist()
    return [schedules.priority_based(g), schedules.priority_based(g, shuffled), schedules.ort_default(g),
            orders.memory_aware(g, reads, movable), orders.memory_aware(g, reads, movable, lazy),
            orders.memory_aware(g, reads, [True] * len(g.nodes), lazy)]


def _assert_same_orders(a: Analysis, seed: int) -> None:
    compiled, pure = _both(lambda: _orders(a, seed))
    assert compiled == pure
    assert all(sorted(o) == list(range(len(a.graph.nodes))) for o in compiled)  # each runs every node once
    assert compiled[1] != list(range(len(a.graph.nodes)))  # the shuffled file went through the queue


@pytest.mark.parametrize("sample", ["mlp", "cnn", "gpt", "resnet18", "gpt12"])
def test_the_compiled_orders_are_the_same_on_the_samples(sample, compiled_everywhere):
    _assert_same_orders(analyse(load_graph(SAMPLES / f"{sample}.onnx")), 0)


@pytest.mark.parametrize("seed", range(12))
def test_the_compiled_orders_are_the_same_on_random_graphs(seed, compiled_everywhere):
    _assert_same_orders(analyse(Graph.from_model(build_random_training_graph(seed, 24))), seed)


def test_the_edges_are_the_graphs_predecessors_and_successors():
    g = load_graph(SAMPLES / "gpt12.onnx")
    e = g.edges
    assert [e.pred_idx[e.pred_ptr[i]:e.pred_ptr[i + 1]].tolist() for i in range(len(g.nodes))] == g.preds
    assert ([sorted(e.succ_idx[e.succ_ptr[i]:e.succ_ptr[i + 1]].tolist()) for i in range(len(g.nodes))]
            == [sorted(s) for s in g.succs])


def test_the_arenas_event_codes_are_the_kernels():
    """arena.py names kernel-plan events by the codes native.py's replay reads; it keeps its
    own copy (importing native.py imports numba), so the two must agree."""
    native = pytest.importorskip("ckpt_cli.native")
    assert arena._EVENT_CODES == {"out": native.PLAN_OUT, "tmp": native.PLAN_TMP,
                                  "free_tmp": native.PLAN_FREE_TMP, "drop_tmp": native.PLAN_DROP_TMP}


def test_short_orders_stay_in_python(monkeypatch):
    """Below ``NATIVE_MIN_STEPS`` (numba's import costs more than the walk) and without
    numba, the plain walk runs."""
    a = analyse(load_graph(SAMPLES / "gpt.onnx"))
    order = list(a.priority.order)
    life = lifetimes(a.graph, order)
    assert isinstance(plan_buffers(a.graph, order, a.tensors, life).holders, list)
    monkeypatch.setattr(fast, "NATIVE_MIN_STEPS", 0)
    monkeypatch.setattr(fast, "has_numba", lambda: False)
    assert not fast.native(10**6)
    assert isinstance(plan_buffers(a.graph, order, a.tensors, life).holders, list)


def test_flat_holders_read_as_the_lists_they_stand_for():
    lists = [[(0, 7), (2, 9)], [], [(1, 8)]]
    flat = FlatHolders(np.array([0, 2, 2, 3]), np.array([0, 2, 1]), np.array([7, 9, 8]))
    assert len(flat) == 3 and list(flat) == lists and flat == lists and lists == flat
    assert [flat[b] for b in range(3)] == lists and flat[-1] == [(1, 8)] and flat[1:] == lists[1:]
    assert flat != [[(0, 7), (2, 9)], [], [(1, 9)]]
    with pytest.raises(IndexError):
        flat[3]
    takes = FlatTakes(np.array([0, 1, 0]), np.array([0, 0, 2]))
    assert takes == [(0, 0), (1, 0), (0, 2)] and takes[-1] == (0, 2) and takes[:1] == [(0, 0)] and len(takes) == 3


def _arena_figures(a: Analysis) -> list[ArenaResult]:
    """``arena_peak`` of both profiles, with the kernels' temporaries, whole and stopped
    short above half and 90% of the peak."""
    out = []
    for reuse in (True, False):
        profile = a.profile(reuse)
        plans = kernel_plans(a.graph, profile.order, a.tensors)
        base = small_initializer_bytes(a.graph, a.tensors)
        whole = arena_peak(profile, base, plans=plans)
        out += [whole, *(arena_peak(profile, base, plans=plans, give_up_above=int(whole.peak_in_use_bytes * share))
                         for share in (0.5, 0.9))]
    return out


@pytest.mark.parametrize("sample", ["mlp", "cnn", "gpt", "resnet18", "gpt12"])
def test_the_compiled_arena_replays_the_same_on_the_samples(sample, compiled_everywhere):
    a = analyse(load_graph(SAMPLES / f"{sample}.onnx"))
    compiled, pure = _both(lambda: _arena_figures(a))
    assert compiled == pure
    assert len(compiled[1].timeline_in_use) < len(compiled[0].timeline_in_use)  # stopped short


@pytest.mark.parametrize("seed", range(12))
def test_the_compiled_arena_replays_the_same_on_random_graphs(seed, compiled_everywhere):
    a = analyse(Graph.from_model(build_random_training_graph(seed, 24)))
    compiled, pure = _both(lambda: _arena_figures(a))
    assert compiled == pure


def test_the_compiled_arena_allocates_as_ort_s_bfc_arena():
    """Random requests freed in random order, sizes across bins and past a region's
    doubling, then every other one of 3,000 small chunks freed (a free set of blocks): every
    address and figure as ``BFCArena``'s. A free set left too few blocks says so (its caller
    runs the replay again with more)."""
    native = pytest.importorskip("ckpt_cli.native")
    rng = np.random.default_rng(7)
    sizes = rng.choice([0, 1, 255, 256, 3000, 65536, 1 << 20, 3 << 20, 300 << 20], size=3000).tolist()
    config = (arena.MIN_ALLOCATION_BYTES, arena.DEFAULT_MAX_DEAD_BYTES_PER_CHUNK,
              arena.DEFAULT_MAX_POWER_OF_TWO_EXTEND_BYTES)
    initial = arena.rounded_bytes(arena.DEFAULT_INITIAL_CHUNK_SIZE_BYTES)
    made = native.new_arena(40000, 400, initial, arena._ADDRESS_TOP, config)
    python = arena.BFCArena()
    live: list[tuple[int | None, int]] = []

    def both(n: int) -> None:
        live.append((python.alloc(n), native.alloc(*made, n)))

    def free_both(k: int) -> None:
        ptr, c = live.pop(k)
        python.free(ptr)
        native.free(*made[:4], c)

    for n in sizes:
        both(n)
        if rng.random() < 0.45:
            free_both(int(rng.integers(len(live))))
        assert made.stats[:3].tolist() == [python.in_use, python.requested_in_use, python.held]
    for _ in range(3000):
        both(512)
    for k in range(len(live) - 1, len(live) - 3000, -2):
        free_both(k)
    for n in sizes[:500]:
        both(n)
    assert made.stats[:3].tolist() == [python.in_use, python.requested_in_use, python.held]
    assert [None if c < 0 else int(made.chunks[c, 0]) for _, c in live] == [ptr for ptr, _ in live]
    assert native.region_sizes(made).tolist() == [size for _, size in python.regions]
    assert made.stats[8] > 20 and not native.overflowed(made)  # the free set split blocks
    few = native.new_arena(40000, 2, initial, arena._ADDRESS_TOP, config)
    chunks = [native.alloc(*few, 512) for _ in range(3000)]
    for c in chunks[::2]:
        native.free(*few[:4], c)
    assert native.overflowed(few)
