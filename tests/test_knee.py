"""The knee rule of the default plan (``planning/knee.py``) on fronts built by hand, and
``--auto min-peak`` against it on a sample."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from conftest import SAMPLES
from ckpt_cli.analysis import analyse
from ckpt_cli.cli import main
from ckpt_cli.graph import Graph
from ckpt_cli.planning import cutsearch
from ckpt_cli.planning.knee import Point, knee_index
from ckpt_cli.planning.regions import default_regions
from ckpt_cli.rewrite.select import make_plan, plan_cost

ORIGINAL, STEP = 1000, 1000


def run(*args):
    r = CliRunner().invoke(main, [str(a) for a in args])
    return r.exit_code, r.output


def _at(points: list[tuple[int, int]], slope: float = 1.0) -> tuple[int, int]:
    front = [Point(peak, flops) for peak, flops in points]
    return points[knee_index(front, ORIGINAL, STEP, slope)]


def test_stops_where_a_hop_costs_more_step_than_it_saves_peak():
    # hops: 1000->600 for 50 (0.125), 600->450 for +100 (0.67), 450->400 for +150 (3.0)
    front = [(1000, 0), (600, 50), (450, 150), (400, 300)]
    assert _at(front) == (450, 150)
    assert _at(front, slope=5.0) == (400, 300)
    assert _at(front, slope=0.1) == (1000, 0)


def test_takes_the_hull_past_a_dent_in_the_front():
    # 800 alone is a bad buy (slope 2), but 500 reached from the start costs 0.6 per share
    front = [(1000, 0), (800, 400), (500, 300)]
    assert _at(front) == (500, 300)


def test_a_hop_at_exactly_the_max_slope_is_taken_and_the_default_slope_is_one():
    """One percent of a step's FLOPs for one percent of the peak is still bought."""
    front = [(1000, 0), (500, 500)]
    assert _at(front) == (500, 500) and _at(front, slope=0.99) == (1000, 0)
    points = [Point(peak, flops) for peak, flops in [(1000, 0), (500, 510)]]
    assert knee_index(points, ORIGINAL, STEP) == 0  # slope 1.02 with the default MAX_SLOPE
    assert knee_index(points, ORIGINAL, STEP, 1.1) == 1


def test_the_axes_are_shares_of_the_original_peak_and_of_a_steps_flops():
    """Half the peak for a quarter of a step (1000 of 4000 FLOPs): slope 0.5, taken; the
    same FLOPs against a step of 1000 would cost a whole step, slope 2."""
    points = [Point(1000, 0), Point(500, 1000)]
    assert knee_index(points, 1000, 4000) == 1 and knee_index(points, 1000, 1000) == 0
    assert knee_index(points, 3000, 4000) == 0  # a sixth of the original's peak saved: slope 1.5


def test_starts_from_the_lowest_peak_among_plans_that_recompute_least():
    front = [(1000, 0), (900, 0), (950, 10), (300, 2000)]
    assert _at(front) == (900, 0)


def test_a_plan_better_on_both_axes_is_always_taken():
    assert _at([(1000, 50), (700, 0), (600, 0)]) == (600, 0)


def test_min_peak_writes_the_lowest_peak_the_knee_passed_up(tmp_path):
    code, out = run("plan", SAMPLES / "gpt.onnx", "--json")
    knee = json.loads(out)["knee"]
    code2, out2 = run("plan", SAMPLES / "gpt.onnx", "--json", "--auto", "min-peak")
    lowest = json.loads(out2)
    assert code == code2 == 0 and knee["stopped_early"]
    assert lowest["knee"] is None and lowest["recompute_flops"] > knee["chosen"]["recompute_flops"]
    assert lowest["peak_bytes_after"] < knee["chosen"]["peak_bytes"]
    # the default was judged again in a plain session, where the knee saves nothing on gpt:
    # it took the lowest peak's hull vertex, as --auto min-peak does
    assert json.loads(out)["plain_session"]["moved"]


def test_an_ort_artifact_keeps_the_lowest_peak_by_default():
    """The Module API's untuned session fuses the artifact's rewrite; the lowest-peak plan
    is the one measured bit-identical there over the artifact zoo."""
    artifact = SAMPLES / "ort_artifact" / "training_model.onnx"
    code, out = run("plan", artifact, "--json")
    code2, out2 = run("plan", artifact, "--json", "--auto", "min-peak")
    default, lowest = json.loads(out), json.loads(out2)
    assert code == code2 == 0 and default["knee"] is None
    assert default["plan"] == lowest["plan"]


def test_the_default_plans_header_names_its_kind_not_lowest(tmp_path):
    """The knee's min-cut plan is labelled 'mincut' in rewrite's header (the line after the
    headline) and in JSON's strategy: '(lowest)' is --auto min-peak's word, not the default's."""
    code, out = run("rewrite", SAMPLES / "cnn.onnx", "-o", tmp_path / "c.onnx")
    first = out.splitlines()[1]
    assert code == 0 and first.endswith("(mincut)") and "lowest" not in first, first
    code, out = run("plan", SAMPLES / "cnn.onnx", "--json")
    assert code == 0 and json.loads(out)["strategy"] == "mincut"


