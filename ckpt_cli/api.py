"""ckpt as a library: one call per command, each taking a path or an ``onnx.ModelProto``.

::

    import onnx, ckpt_cli
    model = onnx.load("model.onnx")
    result = ckpt_cli.rewrite_model(model, budget="60%")      # nothing written to disk
    check = ckpt_cli.check_models(model, result.model)          # both run on ONNX Runtime
    assert check.passed, check.figures.failures

Every result has ``to_json()``, the same object the command prints with ``--json``.
The command line (``ckpt_cli.cli``) only parses options, calls these and renders.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, TypeVar, Union

import onnx

from .version import __version__
from .analysis import Analysis, analyse, symbolic_dims
from .analysis.scaling import Scaling, probe_tensors, scaling, symbolic_shapes
from .analysis.shapes import infer_tied, resolve_dims, tied_dims
from .errors import BudgetUnreachable, CkptError, ModelError, UsageError
from .ort.expand import expand_functions
from .graph import Graph
from .markers import PROVENANCE_PREFIX
from .io.load import Acceptance, load_graph, open_graph
from .planning.budget import Planned
from .rewrite.select import judged_rewrite, make_plan, plan_notes, plan_rows, planned_rewrite, rewrite_plan
from .verify.plain_choice import judged_in_plain
from .verify.driver import WorkerOptions
from .verify.module_choice import Writer, judged_by_training, judged_in_module
from .planning.decision import Decision
from .options import AnalysisOptions, CheckOptions, PlanOptions, RewriteOptions
from .planning.plan import Plan, Policy
from .background import Background
from .progress import stage
from .report.model import (Options, Report, Source, check_report, inspect_report, plan_report, planning_section,
                           rewrite_report)
from .report.headline import check_headline
from .rewrite import (ModulePeaks, RewriteResult, rewrite, with_pattern_advice, without_mem_pattern,
                      written as analysed_written)
from .rewrite.mem_pattern import is_ort_artifact
from .verify.module_model import module_peaks
from .io.save import check_output_path, save_model
from .verify.rules import Rule, held_within
from .ort.settings import settings_snippet
from .verify.stage import CheckFigures, check_analysed
from .io.written import to_model, unplanned_shapes

if TYPE_CHECKING:
    from .optimize import Optimized

ModelInput = Union[str, Path, onnx.ModelProto]
T = TypeVar("T")



@dataclass(frozen=True)
class Loaded:
    """A model input, loaded: its graph, what reports call it, and where its external data lives."""

    graph: Graph
    source: Source
    path: Path | None  # the file, when the input was one
    data_dir: Path | None  # folder external-data locations are relative to
    # onnx's checker and ORT's load of the file, decided beside the analysis (``analyse_input``)
    acceptance: Acceptance = field(default_factory=Acceptance)


def _typed(name: str, value: T, cls: type | tuple[type, ...]) -> T:
    """``value`` when it is None or a ``cls``; anything else is the caller's TypeError."""
    if value is not None and not isinstance(value, cls):
        expected = "a path" if isinstance(cls, tuple) else cls.__name__
        raise TypeError(f"{name}: expected {expected}, got {type(value).__name__}")
    return value


_PATH = (str, os.PathLike)


def load_input(model: ModelInput) -> Loaded:
    """A path is loaded from disk; a ModelProto is indexed as it is (its external data,
    if any, must be resolvable from the current folder)."""
    if not isinstance(model, (str, os.PathLike, onnx.ModelProto)):
        raise TypeError(f"model: expected a path or an onnx.ModelProto, got {type(model).__name__}")
    if isinstance(model, onnx.ModelProto):
        if not model.HasField("graph") or not model.graph.node:
            raise ModelError("<in-memory model>: not an ONNX model (no graph with nodes in it)")
        proto = onnx.ModelProto()
        proto.CopyFrom(model)  # the caller's model is never modified
        graph = Graph.from_model(proto)
        graph.topological_order()  # raises on a cycle
        graph = expand_functions(graph)  # plan on the nodes ORT runs
        return Loaded(graph, Source.of_proto(model), None, Path("."))
    path = Path(model)
    graph, acceptance = open_graph(path)
    return Loaded(graph, Source.of_file(path), path, path.parent, acceptance)


