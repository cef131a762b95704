"""Tensor-level planning: the min-cut front, the byte-budget MILP, and the budget search
that uses them, checked against the real rewrite."""

from __future__ import annotations

import onnx

import pytest

from conftest import SAMPLES
from ckpt_cli.analysis import analyse
from ckpt_cli.errors import BudgetUnreachable
from ckpt_cli.io.load import load_graph
from ckpt_cli.rewrite.select import make_plan, rewrite_plan
from ckpt_cli.planning import mincut
from ckpt_cli.rewrite import rewrite, written


@pytest.fixture(scope="module")
def gpt():
    return analyse(load_graph(SAMPLES / "gpt.onnx"))


@pytest.fixture(scope="module")
def gpt_front(gpt):
    problem = mincut.build(gpt)
    return problem, mincut.front(problem)


def test_the_front_trades_bytes_for_recompute(gpt, gpt_front):
    _, cuts = gpt_front
    assert len(cuts) >= 5
    kept = [c.kept_bytes for c in cuts]
    cost = [c.cost for c in cuts]
    assert kept == sorted(kept, reverse=True) and len(set(kept)) == len(kept)
    assert cost == sorted(cost)
    assert cuts[0].cost == 0 and cuts[0].kept_bytes == gpt.stashed_bytes  # keep everything
    assert cuts[-1].kept_bytes == 0  # everything recomputable recomputed


def test_the_rewrite_keeps_and_recomputes_exactly_what_the_cut_says(gpt, gpt_front):
    _, cuts = gpt_front
    for cut in cuts[1:len(cuts) - 1:3]:
        result = written(gpt, rewrite(gpt, mincut.to_plan(gpt, cut)))
        assert result.after.stashed_bytes == cut.kept_bytes
        assert result.recompute_flops == cut.flops
        assert result.after.priority.peak_bytes < gpt.priority.peak_bytes


def test_parameter_transposes_are_recomputed_for_free(gpt, gpt_front):
    _, cuts = gpt_front
    free = cuts[1]  # the first corner that recomputes anything
    assert free.flops == 0 and free.kept_bytes < gpt.stashed_bytes
    ops = {gpt.graph.nodes[i].op_type for i in free.copied}
    assert "Transpose" in ops


def test_a_byte_budget_is_met_at_the_least_cost(gpt_front):
    problem, cuts = gpt_front
    limit = (cuts[3].kept_bytes + cuts[4].kept_bytes) // 2  # between two corners
    exact = mincut.solve_bytes(problem, limit)
    assert exact is not None and exact.kept_bytes <= limit
    assert cuts[4].cost >= exact.cost >= cuts[3].cost
    by_matmul = mincut.solve_bytes(problem, limit, matmul_first=True)
    assert by_matmul.kept_bytes <= limit and by_matmul.matmul_flops <= exact.matmul_flops
    assert mincut.solve_bytes(problem, -1) is None


def test_random_ops_are_kept_and_policies_are_honoured(tmp_path):
    import onnx
    from chain import chain_model

    path = tmp_path / "chain.onnx"
    onnx.save(chain_model(dropout_layer=1), path)
    a = analyse(load_graph(path))
    problem = mincut.build(a)
    dropout = next(n.index for n in a.graph.nodes if n.op_type == "Dropout")
    for cut in mincut.front(problem):
        assert dropout not in cut.copied
    everything = mincut.front(problem)[-1]
    assert "d1" in everything.kept  # the dropout output is the only way to have it
    keep_matmul = mincut.build(a, mincut.Policy(keep_ops=frozenset({"MatMul"})))
    for cut in mincut.front(keep_matmul):
        assert all(a.graph.nodes[i].op_type != "MatMul" for i in cut.copied)
    recompute_relu = mincut.build(a, mincut.Policy(recompute_ops=frozenset({"Relu"})))
    for cut in mincut.front(recompute_relu):
        assert not any(a.graph.nodes[a.graph.producer[t]].op_type == "Relu" for t in cut.kept)