@pytest.fixture(scope="module")
def above_old_limit():
    """A synthetic transformer above the 5,000 nodes the knee once stopped at, small in
    bytes: its rewrites are quick."""
    from fixtures.synthetic import build_transformer

    a = analyse(Graph.from_model(build_transformer(37, d_model=32, seq=16)))
    assert len(a.graph.nodes) > 5_000
    return a


def _share(a, flops: int) -> float:
    return flops / (a.forward_flops + a.backward_flops)


def test_a_graph_above_five_thousand_nodes_gets_the_knee(above_old_limit):
    """The corners nearest the knee of their estimated peaks and the per-layer plan
    judged, as KNEE_JUDGED_NODES allows: the knee is a min-cut corner recomputing a
    fraction of what the per-layer plan does, at no higher a peak."""
    a = above_old_limit
    planned = make_plan(a)
    layers = plan_cost(a, default_regions(a))
    assert planned.knee is not None and planned.plan.strategy == "mincut"
    assert planned.knee.candidates > 2
    assert planned.knee.chosen.peak_bytes <= layers.peak_bytes * 1.01
    assert _share(a, planned.knee.chosen.recompute_flops) < _share(a, layers.recompute_flops) / 5


def test_above_the_rewrite_bound_the_knee_judges_the_corners_nearest_it(above_old_limit, monkeypatch):
    """With two rewrites allowed, the corner at the knee of the estimated peaks and the
    per-layer plan are judged, and the knee of the two taken."""
    a = above_old_limit
    monkeypatch.setattr(cutsearch, "KNEE_JUDGED_NODES", 2 * len(a.graph.nodes))
    planned = make_plan(a)
    layers = plan_cost(a, default_regions(a))
    assert planned.knee is not None and planned.knee.candidates == 2
    assert planned.plan.strategy == "mincut"
    assert any("2 of " in note for note in planned.plan.notes)
    assert planned.knee.chosen.peak_bytes <= layers.peak_bytes * 1.01


def test_above_five_thousand_nodes_the_lowest_peak_judges_corners_beside_the_layers(above_old_limit, monkeypatch):
    """``--auto min-peak`` (an ORT artifact's default) above DEFAULT_SEARCH_NODES judges the
    per-layer plan and, as KNEE_JUDGED_NODES allows, the corners of lowest estimated peak:
    it takes one of them where it is as low for less recompute, and a session that refuses
    it gets the per-layer plan next (a fallback with less recompute only: none here)."""
    a = above_old_limit
    layers = plan_cost(a, default_regions(a))
    monkeypatch.setattr(cutsearch, "KNEE_JUDGED_NODES", 3 * len(a.graph.nodes))
    lowest = make_plan(a, auto="min-peak")
    assert lowest.cost is not None and any("3 plan(s) judged" in note for note in lowest.plan.notes)
    assert lowest.cost.peak_bytes <= layers.peak_bytes * (1 + cutsearch.NEAR_LOWEST)
    assert lowest.cost.recompute_flops <= layers.recompute_flops
    assert lowest.plan.strategy == "mincut"
    monkeypatch.setattr(cutsearch, "KNEE_JUDGED_NODES", len(a.graph.nodes))  # one rewrite: the layers alone
    alone = make_plan(a, auto="min-peak")
    assert alone.plan.strategy == "layers" and alone.cost == layers


def test_the_aimed_knee_is_judged_first_then_its_hull_neighbours_past_it_first():
    """The order a bounded knee search judges corners in: the knee of the estimated front,
    the hull vertex past it, the one before, outward; points off the hull last."""
    front = [Point(1000, 0), Point(600, 50), Point(450, 150), Point(400, 300), Point(700, 400)]
    assert cutsearch._knee_first(front, ORIGINAL, STEP) == [2, 3, 1, 0, 4]


def test_the_cut_problem_is_let_go_before_the_knee_is_judged(above_old_limit, monkeypatch):
    """The rewrites a bounded knee search judges run without the cut problem and its front
    alive (at 100k nodes 30 MiB of the rewrite's peak): nothing the judging reads needs them."""
    import weakref

    import ckpt_cli.rewrite.select as select

    a = above_old_limit
    monkeypatch.setattr(cutsearch, "KNEE_JUDGED_NODES", 2 * len(a.graph.nodes))
    problems: list[weakref.ref] = []
    built = cutsearch.build

    def build(*args, **kwargs):
        problem = built(*args, **kwargs)
        problems.append(weakref.ref(problem))
        return problem

    alive: list[bool] = []
    own = select.rewrite

    def judged(*args, **kwargs):
        alive.append(any(p() is not None for p in problems))
        return own(*args, **kwargs)

    monkeypatch.setattr(cutsearch, "build", build)
    monkeypatch.setattr(select, "rewrite", judged)
    planned = make_plan(a)
    assert planned.knee is not None and planned.knee.candidates == 2
    assert problems and alive and not any(alive)
