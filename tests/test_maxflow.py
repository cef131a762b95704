"""The max-flow solver of the min-cut planner (``planning/maxflow.py``): its cut against
every cut of small networks, enumerated, and against a textbook network."""

from __future__ import annotations

import itertools
import os
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckpt_cli.planning import maxflow
from ckpt_cli.planning.maxflow import Network

INF = (1 << 31) - 1


def _cut_capacity(tails, heads, caps, side) -> int:
    return int(sum(c for t, h, c in zip(tails, heads, caps) if side[t] and not side[h]))


def _brute_force(tails, heads, caps, size) -> tuple[int, np.ndarray]:
    """The least cut capacity over every vertex set holding the source (0) and not the
    sink (1), and the smallest such set: the intersection of the least ones."""
    best, smallest = None, None
    for bits in itertools.product((False, True), repeat=size - 2):
        side = np.array([True, False, *bits])
        value = _cut_capacity(tails, heads, caps, side)
        if best is None or value < best:
            best, smallest = value, side.copy()
        elif value == best:
            smallest &= side
    assert best is not None and smallest is not None
    return best, smallest


def _solve(tails, heads, caps, size) -> np.ndarray:
    infinite = np.asarray(caps) >= INF
    return Network(np.asarray(tails), np.asarray(heads), infinite, size).source_side(np.asarray(caps))


@st.composite
def networks(draw):
    """Up to 9 vertices and 3 arcs a vertex, parallel and opposite arcs allowed, a few
    infinite arcs (none out of the source), small integer capacities: ties between cuts
    are common, and so are paths the flow must later cancel."""
    size = draw(st.integers(2, 9))
    capacity = st.one_of(st.integers(0, 6), st.integers(0, 6), st.just(INF))
    arcs = draw(st.lists(st.tuples(st.integers(0, size - 1), st.integers(1, size - 1), capacity),
                         min_size=size, max_size=3 * size))
    arcs = [(t, h, c) for t, h, c in arcs if t != h and not (t == 0 and c == INF)]
    tails, heads, caps = (list(x) for x in zip(*arcs)) if arcs else ([], [], [])
    return tails, heads, caps, size


@pytest.mark.parametrize(("pure", "waves"), [("0", maxflow.WAVES), ("0", 1), ("1", 0)],
                         ids=["waves", "one-wave-then-depth-first", "depth-first"])
@settings(max_examples=400, deadline=None)
@given(networks())
def test_the_cut_is_the_least_and_its_source_side_the_smallest(pure, waves, net):
    """Every way to a blocking flow: numpy waves, a wave then the depth-first search for
    what it left, and the depth-first search alone (``CKPT_PURE_PYTHON=1``)."""
    tails, heads, caps, size = net
    best, smallest = _brute_force(tails, heads, caps, size)
    with mock.patch.dict(os.environ, {"CKPT_PURE_PYTHON": pure}), mock.patch.object(maxflow, "WAVES", waves):
        side = _solve(tails, heads, caps, size)
    assert _cut_capacity(tails, heads, caps, side) == best
    assert side.tolist() == smallest.tolist()


def test_a_source_to_sink_path_of_two_arcs_passes_the_smaller_capacity():
    side = _solve([0, 2, 0, 3], [2, 1, 3, 1], [5, 3, 2, 4], 4)
    assert side.tolist() == [True, False, True, False]  # 2 keeps 2 units it cannot pass on


@pytest.mark.parametrize("pure", ["0", "1"], ids=["waves", "depth-first"])
def test_a_vertex_reached_only_against_the_flow_is_on_the_source_side(pure):
    """s -> c -> a -> t carries the one unit a -> t passes; s -> d -> a is left with room,
    and from a the source reaches c only back along the flow c -> a (the waves send the
    unit through d instead: they fill c -> a first, then take back from it first)."""
    arcs = [(0, 4, 5), (4, 3, 5), (0, 2, 1), (2, 3, 1), (3, 1, 1)]
    tails, heads, caps = (list(x) for x in zip(*arcs))
    with mock.patch.dict(os.environ, {"CKPT_PURE_PYTHON": pure}):
        side = _solve(tails, heads, caps, 5)
    assert side.tolist() == _brute_force(tails, heads, caps, 5)[1].tolist() == [True, False, True, True, True]


def test_a_wave_takes_back_what_a_shared_arc_cannot_pass():
    """s -> a -> w and s -> b -> w, 3 units each way, meet at w -> t, which passes 3: the
    wave sends 6 to w and must take 3 back, to a and on to s, or s -> a stays full and
    the cut comes out as {s} (6) instead of {s, a, b, w} (3)."""
    tails, heads, caps = [0, 0, 2, 3, 4], [2, 3, 4, 4, 1], [3, 3, 3, 3, 3]
    side = _solve(tails, heads, caps, 5)
    assert side.tolist() == _brute_force(tails, heads, caps, 5)[1].tolist() == [True, False, True, True, True]


def test_a_textbook_network_flows_23():
    """Cormen et al.'s example (fig. 26.1, s=0, t=1, v1..v4=2..5): maximum flow 23, the
    minimum cut {s, v1, v2, v4}."""
    arcs = [(0, 2, 16), (0, 3, 13), (3, 2, 4), (2, 4, 12), (4, 3, 9), (3, 5, 14), (5, 4, 7), (4, 1, 20), (5, 1, 4)]
    tails, heads, caps = (list(x) for x in zip(*arcs))
    side = _solve(tails, heads, caps, 6)
    assert _cut_capacity(tails, heads, caps, side) == 23
    assert np.flatnonzero(side).tolist() == [0, 2, 3, 5]


def test_one_network_solves_at_many_capacities():
    """``Network`` is built once per cut problem and solved at every price: a solve must not
    change what the next one sees."""
    tails, heads = [0, 0, 2, 3, 2, 3], [2, 3, 1, 1, 3, 2]
    infinite = np.zeros(6, dtype=bool)
    net = Network(np.array(tails), np.array(heads), infinite, 4)
    rng = np.random.default_rng(3)
    for _ in range(30):
        caps = rng.integers(0, 9, size=6)
        assert net.source_side(caps).tolist() == _brute_force(tails, heads, caps.tolist(), 4)[1].tolist()


def test_vertices_tied_to_the_sink_by_infinite_arcs_are_never_on_the_source_side():
    """2 -> 3 -> sink infinite: both merge into the sink; 4 hangs off 3 and is reached
    from the source only through it (so never); 5 is reached but leads nowhere."""
    arcs = [(0, 2, 5), (2, 3, INF), (3, 1, INF), (3, 4, 2), (4, 1, 1), (0, 5, 3)]
    tails, heads, caps = (list(x) for x in zip(*arcs))
    side = _solve(tails, heads, caps, 6)
    assert side.tolist() == _brute_force(tails, heads, caps, 6)[1].tolist() == [True, False, False, False, False, True]


def test_an_infinite_arc_within_reach_of_a_finite_cut_is_refused():
    """Merging what infinite arcs tie to the sink is exact only when no minimum cut can hold
    such an arc: one no larger than the source's own cut is ckpt's bug."""
    net = Network(np.array([0, 2]), np.array([2, 1]), np.array([False, True]), 3)
    with pytest.raises(ValueError, match="infinite arc"):
        net.source_side(np.array([10, 10]))
