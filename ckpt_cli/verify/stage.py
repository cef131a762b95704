"""The check stage: run two model files on ONNX Runtime and judge the rewrite.

It takes paths (what ORT really loads) and the predictions made for those files,
never an in-memory graph: a check must measure the bytes that were written. The
measuring happens in child processes (``driver.py`` runs ``worker.py``).

The verdict fails when any premise of the saving fails, not only when outputs differ:
ORT ran nodes that are not in the file or not in the order ckpt simulated, the rewritten peak
is above the original's, or the prediction is further off than ``max_prediction_error``.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import onnx

from ..analysis import Analysis
from ..analysis.arena import predict_in_use
from ..analysis.memory import PAGE_BYTES, visible_peak
from ..analysis.scaling import other_assignment
from ..analysis.shapes import TensorInfo
from ..errors import CheckFailed, RunFailed, RuntimeUnavailable, UsageError
from ..graph import Graph
from ..markers import SessionPlan
from ..options import CheckOptions
from ..ops import VIEW_OPS, declarations, ort_kernel_defects
from . import driver
from .feeds import prepare_feeds
from .figures import (CheckFigures, Finding, MeasuredRuns, Measurement, OutputFigures, PlainPrediction,
                      PredictionFigures, note)
from .module_runs import module_sessions
from .plain_model import fused_plain
from .records import ModuleSessions, OtherDims, RunToRun, Spread
from .rules import RULES, Rule, judge

# Above this error of the plain-session prediction, the check also models ORT's fused graph
# (one ORT optimization and analysis more) to tell fusions from a memory-model error.
PLAIN_FUSED_ABOVE = 0.02
# what ORT says of an op this build has no schema for (an ORT training op in plain onnxruntime)
_MISSING_OP = ("not a registered function/op", "No Op registered for")


# The check's children map every block of a page or more on its own (driver.CHILD_ENV) and
# give malloc's free heap pages back before each measured run (worker._trim_heap): a
# smaller block fits in a heap page that is resident already.
PROCESS_PEAK_MIN_BLOCK = PAGE_BYTES


@dataclass(frozen=True)
class Prediction:
    """What ckpt's memory model predicts for one file under the check's settings."""

    tensor_bytes: int  # live tensor bytes at the peak (ORT's bytes requested)
    in_use_bytes: int | None  # the CPU arena's bytes in use at the peak
    order: tuple[str, ...] = ()  # node names in the order simulated (ORT's PRIORITY_BASED)
    plain_in_use_bytes: int | None = None  # the CPU arena's peak in a plain InferenceSession (fusions aside)
    # the file's tensor sizes, for ORT's fused graph of it where shape inference stops at a contrib op
    tensors: Mapping[str, TensorInfo] | None = field(default=None, compare=False, repr=False)
    unsized: tuple[str, ...] = ()  # tensors whose size is unknown: counted as 0 B above
    # the peak as a process-peak measurement sees it: with the working memory kernels hold
    # outside ORT's allocator, without blocks under PROCESS_PEAK_MIN_BLOCK
    process_bytes: int | None = None


def _relative_error(predicted: int | None, measured: int | None) -> float | None:
    return None if not measured or predicted is None else (predicted - measured) / measured


def _run(original: Path, rewritten: Path, feeds: Path, options: driver.PairOptions) -> driver.PairRun:
    provider = options.provider
    try:
        return driver.check_pair(original, rewritten, feeds, options)
    except RuntimeUnavailable as e:
        if e.kind == "provider_unavailable":
            raise RuntimeUnavailable(e.kind, f"ONNX Runtime provider '{provider}' is unavailable: {e.message}") from e
        raise
    except RunFailed as e:
        if e.kind == "load_failed" and any(m in e.message for m in _MISSING_OP):
            raise RuntimeUnavailable(e.kind, f"this onnxruntime cannot load the model ({e.message}); run the "
                                     "check with --python pointing at an environment with the ORT build that "
                                     "has these ops (e.g. onnxruntime-training)") from e
        if e.kind == "bad_feeds":
            raise UsageError(e.message) from e
        if e.kind == "load_failed" and "cannot start" not in e.message and "cannot import" not in e.message:
            # ckpt's validation had ORT load it with optimizations off: not the model's fault
            raise RunFailed(e.kind, f"ONNX Runtime could not load a model ckpt validated (ORT loads it with "
                                    f"optimizations off): {e.message}") from e
        raise RunFailed(e.kind, f"ONNX Runtime failed ({e.kind}): {e.message}"
                                f"{_known_cause(original, e) or _known_cause(rewritten, e)}") from e


def _known_cause(path: Path, e: RunFailed) -> str:
    """A crash's known cause in the kernels of the model at ``path``, as a clause of the message, or ''."""
    if e.kind != "crashed":
        return ""
    try:
        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception:  # noqa: BLE001 - a model onnx cannot read: the crash is the message, a cause only a bonus
        return ""
    defects = ort_kernel_defects(graph.node, declarations(graph))
    return f"; a known cause: {defects[0]}" if defects else ""


