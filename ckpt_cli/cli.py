"""The ``ckpt`` command line: option parsing and rendering over the library API."""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import click

from . import __version__
from .errors import CkptError, UsageError
from .plan_options import policy_from, policy_options

EXIT_INTERNAL = 70
PRETTY_JSON_LIMIT = 1 << 20  # larger reports (100k-node graphs) are written compact


def _parse_dims(values: tuple[str, ...]) -> dict[str, int]:
    dims: dict[str, int] = {}
    for v in values:
        name, sep, num = v.partition("=")
        if not sep or not name or not num.strip().isdigit():
            raise UsageError(f"--dim expects NAME=VALUE with a positive integer, got '{v}'")
        dims[name.strip()] = int(num)
    return dims


def analysis_options(f):
    """Options every command that analyses a model shares."""
    f = click.option("--dim", "dims", multiple=True, metavar="NAME=VALUE",
                     help="Bind a symbolic dimension (repeatable), e.g. --dim batch=8.")(f)
    f = click.option("--loss", metavar="NAME", help="The loss output (default: detected by name).")(f)
    f = click.option("--grad-output", "grad_outputs", multiple=True, metavar="NAME",
                     help="A gradient output (repeatable; default: outputs named like *_grad).")(f)
    return f


def report_options(f):
    f = click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")(f)
    f = click.option("--report", "report_path", type=click.Path(dir_okay=False, path_type=Path),
                     help="Also write the JSON report to this file.")(f)
    f = click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors (exit code tells).")(f)
    return f


def emit(report: dict, render, as_json: bool, report_path: Path | None, quiet: bool) -> None:
    """Write the report where asked: JSON on stdout, a JSON file, or tables."""
    from .save import write_text_atomic
    from .report.render import make_console

    if as_json or report_path is not None:
        text = json.dumps(report)  # json's C encoder; indenting makes it pure Python
        if len(text) < PRETTY_JSON_LIMIT:
            text = json.dumps(report, indent=2)
        if report_path is not None:
            write_text_atomic(report_path, text + "\n")
    if not as_json:
        render(report, make_console(quiet=quiet))
    elif not quiet:
        click.echo(text)


def _load_and_analyse(model: Path, dims, loss, grad_outputs):
    from .analysis import analyse, symbolic_dims
    from .load import load_graph

    graph = load_graph(model)
    bound = _parse_dims(dims)
    unknown = set(bound) - symbolic_dims(graph)
    if unknown:
        known = ", ".join(sorted(symbolic_dims(graph))) or "none"
        raise UsageError(f"--dim {sorted(unknown)[0]}: no such symbolic dimension in the model (it has: {known})")
    return analyse(graph, bound, loss, list(grad_outputs) or None)


def check_options(f):
    """Options of the ORT check, shared by ``check`` and ``rewrite --check``."""
    f = click.option("--provider", type=click.Choice(["auto", "cuda", "cpu"]), default="auto", show_default=True,
                     help="ONNX Runtime execution provider (auto: CUDA when a GPU really works, else CPU).")(f)
    f = click.option("--runs", type=click.IntRange(1, 100), default=3, show_default=True,
                     help="Measured runs per graph (median reported), after one warm-up run.")(f)
    f = click.option("--seed", type=int, default=0, show_default=True, help="Seed of the generated feeds.")(f)
    f = click.option("--feeds", "feeds_file", type=click.Path(dir_okay=False, path_type=Path),
                     help="Feed these inputs (.npz, one array per graph input) instead of generated ones.")(f)
    f = click.option("--python", "python", metavar="PATH",
                     help="Run ONNX Runtime under this interpreter (needs numpy and onnxruntime there).")(f)
    f = click.option("--rtol", type=float, help="Accept outputs within this relative tolerance.")(f)
    f = click.option("--atol", type=float, help="Accept outputs within this absolute tolerance.")(f)
    return f


def auto_options(f):
    f = click.option("--auto", type=click.Choice(["layers", "sqrt", "balanced", "budget", "optimal"]),
                     help="Choose regions automatically: per layer, sqrt(n) segments, balanced (recompute only "
                          "cheap ops), budget (least recompute under --budget), or optimal (an exact MILP of "
                          "the budget problem, for graphs of a few hundred nodes).")(f)
    f = click.option("--budget", metavar="SIZE|PCT",
                     help="Peak-memory budget for the predicted peak: 2GiB, 512MiB, or 40% of the original.")(f)
    return f


