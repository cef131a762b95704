"""Kernel working memory (``ort.scratch``) against one-node models measured on ONNX
Runtime 1.19.2's training build: ConvGrad's im2col column buffer, Conv's full im2col
expansion (MLAS, more filters than output pixels), GRUGrad's per-step weight gradients
the temporaries of a Sum of three or more inputs, the index lists of a ReduceSum off its
fast paths, each at three sizes, and the int64 copy of the indices that ScatterElements and
GatherElementsGrad make and the run offsets of Expand, at two.

The measurement is the process's peak above its state before the run (arena off, blocks
of 64 KiB and more from mmap), which Linux batches per thread: it under-reads by up to 64
pages per thread (256 KiB), and was seen up to 372 KiB short of outputs plus workspace on
these sizes (ConvGrad 2x96x32x32: 3.17 of 3.54 MiB of workspace seen; Conv 1x256x2048x16:
all of it). So the measured peak must lie between the prediction with the workspace less
that slack and the prediction plus a page, and well above the prediction without it.
"""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import ROOT
from test_ort_training import training_python  # noqa: F401 - the fixture
from ckpt_cli.analysis.memory import simulate
from ckpt_cli.analysis.shapes import infer_tensors
from ckpt_cli.graph import Graph
from ckpt_cli.ort.scratch import scratch_bytes

pytestmark = pytest.mark.slow
F = TensorProto.FLOAT
SLACK = 64 * 4096  # Linux's per-thread RSS batching, plus 10% of the workspace (see above)
# Each block mmap serves (the outputs, the kernel's buffers: at most eight here) is whole pages
# with a 16-byte header in front, so it can read up to a page above its bytes
PAGE_ROUNDING = 8 * 4096
SCRIPT = ROOT / "tests" / "fixtures" / "kernel_peak.py"


def _model(node, inputs, outputs, ms: bool) -> onnx.ModelProto:
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid("com.microsoft", 1)] if ms else [])
    vi = lambda name, shape: helper.make_tensor_value_info(name, F, shape)  # noqa: E731
    g = helper.make_graph([node], "one", [vi(*i) for i in inputs], [vi(*o) for o in outputs])
    return helper.make_model(g, opset_imports=opsets, ir_version=8)


def conv_grad(n: int, c: int, m: int, hw: int) -> onnx.ModelProto:
    node = helper.make_node("ConvGrad", ["dy", "x", "w"], ["dx", "dw", "db"], domain="com.microsoft",
                            kernel_shape=[3, 3], pads=[1] * 4, strides=[1, 1], group=1, dilations=[1, 1])
    return _model(node, [("dy", [n, m, hw, hw]), ("x", [n, c, hw, hw]), ("w", [m, c, 3, 3])],
                  [("dx", [n, c, hw, hw]), ("dw", [m, c, 3, 3]), ("db", [m])], ms=True)


def conv(n: int, c: int, m: int, hw: int) -> onnx.ModelProto:
    node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], pads=[1] * 4)
    return _model(node, [("x", [n, c, hw, hw]), ("w", [m, c, 3, 3])], [("y", [n, m, hw, hw])], ms=False)


def gru_grad(seq: int, batch: int, width: int, hidden: int) -> onnx.ModelProto:
    """GRUGrad with H0 and dH0 (no zero states of its own); outputs much smaller than its
    per-step weight gradients only where the sequence and batch are short."""
    ins = [("x", [seq, batch, width]), ("w", [1, 3 * hidden, width]), ("r", [1, 3 * hidden, hidden]),
           ("b", [1, 6 * hidden]), ("h0", [1, batch, hidden]), ("hall", [seq, 1, batch, hidden]),
           ("zrh", [seq, 1, batch, 3 * hidden]), ("dhall", [seq, 1, batch, hidden]), ("dht", [1, batch, hidden])]
    outs = [("dx", [seq, batch, width]), ("dw", [1, 3 * hidden, width]), ("dr", [1, 3 * hidden, hidden]),
            ("db", [1, 6 * hidden]), ("dh0", [1, batch, hidden])]
    names = [n for n, _ in ins]
    node = helper.make_node("GRUGrad", [*names[:4], "", *names[4:]], [n for n, _ in outs], domain="com.microsoft",
                            hidden_size=hidden)
    return _model(node, ins, outs, ms=True)


def variadic(inputs: int, rows: int, cols: int) -> onnx.ModelProto:
    """Sum of ``inputs`` inputs, the first broadcast along its rows (a 1 x cols bias)."""
    names = [f"x{k}" for k in range(inputs)]
    node = helper.make_node("Sum", names, ["y"])
    shapes = [[1, cols]] + [[rows, cols]] * (inputs - 1)
    return _model(node, list(zip(names, shapes)), [("y", [rows, cols])], ms=False)


def reduce_sum(shape: tuple[int, ...], axes: tuple[int, ...], op: str = "ReduceSum") -> onnx.ModelProto:
    """ReduceSum (or ORT training's ReduceSumTraining) over alternating axes (no fast path),
    axes an initializer (opset 17)."""
    ms = op == "ReduceSumTraining"
    node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=0, domain="com.microsoft" if ms else "")
    out = [d for k, d in enumerate(shape) if k not in axes]
    model = _model(node, [("x", list(shape))], [("y", out)], ms=ms)
    model.graph.initializer.append(helper.make_tensor("axes", TensorProto.INT64, [len(axes)], list(axes)))
    return model


