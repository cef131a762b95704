"""``ckpt rewrite --ort-optimize``: the written file holds ORT's fusions, keeps ckpt's tags,
order and guards, and its saving is proved on ONNX Runtime like any rewrite's."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner
from conftest import SAMPLES

import ckpt_cli
from ckpt_cli.analysis.cost import node_flops
from ckpt_cli.analysis.shapes import TensorInfo
from ckpt_cli.cli import main
from ckpt_cli.graph import Node
from ckpt_cli.markers import GUARD_META, RECOMPUTE_META
from ckpt_cli.ops import is_recomputable
from ckpt_cli.io.session import recorded_settings

pytestmark = pytest.mark.slow

GPT = SAMPLES / "gpt.onnx"


@pytest.fixture(scope="module")
def optimized(tmp_path_factory) -> tuple[Path, ckpt_cli.api.RewriteModelResult]:
    out = tmp_path_factory.mktemp("ortopt") / "gpt.opt.onnx"
    # the lowest peak recomputes matmuls, which ORT fuses: the knee recomputes few
    return out, ckpt_cli.rewrite_model(GPT, out, ort_optimize="cpu", auto="min-peak", keep_mem_pattern=False)


@pytest.fixture(scope="module")
def checked(optimized):
    out, _ = optimized
    return ckpt_cli.check_models(GPT, out)


def _meta(node: onnx.NodeProto) -> dict[str, str]:
    return {p.key: p.value for p in node.metadata_props}


def test_written_file_holds_fused_contrib_ops_with_the_rewrites_tags(optimized):
    out, result = optimized
    model = onnx.load(str(out))
    fused = [n for n in model.graph.node if n.domain == "com.microsoft"]
    assert fused and {n.op_type for n in fused} >= {"FusedMatMul"}
    # Fused recompute copies inherited the copy's tags (ORT drops node metadata).
    fused_copies = [n for n in fused if RECOMPUTE_META in _meta(n)]
    assert fused_copies and all("ckpt.region" in _meta(n) for n in fused_copies)
    copies = [n for n in model.graph.node if RECOMPUTE_META in _meta(n)]
    report = result.report
    assert report["recompute_nodes"] == len(copies) > 0
    assert report["ort_optimize"]["fused_ops"]["FusedMatMul"] == sum(n.op_type == "FusedMatMul" for n in fused)
    assert report["ort_optimize"]["not_recomputable"] == {}  # FusedMatMul is deterministic
    meta = {p.key: p.value for p in model.metadata_props}
    assert json.loads(meta["ckpt.ort_optimize"])["level"] == "ORT_ENABLE_EXTENDED"
    assert int(meta["ckpt.recompute_nodes"]) == len(copies)


def test_file_order_is_the_rewrites_schedule(optimized):
    """ORT saves its graph in DEFAULT order; the file ckpt writes is back in the rewrite's:
    forward first, every recompute copy after it, and the predicted order is the file order."""
    out, result = optimized
    names = [n.name for n in onnx.load(str(out)).graph.node]
    a = result.result.after
    assert [a.graph.nodes[i].name for i in a.priority.order] == names
    last_forward = max(i for i, f in enumerate(a.phases.is_forward) if f)
    copies = [n.index for n in a.graph.nodes if n.meta(RECOMPUTE_META) is not None]
    assert copies and min(copies) > last_forward


def test_guards_survive_the_optimization(optimized):
    out, result = optimized
    model = onnx.load(str(out))
    guards = [n for n in model.graph.node if GUARD_META in _meta(n)]
    sizes = [n for n in guards if n.op_type == "Size"]  # ORT folds Shape, never Size
    assert sizes and len(guards) == result.report["ort_optimize"]["guard_nodes_after"]
    assert {p.key: p.value for p in model.metadata_props}["ckpt.pinned"] == str(len(guards))


def test_recorded_settings_run_the_file_as_written(optimized):
    out, _ = optimized
    s = recorded_settings(out)
    assert (s["graph_optimization_level"], s["execution_order"]) == ("ORT_DISABLE_ALL", "PRIORITY_BASED")
    assert s["provider"] == "CPUExecutionProvider" and s["ort_optimize"]["provider"] == "cpu"
    so = ckpt_cli.session_options(out)
    assert so.graph_optimization_level.name == "ORT_DISABLE_ALL"


def test_keeps_the_memory_pattern_switch_and_warns_of_nothing(optimized):
    # ORT's optimized graph keeps ckpt's optional input; the result's fields are the rewrite's
    # own (a positional constructor once shifted the session name into ``warning``).
    out, result = optimized
    model = onnx.load(str(out))
    off = result.result.pattern_off
    assert off is not None and off.input in {v.name for v in model.graph.input}
    assert {p.key: p.value for p in model.metadata_props}["ckpt.mem_pattern_off"] == off.input
    assert result.report["warning"] is None and result.result.session == "ckpt"


def test_loads_back_through_ckpt_with_every_tensor_sized(optimized):
    out, result = optimized
    inspected = ckpt_cli.inspect_model(out)
    assert inspected.analysis.unsized == {}
    assert inspected.report["peak_bytes"] == result.report["after"]["peak_bytes"]


def test_check_passes_against_the_original_at_the_same_level(checked):
    f = checked.figures
    assert f.outputs.reference_level == "ORT_ENABLE_EXTENDED"
    assert f.outputs.unoptimized_vs_rewritten is not None  # the comparison with the unfused original is reported too
    assert f.outputs.equal, f.failures
    assert f.order_matches and f.order.n_not_in_file == 0 and f.order.n_not_executed == 0
    assert abs(f.prediction.tensor_error["rewritten"]) <= 0.10
    assert f.measured.rewritten.peak_bytes < f.measured.original_ort_default.peak_bytes
    assert checked.passed, f.failures


def test_ort_optimize_cuda_without_a_gpu_is_exit_4(tmp_path):
    from ckpt_cli.verify.driver import probe_provider

    if probe_provider("cuda")[0]:
        pytest.skip("a CUDA provider works here")
    out = tmp_path / "gpt.cuda.onnx"
    r = CliRunner().invoke(main, ["rewrite", str(GPT), "-o", str(out), "--ort-optimize", "cuda"])
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 4 and len(lines) == 1 and "--ort-optimize cuda" in lines[0], r.stderr
    assert not out.exists()


def _node(op: str, inputs: list[str], outputs: list[str], domain: str = "", **attrs) -> Node:
    return Node.from_proto(0, onnx.helper.make_node(op, inputs, outputs, domain=domain, **attrs))


def test_fused_ops_are_priced_and_recomputable():
    f32 = onnx.TensorProto.FLOAT
    t = {"a": TensorInfo(f32, (8, 4, 16), 8 * 4 * 16 * 4), "b": TensorInfo(f32, (8, 4, 32), 8 * 4 * 32 * 4),
         "y": TensorInfo(f32, (16, 32), 16 * 32 * 4)}
    fused = _node("FusedMatMul", ["a", "b"], ["y"], "com.microsoft", transA=1)
    assert node_flops(fused, t) == 2 * 16 * 32 * 4  # the contraction runs over A's rows
    assert is_recomputable(fused)
    assert not is_recomputable(_node("BiasDropout", ["a"], ["y"], "com.microsoft"))
    assert not is_recomputable(_node("FusedMatMul", ["a", "b"], ["y"], "com.example"))


def test_external_data_is_written_beside_the_output(tmp_path):
    src = tmp_path / "gpt.onnx"
    onnx.save(onnx.load(str(GPT)), src, save_as_external_data=True, all_tensors_to_one_file=True,
              location="gpt.data", size_threshold=1024)
    out = tmp_path / "out.onnx"
    result = ckpt_cli.rewrite_model(src, out, ort_optimize="cpu")
    data = [p for p in result.written if p.suffix == ".data"]
    assert len(data) == 1 and data[0].parent == tmp_path and data[0].name.startswith("out.onnx.")
    model = onnx.load(str(out))  # resolves the data beside it
    assert any(t.name and t.raw_data for t in model.graph.initializer)
    assert ckpt_cli.inspect_model(out).analysis.unsized == {}


def test_device_copies_ort_writes_for_cuda_are_dropped(tmp_path):
    # ORT's CUDA optimization writes MemcpyToHost/FromHost nodes (not ONNX ops) into the file,
    # renaming the copied tensor (r -> r_CUDAExecutionProvider) and giving the copy its name
    # (as measured on an H200, gpt12). The copies go and every tensor keeps the rewrite's name.
    from onnx import TensorProto, helper

    from ckpt_cli.optimize import _drop_device_copies

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    s = helper.make_tensor_value_info("s", TensorProto.INT64, [])
    nodes = [helper.make_node("Relu", ["x"], ["r_CUDAExecutionProvider"], name="relu"),
             helper.make_node("MemcpyToHost", ["r_CUDAExecutionProvider"], ["r"], name="Memcpy"),
             helper.make_node("Size", ["r"], ["s_cpu"], name="size"),
             helper.make_node("MemcpyFromHost", ["s_cpu"], ["s"], name="Memcpy_token_1"),
             helper.make_node("MemcpyFromHost", ["x"], ["x_copy"], name="Memcpy_token_2"),
             helper.make_node("Neg", ["r"], ["n"], name="neg"),
             helper.make_node("Add", ["n", "x_copy"], ["y"], name="add")]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y, s]),
                              opset_imports=[helper.make_opsetid("", 20)])
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    assert _drop_device_copies(path) == 3
    out = onnx.load(str(path))
    onnx.checker.check_model(out, full_check=True)
    assert [(n.op_type, list(n.input), list(n.output)) for n in out.graph.node] == [
        ("Relu", ["x"], ["r"]), ("Size", ["r"], ["s"]), ("Neg", ["r"], ["n"]), ("Add", ["n", "x"], ["y"])]
    assert _drop_device_copies(path) == 0
