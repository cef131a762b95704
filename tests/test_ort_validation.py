"""What ckpt accepts, ONNX Runtime loads: type errors, the ONNX-domain ops only ORT registers
(LayerNormalization below opset 17) checked against ORT's own schema, in a graph ORT can
resolve and in a training artifact it cannot (gradient ops only onnxruntime-training has)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from chain import chain_feeds, chain_model
from ckpt_cli.cli import main
from conftest import SAMPLES

ARTIFACT = SAMPLES / "zoo" / "embed_ln" / "training_model.onnx"  # opset 14: LayerNormalization is ORT's


def _inspect(path: Path) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["inspect", str(path)])
    return result.exit_code, result.output


def _saved(folder: Path, model: onnx.ModelProto, change: Callable[[onnx.ModelProto], None]) -> Path:
    change(model)
    path = folder / "m.onnx"
    onnx.save(model, path)
    return path


def _ln_node(model: onnx.ModelProto) -> onnx.NodeProto:
    return next(n for n in model.graph.node if n.op_type == "LayerNormalization")


def _set_attribute(node: onnx.NodeProto, name: str, value) -> None:
    kept = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend(kept + [helper.make_attribute(name, value)])


def _cast_ln_input(model: onnx.ModelProto, to: int) -> None:
    ln = _ln_node(model)
    model.graph.node.insert(0, helper.make_node("Cast", [ln.input[0]], ["cast_x"], to=to, name="cast_x"))
    ln.input[0] = "cast_x"


def _retype_input(model: onnx.ModelProto, name: str, elem_type: int) -> None:
    next(v for v in model.graph.input if v.name == name).type.tensor_type.elem_type = elem_type


def _chain_with(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], outputs: list[str],
                opset: int = 17, out_type: int = TensorProto.FLOAT,
                shape=(8, 16)) -> Callable[[onnx.ModelProto], None]:
    """A change adding ``nodes`` (reading the chain's input ``x``, float [8, 16]) and their outputs."""
    def change(m: onnx.ModelProto) -> None:
        m.graph.node.extend(nodes)
        m.graph.initializer.extend(inits)
        m.graph.output.extend(helper.make_tensor_value_info(t, out_type, list(shape)) for t in outputs)
        m.opset_import[0].version = opset
    return change


def _f(name: str, shape, dtype=np.float32) -> onnx.TensorProto:
    return numpy_helper.from_array(np.ones(shape, dtype), name)


def test_artifact_as_generated_loads():
    code, out = _inspect(ARTIFACT)
    assert code == 0, out


@pytest.mark.parametrize("change,words", [
    (lambda m: _ln_node(m).input.append("ln.bias"), "input size 4 not in range"),
    (lambda m: _set_attribute(_ln_node(m), "axis", 7), "axis 7 is not in valid range"),
    (lambda m: _cast_ln_input(m, TensorProto.INT32), "tensor(int32)"),
    (lambda m: _retype_input(m, "ln.weight", TensorProto.DOUBLE), "LayerNormalization"),
])
def test_ort_registered_op_in_artifact_checked_by_ort(tmp_path, change, words):
    code, out = _inspect(_saved(tmp_path, onnx.load(ARTIFACT), change))
    assert code == 2, out
    assert out.startswith("ckpt: error:") and len(out.strip().splitlines()) == 1, out
    assert words in out, out


def test_type_error_in_artifact_refused(tmp_path):
    add = helper.make_node("Add", ["/emb/Gather_output_0", "twice"], ["mixed"], name="mixed_add")
    change = _chain_with([add], [_f("twice", [1], np.float64)], ["mixed"], opset=14, out_type=TensorProto.DOUBLE,
                         shape=("batch", 64, 256))
    code, out = _inspect(_saved(tmp_path, onnx.load(ARTIFACT), change))
    assert code == 2 and "mixed_add" in out and "double" in out, out


@pytest.mark.parametrize("nodes,inits,words", [
    ([helper.make_node("Add", ["x", "d"], ["y"], name="mixed_add")], [_f("d", [16], np.float64)],
     "bound to different types"),
    ([helper.make_node("Cast", ["x"], ["xi"], to=TensorProto.INT32),
      helper.make_node("LayerNormalization", ["xi", "s"], ["y"], name="ln_int")], [_f("s", [16], np.int32)],
     "tensor(int32)"),
    ([helper.make_node("LayerNormalization", ["x", "s", "s", "s"], ["y"], name="ln4")], [_f("s", [16])],
     "input size 4"),
    ([helper.make_node("LayerNormalization", ["x", "s"], ["y"], axis=7, name="ln_axis")], [_f("s", [16])],
     "axis"),
])
@pytest.mark.parametrize("opset", [16, 17])
def test_type_and_schema_errors_refused(tmp_path, nodes, inits, words, opset):
    code, out = _inspect(_saved(tmp_path, chain_model(layers=2, batch=8, width=16),
                                _chain_with(nodes, inits, ["y"], opset)))
    assert code == 2, out
    assert words in out or (opset == 17 and words.startswith("input size")), out


def test_valid_ort_registered_op_accepted(tmp_path):
    ln = helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], axis=-1, name="ln")
    path = _saved(tmp_path, chain_model(layers=2, batch=8, width=16),
                  _chain_with([ln], [_f("s", [16]), _f("b", [16])], ["y"], opset=16))
    code, out = _inspect(path)
    assert code == 0, out