def test_budget_sweep_never_overshoots_and_recompute_is_monotone():
    a = analyse(load_graph(SAMPLES / "mlp.onnx"))
    base = a.ort_peak_bytes
    flops = []
    for k in range(20):
        share = 1.0 - 0.01 * k
        try:
            planned = make_plan(a, budget=f"{share * 100:.0f}%")
        except BudgetUnreachable:
            flops.append(None)
            continue
        assert planned.search.peak_bytes <= int(base * share)
        assert rewrite(a, planned.plan).after.ort_peak_bytes <= planned.search.peak_bytes
        flops.append(planned.search.recompute_flops)
    reached = [f for f in flops if f is not None]
    assert len(reached) >= 10
    assert flops[:len(reached)] == reached, "a budget that fits stays reachable when loosened"
    assert reached == sorted(reached), "tighter budgets never recompute less"


@pytest.mark.parametrize("sample, top, step", [("cnn", 94.0, 4.5), ("gpt", 80.0, 8.75)])
def test_budget_as_the_cli_plans_it_is_monotone(sample, top, step):
    """``make_plan`` with ``--budget`` as the CLI runs it, at 5 budgets over the range where
    plans change: never above the budget, and a tighter budget never recomputes less (on cnn
    it did: the other segmentations were ranked by the linear model's estimate under the
    budget, and a winner's polish stopped early). ``make bench`` sweeps 20 budgets."""
    a = analyse(load_graph(SAMPLES / f"{sample}.onnx"))
    base = a.ort_peak_bytes
    flops = []
    for k in range(5):
        share = top - step * k
        planned = make_plan(a, budget=f"{share}%")
        assert planned.search.peak_bytes <= planned.budget == int(base * share / 100)
        assert rewrite_plan(a, planned).after.ort_peak_bytes <= planned.budget  # what is written
        flops.append(planned.search.recompute_flops)
    assert flops == sorted(flops), f"tighter budgets never recompute less: {flops}"
    assert flops[-1] > flops[0]


def test_the_written_graph_meets_the_budget_not_only_the_search(gpt):
    """Searches judge plans unpinned; pin's guards add bytes to the written graph (1280 on
    gpt's fit at 70%, as ORT holds it). A budget between the two is searched again below it."""
    first = make_plan(gpt, budget="70%")
    guards = rewrite_plan(gpt, first).after.ort_peak_bytes - first.search.peak_bytes
    assert guards > 0  # the premise: the fit's pinned graph peaks higher
    budget = first.search.peak_bytes + guards // 2
    planned = make_plan(gpt, budget=str(budget))
    assert planned.budget == budget
    assert rewrite_plan(gpt, planned).after.ort_peak_bytes <= budget
    assert rewrite(gpt, planned.plan).after.ort_peak_bytes <= budget
    assert planned.search.recompute_flops >= first.search.recompute_flops


def test_gpt_budget_sweep_never_overshoots_and_recompute_is_monotone(gpt):
    """The tensor-level search behind ``--budget`` on the gpt sample (what it returned at every
    budget here, checked against ``make_plan`` from 80% to 68%), over 20 budgets. One analysis
    and one cost model cache are shared: the corners are judged once for all budgets."""
    from ckpt_cli.rewrite.select import plan_cost
    from ckpt_cli.planning.cutsearch import search_cuts

    base = gpt.priority.peak_bytes
    problem = mincut.build(gpt)
    costs = {}

    def cost(plan):
        key = tuple(sorted((tuple(sorted(r.nodes)), tuple(sorted(r.keep))) for r in plan.regions))
        if key not in costs:
            costs[key] = plan_cost(gpt, plan)
        return costs[key]

    flops = []
    for k in range(20):
        limit = int(base * (0.95 - 0.03 * k))
        best = search_cuts(gpt, limit, cost, thorough=True, problem=problem).best
        if best is None:
            flops.append(None)
            continue
        assert best.cost.peak_bytes <= limit
        assert rewrite(gpt, best.plan, pin=False).after.priority.peak_bytes == best.cost.peak_bytes
        flops.append(best.cost.recompute_flops)
    reached = [f for f in flops if f is not None]
    assert len(reached) >= 15
    assert flops[:len(reached)] == reached, "a budget that fits stays reachable when loosened"
    assert reached == sorted(reached), "tighter budgets never recompute less"
    assert reached[0] == 0 < reached[-1]