def _pair_options(options: CheckOptions, expected_order: tuple[str, ...], enable_mem_reuse: bool,
                  reference_level: str | None) -> driver.PairOptions:
    return driver.PairOptions(provider=options.provider, runs=options.runs, rtol=options.rtol or 0.0,
                              atol=options.atol or 0.0, enable_mem_reuse=enable_mem_reuse,
                              expected_order=expected_order or None, reference_level=reference_level,
                              worker=driver.WorkerOptions(python=options.python, timeout=options.timeout,
                                                          seed=options.seed))


def _output_figures(pair: driver.PairRun, options: CheckOptions, model: onnx.ModelProto) -> OutputFigures:
    tolerant = options.rtol is not None or options.atol is not None
    return OutputFigures(pair.outputs_equal, pair.outputs_within_tolerance,
                         {"rtol": options.rtol, "atol": options.atol} if tolerant else None,
                         pair.max_abs_diff, pair.outputs, pair.reference_level, pair.unoptimized_vs_rewritten,
                         _spread_verdict(pair.run_to_run, model))


def _measured_runs(pair: driver.PairRun) -> MeasuredRuns:
    return MeasuredRuns.of(pair)


def _plain_prediction(rewritten: str | Path, predicted: Prediction, pair: driver.PairRun,
                      default: Measurement | None, timeout: float | None) -> tuple[PlainPrediction, list[Finding]]:
    """The rewrite's plain-session prediction against ``default``, its peak under ORT's
    defaults; with the notes it gives."""
    plain = predicted.plain_in_use_bytes
    # the memory-pattern model is the CPU arena's: CUDA's plain session is not modelled,
    # and process_peak runs with the arena off
    if pair.provider != "cpu" or plain is None or default is None or default.method != "profiler":
        return PlainPrediction(), []
    error = _relative_error(plain, default.peak_bytes)
    if abs(error or 0.0) <= PLAIN_FUSED_ABOVE:
        return PlainPrediction(plain, error), []
    fused = fused_plain(rewritten, predicted.tensors or {}, timeout)
    executed = pair.rewritten.ort_default_order
    if fused is not None and executed is not None and list(fused.order) != executed:
        return PlainPrediction(plain, error), [note("plain_fused_order", "the plain session did not run ORT's fused "
                                                    "graph in the order ORT writes it: ckpt's model of it is left out")]
    if fused is None:
        return PlainPrediction(plain, error), []
    return PlainPrediction(plain, error, fused.peak_in_use_bytes,
                           _relative_error(fused.peak_in_use_bytes, default.peak_bytes)), []


