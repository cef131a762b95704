"""The library API (ckpt_cli.api): in-memory models, results equal to the commands' JSON,
and a check whose verdict fails when a premise of the saving fails."""

from __future__ import annotations

import json
import re

import onnx
import pytest
from click.testing import CliRunner
from conftest import ROOT, SAMPLES

import ckpt_cli
from ckpt_cli.cli import main
from ckpt_cli.markers import is_recompute_copy

pytestmark = pytest.mark.slow


def cli_json(*args) -> tuple[int, dict]:
    r = CliRunner().invoke(main, [str(a) for a in args] + ["--json"])
    return r.exit_code, json.loads(r.stdout) if r.stdout.strip().startswith("{") else {"output": r.output}


def test_public_names_are_exported():
    for name in ("inspect_model", "plan_model", "rewrite_model", "check_models", "session_options"):
        assert callable(getattr(ckpt_cli, name)), name
        assert name in ckpt_cli.__all__


def test_in_memory_rewrite_touches_no_disk_and_its_check_measures_the_rewrite(tmp_path, monkeypatch):
    """The false pass this replaces: a rewritten graph kept the original's path, so
    checking it in memory ran the original twice and reported identical peaks."""
    monkeypatch.chdir(tmp_path)
    model = onnx.load(str(SAMPLES / "gpt.onnx"))
    before = model.SerializeToString(deterministic=True)
    result = ckpt_cli.rewrite_model(model, auto="min-peak")
    assert list(tmp_path.iterdir()) == []  # nothing written
    assert model.SerializeToString(deterministic=True) == before  # the caller's model untouched
    assert result.written == [] and result.to_json()["output"] is None
    assert len(result.model.graph.node) != len(model.graph.node)  # recompute copies are in it

    check = ckpt_cli.check_models(model, result.model, options=ckpt_cli.CheckOptions(runs=1))
    f = check.figures
    assert check.passed, f.failures
    assert f.outputs.equal and f.order_matches
    # Two different graphs were measured: the rewrite's peak is its own, and below.
    assert f.measured.rewritten.peak_bytes < f.measured.original.peak_bytes
    assert f.measured.rewritten.peak_requested_bytes == f.prediction.tensor_bytes["rewritten"]
    assert check.to_json()["model"] == "<in-memory model>"


def test_api_results_equal_the_commands_json(tmp_path):
    code, cli = cli_json("inspect", SAMPLES / "mlp.onnx")
    assert code == 0
    api = ckpt_cli.inspect_model(SAMPLES / "mlp.onnx").to_json()
    assert json.loads(json.dumps(api)) == cli

    out = tmp_path / "gpt.ckpt.onnx"
    code, cli = cli_json("rewrite", SAMPLES / "gpt.onnx", "-o", out)
    assert code == 0
    api = ckpt_cli.rewrite_model(SAMPLES / "gpt.onnx", out, force=True).to_json()
    assert json.loads(json.dumps(api)) == cli


def test_written_model_records_its_provenance(tmp_path):
    out = tmp_path / "gpt.ckpt.onnx"
    result = ckpt_cli.rewrite_model(SAMPLES / "gpt.onnx", out, budget="75%")
    meta = {p.key: p.value for p in onnx.load(str(out), load_external_data=False).metadata_props}
    assert meta["ckpt.version"] == ckpt_cli.__version__
    assert json.loads(meta["ckpt.options"])["budget"] == "75%"
    assert int(meta["ckpt.recompute_nodes"]) == result.result.recompute_nodes
    assert int(meta["ckpt.predicted_peak_bytes"]) == result.result.after.priority.peak_bytes
    assert meta["ckpt.enable_mem_reuse"] in ("0", "1")


def test_check_fails_when_ort_runs_nodes_that_are_not_in_the_file(tmp_path):
    """One backward node of a rewrite wrapped in a local ONNX function: ORT expands it
    into nodes of its own at session creation. Outputs are equal and memory is lower, yet
    the schedule ckpt simulated is not what ran, so the check fails; the nodes ORT added
    are named (tolerated themselves: the peak stays within the prediction error)."""
    src = SAMPLES / "mlp.onnx"
    out = tmp_path / "mlp.ckpt.onnx"
    ckpt_cli.rewrite_model(src, out)
    m = onnx.load(str(out))
    k, node = next((k, n) for k, n in enumerate(m.graph.node) if n.op_type == "Mul" and not n.attribute)
    body = onnx.helper.make_node("Mul", ["a", "b"], ["c"], name="inner_mul")
    m.functions.append(onnx.helper.make_function("local.test", "WrappedMul", ["a", "b"], ["c"], [body],
                                                 [onnx.helper.make_opsetid("", 17)]))
    m.opset_import.append(onnx.helper.make_opsetid("local.test", 1))
    wrapped = onnx.helper.make_node("WrappedMul", list(node.input), list(node.output), name=node.name,
                                    domain="local.test")
    m.graph.node.remove(node)
    m.graph.node.insert(k, wrapped)
    broken = tmp_path / "broken.onnx"
    onnx.save(m, str(broken))

    result = ckpt_cli.check_models(src, broken)
    assert result.figures.outputs.equal
    assert result.figures.order.n_not_in_file > 0
    assert not result.passed
    assert "ran_every_file_node" in result.figures.codes, result.figures.failures
    assert "ran_only_file_nodes_tolerated" in result.figures.codes, result.figures.notes
    assert any("not in the file (Mul x1" in n for n in result.figures.notes), result.figures.notes
    code, report = cli_json("check", src, broken)
    assert code == 1 and report["passed"] is False