@contextmanager
def _refusal_first(loaded: Loaded) -> Iterator[None]:
    """An error the block raises comes after the refusal of ``loaded``'s file by onnx's
    checker or ORT, as when those checks ran before it."""
    try:
        yield
    except Exception:
        loaded.acceptance.confirm()
        raise


def analyse_input(loaded: Loaded, analysis: AnalysisOptions | None = None) -> Analysis:
    """``analyse`` with the option checks every command shares; the file's refusal by
    onnx's checker or ORT (``Loaded.acceptance``) comes first."""
    with _refusal_first(loaded):
        a = _analysed_input(loaded, analysis)
    loaded.acceptance.confirm()
    return a


def _analysed_input(loaded: Loaded, analysis: AnalysisOptions | None) -> Analysis:
    analysis = (_typed("analysis", analysis, AnalysisOptions) or AnalysisOptions()).validate()
    dims = dict(analysis.dims)
    known = symbolic_dims(loaded.graph)  # cheap: reads the graph's inputs and outputs only
    unknown = set(dims) - known
    if unknown:
        have = ", ".join(sorted(known)) or "none"
        raise UsageError(f"--dim {sorted(unknown)[0]}: no such symbolic dimension in the model (it has: {have})")
    bound, defaulted = resolve_dims(loaded.graph, dims)
    loss, outputs = analysis.loss, list(analysis.grad_outputs) or None
    if not defaulted:
        a = analyse(loaded.graph, bound, loss, outputs)
    else:
        shapes = infer_tied(loaded.graph, bound, defaulted)
        a = analyse(loaded.graph, shapes.dims, loss, outputs, shapes.tensors, default_dims=defaulted)
    _refuse_contradicted_ties(a, dims)
    return a


def _refuse_contradicted_ties(a: Analysis, given: dict[str, int]) -> None:
    """A --dim that a tied dimension contradicts (the flattened labels of a language model's
    loss, ``batch_x_32`` beside ``batch``) would size the labels apart from the scores."""
    for name, value in tied_dims(a.graph, a.tensors, tuple(given)).items():
        if given[name] != value:
            others = ", ".join(f"{d}={v}" + (" (ckpt's default: set it with --dim)" if d in a.default_dims else "")
                               for d, v in a.dims if d != name) or "the model's sizes"
            raise UsageError(f"--dim {name}={given[name]} contradicts the other dimensions: the loss's labels "
                             f"need {name}={value} at {others}")


_ANALYSIS_KEYWORDS = ("dims", "loss", "grad_outputs")


def refuse_unsized(a: Analysis, allowed: bool) -> None:
    """A plan on tensors of unknown size counts them as 0 B: never in silence."""
    unsized = a.unsized
    if unsized and not allowed:
        g = a.graph
        names = ", ".join(f"{t} ({g.nodes[g.producer[t]].op_type})" for t in list(unsized)[:3])
        raise ModelError(f"{len(unsized)} tensors have a size known only at run time (e.g. {names}): a plan would "
                         "count them as 0 B (--allow-unsized plans anyway)")


def _split_keywords(keywords: dict[str, Any]) -> tuple[AnalysisOptions | None, dict[str, Any]]:
    """The keyword form of a call: its analysis options, and the rest."""
    given = {k: keywords.pop(k) for k in _ANALYSIS_KEYWORDS if k in keywords}
    return (AnalysisOptions.of(**given) if given else None), keywords


# ----------------------------------------------------------------------------- inspect


@dataclass(frozen=True)
class InspectResult:
    analysis: Analysis
    report: Report

    def to_json(self) -> Report:
        return self.report


@dataclass(frozen=True)
class InspectRun:
    """What ``inspect`` found: the model as loaded, its analysis and how it scales."""

    loaded: Loaded
    analysis: Analysis
    options: AnalysisOptions
    scaled: Scaling | None


