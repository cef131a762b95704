"""--activation-budget F: PyTorch's activation_memory_budget, as a share of the activation
bytes the backward reads without recompute; the cut with the fewest matmul FLOPs under it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import ROOT, SAMPLES
import ckpt_cli
from ckpt_cli.analysis import analyse
from ckpt_cli.cli import main
from ckpt_cli.errors import BudgetUnreachable
from ckpt_cli.io.load import load_graph
from ckpt_cli.planning import mincut
from ckpt_cli.planning.activation import activation_budget_plan, no_recompute_bytes
from ckpt_cli.planning.plan import Policy
from ckpt_cli.rewrite import rewrite, written

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


def test_activation_budget_of_one_recomputes_nothing(gpt):
    plan, record = activation_budget_plan(gpt, 1.0)
    assert record.recompute_matmul_flops == 0 and record.kept_bytes == record.no_recompute_bytes
    assert plan.regions == [] and record.kept_share == 1.0


def test_activation_budget_of_zero_recomputes_all_it_can(gpt):
    """PyTorch's 0 saves only the inputs; on the GPT sample every activation can be recomputed."""
    plan, record = activation_budget_plan(gpt, 0.0)
    assert record.kept_bytes == 0 == record.limit_bytes and record.kept_share == 0.0
    assert written(gpt, rewrite(gpt, plan, pin=False)).after.stashed_bytes == 0


SHARES = (1.0, 0.8, 0.5, 0.2, 0.05, 0.0)


@pytest.mark.parametrize("model", ["gpt", "mlp", "cnn", "resnet18"])
def test_activation_budget_rewrite_keeps_its_share_and_recompute_grows_as_it_shrinks(model):
    """The rewritten graph (unpinned: pinning adds guard scalars) stashes at most F of the
    no-recompute plan's bytes, and a smaller F never recomputes fewer matmul FLOPs."""
    a = analyse(load_graph(SAMPLES / f"{model}.onnx"))
    base = a.stashed_bytes
    matmul = []
    for share in SHARES:
        plan, record = activation_budget_plan(a, share)
        assert record.no_recompute_bytes == base
        assert record.kept_bytes <= share * base
        assert written(a, rewrite(a, plan, pin=False)).after.stashed_bytes <= share * base, share
        matmul.append(record.recompute_matmul_flops)
    assert matmul == sorted(matmul) and matmul[0] == 0, matmul


def test_activation_budget_takes_the_fewest_matmul_flops_on_the_front(gpt):
    """No corner of the min-cut front that fits the same bytes recomputes fewer matmul FLOPs."""
    problem = mincut.build(gpt)
    for share in (0.5, 0.2):
        _, record = activation_budget_plan(gpt, share)
        fitting = [c for c in mincut.front(problem) if c.kept_bytes <= record.limit_bytes]
        assert fitting and record.recompute_matmul_flops <= min(c.matmul_flops for c in fitting)


@pytest.mark.parametrize("share", [0.55, 0.5])
def test_activation_budget_counts_matmul_flops_before_ckpts_own_cost(share):
    """On a ResNet the two objectives part: at the same byte limit ckpt's own (FLOPs plus
    bytes moved) recomputes the stem conv (7.1 M matmul FLOPs) rather than BatchNorm's
    pointwise ops, as it recomputes the fc Gemm rather than 20 BatchNorms' statistics on
    resnet18_224 at PyTorch's 0.5 and 0.2 (bench/PEER.md). PyTorch's knob weighs matmul
    FLOPs first, so --activation-budget keeps that conv."""
    a = analyse(load_graph(SAMPLES / "resnet18.onnx"))
    _, record = activation_budget_plan(a, share)
    own = mincut.solve_bytes(mincut.build(a), record.limit_bytes)
    assert own is not None and record.kept_bytes <= record.limit_bytes
    assert record.recompute_matmul_flops < own.matmul_flops, (record, own.matmul_flops)


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


@pytest.mark.parametrize("command,extra", [("plan", ("--sweep",)), ("rewrite", ("--no-recompute",))])
def test_activation_budget_refuses_options_that_plan_nothing(command, extra, tmp_path):
    where = ("-o", tmp_path / "x.onnx") if command == "rewrite" else ()
    code, out = run(command, SAMPLES / "gpt.onnx", *where, "--activation-budget", "0.5", *extra)
    assert code == 2 and "--activation-budget" in out and len(out.strip().splitlines()) == 1