def test_readme_library_example_runs(tmp_path, monkeypatch):
    """The commands reference's library example, run as written (from the repository root)."""
    text = (ROOT / "docs" / "commands.md").read_text()
    block = re.search(r"### Library\n.*?```python\n(.*?)```", text, re.S)
    assert block, "docs/commands.md has a '### Library' section with a python example"
    monkeypatch.chdir(ROOT)
    namespace: dict = {}
    exec(compile(block.group(1), "docs/commands.md", "exec"), namespace)  # noqa: S102 - our own docs
    assert namespace["check"].passed


def test_recompute_tensors_carry_type_and_shape():
    result = ckpt_cli.rewrite_model(SAMPLES / "gpt.onnx")
    typed = {v.name: v for v in result.model.graph.value_info}
    copies = [n for n in result.model.graph.node if is_recompute_copy(n)]
    assert copies
    for node in copies:
        for t in node.output:
            if t:
                assert t in typed, f"{t} has no value_info"
                assert typed[t].type.tensor_type.elem_type != 0
    onnx.checker.check_model(result.model)


def test_session_command_and_helper_give_the_recorded_settings(tmp_path):
    out = tmp_path / "gpt.ckpt.onnx"
    result = ckpt_cli.rewrite_model(SAMPLES / "gpt.onnx", out)
    r = CliRunner().invoke(main, ["session", str(out)])
    assert r.exit_code == 0, r.output
    assert repr(str(out)) in r.stdout  # the snippet names the real output
    namespace: dict = {}
    exec(r.stdout, namespace)  # noqa: S102 - our own snippet
    so = ckpt_cli.session_options(out)
    import onnxruntime as ort

    assert so.execution_order == ort.ExecutionOrder.PRIORITY_BASED
    assert so.enable_mem_reuse == result.result.mem_reuse == namespace["so"].enable_mem_reuse
    assert namespace["session"].get_providers()[0] == "CPUExecutionProvider"
    r = CliRunner().invoke(main, ["session", str(SAMPLES / "gpt.phases.json")])
    assert r.exit_code == 2 and "not a readable ONNX model" in r.stderr


@pytest.mark.xfail(strict=True, reason="the pinned knee plan of gpt is predicted 72 bytes above ORT's requested "
                                       "peak (exact unpinned): ORT keeps pin's Constant zeros as session "
                                       "initializers, ckpt counts them as run buffers (test_fresh bounds it by 1 KiB)")
def test_the_pinned_knee_plan_is_predicted_to_the_byte():
    model = onnx.load(str(SAMPLES / "gpt.onnx"))
    result = ckpt_cli.rewrite_model(model)
    check = ckpt_cli.check_models(model, result.model, options=ckpt_cli.CheckOptions(runs=1))
    assert check.figures.rewritten.peak_requested_bytes == check.figures.predicted["rewritten"]


def test_written_model_names_ckpt_as_producer_and_keeps_the_source(tmp_path):
    """Tools that read producer_name/producer_version (Netron, model registries) see ckpt's;
    the exporter that made the original stays in the metadata, through a second rewrite too."""
    from ckpt_cli.markers import SOURCE_PRODUCER_META
    from ckpt_cli.version import __version__

    source = onnx.load(str(SAMPLES / "gpt.onnx"), load_external_data=False)
    first, second = tmp_path / "a.onnx", tmp_path / "b.onnx"
    ckpt_cli.rewrite_model(SAMPLES / "gpt.onnx", first)
    ckpt_cli.rewrite_model(first, second)
    for path in (first, second):
        m = onnx.load(str(path), load_external_data=False)
        assert (m.producer_name, m.producer_version) == ("ckpt", __version__)
        meta = {p.key: p.value for p in m.metadata_props}
        assert meta[SOURCE_PRODUCER_META] == f"{source.producer_name} {source.producer_version}"
        assert source.producer_name == "pytorch"


def test_a_rewrite_keeps_none_of_the_searchs_unpinned_rewrites():
    """The search's own rewrite of the plan (a graph of the model's size) is spent once the
    written one is made from it: kept, it stayed alive through building and saving the model."""
    result = ckpt_cli.rewrite_model(SAMPLES / "gpt.onnx")
    planned = result.planned
    assert planned is not None and planned.plan is not None and planned.plan.regions
    assert planned.result is None
    assert all(r is None for _, _, r in (*planned.beyond, *planned.fallbacks))