def _busy(message: str, quiet: bool):
    """A spinner on a terminal; nothing in JSON mode or when output is not a TTY."""
    import contextlib

    if quiet or not sys.stderr.isatty():
        return contextlib.nullcontext()
    from rich.console import Console

    return Console(stderr=True).status(message)


def _run_check(original, rewritten, dims, provider, runs, seed, feeds_file, python, rtol, atol, quiet):
    from .check import run_check

    with _busy(f"running both graphs on ONNX Runtime ({runs} runs each, plus ORT defaults)", quiet):
        return run_check(original, rewritten, provider=provider, runs=runs, seed=seed, dims=_parse_dims(dims),
                         feeds_file=feeds_file, python=python, rtol=rtol, atol=atol)


class CkptGroup(click.Group):
    """Turns expected failures into one line and an exit code; no traceback unless --debug."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except CkptError as e:
            if ctx.obj and ctx.obj.get("debug"):
                traceback.print_exc()
            click.echo(f"ckpt: error: {e}", err=True)
            sys.exit(e.exit_code)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except KeyboardInterrupt:
            click.echo("ckpt: interrupted", err=True)
            sys.exit(130)
        except Exception as e:  # a bug: one line unless --debug
            if ctx.obj and ctx.obj.get("debug"):
                traceback.print_exc()
            else:
                click.echo(f"ckpt: internal error: {type(e).__name__}: {e} (rerun with --debug for details)",
                           err=True)
            sys.exit(EXIT_INTERNAL)


@click.group(cls=CkptGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="ckpt")
@click.option("--debug", is_flag=True, help="Show Python tracebacks on errors.")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """ckpt: gradient checkpointing for ONNX training graphs.

    A training graph holds the forward and backward pass in one ONNX file; its peak
    memory is mostly forward activations stashed for the backward. ckpt predicts that
    peak, rewrites the graph to recompute activations instead of keeping them, and
    proves the result on ONNX Runtime.

    \b
    Typical use:
      ckpt inspect model.onnx                  # where does the memory go?
      ckpt rewrite model.onnx -o model.ckpt.onnx --check
      ckpt check model.onnx model.ckpt.onnx --json
      ckpt compare model.onnx rewrite.json --fail-if 'peak_bytes>2GiB'

    Exit codes: 0 ok, 1 check failed or a --fail-if condition held, 2 bad input or
    usage, 3 budget unreachable, 4 runtime unavailable, 70 internal error.
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


@main.command()
@click.argument("model", type=click.Path(path_type=Path))
@analysis_options
@report_options
def inspect(model: Path, dims, loss, grad_outputs, as_json, report_path, quiet) -> None:
    """Analyse a training graph and predict its peak memory.

    Classifies nodes as forward or backward, lists the activations stashed for the
    backward pass, and simulates memory under both ONNX Runtime execution orders
    (PRIORITY_BASED = file order, and DEFAULT).

    \b
    Example:
      ckpt inspect sample_models/gpt.onnx
      ckpt inspect model.onnx --dim batch=8 --json | jq .peak_bytes
    """
    from .report.model import inspect_report
    from .report.render import render_inspect

    a = _load_and_analyse(model, dims, loss, grad_outputs)
    options = {"dims": list(dims), "loss": loss, "grad_outputs": list(grad_outputs)}
    emit(inspect_report(a, options), render_inspect, as_json, report_path, quiet)


def default_output(model: Path) -> Path:
    return model.with_name(model.name[:-5] + ".ckpt.onnx" if model.name.endswith(".onnx") else model.name + ".ckpt.onnx")


@main.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Where to write the rewritten model (default: <model>.ckpt.onnx beside it).")
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
@auto_options
@policy_options
@click.option("--check", "run_the_check", is_flag=True,
              help="Then run `ckpt check` on the result (exit 1 if it fails).")
