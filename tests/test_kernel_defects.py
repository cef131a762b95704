"""ONNX Runtime kernels known to compute wrongly are named, not planned on in silence.

onnxruntime-training 1.19.2's CPU ConvGrad over one axis with group > 1 writes past its
buffers: a one-node model of it aborts the process with the arena off (measured, 64 in
and out channels, groups 2-64 including depthwise); over two axes it runs clean.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from collections import Counter

import onnx
import pytest
from conftest import ROOT
from onnx import helper

from ckpt_cli.ops import ort_kernel_defects, thread_racing_outputs
from test_ort_training import training_python  # noqa: F401 - the fixture

# sample_models/artifact_zoo.py's keyword_kl with groups=4 in its second Conv1d, made by
# generate_artifacts (onnxruntime-training 1.19.2); its checkpoint is not needed here
GROUPED = ROOT / "tests" / "fixtures" / "grouped_conv1d_training.onnx"


def _conv_grad(group: int, axes: int = 1) -> onnx.NodeProto:
    return helper.make_node("ConvGrad", ["dY", "X", "W"], ["dX", "dW", "dB"], domain="com.microsoft",
                            kernel_shape=[3] * axes, pads=[1] * 2 * axes, strides=[1] * axes, group=group)


def test_a_grouped_1d_conv_grad_is_a_known_defect():
    found = ort_kernel_defects([_conv_grad(4), _conv_grad(64), _conv_grad(1)])
    assert len(found) == 1 and found[0].startswith("2 grouped 1-D ConvGrad node(s)")


def test_ungrouped_and_2d_conv_grads_are_not():
    assert ort_kernel_defects([_conv_grad(1), _conv_grad(4, axes=2), _conv_grad(1, axes=2)]) == []
    plain = helper.make_node("Conv", ["X", "W"], ["Y"], kernel_shape=[3], group=4)
    assert ort_kernel_defects([plain]) == []


def _pool_grad(op: str, name: str) -> onnx.NodeProto:
    return helper.make_node(op, ["dY", "I"], [f"dX_{name}"], name=name, kernel_shape=[2, 2], strides=[2, 2])


def test_pooling_gradients_need_numbers_where_their_kernel_reads_the_declaration():
    """ORT's CPU MaxPoolGrad and AveragePoolGrad size dX from its declared shape: none kills
    the session's making (SIGSEGV), a symbol reads as 0 (MaxPoolGrad's first dimension
    aside, taken from dY at run time)."""
    declared = {f"dX_{k}": helper.make_tensor_value_info(f"dX_{k}", onnx.TensorProto.FLOAT, dims) for k, dims in
                {"batch_first": ["batch", 8, 16, 16], "static": [4, 8, 16, 16], "inner": [4, "unk__1", 16, 16]}.items()}
    assert ort_kernel_defects([_pool_grad("MaxPoolGrad", k) for k in ("batch_first", "static")], declared) == []
    assert ort_kernel_defects([_pool_grad("AveragePoolGrad", "static")], declared) == []
    avg = ort_kernel_defects([_pool_grad("AveragePoolGrad", "batch_first")], declared)
    assert len(avg) == 1 and avg[0].startswith("1 pooling gradient node(s) whose output declares a symbolic")
    inner = ort_kernel_defects([_pool_grad("MaxPoolGrad", "inner"), _pool_grad("MaxPoolGrad", "none")], declared)
    assert [line.split(" (")[0] for line in inner] == [
        "1 pooling gradient node(s) with no shape declared for their output",
        "1 pooling gradient node(s) whose output declares a symbolic dimension"]
    assert "(none)" in inner[0] and "(inner)" in inner[1]


def test_inspect_names_a_pooling_gradient_without_its_declaration(tmp_path):
    from ckpt_cli import inspect_model

    model = onnx.load(ROOT / "sample_models" / "zoo" / "lenet" / "training_model.onnx")
    pooled = {n.output[0] for n in model.graph.node if n.op_type == "MaxPoolGrad"}
    kept = [v for v in model.graph.value_info if v.name not in pooled]
    del model.graph.value_info[:]
    model.graph.value_info.extend(kept)
    onnx.save(model, tmp_path / "undeclared.onnx")
    assert inspect_model(ROOT / "sample_models" / "zoo" / "lenet" / "training_model.onnx").to_json()[
        "ort_kernel_defects"] == []
    found = inspect_model(tmp_path / "undeclared.onnx").to_json()["ort_kernel_defects"]
    assert len(found) == 1 and found[0].startswith(f"{len(pooled)} pooling gradient node(s) with no shape declared")


def test_a_crash_of_such_a_model_names_the_cause(tmp_path):
    from ckpt_cli.errors import RunFailed
    from ckpt_cli.verify.stage import _known_cause

    model = helper.make_model(helper.make_graph([_conv_grad(4)], "g", [], []))
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    crashed = _known_cause(path, RunFailed("crashed", "killed by SIGABRT"))
    assert crashed.startswith("; a known cause: 1 grouped 1-D ConvGrad node(s)")
    assert _known_cause(path, RunFailed("timeout", "ran past 600 s")) == ""


def test_a_crash_names_the_rewrites_defect_where_the_original_has_none(tmp_path, monkeypatch):
    """The pointnet crash: ckpt's rewrite had dropped a declaration the original made, so
    the cause is in the rewritten file only."""
    from ckpt_cli.errors import RunFailed
    from ckpt_cli.verify import driver, stage

    clean, defective = tmp_path / "original.onnx", tmp_path / "rewritten.onnx"
    onnx.save(helper.make_model(helper.make_graph([], "g", [], [])), clean)
    onnx.save(helper.make_model(helper.make_graph([_conv_grad(4)], "g", [], [])), defective)

    def crash(*args):
        raise RunFailed("crashed", "killed by SIGSEGV")

    monkeypatch.setattr(driver, "check_pair", crash)
    with pytest.raises(RunFailed) as e:
        stage._run(clean, defective, tmp_path / "feeds.npz", types.SimpleNamespace(provider="cpu"))
    assert e.value.message.startswith("ONNX Runtime failed (crashed): killed by SIGSEGV; "
                                      "a known cause: 1 grouped 1-D ConvGrad node(s)")


def test_inspect_warns_of_a_grouped_conv1d_artifact():
    r = subprocess.run([sys.executable, "-m", "ckpt_cli.cli", "inspect", GROUPED, "--json"], capture_output=True,
                       text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["ort_kernel_defects"][0].startswith("1 grouped 1-D ConvGrad node(s)")
    text = subprocess.run([sys.executable, "-m", "ckpt_cli.cli", "inspect", GROUPED], capture_output=True, text=True,
                          cwd=ROOT, timeout=300, env=dict(os.environ, NO_COLOR="1")).stdout
    assert "warning: 1 grouped 1-D ConvGrad node(s)" in text


@pytest.mark.slow
def test_check_of_a_grouped_conv1d_artifact_exits_5_naming_the_kernel(training_python, tmp_path):  # noqa: F811
    cli = [sys.executable, "-m", "ckpt_cli.cli"]
    rewritten = tmp_path / "rw.onnx"
    assert subprocess.run([*cli, "rewrite", GROUPED, "-o", rewritten], capture_output=True, cwd=ROOT,
                          timeout=300).returncode == 0
    r = subprocess.run([*cli, "check", GROUPED, rewritten, "--python", training_python, "--provider", "cpu",
                        "--runs", "1"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 5, (r.returncode, r.stderr[-1000:])
    assert "a known cause: 1 grouped 1-D ConvGrad node(s)" in r.stderr and r.stderr.count("\n") <= 2, r.stderr


# --work-around-ort-defects: each grouped 1-D ConvGrad in its 2-D form (rewrite/ort_defects.py)
def _one_node_1d(n: int, c: int, m: int, length: int, k: int, group: int, stride: int, pad: int,
                 dilation: int) -> onnx.ModelProto:
    out_length = (length + 2 * pad - dilation * (k - 1) - 1) // stride + 1
    node = helper.make_node("ConvGrad", ["dY", "X", "W"], ["dX", "dW", "dB"], domain="com.microsoft", name="grad",
                            kernel_shape=[k], pads=[pad, pad], strides=[stride], dilations=[dilation], group=group)
    vi = lambda name, shape: helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, shape)  # noqa: E731
    graph = helper.make_graph([node], "one", [vi("dY", [n, m, out_length]), vi("X", [n, c, length]),
                                              vi("W", [m, c // group, k])],
                              [vi("dX", [n, c, length]), vi("dW", [m, c // group, k]), vi("dB", [m])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                             ir_version=8)


def _conv1d_gradients(dy, x, w, group: int, stride: int, pad: int, dilation: int):
    """dX, dW, dB of y = conv1d(x, w, groups=group) given dL/dy, in float64."""
    import numpy as np

    dy, x, w = (a.astype(np.float64) for a in (dy, x, w))
    m, per_group, k = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad)))
    dxp, dw = np.zeros_like(xp), np.zeros_like(w)
    span = stride * (dy.shape[2] - 1) + 1
    for f in range(m):
        channels = slice(f // (m // group) * per_group, (f // (m // group) + 1) * per_group)
        for j in range(k):
            taps = slice(j * dilation, j * dilation + span, stride)  # the input positions tap j reads
            dw[f, :, j] = np.einsum("no,nco->c", dy[:, f], xp[:, channels, taps])
            dxp[:, channels, taps] += dy[:, f][:, None, :] * w[f, :, j][None, :, None]
    return dxp[:, :, pad:pad + x.shape[2]], dw, dy.sum(axis=(0, 2))


def _run(python: str, model, feeds: dict, folder, *flags: str) -> dict:
    import numpy as np

    folder.mkdir(exist_ok=True)
    path, feeds_path, out = folder / "m.onnx", folder / "feeds.npz", folder / "out.npz"
    onnx.save(model, path) if isinstance(model, onnx.ModelProto) else None
    np.savez(feeds_path, **feeds)
    r = subprocess.run([python, ROOT / "tests" / "fixtures" / "run_outputs.py",
                        path if isinstance(model, onnx.ModelProto) else model, feeds_path, out, *flags],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.returncode, r.stderr[-1000:])
    got = np.load(out)
    return {str(name): got[f"o{k}"] for k, name in enumerate(got["names"])}


def test_the_work_around_writes_each_grouped_1d_conv_grad_in_2d():
    from ckpt_cli.io.load import load_graph
    from ckpt_cli.rewrite.ort_defects import conv_grads_in_2d

    graph = load_graph(GROUPED)
    worked, count = conv_grads_in_2d(graph)
    assert count == 1 and ort_kernel_defects(n.proto for n in worked.nodes) == []
    grads = [n for n in worked.nodes if n.op_type == "ConvGrad"]
    assert sorted(len(n.attr("kernel_shape")) for n in grads) == [1, 1, 2]  # the ungrouped ones stay as they are
    added = Counter(n.op_type for n in worked.nodes) - Counter(n.op_type for n in graph.nodes)
    assert added == {"Unsqueeze": 3, "Squeeze": 2, "Constant": 1}  # dY, X, W in; dX, dW out; their axis
    assert conv_grads_in_2d(worked) == (worked, 0)


@pytest.mark.slow
@pytest.mark.parametrize("sizes", [(2, 8, 8, 16, 3, 4, 1, 1, 1), (3, 64, 64, 33, 3, 64, 2, 1, 1),
                                   (2, 12, 6, 20, 5, 3, 1, 2, 2)], ids=["groups4", "depthwise-stride2", "dilated"])
def test_the_2d_form_runs_with_the_arena_off_and_gives_conv1d_gradients(training_python, tmp_path, sizes):  # noqa: F811
    import numpy as np

    from ckpt_cli.graph import Graph
    from ckpt_cli.rewrite.ort_defects import conv_grads_in_2d

    model = _one_node_1d(*sizes)
    worked, count = conv_grads_in_2d(Graph.from_model(model))
    assert count == 1
    del model.graph.node[:]
    model.graph.node.extend(n.proto for n in worked.nodes)
    rng = np.random.default_rng(0)
    feeds = {v.name: rng.standard_normal([d.dim_value for d in v.type.tensor_type.shape.dim]).astype(np.float32)
             for v in model.graph.input}
    got = _run(training_python, model, feeds, tmp_path / "run", "--arena-off")
    expected = _conv1d_gradients(feeds["dY"], feeds["X"], feeds["W"], *sizes[5:])
    for name, want in zip(("dX", "dW", "dB"), expected):
        assert got[name].shape == want.shape
        assert np.abs(got[name] - want).max() <= 1e-5 * max(1.0, np.abs(want).max()), name


@pytest.mark.slow
def test_a_rewrite_with_the_work_around_trains_the_grouped_conv1d_artifact_as_the_original(training_python,  # noqa: F811
                                                                                            tmp_path):
    """The fixture rewritten with --work-around-ort-defects runs with the arena off (the
    original's kernel writes past its buffers there) and gives the original's loss and
    gradients, run with the arena on, bit for bit."""
    import numpy as np

    rewritten = tmp_path / "rw.onnx"
    r = subprocess.run([sys.executable, "-m", "ckpt_cli.cli", "rewrite", GROUPED, "-o", rewritten,
                        "--work-around-ort-defects", "--json"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["options"]["work_around_ort_defects"] and report["ort_kernel_defects"] == []
    rng = np.random.default_rng(0)
    feeds = {v.name: rng.standard_normal([d.dim_value or 8 for d in v.type.tensor_type.shape.dim]).astype(np.float32)
             for v in onnx.load(GROUPED).graph.input if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT}
    original = _run(training_python, str(GROUPED), feeds, tmp_path / "original", "--gradients")
    worked = _run(training_python, str(rewritten), feeds, tmp_path / "rewritten", "--gradients", "--arena-off")
    assert sum(name.endswith("_grad") for name in original) == 8
    for name, value in original.items():
        assert np.array_equal(worked[name], value), name


def _scatter(reduction: str | None, out: str = "grad") -> onnx.NodeProto:
    extra = {"reduction": reduction} if reduction else {}
    return helper.make_node("ScatterND", ["zeros", "ids", "updates"], [out], **extra)


def test_a_reducing_scatter_taints_the_outputs_downstream_of_it():
    nodes = [_scatter("add", "raw"), helper.make_node("Mul", ["raw", "scale"], ["grad"]),
             helper.make_node("Relu", ["x"], ["other"])]
    assert thread_racing_outputs(nodes, ["other", "grad", "raw"]) == ["grad", "raw"]
    assert thread_racing_outputs([_scatter("max")], ["grad"]) == ["grad"]


def test_a_scatter_that_only_writes_races_with_nothing():
    # reduction none (the default) promises unique indices: each element is written once
    assert thread_racing_outputs([_scatter(None)], ["grad"]) == []
    assert thread_racing_outputs([_scatter("none")], ["grad"]) == []