def test_tensorrt_plugin_op_refused(tmp_path):
    """A schema ORT lists in the ONNX domain for its TensorRT provider only: no CPU kernel."""
    attrs = dict(score_threshold=0.5, iou_threshold=0.5, plugin_version="1", max_output_boxes=4, score_activation=0,
                 box_coding=0, background_class=-1)
    op = helper.make_node("EfficientNMS_TRT", ["x", "x"], ["n", "boxes", "scores", "classes"], name="trt", **attrs)
    code, out = _inspect(_saved(tmp_path, chain_model(layers=2, batch=8, width=16),
                                _chain_with([op], [], ["boxes"], shape=(8, 4, 4))))
    assert code == 2 and "EfficientNMS_TRT" in out, out


def test_missing_onnxruntime_says_what_to_install():
    hide = "import sys; sys.modules['onnxruntime'] = None; from ckpt_cli.cli import main; sys.exit(main())"
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root)}
    r = subprocess.run([sys.executable, "-c", hide, "inspect", str(SAMPLES / "mlp.onnx")], capture_output=True,
                       text=True, env=env, timeout=120)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 4 and len(lines) == 1, r.stderr
    assert lines[0].startswith("ckpt: error: onnxruntime is not installed") and "pip install onnxruntime" in lines[0]


def _function_constant_model(folder: Path) -> Path:
    """The chain with a local function whose Constant keeps its value in ``c.bin`` beside the model."""
    value = np.full((16,), 0.5, np.float32)
    (folder / "c.bin").write_bytes(value.tobytes())
    c = onnx.TensorProto(name="c", data_type=TensorProto.FLOAT, dims=[16], data_location=TensorProto.EXTERNAL)
    for key, field in (("location", "c.bin"), ("offset", "0"), ("length", "64")):
        entry = c.external_data.add()
        entry.key, entry.value = key, field
    body = [helper.make_node("Constant", [], ["k"], value=c), helper.make_node("Add", ["a", "k"], ["b"])]
    m = chain_model(layers=2, batch=8, width=16)
    m.functions.append(helper.make_function("local", "AddC", ["a"], ["b"], body, [helper.make_opsetid("", 17)]))
    m.opset_import.append(helper.make_opsetid("local", 1))
    m.graph.node.append(helper.make_node("AddC", ["x"], ["y"], domain="local", name="addc"))
    m.graph.output.append(helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 16]))
    onnx.save(m, folder / "m.onnx")
    return folder / "m.onnx"


