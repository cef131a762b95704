"""Side-by-side comparison of reports and models: the data behind ``ckpt compare``.

Every input becomes one column, described by the same figures:

* an ONNX model is analysed on the fly (as ``ckpt inspect`` would);
* an ``inspect`` report describes the model it inspected;
* a ``rewrite`` report describes the rewritten model (its ``after`` side, plus the
  measured figures of ``check`` when it was written with ``--check``);
* a ``check`` report describes the rewritten model it measured; the original model (or
  its inspect report) beside it takes the original's measured figures from it.

The first input is the baseline: every other column shows its difference and ratio
to it. ``--fail-if`` conditions (see :mod:`.conditions`) read the last input.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict


from ..errors import ModelError, UsageError
from .conditions import Condition, as_number, lookup
from .headline import compare_headline
from .model import SCHEMA_VERSION, envelope

# (key, label, kind). kind drives formatting; all numeric figures are lower-is-better.
FIGURES: tuple[tuple[str, str, str], ...] = (
    ("peak_bytes", "predicted peak", "bytes"),
    ("ort_peak_bytes", "predicted ORT + inputs", "bytes"),
    ("measured_peak_bytes", "measured peak (ORT)", "bytes"),
    ("stashed_bytes", "stashed activations", "bytes"),
    ("recompute_share", "recompute FLOPs / step", "share"),
    ("step_time_s", "step time (median)", "seconds"),
    ("outputs_equal", "outputs bit-identical", "bool"),
    ("nodes", "nodes", "count"),
)
FIGURE_KEYS = tuple(k for k, _, _ in FIGURES)
REPORT_COMMANDS = ("inspect", "plan", "rewrite", "check")
TOP_SCOPES = 8


@dataclass
class Input:
    path: str
    label: str
    kind: str  # "onnx", "inspect", "plan", "rewrite" or "check"
    report: dict[str, Any]
    figures: dict[str, Any]
    scopes: dict[str, int] | None = None
    series: list[int] | None = None
    backward_starts_at: int | None = None
    regions: list[dict[str, Any]] = field(default_factory=list)
    dim_names: set[str] = field(default_factory=set)  # symbolic dimensions (ONNX inputs)
    description: str = ""


# ---------------------------------------------------------------------------------- loading

def _describe(kind: str, r: dict[str, Any]) -> str:
    if kind == "onnx":
        return "ONNX model, analysed now"
    if kind == "inspect":
        return f"inspect report of {Path(r['model']).name}"
    if kind == "plan":
        return f"plan report of {Path(r['model']).name} ({r['strategy']})"
    if kind == "rewrite":
        text = f"rewrite report: {Path(r['model']).name} -> {Path(r['output'] or '?').name}"
        return text + (f", checked on {r['check']['provider']}" if r.get("check") else "")
    return f"check report: {Path(r['model']).name} vs {Path(r['rewritten_model']).name} on {r['provider']}"


def _need(report: dict[str, Any], path: str, source: str) -> Any:
    try:
        return lookup(report, path)
    except KeyError as e:
        raise UsageError(f"{source}: not a complete ckpt {report.get('command')} report "
                         f"(no '{path}')") from e


def _read_report(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except UnicodeDecodeError as e:
        raise UsageError(f"{path}: neither a ckpt JSON report nor an ONNX model") from e
    except json.JSONDecodeError as e:
        raise UsageError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from e
    if not isinstance(doc, dict) or doc.get("command") not in REPORT_COMMANDS:
        got = doc.get("command") if isinstance(doc, dict) else type(doc).__name__
        raise UsageError(f"{path}: not a ckpt inspect, plan, rewrite or check report (command: {got!r})")
    version = doc.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise UsageError(f"{path}: not a ckpt report (no integer schema_version)")
    if version > SCHEMA_VERSION:
        raise UsageError(f"{path}: report schema_version {version} is newer than this ckpt reads "
                         f"({SCHEMA_VERSION}); upgrade ckpt")
    return doc


def _looks_like_json(path: Path) -> bool:
    with open(path, "rb") as f:
        head = f.read(64).lstrip()
    return head.startswith(b"{") or path.suffix.lower() == ".json"


def _recompute_share(r: dict[str, Any], source: str) -> float | None:
    """FLOPs of ckpt's recompute copies in an inspected model over the FLOPs of the step
    without them; None for a report written before inspect counted the copies."""
    recompute = r.get("recompute_flops")
    if recompute is None:
        return None
    rest = _need(r, "forward_flops", source) + _need(r, "backward_flops", source) - recompute
    return recompute / rest if rest else 0.0


def _analyse_model(path: Path, dims: dict[str, int]) -> tuple[dict[str, Any], set[str]]:
    """inspect report and symbolic dimension names of an ONNX model.
    ``dims`` naming dimensions this model does not have are ignored here."""
    from ..analysis import analyse, symbolic_dims
    from ..io.load import load_graph
    from .model import Source, inspect_report

    graph = load_graph(path)
    names = symbolic_dims(graph)
    bound = {k: v for k, v in dims.items() if k in names}
    a = analyse(graph, bound)
    report = {**inspect_report(a, Source.of_file(path), {"dims": [f"{k}={v}" for k, v in bound.items()]}),
              "written_by_ckpt": graph.model.producer_name == "ckpt"}
    return report, names


def _figures(kind: str, r: dict[str, Any], source: str) -> dict[str, Any]:
    f: dict[str, Any] = dict.fromkeys(FIGURE_KEYS)
    if kind in ("onnx", "inspect"):
        f["peak_bytes"] = _need(r, "peak_bytes", source)
        f["ort_peak_bytes"] = r.get("ort_peak_bytes")  # older reports lack it
        f["stashed_bytes"] = _need(r, "stashed_bytes", source)
        f["nodes"] = _need(r, "nodes", source)
        f["recompute_share"] = _recompute_share(r, source)
    elif kind == "plan":
        f["peak_bytes"] = _need(r, "peak_bytes_after", source)
        f["ort_peak_bytes"] = r.get("ort_peak_bytes_after")
        f["recompute_share"] = _need(r, "recompute_share_of_step", source)
    elif kind == "rewrite":
        f["peak_bytes"] = _need(r, "after.peak_bytes", source)
        f["ort_peak_bytes"] = (r.get("after") or {}).get("ort_peak_bytes")
        f["stashed_bytes"] = _need(r, "after.stashed_bytes", source)
        f["nodes"] = _need(r, "after.nodes", source)
        f["recompute_share"] = _need(r, "recompute_share_of_step", source)
        check = r.get("check")
        if check:
            f["measured_peak_bytes"] = (_need(r, "check.rewritten", source) or {}).get("peak_bytes")
            f["step_time_s"] = (check.get("rewritten") or {}).get("time_s")
            f["outputs_equal"] = _need(r, "check.outputs_equal", source)
    else:  # check
        side = _need(r, "rewritten", source) or {}
        f["measured_peak_bytes"] = side.get("peak_bytes")
        f["step_time_s"] = side.get("time_s")
        f["outputs_equal"] = _need(r, "outputs_equal", source)
    return f


def load_input(path: str | Path, label: str, dims: dict[str, int] | None = None) -> Input:
    """Read a report JSON file or analyse an ONNX model. Raises UsageError / ModelError."""
    p = Path(path)
    if not p.exists():
        raise ModelError(f"{p}: no such file")
    if p.is_dir():
        raise ModelError(f"{p}: is a directory, expected a report (.json) or a model (.onnx)")
    if p.stat().st_size == 0:
        raise ModelError(f"{p}: empty file, neither a report nor a model")
    names: set[str] = set()
    if _looks_like_json(p):
        report = _read_report(p)
        kind = report["command"]
    else:
        report, names = _analyse_model(p, dims or {})
        kind = "onnx"
    src = str(p)
    if kind == "onnx":
        inp = _make_input(src, label, kind, report)
        inp.dim_names = names
        return inp
    try:
        return _make_input(src, label, kind, report)
    except (KeyError, IndexError, TypeError, AttributeError, ValueError) as e:
        raise UsageError(f"{src}: not a well-formed ckpt {kind} report ({type(e).__name__}: {e})") from e


def _make_input(src: str, label: str, kind: str, report: dict[str, Any]) -> Input:
    inp = Input(path=src, label=label, kind=kind, report=report, figures=_figures(kind, report, src))
    inp.description = _describe(kind, report)
    if kind in ("onnx", "inspect"):
        inp.scopes = {row["scope"]: row["stashed_bytes"] for row in _need(report, "scopes", src)}
        inp.series = list(_need(report, "timeline.priority_based", src))
        inp.backward_starts_at = report["timeline"].get("backward_starts_at")
    elif kind == "rewrite":
        after = report["after"]
        if isinstance(after.get("scopes"), list):  # reports that carry scopes on each side
            inp.scopes = {row["scope"]: row["stashed_bytes"] for row in after["scopes"]}
        inp.series = list(_need(report, "after.timeline", src))
        inp.backward_starts_at = after.get("backward_starts_at")
        inp.regions = sorted(({"name": g["name"], "freed_bytes": g["freed_bytes"],
                               "recompute_flops": g.get("recompute_flops")}
                              for g in _need(report, "regions", src)),
                             key=lambda g: -(g["freed_bytes"] or 0))
    return inp


def labels_for(paths: list[str]) -> list[str]:
    """Short column labels: file names, made unique with the parent folder or a number."""
    names = [Path(p).name for p in paths]
    out = []
    for p, name in zip(paths, names):
        if names.count(name) > 1:
            parent = Path(p).parent.name
            name = f"{parent}/{name}" if parent else name
        out.append(name)
    for k, name in enumerate(out):
        if out.count(name) > 1:
            out[k] = f"{name}#{k + 1}"
    return out


def load_inputs(paths: list[str], dims: dict[str, int] | None = None, allow_mixed: bool = False) -> list[Input]:
    """Load every input; ``dims`` bind symbolic dimensions of the ONNX inputs that have them.
    Inputs about different original models are refused unless ``allow_mixed``."""
    inputs = [load_input(p, label, dims) for p, label in zip(paths, labels_for(paths))]
    if not allow_mixed:
        check_same_model(inputs)
    _measured_originals(inputs)
    known = set().union(*(i.dim_names for i in inputs))
    unknown = sorted(set(dims or {}) - known)
    if unknown:
        have = ", ".join(sorted(known)) or "none"
        raise UsageError(f"--dim {unknown[0]}: no ONNX input has this symbolic dimension (they have: {have})")
    return inputs


def _measured_originals(inputs: list[Input]) -> None:
    """An original model (or its inspect report) beside a check or rewrite --check report
    that measured it takes the original's measured figures from that report."""
    measured: dict[str, dict[str, Any]] = {}
    for inp in inputs:
        check = inp.report if inp.kind == "check" else inp.report.get("check") if inp.kind == "rewrite" else None
        sha = inp.report.get("model_sha256")
        if isinstance(check, dict) and isinstance(check.get("original"), dict) and isinstance(sha, str):
            measured.setdefault(sha, check["original"])
    for inp in inputs:
        sha = inp.report.get("model_sha256")
        side = measured.get(sha) if inp.kind in ("onnx", "inspect") and isinstance(sha, str) else None
        if side is not None and inp.figures["measured_peak_bytes"] is None:
            inp.figures["measured_peak_bytes"] = side.get("peak_bytes")
            inp.figures["step_time_s"] = side.get("time_s")