def _prediction_figures(predicted: dict[str, Prediction], measured: MeasuredRuns, max_error: float,
                        plain: PlainPrediction) -> PredictionFigures:
    sides = ("original", "rewritten")
    runs = {k: getattr(measured, k) for k in sides}
    tensor = {k: _tensor_prediction(predicted[k], runs[k]) for k in sides}
    in_use = {k: predicted[k].in_use_bytes for k in sides}
    return PredictionFigures(
        tensor, {k: _relative_error(tensor[k], runs[k].peak_requested_bytes) for k in sides},
        in_use, {k: _relative_error(in_use[k], runs[k].peak_bytes) for k in sides}, max_error, plain,
        {k: list(predicted[k].unsized) for k in sides if predicted[k].unsized})


def _measure_pair(original: str | Path, rewritten: str | Path, model: onnx.ModelProto, options: CheckOptions,
                  pair_options: driver.PairOptions, dims: dict[str, int]) -> driver.PairRun:
    with tempfile.TemporaryDirectory(prefix="ckpt_feeds_") as tmp:
        feeds_path = Path(tmp) / "feeds.npz"
        prepare_feeds(model, feeds_path, options.seed, dims, options.feeds_file)
        return _run(Path(original), Path(rewritten), feeds_path, pair_options)


@dataclass(frozen=True)
class RunsAt:
    """Where a check runs the files besides its options: the values of the symbolic
    dimensions every figure is at (``dims``), ``other_dims`` where both files run once more
    (outputs only), and the session the rewrite is run in (``user_session``): "ort_default"
    for a file written for ORT's defaults and for an ORT training artifact (the Module API
    runs those in an untuned session), else "ckpt" (its recorded settings); ``artifact``:
    the original is an ORT training artifact, also trained in the Module API."""

    dims: Mapping[str, int] = field(default_factory=dict)
    other_dims: Mapping[str, int] | None = None
    user_session: str = "ckpt"
    artifact: bool = False


def _at_other_dims(original: str | Path, rewritten: str | Path, model: onnx.ModelProto, options: CheckOptions,
                   pair_options: driver.PairOptions, other: Mapping[str, int] | None) -> OtherDims | None:
    """Both files run once more with ``other`` values of the symbolic dimensions (none with
    the user's feeds): a file that only runs at the analysed values fails the check."""
    if not other or options.feeds_file is not None:
        return None
    with tempfile.TemporaryDirectory(prefix="ckpt_feeds_") as tmp:
        feeds_path = Path(tmp) / "feeds.npz"
        prepare_feeds(model, feeds_path, options.seed, dict(other), None)
        return driver.outputs_at(Path(original), Path(rewritten), feeds_path, other, pair_options)


def _module_sessions(original: str | Path, rewritten: str | Path, model: onnx.ModelProto, options: CheckOptions,
                     worker: driver.WorkerOptions, provider: str, dims: Mapping[str, int]) -> ModuleSessions:
    """Both training models in the Module API (``module_runs``), on the check's feeds."""
    if provider != "cpu":
        return ModuleSessions(f"the Module API runs on CPU here, the check on {provider}")
    with tempfile.TemporaryDirectory(prefix="ckpt_feeds_") as tmp:
        feeds_path = Path(tmp) / "feeds.npz"
        prepare_feeds(model, feeds_path, options.seed, dict(dims), options.feeds_file)
        return module_sessions(original, rewritten, feeds_path, worker, dims=dims)


def check_files(original: str | Path, rewritten: str | Path, predicted: dict[str, Prediction],
                options: CheckOptions = CheckOptions(), *, enable_mem_reuse: bool = True,
                feeds_model: onnx.ModelProto | None = None,
                dims: RunsAt | Mapping[str, int] | None = None,
                reference_level: str | None = None) -> CheckFigures:
    """Measure both files and judge the rewrite (``measure_files``, then ``rules.judge``)."""
    figures = measure_files(original, rewritten, predicted, options, enable_mem_reuse=enable_mem_reuse,
                            feeds_model=feeds_model, dims=dims, reference_level=reference_level)
    return judge(figures, tolerant=figures.outputs.tolerance is not None)


