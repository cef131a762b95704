"""Second copies (rewrite/twice.py, planning/twice.py): a recomputed tensor made again
right before its late backward readers.

In the hand-built chain (``fixtures/chain.py``) one region over every layer copies the
whole forward before the last layer's backward; ``z0`` (the first MatMul's output) is read
only by the first layer's ReLU gradient, at the very end, so its first copy waits across
the whole backward. A second copy right before that reader lets the first die once the
next copy read it.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from chain import chain_feeds, chain_model
from conftest import SAMPLES
from ckpt_session import run_outputs

from ckpt_cli.analysis import analyse, lowest_peak, schedules
from ckpt_cli.errors import UsageError
from ckpt_cli.io.load import load_graph
from ckpt_cli.io.save import build_model
from ckpt_cli.markers import BLOCK_META, CSE_GUARD_ATTR, recompute_source
from ckpt_cli.planning.evaluate import PlanEvaluator, working_peak
from ckpt_cli.planning.plan import Plan, Region
from ckpt_cli.planning.regions import regions_from_plan
from ckpt_cli.planning.cutsearch import DefaultPlan
from ckpt_cli.planning.twice import Judged, SecondCopies, lowest_with_twice
from ckpt_cli.rewrite import rewrite
from ckpt_cli.io.written import to_model

LAYERS = 4


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    path = tmp_path_factory.mktemp("twice") / "chain.onnx"
    onnx.save(chain_model(layers=LAYERS), path)
    return analyse(load_graph(path))


def _one_region(a, twice=frozenset()) -> Plan:
    nodes = {i for i, n in enumerate(a.graph.nodes) if a.phases.is_forward[i] and n.op_type in ("MatMul", "Relu")}
    return Plan([Region("all", nodes, set(), set(twice))], "test")


def _per_layer(a) -> Plan:
    regions = [Region(f"layers.{k}", {i for i, n in enumerate(a.graph.nodes)
                                      if a.phases.is_forward[i] and n.name.startswith(f"/layers.{k}/")})
               for k in range(LAYERS)]
    return Plan(regions, "test")


def _second_copies(graph):
    return [n for n in graph.nodes if n.meta(BLOCK_META) is not None]


def test_a_second_copy_lowers_the_peak_and_trains_bit_identically(chain, tmp_path):
    once = rewrite(chain, _one_region(chain))
    twice = rewrite(chain, _one_region(chain, {"z0"}))
    assert working_peak(twice.after) < working_peak(once.after)
    assert twice.regions[0].twice == [("z0", "/layers.0/Greater_grad")]
    second = _second_copies(twice.graph)
    assert [recompute_source(n) for n in second] == ["/layers.0/MatMul"]
    # the late reader reads the second copy, the first copy's other reader (the ReLU copy) the first
    late = next(n for n in twice.graph.nodes if n.name == "/layers.0/Greater_grad")
    assert late.inputs[0].startswith(second[0].outputs[0])  # or a fresh view of it (rewrite/fresh.py)
    feeds = chain_feeds(chain.graph.model)
    path = tmp_path / "twice.onnx"
    onnx.save(to_model(twice), path)
    original, rewritten = run_outputs(chain.graph.model, feeds), run_outputs(path, feeds)
    assert original.keys() == rewritten.keys()
    assert all(np.array_equal(original[k], rewritten[k]) for k in original)
    # and under ORT's defaults (every optimization, its DEFAULT order), as the original runs there
    plain = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    base = ort.InferenceSession(chain.graph.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert all(np.array_equal(x, y) for x, y in zip(plain, base))


def test_pin_runs_the_second_copy_after_the_early_readers_in_ort_default_order(chain):
    """Pinned as a block of its own: ORT's DEFAULT order would otherwise run a copy that reads
    only graph inputs as soon as they exist, in the forward."""
    graph = rewrite(chain, _one_region(chain, {"z0"})).graph
    position = {i: k for k, i in enumerate(schedules.ort_default(graph))}
    second = _second_copies(graph)[0]
    early = [n for n in graph.nodes if n.name in ("/layers.1/Greater_grad", "/layers.1/Transpose_grad",
                                                  "/layers.2/Greater_grad", "/layers.3/MatMul_wgrad")]
    assert len(early) == 4
    assert all(position[n.index] < position[second.index] for n in early)


def test_cse_merges_the_second_copy_with_neither_the_original_nor_the_first(chain, tmp_path):
    """Unpinned, the copies that read only original tensors differ from each other by their
    CSE guard's value alone."""
    result = rewrite(chain, _one_region(chain, {"z0"}), pin=False)
    model = build_model(result.graph, [n.proto for n in result.graph.nodes])
    assert {a.s.decode() for n in model.graph.node for a in n.attribute if a.name == CSE_GUARD_ATTR} == {
        "all", "all#late1"}
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    optimized = onnx.load(so.optimized_model_filepath)
    first_layer = [n for n in optimized.graph.node if n.op_type == "MatMul" and list(n.input) == ["x", "layers.0.weight"]]
    assert len(first_layer) == 3  # the original, its first copy and its second


