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

import onnx
import pytest
from conftest import ROOT
from onnx import helper

from ckpt_cli.ops import ort_kernel_defects
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


def test_a_crash_of_such_a_model_names_the_cause(tmp_path):
    from ckpt_cli.errors import RunFailed
    from ckpt_cli.verify.stage import _known_cause

    model = helper.make_model(helper.make_graph([_conv_grad(4)], "g", [], []))
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    crashed = _known_cause(path, RunFailed("crashed", "killed by SIGABRT"))
    assert crashed.startswith("; a known cause: 1 grouped 1-D ConvGrad node(s)")
    assert _known_cause(path, RunFailed("timeout", "ran past 600 s")) == ""


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
