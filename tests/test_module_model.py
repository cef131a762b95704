"""ckpt's model of the untuned Module session (analysis/training_pattern.py, verify/module_model.py).

The static memory pattern of ORT's training build (every live buffer an obstacle, static
shapes only), the gradient buffers, the arena over its runs, the kernels' heap scratch, and, with the ORT training interpreter (``training_python``), the
prediction against the process peak ``Module`` + ``Optimizer`` measure on the ORT-training
recipe's artifacts (made without torch)."""

from __future__ import annotations

import json
import math
import subprocess

import pytest
from conftest import ROOT
from onnx import TensorProto, helper

from ckpt_cli.analysis.shapes import infer_tensors
from ckpt_cli.analysis.lifetimes import lifetimes
from ckpt_cli.analysis.planner import plan_buffers
from ckpt_cli.analysis.training_pattern import FIRST_STEP_PROCESS_BYTES, gradient_buffers, heap_scratch, in_block, predict_module, static_block
from ckpt_cli.graph import Graph
from ckpt_cli.verify.module_model import predict_module_session, resolvable
from test_ort_training import training_python  # noqa: F401 - the fixture

MIB = 1 << 20


def _reuse_after_idle() -> Graph:
    """MatMuls over 1024 x 1024 floats (4 MiB): a's buffer idles at steps 2-3 and e reuses
    it at step 4; c (2 MiB) lives over steps 2-3."""
    sq, half, back = (helper.make_tensor(n, TensorProto.FLOAT, dims, [0.0] * (dims[0] * dims[1]))
                      for n, dims in (("wsq", [1024, 1024]), ("whalf", [1024, 512]), ("wback", [512, 1024])))
    nodes = [helper.make_node("MatMul", ["x", "wsq"], ["a"], name="m0"),
             helper.make_node("MatMul", ["a", "wsq"], ["b"], name="m1"),
             helper.make_node("MatMul", ["b", "whalf"], ["c"], name="m2"),
             helper.make_node("MatMul", ["c", "wback"], ["d"], name="m3"),
             helper.make_node("MatMul", ["d", "wsq"], ["e"], name="m4"),
             helper.make_node("Relu", ["e"], ["y"], name="r5")]
    g = helper.make_graph(nodes, "idle", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1024, 1024])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1024, 1024])],
                          initializer=[sq, half, back])
    return Graph.from_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]))


def test_a_buffer_idle_between_its_tensors_is_still_an_obstacle():
    # ORT's program counter for a's buffer runs from a's step to the buffer's release (after
    # e's last reader), so c cannot sit in it while it idles: a, b and c side by side
    g = _reuse_after_idle()
    tensors = infer_tensors(g)
    life = lifetimes(g, list(range(6)))
    buffers = plan_buffers(g, list(range(6)), tensors, life, True)
    held = in_block(g, tensors, buffers, {"a", "b", "c", "d", "e"})
    assert static_block(buffers, life, held) == 10 * MIB


def test_ort_resolves_numbers_and_the_symbols_its_inputs_bind():
    assert resolvable([64, 3, 32], {})
    assert resolvable(["batch", 3], {"batch": 64})
    assert not resolvable(["unk__0", 3], {"batch": 64})
    assert not resolvable([None, 3], {"batch": 64}) and not resolvable(None, {})


