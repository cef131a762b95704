"""onnx's checker and ORT's load of a file run in a forked child while the command analyses
it (``io.load.open_graph``): the same refusals as when they run in line, given before any
error that came after them, and the parent's own check, on the file read again, where the
child gives nothing back. ORT's expansion of function ops is asked in a child too: a
command that needs ORT for nothing else never imports it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import helper, numpy_helper

from ckpt_cli import background
from ckpt_cli.api import inspect_model
from ckpt_cli.background import can_fork
from ckpt_cli.cli import main
from ckpt_cli.errors import ModelError
from ckpt_cli.io import load
from ckpt_cli.io.load import load_graph, open_graph
from ckpt_cli.ort import expand
from conftest import SAMPLES

# Its SoftmaxCrossEntropyLoss is expanded in place after loading (221 -> 309 nodes): the
# parent's graph is spent by the time the acceptance is asked for.
EXPANDED = SAMPLES / "zoo" / "capsules" / "training_model.onnx"
REFUSED_WORDS = "ONNX Runtime refuses the model"


def _refused(folder: Path) -> Path:
    """EXPANDED with a node only ORT refuses: onnx's checker and ckpt's analysis pass it."""
    model = onnx.load(EXPANDED)
    x = next(v for v in model.graph.input if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT)
    shape = [d.dim_value or d.dim_param for d in x.type.tensor_type.shape.dim]
    model.graph.node.append(helper.make_node("LayerNormalization", [x.name, "scale"], ["normed"], axis=7,
                                             name="ln_axis"))
    model.graph.initializer.append(numpy_helper.from_array(np.ones(shape[-1:], np.float32), "scale"))
    model.graph.output.append(helper.make_tensor_value_info("normed", onnx.TensorProto.FLOAT, shape))
    path = folder / "refused.onnx"
    onnx.save(model, path)
    return path


def _inspect(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["inspect", *args])
    return result.exit_code, result.output


@pytest.fixture
def beside(monkeypatch) -> None:
    """ORT's work goes to children here too, though this process has imported ORT (which
    keeps it in line otherwise: ``ort.asked_in_a_child``)."""
    monkeypatch.setattr(load, "asked_in_a_child", background.can_fork)
    monkeypatch.setattr(expand, "asked_in_a_child", background.can_fork)


@pytest.fixture
def children(monkeypatch) -> list[int]:
    """The children started beside the command, counted."""
    started: list[int] = []
    start = background._start

    def counted(work):
        child = start(work)
        started.extend([child[0]] if child else [])
        return child

    monkeypatch.setattr(background, "_start", counted)
    return started


def test_the_model_loads_as_it_did_in_line():
    assert len(load_graph(EXPANDED).nodes) > len(onnx.load(EXPANDED).graph.node)


def test_a_refusal_is_the_same_from_the_child_and_in_line(tmp_path, monkeypatch, beside, children):
    path = _refused(tmp_path)
    from_child = _inspect(str(path))
    assert children or not can_fork()
    monkeypatch.setenv("CKPT_SERIAL", "1")
    in_line = _inspect(str(path))
    assert from_child == in_line
    assert from_child[0] == 2 and REFUSED_WORDS in from_child[1] and "ln_axis" in from_child[1], from_child


def test_the_library_raises_the_refusal(tmp_path, beside):
    with pytest.raises(ModelError, match=REFUSED_WORDS):
        inspect_model(_refused(tmp_path))


def _reversed(folder: Path) -> Path:
    """EXPANDED with its nodes in reverse: ckpt sorts them, and gives the checker a sorted copy."""
    model = onnx.load(EXPANDED)
    nodes = list(model.graph.node)[::-1]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    path = folder / "reversed.onnx"
    onnx.save(model, path)
    return path


@pytest.mark.parametrize("refused", [False, True])
def test_a_silent_child_leaves_the_check_to_the_parent(tmp_path, monkeypatch, beside, refused):
    """A child that dies without a word: the parent checks the file, read again (its own
    graph was expanded in place, and its sorted order no longer fits it), and decides as
    the child would have."""
    path = _refused(tmp_path) if refused else _reversed(tmp_path)
    expected = _inspect(str(path), "--json")
    monkeypatch.setattr(background, "_run_child", lambda work, write: os.close(write))
    assert _inspect(str(path), "--json") == expected
    assert expected[0] == (2 if refused else 0), expected


def test_the_refusal_comes_before_an_analysis_error(tmp_path, beside):
    code, out = _inspect(str(_refused(tmp_path)), "--dim", "nosuch=3")
    assert code == 2 and REFUSED_WORDS in out and "no such symbolic dimension" not in out, out


def test_the_refusal_comes_before_an_output_error(tmp_path, beside):
    path = _refused(tmp_path)
    taken = tmp_path / "out.onnx"
    taken.write_bytes(b"")
    result = CliRunner().invoke(main, ["rewrite", str(path), "-o", str(taken)])
    assert result.exit_code == 2 and REFUSED_WORDS in result.output, result.output


@pytest.mark.skipif(not can_fork(), reason="children run beside the command on Linux with more than one core")
@pytest.mark.parametrize("model", ["gpt.onnx", "zoo/capsules/training_model.onnx"])
def test_the_command_leaves_ort_to_its_children(model):
    """capsules' SoftmaxCrossEntropyLoss goes to ORT to be expanded; both files to ORT to be
    accepted: ORT's import, environment and sessions stay out of the command's process."""
    script = ("import sys\nfrom ckpt_cli.cli import main\ntry:\n    main(sys.argv[1:], standalone_mode=False)\n"
              "except SystemExit:\n    pass\nprint('onnxruntime' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", script, "inspect", str(SAMPLES / model), "--json"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip().endswith("False"), run.stderr[-2000:]


def test_a_process_that_imported_ort_keeps_the_work_in_line(tmp_path, children):
    """Where ORT is imported already (as in this test process) nothing forks: the refusal
    comes from the load itself, the expansion is asked here."""
    import onnxruntime  # noqa: F401 - the premise: ORT is in this process

    with pytest.raises(ModelError, match=REFUSED_WORDS):
        open_graph(_refused(tmp_path))
    graph, acceptance = open_graph(EXPANDED)
    acceptance.confirm()
    assert children == [] and len(graph.nodes) > len(onnx.load(EXPANDED).graph.node)