def measure_files(original: str | Path, rewritten: str | Path, predicted: dict[str, Prediction],
                  options: CheckOptions = CheckOptions(), *, enable_mem_reuse: bool = True,
                  feeds_model: onnx.ModelProto | None = None,
                  dims: RunsAt | Mapping[str, int] | None = None,
                  reference_level: str | None = None) -> CheckFigures:
    """Measure both files: the figures the rules judge, with the measurement's own notes.

    ``predicted`` maps "original"/"rewritten" to ckpt's predictions for those files
    under the check's settings (``enable_mem_reuse`` is the setting the rewritten file
    asks for; both run with it). Outputs must be bit-identical unless ``options.rtol``/
    ``options.atol`` are given. ``feeds_model`` is the original ModelProto when already loaded.
    ``reference_level``: the rewritten file holds ORT's fusions made at this optimization
    level; its outputs are compared with the original's at that level. ``dims``: the values
    of the symbolic dimensions (a ``RunsAt`` also gives others, and the user's session).
    """
    import onnx

    model = feeds_model if feeds_model is not None else onnx.load(str(original), load_external_data=False)
    pair_options = _pair_options(options, predicted["rewritten"].order, enable_mem_reuse, reference_level)
    runs_at = dims if isinstance(dims, RunsAt) else RunsAt(dict(dims or {}))
    pair = _measure_pair(original, rewritten, model, options, pair_options, dict(runs_at.dims))
    outputs, measured = _output_figures(pair, options, model), _measured_runs(pair)
    plain, found = _plain_prediction(rewritten, predicted["rewritten"], pair, measured.rewritten_ort_default,
                                     options.timeout)
    module = (_module_sessions(original, rewritten, model, options, pair_options.worker, pair.provider, runs_at.dims)
              if runs_at.artifact else None)
    return CheckFigures(pair.provider, pair.rewritten.ckpt.ort_version, enable_mem_reuse, outputs, measured,
                        pair.order, _prediction_figures(predicted, measured, options.max_prediction_error, plain),
                        _at_other_dims(original, rewritten, model, options, pair_options, runs_at.other_dims),
                        runs_at.user_session, module, findings=tuple(found))


# Ops that move or relabel data: the kernel that computed an output sits above them.
_PASS_THROUGH = VIEW_OPS | {"Transpose", "Cast"}


# A rewrite's output that differs from the original's is accepted only when the kernel
# computing it is seen to vary between two runs of the original itself (atomics in
# ScatterND, cuDNN's weight gradients, reductions on CUDA), and by no more than this many
# times the largest spread seen from that kernel, or within the default tolerance.
SPREAD_FACTOR = 4.0


def _kernel_of(producer: dict[str, onnx.NodeProto], name: str) -> str | None:
    node = producer.get(name)
    while node is not None and node.op_type in _PASS_THROUGH and node.input:
        node = producer.get(node.input[0])
    return node.op_type if node is not None else None


def _spread_verdict(spread: Mapping[str, Spread] | None, model: onnx.ModelProto) -> RunToRun | None:
    """Judge each differing output against the run-to-run spread of its kernel."""
    if spread is None:
        return None
    producer = {o: n for n in model.graph.node for o in n.output}
    kernel = {name: _kernel_of(producer, name) for name in spread}
    kernel_spread: dict[str, float] = {}
    for name, e in spread.items():
        if e.original_spread > 0:
            k = kernel[name] or "?"
            kernel_spread[k] = max(kernel_spread.get(k, 0.0), e.original_spread)
    outputs = {}
    for name, e in spread.items():
        if e.bit_identical:
            continue
        seen = kernel_spread.get(kernel[name] or "?", 0.0)
        outputs[name] = replace(e, kernel=kernel[name], accepted=seen > 0 and (
            e.within_tolerance or e.rewrite_diff <= SPREAD_FACTOR * seen))
    return RunToRun(outputs, tuple(name for name, e in outputs.items() if not e.accepted),
                    dict(sorted(kernel_spread.items())), sum(1 for e in spread.values() if e.original_spread > 0))


