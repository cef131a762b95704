"""Options the commands share, their parsing, and where a report goes."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import click

from ..errors import UsageError

if TYPE_CHECKING:  # imported where used: a command's start loads no more than it needs
    from rich.console import Console

    from ..options import AnalysisOptions, CheckOptions, PlanOptions, RewriteOptions
    from ..planning.plan import Policy

PRETTY_JSON_LIMIT = 1 << 20  # larger reports (100k-node graphs) are written compact

# A command's function, as click's decorators take and give it back.
Command = TypeVar("Command", bound=Callable[..., Any])
# Renders a report (as --json prints it) on a console.
Render = Callable[[dict[str, Any], "Console"], None]


def parse_dims(values: tuple[str, ...]) -> dict[str, int]:
    """('batch=8', ...) -> {'batch': 8}; sizes are positive integers."""
    dims: dict[str, int] = {}
    for v in values:
        name, sep, num = v.partition("=")
        num = num.strip()
        if not sep or not name.strip() or not (num.isascii() and num.isdigit()) or int(num) <= 0:
            raise UsageError(f"--dim expects NAME=VALUE with a positive integer, got '{v}'")
        dims[name.strip()] = int(num)
    return dims


def analysis_options(f: Command) -> Command:
    """Options every command that analyses a model shares."""
    f = click.option("--dim", "dims", multiple=True, metavar="NAME=VALUE",
                     help="Bind a symbolic dimension (repeatable), e.g. --dim batch=8.")(f)
    f = click.option("--loss", metavar="NAME", help="The loss output (default: detected by name).")(f)
    f = click.option("--grad-output", "grad_outputs", multiple=True, metavar="NAME",
                     help="A gradient output (repeatable; default: outputs named like *_grad).")(f)
    return f


def remember_json(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    """A failure under --json prints a JSON error object too (cli.main.fail): a CI step that
    parses stdout gets the exit code and the message, not an empty document."""
    if value:
        ctx.find_root().ensure_object(dict)["json"] = True
    return value


def report_options(f: Command) -> Command:
    f = click.option("--json", "as_json", is_flag=True, callback=remember_json,
                     help="Print one JSON object instead of tables (on failure: {\"error\": {\"exit_code\", "
                          "\"message\"}}).")(f)
    f = click.option("--report", "report_path", type=click.Path(dir_okay=False, path_type=Path),
                     help="Also write the JSON report to this file (never over a model or plan it reads "
                          "or writes).")(f)
    f = click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors (exit code tells).")(f)
    return f


def check_options(f: Command) -> Command:
    """Options of the ORT check, shared by ``check`` and ``rewrite --check``."""
    f = click.option("--provider", type=click.Choice(["auto", "cuda", "cpu"]), default="auto", show_default=True,
                     help="ONNX Runtime execution provider (auto: CUDA when a GPU really works, else CPU).")(f)
    f = click.option("--runs", type=click.IntRange(1, 100), default=3, show_default=True,
                     help="Measured runs per graph (median reported), after one warm-up run.")(f)
    f = click.option("--seed", type=click.IntRange(0, 2**31 - 1), default=0, show_default=True,
                     help="Seed of the generated feeds and of ORT's random ops (Dropout).")(f)
    f = click.option("--feeds", "feeds_file", type=click.Path(dir_okay=False, path_type=Path),
                     help="Feed these inputs (.npz, one array per graph input) instead of generated ones.")(f)
    f = click.option("--python", "python", metavar="PATH",
                     help="Run ONNX Runtime under this interpreter (needs numpy and onnxruntime there). "
                          "With onnxruntime-training there, rewrite also chooses an ORT training "
                          "artifact's default by training its plans in the Module API's untuned session.")(f)
    f = click.option("--rtol", type=click.FloatRange(0, 1), help="Accept outputs within this relative tolerance.")(f)
    f = click.option("--atol", type=click.FloatRange(0, min_open=False),
                     help="Accept outputs within this absolute tolerance.")(f)
    f = click.option("--timeout", type=click.FloatRange(1, 86400), default=600, show_default=True,
                     help="Seconds one ONNX Runtime child may take (a model's warm-up and runs; "
                          "rewrite --ort-optimize's optimization); past it ckpt exits 5.")(f)
    f = click.option("--max-prediction-error", type=click.FloatRange(0, 10), default=0.10, show_default=True,
                     help="Fail the check when ckpt's predicted peak is further off the measured one "
                          "(a share: 0.1 = 10%).")(f)
    return f


def auto_options(f: Command) -> Command:
    from ..options import AUTO_NAMES

    f = click.option("--auto", type=click.Choice(AUTO_NAMES),
                     help="Choose regions automatically: per layer, sqrt(n) segments, balanced (recompute only "
                          "cheap ops), budget (least recompute under --budget), optimal (an exact MILP of "
                          "the budget problem, for graphs of a few hundred nodes), or min-peak (the default's "
                          "search to its lowest peak instead of its knee).")(f)
    f = click.option("--budget", metavar="SIZE|PCT",
                     help="Peak-memory budget on what ORT is predicted to hold (its arena in use, as ckpt "
                          "check measures it, plus parameters and inputs): 2GiB, 512MiB, or 40% of the "
                          "original's.")(f)
    f = click.option("--activation-budget", type=click.FloatRange(0, 1), metavar="F",
                     help="PyTorch's torch._functorch.config.activation_memory_budget in ckpt: keep at most "
                          "F (0-1) of the activation bytes the backward reads when nothing is recomputed, "
                          "recomputing the fewest matmul FLOPs (a tensor-level min cut). 1 recomputes "
                          "nothing, 0.5 keeps half the activations, 0 recomputes all it can; a share no "
                          "cut reaches exits 3. It bounds activations, not the peak (--budget does).")(f)
    return f


def analysis_value(given: dict[str, Any]) -> AnalysisOptions:
    """The AnalysisOptions of a command's --dim/--loss/--grad-output (taken out of ``given``)."""
    from ..options import AnalysisOptions

    return AnalysisOptions(parse_dims(given.pop("dims")), given.pop("loss"), tuple(given.pop("grad_outputs")))


