"""ONNX Runtime's own ops: accepted where ORT registers them, and sized by their rules.

The graphs are built by hand in the shape ORT training artifacts have them (the artifact
zoo in sample_models/zoo has the real ones; see test_artifact_zoo.py).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ckpt_cli.analysis.shapes import infer_tensors
from ckpt_cli.errors import ModelError
from ckpt_cli.graph import Graph
from ckpt_cli.io.load import load_graph
from ckpt_cli.ort.registry import ort_only_ops, ort_registers

F = TensorProto.FLOAT
MS = "com.microsoft"


def _model(nodes, inputs, outputs, inits=(), opset=14) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)])
    m.ir_version = 7
    return m


def _layer_norm_model(opset: int, op: str = "LayerNormalization") -> onnx.ModelProto:
    nodes = [helper.make_node(op, ["x", "scale", "bias"], ["y", "mean", "inv_std"], axis=-1, epsilon=1e-5),
             helper.make_node("Relu", ["y"], ["out"])]
    return _model(nodes, [helper.make_tensor_value_info("x", F, ["batch", 16, 32])],
                  [helper.make_tensor_value_info("out", F, ["batch", 16, 32])],
                  [numpy_helper.from_array(np.ones(32, np.float32), "scale"),
                   numpy_helper.from_array(np.zeros(32, np.float32), "bias")], opset)


def test_layer_norm_below_opset_17_is_accepted_and_sized(tmp_path):
    path = tmp_path / "ln14.onnx"
    onnx.save(_layer_norm_model(14), path)
    with pytest.raises(onnx.checker.ValidationError, match="LayerNormalization"):
        onnx.checker.check_model(onnx.load(path))  # the premise: onnx alone refuses it
    graph = load_graph(path)
    assert ort_only_ops(graph.model) == {"LayerNormalization": 1}
    t = infer_tensors(graph, {"batch": 4})
    assert t["y"].shape == (4, 16, 32) and t["out"].nbytes == 4 * 16 * 32 * 4  # inference goes on past it
    assert t["mean"].shape == (4, 16, 1) and t["inv_std"].dtype == F


def test_an_op_nobody_registers_is_still_refused(tmp_path):
    m = _layer_norm_model(14)
    m.graph.node[0].op_type = "LayerNormalizationX"
    onnx.save(m, tmp_path / "bad.onnx")
    with pytest.raises(ModelError, match="No Op registered for LayerNormalizationX"):
        load_graph(tmp_path / "bad.onnx")


def test_registration_follows_the_opset():
    assert ort_registers("MaxPoolGrad", 15) and not ort_registers("MaxPoolGrad", 8)
    assert ort_registers("LayerNormalization", 14)
    assert not ort_registers("NoSuchOp", 20)


def test_registration_starts_at_the_version_ort_registers_the_op_from():
    assert ort_registers("MaxPoolGrad", 9) and not ort_registers("MaxPoolGrad", 8)
    assert ort_registers("SimplifiedLayerNormalization", 1)


def test_contrib_layer_norms_are_registered_where_onnxruntime_lists_no_schemas(monkeypatch):
    """1.19's training wheel lists no schemas: ORT's contrib LayerNormalization (from
    version 1, where onnx has it from 17) is known from ckpt's own table then."""
    from ckpt_cli.ort import registry

    monkeypatch.setattr(registry, "_installed_schemas", lambda: {})
    assert ort_registers("LayerNormalization", 14) and ort_registers("SimplifiedLayerNormalization", 14)
    assert ort_registers("ConvGrad", 14) and not ort_registers("SoftmaxGrad_13", 14)