def _inspect_report(run: InspectRun) -> Report:
    return {**inspect_report(run.analysis, run.loaded.source, run.options.to_json()),
            "scaling": run.scaled.to_json() if run.scaled else None}


def inspect_model(model: ModelInput, options: AnalysisOptions | None = None, **keywords: Any) -> InspectResult:
    """Phases, stashed activations and the predicted peak under both ORT orders.
    ``options`` (or the keywords ``dims``, ``loss``, ``grad_outputs``): how to read the graph."""
    options = _typed("options", options, AnalysisOptions) or AnalysisOptions.of(**keywords)
    loaded = load_input(model)
    a = analyse_input(loaded, options)
    run = InspectRun(loaded, a, options, scaling(a))
    return InspectResult(a, _inspect_report(run))


@dataclass(frozen=True)
class Scaled:
    """How the figures move with the symbolic dimensions (``scaling``), and the regions of
    the plan made at twice their values (``again``, its plan file's; None: no plan), when
    the model has any."""

    scaling: Scaling
    again: Any
    unreachable: str | None = None  # why no plan fits the budget at twice the dimensions


Again = Background[tuple[Any, "str | None"]]  # ``again`` and ``unreachable``, planned beside the command


def _again(scaled: Scaling | None, replan: Callable[[Analysis], Planned | None], names: list[str]) -> Again | None:
    """The plan ``replan`` makes at twice the dimensions, started beside the command's own
    plan (it takes as long). A budget in bytes that the doubled sizes cannot meet is a fact
    about them, not a failure of the command."""
    if scaled is None:
        return None
    doubled = scaled.doubled

    def work() -> tuple[Any, str | None]:
        try:
            planned = replan(doubled)
        except BudgetUnreachable as e:
            return None, str(e)
        return _regions(planned, names), None

    return Background(work)


def _scaled(scaled: Scaling | None, again: Again | None) -> Scaled | None:
    if scaled is None or again is None:
        return None
    return Scaled(scaled, *again.result())


def _regions(planned: Planned | None, names: list[str]) -> Any:
    return planned.plan.to_json(names)["regions"] if planned and planned.plan else None


def _scaling_report(a: Analysis, planned: Planned | None, scaled: Scaled | None) -> Report | None:
    """``scaled`` as the report says it: whether the plan made at twice the dimensions is this one."""
    if scaled is None:
        return None
    same = _regions(planned, [n.name for n in a.graph.nodes]) == scaled.again
    unreachable = {} if scaled.unreachable is None else {"budget_unreachable_at_doubled_dims": scaled.unreachable}
    return {**scaled.scaling.to_json(), "same_plan_at_doubled_dims": same, **unreachable}


# ----------------------------------------------------------------------------- plan


@dataclass(frozen=True)
class PlanRun:
    """What ``plan`` made: the plan chosen (``planned``) and applied in memory (``result``)."""

    loaded: Loaded
    analysis: Analysis
    planned: Planned
    result: RewriteResult
    scaled: Scaled | None
    output: str | Path | None  # where the plan file goes, as given
    options: Options  # the options as the report records them


def _plan_report(run: PlanRun) -> Report:
    a, planned, result = run.analysis, run.planned, run.result
    return {**plan_report(a, run.loaded.source, planned, result, plan_rows(a, planned, result),
                          str(run.output) if run.output else None, run.options),
            "scaling": _scaling_report(a, planned, run.scaled)}


@dataclass(frozen=True)
class PlanResult:
    analysis: Analysis
    planned: Planned
    rewrite: RewriteResult  # the plan applied (in memory), which the figures describe
    report: Report

    @property
    def decisions(self) -> dict[str, Decision]:
        """Per stashed buffer of the input: kept or recomputed, and why (the rewrite's final word)."""
        return self.rewrite.decisions

    def to_json(self) -> Report:
        return self.report


