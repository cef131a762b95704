"""``ckpt plan --sweep`` and the per-op policies, through the CLI."""

from __future__ import annotations

import json

from click.testing import CliRunner

from conftest import SAMPLES
from ckpt_cli.cli import main


def run(*args):
    r = CliRunner().invoke(main, [str(a) for a in args])
    return r.exit_code, r.output


def test_sweep_shows_the_front_as_json_table_chart_and_svg(tmp_path):
    svg = tmp_path / "front.svg"
    code, out = run("plan", SAMPLES / "gpt.onnx", "--sweep", "--svg", svg, "--json")
    assert code == 0, out
    points = json.loads(out)["sweep"]
    front = [p for p in points if p["pareto"]]
    assert len(front) >= 5
    by_flops = sorted(front, key=lambda p: p["recompute_flops"])
    assert [p["peak_bytes"] for p in by_flops] == sorted((p["peak_bytes"] for p in by_flops), reverse=True)
    assert by_flops[-1]["peak_bytes"] < 0.5 * json.loads(out)["peak_bytes_before"]
    text = svg.read_text()
    assert text.startswith("<svg") and text.count("<circle") == len(points)
    code, out = run("plan", SAMPLES / "gpt.onnx", "--sweep")
    assert code == 0 and "recompute share of the step" in out and "*" in out
    assert all(len(line) <= 80 for line in out.splitlines())
    assert "Knee (K)" in out


def test_sweep_marks_the_default_plan_as_its_knee():
    """The sweep's knee and the default plan are the same rule over the same kind of points:
    on gpt both stop at the corner where recompute outgrows the peak it saves."""
    code, out = run("plan", SAMPLES / "gpt.onnx", "--sweep", "--json")
    knees = [p for p in json.loads(out)["sweep"] if p["knee"]]
    assert code == 0 and len(knees) == 1
    code, out = run("plan", SAMPLES / "gpt.onnx", "--json")
    knee = json.loads(out)["knee"]
    assert knee["stopped_early"] and knee["chosen"]["recompute_flops"] < knee["lowest_peak"]["recompute_flops"] / 3
    assert knees[0]["recompute_flops"] == knee["chosen"]["recompute_flops"]


def test_keep_ops_are_never_recomputed_by_any_strategy():
    from ckpt_cli.analysis import analyse
    from ckpt_cli.io.load import load_graph
    from ckpt_cli.rewrite.select import make_plan, rewrite_plan
    from ckpt_cli.planning.plan import Policy

    a = analyse(load_graph(SAMPLES / "gpt.onnx"))
    by_name = {n.name: n for n in a.graph.nodes}
    policy = Policy(keep_ops=frozenset({"Gemm", "MatMul"}))
    for options in ({"auto": "layers"}, {"auto": "balanced"}, {"budget": "80%"}, {"patterns": ["node_*"]}, {}):
        planned = make_plan(a, policy=policy, **options)
        result = rewrite_plan(a, planned)
        copied = {by_name[name].op_type for r in result.regions for name in r.copies}
        assert copied and not copied & {"Gemm", "MatMul"}, options
        assert "policy: always keeps Gemm,MatMul" in planned.plan.notes, options
    code, out = run("plan", SAMPLES / "gpt.onnx", "--keep-ops", "Gemm,MatMul", "--budget", "80%")
    assert code == 0 and "always keeps Gemm,MatMul" in out


def test_recompute_ops_are_not_kept_inside_regions():
    from ckpt_cli.analysis import analyse
    from ckpt_cli.io.load import load_graph
    from ckpt_cli.rewrite.select import make_plan, rewrite_plan
    from ckpt_cli.planning.plan import Policy

    a = analyse(load_graph(SAMPLES / "gpt.onnx"))
    by_name = {n.name: n for n in a.graph.nodes}

    def copied(policy):
        result = rewrite_plan(a, make_plan(a, auto="balanced", policy=policy))
        return {by_name[name].op_type for r in result.regions for name in r.copies}

    assert "Gemm" not in copied(Policy()), "balanced keeps Gemm outputs"
    assert "Gemm" in copied(Policy(recompute_ops=frozenset({"Gemm"}))), "unless the policy says to recompute them"
    code, out = run("plan", SAMPLES / "gpt.onnx", "--recompute-ops", "Gemm", "--keep-ops", "Gemm")
    assert code == 2 and "both name Gemm" in out


def test_a_region_that_recomputes_nothing_says_so(tmp_path):
    code, out = run("rewrite", SAMPLES / "gpt.onnx", "--region", "node_gelu*", "-o", tmp_path / "g.onnx")
    assert code == 0, out
    assert "region 'node_gelu*' recomputes nothing" in out


def test_sweep_with_o_is_refused_instead_of_writing_nothing(tmp_path):
    out = tmp_path / "sweep.json"
    r = CliRunner().invoke(main, ["plan", str(SAMPLES / "mlp.onnx"), "--sweep", "-o", str(out)])
    assert r.exit_code == 2 and "--sweep makes none" in r.output and "--report FILE" in r.output, r.output
    assert not out.exists()
