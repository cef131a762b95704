"""--dim values ckpt documents are taken as given, contradictions are refused, and the
scaling report states how the peak really grows with the dimensions."""

from __future__ import annotations

import json
import re

import numpy as np
import onnx
import pytest
from chain import chain_model
from click.testing import CliRunner
from conftest import SAMPLES
from onnx import TensorProto, helper, numpy_helper

from ckpt_cli.cli import main
from ckpt_cli.units import human_bytes

ZOO_GPT = SAMPLES / "zoo" / "gpt" / "training_model.onnx"  # labels declared [batch_x_32] beside [batch, 32]


def run(*args) -> tuple[int, str, str]:
    r = CliRunner().invoke(main, [str(a) for a in args])
    return r.exit_code, r.stdout, r.stderr


def _symbolic_chain(tmp_path, width: int, output_dim: bool = False):
    """A small chain with a symbolic batch; with ``output_dim``, an output declared
    [batch, n] where n is the width (a dimension only an output names, not the batch's)."""
    m = chain_model(layers=2, batch=8, width=width)
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    if output_dim:
        m.graph.node.append(helper.make_node("Identity", ["a1"], ["act_out"], name="out_id"))
        m.graph.output.append(helper.make_tensor_value_info("act_out", TensorProto.FLOAT, ["batch", "n"]))
    path = tmp_path / "sym.onnx"
    onnx.save(m, str(path))
    return path


def test_the_largest_documented_dim_is_taken(tmp_path):
    """2**40 is in range: the scaling report at twice it is left out, not refused as 2**41."""
    path = _symbolic_chain(tmp_path, width=1)
    code, out, err = run("inspect", path, "--dim", f"batch={2**40}", "--json")
    assert code == 0, err
    assert json.loads(out)["scaling"] is None
    code, _, err = run("inspect", path, "--dim", f"batch={2**40 + 1}")
    assert code == 2 and f"batch={2**40 + 1}: out of range" in err


def test_an_output_only_dim_given_its_value_is_taken(tmp_path):
    path = _symbolic_chain(tmp_path, width=8, output_dim=True)
    code, out, err = run("inspect", path, "--dim", "batch=8", "--dim", "n=8", "--json")
    assert code == 0, err
    assert json.loads(out)["scaling"]["doubled_dims"] == {"batch": 16}


@pytest.mark.skipif(not ZOO_GPT.exists(), reason="the artifact zoo is not built")
def test_a_dim_that_contradicts_a_tied_one_is_refused():
    code, _, err = run("inspect", ZOO_GPT, "--dim", "batch=2", "--dim", "batch_x_32=65", "-q")
    assert code == 2
    assert err.strip() == ("ckpt: error: --dim batch_x_32=65 contradicts the other dimensions: the loss's labels "
                           "need batch_x_32=64 at batch=2")
    code, _, err = run("inspect", ZOO_GPT, "--dim", "batch=2", "--dim", "batch_x_32=64", "-q")
    assert code == 0, err