def test_no_second_copy_where_every_reader_is_at_the_block(chain):
    """``z3`` is read by the first backward reader of the region's copies alone: there is
    no late reader to move, and the rewrite is the one without it."""
    once = rewrite(chain, _one_region(chain), pin=False)
    asked = rewrite(chain, _one_region(chain, {"z3"}), pin=False)
    assert asked.regions[0].twice == []
    assert [(n.name, n.inputs) for n in asked.graph.nodes] == [(n.name, n.inputs) for n in once.graph.nodes]


def test_the_search_keeps_second_copies_only_where_the_peak_goes_down(chain):
    evaluator = PlanEvaluator(chain, rewrite, keep_results=True)
    search = SecondCopies(evaluator)
    plan = _one_region(chain)
    cost = evaluator.cost(plan)
    better, lower = search.improved(plan, cost)
    assert lower.peak_bytes < cost.peak_bytes
    assert better.regions[0].twice and any("recomputed a second time" in note for note in better.notes)
    assert not plan.regions[0].twice and not plan.notes  # the plan judged is left as it is
    assert working_peak(evaluator.results[id(better)].after) == lower.peak_bytes
    # per layer, each copy's readers are next to each other: nothing is worth a second copy
    layered = _per_layer(chain)
    assert search.improved(layered, evaluator.cost(layered)) is None


def test_second_copies_are_taken_only_where_the_written_graph_holds_less(chain):
    """The search judges unpinned rewrites by their live tensors; the choice with second
    copies is taken only where its written graph (pinned) is kept where the one without is,
    and is predicted to hold less in ORT."""
    from types import SimpleNamespace

    from ckpt_cli.planning.budget import Planned
    from ckpt_cli.rewrite.select import rewrite_plan

    evaluator = PlanEvaluator(chain, rewrite, keep_results=True)
    judged = Judged(evaluator.cost)
    plan = _one_region(chain)
    chosen = DefaultPlan(plan, judged(plan))

    def write(p):
        return rewrite_plan(chain, Planned(p, result=evaluator.results.get(id(p))))

    taken = lowest_with_twice(chain, evaluator, judged, chosen, write)
    assert taken.plan.regions[0].twice and taken.cost.peak_bytes < chosen.cost.peak_bytes
    assert taken.fallbacks[0][0] is plan  # a session that refuses it goes on without them

    def dropping_twice(p):  # as an ORT artifact's rewrite predicted no lower in the Module session
        return SimpleNamespace(no_gain="no lower" if p.regions[0].twice else None, after=write(p).after)

    assert lowest_with_twice(chain, evaluator, judged, chosen, dropping_twice) is chosen

    def holding_more(p):  # as where pin's guards or the arena undo the saving
        return SimpleNamespace(no_gain=None, after=(write(plan) if p.regions[0].twice else write(_per_layer(chain))).after)

    assert lowest_with_twice(chain, evaluator, judged, chosen, holding_more) is chosen


