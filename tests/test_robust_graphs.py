"""Graphs ckpt used to get wrong (issue 11, items 5-8 and 12): subgraphs reading outer
tensors, Constant tensors in external data, invalid inputs, hostile external-data
locations, and a loss-gradient seed computed inside the graph."""

import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from ckpt_cli.cli import main
from ckpt_cli.errors import ModelError
from ckpt_cli.io.load import load_graph

SAMPLES = Path(__file__).resolve().parent.parent / "sample_models"


def ckpt(*args) -> tuple[int, str]:
    r = CliRunner().invoke(main, [str(a) for a in args])
    assert "Traceback" not in r.output, r.output
    return r.exit_code, r.output


def _branch(name: str, op: str) -> onnx.GraphProto:
    """A branch that reads the outer tensors ``h`` and ``zero`` (not its own inputs)."""
    return helper.make_graph(
        [helper.make_node(op, ["h", "zero"], ["m_b"], name=f"{name}_cmp"),
         helper.make_node("Cast", ["m_b"], [f"m_{name}"], to=TensorProto.FLOAT, name=f"{name}_cast")],
        name, [], [helper.make_tensor_value_info(f"m_{name}", TensorProto.FLOAT, [16, 32])])


def if_training_graph(seed_inside: bool = False) -> onnx.ModelProto:
    """relu(x @ W) summed as the loss; the backward's ReLU mask comes from an If whose
    branches read the forward activation ``h`` and a Constant only they use."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="fwd_matmul"),
        helper.make_node("Relu", ["h"], ["r"], name="fwd_relu"),
        helper.make_node("ReduceSum", ["r"], ["loss"], keepdims=0, name="fwd_loss"),
        helper.make_node("Constant", [], ["zero"], value=numpy_helper.from_array(np.float32(0), "zero_v"),
                         name="bwd_zero"),
        helper.make_node("If", ["cond"], ["mask"], then_branch=_branch("then", "Greater"),
                         else_branch=_branch("else", "GreaterOrEqual"), name="bwd_mask"),
    ]
    if seed_inside:  # d loss / d loss = 1, made in the graph: no tangent input
        nodes.append(helper.make_node("Constant", [], ["tangent"],
                                      value=numpy_helper.from_array(np.float32(1), "one"), name="bwd_seed"))
    nodes += [
        helper.make_node("Mul", ["mask", "tangent"], ["dh"], name="bwd_dh"),
        helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0], name="bwd_xt"),
        helper.make_node("MatMul", ["xt", "dh"], ["W_grad"], name="bwd_dw"),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, 8])]
    if not seed_inside:
        inputs.append(helper.make_tensor_value_info("tangent", TensorProto.FLOAT, []))
    graph = helper.make_graph(
        nodes, "if_training", inputs,
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, []),
         helper.make_tensor_value_info("W_grad", TensorProto.FLOAT, [8, 32])],
        initializer=[numpy_helper.from_array(rng.standard_normal((8, 32)).astype(np.float32), "W"),
                     numpy_helper.from_array(np.array(True), "cond")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _run(path: Path) -> dict:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {"x": np.random.default_rng(1).standard_normal((16, 8)).astype(np.float32)}
    if any(i.name == "tangent" for i in sess.get_inputs()):
        feeds["tangent"] = np.array(1, np.float32)
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, feeds)))


@pytest.mark.parametrize("args", [[], ["--region", "fwd_*"], ["--no-recompute"]])
def test_if_reading_outer_tensors_rewrites_validly(tmp_path, args):
    src = tmp_path / "if.onnx"
    onnx.save(if_training_graph(), src)
    out = tmp_path / "if.ckpt.onnx"
    code, text = ckpt("rewrite", src, "-o", out, "-q", *args)
    assert code == 0, text
    written = onnx.load(out)
    onnx.checker.check_model(written, full_check=True)
    assert "bwd_zero" in {n.name for n in written.graph.node}, "a Constant read only by a branch is kept"
    order = [n.name for n in written.graph.node]
    assert order.index("fwd_matmul") < order.index("bwd_mask")
    expected, got = _run(src), _run(out)
    for k in expected:
        assert np.array_equal(expected[k], got[k]), k


def test_implicit_inputs_are_consumers():
    g = load_graph_from(if_training_graph())
    mask = next(n for n in g.nodes if n.name == "bwd_mask")
    assert set(mask.implicit) == {"h", "zero"}
    assert mask.index in g.consumers["h"] and mask.index in g.consumers["zero"]


def load_graph_from(model: onnx.ModelProto):
    from ckpt_cli.graph import Graph

    return Graph.from_model(model)


def test_seed_computed_in_the_graph_is_a_training_graph(tmp_path):
    src = tmp_path / "seeded.onnx"
    onnx.save(if_training_graph(seed_inside=True), src)
    code, text = ckpt("inspect", src, "--loss", "loss", "--grad-output", "W_grad", "-q")
    assert code == 0, text
    code, text = ckpt("rewrite", src, "-o", tmp_path / "o.onnx", "--loss", "loss", "--grad-output", "W_grad", "-q")
    assert code == 0, text
    onnx.checker.check_model(onnx.load(tmp_path / "o.onnx"), full_check=True)


def test_an_initializer_only_a_branch_reads_is_written(tmp_path):
    """The If's branches read ``zero`` from the outer scope: as an initializer it must stay."""
    model = if_training_graph()
    const = next(n for n in model.graph.node if n.name == "bwd_zero")
    model.graph.node.remove(const)
    model.graph.initializer.append(numpy_helper.from_array(np.float32(0), "zero"))
    src, out = tmp_path / "init.onnx", tmp_path / "init.ckpt.onnx"
    onnx.save(model, src)
    code, text = ckpt("rewrite", src, "-o", out, "-q")
    assert code == 0, text
    written = onnx.load(out)
    onnx.checker.check_model(written, full_check=True)
    assert "zero" in {t.name for t in written.graph.initializer}
    expected, got = _run(src), _run(out)
    for k in expected:
        assert np.array_equal(expected[k], got[k]), k


