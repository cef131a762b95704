"""The vectorized passes against the plain-Python paths they fall back to
(``CKPT_PURE_PYTHON=1``, ckpt_cli/fast.py): identical results on the samples and on
random training graphs. Today: the min cut's blocking flows (``planning/maxflow.py``)."""

from __future__ import annotations

import os
from unittest import mock

import numpy as np
import pytest
from randgraph import build_random_training_graph

from conftest import SAMPLES
from ckpt_cli.analysis import Analysis, analyse
from ckpt_cli.fast import vectorized
from ckpt_cli.graph import Graph
from ckpt_cli.io.load import load_graph
from ckpt_cli.planning import maxflow, mincut


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