def test_function_constant_external_data_beside_the_model(tmp_path, monkeypatch):
    src, elsewhere, out = tmp_path / "src", tmp_path / "elsewhere", tmp_path / "out"
    for folder in (src, elsewhere, out):
        folder.mkdir()
    model = _function_constant_model(src)
    monkeypatch.chdir(elsewhere)  # the value lies beside the model, not in the working folder
    code, text = _inspect(model)
    assert code == 0, text
    monkeypatch.chdir(src)  # where a relative location would resolve: the output must not depend on it
    result = CliRunner().invoke(main, ["rewrite", str(model), "-o", str(out / "r.onnx"), "-q"])
    assert result.exit_code == 0, result.output
    import onnxruntime as ort

    feeds = chain_feeds(onnx.load(model))
    session = ort.InferenceSession(str(out / "r.onnx"), providers=["CPUExecutionProvider"])
    y = session.run(["y"], feeds)[0]
    assert np.array_equal(y, feeds["x"] + np.float32(0.5))


def test_bfloat16_note_says_what_cpu_does(tmp_path):
    """The note is what ORT's CPU provider does with a bfloat16 graph: it refuses the session
    (no kernel), it does not compute in float32 between Casts as it does for float16."""
    sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
    from randgraph import build_random_training_graph

    import onnxruntime as ort
    from onnxruntime.capi.onnxruntime_pybind11_state import NotImplemented as NoKernel

    model = build_random_training_graph(3, 6, "bfloat16", opset=17)
    path = tmp_path / "bf16.onnx"
    onnx.save(model, path)
    with pytest.raises(NoKernel):
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    result = CliRunner().invoke(main, ["inspect", str(path), "--json"])
    assert result.exit_code == 0, result.output
    note = json.loads(result.stdout)["reduced_precision"]
    assert note["dtypes"] == ["bfloat16"]
    assert "refuses to load" in note["cpu"] and "float32" not in note["cpu"], note


def test_contradicting_types_before_a_function_op_refused(tmp_path):
    """A training artifact ORT cannot resolve, whose float initializer is also declared a bool
    graph output, read by a function op (SoftmaxCrossEntropyLoss's gradient path): a clean
    refusal, not an internal error from typing the function op's inputs."""
    artifact = onnx.load(SAMPLES / "zoo" / "embed_ln17" / "training_model.onnx")

    def declare_bool(m: onnx.ModelProto) -> None:
        m.graph.output.append(helper.make_tensor_value_info("onnx::loss::2_grad", TensorProto.BOOL, [1]))

    code, out = _inspect(_saved(tmp_path, artifact, declare_bool))
    assert code == 2 and out.startswith("ckpt: error:") and len(out.strip().splitlines()) == 1, out