def _fork(width: int, y: str = "y") -> Graph:
    """x -> Relu a -> Relu b; c = a + b; y = Relu c (the output, named ``y``): tensors of
    ``width`` floats, a buffer each (a's counter [0, 2], b's [1, 3], c's [2, 4])."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="r0"), helper.make_node("Relu", ["a"], ["b"], name="r1"),
             helper.make_node("Add", ["a", "b"], ["c"], name="add"), helper.make_node("Relu", ["c"], [y], name="r2")]
    g = helper.make_graph(nodes, "fork", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [width])],
                          [helper.make_tensor_value_info(y, TensorProto.FLOAT, [width])])
    return Graph.from_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]))


ORDER = [0, 1, 2, 3]


def test_what_ort_cannot_size_before_the_run_stays_out_of_the_block():
    g = _fork(1 << 20)  # 4 MiB a tensor
    tensors = infer_tensors(g)
    every = predict_module(g, tensors, ORDER, {"a", "b", "c", "y"})
    assert every.block_bytes == 12 * MIB and every.dynamic_buffers == 1  # the output y is outside
    without_a = predict_module(g, tensors, ORDER, {"b", "c", "y"})
    assert without_a.block_bytes == 8 * MIB and without_a.dynamic_buffers == 2
    nothing = predict_module(g, tensors, ORDER, set())
    assert nothing.block_bytes == 0 and nothing.dynamic_buffers == 4


def _handles(*region_mib: int) -> int:
    """The arena's bookkeeping for regions of these MiB: 8 bytes per 256, each its own mapping."""
    return sum(-(-(r * MIB // 32 + 64) // 4096) * 4096 for r in region_mib)


def test_the_second_run_takes_the_newer_of_two_equal_regions_for_its_block():
    # a 12 MiB block takes a 16 MiB region whole (a chunk is split only for a request of at
    # most half of it), the output a second 16 MiB region. The Module drops a gradient's
    # accumulation flag in the call, so after the run both regions are free and equal: the
    # second run's block takes the newer one (the lower address) and touches 12 MiB there,
    # not 4: the peak grows by 8 MiB at the second step
    g = _fork(1 << 20, "w_grad.accumulation.out")
    p = predict_module(g, infer_tensors(g), ORDER, {"a", "b", "c", "w_grad.accumulation.out"})
    assert p.regions == (16 * MIB, 16 * MIB)
    assert p.first_run_bytes == 16 * MIB and p.peak_bytes == 24 * MIB + _handles(16, 16) + FIRST_STEP_PROCESS_BYTES


def test_the_loss_the_caller_holds_keeps_the_next_block_beside_it():
    # as above, but y is what Module returns, and the loop holds it (loss = module(...)) until
    # the next call returns: the second run's block best-fits the 12 MiB left beside it in
    # y's region and touches all of it; the second y goes to the first region. Measured on
    # the zoo: llama 89.2 MiB with the loss dropped at once, 97.0 MiB held (the model's 96.7)
    g = _fork(1 << 20)
    p = predict_module(g, infer_tensors(g), ORDER, {"a", "b", "c", "y"})
    assert p.regions == (16 * MIB, 16 * MIB)
    assert p.first_run_bytes == 16 * MIB and p.peak_bytes == 32 * MIB + _handles(16, 16) + FIRST_STEP_PROCESS_BYTES


def test_a_block_back_in_a_region_the_first_run_filled_adds_nothing():
    # only b in the block (12 MiB: a 16 MiB region), a in a second 16 MiB region, c and y
    # in a 32 MiB one (the output dropped in the call, as a gradient's flag is): the second
    # run's block takes a's region, touched there already
    g = _fork(3 << 20, "w_grad.accumulation.out")
    p = predict_module(g, infer_tensors(g), ORDER, {"b"})
    assert p.regions == (16 * MIB, 16 * MIB, 32 * MIB)
    assert p.first_run_bytes == 36 * MIB and p.peak_bytes == 36 * MIB + _handles(16, 16, 32) + FIRST_STEP_PROCESS_BYTES


@pytest.mark.slow
def test_the_prediction_follows_the_module_peak_of_the_recipe(training_python, tmp_path):  # noqa: F811
    """The recipe's artifacts (a residual MLP, batch 256) and ckpt's default rewrite:
    predicted within 15% of the process peak 10 Module steps measure (measured: -10%, -12%;
    what the model leaves out, the Optimizer's session and what the process allocates
    beside the arena, is about 1 MiB), and the rewrite below the original in both."""
    script = ROOT / "examples" / "ort_training_artifacts" / "artifacts.py"
    subprocess.run([training_python, str(script), "make", str(tmp_path)], check=True, capture_output=True)
    original, rewrite = tmp_path / "training_model.onnx", tmp_path / "training_model.ckpt.onnx"
    from ckpt_cli.api import rewrite_model

    rewrite_model(str(original), str(rewrite))
    figures = {}
    for model in (original, rewrite):
        done = subprocess.run([training_python, str(script), "train", str(tmp_path), str(model), "--steps", "10"],
                              check=True, capture_output=True, text=True)
        measured = json.loads(done.stdout.strip().splitlines()[-1])["process_peak_bytes"]
        predicted = predict_module_session(model, {}, training_python)
        assert predicted is not None
        figures[model.name] = (measured, predicted.peak_bytes)
        assert abs(predicted.peak_bytes - measured) <= 0.15 * measured, figures
    assert figures[rewrite.name][1] < figures[original.name][1] and figures[rewrite.name][0] < figures[original.name][0]


def test_conv_grad_takes_its_col_buffer_and_bias_multiplier_from_the_arena():
    from ckpt_cli.analysis.shapes import TensorInfo
    from ckpt_cli.analysis.training_pattern import training_kernel_plans

    node = helper.make_node("ConvGrad", ["dY", "X", "W"], ["dX", "dW", "dB"], name="cg", domain="com.microsoft",
                            kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1], group=1)
    fused = helper.make_node("FusedConv", ["X", "W"], ["Y"], name="fc", domain="com.microsoft",
                             kernel_shape=[3, 3], pads=[1, 1, 1, 1], activation="Relu")
    shapes = {"dY": (8, 64, 16, 16), "X": (8, 32, 16, 16), "W": (64, 32, 3, 3), "Y": (8, 64, 16, 16),
              "dX": (8, 32, 16, 16), "dW": (64, 32, 3, 3), "dB": (64,)}
    g = helper.make_graph([fused, node], "g", [helper.make_tensor_value_info(t, TensorProto.FLOAT, list(shapes[t]))
                                               for t in ("dY", "X", "W")],
                          [helper.make_tensor_value_info(t, TensorProto.FLOAT, list(shapes[t]))
                           for t in ("Y", "dX", "dW", "dB")])
    graph = Graph.from_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18),
                                                                 helper.make_opsetid("com.microsoft", 1)]))
    tensors = {t: TensorInfo(TensorProto.FLOAT, s, 4 * math.prod(s)) for t, s in shapes.items()}
    plans = training_kernel_plans(graph, [0, 1], tensors)
    col = 4 * 32 * 9 * 16 * 16  # C/group * kernel size * output image size floats
    assert plans[1] == (("tmp", col), ("tmp", 4 * 16 * 16), ("out",), ("free_tmp",))
    assert plans[0][0] == ("out",) and plans[0][1][0] == "tmp" and plans[0][1][1] > 0  # Conv's working buffer
    assert heap_scratch(graph, tensors, [0, 1]) == 0  # the arena holds them, not the heap


