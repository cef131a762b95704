"""ckpt's prediction of the session an ORT training artifact's users run: ``Module`` untuned.

``onnxruntime.training.api.Module(training, state, eval)`` builds its session with ORT's
defaults: ORT_ENABLE_ALL's fusions, DEFAULT order, buffer reuse, the memory pattern and the
CPU arena. The graph it runs is the one ORT writes at ORT_ENABLE_ALL (``plain_model``'s
``write_fused``, by the training interpreter: its build knows the gradient ops), in the
order it writes it. Which of its tensors ORT can size before the run decides what the
training build's static memory pattern holds (``analysis/training_pattern.py``); ORT's own
shape inference says so, not onnx's: many gradient ops (Clip's, BatchNorm's, the weight
gradients of Conv) have no shape inference in ORT, and their outputs are allocated when
they run. The same shapes decide which buffers its planner lets a tensor reuse
(``SameSize``: a dimension it does not know matches nothing). ORT writes the shapes it
inferred for the graph's outputs only, so ORT loads the
fused graph once more (a child, at ORT_DISABLE_ALL: the graph as it is), every tensor a node
writes declared an output without a type, and the shapes are read back from the file it
writes.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

import onnx

from ..analysis.shapes import TensorInfo, infer_shapes, itemsize
from ..analysis.training_pattern import ModulePrediction, predict_module
from ..errors import CkptError, RunFailed
from ..graph import Graph
from ..io.load import load_graph
from ..options import DEFAULT_TIMEOUT_S
from ..optimize import run_ort_optimizer
from ..rewrite import RewriteResult
from .plain_model import or_none, write_fused

OrtShape = list[int | str | None] | None  # a dimension ORT knows by number, by symbol, or not at all


def ort_shapes(fused: Path, timeout: float | None, python: str | None) -> dict[str, OrtShape] | None:
    """The shape ORT's own inference gives every tensor a node of ``fused`` writes (None: no
    shape); None when ORT cannot load the graph so declared."""
    model = onnx.load(str(fused))
    declared = {o.name for o in model.graph.output}
    for node in model.graph.node:
        for t in node.output:
            if t and t not in declared:
                model.graph.output.add().name = t  # no type: ORT's inference gives it
                declared.add(t)
    source, written = fused.parent / "shapes_in.onnx", fused.parent / "shapes_out.onnx"
    onnx.save(model, str(source), save_as_external_data=True, location="shapes_in.onnx.data")
    try:
        run_ort_optimizer(source, written, "cpu", external="shapes_out.onnx.data", level="ORT_DISABLE_ALL",
                          timeout=timeout, python=python)
        answer = onnx.load(str(written), load_external_data=False)
    except RunFailed as e:
        if e.kind == "timeout":
            raise
        return None
    except (CkptError, OSError, onnx.onnx_cpp2py_export.checker.ValidationError):
        return None
    shapes: dict[str, OrtShape] = {}
    for v in answer.graph.output:
        t = v.type.tensor_type
        shapes[v.name] = None if not t.HasField("shape") else [
            d.dim_value if d.HasField("dim_value") else (d.dim_param if d.HasField("dim_param") else None)
            for d in t.shape.dim]
    return shapes


def resolvable(shape: OrtShape, bound: Mapping[str, int]) -> bool:
    """``TryResolveShape`` at the first run: every dimension a positive number or a symbol
    the graph's inputs bind."""
    return shape is not None and all((isinstance(d, int) and d > 0) or (isinstance(d, str) and d in bound)
                                     for d in shape)


def _sized(shape: OrtShape, dtype: int, bound: Mapping[str, int]) -> TensorInfo | None:
    if not resolvable(shape, bound) or shape is None:
        return None
    dims = tuple(d if isinstance(d, int) else bound[str(d)] for d in shape)
    n = 1
    for d in dims:
        n *= d
    return TensorInfo(dtype, dims, n * itemsize(dtype))


