"""The floor of every plan (``analysis/floor.py``): what no order or recompute plan goes below."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ckpt_cli.analysis import analyse, lowest_peak
from ckpt_cli.analysis.floor import plan_floor
from ckpt_cli.analysis.memory import buffer_roots, resident_bytes
from ckpt_cli.analysis.shapes import infer_tensors
from ckpt_cli.api import plan_model
from ckpt_cli.errors import BudgetUnreachable
from ckpt_cli.graph import Graph
from ckpt_cli.options import PlanOptions

from conftest import SAMPLES

KIB = 1024


def _floor_of(nodes: list[onnx.NodeProto], inputs: dict[str, list[int]], outputs: list[str],
              initializers: list[onnx.TensorProto] = ()):
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs], list(initializers))
    g = Graph.from_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    tensors = infer_tensors(g)
    return plan_floor(g, tensors, buffer_roots(g), resident_bytes(g, tensors), 4)


def test_a_view_shares_its_input_buffer_and_an_in_place_op_its_first_input():
    shape = numpy_helper.from_array(np.array([256, 256], dtype=np.int64), "shape")
    floor = _floor_of([helper.make_node("Exp", ["x"], ["e"], name="exp"),
                       helper.make_node("Sigmoid", ["e"], ["s"], name="sigmoid"),  # in place on e
                       helper.make_node("Reshape", ["s", "shape"], ["r"], name="view"),
                       helper.make_node("Add", ["r", "s"], ["o"], name="add")],
                      {"x": [256, 256]}, ["o"], [shape])
    # add holds s (r is a view of it) and o: 2 x 256 KiB; exp and sigmoid hold one buffer each
    assert (floor.node, floor.working_bytes, floor.scratch_bytes) == ("add", 512 * KIB, 0)
    assert floor.bytes == floor.resident_bytes + 512 * KIB


def test_an_in_place_op_on_a_resident_input_writes_a_new_buffer():
    floor = _floor_of([helper.make_node("Sigmoid", ["x"], ["s"], name="first"),
                       helper.make_node("Sigmoid", ["s"], ["t"], name="second")],  # in place on s
                      {"x": [256, 256]}, ["t"])
    assert (floor.node, floor.working_bytes) == ("first", 256 * KIB)


def test_a_node_no_output_needs_sets_no_floor():
    floor = _floor_of([helper.make_node("Exp", ["x"], ["big"], name="dead"),
                       helper.make_node("ReduceSum", ["x"], ["o"], name="sum", keepdims=0)],
                      {"x": [256, 256]}, ["o"])
    assert floor.node is None and floor.bytes == floor.resident_bytes + floor.output_bytes


def test_a_kernel_s_working_memory_is_part_of_its_floor():
    a = analyse(Graph.from_model(onnx.load(SAMPLES / "cnn.onnx")))
    floor = lowest_peak(a)
    assert floor.scratch_bytes > 0 and floor.node is not None
    assert floor.bytes == floor.resident_bytes + floor.working_bytes + floor.scratch_bytes
    assert floor.bytes > a.priority.resident_bytes + a.output_bytes  # the node sets it, not the outputs


@pytest.mark.parametrize("name", ["cnn", "gpt"])
def test_the_lowest_peak_plan_stays_at_or_above_the_floor(name):
    planned = plan_model(SAMPLES / f"{name}.onnx", PlanOptions(auto="min-peak"))
    assert planned.rewrite.after.working_peak_bytes >= lowest_peak(planned.analysis).bytes


def test_an_unreachable_budget_names_the_node_that_sets_the_floor():
    with pytest.raises(BudgetUnreachable, match=r"no plan goes below .*: node node_where_8 runs in every plan .* "
                                                r"of kernel working memory"):
        plan_model(SAMPLES / "cnn.onnx", PlanOptions(budget="30%"))