def test_a_graph_loads_the_same_whatever_the_process_loaded_before(tmp_path):
    """ORT is asked about a graph's function ops (Relu here) until it was seen to run them as
    they are; the first load, which asks, and a later one, which does not, give one graph."""
    from ckpt_cli.ort import expand

    src = tmp_path / "if.onnx"
    onnx.save(if_training_graph(seed_inside=True), src)
    expand._RUN_AS_IS.clear()
    first = load_graph(src)
    assert expand._RUN_AS_IS, "the first load asked ORT: the case under test"
    again = load_graph(src)

    def shape(g):
        return [(n.name, n.op_type, n.inputs, n.outputs) for n in g.nodes], sorted(g.initializers)
    assert shape(first) == shape(again)
    assert "bwd_zero" in {n.name for n in first.nodes} and "bwd_seed" in {n.name for n in first.nodes}


def test_constant_tensors_in_external_data_are_copied(tmp_path):
    model = if_training_graph()
    big = numpy_helper.from_array(np.full((16, 32), 0.5, np.float32), "half_v")
    model.graph.node.insert(0, helper.make_node("Constant", [], ["half"], value=big, name="fwd_half"))
    model.graph.node[2].input[0] = "h"  # keep the graph valid; then use the constant:
    model.graph.node.insert(3, helper.make_node("Add", ["r0", "half"], ["r"], name="fwd_add"))
    model.graph.node[2].output[0] = "r0"
    src_dir = tmp_path / "src"
    src_dir.mkdir()
    onnx.save(model, src_dir / "c.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
              location="c.weights", size_threshold=0, convert_attribute=True)
    reread = onnx.load(src_dir / "c.onnx", load_external_data=False)
    assert any(a.t.data_location == TensorProto.EXTERNAL for n in reread.graph.node for a in n.attribute
               if n.op_type == "Constant")
    out = tmp_path / "elsewhere" / "c.ckpt.onnx"
    out.parent.mkdir()
    code, text = ckpt("rewrite", src_dir / "c.onnx", "-o", out, "-q")
    assert code == 0, text
    onnx.checker.check_model(str(out), full_check=True)
    onnx.save(onnx.load(src_dir / "c.onnx"), tmp_path / "inline.onnx")  # ORT reads no external Constants
    expected, got = _run(tmp_path / "inline.onnx"), _run(out)
    assert all(np.array_equal(expected[k], got[k]) for k in expected)


# ---- invalid inputs: exit 2 with one line -------------------------------------------------
def _broken(tmp_path: Path, change) -> Path:
    model = if_training_graph()
    change(model)
    path = tmp_path / "bad.onnx"
    onnx.save(model, path)
    return path


def _no_opset(m):
    del m.opset_import[:]


def _reads_nothing(m):
    m.graph.node[1].input[0] = "ghost"


def _output_nothing(m):
    m.graph.output.append(helper.make_tensor_value_info("phantom", TensorProto.FLOAT, [1]))


def _negative_dim(m):
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = -3


@pytest.mark.parametrize("change,message", [(_no_opset, "opset"), (_reads_nothing, "ghost"),
                                            (_output_nothing, "phantom"), (_negative_dim, "-3")])
def test_invalid_graphs_are_refused(tmp_path, change, message):
    path = _broken(tmp_path, change)
    for command in ("inspect", "rewrite", "plan"):
        code, text = ckpt(command, path, "-q")
        assert code == 2, (command, text)
        assert text.startswith("ckpt: error:") and message in text and text.count("\n") == 1