def plan_model(model: ModelInput, options: PlanOptions | None = None, *, analysis: AnalysisOptions | None = None,
               output: str | Path | None = None, force: bool = False,
               progress: Callable[[str], None] | None = None, python: str | None = None,
               **keywords: Any) -> PlanResult:
    """Choose regions (``options``, or its keywords: ``auto`` = layers, sqrt, balanced,
    budget, optimal; ``budget`` = '2GiB' or '40%'; ``activation_budget`` = F in [0, 1], PyTorch's
    activation_memory_budget; ``policy`` = per-op rules) and explain the choice; with
    ``output``, write the plan file there. The default is judged as ``rewrite_model`` judges
    it: with ``python`` (an interpreter with onnxruntime-training), an ORT training
    artifact's by training its plans in the Module API."""
    from .io.save import write_text_atomic
    import json

    given, keywords = _split_keywords(keywords)
    analysis = analysis or given or AnalysisOptions()
    options = (_typed("options", options, PlanOptions) or PlanOptions.of(**keywords)).validate()
    _typed("output", output, _PATH)
    loaded = load_input(model)
    a = analyse_input(loaded, analysis)
    refuse_unsized(a, options.allow_unsized)
    if output is not None:
        check_output_path(Path(output), loaded.path, force)
    _typed("python", python, str)
    as_rewritten = RewriteOptions(options, trainer=python).validate()
    scaled = scaling(a)
    again = _again(scaled, lambda d: make_plan(d, options), [n.name for n in a.graph.nodes])
    writer = _writer(a, as_rewritten, analysis, scaled)
    planned = _judged_default(a, make_plan(a, options, progress=progress), as_rewritten, writer)
    result = rewrite_plan(a, planned, module_peaks=_module_peaks(a, as_rewritten, writer, planned.plan))
    planned = planned.settled()
    run = PlanRun(loaded, a, planned, result, _scaled(scaled, again), output,
                  {**options.to_json(), **analysis.to_json()})
    report = _plan_report(run)
    if output is not None:
        write_text_atomic(Path(output), json.dumps(report["plan"], indent=2) + "\n")
    return PlanResult(a, planned, result, report)


def sweep_model(model: ModelInput, *, svg: str | Path | None = None, policy: Policy | None = None,
                analysis: AnalysisOptions | None = None, allow_unsized: bool = False, **keywords: Any) -> Report:
    """``ckpt plan --sweep``: predicted peak against recompute share over the min-cut
    front (each point a real rewrite), as a report; with ``svg``, the chart there too."""
    from .planning.sweep import sweep_points
    from .report.sweep_view import sweep_report, sweep_svg
    from .io.save import write_text_atomic

    given, _ = _split_keywords(keywords)
    analysis = analysis or given or AnalysisOptions()
    policy = PlanOptions(policy=policy or Policy()).validate().policy
    _typed("svg", svg, _PATH)
    loaded = load_input(model)
    a = analyse_input(loaded, analysis)
    refuse_unsized(a, allow_unsized)
    points = sweep_points(a, lambda p: rewrite(a, p, pin=False), policy)
    notes = [policy.describe()] if policy else []
    if svg is not None:
        name = loaded.path.name if loaded.path else "model"
        write_text_atomic(Path(svg), sweep_svg(points, f"{name}: predicted peak against recompute"))
        notes.append(f"chart written to {svg}")
    options = {"sweep": True, "svg": str(svg) if svg else None, **PlanOptions(policy=policy).policy_json(),
               **analysis.to_json()}
    return sweep_report(a, loaded.source, points, options, notes)


# ----------------------------------------------------------------------------- check


@dataclass(frozen=True)
class CheckRun:
    """What ``check`` judged: the two models (as reports name them) and the figures."""

    original: Source
    rewritten: Source
    figures: CheckFigures
    options: Options  # the options as the report records them


def _check_report(run: CheckRun) -> Report:
    return check_report(run.original, run.rewritten, run.figures.to_json(), run.options)


@dataclass(frozen=True)
class CheckResult:
    figures: CheckFigures
    report: Report

    @property
    def passed(self) -> bool:
        return self.figures.passed

    def to_json(self) -> Report:
        return self.report


def _on_disk(model: ModelInput, folder: Path, name: str) -> Path:
    """The model's file; an in-memory model is written to ``folder`` first."""
    if not isinstance(model, onnx.ModelProto):
        return Path(model)
    path = folder / name
    save_model(model, path, source_dir=Path("."))
    return path


