"""--activation-budget F: PyTorch's activation_memory_budget, as a share of the activation
bytes the backward reads without recompute; the cut with the fewest matmul FLOPs under it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import ROOT, SAMPLES
from ckpt_cli.analysis import analyse
from ckpt_cli.cli import main
from ckpt_cli.io.load import load_graph
from ckpt_cli.planning import mincut
from ckpt_cli.planning.activation import activation_budget_plan, no_recompute_bytes

# PyTorch 2.13's min_cut_rematerialization_partition on the same models (its activation bytes
# and matmul recompute per activation_memory_budget), as measured for the peer bench.
PEER = json.loads((ROOT / "bench" / "peer_pytorch.json").read_text())


def run(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.output


def plan_json(model: Path, share: float) -> dict:
    code, out = run("plan", model, "--activation-budget", share, "--json")
    assert code == 0, out
    return json.loads(out)


@pytest.fixture(scope="module")
def gpt():
    return analyse(load_graph(SAMPLES / "gpt.onnx"))


def test_activation_budget_keeps_at_most_its_share(gpt):
    base = no_recompute_bytes(mincut.build(gpt))
    assert base == gpt.stashed_bytes
    for share in (0.8, 0.5, 0.2):
        record = plan_json(SAMPLES / "gpt.onnx", share)["activation_budget"]
        assert record["no_recompute_bytes"] == base
        assert record["kept_bytes"] <= record["limit_bytes"] == int(share * base)


def test_activation_budget_of_one_recomputes_no_matmul(gpt):
    plan, record = activation_budget_plan(gpt, 1.0)
    assert record.recompute_matmul_flops == 0 and record.kept_bytes == record.no_recompute_bytes


def test_activation_budget_takes_the_fewest_matmul_flops_on_the_front(gpt):
    """No corner of the min-cut front that fits the same bytes recomputes fewer matmul FLOPs."""
    problem = mincut.build(gpt)
    for share in (0.5, 0.2):
        _, record = activation_budget_plan(gpt, share)
        fitting = [c for c in mincut.front(problem) if c.kept_bytes <= record.limit_bytes]
        assert fitting and record.recompute_matmul_flops <= min(c.matmul_flops for c in fitting)


@pytest.mark.parametrize("model", ["gpt", "gpt12"])
def test_activation_budget_recomputes_no_more_matmul_than_pytorch_at_its_bytes(model):
    """At each of PyTorch's min-cut points, the share that lands on PyTorch's activation bytes
    recomputes no more matmul FLOPs than PyTorch did (through the CLI)."""
    path = SAMPLES / f"{model}.onnx"
    base = no_recompute_bytes(mincut.build(analyse(load_graph(path))))
    points = next(m for m in PEER["models"] if m["model"] == model)["points"]
    for point in (p for p in points if p["partitioner"] == "min_cut" and p["budget"] in (0.5, 0.2)):
        share = (point["activation_bytes"] + 1) / base  # the share whose floor is PyTorch's bytes
        record = plan_json(path, share)["activation_budget"]
        assert record["kept_bytes"] <= point["activation_bytes"]
        assert record["recompute_matmul_flops"] <= point["recompute_matmul_flops"], point["budget"]


@pytest.mark.parametrize("command,extra", [("plan", ("--budget", "50%")), ("plan", ("--auto", "sqrt")),
                                           ("rewrite", ("--region", "*"))])
def test_activation_budget_refuses_other_plan_choices(command, extra, tmp_path):
    where = ("-o", tmp_path / "x.onnx") if command == "rewrite" else ()
    code, out = run(command, SAMPLES / "gpt.onnx", *where, "--activation-budget", "0.5", *extra)
    assert code == 2 and "--activation-budget chooses regions itself" in out


@pytest.mark.parametrize("share", ["0", "1.5", "-0.1", "half"])
def test_activation_budget_outside_zero_one_is_a_usage_error(share):
    code, out = run("plan", SAMPLES / "gpt.onnx", "--activation-budget", share)
    assert code == 2 and "--activation-budget" in out


def test_activation_budget_library_refuses_a_share_outside_zero_one(gpt):
    with pytest.raises(ValueError):
        activation_budget_plan(gpt, 0.0)


@pytest.mark.slow
def test_activation_budget_rewrite_passes_its_check(tmp_path):
    out = tmp_path / "gpt.ab.onnx"
    code, text = run("rewrite", SAMPLES / "gpt.onnx", "-o", out, "--activation-budget", "0.5", "--check", "--json")
    assert code == 0, text
    report = json.loads(text)
    assert report["planning"]["activation_budget"]["kept_bytes"] <= report["planning"]["activation_budget"][
        "limit_bytes"]
    assert report["check"]["passed"] and report["after"]["peak_bytes"] < report["before"]["peak_bytes"]