def test_the_gradient_buffers_fill_the_arena_before_the_first_block():
    # a 3 MiB gradient buffer takes the first region, 4 MiB, and the 12 MiB block a 16 MiB
    # one past it; the peak counts neither the buffer (resident before the first step) nor
    # the untouched tails
    g = _fork(1 << 20)
    grad = helper.make_tensor_value_info("w_grad.accumulation.buffer", TensorProto.FLOAT, [3 << 18])
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="r0"), helper.make_node("Relu", ["a"], ["b"], name="r1"),
             helper.make_node("Add", ["a", "b"], ["c"], name="add"), helper.make_node("Relu", ["c"], ["y"], name="r2")]
    with_grad = Graph.from_model(helper.make_model(
        helper.make_graph(nodes, "fork", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1 << 20]), grad],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1 << 20])]),
        opset_imports=[helper.make_opsetid("", 18)]))
    tensors = infer_tensors(with_grad)
    assert gradient_buffers(with_grad, tensors) == [3 * MIB]
    p = predict_module(with_grad, tensors, ORDER, {"a", "b", "c", "y"})
    assert p.regions[:2] == (4 * MIB, 16 * MIB)
    assert p.peak_bytes == predict_module(g, infer_tensors(g), ORDER, {"a", "b", "c", "y"}).peak_bytes


