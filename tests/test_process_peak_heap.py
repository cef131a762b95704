"""The process-peak measurement sees live blocks, not the heap's holes.

ORT builds whose profiler has no memory fields (onnxruntime-training 1.19.2) are measured by
the process's peak with the arena off. Blocks under glibc's mmap threshold come from the
heap, where a freed block leaves a hole that stays resident when the next, larger block does
not fit it. The check's children map every block of a page or more on its own, so the
measured peak follows ckpt's prediction of the live blocks, each its whole mapping. The
graph here leaves such holes: 64 KiB of 16 KiB tensors freed between live ones while 32 KiB
ones are made; at a 64 KiB threshold it measures about a third above its live bytes.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
import numpy as np

from ckpt_cli import verify as check
from ckpt_cli.analysis import schedules
from ckpt_cli.analysis.memory import MemoryProfile, PAGE_BYTES, mapped_bytes, simulate, visible_peak
from ckpt_cli.analysis.shapes import infer_tensors
from ckpt_cli.graph import Graph
from ckpt_cli.verify.feeds import make_feeds, save_feeds

N = 512          # 16 KiB tensors made from the input
WIDTH = 4096     # floats: 16 KiB
RSS_SLACK = 256 * 1024


def holes_model() -> onnx.ModelProto:
    """A_i = X + c_i (16 KiB each); B_i = Concat(A_i, A_i) (32 KiB) for odd i, which frees A_i
    between live even ones; then one Sum of the even A_i and one of the B_i."""
    nodes, inits = [], []
    for i in range(N):
        inits.append(numpy_helper.from_array(np.array([float(i)], np.float32), f"c{i}"))
        nodes.append(helper.make_node("Add", ["X", f"c{i}"], [f"A{i}"], name=f"add{i}"))
    odd = range(1, N, 2)
    nodes += [helper.make_node("Concat", [f"A{i}", f"A{i}"], [f"B{i}"], axis=0, name=f"cat{i}") for i in odd]
    nodes.append(helper.make_node("Sum", [f"A{i}" for i in range(0, N, 2)], ["S"], name="sum_a"))
    nodes.append(helper.make_node("Sum", [f"B{i}" for i in odd], ["T"], name="sum_b"))
    graph = helper.make_graph(nodes, "holes", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [WIDTH])],
                              [helper.make_tensor_value_info("S", TensorProto.FLOAT, [WIDTH]),
                               helper.make_tensor_value_info("T", TensorProto.FLOAT, [2 * WIDTH])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def predicted(model: onnx.ModelProto, min_bytes: int = PAGE_BYTES) -> int:
    """ckpt's process-peak prediction of ``model`` in ORT's PRIORITY_BASED order, reuse off."""
    graph = Graph.from_model(model)
    tensors = infer_tensors(graph)
    profile: MemoryProfile = simulate(graph, schedules.priority_based(graph), tensors, reuse_buffers=False)
    return visible_peak(profile, graph, tensors, min_bytes)


def test_mapped_bytes_is_the_whole_mapping():
    assert mapped_bytes(PAGE_BYTES) == 2 * PAGE_BYTES  # the data starts 64 bytes in
    assert mapped_bytes(PAGE_BYTES - 64) == PAGE_BYTES
    assert mapped_bytes(16 * 1024) == 20 * 1024


def test_visible_peak_counts_whole_mappings_of_page_blocks():
    model = holes_model()
    # all N A live (16 KiB, 5 pages mapped each) when the first B is made
    assert predicted(model) >= N * mapped_bytes(4 * WIDTH) + mapped_bytes(8 * WIDTH)
    assert predicted(model, 1 << 20) == 0  # no block of a MiB


def test_process_peak_follows_live_blocks_not_heap_holes(tmp_path: Path):
    model = holes_model()
    path, feeds = tmp_path / "holes.onnx", tmp_path / "feeds.npz"
    onnx.save(model, str(path))
    save_feeds(feeds, make_feeds(model, seed=0))
    r = check.run_model(path, feeds, provider="cpu", settings="ckpt", runs=2, enable_mem_reuse=False,
                        worker=check.WorkerOptions(memory_method="process_peak"))
    if r["method"] != "process_peak":
        pytest.skip(f"this onnxruntime measured by {r['method']}")
    expected, measured = predicted(model), r["peak_bytes"]
    # measured: -0.3% to +6.7% (some processes hold about 0.9 MB more in every run, cause not
    # found); at a 64 KiB threshold +15%
    assert abs(measured - expected) <= 0.08 * expected + RSS_SLACK, (measured, expected, r["runs"])
