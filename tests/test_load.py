"""Bad input gets one clear line and exit code 2, never a traceback."""

import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper

from chain import chain_model
from ckpt_cli.cli import main
from ckpt_cli.errors import ModelError
from ckpt_cli.io.load import load_graph


def run_cli(*args):
    result = CliRunner().invoke(main, list(map(str, args)))
    return result.exit_code, result.output


def _bad_files(tmp_path):
    good = tmp_path / "good.onnx"
    onnx.save(chain_model(), good)
    raw = good.read_bytes()
    (tmp_path / "truncated.onnx").write_bytes(raw[: len(raw) // 2])
    (tmp_path / "text.onnx").write_text("this is not a model\n" * 20)
    (tmp_path / "empty.onnx").write_bytes(b"")
    cyc = helper.make_graph(
        [helper.make_node("Relu", ["b"], ["a"], name="r1"), helper.make_node("Relu", ["a"], ["b"], name="r2")],
        "cyc", [], [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1])])
    onnx.save(helper.make_model(cyc), tmp_path / "cycle.onnx")
    fwd = helper.make_graph([helper.make_node("Relu", ["x"], ["loss"], name="r")], "inference",
                            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                            [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [2])])
    # an IR version and opset ONNX Runtime supports: it validates every model ckpt loads
    onnx.save(helper.make_model(fwd, ir_version=8, opset_imports=[helper.make_opsetid("", 17)]),
              tmp_path / "inference.onnx")


@pytest.mark.parametrize("name,words", [
    ("missing.onnx", "no such file"),
    ("truncated.onnx", "not a readable ONNX model"),
    ("text.onnx", "ONNX model"),
    ("empty.onnx", "empty file"),
    ("cycle.onnx", "cycle"),
    ("inference.onnx", "no backward part"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, name, words):
    _bad_files(tmp_path)
    code, out = run_cli("inspect", tmp_path / name)
    assert code == 2, out
    lines = out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ckpt: error:"), out
    assert words in lines[0]
    assert "Traceback" not in out


def test_debug_shows_traceback(tmp_path):
    _bad_files(tmp_path)
    code, out = run_cli("--debug", "inspect", tmp_path / "cycle.onnx")
    assert code == 2 and "Traceback" in out


def test_unknown_dim_is_usage_error(chain_path):
    code, out = run_cli("inspect", chain_path, "--dim", "nosuch=3")
    assert code == 2 and "no such symbolic dimension" in out


def test_missing_external_data_is_named(tmp_path):
    import numpy as np

    model = chain_model()  # its weights are inputs: add a real initializer to externalise
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.zeros((64, 64), np.float32), "big"))
    onnx.save(model, tmp_path / "ext.onnx", save_as_external_data=True, location="ext.data", size_threshold=0)
    load_graph(tmp_path / "ext.onnx")
    (tmp_path / "ext.data").unlink()
    with pytest.raises(ModelError, match="ext.data"):
        load_graph(tmp_path / "ext.onnx")


def _heavy_model(tmp_path, name: str, *, cut: int = 0, op: str = "MatMul", ir: int = 8, declared: bool = True):
    """x @ W with W embedded and over 1 MiB (the checker gets it as a typed input);
    ``cut`` bytes off its raw_data."""
    import numpy as np
    from onnx import numpy_helper

    w = numpy_helper.from_array(np.ones((600, 600), np.float32), "W")
    if cut:
        w.raw_data = w.raw_data[:-cut]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 600])]
    if declared and ir < 4:
        inputs.append(helper.make_tensor_value_info("W", TensorProto.FLOAT, [600, 600]))
    g = helper.make_graph([helper.make_node(op, ["x", "W"], ["y"], name="mm")], "g", inputs,
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 600])], [w])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17 if ir >= 8 else 9)])
    model.ir_version = ir
    path = tmp_path / name
    onnx.save(model, path)
    return path


def test_big_embedded_weights_are_checked_without_the_checker_copying_them(tmp_path):
    """Embedded weights over 1 MiB reach onnx.checker as typed inputs (it serialized the
    model with them, holding the weights three times over); what it checked of them is
    checked here: a raw_data too short for its shape is refused in one line, and the rest
    of the graph is still the checker's to refuse."""
    graph = load_graph(_heavy_model(tmp_path, "ok.onnx"))
    assert graph.initializers["W"].dims == [600, 600]
    with pytest.raises(ModelError, match="tensor 'W' needs 1440000 bytes .* raw_data holds 1439996"):
        load_graph(_heavy_model(tmp_path, "short.onnx", cut=4))
    with pytest.raises(ModelError, match="not a valid ONNX model"):
        load_graph(_heavy_model(tmp_path, "badop.onnx", op="NoSuchOp"))
    load_graph(_heavy_model(tmp_path, "ir3.onnx", ir=3))  # declared as an input: valid before IR 4
    with pytest.raises(ModelError, match="not a valid ONNX model.*W in initializer but not in graph input"):
        load_graph(_heavy_model(tmp_path, "ir3_undeclared.onnx", ir=3, declared=False))
    code, out = run_cli("inspect", tmp_path / "short.onnx")
    assert code == 2 and out.count("\n") == 1 and "raw_data holds" in out