def test_max_pool_grad_has_the_pooled_input_shape(tmp_path):
    nodes = [helper.make_node("MaxPool", ["x"], ["p", "idx"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("MaxPoolGrad", ["p", "idx"], ["dx"], kernel_shape=[2, 2], strides=[2, 2])]
    m = _model(nodes, [helper.make_tensor_value_info("x", F, [2, 3, 9, 9])],
               [helper.make_tensor_value_info("dx", F, ["n", "c", "h", "w"])], opset=15)
    onnx.save(m, tmp_path / "pool.onnx")
    t = infer_tensors(load_graph(tmp_path / "pool.onnx"))
    assert t["p"].shape == (2, 3, 4, 4)
    assert t["dx"].shape == (2, 3, 9, 9) and t["dx"].dtype == F  # not the indices' shape


def test_gather_grad_takes_the_table_shape_and_the_gradient_type():
    table = numpy_helper.from_array(np.zeros((1000, 64), np.float32), "table")
    nodes = [helper.make_node("Gather", ["table", "ids"], ["emb"]),
             helper.make_node("Shape", ["table"], ["table_shape"]),
             helper.make_node("GatherGrad", ["table_shape", "ids", "emb"], ["table_grad"], domain=MS)]
    m = _model(nodes, [helper.make_tensor_value_info("ids", TensorProto.INT64, [8, 32])],
               [helper.make_tensor_value_info("table_grad", F, None)], [table])
    t = infer_tensors(Graph.from_model(m))
    assert t["table_grad"].shape == (1000, 64) and t["table_grad"].dtype == F
    assert t["table_grad"].nbytes == 1000 * 64 * 4


@pytest.mark.parametrize("op,extra", [("LSTMTraining", {3: 1, 4: 4}), ("GRUTraining", {2: 3})])
def test_rnn_training_outputs_are_sized(op, extra):
    gates = 4 if op == "LSTMTraining" else 3
    seq, batch, feat, hidden = 16, 4, 32, 128
    w = numpy_helper.from_array(np.zeros((1, gates * hidden, feat), np.float32), "W")
    r = numpy_helper.from_array(np.zeros((1, gates * hidden, hidden), np.float32), "R")
    outs = [f"o{k}" for k in range(3 + (op == "LSTMTraining") + 1)]
    nodes = [helper.make_node(op, ["x", "W", "R"], outs, domain=MS, hidden_size=hidden)]
    m = _model(nodes, [helper.make_tensor_value_info("x", F, [seq, batch, feat])],
               [helper.make_tensor_value_info("o0", F, None)], [w, r])
    t = infer_tensors(Graph.from_model(m))
    assert t["o0"].shape == (seq, 1, batch, hidden)
    assert t["o1"].shape == (1, batch, hidden)
    for pos, width in extra.items():  # the states ORT keeps for the gradient (checked against ORT 1.19.2)
        assert t[outs[pos]].shape == (seq, 1, batch, width * hidden)


def test_declared_gradients_take_the_dim_value():
    """Artifacts declare gradient tensors with the symbolic batch: --dim reaches them."""
    nodes = [helper.make_node("Relu", ["x"], ["y"]),
             helper.make_node("ReluGrad", ["dy", "y"], ["dx"], domain=MS)]
    m = _model(nodes, [helper.make_tensor_value_info("x", F, ["batch", 512]),
                       helper.make_tensor_value_info("dy", F, ["batch", 512])],
               [helper.make_tensor_value_info("dx", F, ["batch", 512])])
    m.graph.value_info.append(helper.make_tensor_value_info("y", F, ["batch", 512]))
    t = infer_tensors(Graph.from_model(m), {"batch": 64})
    assert t["dx"].shape == (64, 512) and t["y"].nbytes == 64 * 512 * 4


def test_check_names_tensors_of_unknown_size(tmp_path):
    """A prediction that counts a tensor as 0 B is not a verdict: the check fails naming it."""
    from chain import chain_model

    from ckpt_cli import check_models

    model = chain_model(layers=2, batch=8, width=16)
    model.graph.node.append(helper.make_node("NonZero", ["x"], ["nonzero"], name="/side/NonZero"))
    model.graph.node.append(helper.make_node("Size", ["nonzero"], ["found"], name="/side/Size"))
    model.graph.output.append(helper.make_tensor_value_info("found", TensorProto.INT64, []))
    path = tmp_path / "nz.onnx"
    onnx.save(model, path)
    result = check_models(path, path)
    assert result.figures.prediction.unsized == {"original": ["nonzero"], "rewritten": ["nonzero"]}
    assert not result.passed
    assert result.figures.codes.count("every_tensor_sized") == 2  # one per side
    assert any("1 tensors of unknown size as 0 B (nonzero)" in f for f in result.figures.failures)


def test_layer_norm_grad_holds_four_copies_of_x_while_it_runs():
    """ORT 1.19.2's CPU LayerNormalizationGrad builds four Eigen arrays the size of X: a
    process-peak measurement sees them (measured on a one-node model: 3.9-4.0 x X's bytes)."""
    from ckpt_cli.analysis.memory import peak_with_scratch, simulate

    x = helper.make_tensor_value_info("x", F, [64, 64, 256])
    dy = helper.make_tensor_value_info("dy", F, [64, 64, 256])
    stats = [helper.make_tensor_value_info(n, F, [64, 64, 1]) for n in ("mean", "inv_std")]
    nodes = [helper.make_node("LayerNormalizationGrad", ["dy", "x", "scale", "mean", "inv_std"],
                              ["dx", "dscale", "dbias"], domain=MS, axis=-1)]
    m = _model(nodes, [x, dy, *stats], [helper.make_tensor_value_info("dx", F, [64, 64, 256])],
               [numpy_helper.from_array(np.ones(256, np.float32), "scale")])
    graph = Graph.from_model(m)
    tensors = infer_tensors(graph)
    profile = simulate(graph, [0], tensors)
    assert peak_with_scratch(profile, graph, tensors) - profile.peak_bytes == 4 * 64 * 64 * 256 * 4


def test_a_graph_ort_refuses_is_refused_by_check_with_orts_message(tmp_path):
    """ckpt accepts SinGrad (the training build registers it in the ONNX domain); the plain
    onnxruntime this check runs has no schema for it, and says so: one line, exit 4 (an ORT
    build without the model's ops, README)."""
    import subprocess
    import sys

    from chain import chain_model

    model = chain_model(layers=2, batch=8, width=16)
    model.graph.node.append(helper.make_node("SinGrad", ["x", "x"], ["sg"], name="/side/SinGrad"))
    model.graph.output.append(helper.make_tensor_value_info("sg", F, [8, 16]))
    path, out = tmp_path / "sg.onnx", tmp_path / "sg.ckpt.onnx"
    onnx.save(model, path)
    run = lambda *a: subprocess.run([sys.executable, "-m", "ckpt_cli.cli", *map(str, a)],  # noqa: E731
                                    capture_output=True, text=True, timeout=300)
    assert run("rewrite", path, "-o", out, "-q").returncode == 0
    r = run("check", path, out)
    assert r.returncode == 4 and r.stderr.count("\n") == 1, r.stderr
    assert "this onnxruntime cannot load the model" in r.stderr and "No Op registered for SinGrad" in r.stderr


def test_a_valid_graph_orts_default_optimizations_refuse_is_ort_failing_exit_5(tmp_path):
    """A generated training graph (the fuzzer's case 1660) that onnx's checker and ORT with
    optimizations off accept, but ORT's default optimizations break ("Node input ... is not a
    graph input"): the model is valid, ORT failed: one line, exit 5, naming the session."""
    import subprocess
    import sys

    import onnxruntime as ort
    from randgraph import build_random_training_graph

    path = tmp_path / "a.onnx"
    onnx.save(build_random_training_graph(739466100, 15, "float32", opset=11), path)
    onnx.checker.check_model(str(path), full_check=True)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    with pytest.raises(Exception, match="is not a graph input"):
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    r = subprocess.run([sys.executable, "-m", "ckpt_cli.cli", "check", str(path), str(path), "--runs", "1"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 5 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("ckpt: error: ONNX Runtime could not load a model ckpt validated"), r.stderr
    assert "is not a graph input" in r.stderr and "(under ORT's default settings)" in r.stderr


def test_dim_binds_a_tensor_declared_only_in_value_info_past_an_op_inference_cannot_reach():
    """ORT's contrib Inverse has no shape rule in onnx or ckpt: its output is sized only by
    the file's value_info, where --dim must bind the symbolic batch (else it stays unsized)."""
    nodes = [helper.make_node("Relu", ["x"], ["h"]),
             helper.make_node("Inverse", ["h"], ["inv"], domain=MS),
             helper.make_node("Relu", ["inv"], ["out"])]
    m = _model(nodes, [helper.make_tensor_value_info("x", F, ["batch", 4, 4])],
               [helper.make_tensor_value_info("out", F, None)])
    graph = Graph.from_model(m)
    assert "inv" not in infer_tensors(graph, {"batch": 64})  # the premise: inference does not reach it
    m.graph.value_info.append(helper.make_tensor_value_info("inv", F, ["batch", 4, 4]))
    t = infer_tensors(Graph.from_model(m), {"batch": 64})
    assert t["inv"].shape == (64, 4, 4) and t["inv"].nbytes == 64 * 4 * 4 * 4
    assert t["out"].shape == (64, 4, 4)  # and inference goes on from it


def test_where_scratch_is_both_branches_broadcast_against_the_condition():
    """ORT's CPU Where (tensor/where_op.cc) broadcasts X and Y each against the condition
    into buffers of its own before the select: X_selection and Y_selection."""
    from ckpt_cli.ort.scratch import scratch_bytes

    shapes = {"cond": ((64, 1, 256), 1), "x": ((64, 64, 256), 4), "y": ((), 4)}
    node = helper.make_node("Where", ["cond", "x", "y"], ["out"])
    assert scratch_bytes(Graph.from_model(_model([node], [], [])).nodes[0], shapes.get) == \
        (64 * 64 * 256 + 64 * 1 * 256) * 4


def test_variadic_scratch_is_the_running_broadcasts_above_the_output():
    """ORT's CPU Sum/Mean/Max/Min of opset 8 on (math/element_wise_ops.cc) combine the inputs
    left to right through temporaries of the broadcast shape so far, the last one held while
    the output is written; two inputs need none."""
    from ckpt_cli.ort.scratch import scratch_bytes, variadic_temporaries

    sized = {"bias": ((1, 256), 4), "x": ((64, 256), 4), "y": ((64, 256), 4), "z": ((64, 256), 4),
             "s": (("batch", 256), 4)}.get
    full = 64 * 256 * 4

    def node(op, *inputs):
        return Graph.from_model(_model([helper.make_node(op, list(inputs), ["out"])], [], [])).nodes[0]

    assert variadic_temporaries(node("Sum", "bias", "x", "y"), sized) == ([full], full)
    assert variadic_temporaries(node("Sum", "bias", "bias", "x", "y"), sized) == ([256 * 4, full], full)
    for op in ("Sum", "Mean", "Max", "Min"):
        assert scratch_bytes(node(op, "x", "y", "z"), sized) == full
    # four inputs: two temporaries at once before the output, then one beside it
    assert scratch_bytes(node("Sum", "x", "y", "z", "x"), sized) == full
    assert scratch_bytes(node("Sum", "bias", "bias", "x", "y"), sized) == full
    assert scratch_bytes(node("Sum", "x", "y"), sized) == 0
    assert scratch_bytes(node("Sum", "s", "x", "y"), sized) == 0  # a symbolic dimension: unknown


def test_scatter_scratch_is_an_int64_copy_of_its_indices():
    """ORT 1.19.2's ScatterElements (and Scatter, its opset 9-10 name) and GatherElementsGrad
    copy their indices into an int64 vector before scattering: 8 bytes per index, whatever
    the index type and the data's item size; the indices are input 1, GatherElementsGrad's 2."""
    from ckpt_cli.ort.scratch import scratch_bytes

    sized = {"data": ((64, 64, 32), 4), "idx": ((64, 192, 32), 4), "upd": ((64, 192, 32), 2),
             "dy": ((64, 192, 32), 4), "shape": ((3,), 8), "sym": (("batch", 192, 32), 8)}.get
    n = 64 * 192 * 32

    def node(op, inputs, domain=""):
        made = helper.make_node(op, inputs, ["out"], axis=1, domain=domain)
        return Graph.from_model(_model([made], [], [])).nodes[0]

    assert scratch_bytes(node("ScatterElements", ["data", "idx", "upd"]), sized) == 8 * n
    assert scratch_bytes(node("Scatter", ["data", "idx", "upd"]), sized) == 8 * n
    assert scratch_bytes(node("GatherElementsGrad", ["dy", "shape", "idx"], "com.microsoft"), sized) == 8 * n
    assert scratch_bytes(node("GatherElements", ["data", "idx"]), sized) == 0  # reads its indices as they are
    assert scratch_bytes(node("ScatterElements", ["data", "sym", "upd"]), sized) == 0  # symbolic: unknown


def test_expand_scratch_is_an_offset_per_run_of_the_input():
    """ORT's CPU Expand copies its input out in runs (the input's dimensions right of the
    innermost one it expands) and keeps each run's output offset in an int64 vector."""
    from ckpt_cli.ort.scratch import scratch_bytes

    def scratch(x, y):
        node = Graph.from_model(_model([helper.make_node("Expand", ["x", "s"], ["y"])], [], [])).nodes[0]
        return scratch_bytes(node, {"x": (x, 4), "y": (y, 4)}.get)

    # the upsampling of the zoo's denoiser: runs of one element
    assert scratch((16, 64, 16, 1, 16, 1), (16, 64, 16, 2, 16, 2)) == 8 * 16 * 64 * 16 * 16
    assert scratch((512, 256, 1, 16), (512, 256, 4, 16)) == 8 * 512 * 256  # runs of 16
    assert scratch((64, 4, 1), (64, 4, 8192)) == 8 * 64 * 4
    assert scratch((256, 1024), (4, 256, 1024)) == 8  # only a leading dimension: one run
    assert scratch((256, 1024), (256, 1024)) == 8
    assert scratch(("batch", 1), ("batch", 8)) == 0  # symbolic: unknown


def test_reduce_sum_scratch_is_its_index_lists_off_the_fast_paths():
    """ORT's CPU ReduceSum merges adjacent reduced (R) or kept (K) axes; KR, RK, KRK and RKR
    shapes take fast kernels, the others list in int64 vectors an input offset per group of
    reduced elements but the last axis's and per output element but the last kept axis's."""
    from onnx import numpy_helper

    from ckpt_cli.ort.scratch import scratch_bytes

    def scratch(shape, axes, opset=17, constant=False):
        inputs = ["x"] if opset < 13 else ["x", "axes"]
        attrs = {"axes": list(axes)} if opset < 13 else {}
        nodes = [helper.make_node("ReduceSum", inputs, ["y"], keepdims=0, **attrs)]
        inits = [] if opset < 13 or constant else [numpy_helper.from_array(np.array(axes, np.int64), "axes")]
        if constant == "ints":
            nodes.insert(0, helper.make_node("Constant", [], ["axes"], value_ints=list(axes)))
        elif constant:
            nodes.insert(0, helper.make_node("Constant", [], ["axes"],
                                             value=numpy_helper.from_array(np.array(axes, np.int64))))
        graph = Graph.from_model(_model(nodes, [], [], inits, opset=opset))
        return scratch_bytes(graph.nodes[-1], {"x": (shape, 4)}.get, graph.int_constant)

    # KRKR..., the last kept axis of size 1: an offset per output element
    alternating = (1, 16, 1, 32, 1, 16, 2, 1, 1, 16, 2, 1)
    assert scratch(alternating, (0, 2, 4, 6, 8, 10)) == 8 * (16 * 32 * 16 * 16 + 2)
    assert scratch(alternating, (0, 2, 4, 6, 8, 10), constant=True) == 8 * (16 * 32 * 16 * 16 + 2)
    assert scratch(alternating, (0, 2, 4, 6, 8, 10), constant="ints") == 8 * (16 * 32 * 16 * 16 + 2)
    assert scratch((256, 2, 512, 2, 3), (1, 3), opset=11) == 8 * (256 * 512 + 2)
    assert scratch((64, 2, 64, 2, 8, 2, 1), (1, 3, 5)) == 8 * (64 * 64 * 8 + 2 * 2)
    # the fast paths: KR, RK, KRK, RKR (ones merged with their neighbours)
    assert scratch((64, 512), (1,)) == scratch((512, 64), (0,)) == 0
    assert scratch((64, 1, 512, 32), (1, 2)) == scratch((8, 64, 8), (0, 2)) == 0
    # RK with few rows and KRK with one leading row leave them
    assert scratch((8, 4096), (0,)) == 8 * (1 + 1)
    assert scratch((1, 64, 512), (1,)) == 8 * (1 + 1)
    # axes unknown (a computed input): unknown
    assert scratch_bytes(Graph.from_model(_model([helper.make_node("ReduceSum", ["x", "a"], ["y"])], [], [])).nodes[0],
                         {"x": (alternating, 4)}.get) == 0
    # ORT training's ReduceSumTraining runs the same kernel
    training = helper.make_node("ReduceSumTraining", ["x", "axes"], ["y"], keepdims=0, domain=MS)
    graph = Graph.from_model(_model([training], [], [], [numpy_helper.from_array(np.array((1, 3), np.int64), "axes")]))
    assert scratch_bytes(graph.nodes[0], {"x": ((256, 2, 512, 2, 3), 4)}.get, graph.int_constant) == 8 * (256 * 512 + 2)


def test_softmax_cross_entropy_scratch_counts_shifted_logits_transposed_copy_and_own_log_prob():
    """ORT's CPU SoftmaxCrossEntropyLoss holds the shifted logits (N x C), a transposed copy
    of logits of rank above 2, and log-probabilities of its own when the node has no
    log_prob output: one, two or three copies of the logits while it runs."""
    from ckpt_cli.ort.scratch import scratch_bytes

    def copies(logits: tuple, outputs: list[str]) -> float:
        node = helper.make_node("SoftmaxCrossEntropyLoss", ["scores", "labels"], outputs)
        sized = {"scores": (logits, 4), "labels": (logits[:1] + logits[2:], 8)}.get
        return scratch_bytes(Graph.from_model(_model([node], [], [])).nodes[0], sized) / (4 * int(np.prod(logits)))

    assert copies((512, 1000), ["loss", "log_prob"]) == 1
    assert copies((512, 1000), ["loss"]) == 2
    assert copies((512, 1000), ["loss", ""]) == 2
    assert copies((8, 1000, 64), ["loss", "log_prob"]) == 2
    assert copies((8, 1000, 64), ["loss"]) == 3


def test_conv_grad_scratch_is_one_images_im2col_columns_and_a_row_of_ones():
    """ORT training's CPU ConvGrad (conv_grad.cc) holds an im2col buffer for one image and
    group (C_in/group x kernel elements x output pixels) and a row of ones (output pixels)."""
    from ckpt_cli.ort.scratch import scratch_bytes

    def held(group: int) -> int:
        node = helper.make_node("ConvGrad", ["dy", "x", "w"], ["dx", "dw", "db"], domain="com.microsoft",
                                group=group)
        sized = {"dy": ((2, 8, 10, 12), 4), "x": ((2, 6, 12, 14), 4), "w": ((8, 6 // group, 3, 3), 4)}.get
        return scratch_bytes(Graph.from_model(_model([node], [], [])).nodes[0], sized)

    pixels = 10 * 12
    assert held(1) == (6 * 9 * pixels + pixels) * 4
    assert held(2) == (3 * 9 * pixels + pixels) * 4


def test_conv_scratch_is_unknown_where_a_dimension_it_multiplies_is_symbolic():
    """A kernel or channel dimension left symbolic (a weight computed at run time) makes
    the im2col buffer unknown: 0, as for an unsized tensor, not a TypeError or a str."""
    from ckpt_cli.ort.scratch import scratch_bytes

    def held(op: str, w: tuple, **extra: tuple) -> object:
        ins, outs = (["dy", "x", "w"], ["dx", "dw", "db"]) if op == "ConvGrad" else (["x", "w"], ["y"])
        node = helper.make_node(op, ins, outs, domain="com.microsoft" if op == "ConvGrad" else "")
        sized = {"dy": ((2, 64, 4, 4), 4), "x": ((2, 4, 6, 6), 4), "w": (w, 4), "y": ((2, 64, 4, 4), 4), **extra}
        return scratch_bytes(Graph.from_model(_model([node], [], [])).nodes[0], sized.get)

    assert held("ConvGrad", (64, 4, 3, 3)) == (4 * 9 * 16 + 16) * 4  # the premise: known, it counts
    assert held("Conv", (64, 4, 3, 3)) == 16 * 4 * 9 * 4
    for op in ("ConvGrad", "Conv"):
        assert held(op, (64, 4, "k", 3)) == 0
    assert held("Conv", (64, "c", 3, 3)) == 0
    assert held("ConvGrad", (64, 4, 3, 3), x=((2, "c", 6, 6), 4)) == 0
    assert held("ConvGrad", (64, 4, 3, 3), dy=(("n", 64, 4, 4), 4)) == (4 * 9 * 16 + 16) * 4  # batch unused


def test_gru_grad_scratch_is_one_steps_weight_gradients_and_zeros_for_absent_states():
    """ORT training's CPU GRUGrad (gru_grad_compute.cc) holds one step's dW and dR (3H x I,
    3H x H), the gate gradients (3H) and reset factor (H); without H0 or dH0 a zero state each."""
    from ckpt_cli.ort.scratch import scratch_bytes

    def held(h0: str, dh0: str) -> int:
        node = helper.make_node("GRUGrad", ["x", "w", "r", "b", "", h0, "hall", "zrh", "dhall", "dht"],
                                ["dx", "dw", "dr", "db", dh0], domain="com.microsoft", hidden_size=16)
        sized = {"x": ((5, 3, 8), 4), "r": ((1, 48, 16), 4)}.get
        return scratch_bytes(Graph.from_model(_model([node], [], [])).nodes[0], sized)

    both = (3 * 16 * (8 + 16) + 4 * 16) * 4
    assert held("h0", "dh0") == both
    assert held("", "dh0") == held("h0", "") == both + 3 * 16 * 4
    assert held("", "") == both + 2 * 3 * 16 * 4


def test_conv_scratch_expands_im2col_only_with_more_filters_than_pixels():
    """MLAS Conv reads a pointwise conv's input as it is; with more filters per group than
    output pixels it expands the whole im2col matrix (pixels x C_in/group x kernel)."""
    from ckpt_cli.ort.scratch import scratch_bytes

    def held(filters: int, side: int, kernel: int = 3, **attrs) -> int:
        node = helper.make_node("Conv", ["x", "w"], ["y"], **attrs)
        sized = {"x": ((1, 4, side + kernel - 1, side + kernel - 1), 4), "w": ((filters, 4, kernel, kernel), 4),
                 "y": ((1, filters, side, side), 4)}.get
        return scratch_bytes(Graph.from_model(_model([node], [], [])).nodes[0], sized)

    assert held(64, 4) == 16 * 4 * 9 * 4  # 64 filters > 16 pixels: the whole matrix
    assert held(8, 4) == 0  # 8 filters <= 16 pixels: per-thread slices
    assert held(64, 4, kernel=1) == 0  # pointwise
