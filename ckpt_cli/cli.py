"""The ``ckpt`` command line: option parsing and rendering over the library API."""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import click

from . import __version__
from .errors import CkptError, UsageError

EXIT_INTERNAL = 70


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

    text = json.dumps(report, indent=2, sort_keys=False)
    if report_path is not None:
        write_text_atomic(report_path, text + "\n")
    if as_json:
        if not quiet:
            click.echo(text)
        return
    render(report, make_console(quiet=quiet))


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

    Exit codes: 0 ok, 1 check failed, 2 bad input or usage, 3 budget unreachable,
    4 runtime unavailable, 70 internal error.
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


if __name__ == "__main__":  # pragma: no cover
    main()
