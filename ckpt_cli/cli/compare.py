"""``ckpt compare``: reports and models side by side, and a memory gate for CI.

Registered on the ``ckpt`` group in ``ckpt_cli.cli``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ..errors import UsageError
from .options import emit, parse_dims, protect_report, report_options

if TYPE_CHECKING:
    from rich.console import Console

    from ..report.compare import Input, Outcome


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.argument("inputs", nargs=-1, required=True, metavar="INPUT...")
@click.option("--fail-if", "conditions", multiple=True, metavar="EXPR",
              help="Exit 1 when this condition holds on the last input (repeatable), e.g. "
                   "'measured_peak_bytes>2GiB' or 'ratio(peak_bytes)>90%'.")
@click.option("--svg", "svg_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the memory chart as a self-contained SVG file.")
@click.option("--dim", "dims", multiple=True, metavar="NAME=VALUE",
              help="Bind a symbolic dimension of the ONNX inputs (repeatable), e.g. --dim batch=8.")
@click.option("--allow-mixed", is_flag=True,
              help="Compare inputs about different original models (refused by default).")
@click.option("--format", "fmt", type=click.Choice(["text", "markdown"]), default="text", show_default=True,
              help="How to print the comparison: tables for a terminal, or markdown (a GitHub step summary: "
                   ">> $GITHUB_STEP_SUMMARY).")
@report_options
def compare(inputs: tuple[str, ...], conditions: tuple[str, ...], svg_path: Path | None, dims: tuple[str, ...],
            allow_mixed: bool, fmt: str, **reporting: Any) -> None:
    """Compare reports and models side by side; with --fail-if, a CI memory gate.

    Each INPUT is a JSON report of `ckpt inspect`, `ckpt rewrite` (its rewritten
    model, with measured figures when written with --check) or `ckpt check` (the
    rewritten model it measured), or an ONNX model, analysed now. Prints predicted
    and measured peak, stashed bytes, recompute share, step time and output equality
    per input, with the change against the FIRST input (lower memory in green), the
    per-scope stashed bytes that changed most, and the memory timelines overlaid.

    \b
    --fail-if grammar:  FIELD OP VALUE  or  ratio(FIELD) OP VALUE
      FIELD  a figure: peak_bytes, measured_peak_bytes, stashed_bytes,
             recompute_share, step_time_s, outputs_equal, nodes;
             else a dotted path into the LAST input's JSON (check.rewritten.time_s)
      ratio(FIELD)  last input / first input
      OP     < <= > >= == !=
      VALUE  number, optionally with a binary unit (KiB MiB GiB TiB; K/KB, M/MB,
             G/GB count 1024s too), or %; true/false
    A condition that holds exits 1; one naming a missing field exits 2.

    \b
    Examples:
      ckpt compare model.onnx model.ckpt.onnx
      ckpt compare before.json after.json --svg memory.svg
      ckpt compare model.onnx rewrite.json --fail-if 'measured_peak_bytes>2GiB'
      ckpt compare base.json new.json --fail-if 'ratio(peak_bytes)>105%' --json
      ckpt compare model.onnx rewrite.json --format markdown >> "$GITHUB_STEP_SUMMARY"
    """
    from ..report.compare import compare_report, evaluate, load_inputs
    from ..report.conditions import parse_condition
    from ..report.render import render_compare

    as_json, report_path, quiet = reporting["as_json"], reporting["report_path"], reporting["quiet"]
    if fmt != "text" and as_json:
        raise UsageError("--format and --json both say how to print: choose one")
    parsed = [parse_condition(c) for c in conditions]
    protect_report(report_path, *map(Path, inputs), svg_path)
    protect_report(svg_path, *map(Path, inputs))
    loaded = load_inputs(list(inputs), parse_dims(dims), allow_mixed=allow_mixed)
    charted = [i for i in loaded if i.series]
    if svg_path is not None and not charted:
        raise UsageError("--svg: no input has a memory timeline (check reports carry none; "
                         "add the model or a rewrite report)")
    outcomes = evaluate(parsed, loaded)
    options = {"inputs": list(inputs), "fail_if": list(conditions), "dims": list(dims),
               "svg": str(svg_path) if svg_path else None}
    report = compare_report(loaded, outcomes, options)
    if svg_path is not None:
        _write_chart(svg_path, charted)
    render = _render_markdown if fmt == "markdown" else render_compare
    emit(report, render, as_json, report_path, quiet, (*map(Path, inputs), svg_path))
    _fail_if_held(outcomes, loaded[-1].label)


def _render_markdown(report: dict[str, Any], console: Console) -> None:
    from ..report.markdown import compare_markdown

    if not console.quiet:
        click.echo(compare_markdown(report), nl=False)


def _write_chart(svg_path: Path, charted: list[Input]) -> None:
    from ..io.save import write_text_atomic
    from ..report.svg import memory_chart_svg

    title = "Memory over the schedule: " + " vs ".join(i.label for i in charted)
    write_text_atomic(svg_path, memory_chart_svg([(i.label, i.series or []) for i in charted],
                                                 [i.backward_starts_at for i in charted], title))


def _fail_if_held(outcomes: list[Outcome], label: str) -> None:

    """Each --fail-if condition that holds, one line on stderr; then exit 1."""
    from ..report.render import condition_value_text
    from ..report.text import plain

    held = [o for o in outcomes if o.held]
    for o in held:  # the label comes from a report's or a model's file: escaped like any name
        click.echo(plain(f"ckpt: --fail-if '{o.condition.text}' holds on {label} "
                         f"({o.condition.operand} = {condition_value_text(o.condition.operand, o.actual)})"),
                   err=True)
    if held:
        sys.exit(1)