def test_second_copies_must_be_clearly_below_every_plan_without(chain):
    """Within NEAR_LOWEST of a plan without second copies the default prefers less recompute."""
    from ckpt_cli.planning.search import PlanCost

    evaluator = PlanEvaluator(chain, rewrite, keep_results=True)
    judged = Judged(evaluator.cost)
    plan = _one_region(chain)
    chosen = DefaultPlan(plan, judged(plan))
    _, lower = SecondCopies(evaluator).improved(plan, chosen.cost)
    assert lower.peak_bytes < 0.97 * chosen.cost.peak_bytes
    # a plan without them (judged by the peak descent, say) 1% above the one with them
    judged.others.append((_per_layer(chain), PlanCost(int(lower.peak_bytes * 1.01), chosen.cost.recompute_flops)))
    assert lowest_with_twice(chain, evaluator, judged, chosen) is chosen
    judged.others[-1] = (_per_layer(chain), PlanCost(int(lower.peak_bytes * 1.03), chosen.cost.recompute_flops))
    assert lowest_with_twice(chain, evaluator, judged, chosen).plan.regions[0].twice


def test_the_default_takes_second_copies_only_where_they_are_clearly_lower():
    """keyword_kl's floor needs three conv outputs made twice: the lowest peak falls from
    10.2 MiB (the sqrt plan) to its floor. Zoo bert takes none: with them its plans are
    within the default's margin of those without, or their written graph holds no less."""
    from ckpt_cli.options import MIN_PEAK
    from ckpt_cli.rewrite.select import make_plan

    zoo = SAMPLES / "zoo"
    kw = analyse(load_graph(zoo / "keyword_kl" / "training_model.onnx"), dims={"batch": 64})
    planned = make_plan(kw, auto=MIN_PEAK)
    assert any(r.twice for r in planned.plan.regions)
    assert planned.result is not None and working_peak(planned.result.after) <= 1.01 * lowest_peak(kw).bytes
    # a session that refuses it (the Module API's, trained by --python) falls back on the
    # choice without second copies first
    first = planned.fallbacks[0][0]
    assert first.strategy == "sqrt" and not any(r.twice for r in first.regions)
    bert = analyse(load_graph(zoo / "bert" / "training_model.onnx"), dims={"batch": 64})
    assert not any(r.twice for r in make_plan(bert, auto=MIN_PEAK).plan.regions)


def test_plan_files_carry_the_second_copies(chain):
    plan = _one_region(chain, {"z0"})
    data = json.loads(json.dumps(plan.to_json([n.name for n in chain.graph.nodes])))
    assert data["regions"][0]["twice"] == ["z0"]
    assert regions_from_plan(chain, data).regions[0].twice == {"z0"}
    assert "twice" not in _one_region(chain).to_json([n.name for n in chain.graph.nodes])["regions"][0]
    data["regions"][0]["twice"] = ["x"]
    with pytest.raises(UsageError, match="twice 'x' is not a tensor made in the region"):
        regions_from_plan(chain, data)


def test_the_report_says_which_tensors_are_made_twice(chain, tmp_path):
    """``rewrite --json``: the region's row names each tensor made twice and where, the plan
    carries them, and the report still matches its schema."""
    from importlib import resources

    from click.testing import CliRunner

    from ckpt_cli.cli import main

    jsonschema = pytest.importorskip("jsonschema")
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(_one_region(chain, {"z0"}).to_json([n.name for n in chain.graph.nodes])))
    source = tmp_path / "chain.onnx"
    onnx.save(chain.graph.model, source)
    result = CliRunner().invoke(main, ["rewrite", str(source), "-o", str(tmp_path / "out.onnx"), "--plan", str(plan),
                                       "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    schema = json.loads(resources.files("ckpt_cli.report").joinpath("schema.json").read_text())
    jsonschema.validate(report, schema)
    assert report["regions"][0]["recomputed_twice"] == [{"tensor": "z0", "placed_before": "/layers.0/Greater_grad"}]
    assert report["plan"]["regions"][0]["twice"] == ["z0"]
