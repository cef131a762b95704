"""``ckpt inspect | plan | rewrite | check | session``: parse, call ``ckpt_cli.api``, render."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ..errors import CkptError, ModelError, UsageError
from ..progress import listening
from .progress import progress
from .options import (analysis_options, analysis_value, auto_options, check_options, check_value, emit,
                      plan_value, policy_options, protect_report, renderer, report_options, rewrite_value)

if TYPE_CHECKING:
    from rich.console import Console

    from ..options import AnalysisOptions, PlanOptions


@click.command()
@click.argument("model", type=click.Path(path_type=Path))
@analysis_options
@report_options
def inspect(model: Path, **given: Any) -> None:
    """Analyse a training graph and predict its peak memory.

    Classifies nodes as forward or backward, lists the activations stashed for the
    backward pass, and simulates memory under both ONNX Runtime execution orders
    (PRIORITY_BASED = file order, and DEFAULT).

    \b
    Example:
      ckpt inspect sample_models/gpt.onnx
      ckpt inspect model.onnx --dim batch=8 --json | jq .peak_bytes
    """
    from ..api import inspect_model

    as_json, report_path, quiet = given.pop("as_json"), given.pop("report_path"), given.pop("quiet")
    protect_report(report_path, model)
    warn_if_undone(model)
    result = inspect_model(model, analysis_value(given))
    emit(result.to_json(), renderer("render", "render_inspect"), as_json, report_path, quiet, (model,))


def default_output(model: Path) -> Path:
    return model.with_name(model.name[:-5] + ".ckpt.onnx" if model.name.endswith(".onnx") else model.name + ".ckpt.onnx")


@click.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(),  # a str: Path() would drop the trailing slash of DIR/
              help="Where to write the rewritten model (default: <model>.ckpt.onnx beside it; a folder: "
                   "<model>.ckpt.onnx in it).")
@click.option("--force", is_flag=True, help="Overwrite the output if it exists.")
@click.option("--region", "patterns", multiple=True, metavar="PATTERN",
              help="A region: forward nodes whose name matches a glob, or a regex with re: (repeatable).")
@click.option("--regions-by-scope", "scope", metavar="REGEX",
              help="One region per distinct first capture group over node names, e.g. 'layers\\.(\\d+)'.")
@click.option("--boundary", "boundaries", multiple=True, metavar="INPUTS:OUTPUTS",
              help="A region: forward nodes between these tensors (comma-separated names; repeatable).")
@click.option("--plan", "plan_file", type=click.Path(dir_okay=False, path_type=Path),
              help="A JSON plan file (the 'plan' of a rewrite --json report, or written by hand; see README).")
@click.option("--no-recompute", is_flag=True, help="Only write the memory-efficient order, no recompute.")
@click.option("--pin/--no-pin", default=True, show_default=True,
              help="Hold the written order in the data flow (guard nodes), so that it survives any ORT session.")
@click.option("--keep-mem-pattern/--mem-pattern-off", default=True, show_default=True,
              help="Keep the model's inputs as they are and leave ORT's memory pattern to the session (the "
                   "default plan is judged in a plain session with it on). --mem-pattern-off adds an optional "
                   "input nobody feeds, which turns the pattern off where ckpt predicts that lowers a plain "
                   "session's peak; tools that feed every input (Polygraphy, perf tests) then need --keep-mem-pattern.")
@click.option("--ort-optimize", "ort_optimize", type=click.Choice(["cpu", "cuda"]), default=None,
              help="Then let ONNX Runtime fuse the rewritten graph for this provider (ORT_ENABLE_EXTENDED) and "
                   "write ORT's graph, re-sorted and re-simulated (run it with ORT_DISABLE_ALL, as recorded).")
@click.option("--work-around-ort-defects", is_flag=True,
              help="Write each grouped 1-D ConvGrad (a kernel of onnxruntime-training 1.19.2 that writes past "
                   "its buffers) in its 2-D form, Unsqueeze and Squeeze around it, which ORT runs clean.")
@auto_options
@policy_options
@click.option("--check", "run_the_check", is_flag=True,
              help="Then run `ckpt check` on the result (exit 1 if it fails).")
@check_options
@analysis_options
@report_options
def rewrite(model: Path, **given: Any) -> None:
    """Rewrite a training graph to recompute activations instead of stashing them.

    Marked regions of the forward pass keep only their inputs for the backward pass;
    the backward recomputes the rest right before it needs it. The graph is written
    in the order ONNX Runtime must execute it (run it with the session settings the
    report prints, or `ckpt session OUTPUT`). With no region option, ckpt judges per-layer
    regions, segments and tensor-level min cuts by their predicted peak and recompute,
    and takes the knee: the lowest peak while each further 1% of a step's FLOPs still
    saves at least 1% of the peak (`--auto min-peak`: the lowest peak, whatever it costs).
    It never writes a plan above the original (then it writes the reordered graph and
    says why).

    \b
    Examples:
      ckpt rewrite sample_models/gpt.onnx -o gpt.ckpt.onnx
      ckpt rewrite model.onnx --regions-by-scope 'layers\\.(\\d+)' --json
      ckpt rewrite model.onnx --boundary 'x:h3' --force
      ckpt rewrite model.onnx --plan plan.json
      ckpt rewrite sample_models/gpt.onnx --ort-optimize cpu --check
      ckpt rewrite sample_models/gpt.onnx --activation-budget 0.5 --check
    """
    from ..api import rewrite_model

    as_json, report_path, quiet = given.pop("as_json"), given.pop("report_path"), given.pop("quiet")
    output = _output_file(given.pop("output") or default_output(model), model)
    force, run_the_check = given.pop("force"), given.pop("run_the_check")
    analysis, options = analysis_value(given), rewrite_value(given)  # --timeout: for --ort-optimize too
    check = check_value(given) if run_the_check else False
    protect_report(report_path, model, output, options.plan.plan_file)
    # A log hears of stages only when the ORT check runs (the long part of the work), and not
    # under --json, whose readers often take both streams as one (2>&1).
    try:
        with progress("reading the model", quiet, lines=run_the_check and not as_json) as shown, \
                listening(shown.stage):
            result = rewrite_model(model, output, options, analysis=analysis, force=force, check=check,
                                   progress=shown.detail)
    except CkptError as e:
        if e.report is not None and report_path is not None:  # the model is written: so is its report
            emit(e.report, _render_rewrite, True, report_path, True, (model, output, options.plan.plan_file))
        raise
    emit(result.to_json(), _render_rewrite, as_json, report_path, quiet, (model, output, options.plan.plan_file))
    if result.check is not None and not result.check.passed:
        sys.exit(1)


def _render_rewrite(r: dict[str, Any], console: Console) -> None:
    from ..report.plan_view import render_budget, render_explanations
    from ..report.render import render_check, render_rewrite

    render_rewrite(r, console)
    if "planning" in r and (r["options"]["auto"] or r["options"]["budget"]):
        render_budget(r["planning"], console)
        render_explanations(r["planning"]["explanations"], console)
    if "check" in r:
        render_check({**r["check"], "model": r["model"], "rewritten_model": r["output"]}, console)


def _output_file(output: str | Path, model: Path) -> Path:
    """``-o DIR/`` or an existing folder means ``DIR/<model>.ckpt.onnx``."""
    if str(output).endswith(("/", "\\")) or Path(output).is_dir():
        return Path(output) / default_output(model).name
    return Path(output)


@click.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the plan (JSON, editable) here; read it back with `ckpt rewrite --plan`.")
@click.option("--force", is_flag=True, help="Overwrite the output if it exists.")
@auto_options
@policy_options
@click.option("--sweep", is_flag=True,
              help="Print predicted peak against recompute share over the min-cut front (each point a real "
                   "rewrite), to pick a --budget by looking.")
@click.option("--svg", type=click.Path(dir_okay=False, path_type=Path), help="With --sweep: write the chart as SVG.")
@click.option("--python", "python", metavar="PATH",
              help="An interpreter with onnxruntime-training: an ORT training artifact's default is then "
                   "chosen as `ckpt rewrite --python` chooses it, by training its plans in the Module API's "
                   "untuned session.")
@analysis_options
@report_options
def plan(model: Path, **given: Any) -> None:
    """Choose checkpoint regions automatically and explain the choice, without rewriting.

    Strategies: layers (one region per repeated layer), sqrt (about sqrt(n) segments cut
    at small tensors), balanced (recompute only cheap memory-bound ops, keep MatMul/Conv
    outputs), budget (the least recompute FLOPs whose predicted ORT peak fits --budget),
    optimal (the budget problem as an exact MILP, to measure budget against).
    --activation-budget F speaks PyTorch's activation_memory_budget: keep at most F of
    the activation bytes the no-recompute plan saves for the backward, with the fewest
    matmul FLOPs recomputed. For every stashed activation the report says whether it is kept or recomputed and
    why. An unreachable budget (or activation budget) exits with code 3 and says why.

    \b
    Examples:
      ckpt plan sample_models/gpt.onnx --budget 75% -o plan.json
      ckpt rewrite sample_models/gpt.onnx --plan plan.json -o gpt.ckpt.onnx
      ckpt plan model.onnx --auto balanced --json | jq '.explanations[:5]'
      ckpt plan sample_models/gpt.onnx --activation-budget 0.2 --json | jq .activation_budget
    """
    from ..api import plan_model

    as_json, report_path, quiet = given.pop("as_json"), given.pop("report_path"), given.pop("quiet")
    output, force, sweep, svg = given.pop("output"), given.pop("force"), given.pop("sweep"), given.pop("svg")
    python = given.pop("python")
    protect_report(report_path, model, output, svg)
    analysis, options = analysis_value(given), plan_value(given)
    if sweep:
        if python is not None:
            raise UsageError("--python judges the default plan by training it, and --sweep draws the whole "
                             "min-cut front: drop one")
        _refuse_with_sweep(output, options)
        _sweep(model, svg, options, analysis, (as_json, report_path, quiet))
        return
    if svg is not None:
        raise UsageError("--svg goes with --sweep")
    with progress("planning", quiet, lines=False) as shown:
        result = plan_model(model, options, analysis=analysis, output=output, force=force, progress=shown.detail,
                            python=python)
    emit(result.to_json(), renderer("plan_view", "render_plan"), as_json, report_path, quiet, (model, output))


def _refuse_with_sweep(output: Path | None, options: PlanOptions) -> None:
    """The sweep draws the whole front: no one plan to write, no strategy or budget to follow."""
    if output is not None:
        raise UsageError("-o writes one plan, and --sweep makes none: pick a --budget from the sweep and rerun "
                         "without --sweep, or write the sweep's JSON with --report FILE")
    if options.auto or options.budget:
        raise UsageError("--sweep draws the whole min-cut front: drop --auto/--budget")
    if options.activation_budget is not None:
        raise UsageError("--sweep draws the whole min-cut front: drop --activation-budget")


def _sweep(model: Path, svg: Path | None, options: PlanOptions, analysis: AnalysisOptions,
           reporting: tuple[bool, Path | None, bool]) -> None:
    from ..api import sweep_model
    from ..report.sweep_view import render_sweep

    as_json, report_path, quiet = reporting
    protect_report(svg, model)
    with progress("sweeping the min-cut front", quiet, lines=False):
        report = sweep_model(model, svg=svg, policy=options.policy, analysis=analysis,
                             allow_unsized=options.allow_unsized)
    emit(report, render_sweep, as_json, report_path, quiet, (model, svg))


@click.command()
@click.argument("original", type=click.Path(path_type=Path))
@click.argument("rewritten", type=click.Path(path_type=Path))
@check_options
@analysis_options
@report_options
def check(original: Path, rewritten: Path, **given: Any) -> None:
    """Prove a rewrite on ONNX Runtime: same outputs, less memory, written order kept.

    Runs both graphs, each in a fresh child process, with the session settings ckpt
    recommends, and both once more under ORT's default settings (what users get
    without ckpt's settings). Compares every output bit for bit, reads the real peak
    of each run from ORT's profiler, and checks that ORT executed the rewritten nodes,
    and only those, in the written order (nodes ORT adds are named, and tolerated
    where the rewritten peak stays within --max-prediction-error). An ORT training artifact
    (checkpoint, eval and optimizer models beside the original) is also trained 10 steps in
    ORT's Module API, untuned and under the rewrite's settings: the rewrite's process peak
    untuned must not be above the original's, and its losses must be bit-identical in both.

    Exit code 0 when every premise holds; 1 when outputs differ, memory got worse, ORT
    ran another order or nodes not in the file that put the peak off the prediction, or
    the prediction is further off than --max-prediction-error; 2 bad input; 4 provider unavailable; 5 ORT could not run.

    \b
    Examples:
      ckpt check model.onnx model.ckpt.onnx
      ckpt check model.onnx model.ckpt.onnx --provider cuda --json
      ckpt check training_model.onnx training_model.ckpt.onnx --python /opt/ort-training/bin/python
    """
    from ..api import check_models

    as_json, report_path, quiet = given.pop("as_json"), given.pop("report_path"), given.pop("quiet")
    protect_report(report_path, original, rewritten)
    warn_if_undone(original, rewritten)
    options = check_value(given)
    with progress("reading both models", quiet, lines=not as_json) as shown, listening(shown.stage):
        result = check_models(original, rewritten, analysis=analysis_value(given), options=options)
    emit(result.to_json(), renderer("render", "render_check"), as_json, report_path, quiet, (original, rewritten))
    if not result.passed:
        sys.exit(1)


@click.command()
@click.argument("model", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--provider", type=click.Choice(["cpu", "cuda"]), default=None,
              help="The execution provider the session will use (default: the one the model was optimized for "
                   "with --ort-optimize, else cpu).")
@report_options
def session(model: Path, provider: str | None, as_json: bool, report_path: Path | None, quiet: bool) -> None:
    """Print the ONNX Runtime session a ckpt-written model needs, as Python to paste.

    The settings are read from the model's metadata (what the rewrite planned for). In
    a program, `ckpt_cli.session_options(path)` returns the same SessionOptions.

    \b
    Example:
      ckpt session gpt.ckpt.onnx
      ckpt session gpt.ckpt.onnx --json | jq .settings.execution_order
    """
    from ..io.session import recorded_settings
    from ..report.model import session_report

    protect_report(report_path, model)
    settings = recorded_settings(model)  # an unreadable file: its own error
    undone: list[str] = []
    if not warn_if_undone(model, said=undone):
        from ..markers import SESSION_META

        raise ModelError(f"{model}: not a model ckpt wrote (it has no {SESSION_META} metadata): "
                         "ckpt session prints the settings of `ckpt rewrite` outputs")
    provider = provider or settings.get("ort_optimize", {}).get("provider", "cpu")
    report = session_report(model, provider, settings, undone[0] if undone else None)
    emit(report, _render_session, as_json, report_path, quiet, (model,))


def _render_session(r: dict[str, Any], console: Console) -> None:

    """The snippet as it is, to paste or pipe into a file (no markup, no wrapping)."""
    if not console.quiet:
        click.echo(r["session_settings"], nl=False)


def warn_if_undone(*models: Path, said: list[str] | None = None) -> bool:
    """One line on stderr for each model ckpt rewrote that a later tool undid (also appended
    to ``said``); whether the last was written by ckpt. A file that cannot be read is left
    to the command's own load."""
    from ..io.serialize import read_model
    from ..io.written import undone_rewrite, written_by_ckpt

    written = False
    for path in models:
        try:
            model = read_model(path, embedded_weights=False)  # the metadata and nodes: not the weights
        except Exception:  # noqa: BLE001 - any read failure: the command's own load reports it
            written = False
            continue
        written = written_by_ckpt(model)
        message = undone_rewrite(model, path)
        if message:
            click.echo(message, err=True)
            if said is not None:
                said.append(message)
    return written