def check_models(original: ModelInput, rewritten: ModelInput, *, analysis: AnalysisOptions | None = None,
                 options: CheckOptions | None = None, **keywords: Any) -> CheckResult:
    """Run both models on ONNX Runtime and judge the rewrite: outputs, measured peak, the
    executed order and the prediction. In-memory models are written to a temporary folder
    first, so what runs is always the bytes a user would save. ``analysis`` (or the keywords
    ``dims``, ``loss``, ``grad_outputs``): how to read both graphs."""
    given, rest = _split_keywords(keywords)
    if rest:
        raise TypeError(f"check_models() got an unexpected keyword argument {sorted(rest)[0]!r}")
    analysis = analysis or given or AnalysisOptions()
    options = (_typed("options", options, CheckOptions) or CheckOptions()).validate()
    with tempfile.TemporaryDirectory(prefix="ckpt_check_") as tmp:
        paths = {"original": _on_disk(original, Path(tmp), "original.onnx"),
                 "rewritten": _on_disk(rewritten, Path(tmp), "rewritten.onnx")}
        stage("analysing both models")
        analysed = {k: analyse_input(load_input(p), analysis) for k, p in paths.items()}
        figures = check_analysed(paths, analysed, dict(analysed["original"].dims), options)
    run = CheckRun(_source(original), _source(rewritten), figures,
                   {**options.to_json(), "dims": analysis.to_json()["dims"]})
    return CheckResult(figures, _check_report(run))


def _source(model: ModelInput) -> Source:
    return Source.of_proto(model) if isinstance(model, onnx.ModelProto) else Source.of_file(model)


# ----------------------------------------------------------------------------- rewrite


@dataclass(frozen=True)
class Written:
    """The rewrite as written: the model (ORT's optimization of it with ``--ort-optimize``),
    its figures, the files written, ORT's optimization record and the notes on it."""

    model: onnx.ModelProto
    result: RewriteResult
    files: list[Path]
    optimized: Optimized | None = None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class RewriteRun:
    """What ``rewrite`` made, in one value: the input (``loaded``, ``analysis``), the plan
    (``planned``; None with no_recompute), the model ``written`` and its ``check``."""

    loaded: Loaded
    analysis: Analysis
    planned: Planned | None
    written: Written
    check: CheckFigures | None
    options: RewriteOptions
    recorded: Options  # the options as the report records them
    scaled: Scaled | None
    notes: tuple[str, ...]  # the plan's notes


def _rewrite_report(run: RewriteRun, check_error: Report | None = None) -> Report:
    """The report of ``run`` (with ``check_error``: why its check did not judge it)."""
    a, w, planned, options = run.analysis, run.written, run.planned, run.options
    chosen = planned.plan if planned else None
    path = str(w.files[0]) if w.files else None
    report = rewrite_report(a, run.loaded.source, w.result, path,
                            chosen.to_json([n.name for n in a.graph.nodes]) if chosen else None,
                            list(run.notes + w.notes),
                            settings_snippet(options.ort_optimize if w.optimized and options.ort_optimize else "cpu",
                                             w.result.mem_reuse, path, w.result.session,
                                             w.result.pattern_off.input if w.result.pattern_off else None,
                                             w.result.mem_arena),
                            run.recorded)
    planning = {} if planned is None else {"planning": planning_section(a, planned, w.result,
                                                                        plan_rows(a, planned, w.result))}
    report = {**report, "ort_optimize": w.optimized.to_json() if w.optimized else None,
              "scaling": _scaling_report(a, planned, run.scaled), **planning}
    if check_error is not None:
        return {**report, "check_error": check_error}
    if run.check is None:
        return report
    checked = run.check.to_json()
    return {**report, "check": checked,
            "headline": check_headline(checked, (a.priority.peak_bytes, w.result.after.priority.peak_bytes))}