def _layer_norm_grad(rows: int) -> tuple[Graph, dict]:
    from ckpt_cli.analysis.shapes import TensorInfo

    node = helper.make_node("LayerNormalizationGrad", ["dY", "X", "scale", "mean", "inv"], ["dX", "dscale", "dbias"],
                            name="lng", domain="com.microsoft", axis=-1)
    shapes = {"dY": (rows, 64), "X": (rows, 64), "scale": (64,), "mean": (rows, 1), "inv": (rows, 1),
              "dX": (rows, 64), "dscale": (64,), "dbias": (64,)}
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info(t, TensorProto.FLOAT, list(shapes[t]))
                                        for t in ("dY", "X", "scale", "mean", "inv")],
                          [helper.make_tensor_value_info(t, TensorProto.FLOAT, list(shapes[t]))
                           for t in ("dX", "dscale", "dbias")])
    graph = Graph.from_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18),
                                                                 helper.make_opsetid("com.microsoft", 1)]))
    return graph, {t: TensorInfo(TensorProto.FLOAT, s, 4 * math.prod(s)) for t, s in shapes.items()}


def test_a_kernel_heap_scratch_lands_on_the_arena():
    # LayerNormalizationGrad's four Eigen arrays the size of X, mapped at 64 KiB or more
    # (measured on the zoo's tagger: 4 x 397312-byte mmaps every step, outside the arena);
    # below the Module child's mmap threshold they come from the heap's room
    graph, tensors = _layer_norm_grad(1536)
    mapped = -(-(4 * 1536 * 64 * 4 + 64) // 4096) * 4096
    assert heap_scratch(graph, tensors, [0]) == mapped
    p = predict_module(graph, tensors, [0], set())
    assert p.scratch_bytes == mapped and p.peak_bytes >= mapped
    small, small_tensors = _layer_norm_grad(32)  # 8 KiB arrays
    assert heap_scratch(small, small_tensors, [0]) == 0


def test_the_module_planner_compares_buffers_by_the_shapes_ort_knows(tmp_path):
    # ORT's SameSize never matches a dimension it does not know: a tensor ORT sizes only at
    # run time neither reuses a buffer nor is reused, whatever ckpt's own inference knows
    from ckpt_cli.analysis.planner import _size_key
    from ckpt_cli.analysis.shapes import TensorInfo
    from ckpt_cli.verify.module_model import module_tensors

    nodes = [helper.make_node("MatMul", [i, "w"], [o], name=f"m{k}") for k, (i, o) in enumerate(zip("xabc", "abcd"))]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                          [helper.make_tensor_value_info("d", TensorProto.FLOAT, ["batch", 8])],
                          initializer=[helper.make_tensor("w", TensorProto.FLOAT, [8, 8], [0.0] * 64)])
    path = tmp_path / "fused.onnx"
    import onnx

    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    known = {t: TensorInfo(TensorProto.FLOAT, (4, 8), 128) for t in "abcd"}  # the original's, at batch 4
    ort = {"a": [None, 8], "b": ["batch", 8], "c": [None, 8], "d": ["batch", 8]}
    made = module_tensors(path, known, ort, {"batch": 4})
    assert made is not None
    graph, tensors = made
    assert tensors["a"].planner_shape == ("?", 8) and _size_key(tensors["a"]) is None  # matches none
    assert tensors["b"].planner_shape == ("batch", 8) and _size_key(tensors["b"]) == _size_key(tensors["d"]) is not None
    buffers = plan_buffers(graph, [0, 1, 2, 3], tensors, lifetimes(graph, [0, 1, 2, 3]), True)
    owner = {graph.ids.names[t]: b for b, holders in enumerate(buffers.holders) for _, t in holders}
    assert owner["c"] != owner["a"]  # a is free when c is made, but ORT cannot tell they match


