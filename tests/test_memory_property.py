"""The memory model against ONNX Runtime's profiler at every node, on random training graphs.

For each random graph (tests/fixtures/randgraph.py), original and rewritten (a random recompute
plan), with ``enable_mem_reuse`` on and off, ORT runs the graph under ckpt's settings and
its profiler gives, after every node, the bytes requested (``mem_bytes_requested_in_use``)
and the arena's bytes in use (``mem_bytes_in_use``). ckpt predicts both: the planner's
buffers (``memory.simulate``) replayed through the arena model (``arena.predict_in_use``).
Both sequences must be equal at every node, and ORT must execute ckpt's PRIORITY_BASED
schedule.

``python tests/test_memory_property.py [--graphs N] [--seed S]`` prints the agreement rate
instead of failing on the first difference.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ort_profile import NodeMemory, node_memory_in_child  # noqa: E402
from randgraph import build_random_training_graph, random_feeds  # noqa: E402

from ckpt_cli.analysis import analyse, schedules  # noqa: E402
from ckpt_cli.analysis.arena import predict_in_use  # noqa: E402
from ckpt_cli.analysis.memory import simulate  # noqa: E402
from ckpt_cli.graph import Graph  # noqa: E402
from ckpt_cli.planning.plan import Plan, Region  # noqa: E402
from ckpt_cli.rewrite import rewrite  # noqa: E402
from ckpt_cli.io.save import build_model  # noqa: E402

GRAPHS = 200  # x (original, rewritten) x (reuse on, off) = 800 cases


@dataclass(frozen=True)
class Case:
    seed: int
    kind: str  # "original" or "rewritten"
    reuse: bool
    order_ok: bool
    requested_ok: bool  # bytes requested equal at every node
    in_use_ok: bool  # arena bytes in use equal at every node
    worst_requested: float  # largest relative error at any node
    worst_in_use: float
    peak_requested: float  # relative error of the peak
    peak_in_use: float
    unsized: bool  # ckpt knows some tensor's size only at run time (and says so)

    @property
    def exact(self) -> bool:
        return self.order_ok and self.requested_ok and self.in_use_ok


def _graphs(seed: int):
    """(kind, model, graph, tensors) for the original and a random rewrite of one graph."""
    rng = np.random.default_rng(seed)
    model = build_random_training_graph(seed, int(rng.integers(3, 21)), scale=int(rng.choice([1, 16])))
    a = analyse(Graph.from_model(model))
    yield "original", model, a.graph, a.tensors
    forward = [i for i in range(len(a.graph.nodes)) if a.phases.is_forward[i]]
    chosen = {i for i in forward if rng.random() < 0.75} or set(forward)
    # Unpinned: the memory model's rules on the rewritten structure. Pinned files are checked
    # as ckpt check sees them (the written file analysed afresh) in test_rewrite_samples.
    res = rewrite(a, Plan([Region("r", chosen)], "random"), pin=False)
    yield "rewritten", build_model(res.graph, [n.proto for n in res.graph.nodes]), res.graph, res.after.tensors


def _relative(pred, meas) -> float:
    return max((abs(p - m) / m for p, m in zip(pred, meas) if m), default=0.0)


def _case(seed, kind, reuse, graph, order, profile, predicted, measured: NodeMemory) -> Case:
    req, use = predicted.timeline_requested, predicted.timeline_in_use
    return Case(seed, kind, reuse,
                order_ok=[graph.nodes[i].name for i in order] == list(measured.names),
                requested_ok=tuple(req) == measured.requested, in_use_ok=tuple(use) == measured.in_use,
                worst_requested=_relative(req, measured.requested), worst_in_use=_relative(use, measured.in_use),
                peak_requested=max(req) / max(measured.requested) - 1,
                peak_in_use=max(use) / max(measured.in_use) - 1, unsized=bool(profile.unsized))


def compare(seeds: range) -> list[Case]:
    """Predict every case here, measure them all in one fresh process, compare."""
    jobs, predictions = [], []
    for seed in seeds:
        for kind, model, graph, tensors in _graphs(seed):
            feeds = random_feeds(model, seed)
            order = schedules.priority_based(graph)
            for reuse in (True, False):
                profile = simulate(graph, order, tensors, reuse_buffers=reuse)
                predictions.append((seed, kind, reuse, graph, order, profile, predict_in_use(graph, profile, tensors)))
                jobs.append((model, feeds, reuse))
    return [_case(*p, m) for p, m in zip(predictions, node_memory_in_child(jobs))]


def test_memory_model_matches_ort_at_every_node():
    cases = compare(range(GRAPHS))
    assert all(c.order_ok for c in cases), "ORT did not execute ckpt's PRIORITY_BASED schedule"
    assert not any(c.unsized for c in cases), "ckpt left tensors unsized"
    wrong = [c for c in cases if not c.exact]
    assert not wrong, f"{len(wrong)} of {len(cases)} cases differ from ORT's profiler, e.g. {wrong[:3]}"


@pytest.mark.parametrize("sample", ["mlp", "gpt", "cnn"])
def test_samples_requested_bytes_at_every_node(sample):
    """Real exported graphs, original and sqrt-segment rewrite, reuse on and off: the tensor
    bytes equal ORT's at every node; the arena peak within 0.1% (kernel temporaries the
    arena model does not know move a few chunks)."""
    from conftest import SAMPLES

    from ckpt_cli.io.load import load_graph
    from ckpt_cli.planning import sqrt_regions
    from ckpt_cli.verify.feeds import make_feeds

    path = SAMPLES / f"{sample}.onnx"
    model = onnx.load(str(path))
    a = analyse(load_graph(str(path)))
    res = rewrite(a, sqrt_regions(a), pin=False)  # pinned files: test_rewrite_samples
    feeds = make_feeds(model)
    jobs, predictions = [], []
    for graph, tensors in ((a.graph, a.tensors), (res.graph, res.after.tensors)):
        written = build_model(graph, [n.proto for n in graph.nodes])
        order = schedules.priority_based(graph)
        for reuse in (True, False):
            predicted = predict_in_use(graph, simulate(graph, order, tensors, reuse_buffers=reuse), tensors)
            predictions.append(([graph.nodes[i].name for i in order], predicted))
            jobs.append((written, feeds, reuse))
    for (names, predicted), measured in zip(predictions, node_memory_in_child(jobs)):
        assert names == list(measured.names)
        assert tuple(predicted.timeline_requested) == measured.requested
        assert abs(predicted.peak_in_use_bytes - max(measured.in_use)) <= 0.001 * max(measured.in_use)


def _int64(values, name):
    return onnx.numpy_helper.from_array(np.array(values, np.int64), name)


# Reshape targets computed from a shape, and whether ORT knows the result before the run.
SHAPE_PATTERNS = {
    "Shape": (True, [("Shape", ["x"], "s", {}), ("Reshape", ["a", "s"], "t", {})], []),
    "Expand to Shape": (True, [("Shape", ["x"], "s", {}), ("Expand", ["a", "s"], "t", {})], []),
    "Slice, Concat": (False, [("Shape", ["x"], "s", {}), ("Slice", ["s", "i0", "i1"], "s0", {}),
                              ("Slice", ["s", "i1", "i2"], "s1", {}), ("Concat", ["s0", "s1"], "c", {"axis": 0}),
                              ("Reshape", ["a", "c"], "t", {})], []),
    "Div, Mul": (False, [("Shape", ["x"], "s", {}), ("Div", ["s", "k"], "s0", {}), ("Mul", ["s0", "k"], "c", {}),
                         ("Reshape", ["a", "c"], "t", {})], [_int64([1, 1], "k")]),
    "guard": (False, [("Shape", ["x"], "s", {}), ("Size", ["x"], "z", {}), ("Unsqueeze", ["z", "i0"], "z1", {}),
                      ("Slice", ["z1", "i0", "i0"], "e", {}), ("Concat", ["s", "e"], "c", {"axis": 0}),
                      ("Reshape", ["a", "c"], "t", {})], []),
}


@pytest.mark.parametrize("pattern", list(SHAPE_PATTERNS))
def test_shapes_ort_knows_before_the_run(pattern):
    """t = Reshape(a, <shape computed from x's shape>); u, v, w = Neg chain; w can take u's
    freed buffer only if ORT knows their shape."""
    from onnx import TensorProto, helper

    from ckpt_cli.analysis.shapes import infer_tensors

    static, steps, inits = SHAPE_PATTERNS[pattern]
    nodes = [helper.make_node("Neg", ["x"], ["a"], name="a")]
    nodes += [helper.make_node(op, ins, [out], name=out, **attrs) for op, ins, out, attrs in steps]
    nodes += [helper.make_node("Neg", [i], [o], name=o) for i, o in (("t", "u"), ("u", "v"), ("v", "w"), ("x", "y"))]
    nodes.append(helper.make_node("Add", ["w", "y"], ["out"], name="out"))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [128, 64])],
                          [helper.make_tensor_value_info("out", TensorProto.DOUBLE, [128, 64])],
                          [*inits, _int64([0], "i0"), _int64([1], "i1"), _int64([2], "i2")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    graph = Graph.from_model(model)
    tensors = infer_tensors(graph)
    assert tensors["u"].nbytes == 128 * 64 * 8 and tensors["u"].static_shape == static
    order = schedules.priority_based(graph)
    predicted = predict_in_use(graph, simulate(graph, order, tensors), tensors)
    (measured,) = node_memory_in_child([(model, {"x": np.ones((128, 64))}, True)])
    assert tuple(predicted.timeline_requested) == measured.requested


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--graphs", type=int, default=GRAPHS)
    p.add_argument("--seed", type=int, default=0, help="first seed")
    args = p.parse_args()
    cases = compare(range(args.seed, args.seed + args.graphs))
    exact = sum(c.exact for c in cases)
    print(f"{exact} of {len(cases)} cases match ORT's profiler at every node ({100 * exact / len(cases):.1f}%)")
    for kind in ("original", "rewritten"):
        for reuse in (True, False):
            sub = [c for c in cases if c.kind == kind and c.reuse == reuse]
            print(f"  {kind:9} reuse {'on ' if reuse else 'off'}: {sum(c.exact for c in sub)}/{len(sub)} exact")
    print(f"order differs: {sum(not c.order_ok for c in cases)}")
    sized = [c for c in cases if not c.unsized]
    print(f"cases with every size known: {sum(c.exact for c in sized)} of {len(sized)} exact; "
          f"{len(cases) - len(sized)} cases with tensors of unknown size, {sum(c.exact for c in cases if c.unsized)} exact")
    print(f"worst error at any node: requested {100 * max(c.worst_requested for c in cases):.2f}%, "
          f"in use {100 * max(c.worst_in_use for c in cases):.2f}%")
    for field in ("peak_requested", "peak_in_use"):
        errors = [getattr(c, field) for c in cases]
        print(f"{field} error: {100 * min(errors):+.2f}% to {100 * max(errors):+.2f}%, "
              f"over 5% off in {sum(abs(e) > 0.05 for e in errors)} cases")
    for c in sorted((c for c in cases if not c.exact), key=lambda c: c.unsized)[:10]:
        print("  differs:", c)


if __name__ == "__main__":
    main()