@dataclass(frozen=True)
class RewriteModelResult:
    model: onnx.ModelProto  # the rewritten model (nodes in the order ORT must run them)
    result: RewriteResult
    analysis: Analysis  # of the input
    planned: Planned | None
    report: Report
    written: list[Path] = field(default_factory=list)  # the model file (and its .data), when written
    check: CheckFigures | None = None

    @classmethod
    def of(cls, run: RewriteRun) -> "RewriteModelResult":
        w = run.written
        return cls(w.model, w.result, run.analysis, run.planned, _rewrite_report(run), w.files, run.check)

    @property
    def decisions(self) -> dict[str, Decision]:
        """Per stashed buffer of the input: kept or recomputed, and why (empty with no_recompute)."""
        return self.result.decisions

    def to_json(self) -> Report:
        return self.report


def rewrite_model(model: ModelInput, output: str | Path | None = None, options: RewriteOptions | None = None, *,
                  analysis: AnalysisOptions | None = None, force: bool = False, check: bool | CheckOptions = False,
                  progress: Callable[[str], None] | None = None, **keywords: Any) -> RewriteModelResult:
    """Rewrite a training graph to recompute activations instead of stashing them.

    ``options`` (or its keywords): regions come from ``regions`` (globs or ``re:`` regexes
    over node names), ``regions_by_scope``, ``boundaries`` ('IN1,IN2:OUT1'), a ``plan``
    file, ``auto``, ``budget`` or ``activation_budget``; with none, the knee of the front, judged again in a plain
    session. ``pin`` holds the written order in the data flow (guard nodes), so that any
    ORT session runs it; with ``keep_mem_pattern=False`` it also turns ORT's memory pattern
    off where that predicts a lower plain-session peak (an optional input nobody feeds,
    ``rewrite/mem_pattern.py``), which changes the model's inputs. The
    rewritten ModelProto is in the result; it is written only when ``output`` is given
    (atomically, never over the input). ``check`` (True or CheckOptions) runs both models
    on ONNX Runtime. ``ort_optimize`` ("cpu" or "cuda") then lets ORT fuse the rewritten
    graph for that provider (ORT_ENABLE_EXTENDED) and writes ORT's graph, re-sorted and
    re-simulated; ORT's child process for it may run ``timeout`` seconds (None: no limit;
    the check's runs take ``check``'s)."""
    given, keywords = _split_keywords(keywords)
    analysis = analysis or given or AnalysisOptions()
    options = (_typed("options", options, RewriteOptions) or RewriteOptions.of(**keywords)).validate()
    if not isinstance(check, (bool, CheckOptions)):
        raise TypeError(f"check: expected True, False or CheckOptions, got {type(check).__name__}")
    check_options = (check if isinstance(check, CheckOptions) else CheckOptions()).validate()
    _typed("output", output, _PATH)
    stage("reading the model")
    loaded = load_input(model)
    with _refusal_first(loaded):
        if output is not None:
            check_output_path(Path(output), loaded.path, force)
        if options.work_around_ort_defects:
            loaded = _worked_around(loaded)
    stage("analysing the graph")
    a = analyse_input(loaded, analysis)
    refuse_unsized(a, options.plan.allow_unsized)
    run = _rewritten(a, loaded, options, analysis, output, progress)
    if check:
        run = replace(run, check=_checked(model, run, check_options))
    return RewriteModelResult.of(run)


def _checked(model: ModelInput, run: RewriteRun, options: CheckOptions) -> CheckFigures:
    """``run``'s rewrite checked on ORT; a check that cannot judge it raises with the
    run's report saying why (the model is written)."""
    try:
        stage("ORT check: analysing the written model")
        return _check_rewrite(model, run, options)
    except CkptError as e:
        from .report.text import plain  # rich: only on this path

        e.report = _rewrite_report(run, check_error={"exit_code": e.exit_code, "message": plain(str(e))})
        raise


def _worked_around(loaded: Loaded) -> Loaded:
    """``loaded`` with the ORT kernels known to compute wrongly written another way."""
    from .rewrite.ort_defects import conv_grads_in_2d

    graph, _ = conv_grads_in_2d(loaded.graph)
    return replace(loaded, graph=graph)