def plan_value(given: dict[str, Any]) -> PlanOptions:
    """The PlanOptions of a command's region, strategy and policy options (taken out of ``given``)."""
    from ..options import PlanOptions

    policy = policy_from(given.pop("recompute_ops"), given.pop("keep_ops"))
    return PlanOptions(tuple(given.pop("patterns", ())), given.pop("scope", None), tuple(given.pop("boundaries", ())),
                       given.pop("plan_file", None), given.pop("auto"), given.pop("budget"), policy,
                       activation_budget=given.pop("activation_budget", None),
                       allow_unsized=given.pop("allow_unsized", False))


def rewrite_value(given: dict[str, Any]) -> RewriteOptions:
    """The RewriteOptions of ``ckpt rewrite``'s options (taken out of ``given``)."""
    from ..options import RewriteOptions

    return RewriteOptions(plan_value(given), given.pop("no_recompute"), given.pop("pin"),
                          given.pop("keep_mem_pattern"), given.pop("ort_optimize"), given["timeout"],
                          given["python"], given.pop("work_around_ort_defects"))


def check_value(given: dict[str, Any]) -> CheckOptions:
    """The CheckOptions of the check's options (taken out of ``given``)."""
    from ..options import CheckOptions

    return CheckOptions(**{k: given.pop(k) for k in ("provider", "runs", "seed", "feeds_file", "python", "rtol",
                                                      "atol", "timeout", "max_prediction_error")})


def protect_report(report_path: Path | None, *protected: Path | None) -> None:
    """A report never replaces a file the command reads or writes: the models, their
    external data (every data file a model loaded in this process keeps its weights in,
    and ``<model>.data``), the rewritten model, a plan file. Checked before the work and
    again before the report is written (when the data files are known)."""
    if report_path is None:
        return
    from ..io.load import loaded_data_files
    from ..io.save import check_report_path, data_file_pattern

    files = [Path(p) for p in protected if p is not None]
    check_report_path(report_path, files + [Path(f"{p}.data") for p in files] + sorted(loaded_data_files()))
    for p in files:  # the data file a rewrite writes is named by its content: refuse the whole pattern
        if report_path.resolve().parent == p.resolve().parent and data_file_pattern(p.name).match(report_path.name):
            raise UsageError(f"{report_path}: is named like the data file of {p}, which the report must not "
                             "overwrite; choose another --report")