def _scores_model(path) -> None:
    """loss = sum(relu(h @ h^T)), h = x @ W, x [batch, 4]: the stashed scores are [batch, batch]."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32), "W")
    make = helper.make_node
    nodes = [make("MatMul", ["x", "W"], ["h"], name="/f/MatMul"), make("Transpose", ["h"], ["hT"], name="/f/T"),
             make("MatMul", ["h", "hT"], ["S"], name="/f/Scores"), make("Relu", ["S"], ["R"], name="/f/Relu"),
             make("ReduceSum", ["R"], ["loss"], keepdims=0, name="/f/Sum"),
             make("Shape", ["R"], ["Rs"], name="/b/Shape"), make("Expand", ["tangent_loss", "Rs"], ["dR"], name="/b/E"),
             make("Sign", ["R"], ["mask"], name="/b/Sign"), make("Mul", ["dR", "mask"], ["dS"], name="/b/Mul"),
             make("MatMul", ["dS", "h"], ["dh1"], name="/b/MM1"), make("Transpose", ["dS"], ["dST"], name="/b/T"),
             make("MatMul", ["dST", "h"], ["dh2"], name="/b/MM2"), make("Add", ["dh1", "dh2"], ["dh"], name="/b/Add"),
             make("Transpose", ["x"], ["xT"], name="/b/Tx"), make("MatMul", ["xT", "dh"], ["W_grad"], name="/b/MMW")]
    graph = helper.make_graph(nodes, "scores", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4]),
                                                helper.make_tensor_value_info("tangent_loss", TensorProto.FLOAT, [])],
                              [helper.make_tensor_value_info("loss", TensorProto.FLOAT, []),
                               helper.make_tensor_value_info("W_grad", TensorProto.FLOAT, [4, 4])], initializer=[w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))


def test_scores_growing_faster_than_the_dims_make_the_fit_not_linear(tmp_path):
    path = tmp_path / "scores.onnx"
    _scores_model(path)
    code, out, err = run("inspect", path, "--json")
    assert code == 0, err
    scaled = json.loads(out)["scaling"]
    assert scaled["faster_activations"] == ["R"] and "R" not in scaled["fixed_activations"]
    assert not scaled["linear"] and scaled["peak_bytes_formula"].startswith("not linear in batch")
    text = run("inspect", path)[1]
    line = next(t for t in text.splitlines() if t.startswith("peak"))
    assert "-" not in line.split(";")[0] and "more than double with batch" in " ".join(text.split())


def test_a_linear_peak_keeps_its_formula(tmp_path):
    code, out, err = run("inspect", _symbolic_chain(tmp_path, width=16), "--dim", "batch=8", "--json")
    scaled = json.loads(out)["scaling"]
    assert code == 0 and scaled["linear"] and not scaled["faster_activations"], scaled
    assert scaled["peak_bytes_formula"].endswith("* batch bytes") and not scaled["peak_bytes_formula"].startswith("-")


def test_the_scaling_line_gives_units_not_raw_bytes(tmp_path):
    """The JSON keeps the formula in bytes; the text line gives its terms in units."""
    path = _symbolic_chain(tmp_path, width=64)
    scaled = json.loads(run("inspect", path, "--dim", "batch=64", "--json")[1])["scaling"]
    p0, p1 = scaled["peak_bytes"]
    line = next(t for t in run("inspect", path, "--dim", "batch=64")[1].splitlines() if t.startswith("peak ="))
    assert line.startswith(f"peak = {human_bytes(2 * p0 - p1)} + {human_bytes((p1 - p0) / 64)} * batch;"), line
    assert not re.search(r"\d{4,}", line.split(";")[0]), line
    path = tmp_path / "scores.onnx"
    _scores_model(path)
    line = next(t for t in run("inspect", path)[1].splitlines() if t.startswith("peak not"))
    assert line.startswith("peak not linear in batch: ") and " at twice them (x" in line, line
    assert not re.search(r"\d{4,}", line.split(";")[0]), line


ZOO_LENET = SAMPLES / "zoo" / "lenet" / "training_model.onnx"


@pytest.mark.parametrize("command", ["plan", "rewrite"])
def test_a_budget_the_doubled_dims_cannot_meet_still_plans_the_given_ones(tmp_path, command):
    """An absolute --budget that fits at the model's dims but not at twice them (the scaling
    line's second plan) plans the given dims and says the doubled ones do not fit."""
    ort_peak = json.loads(run("plan", ZOO_LENET, "--json")[1])["ort_peak_bytes_before"]
    budget = f"{ort_peak // 1024}KiB"  # met at batch 64, far below the floor at 128
    out = ["-o", tmp_path / "lenet.onnx"] if command == "rewrite" else []
    code, stdout, stderr = run(command, ZOO_LENET, "--budget", budget, "--json", *out)
    assert code == 0, stderr
    report = json.loads(stdout)
    after = report["ort_peak_bytes_after"] if command == "plan" else report["after"]["ort_peak_bytes"]
    assert after <= ort_peak
    assert "unreachable" in report["scaling"]["budget_unreachable_at_doubled_dims"]
    assert report["scaling"]["same_plan_at_doubled_dims"] is False
    code, stdout, _ = run(command, ZOO_LENET, "--budget", budget, *([] if command == "plan" else
                                                                     ["-o", tmp_path / "t.onnx"]))
    assert code == 0 and "no plan fits the budget at batch = 128" in stdout


@pytest.mark.parametrize("command", ["plan", "rewrite"])
def test_the_plan_at_doubled_dims_is_the_same_made_beside_the_command_or_after_it(tmp_path, command, monkeypatch):
    """The plan at twice the dims is made in a forked child beside the command's own plan
    (``ckpt_cli/background.py``) where one can run; ``CKPT_SERIAL=1`` makes it after it.
    The reports are the same, the zoo GPT's plan holding at twice its batch among them."""
    from ckpt_cli import background

    reports = []
    for serial in ("0", "1"):
        monkeypatch.setenv("CKPT_SERIAL", serial)
        made = []
        monkeypatch.setattr(background, "_start",
                            lambda work, start=background._start: made.append(work.__qualname__) or start(work))
        out = ["-o", tmp_path / f"gpt{serial}.onnx"] if command == "rewrite" else []
        code, stdout, stderr = run(command, ZOO_GPT, "--json", *out)
        assert code == 0, stderr
        doubled = [name for name in made if name.startswith("_again.")]  # the file's checks have children too
        assert doubled == (["_again.<locals>.work"] if serial == "0" and background.can_fork() else [])
        reports.append(json.loads(stdout)["scaling"])
    assert reports[0] == reports[1]
    assert reports[0]["same_plan_at_doubled_dims"] is True