def test_truncated_gpt_is_refused(tmp_path):
    path = tmp_path / "t.onnx"
    path.write_bytes((SAMPLES / "gpt.onnx").read_bytes()[:444298])
    code, text = ckpt("rewrite", path, "-o", tmp_path / "o.onnx")
    assert code == 2 and "ckpt: error:" in text
    assert not (tmp_path / "o.onnx").exists()


# ---- external data locations ---------------------------------------------------------------
@pytest.fixture
def ext_dir(tmp_path) -> Path:
    folder = tmp_path / "m"
    folder.mkdir()
    onnx.save(if_training_graph(), folder / "e.onnx", save_as_external_data=True, location="e.data",
              size_threshold=0)
    return folder


def _relocate(folder: Path, **fields) -> Path:
    m = onnx.load(folder / "e.onnx", load_external_data=False)
    t = next(t for t in m.graph.initializer if t.name == "W")
    for e in t.external_data:
        if e.key in fields:
            e.value = fields.pop(e.key)
    for k, v in fields.items():
        entry = t.external_data.add()
        entry.key, entry.value = k, v
    path = folder / "hostile.onnx"
    onnx.save(m, path)
    return path


@pytest.mark.parametrize("fields,message", [
    ({"location": "/etc/passwd"}, "absolute"),
    ({"location": "../../../../etc/passwd"}, "outside"),
    ({"location": "sub/../../e.data"}, "outside"),
    ({"offset": "abc"}, "malformed"),
    ({"offset": "-5"}, "malformed"),
    ({"offset": "999999999"}, "only"),
    ({"length": "16"}, "needs"),
    ({"location": "nothere.data"}, "missing"),
])
def test_hostile_external_locations(ext_dir, fields, message):
    path = _relocate(ext_dir, **fields)
    with pytest.raises(ModelError, match=message):
        load_graph(path)
    code, text = ckpt("rewrite", path, "-o", ext_dir / "o.onnx")
    assert code == 2 and message in text and text.count("\n") == 1
    assert not (ext_dir / "o.onnx").exists()


def test_links_and_special_files_as_external_data(ext_dir, tmp_path):
    outside = tmp_path / "secret.bin"
    shutil.copy(ext_dir / "e.data", outside)
    os.symlink(outside, ext_dir / "escape.data")
    with pytest.raises(ModelError, match="symbolic link"):
        load_graph(_relocate(ext_dir, location="escape.data"))
    os.symlink("/dev/zero", ext_dir / "zero.data")
    with pytest.raises(ModelError, match="symbolic link"):
        load_graph(_relocate(ext_dir, location="zero.data"))
    os.mkfifo(ext_dir / "fifo.data")
    with pytest.raises(ModelError, match="regular file"):
        load_graph(_relocate(ext_dir, location="fifo.data"))
    os.symlink(tmp_path, ext_dir / "sub")
    with pytest.raises(ModelError, match="outside"):  # a linked folder in the path
        load_graph(_relocate(ext_dir, location="sub/secret.bin"))


@pytest.mark.parametrize("where", ["node", "metadata", "location", "graph_name", "doc_string"])
def test_names_that_are_not_utf8_are_refused(tmp_path, where):
    model = if_training_graph()
    mark = "MARKMARK"
    if where == "node":
        model.graph.node[1].name = mark
    elif where == "graph_name":  # copied into the files ckpt writes and the copies it checks
        model.graph.name = mark
    elif where == "doc_string":
        model.doc_string = mark
    elif where == "metadata":
        entry = model.graph.node[1].metadata_props.add()
        entry.key, entry.value = "pkg.torch.onnx.name_scopes", mark
    path = tmp_path / "u.onnx"
    if where == "location":
        onnx.save(model, path, save_as_external_data=True, location=mark, size_threshold=0)
        (tmp_path / mark).rename(tmp_path / "data")
    else:
        onnx.save(model, path)
    path.write_bytes(path.read_bytes().replace(mark.encode(), b"\xff\xfeMARK\xc3("))
    code, text = ckpt("rewrite", path, "-o", tmp_path / "o.onnx")
    assert code == 2 and "UTF-8" in text and text.count("\n") == 1, text


def test_ir3_external_initializer_not_an_input_is_refused(ext_dir):
    m = onnx.load(ext_dir / "e.onnx", load_external_data=False)
    m.ir_version = 3
    onnx.save(m, ext_dir / "ir3.onnx")
    code, text = ckpt("rewrite", ext_dir / "ir3.onnx", "-o", ext_dir / "o.onnx")
    assert code == 2 and "not in graph input" in text, text