@check_options
@analysis_options
@report_options
def rewrite(model: Path, output, force, patterns, scope, boundaries, plan_file, no_recompute, auto, budget,
            recompute_ops, keep_ops, run_the_check, provider, runs, seed, feeds_file, python, rtol, atol, dims, loss, grad_outputs, as_json,
            report_path, quiet) -> None:
    """Rewrite a training graph to recompute activations instead of stashing them.

    Marked regions of the forward pass keep only their inputs for the backward pass;
    the backward recomputes the rest right before it needs it. The graph is written
    in the order ONNX Runtime must execute it (run it with ExecutionOrder.PRIORITY_BASED
    and the session settings the report prints). With no region option, ckpt uses one
    region per repeated layer, or sqrt(n) segments when it finds no layers.

    \b
    Examples:
      ckpt rewrite sample_models/gpt.onnx -o gpt.ckpt.onnx
      ckpt rewrite model.onnx --regions-by-scope 'layers\\.(\\d+)' --json
      ckpt rewrite model.onnx --boundary 'x:h3' --force
      ckpt rewrite model.onnx --plan plan.json
    """
    from .pipeline import make_plan, plan_rows, rewrite_plan
    from .report.model import rewrite_report
    from .report.plan_view import planning_section, render_explanations
    from .report.render import render_rewrite
    from .runtime.worker import settings_snippet
    from .rewrite import to_model
    from .save import check_output_path, save_model

    output = output or default_output(model)
    a = _load_and_analyse(model, dims, loss, grad_outputs)
    check_output_path(output, model, force)
    if no_recompute and (patterns or scope or boundaries or plan_file or auto or budget):
        raise UsageError("--no-recompute takes no region options")
    with _busy("planning", quiet or as_json or not (auto or budget)) as status:
        planned = None if no_recompute else make_plan(a, auto, budget, list(patterns), scope, list(boundaries),
                                                       plan_file, progress=status and status.update,
                                                       policy=policy_from(recompute_ops, keep_ops))
    plan = planned.plan if planned else None
    result = rewrite_plan(a, planned)
    written = save_model(to_model(result), output,
                         source_dir=model.parent)
    options = {"regions": list(patterns), "regions_by_scope": scope, "boundaries": list(boundaries),
               "plan": str(plan_file) if plan_file else None, "no_recompute": no_recompute, "auto": auto,
               "budget": budget, "dims": list(dims), "loss": loss, "grad_outputs": list(grad_outputs)}
    report = rewrite_report(a, result, str(written[0]),
                            plan.to_json([n.name for n in a.graph.nodes]) if plan else None,
                            plan.notes if plan else [], settings_snippet("cpu", result.mem_reuse), options)
    if planned is not None:
        report["planning"] = planning_section(a, planned, result, plan_rows(a, planned, result))

    def render_rewrite_and_plan(r, console):
        render_rewrite(r, console)
        if "planning" in r and (r["options"]["auto"] or r["options"]["budget"]):
            render_explanations(r["planning"]["explanations"], console)

    if not run_the_check:
        emit(report, render_rewrite_and_plan, as_json, report_path, quiet)
        return
    from .load import load_graph
    from .report.render import render_check

    rewritten = analyse_written(load_graph(written[0]), result.after)
    figures = _run_check(a, rewritten, dims, provider, runs, seed, feeds_file, python, rtol, atol,
                         quiet or as_json)
    report["check"] = figures

    def render_both(r, console):
        render_rewrite_and_plan(r, console)
        render_check({**r["check"], "model": r["model"], "rewritten_model": r["output"]}, console)

    emit(report, render_both, as_json, report_path, quiet)
    if not figures["passed"]:
        sys.exit(1)