# Since view copies go unguarded (ORT 1.25-1.30's Reshape fusion), the gpt cut's written peak
# moved and --budget at it finds a plan of 17,645,568 recompute FLOPs against the cut's
# 16,172,033 (1.09x): a known planner gap, open.
GPT_CUT_GAP = pytest.mark.xfail(reason="--budget at the gpt cut's peak recomputes 1.09x the cut", strict=True)


@pytest.mark.parametrize("model,kept", [pytest.param("gpt", 2818048, marks=GPT_CUT_GAP), ("gpt12", 230040780)])
def test_budget_at_a_cuts_peak_recomputes_no_more_than_the_cut(model, kept):
    """Held to the cut in peak space: at the written peak of the cut that keeps PyTorch's
    activation bytes (gpt: budget 0.5, gpt12: 1.0), --budget finds a plan that recomputes no
    more than that cut. On gpt it missed one inside a richer gap of the front (1.32x the
    cut's FLOPs); on gpt12 the cut is over the budget until pinned (its fresh buffers)."""
    a = analyse(load_graph(str(SAMPLES / f"{model}.onnx")))
    cut = mincut.solve_bytes(mincut.build(a), kept)
    written = rewrite(a, mincut.to_plan(a, cut, "mincut"))
    planned = make_plan(a, budget=str(written.after.ort_peak_bytes))
    result = rewrite_plan(a, planned)
    assert result.after.ort_peak_bytes <= written.after.ort_peak_bytes
    assert result.recompute_flops <= written.recompute_flops


def test_below_every_corner_a_cut_between_two_can_still_fit(gpt):
    """A budget a byte below the lowest corner's peak: no corner fits, but a corner kept
    a little leaner does (the corners' peaks are not the front's floor)."""
    from ckpt_cli.planning.cutsearch import search_cuts
    from ckpt_cli.rewrite.select import plan_cost

    corners = mincut.front(mincut.build(gpt), mincut.MAX_SOLVES)
    lowest = min(plan_cost(gpt, mincut.to_plan(gpt, c, "x")).peak_bytes for c in corners)
    found = search_cuts(gpt, lowest - 1, lambda p: plan_cost(gpt, p), thorough=True)
    assert found.best is not None and found.best.cost.peak_bytes < lowest


def test_budget_uses_the_cut_where_it_recomputes_less(gpt):
    planned = make_plan(gpt, budget="75%")
    assert planned.search.peak_bytes <= int(gpt.ort_peak_bytes * 0.75)
    assert any("tensor-level" in n for n in planned.plan.notes), planned.plan.notes


@pytest.mark.parametrize("model", ["gpt", "gpt12"])
def test_the_front_dominates_pytorchs_min_cut_at_half_and_a_fifth(model):
    """bench/peer_pytorch.json: PyTorch's partitioner on the models the gpt samples come from."""
    import json

    from flops import matmul_flops
    from conftest import ROOT

    a = analyse(load_graph(SAMPLES / f"{model}.onnx"))
    problem = mincut.build(a)
    peer = {m["model"]: m for m in json.loads((ROOT / "bench" / "peer_pytorch.json").read_text())["models"]}[model]
    forward = [i for i in range(len(a.graph.nodes)) if a.phases.is_forward[i]]
    assert matmul_flops(a, forward) == peer["forward_matmul_flops"]  # both count as torch's flop counter
    for point in peer["points"]:
        if point["budget"] not in (0.5, 0.2):
            continue
        cut = mincut.solve_bytes(problem, point["activation_bytes"])
        # The plan's activations; pinning adds a few bytes of guard scalars, counted apart.
        result = written(a, rewrite(a, mincut.to_plan(a, cut), pin=False))
        assert result.after.stashed_bytes <= point["activation_bytes"]
        assert matmul_flops(a, cut.copied) <= point["recompute_matmul_flops"], point["budget"]