@pytest.mark.parametrize("share", ["1.5", "-0.1", "half", "nan"])
def test_activation_budget_outside_zero_one_is_a_usage_error(share):
    code, out = run("plan", SAMPLES / "gpt.onnx", "--activation-budget", share)
    assert code == 2 and "--activation-budget" in out and len(out.strip().splitlines()) == 1


def test_activation_budget_no_cut_reaches_exits_3_in_one_line():
    """Kept MatMul/Gemm outputs cannot be recomputed: 0.6 of the GPT sample's activations
    stay, so 0.5 is unreachable (the code of an unreachable --budget), 0.7 is not."""
    code, out = run("plan", SAMPLES / "gpt.onnx", "--activation-budget", "0.5", "--keep-ops", "MatMul,Gemm")
    assert code == 3 and "unreachable" in out and len(out.strip().splitlines()) == 1
    code, out = run("plan", SAMPLES / "gpt.onnx", "--activation-budget", "0.5", "--keep-ops", "MatMul,Gemm",
                    "--json")
    doc = next(line for line in out.splitlines() if line.startswith("{"))
    assert code == 3 and json.loads(doc)["error"]["exit_code"] == 3
    assert run("plan", SAMPLES / "gpt.onnx", "--activation-budget", "0.7", "--keep-ops", "MatMul,Gemm")[0] == 0


def test_activation_budget_library_refuses_a_share_outside_zero_one(gpt):
    with pytest.raises(ValueError):
        activation_budget_plan(gpt, 1.5)
    with pytest.raises(BudgetUnreachable):
        activation_budget_plan(gpt, 0.5, Policy(keep_ops=frozenset({"MatMul", "Gemm"})))
    with pytest.raises(ValueError, match="--activation-budget"):
        ckpt_cli.plan_model(SAMPLES / "gpt.onnx", activation_budget=-0.5)
    with pytest.raises(TypeError, match="activation_budget"):
        ckpt_cli.plan_model(SAMPLES / "gpt.onnx", activation_budget="0.5")


def test_activation_budget_through_the_library_records_its_choice():
    result = ckpt_cli.plan_model(SAMPLES / "gpt.onnx", activation_budget=0.2)
    record = result.to_json()["activation_budget"]
    assert record["kept_bytes"] <= 0.2 * record["no_recompute_bytes"]
    assert record["kept_share"] == record["kept_bytes"] / record["no_recompute_bytes"]
    assert result.to_json()["options"]["activation_budget"] == 0.2


@pytest.mark.slow
def test_activation_budget_rewrite_passes_its_check(tmp_path):
    out = tmp_path / "gpt.ab.onnx"
    code, text = run("rewrite", SAMPLES / "gpt.onnx", "-o", out, "--activation-budget", "0.5", "--check", "--json")
    assert code == 0, text
    report = json.loads(text)
    assert report["planning"]["activation_budget"]["kept_bytes"] <= report["planning"]["activation_budget"][
        "limit_bytes"]
    assert report["check"]["passed"] and report["after"]["peak_bytes"] < report["before"]["peak_bytes"]
    assert report["check"]["outputs_equal"] and report["options"]["activation_budget"] == 0.5


@pytest.mark.slow
def test_activation_budget_rewrite_through_the_library_passes_its_check():
    """0.2 through rewrite_model: bit-identical outputs on ORT, at most 0.2 of the activations."""
    out = ckpt_cli.rewrite_model(SAMPLES / "gpt.onnx", activation_budget=0.2,
                                 check=ckpt_cli.CheckOptions(provider="cpu", runs=1))
    record = out.report["planning"]["activation_budget"]
    assert out.check.passed and out.check.to_json()["outputs_equal"]
    assert record["kept_bytes"] <= 0.2 * record["no_recompute_bytes"]
    assert out.result.recompute_flops > 0


def test_activation_budget_without_a_milp_answer_takes_the_best_corner_that_fits(gpt, monkeypatch):
    """HiGHS may find nothing in its time limit though a cut fits: the front's corner under
    the limit with the fewest matmul FLOPs, not an 'unreachable' exit."""
    monkeypatch.setattr(mincut, "solve_bytes", lambda *args, **kw: None)
    _, record = activation_budget_plan(gpt, 0.5)
    fitting = [c for c in mincut.front(mincut.build(gpt)) if c.kept_bytes <= record.limit_bytes]
    assert record.kept_bytes <= record.limit_bytes
    assert record.recompute_matmul_flops == min(c.matmul_flops for c in fitting)