def _finite(value: object) -> object:
    """JSON has no Infinity or NaN: such figures are written as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def report_text(report: dict[str, Any]) -> str:
    return "".join(report_pieces(report))


def report_pieces(report: dict[str, Any]) -> list[str]:
    """``report`` as JSON, in pieces that join into it: indented when it is small, else
    compact, a piece per top-level entry. A large report (100k nodes: 6 MB) is written
    piece by piece: joined and then encoded it held two more copies of itself."""
    doc: dict[str, Any] = report
    try:
        pieces = _compact(doc)
    except ValueError:
        doc = cast(dict[str, Any], _finite(report))
        pieces = _compact(doc)
    if sum(map(len, pieces)) < PRETTY_JSON_LIMIT:
        return [json.dumps(doc, indent=2, allow_nan=False)]
    return pieces


def _compact(doc: dict[str, Any]) -> list[str]:
    """``json.dumps(doc, allow_nan=False)`` (json's C encoder; indenting makes it pure
    Python), a piece per entry of ``doc``."""
    if not doc or not all(isinstance(k, str) for k in doc):
        return [json.dumps(doc, allow_nan=False)]
    entries = (json.dumps(k) + ": " + json.dumps(v, allow_nan=False) for k, v in doc.items())
    pieces = [("{" if k == 0 else ", ") + entry for k, entry in enumerate(entries)]
    pieces[-1] += "}"
    return pieces


def emit(report: dict[str, Any], render: Render, as_json: bool, report_path: Path | None, quiet: bool,
         protected: tuple[Path | None, ...] = ()) -> None:
    """Write the report where asked: JSON on stdout, a JSON file (never over ``protected``
    files), or tables."""
    from ..io.save import write_text_atomic

    pieces = report_pieces(report) if (as_json or report_path is not None) else []
    if report_path is not None:
        protect_report(report_path, *protected)
        write_text_atomic(report_path, "".join(pieces) + "\n")
    if not as_json:
        from ..report.render import make_console  # rich, only for a terminal report

        render(report, make_console(quiet=quiet))
    elif not quiet:
        for piece in pieces:
            click.echo(piece, nl=False)
        click.echo()


def renderer(module: str, name: str) -> Render:
    """``ckpt_cli.report.<module>.<name>``, imported when a report is rendered: a --json
    run never loads rich, which would slow every command's start."""
    def render(report: dict[str, Any], console: Console) -> None:
        from importlib import import_module

        getattr(import_module(f"ckpt_cli.report.{module}"), name)(report, console)
    return render


def policy_options(f: Command) -> Command:
    """The per-op policy options: ``--recompute-ops`` and ``--keep-ops`` (and, as every
    command that plans takes them, ``--allow-unsized``)."""
    f = click.option("--allow-unsized", is_flag=True,
                     help="Plan even where a tensor's size is unknown before the run (it counts as 0 B); "
                          "without it such a model exits 2, naming the tensors.")(f)
    f = click.option("--keep-ops", metavar="OP,OP", default="",
                     help="Never recompute outputs of these op types, e.g. MatMul,Gemm (every strategy).")(f)
    f = click.option("--recompute-ops", metavar="OP,OP", default="",
                     help="Never keep outputs of these op types in recomputed parts, e.g. Add,Mul,Gelu "
                          "(every strategy).")(f)
    return f


def policy_from(recompute_ops: str, keep_ops: str) -> Policy:

    """A planning Policy from the option values; an op in both lists is a usage error."""
    from ..planning.plan import Policy

    recompute = frozenset(op.strip() for op in recompute_ops.split(",") if op.strip())
    keep = frozenset(op.strip() for op in keep_ops.split(",") if op.strip())
    if recompute & keep:
        raise UsageError(f"--recompute-ops and --keep-ops both name {', '.join(sorted(recompute & keep))}")
    return Policy(keep, recompute)