@pytest.mark.parametrize("model,share", [("mlp", 90), ("gpt", 50), ("cnn", 80),
                                         ("ort_artifact/training_model", 92), ("resnet18", 90)])
def test_budget_and_optimal_agree_within_3_percent(model, share):
    """gpt12 takes minutes under optimal: bench/agreement.py. On resnet18 no cut fits and
    the greedy keep set recomputed 47x optimal's until budget used the exact MILP there; at
    gpt 50% and cnn 80% a structure wins, and the greedy keep set recomputed 1.27x and 1.11x
    optimal's there until budget searched that structure with the MILP too."""
    a = analyse(load_graph(SAMPLES / f"{model}.onnx"))
    heuristic = make_plan(a, budget=f"{share}%").search
    exact = make_plan(a, auto="optimal", budget=f"{share}%").search
    limit = int(a.ort_peak_bytes * share / 100)
    assert heuristic.peak_bytes <= limit and exact.peak_bytes <= limit
    assert exact.recompute_flops <= heuristic.recompute_flops <= 1.03 * exact.recompute_flops


def _random_problem(data) -> "mincut.Problem":
    """A small closure problem: nodes in topological order, each reading earlier tensors
    (some made by nodes that cannot be copied), some tensors read by the backward."""
    import numpy as np
    from hypothesis import strategies as st

    n_nodes = data.draw(st.integers(1, 7))
    n_fixed = data.draw(st.integers(0, 2))  # tensors whose producer cannot be copied
    tensors, producer, heads, tails = [], [], [], []
    for u in range(n_fixed):
        tensors.append(f"x{u}")
        producer.append(-1)
    for k in range(n_nodes):
        for h in sorted(data.draw(st.sets(st.integers(0, len(tensors) - 1), max_size=3)) if tensors else ()):
            heads.append(h)
            tails.append(k)
        for j in range(data.draw(st.integers(1, 2))):
            tensors.append(f"t{k}_{j}")
            producer.append(k)
    m = len(tensors)
    read = sorted(data.draw(st.sets(st.integers(0, m - 1), min_size=1)))
    must = [p >= 0 and data.draw(st.booleans()) and data.draw(st.booleans()) for p in producer]
    cost = data.draw(st.lists(st.integers(0, 50), min_size=n_nodes, max_size=n_nodes))
    nbytes = data.draw(st.lists(st.integers(0, 40), min_size=m, max_size=m))
    zeros = np.zeros(n_nodes, dtype=np.int64)
    return mincut.Problem(list(range(n_nodes)), np.asarray(cost, dtype=np.int64), tensors,
                          np.asarray(nbytes, dtype=np.int64), np.asarray(must, dtype=bool),
                          np.asarray(producer, dtype=np.int64), np.asarray(heads, dtype=np.int64),
                          np.asarray(tails, dtype=np.int64), np.asarray(read, dtype=np.int64), list(tensors),
                          zeros, np.asarray(cost, dtype=np.int64))


def _closure(p, copied: set[int]) -> set[int]:
    """The tensors the backward needs when ``copied`` nodes are recomputed, by fixed point."""
    needed = set(p.read_backward.tolist())
    inputs = {k: [h for h, t in zip(p.heads.tolist(), p.tails.tolist()) if t == k] for k in range(len(p.nodes))}
    while True:
        more = {h for u in needed if p.producer[u] in copied for h in inputs[int(p.producer[u])]} - needed
        if not more:
            return needed
        needed |= more