def scatter(batch: int, edges: int, width: int) -> onnx.ModelProto:
    """ScatterElements with add over axis 1 (a graph's messages summed into 64 nodes), the
    indices an int64 initializer as large as the updates."""
    node = helper.make_node("ScatterElements", ["x", "idx", "upd"], ["y"], axis=1, reduction="add")
    model = _model(node, [("x", [batch, 64, width]), ("upd", [batch, edges, width])], [("y", [batch, 64, width])],
                   ms=False)
    model.graph.initializer.append(numpy_helper.from_array(np.zeros((batch, edges, width), np.int64), "idx"))
    return model


def gather_elements_grad(batch: int, edges: int, width: int) -> onnx.ModelProto:
    """GatherElementsGrad (the gradient of a GatherElements over axis 1), int32 indices."""
    node = helper.make_node("GatherElementsGrad", ["dy", "shape", "idx"], ["dx"], axis=1, domain="com.microsoft")
    model = _model(node, [("dy", [batch, edges, width])], [("dx", [batch, 64, width])], ms=True)
    model.graph.initializer.extend([numpy_helper.from_array(np.array([batch, 64, width], np.int64), "shape"),
                                    numpy_helper.from_array(np.zeros((batch, edges, width), np.int32), "idx")])
    return model


def expand(x: tuple[int, ...], y: tuple[int, ...]) -> onnx.ModelProto:
    """Expand ``x`` to ``y``, the shape an int64 initializer."""
    model = _model(helper.make_node("Expand", ["x", "shape"], ["y"]), [("x", list(x))], [("y", list(y))], ms=False)
    model.graph.initializer.append(numpy_helper.from_array(np.array(y, np.int64), "shape"))
    return model


CASES = [(conv_grad, (8, 48, 16, 32)), (conv_grad, (4, 64, 64, 32)), (conv_grad, (2, 96, 32, 32)),
         (conv, (2, 128, 1024, 16)), (conv, (1, 192, 1024, 16)), (conv, (1, 256, 2048, 16)),
         (gru_grad, (4, 8, 256, 256)), (gru_grad, (2, 4, 128, 384)), (gru_grad, (3, 2, 512, 256)),
         (variadic, (3, 1024, 512)), (variadic, (4, 1024, 512)), (variadic, (6, 512, 1024)),
         (reduce_sum, ((1, 16, 1, 32, 1, 16, 2, 1, 1, 16, 2, 1), (0, 2, 4, 6, 8, 10))),
         (reduce_sum, ((256, 2, 512, 2, 1), (1, 3))), (reduce_sum, ((512, 3, 512, 3, 2), (1, 3))),
         (reduce_sum, ((512, 3, 512, 3, 2), (1, 3), "ReduceSumTraining")),
         (scatter, (64, 192, 32)), (scatter, (16, 256, 128)), (gather_elements_grad, (64, 192, 32)),
         (gather_elements_grad, (8, 512, 96)),
         (expand, ((16, 64, 16, 1, 16, 1), (16, 64, 16, 2, 16, 2))), (expand, ((512, 256, 1, 16), (512, 256, 4, 16)))]


def _case_id(make, sizes) -> str:
    return f"{make.__name__}-{'x'.join(map(str, sizes))}".replace(" ", "").replace(",", "_")


@pytest.fixture(scope="module")
def measured(training_python, tmp_path_factory) -> dict[str, int]:  # noqa: F811
    """Every case's peak, measured in one process (each model its own session)."""
    folder = tmp_path_factory.mktemp("kernels")
    paths = {}
    for make, sizes in CASES:
        paths[_case_id(make, sizes)] = path = folder / f"{_case_id(make, sizes)}.onnx"
        onnx.save(make(*sizes), str(path))
    r = subprocess.run([training_python, str(SCRIPT), *map(str, paths.values()), "--runs", "2"], capture_output=True,
                       text=True, timeout=300, env=dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536"))
    assert r.returncode == 0, r.stderr[-1000:]
    peaks = json.loads(r.stdout)
    return {case: max(peaks[str(path)]) for case, path in paths.items()}


@pytest.mark.parametrize("make,sizes", CASES, ids=[_case_id(*c) for c in CASES])
def test_workspace_is_what_the_kernel_takes(measured, make, sizes):  # noqa: F811
    model = make(*sizes)
    graph = Graph.from_model(model)
    tensors = infer_tensors(graph)
    outputs = simulate(graph, [0], tensors).peak_bytes - sum(tensors[t].nbytes for t in graph.resident)
    workspace = scratch_bytes(graph.nodes[0], lambda t: (tensors[t].shape, 4), graph.int_constant)
    assert workspace >= 1 << 20  # the sizes make it large against the measurement's slack
    peak = measured[_case_id(make, sizes)]
    assert outputs + 0.9 * workspace - SLACK <= peak <= outputs + workspace + PAGE_ROUNDING, (peak, outputs, workspace)
    assert peak - outputs > workspace / 2  # without the workspace the prediction would be far short