@main.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the plan (JSON, editable) here; read it back with `ckpt rewrite --plan`.")
@click.option("--force", is_flag=True, help="Overwrite the output if it exists.")
@auto_options
@policy_options
@click.option("--sweep", is_flag=True, help="Print predicted peak against recompute over the min-cut front.")
@click.option("--svg", type=click.Path(dir_okay=False, path_type=Path), help="With --sweep: write the chart as SVG.")
@analysis_options
@report_options
def plan(model: Path, output, force, auto, budget, recompute_ops, keep_ops, sweep, svg, dims, loss, grad_outputs,
         as_json, report_path, quiet) -> None:
    """Choose checkpoint regions automatically and explain the choice, without rewriting.

    Strategies: layers (one region per repeated layer), sqrt (about sqrt(n) segments cut
    at small tensors), balanced (recompute only cheap memory-bound ops, keep MatMul/Conv
    outputs), budget (the least recompute FLOPs whose predicted peak fits --budget),
    optimal (the budget problem as an exact MILP, to measure budget against).
    For every stashed activation the report says whether it is kept or recomputed and
    why. An unreachable budget exits with code 3 and says what dominates the peak.

    \b
    Examples:
      ckpt plan sample_models/gpt.onnx --budget 75% -o plan.json
      ckpt rewrite sample_models/gpt.onnx --plan plan.json -o gpt.ckpt.onnx
      ckpt plan model.onnx --auto balanced --json | jq '.explanations[:5]'
    """
    from .pipeline import make_plan, plan_rows, rewrite_plan
    from .report.plan_view import plan_report, render_plan
    from .save import check_output_path, write_text_atomic

    a = _load_and_analyse(model, dims, loss, grad_outputs)
    if sweep:
        from .pipeline import sweep as run_sweep
        from .report.sweep_view import render_sweep

        return emit(run_sweep(a, svg, {"sweep": True}, policy_from(recompute_ops, keep_ops)), render_sweep, as_json,
                    report_path, quiet)
    if output is not None:
        check_output_path(output, model, force)
    with _busy("planning", quiet or as_json) as status:
        planned = make_plan(a, auto, budget, progress=status and status.update,
                            policy=policy_from(recompute_ops, keep_ops))
        result = rewrite_plan(a, planned)
    report = plan_report(a, planned, result, plan_rows(a, planned, result), str(output) if output else None,
                         {"auto": auto, "budget": budget, "dims": list(dims), "loss": loss,
                          "grad_outputs": list(grad_outputs)})
    if output is not None:
        write_text_atomic(output, json.dumps(report["plan"], indent=2) + "\n")
    emit(report, render_plan, as_json, report_path, quiet)


def analyse_written(graph, analysed):
    """Analysis of a written graph, reusing the shapes already known for it."""
    from .analysis import analyse

    return analyse(graph, loss=analysed.phases.loss, grad_outputs=list(analysed.phases.grad_outputs),
                   tensors=analysed.tensors)


@main.command()
@click.argument("original", type=click.Path(path_type=Path))
@click.argument("rewritten", type=click.Path(path_type=Path))
@check_options
@analysis_options
@report_options
def check(original: Path, rewritten: Path, provider, runs, seed, feeds_file, python, rtol, atol, dims, loss,
          grad_outputs, as_json, report_path, quiet) -> None:
    """Prove a rewrite on ONNX Runtime: same outputs, less memory, written order kept.

    Runs both graphs, each in a fresh child process, with the session settings ckpt
    recommends, and the original once more under ORT's default settings (what users
    get without ckpt). Compares every output bit for bit, reads the real peak of
    each run from ORT's profiler, and checks that ORT executed the rewritten nodes
    in the written order.

    Exit code 0 when outputs agree and the rewritten peak is not higher; 1 when
    outputs differ or memory got worse; 2 bad input; 4 provider unavailable.

    \b
    Examples:
      ckpt check model.onnx model.ckpt.onnx
      ckpt check model.onnx model.ckpt.onnx --provider cuda --json
      ckpt check training_model.onnx training_model.ckpt.onnx --python /opt/ort-training/bin/python
    """
    from .report.model import check_report
    from .report.render import render_check

    a = _load_and_analyse(original, dims, loss, grad_outputs)
    from .load import load_graph

    b = analyse_written(load_graph(rewritten), _load_and_analyse(rewritten, dims, loss, grad_outputs))
    figures = _run_check(a, b, dims, provider, runs, seed, feeds_file, python, rtol, atol, quiet or as_json)
    options = {"provider": provider, "runs": runs, "seed": seed, "feeds": str(feeds_file) if feeds_file else None,
               "python": python, "rtol": rtol, "atol": atol, "dims": list(dims)}
    emit(check_report(a, b, figures, options), render_check, as_json, report_path, quiet)
    if not figures["passed"]:
        sys.exit(1)


from .compare_cli import compare  # noqa: E402  (a command module of its own)

main.add_command(compare)

if __name__ == "__main__":  # pragma: no cover
    main()