def test_the_cut_is_the_least_cost_closure_and_needs_what_the_backward_needs():
    """Against brute force over every set of copied nodes on small random problems: the
    max-flow's cut costs the least (recompute plus price per kept byte, views never kept),
    and the tensors it keeps are exactly the needed ones no copied node makes."""
    from itertools import combinations

    import numpy as np
    from hypothesis import given, settings, strategies as st

    @settings(max_examples=150, deadline=None, derandomize=True)
    @given(st.data(), st.integers(0, 4))
    def check(data, price):
        p = _random_problem(data)
        n = len(p.nodes)
        best = None
        for r in range(n + 1):
            for chosen in combinations(range(n), r):
                copied = set(chosen)
                needed = _closure(p, copied)
                kept = [u for u in needed if p.producer[u] not in copied]
                if any(p.must_recompute[u] for u in kept):
                    continue
                used = {int(p.producer[u]) for u in needed if p.producer[u] in copied}
                total = sum(int(p.cost[k]) for k in used) + price * sum(int(p.nbytes[u]) for u in kept)
                best = total if best is None else min(best, total)
        cut = mincut.solve(p, float(price))
        assert cut.cost + price * cut.kept_bytes == best
        copied = set(cut.copied)
        needed = _closure(p, copied)
        assert cut.kept == {p.tensors[u] for u in needed if p.producer[u] not in copied}
        for copied in (copied, set(data.draw(st.sets(st.integers(0, n - 1))))):
            mask = np.zeros(n, dtype=bool)
            mask[sorted(copied)] = True
            assert set(np.flatnonzero(mincut._needed(p, mask)).tolist()) == _closure(p, copied)

    check()


def test_a_budget_bounds_what_ort_measures_and_the_check_holds_it_to_that(tmp_path):
    """On cnn ORT's arena holds more than the live tensors (whole chunks handed out): the
    budget is on that, the written graph's measured arena plus its inputs stays within it,
    and the check fails the rewrite when the same figure is over (the rule on its own)."""
    from dataclasses import replace as replaced

    from ckpt_cli.api import rewrite_model
    from ckpt_cli.options import CheckOptions
    from ckpt_cli.verify.rules import held_within, judge

    a = analyse(load_graph(SAMPLES / "cnn.onnx"))
    assert a.ort_peak_bytes > a.priority.peak_bytes  # the premise: the two measures differ here
    budget = int(a.ort_peak_bytes * 0.7)
    out = rewrite_model(SAMPLES / "cnn.onnx", tmp_path / "cnn.ckpt.onnx", budget=str(budget),
                        check=CheckOptions(provider="cpu", runs=1))
    assert out.report["planning"]["budget_met"] and out.result.after.ort_peak_bytes <= budget
    held = out.check.measured.rewritten.peak_bytes + out.result.after.outside_arena_bytes
    assert held <= budget and out.check.passed, out.check.failures
    # ORT makes the guards' Constant nodes (8-32 byte int64s) initializers held in the arena for
    # the session; ckpt's arena model leaves them out (counting them would fail fresh.py's
    # no-higher rule for the views it writes): a known offset, beside an arena rounding unit
    constants = sum(onnx.numpy_helper.to_array(n.proto.attribute[0].t).nbytes
                    for n in out.result.graph.nodes if n.op_type == "Constant")
    assert abs(out.report["planning"]["ort_peak_bytes_after"] + constants - held) <= 256
    tight = judge(replaced(out.check, findings=()), False, (held_within(held - 1, out.result.after.outside_arena_bytes),))
    assert not tight.passed and tight.codes == ["budget_held"]