def _original_sha(inp: Input) -> str | None:
    """The SHA-256 of the original model an input is about, when it says: rewrite and check
    reports name their input model, and an ONNX model not written by ckpt is its own original.
    Inspect reports and ckpt-written models may be of a rewrite: they are not checked."""
    r = inp.report
    if inp.kind in ("rewrite", "check") or (inp.kind == "onnx" and not r.get("written_by_ckpt")):
        sha = r.get("model_sha256")
        return sha if isinstance(sha, str) else None
    return None


def check_same_model(inputs: list[Input]) -> None:
    """Refuse to put side by side inputs about different original models."""
    seen: dict[str, Input] = {}
    for inp in inputs:
        sha = _original_sha(inp)
        if sha is not None:
            seen.setdefault(sha, inp)
    if len(seen) > 1:
        (a, x), (b, y) = list(seen.items())[:2]
        raise UsageError(f"{x.label} is about model sha256 {a[:12]} but {y.label} about {b[:12]}: "
                         "these are different models (pass --allow-mixed to compare them anyway)")


# ---------------------------------------------------------------------------------- comparing

class Change(TypedDict):
    """A figure against the first input's: the difference, and the ratio (None where the first is 0)."""

    diff: float
    ratio: float | None


def change(first: Any, value: Any, kind: str) -> Change | None:
    """Difference and ratio of ``value`` to ``first`` (None when either is missing)."""
    if kind == "bool" or first is None or value is None:
        return None
    diff = value - first
    return {"diff": diff, "ratio": (value / first) if first else None}