def _folded_shape_model(expand_to: list[int]) -> onnx.ModelProto:
    """A Reshape whose target only evaluating Shape/Div/Mul gives ([4, 4] -> [2, 8]), its
    result's gradient path Expanded to ``expand_to``."""
    i64 = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Shape", ["s"], ["sh"]),
             helper.make_node("Div", ["sh", "c0"], ["a"]), helper.make_node("Mul", ["a", "c1"], ["b"]),
             helper.make_node("Reshape", ["s", "b"], ["r"]), helper.make_node("Mul", ["r", "p"], ["rp"]),
             helper.make_node("ReduceSum", ["rp"], ["loss"], keepdims=0),
             helper.make_node("Mul", ["r", "tangent_loss"], ["dr"], name="bwd_Mul"),
             helper.make_node("Expand", ["dr", "to"], ["p_grad"], name="bwd_Expand")]
    graph = helper.make_graph(
        nodes, "folded", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4]),
                          helper.make_tensor_value_info("p", TensorProto.FLOAT, [2, 8]),
                          helper.make_tensor_value_info("tangent_loss", TensorProto.FLOAT, [])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, []),
         helper.make_tensor_value_info("p_grad", TensorProto.FLOAT, expand_to)],
        [i64("c0", [2, 1]), i64("c1", [1, 2]), i64("to", expand_to)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_shapes_only_folding_reveals_are_refused(tmp_path):
    """ORT at ORT_DISABLE_ALL cannot see this Expand's input shape and loads the model (a run
    fails); a rewrite declaring the shapes ckpt folded would not load: refused at the input."""
    code, out = _inspect(_saved(tmp_path, _folded_shape_model([2, 8]), lambda m: None))
    assert code == 0, out
    code, out = _inspect(_saved(tmp_path, _folded_shape_model([8, 4]), lambda m: None))
    assert code == 2 and "bwd_Expand" in out and "Incompatible dimensions" in out, out


def test_declared_output_type_of_ort_registered_op_in_artifact_checked(tmp_path):
    """The excerpt ORT judges keeps the file's declared output types (LayerNormalization's
    output declared int64 where ORT infers float)."""
    def declare(m: onnx.ModelProto) -> None:
        next(v for v in m.graph.value_info if v.name == "/ln/Add_1_output_0").type.tensor_type.elem_type = 7

    code, out = _inspect(_saved(tmp_path, onnx.load(ARTIFACT), declare))
    assert code == 2 and "/ln/Add_1_output_0" in out, out


ARTIFACT17 = SAMPLES / "zoo" / "embed_ln17" / "training_model.onnx"  # opset 17: no op only ORT registers


def _int_matmul(m: onnx.ModelProto) -> None:
    """MatMul of the int64 labels and a float constant: the model's only ONNX-domain op whose
    types contradict it, after the gradient ops only onnxruntime-training registers."""
    m.graph.initializer.append(_f("c", [1]))
    m.graph.node.append(helper.make_node("MatMul", ["labels", "c"], ["y"], name="int_matmul"))
    m.graph.value_info.append(helper.make_tensor_value_info("y", TensorProto.INT64, ["batch"]))


def test_type_error_after_training_ops_refused_at_bound_dims(tmp_path):
    """onnx's strict inference lets this through once the batch is bound (an unknown-domain op
    before it); ORT, given every node it registers, refuses it."""
    code, out = _inspect(_saved(tmp_path, onnx.load(ARTIFACT17), _int_matmul))
    assert code == 2 and out.startswith("ckpt: error:") and len(out.strip().splitlines()) == 1, out
    assert "int_matmul" in out and "bound to different types" in out, out


def test_training_op_output_declared_with_a_wrong_type_refused(tmp_path):
    """A gradient op's output (only onnxruntime-training infers it) declared int64 where an
    ONNX-domain op reading it needs a float: what ORT then meets in the Gemm."""
    def declare(m: onnx.ModelProto) -> None:
        next(v for v in m.graph.value_info if v.name == "logits_grad").type.tensor_type.elem_type = TensorProto.INT64

    code, out = _inspect(_saved(tmp_path, onnx.load(ARTIFACT17), declare))
    assert code == 2 and "ONNX Runtime refuses the model" in out, out


def _with_op(op: str, domain: str) -> Callable[[onnx.ModelProto], None]:
    def change(m: onnx.ModelProto) -> None:
        m.graph.node.append(helper.make_node(op, ["x", "x"], ["y"], domain=domain, name="odd"))
        m.graph.output.append(helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 16]))
        m.opset_import.append(helper.make_opsetid(domain, 1))
    return change


@pytest.mark.parametrize("op", ["NoSuchOp", "Relu"])
@pytest.mark.parametrize("base", ["chain", "artifact"])
def test_unknown_com_microsoft_op_refused(tmp_path, op, base):
    """An op in ORT's own domain that neither onnxruntime nor onnxruntime-training registers:
    every ORT refuses it, in a graph ORT resolves and in a training artifact."""
    model = chain_model(layers=2, batch=8, width=16) if base == "chain" else onnx.load(ARTIFACT17)
    if base == "artifact":
        model.graph.input.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 16]))
    code, out = _inspect(_saved(tmp_path, model, _with_op(op, "com.microsoft")))
    assert code == 2 and len(out.strip().splitlines()) == 1, out
    assert f"com.microsoft:{op} is an op neither onnxruntime" in out, out


def test_training_op_plain_onnxruntime_lacks_accepted(tmp_path):
    """ReluGrad: only onnxruntime-training registers it; ckpt cannot refuse it."""
    code, out = _inspect(_saved(tmp_path, chain_model(layers=2, batch=8, width=16),
                                _with_op("ReluGrad", "com.microsoft")))
    assert code == 0, out