def test_a_byte_budget_cut_over_the_budget_by_the_solvers_tolerance_is_solved_again(monkeypatch):
    """HiGHS holds the byte row within a feasibility tolerance: on gpt2s at PyTorch's 0.5
    the cut kept 4 bytes more than the budget, and at 0.2 the same cut came back at a budget
    lowered by those 4 bytes. Such a cut is solved again, lower by the excess, then by a
    margin too."""
    from types import SimpleNamespace

    limits = []

    def once(problem, limit, matmul_first, time_limit):
        limits.append(limit)
        return SimpleNamespace(kept_bytes=1004 if len(limits) <= 2 else limit)

    monkeypatch.setattr(mincut, "_solve_bytes_once", once)
    assert mincut.solve_bytes(None, 1000).kept_bytes == 991 and limits == [1000, 996, 991]


def _brute_force_copied(problem, price: int) -> frozenset:
    """The least-cost cut by enumeration; among ties, the union of the tied copied sets,
    each pruned to what the backward needs (optimal closures are closed under union)."""
    import itertools
    import numpy as np

    best, union = None, set()
    n = len(problem.nodes)
    for bits in itertools.product((False, True), repeat=n):
        cut = mincut._cut(problem, float(price), np.array(bits, dtype=bool))
        if any(problem.must_recompute[problem.tensors.index(t)] for t in cut.kept):
            continue
        total = cut.cost + price * int(sum(problem.nbytes[problem.tensors.index(t)] for t in cut.kept))
        if best is None or total < best:
            best, union = total, set()
        if total == best:
            union |= cut.copied
    return frozenset(union)


def test_solve_returns_the_least_cost_cut_that_recomputes_the_most():
    """Random chains of up to 7 copyable nodes with tied costs: the max-flow cut against
    enumeration, so any max-flow solver gives the same cut (ties included)."""
    import numpy as np

    rng = np.random.default_rng(7)
    for case in range(40):
        n = int(rng.integers(2, 8))
        # tensor u is made by node u (u < n) or is a forward input (u == n: its producer cannot be copied)
        heads, tails = [n], [0]
        for k in range(1, n):
            for u in sorted(set(rng.integers(0, k, size=int(rng.integers(1, 3))).tolist()) | {k - 1}):
                heads.append(u)
                tails.append(k)
        read = sorted(set(rng.integers(0, n, size=int(rng.integers(1, 4))).tolist()))
        problem = mincut.Problem(
            nodes=list(range(n)), cost=rng.choice([0, 2, 4], size=n).astype(np.int64),
            tensors=[f"t{u}" for u in range(n + 1)], nbytes=rng.choice([0, 1, 2, 4], size=n + 1).astype(np.int64),
            must_recompute=np.r_[rng.random(n) < 0.15, False], producer=np.r_[np.arange(n), -1].astype(np.int64),
            heads=np.asarray(heads, dtype=np.int64), tails=np.asarray(tails, dtype=np.int64),
            read_backward=np.asarray(read, dtype=np.int64), buffer=[f"t{u}" for u in range(n + 1)],
            matmul_flops=np.zeros(n, dtype=np.int64), flops=np.zeros(n, dtype=np.int64))
        for price in (1, 2):
            assert mincut.solve(problem, price).copied == _brute_force_copied(problem, price), (case, price)


def test_a_cut_is_solved_without_scipy_or_anything_heavier():
    """The max flow is ckpt's own (numpy and plain Python): solving a cut loads neither scipy
    (143 MB installed, 0.3-0.45 s to import) nor pandas (OR-Tools' dependency, once the
    max-flow solver's)."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys; from ckpt_cli.planning import mincut; from ckpt_cli.analysis import analyse; "
            "from ckpt_cli.io.load import load_graph; a = analyse(load_graph(sys.argv[1])); "
            "problem = mincut.build(a); cut = mincut.solve(problem, float(problem.cost.sum()) + 1.0); "
            "print(len(cut.copied) > 0, 'scipy' in sys.modules, 'pandas' in sys.modules or 'ortools' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(SAMPLES / "mlp.onnx")], capture_output=True, text=True,
                         cwd=Path(__file__).parent.parent)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "False", "False"]
