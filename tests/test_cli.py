"""The command line as CI scripts use it: JSON contracts, exit codes, files written."""

from __future__ import annotations

import hashlib
import json

import onnx
import pytest
from click.testing import CliRunner

from conftest import SAMPLES
from ckpt_cli.cli import main
from ckpt_cli.markers import is_recompute_copy

INSPECT_KEYS = {"forward_nodes", "backward_nodes", "phases", "stashed_bytes", "resident_bytes", "peak_bytes",
                "peak_bytes_ort_default", "forward_flops", "backward_flops"}
REWRITE_KEYS = {"output", "regions", "before", "after", "recompute_nodes", "recompute_flops", "forward_flops"}
CHECK_KEYS = {"provider", "outputs_equal", "max_abs_diff", "original", "rewritten", "original_ort_default",
              "order_matches", "predicted", "prediction_error"}


def run(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.output


def sha(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def graph_sha(path) -> str:
    import onnx

    return hashlib.sha256(onnx.load(str(path)).graph.SerializeToString(deterministic=True)).hexdigest()


@pytest.mark.parametrize("model", ["mlp.onnx", "gpt.onnx", "cnn.onnx", "ort_artifact/training_model.onnx"])
def test_inspect_json_contract(model):
    code, out = run("inspect", SAMPLES / model, "--json")
    assert code == 0, out
    r = json.loads(out)
    assert INSPECT_KEYS <= set(r)
    assert r["forward_nodes"] + r["backward_nodes"] == len(r["phases"])
    assert set(r["phases"].values()) == {"forward", "backward"}
    assert r["peak_bytes"] > r["resident_bytes"] > 0 and r["stashed_bytes"] > 0
    assert r["forward_flops"] > 0 and r["backward_flops"] > 0


def test_inspect_terminal_report_reads_in_80_columns():
    code, out = run("inspect", SAMPLES / "gpt.onnx")
    assert code == 0
    assert "Top stashed activations" in out and "blocks.3" in out
    chart = out[out.index("Memory over"):].splitlines()[1:13]
    assert all(len(line) <= 80 for line in chart)
    assert any("|" in line for line in chart[-2:]) and "^" in chart[-2]


def test_rewrite_json_contract_and_files(tmp_path):
    src = SAMPLES / "gpt.onnx"
    before = sha(src)
    out = tmp_path / "gpt.ckpt.onnx"
    code, text = run("rewrite", src, "-o", out, "--json")
    assert code == 0, text
    r = json.loads(text)
    assert REWRITE_KEYS <= set(r)
    assert {"peak_bytes", "stashed_bytes", "nodes"} <= set(r["before"]) & set(r["after"])
    assert {f"blocks.{i}" for i in range(4)} <= {x["name"] for x in r["regions"]}
    assert r["after"]["peak_bytes"] < r["before"]["peak_bytes"]
    assert sha(src) == before, "the input must never be modified"
    m = onnx.load(out)
    onnx.checker.check_model(m, full_check=True)
    assert m.ir_version <= 10
    assert not list(tmp_path.glob(".*.tmp")), "no temporary file may be left behind"
    import os
    import stat

    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~mask, "written files get the usual permissions"

    code, text = run("rewrite", src, "-o", out)
    assert code == 2 and "--force" in text
    first = sha(out)
    code, _ = run("rewrite", src, "-o", out, "--force", "-q")
    assert code == 0 and sha(out) == first, "the same command twice must give byte-identical files"


def test_rewrite_refuses_to_overwrite_its_input(tmp_path):
    copy = tmp_path / "m.onnx"
    copy.write_bytes((SAMPLES / "mlp.onnx").read_bytes())
    code, out = run("rewrite", copy, "-o", copy, "--force")
    assert code == 2 and "input" in out


def test_default_output_name(tmp_path):
    copy = tmp_path / "mlp.onnx"
    copy.write_bytes((SAMPLES / "mlp.onnx").read_bytes())
    code, out = run("rewrite", copy, "-q")
    assert code == 0, out
    assert (tmp_path / "mlp.ckpt.onnx").exists()


@pytest.mark.parametrize("args,needle", [
    (["--region", "nothing_matches_*"], "matches no forward node"),
    (["--boundary", "nosuch:loss"], "no tensor named 'nosuch'"),
    (["--regions-by-scope", "zzz(\\d+)"], "matches no forward node"),
    (["--region", "a", "--regions-by-scope", "b(\\d)"], "one of"),
])
def test_region_errors_name_the_problem(tmp_path, args, needle):
    code, out = run("rewrite", SAMPLES / "gpt.onnx", "-o", tmp_path / "x.onnx", *args)
    assert code == 2 and needle in out and len(out.strip().splitlines()) == 1, out


def test_region_options_and_plan_round_trip(tmp_path):
    src = SAMPLES / "gpt.onnx"
    code, text = run("rewrite", src, "-o", tmp_path / "a.onnx", "--regions-by-scope", r"blocks\.(\d+)", "--json")
    assert code == 0, text
    by_scope = json.loads(text)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(by_scope["plan"]))
    code, text = run("rewrite", src, "-o", tmp_path / "b.onnx", "--plan", plan, "--json")
    assert code == 0, text
    assert json.loads(text)["after"]["peak_bytes"] == by_scope["after"]["peak_bytes"]
    # The same graph; the files differ only in the options recorded in their provenance.
    assert graph_sha(tmp_path / "a.onnx") == graph_sha(tmp_path / "b.onnx")

    code, text = run("rewrite", src, "-o", tmp_path / "c.onnx", "--region", "re:^node_(mm|addmm)", "--json")
    assert code == 0, text
    code, text = run("rewrite", src, "-o", tmp_path / "d.onnx", "--no-recompute", "--json")
    r = json.loads(text)
    assert code == 0 and r["recompute_nodes"] == 0 and r["after"]["nodes"] == r["before"]["nodes"]
    assert r["after"]["stashed_bytes"] <= r["before"]["stashed_bytes"]


def test_rewriting_a_rewritten_graph_nests_nothing(tmp_path):
    once, twice = tmp_path / "once.onnx", tmp_path / "twice.onnx"
    assert run("rewrite", SAMPLES / "gpt.onnx", "-o", once, "-q")[0] == 0
    code, text = run("rewrite", once, "-o", twice, "--json")
    assert code == 0, text
    names = [n.name for n in onnx.load(twice).graph.node]
    assert not any(n.endswith("_recompute_recompute") for n in names)


def test_check_json_contract_and_corrupted_rewrite(tmp_path):
    src = SAMPLES / "mlp.onnx"
    out = tmp_path / "mlp.ckpt.onnx"
    assert run("rewrite", src, "-o", out, "--auto", "layers", "-q")[0] == 0  # the default only reorders mlp
    code, text = run("check", src, out, "--json", "--runs", "1", "--provider", "cpu")
    assert code == 0, text
    r = json.loads(text)
    assert CHECK_KEYS <= set(r)
    assert r["outputs_equal"] and r["order_matches"] and r["provider"] == "cpu"
    assert {"peak_bytes", "time_s"} <= set(r["original"]) & set(r["rewritten"]) & set(r["original_ort_default"])

    broken = onnx.load(out)  # a wrong rewrite: one recompute copy computes something else
    copy = next(n for n in broken.graph.node if is_recompute_copy(n) and n.op_type == "Gemm")
    copy.op_type, copy.input[:] = "MatMul", list(copy.input[:2])
    for a in list(copy.attribute):
        copy.attribute.remove(a)
    bad = tmp_path / "broken.onnx"
    onnx.save(broken, bad)
    code, text = run("check", src, bad, "--json", "--runs", "1", "--provider", "cpu")
    assert code == 1, text
    assert json.loads(text)["outputs_equal"] is False


def test_cuda_unavailable_is_exit_4(tmp_path):
    from ckpt_cli.verify import probe_provider

    if probe_provider("cuda")[0]:
        pytest.skip("a GPU is available here")
    code, out = run("check", SAMPLES / "mlp.onnx", SAMPLES / "mlp.onnx", "--provider", "cuda", "--runs", "1")
    assert code == 4 and "cuda" in out.lower() and len(out.strip().splitlines()) == 1, out


def test_rewrite_can_turn_ort_buffer_reuse_off(tmp_path):
    """On the GPT sample ORT's planner would park freed buffers for later same-shape
    tensors; ckpt predicts less with enable_mem_reuse off, records it in the model, and the
    check runs both graphs that way (and measures the prediction)."""
    out = tmp_path / "gpt.ckpt.onnx"
    code, text = run("rewrite", SAMPLES / "gpt.onnx", "-o", out, "--check", "--runs", "1", "--provider", "cpu",
                     "--json")
    assert code == 0, text
    r = json.loads(text)
    assert r["enable_mem_reuse"] is False and "so.enable_mem_reuse = False" in r["session_settings"]
    assert r["check"]["enable_mem_reuse"] is False
    meta = {p.key: p.value for p in onnx.load(out).metadata_props}
    assert meta["ckpt.enable_mem_reuse"] == "0"
    assert all(abs(e) <= 0.05 for e in r["check"]["prediction_error_in_use"].values())
    inspected = json.loads(run("inspect", out, "--json")[1])
    assert inspected["peak_bytes"] == r["after"]["peak_bytes"]


def test_version_and_help_load_neither_onnx_nor_the_planner():
    # the CLI's own module and its options' names only: `ckpt --version` answered in 0.045 s
    # so, against 0.134 s with onnx and the planner loaded by its imports
    import subprocess
    import sys

    probe = ("import sys, ckpt_cli.cli.main; "
             "print(sorted(m for m in ('onnx', 'numpy', 'ckpt_cli.planning', 'ckpt_cli.analysis', 'ckpt_cli.graph') "
             "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