def _writer(a: Analysis, options: RewriteOptions, analysis: AnalysisOptions, scaled: Scaling | None) -> Writer:
    """How ``rewrite`` writes a plan's result with these options: the finish (the memory
    pattern's input) and the file's model (provenance, symbolic shapes)."""
    finish = (with_pattern_advice if options.keep_mem_pattern else
              without_mem_pattern if options.pin else None)
    recorded = {**options.to_json(), **analysis.to_json()}
    probes = probe_tensors(a) if scaled else None  # one shape inference, however many plans are written

    def model_of(result: RewriteResult, plan: Plan | None, unplanned: bool = False,
                 shared: bool = False) -> onnx.ModelProto | None:
        shapes = symbolic_shapes(result.graph, result.after.tensors, scaled, probes) if scaled else None
        model = to_model(result, _provenance(recorded, result, plan), shapes)
        if not unplanned:
            return model
        model, hidden = unplanned_shapes(model, result, shapes or {}, sized_at=dict(a.dims), shared=shared)
        return model if hidden else None

    return Writer(finish, model_of)


def _judged_default(a: Analysis, planned: Planned, options: RewriteOptions, writer: Writer) -> Planned:
    """The default judged in the session its users run: an artifact's by training its plans
    in the Module API (with ``options.trainer``), any other in a plain session."""
    if not options.pin:
        return planned
    if options.trainer is not None and options.ort_optimize is None and judged_by_training(a):
        stage("judging the default by training it in the Module API")
        worker = WorkerOptions(options.trainer, options.timeout)
        return judged_in_module(a, planned, a.graph.model, worker, writer)
    stage("judging the default in a plain session")
    return judged_in_plain(a, planned, writer.finish, options.timeout)


def _module_peaks(a: Analysis, options: RewriteOptions, writer: Writer, plan: Plan | None) -> ModulePeaks | None:
    """ckpt's model of the untuned Module session, for an artifact no Module trial judges
    (no checkpoint beside it) when ``options.trainer`` is an ORT training interpreter."""
    if (options.trainer is None or options.ort_optimize is not None or a.graph.path is None
            or not is_ort_artifact(a.graph) or judged_by_training(a)):
        return None
    stage("predicting the Module API's session")

    def save(result: RewriteResult, path: Path) -> bool:
        return writer.save(a, writer.result(result), plan, path, (False, False))

    return module_peaks(a.graph.path, dict(a.dims), save, options.trainer, options.timeout)


def _rewritten(a: Analysis, loaded: Loaded, options: RewriteOptions, analysis: AnalysisOptions,
               output: str | Path | None, progress: Callable[[str], None] | None) -> RewriteRun:
    """Plan, rewrite and write (when ``output``): the run, not yet checked."""
    replan: Callable[[Analysis], Planned | None] = (
        (lambda d: None) if options.no_recompute else (lambda d: make_plan(d, options.plan, pin=options.pin)))
    scaled = scaling(a)
    again = _again(scaled, replan, [n.name for n in a.graph.nodes])
    stage("planning")
    planned = None if options.no_recompute else make_plan(a, options.plan, progress=progress, pin=options.pin)
    writer = _writer(a, options, analysis, scaled)
    if planned is not None:
        planned = _judged_default(a, planned, options, writer)
    chosen = planned.plan if planned else None
    stage("rewriting the graph")
    result = planned_rewrite(a, planned, options.pin)
    # the search's rewrites go before the written one is judged, analysed and saved
    planned = planned.settled() if planned is not None else None
    peaks = _module_peaks(a, options, writer, chosen)
    result = analysed_written(a, writer.result(judged_rewrite(a, planned, result, peaks)))  # analysed for its report
    module = planned.module if planned is not None else None
    rewritten = writer.written(result, chosen, module is not None and module.unplanned,
                               module is not None and module.shared)
    notes = plan_notes(chosen, result)
    stage("writing the model" if options.ort_optimize is None else "optimizing on ORT, writing the model")
    written = _written(rewritten, result, a, loaded, options, output)
    return RewriteRun(loaded, a, planned, written, None, options, {**options.to_json(), **analysis.to_json()},
                      _scaled(scaled, again), tuple(notes))