def scope_rows(inputs: list[Input], limit: int = TOP_SCOPES) -> list[dict[str, Any]]:
    """Per-scope stashed bytes of the inputs that have them, the scopes whose bytes
    changed most (versus the first such input) first."""
    scoped = {k: i.scopes for k, i in enumerate(inputs) if i.scopes is not None}
    if len(scoped) < 2:
        return []
    order: list[str] = []
    for scopes in scoped.values():
        order.extend(s for s in scopes if s not in order)
    base, *others = scoped
    rows: list[dict[str, Any]] = []
    for scope in order:
        values = [(scoped[k].get(scope, 0) if k in scoped else None) for k in range(len(inputs))]
        biggest = max(abs(scoped[k].get(scope, 0) - scoped[base].get(scope, 0)) for k in others)
        if biggest:
            rows.append({"scope": scope, "stashed_bytes": values, "max_change_bytes": biggest})
    rows.sort(key=lambda r: -r["max_change_bytes"])  # stable: forward order among equals
    return rows[:limit]


@dataclass
class Outcome:
    condition: Condition
    actual: float
    held: bool

    def to_json(self) -> dict[str, Any]:
        c = self.condition
        return {"condition": c.text, "operand": c.operand, "op": c.op, "value": c.value,
                "actual": self.actual, "held": self.held}