def _tensor_prediction(p: Prediction, m: Measurement) -> int:
    """The prediction a measurement is judged against: a process peak sees kernel scratch."""
    return p.process_bytes if m.method == "process_peak" and p.process_bytes is not None else p.tensor_bytes


def predict(a: Analysis, reuse_buffers: bool, plain: bool = False) -> Prediction:
    """ckpt's prediction for a graph run with ``enable_mem_reuse = reuse_buffers``; with
    ``plain``, also in a plain session (what an unmodified ``InferenceSession`` gets)."""
    from ..analysis.pattern import predict_plain

    profile = a.profile(reuse_buffers)  # simulated here with the other reuse: replayed from it
    arena = a.replayed if profile is a.priority else predict_in_use(a.graph, profile, a.tensors)
    return Prediction(profile.activation_peak_bytes, arena.peak_in_use_bytes,
                      tuple(a.graph.nodes[i].name for i in a.priority.order),
                      predict_plain(a.graph, a.tensors).peak_in_use_bytes if plain else None,
                      a.tensors if plain else None, tuple(sorted(a.unsized)),
                      visible_peak(profile, a.graph, a.tensors, PROCESS_PEAK_MIN_BLOCK))


def _same_outputs(original: Graph, rewritten: Graph) -> None:
    """A rewrite has the original's outputs: outputs compared one by one need the same names."""
    a, b = set(original.outputs), set(rewritten.outputs)
    if a != b:
        only = [f"only the {side} has {', '.join(sorted(names)[:5])}"
                for side, names in (("original", a - b), ("rewritten model", b - a)) if names]
        raise CheckFailed(f"the models' outputs differ: {'; '.join(only)}")


def _user_session(artifact: bool, plan: SessionPlan) -> str:
    """The session the rewrite is run in (``RunsAt.user_session``)."""
    return "ort_default" if plan.session == "ort_default" or artifact else "ckpt"


def _artifact(analysed: dict[str, Analysis]) -> bool:
    from ..rewrite.mem_pattern import is_ort_artifact

    return is_ort_artifact(analysed["original"].graph)


def check_analysed(paths: dict[str, Path], analysed: dict[str, Analysis], dims: dict[str, int],
                   options: CheckOptions, also: tuple[Rule, ...] = ()) -> CheckFigures:
    """``check_files`` for two analysed files: each predicted under the setting the rewrite
    asks for, run on the provider an offline-optimized file was made for; judged by the
    verdict's rules and then ``also`` (a budget's, ``rules.held_within``)."""
    _same_outputs(analysed["original"].graph, analysed["rewritten"].graph)
    reuse = analysed["rewritten"].reuse_buffers  # both run with the setting the rewrite asks for
    # A file ORT optimized offline runs on the provider it was optimized for, and its fusions
    # round like the original's at that optimization level: compare outputs with that.
    plan = SessionPlan.read(analysed["rewritten"].graph.model, paths["rewritten"])
    optimized = plan.ort_optimize
    provider = optimized["provider"] if optimized and options.provider == "auto" else options.provider
    predicted = {k: predict(a, reuse, plain=k == "rewritten") for k, a in analysed.items()}
    artifact = _artifact(analysed)
    figures = measure_files(paths["original"], paths["rewritten"], predicted, replace(options, provider=provider),
                            enable_mem_reuse=reuse, feeds_model=analysed["original"].graph.model,
                            dims=RunsAt(dims, other_assignment(analysed["original"]), _user_session(artifact, plan),
                                        artifact),
                            reference_level=optimized["level"] if optimized else None)
    return judge(figures, figures.outputs.tolerance is not None, RULES + also)


# CheckFigures: api.py takes it from here, with check_analysed.
__all__ = ["CheckFigures", "Prediction", "RunsAt", "check_analysed", "check_files", "measure_files", "predict"]