def _written(rewritten: onnx.ModelProto, result: RewriteResult, a: Analysis, loaded: Loaded,
             options: RewriteOptions, output: str | Path | None) -> Written:
    """The model as written (ORT's optimization of it with ``ort_optimize``), the files
    written, ORT's optimization record and notes."""
    if options.ort_optimize is not None and result.session == "ort_default":
        # A graph written unchanged runs under ORT's defaults, which optimize it themselves.
        note = "--ort-optimize: nothing to optimize offline, the graph is written unchanged for ORT's defaults"
        return Written(rewritten, result, _saved(rewritten, output, loaded.data_dir), None, (note,))
    if options.ort_optimize is not None:
        return _ort_optimized(rewritten, result, a, options.ort_optimize, options.timeout, loaded, output)
    return Written(rewritten, result, _saved(rewritten, output, loaded.data_dir))


def _saved(model: onnx.ModelProto, output: str | Path | None, source_dir: Path | None) -> list[Path]:
    return save_model(model, Path(output), source_dir=source_dir) if output is not None else []


def _ort_optimized(rewritten: onnx.ModelProto, result: RewriteResult, a: Analysis, device: str,
                   timeout: float | None, loaded: Loaded, output: str | Path | None) -> Written:
    """ORT's optimization of the rewrite (``ckpt_cli/optimize.py``), written to ``output``
    when given."""
    from .optimize import ort_optimize

    with tempfile.TemporaryDirectory(prefix="ckpt_ortopt_") as tmp:
        optimized = ort_optimize(rewritten, result, a, device, Path(tmp), loaded.data_dir, timeout)
        model = optimized.model
        written = save_model(model, Path(output), source_dir=Path(tmp)) if output is not None else []
        if output is None and optimized.external:
            onnx.load_external_data_for_model(model, tmp)  # the folder goes away with the block
    return Written(model, optimized.result, written, optimized)


def _check_rewrite(model: ModelInput, run: RewriteRun, options: CheckOptions) -> CheckFigures:
    """Check the rewrite as written: the output file when there is one, else the model
    saved to a temporary folder. The written file is analysed afresh (shapes reused); a
    rewrite made to a budget is also judged by it."""
    a, w = run.analysis, run.written
    with tempfile.TemporaryDirectory(prefix="ckpt_check_") as tmp:
        original = run.loaded.path or _on_disk(model, Path(tmp), "original.onnx")
        rewritten = w.files[0] if w.files else _on_disk(w.model, Path(tmp), "rewritten.onnx")
        after = analyse(load_graph(rewritten), loss=a.phases.loss, grad_outputs=list(a.phases.grad_outputs),
                        tensors=w.result.after.tensors)
        return check_analysed({"original": original, "rewritten": rewritten}, {"original": a, "rewritten": after},
                              dict(a.dims), options, _budget_rules(run))


def _budget_rules(run: RewriteRun) -> tuple[Rule, ...]:
    """The budget's rule for a rewrite planned to one: what ORT held is within it."""
    if run.planned is None or run.planned.budget is None:
        return ()
    return (held_within(run.planned.budget, run.written.result.after.outside_arena_bytes),)


def _provenance(options: Options, result: RewriteResult, plan: Plan | None) -> dict[str, str]:
    """What made this file, in its metadata_props (as onnxsim records its own)."""
    import json

    return {
        PROVENANCE_PREFIX + "version": __version__,
        PROVENANCE_PREFIX + "options": json.dumps({k: v for k, v in options.items() if v not in (None, [], False)},
                                                  sort_keys=True),
        PROVENANCE_PREFIX + "strategy": plan.strategy if plan else "reorder only",
        PROVENANCE_PREFIX + "regions": str(len(result.regions)),
        PROVENANCE_PREFIX + "recompute_nodes": str(result.recompute_nodes),
        PROVENANCE_PREFIX + "recompute_flops": str(result.recompute_flops),
        PROVENANCE_PREFIX + "predicted_peak_bytes": str(result.after.priority.peak_bytes),
    }