def _resolve(inp: Input, name: str) -> tuple[bool, Any]:
    """(found, value) of a figure or a dotted path into the input's report."""
    if name in FIGURE_KEYS:
        return True, inp.figures[name]
    try:
        return True, lookup(inp.report, name)
    except KeyError:
        return False, None


def _number(inp: Input, name: str, cond: Condition) -> float:
    found, value = _resolve(inp, name)
    if not found:
        figures = ", ".join(FIGURE_KEYS)
        raise UsageError(f"--fail-if '{cond.text}': {inp.label} ({inp.kind}) has no field '{name}' "
                         f"(figures: {figures}; or a dotted path into its JSON)")
    if value is None:
        if name in ("measured_peak_bytes", "step_time_s", "outputs_equal"):
            why = "measured figures come from check and rewrite --check reports"
        elif inp.kind == "check" and name in FIGURE_KEYS:
            why = "a check report carries no predicted figures"
        elif name == "recompute_share":
            why = "an inspect report has no per-node FLOPs; compare the model itself"
        else:
            why = "the value is null there"
        raise UsageError(f"--fail-if '{cond.text}': {inp.label} ({inp.kind}) has no value for '{name}' ({why})")
    number = as_number(value)
    if number is None:
        raise UsageError(f"--fail-if '{cond.text}': '{name}' in {inp.label} is a {type(value).__name__}, "
                         "not a number")
    return number


def evaluate(conditions: list[Condition], inputs: list[Input]) -> list[Outcome]:
    """Evaluate every condition on the last input (ratios: last / first)."""
    last, first = inputs[-1], inputs[0]
    out = []
    for c in conditions:
        x = _number(last, c.field, c)
        if c.ratio:
            if len(inputs) < 2:
                raise UsageError(f"--fail-if '{c.text}': ratio() needs at least two inputs")
            base = _number(first, c.field, c)
            if base == 0:
                raise UsageError(f"--fail-if '{c.text}': '{c.field}' is 0 in the first input "
                                 f"({first.label}); no ratio")
            x = x / base
        out.append(Outcome(c, x, c.holds(x)))
    return out


def compare_report(inputs: list[Input], outcomes: list[Outcome], options: dict[str, Any]) -> dict[str, Any]:
    """The ``ckpt compare --json`` object."""
    kinds = {k: kind for k, _, kind in FIGURES}
    first = inputs[0].figures
    cols = []
    for k, inp in enumerate(inputs):
        r = inp.report
        cols.append({
            "path": inp.path,
            "label": inp.label,
            "kind": inp.kind,
            "model": r.get("model"),
            "model_sha256": r.get("model_sha256"),
            "figures": inp.figures,
            "vs_first": None if k == 0 else {
                key: change(first[key], inp.figures[key], kinds[key]) for key in FIGURE_KEYS},
            "description": inp.description,
            "regions": inp.regions,
            "timeline": inp.series,
            "backward_starts_at": inp.backward_starts_at,
        })
    return {
        **envelope("compare", None, options),
        "headline": compare_headline(first, inputs[-1].figures if len(inputs) > 1 else None),
        "inputs": cols,
        "scopes": scope_rows(inputs),
        "conditions": [o.to_json() for o in outcomes],
        "failed": any(o.held for o in outcomes),
    }