def test_symbols_only_the_fused_graph_has_are_bound_by_the_models_own_tensors(tmp_path):
    # ORT names the dimensions it cannot infer (unk__N) and ckpt hides some (its unplanned
    # symbols); a tensor a fusion makes is sized through them, from the training model's
    # tensor that declares one
    import onnx

    from ckpt_cli.analysis.shapes import TensorInfo
    from ckpt_cli.verify.module_model import bound_symbols, module_tensors

    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"], name="m0"), helper.make_node("Relu", ["a"], ["z"], name="r")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["unk__1", 8])],
                          initializer=[helper.make_tensor("w", TensorProto.FLOAT, [8, 8], [0.0] * 64)],
                          value_info=[helper.make_tensor_value_info("a", TensorProto.FLOAT, ["ckpt_unplanned_3", 8])])
    path = tmp_path / "fused.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    known = {"a": TensorInfo(TensorProto.FLOAT, (4, 8), 128)}
    ort = {"a": ["ckpt_unplanned_3", 8], "z": ["unk__1", 8]}
    graph = Graph.from_model(onnx.load(str(path)))
    assert bound_symbols(graph, known, ort, {"batch": 4}) == {"batch": 4, "ckpt_unplanned_3": 4}
    made = module_tensors(path, known, ort, {"batch": 4})
    assert made is not None and made[1]["z"].nbytes == 128


def test_the_replay_goes_on_until_the_arena_placements_settle():
    # the free chunks one run leaves decide where the next run's land: here the fifth run's
    # block lands where no run has been, 3 MiB more touched than after the third (as the
    # zoo's mixer rewrite does at its fifth step, and pointnet up to its 77th); from the
    # sixth run on the arena ends each run as it ended the fifth, so every later step adds nothing
    x = 3 << 18  # floats: 3 MiB
    nodes = [helper.make_node("Concat", ["x", "x"], ["t0"], axis=0, name="c0"),
             helper.make_node("Relu", ["x"], ["t1"], name="r1"), helper.make_node("Relu", ["t1"], ["t2"], name="r2"),
             helper.make_node("Relu", ["t2"], ["t3"], name="r3"),
             helper.make_node("Concat", ["t2", "t2"], ["t4"], axis=0, name="c4"),
             helper.make_node("Relu", ["t4"], ["t5"], name="r5")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [x])],
                          [helper.make_tensor_value_info("t5", TensorProto.FLOAT, None)])
    graph = Graph.from_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]))
    p = predict_module(graph, infer_tensors(graph), list(range(6)), {"t1", "t2", "t4"})
    assert p.settled and len(p.step_peaks) == 6
    assert p.step_peaks[1] == p.step_peaks[2] == p.step_peaks[3] < p.step_peaks[4] == p.step_peaks[5] == p.peak_bytes
    assert p.step_peaks[4] - p.step_peaks[3] == 3 * MIB
    assert p.after(1) == p.step_peaks[0] and p.after(3) == p.step_peaks[2]
    assert p.after(10) == p.after(10_000) == p.peak_bytes


def test_the_replay_stops_at_its_bound_unsettled(monkeypatch):
    import ckpt_cli.analysis.training_pattern as tp

    g = _fork(1 << 20)
    monkeypatch.setattr(tp, "MAX_RUNS", 1)
    p = predict_module(g, infer_tensors(g), ORDER, {"a", "b", "c", "y"})
    assert not p.settled and len(p.step_peaks) == 1 and p.peak_bytes == p.step_peaks[0]
    monkeypatch.setattr(tp, "MAX_RUNS", 256)
    monkeypatch.setattr(tp, "MAX_REPLAYED_REQUESTS", 2)  # a run replays the output's buffer and more
    assert len(predict_module(g, infer_tensors(g), ORDER, set()).step_peaks) == 1