def bound_symbols(graph: Graph, known: Mapping[str, TensorInfo], shapes: Mapping[str, OrtShape],
                  dims: Mapping[str, int]) -> dict[str, int]:
    """``dims`` and the value of every other symbol that the fused file declares, or ORT's
    shapes give (its ``unk__`` dimensions, ckpt's hidden ones), where the training model's
    own tensor of that name is sized: what sizes the tensors ORT's fusions make."""
    out = dict(dims)
    declared = {v.name: [d.dim_param or None for d in v.type.tensor_type.shape.dim]
                for v in (*graph.model.graph.value_info, *graph.model.graph.output)}
    for source in (declared, {t: [d if isinstance(d, str) else None for d in s] for t, s in shapes.items() if s}):
        for t, symbols in source.items():
            info = known.get(t)
            if info is None or info.shape is None or len(info.shape) != len(symbols):
                continue
            for d, n in zip(symbols, info.shape):
                if d and isinstance(n, int) and n > 0:
                    out.setdefault(d, n)
    return out


def module_tensors(fused: Path, known: Mapping[str, TensorInfo], shapes: Mapping[str, OrtShape],
                   dims: Mapping[str, int]) -> tuple[Graph, dict[str, TensorInfo]] | None:
    """The fused graph and its tensors: onnx's inference, the file's own tensors by name
    (a fused node keeps the output names of the nodes it replaces), then ORT's shapes for
    what neither sizes; None when a tensor a node writes stays unsized. Each tensor ORT
    shaped carries ORT's shape for the planner (an unknown dimension as "?")."""
    graph = load_graph(fused)
    dims = bound_symbols(graph, known, shapes, dims)
    inferred = infer_shapes(graph, dims, strict=False).tensors
    tensors = {t: known[t] if info.nbytes is None and t in known else info for t, info in inferred.items()}
    for n in graph.nodes:
        for t in n.outputs:
            if t and (t not in tensors or tensors[t].nbytes is None):
                info = known.get(t) if t in known and known[t].nbytes is not None else None
                dtype = (tensors.get(t) or known.get(t) or TensorInfo(0, None, None)).dtype
                info = info or (_sized(shapes.get(t), dtype, dims) if dtype else None)
                if info is None:
                    return None
                tensors[t] = info
    for t, shape in shapes.items():
        if t in tensors:
            tensors[t] = replace(tensors[t], static_shape=False,
                                 ort_shape=None if shape is None else tuple("?" if d is None else d for d in shape))
    return graph, tensors


def predict_module_session(model_path: str | Path, dims: dict[str, int], python: str | None = None,
                           timeout: float | None = DEFAULT_TIMEOUT_S) -> ModulePrediction | None:
    """The untuned Module session's peak above the loaded state for ``model_path`` fed at
    ``dims`` (its symbolic dimensions); None where ORT's fused graph or its shapes cannot
    be had, or a tensor cannot be sized. ``python``: an interpreter with
    onnxruntime-training (None: this one)."""
    known = infer_shapes(load_graph(model_path), dims).tensors
    with tempfile.TemporaryDirectory(prefix="ckpt_module_") as tmp:
        fused = write_fused(model_path, Path(tmp), timeout, python)
        if fused is None:
            return None
        shapes = ort_shapes(fused, timeout, python)
        if shapes is None:
            return None
        made = or_none(lambda: module_tensors(fused, known, shapes, dims))
    if made is None:
        return None
    graph, tensors = made
    static = {t for t, shape in shapes.items() if resolvable(shape, dims)}
    return predict_module(graph, tensors, list(range(len(graph.nodes))), static)


def module_peaks(original: Path, dims: dict[str, int], save: Callable[[RewriteResult, Path], bool],
                 python: str | None, timeout: float | None) -> Callable[[RewriteResult], tuple[int, int] | None]:
    """For a rewrite of the artifact at ``original``: its predicted untuned Module peak and
    the original's (``predict_module_session`` at ``dims``), the rewrite as ``save`` writes
    it; None where either is not predicted. The original's is predicted once."""
    before: list[ModulePrediction | None] = []

    def peaks(result: RewriteResult) -> tuple[int, int] | None:
        with tempfile.TemporaryDirectory(prefix="ckpt_module_peaks_") as tmp:
            path = Path(tmp) / "rewrite.onnx"
            after = predict_module_session(path, dims, python, timeout) if save(result, path) else None
        if after is None:
            return None
        if not before:
            before.append(predict_module_session(original, dims, python, timeout))
        return None if before[0] is None else (after.peak_bytes, before[0].peak_bytes)

    return peaks


__all__ = ["bound_symbols", "module_peaks", "ort_shapes", "predict_module_session", "resolvable"]
