"""ckpt's memory model applied to the graph a plain ``InferenceSession(path)`` really runs.

Before a run, ckpt predicts a plain session on the file's own graph (``predict_plain``):
ORT_ENABLE_ALL's fusions are not simulated, and they move the peak (mlp's rewrite: 30%
below that prediction). After the check has run the file under ORT's defaults, the fused
graph and its order are known: ORT writes the graph it builds at ORT_ENABLE_ALL
(``optimized_model_filepath``), and the profiler gave the order its nodes ran in. The same
memory model (allocation planner, memory pattern, arena) over that graph in that order
then tells whether the model itself holds for the plain session, node for node.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path

from ..analysis import analyse
from ..analysis.pattern import predict_plain
from ..analysis.shapes import TensorInfo
from ..errors import CkptError
from ..load import load_graph
from ..ort_optimize import run_ort_optimizer

PLAIN_LEVEL = "ORT_ENABLE_ALL"  # what InferenceSession(path) builds


def fused_plain_peak(model_path: str | Path, executed: list[str], known: Mapping[str, TensorInfo]) -> int | None:
    """The CPU arena peak ckpt's model gives for ORT's ORT_ENABLE_ALL graph of ``model_path``
    run in ``executed`` (node names, as the profiler of a plain session reported them); None
    when that graph cannot be had, its nodes are not exactly the ones that ran, or a tensor
    of it has no known size. ``known``: the file's tensors; a fused node keeps the output
    names of the nodes it replaces, and onnx's shape inference stops at ORT's contrib ops."""
    with tempfile.TemporaryDirectory(prefix="ckpt_plain_") as tmp:
        fused = Path(tmp) / "fused.onnx"
        try:
            run_ort_optimizer(Path(model_path), fused, "cpu", external="fused.onnx.data", level=PLAIN_LEVEL)
            a = analyse(load_graph(fused))
        except (CkptError, OSError):
            return None
        index = {n.name: n.index for n in a.graph.nodes}
        order = [index.get(name, -1) for name in executed]
        if len(order) != len(index) or sorted(order) != list(range(len(index))):
            return None
        tensors = {t: known[t] if info.nbytes is None and t in known else info for t, info in a.tensors.items()}
        produced = (t for n in a.graph.nodes for t in n.outputs if t)
        if any(t not in tensors or tensors[t].nbytes is None for t in produced):
            return None
        return predict_plain(a.graph, tensors, order).peak_in_use_bytes
