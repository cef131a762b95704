"""ckpt's memory model applied to the graph a plain ``InferenceSession(path)`` really runs.

``predict_plain`` models a plain session on the file's own graph: ORT_ENABLE_ALL's fusions
are not simulated, and they move the peak. ORT writes the graph it builds at
ORT_ENABLE_ALL (``optimized_model_filepath``), and it writes it in the order a plain
session runs it. The same memory model (allocation planner, memory pattern, arena) over
that graph in that order predicts the plain session before any run.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from onnx.helper import make_tensor_value_info

from ..analysis.pattern import predict_plain
from ..analysis.shapes import TensorInfo, infer_shapes
from ..errors import CkptError, RunFailed
from ..graph import Graph
from ..io.load import load_graph
from ..options import DEFAULT_TIMEOUT_S
from ..optimize import run_ort_optimizers

T = TypeVar("T")

PLAIN_LEVEL = "ORT_ENABLE_ALL"  # what InferenceSession(path) builds


@dataclass(frozen=True)
class FusedPlain:
    peak_in_use_bytes: int  # the CPU arena peak predicted for a plain session
    order: tuple[str, ...]  # the node names of ORT's fused graph, in the order ORT runs them


def fused_graph(model_path: str | Path, known: Mapping[str, TensorInfo], timeout: float | None = DEFAULT_TIMEOUT_S,
                python: str | None = None) -> tuple[Graph, dict[str, TensorInfo]] | None:
    """ORT's ORT_ENABLE_ALL graph of ``model_path`` (its nodes in the order a plain session
    runs them) and its tensors; None when ORT cannot write that graph or a tensor of it has
    no known size. ``known``: the file's tensors; a fused node keeps the output names of the
    nodes it replaces, and onnx's shape inference stops at ORT's contrib ops. ORT's child
    running past ``timeout`` seconds is the check's failure (RunFailed), not a missing model."""
    with tempfile.TemporaryDirectory(prefix="ckpt_plain_") as tmp:
        fused = write_fused(model_path, Path(tmp), timeout, python)
        return None if fused is None else read_fused(fused, known)


def write_fused(model_path: str | Path, folder: Path, timeout: float | None = DEFAULT_TIMEOUT_S,
                python: str | None = None) -> Path | None:
    """ORT's ORT_ENABLE_ALL graph of ``model_path`` written into ``folder``; None when ORT
    cannot write it (a child past ``timeout`` raises RunFailed)."""
    return write_fused_all([model_path], folder, timeout, python)[0]


def write_fused_all(models: Sequence[str | Path], folder: Path, timeout: float | None = DEFAULT_TIMEOUT_S,
                    python: str | None = None) -> list[Path | None]:
    """``write_fused`` of each of ``models``, by one ORT child (starting the interpreter and
    ORT is most of a small model's run)."""
    outputs = [folder / f"fused{k}.onnx" for k in range(len(models))]
    jobs = [(Path(model), out, f"{out.name}.data") for model, out in zip(models, outputs)]
    outcomes = or_none(lambda: run_ort_optimizers(jobs, "cpu", PLAIN_LEVEL, timeout, python))
    if outcomes is None:
        return [None] * len(models)
    return [None if isinstance(outcome, Exception) else out for outcome, out in zip(outcomes, outputs)]


def _graph_and_tensors(path: Path, known: Mapping[str, TensorInfo]) -> tuple[Graph, dict[str, TensorInfo]]:
    graph = load_graph(path)
    _declare_ort_op_outputs(graph, known)
    return graph, infer_shapes(graph).tensors


def _declare_ort_op_outputs(graph: Graph, known: Mapping[str, TensorInfo]) -> None:
    """Declare, as value_info, the sizes ``known`` gives the outputs of ORT's own ops in the
    fused graph: ORT writes no value_info there, onnx's inference stops at each such op, and
    sizing them by ckpt's rules passes one more op per round of whole-graph inference (a
    24-layer transformer's backward: a chain of FusedMatMul, 32 rounds, the cap, still
    leaving some to ``known``). A fused node keeps the output names of the nodes it replaces."""
    declared = graph.model.graph.value_info
    for node in graph.nodes:
        if node.domain in ("", "ai.onnx"):
            continue
        for t in node.outputs:
            info = known.get(t)
            if t and info is not None and info.nbytes is not None and info.shape is not None:
                declared.append(make_tensor_value_info(t, info.dtype, list(info.shape)))


def or_none(call: Callable[[], T]) -> T | None:
    """``call()``, or None where ORT or the file could not give its answer; a child that ran
    past its timeout still raises (that is the check's failure, not a missing model)."""
    try:
        return call()
    except RunFailed as e:
        if e.kind == "timeout":
            raise
        return None
    except (CkptError, OSError):
        return None


def read_fused(fused: Path, known: Mapping[str, TensorInfo]) -> tuple[Graph, dict[str, TensorInfo]] | None:
    """The graph ``write_fused`` wrote and its tensors (``fused_graph``'s rules); None when
    it cannot be read or a tensor it produces has no known size."""
    # the tensors only: a whole analysis would also simulate another order and
    # classify phases, which a graph ORT fused need not pass
    loaded = or_none(lambda: _graph_and_tensors(fused, known))
    if loaded is None:
        return None
    graph, inferred = loaded
    tensors = {t: known[t] if info.nbytes is None and t in known else info for t, info in inferred.items()}
    produced = [t for n in graph.nodes for t in n.outputs if t]
    tensors.update((t, known[t]) for t in produced if t not in tensors and t in known)
    if any(t not in tensors or tensors[t].nbytes is None for t in produced):
        return None
    return graph, tensors


def fused_plain(model_path: str | Path, known: Mapping[str, TensorInfo],
                timeout: float | None = DEFAULT_TIMEOUT_S, python: str | None = None) -> FusedPlain | None:
    """ckpt's prediction of ``InferenceSession(model_path)`` on the CPU from ORT's own
    ORT_ENABLE_ALL graph of it (``fused_graph``); None where that graph cannot be had."""
    return _predicted(fused_graph(model_path, known, timeout, python))


def fused_plains(models: Sequence[tuple[Path, Mapping[str, TensorInfo]]],
                 timeout: float | None = DEFAULT_TIMEOUT_S) -> list[FusedPlain | None]:
    """``fused_plain`` of each (model, its known tensors), ORT's graphs written by one child."""
    with tempfile.TemporaryDirectory(prefix="ckpt_plain_") as tmp:
        fused = write_fused_all([model for model, _ in models], Path(tmp), timeout)
        return [None if f is None else _predicted(read_fused(f, known)) for f, (_, known) in zip(fused, models)]


def _predicted(fused: tuple[Graph, dict[str, TensorInfo]] | None) -> FusedPlain | None:
    if fused is None:
        return None
    graph, tensors = fused
    order = list(range(len(graph.nodes)))  # ORT wrote them in the order it runs them
    return FusedPlain(predict_plain(graph, tensors, order).peak_in_use_bytes, tuple(n.name for n in graph.nodes))
