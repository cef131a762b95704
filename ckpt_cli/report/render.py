"""Terminal renderings of report dicts with rich; plain text when not on a terminal."""

from __future__ import annotations

import os
import re
import sys
from typing import IO, Any, cast

from rich import box
from rich.console import Console
from rich.table import Table

from .charts import memory_chart
from ..units import human_bytes, human_flops, percent
from .headline import headline_text
from .text import plain, safe


class _Console(Console):
    def on_broken_pipe(self) -> None:
        # rich exits 1 here, the code of a failed check; let the command line decide.
        self.quiet = True
        raise BrokenPipeError


# Piped output (a CI log) is read by grep and diff: a sentence stays on one line, and a table
# is as wide as its cells, without the spaces rich pads lines with.
_PIPED_WIDTH = 10_000
_TRAILING = re.compile(r"[ \t]+(?=\n)")

# A report, or a part of one, as ``--json`` prints it (``schema.json``): the renderers read
# the JSON document itself.
Json = dict[str, Any]


class _TrimmedLines:
    """``file`` without the spaces at the ends of lines."""

    def __init__(self, file: IO[str]) -> None:
        self._file = file

    def write(self, text: str) -> int:
        return self._file.write(_TRAILING.sub("", text))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)


def make_console(quiet: bool = False, file: IO[str] | None = None) -> Console:
    file = file or sys.stdout
    piped = not file.isatty()
    plain = piped or bool(os.environ.get("NO_COLOR"))
    width = _PIPED_WIDTH if piped else 100 if plain else None
    out = cast(IO[str], _TrimmedLines(file)) if piped else file  # a file in all rich calls on it
    return _Console(file=out, no_color=plain, highlight=False, width=width,
                    soft_wrap=False, quiet=quiet, emoji=False)


MAX_REGION_ROWS = 20  # regions listed one per row in the terminal; the rest are summed in one


def _table(title: str, console: Console, *columns: tuple[str, str]) -> Table:
    plain = console.no_color
    t = Table(title=title, box=box.ASCII2 if plain else box.SIMPLE_HEAVY, title_justify="left",
              show_edge=not plain, pad_edge=False)
    for name, justify in columns:
        t.add_column(name, justify=justify)  # type: ignore[arg-type]
    return t


def chart_lines(console: Console, series: list[tuple[str, list[int]]], boundaries: list[int | None] | None,
                width: int = 80) -> list[str]:
    return [plain(line) for line in memory_chart(series, width=min(width, console.width or width),
                                                 boundaries=boundaries, ascii_only=console.no_color)]


def _activation_scaling(scaled: Json, names: str) -> str:
    """How the stashed activations grow with the dimensions: with them, less, or faster."""
    if scaled["activations_scale"]:
        return f"every stashed activation scales with {names}"
    fixed, faster = len(scaled["fixed_activations"]), len(scaled.get("faster_activations") or ())
    parts = [f"{fixed} stashed activations do not double with {names}"] if fixed else []
    if faster:  # as attention scores do with the sequence length
        parts.append(f"{faster}{'' if fixed else ' stashed activations'} more than double with {names}, "
                     "growing faster than linearly")
    return "; ".join(parts)


def _scaling_formula(scaled: Json) -> str:
    """``peak_bytes_formula`` in units: how the peak grows with the symbolic dimensions."""
    (p0, p1), dims = scaled["peak_bytes"], scaled["dims"]
    names = ", ".join(map(safe, dims))
    if not scaled.get("linear", True):
        growth = f"x{p1 / p0:.2f}" if p0 else "from 0 B"
        return (f"peak not linear in {names}: {human_bytes(p0)} at the values used, {human_bytes(p1)} at twice "
                f"them ({growth})")
    intercept, slope = 2 * p0 - p1, p1 - p0
    if len(dims) == 1:
        (name, value), = dims.items()
        return f"peak = {human_bytes(intercept)} + {human_bytes(slope / value)} * {safe(name)}"
    return f"peak = {human_bytes(intercept)} + {human_bytes(slope)} * k, with {names} all k times the values used"


def render_facts(r: Json, console: Console) -> None:
    """The first lines of a report on a model: what its figures rest on."""
    dims = r.get("dims") or {}
    chosen = [d for d, v in dims.items() if v["source"] == "default"]
    if dims:
        values = ", ".join(f"{safe(d)} = {v['value']}" for d, v in dims.items())
        console.print(f"sizes at {values}" + (f" ({', '.join(map(safe, chosen))}: ckpt's default; set with "
                                               + " ".join(f"--dim {safe(d)}=N" for d in chosen) + ")"
                                               if chosen else ""))
    scaled = r.get("scaling")
    if scaled:
        names = ", ".join(map(safe, scaled["dims"]))
        line = f"{_scaling_formula(scaled)}; "
        line += _activation_scaling(scaled, names)
        if "same_plan_at_doubled_dims" in scaled:
            twice = ", ".join(f"{safe(d)} = {v}" for d, v in scaled["doubled_dims"].items())
            if "budget_unreachable_at_doubled_dims" in scaled:
                line += "; no plan fits the budget at " + twice
            else:
                line += ("; the same plan at " if scaled["same_plan_at_doubled_dims"] else "; another plan at ") + twice
        console.print(line)
    reduced = r.get("reduced_precision")
    if reduced:
        console.print(f"[yellow]{'/'.join(reduced['dtypes'])} graph:[/yellow] {safe(reduced['cpu'])}.")
    for defect in r.get("ort_kernel_defects") or ():
        console.print(f"[yellow]warning:[/yellow] {safe(defect)}.")
    racing = r.get("thread_racing_outputs")
    if racing:
        console.print(f"note: {_racing_line(racing)}.")
    ops = r.get("ort_registered_ops") or {}
    if ops:
        console.print("accepted as ONNX Runtime ops (onnx has no schema for them at this opset): "
                      + ", ".join(f"{safe(op)} x{n}" for op, n in ops.items()))


def _racing_line(outputs: list[str]) -> str:
    named = ", ".join(map(safe, outputs[:3])) + (f" and {len(outputs) - 3} more" if len(outputs) > 3 else "")
    return (f"{named} vary from run to run with more than one ONNX Runtime thread, in the original too "
            "(a reducing ScatterND races where indices repeat); compare at intra_op_num_threads=1, as ckpt check does")


def render_headline(r: Json, console: Console) -> None:
    """The report's first line: the peak it is run for, predicted or measured."""
    text = headline_text(r.get("headline"))
    if text is not None:
        console.print(text, markup=False, highlight=False, style="bold")


def render_inspect(r: Json, console: Console) -> None:
    render_headline(r, console)
    render_facts(r, console)
    console.print(f"[bold]{safe(r['model'])}[/bold]  {r['nodes']} nodes: "
                  f"{r['forward_nodes']} forward, {r['backward_nodes']} backward; "
                  f"loss '{safe(r['loss'])}', {r['gradient_outputs']} gradient outputs")
    t = _table("Memory (predicted)", console, ("", "left"), ("bytes", "right"), ("", "left"))
    t.add_row("parameters + inputs (resident)", human_bytes(r["resident_bytes"]), "")
    t.add_row("stashed activations", human_bytes(r["stashed_bytes"]),
              f"{r['stashed_tensors']} tensors kept from forward to backward")
    t.add_row("peak, PRIORITY_BASED (file order)", human_bytes(r["peak_bytes"]), f"at {safe(r['peak_node'])}")
    t.add_row("peak, ORT DEFAULT order", human_bytes(r["peak_bytes_ort_default"]), "")
    scratch = r.get("peak_bytes_with_kernel_scratch")
    if scratch is not None and scratch != r["peak_bytes"]:
        t.add_row("peak with kernel working memory", human_bytes(scratch),
                  "file order; what the process sees (kernels allocate it outside ORT's arena)")
    floor = r.get("floor")
    if floor is not None:
        t.add_row("floor of every plan", human_bytes(floor["bytes"]),
                  f"no plan goes below it: {safe(floor['node'])} holds its inputs and outputs at once" if floor["node"] is not None
                  else "the resident tensors and the outputs")
    t.add_row("ORT CPU arena at that peak", human_bytes(r["arena_in_use_bytes"]),
              f"in use (what ORT's profiler reports); {human_bytes(r['arena_held_bytes'])} reserved")
    t.add_row("FLOPs forward / backward", f"{human_flops(r['forward_flops'])}",
              f"/ {human_flops(r['backward_flops'])}")
    console.print(t)

    t = _table(f"Top stashed activations ({len(r['top_stashed'])} of {r['stashed_tensors']})", console,
               ("tensor", "left"), ("shape", "left"), ("dtype", "left"), ("bytes", "right"),
               ("producer", "left"), ("scope", "left"))
    for row in r["top_stashed"]:
        t.add_row(safe(row["name"]), safe("x".join(map(str, row["shape"]))) if row["shape"] is not None else "?",
                  safe(row["dtype"]), human_bytes(row["bytes"]), safe(row["producer_op"] or ""),
                  safe(row["scope"] or ""))
    console.print(t)

    if r["scopes"]:
        t = _table("Stashed bytes by scope", console, ("scope", "left"), ("bytes", "right"),
                   ("share", "right"), ("tensors", "right"))
        for row in r["scopes"]:
            t.add_row(safe(row["scope"]), human_bytes(row["stashed_bytes"]),
                      percent(row["stashed_bytes"], r["stashed_bytes"]), str(row["tensors"]))
        console.print(t)

    tl = r["timeline"]
    console.print("Memory over the PRIORITY_BASED schedule")
    for line in chart_lines(console, [("predicted bytes in use", tl["priority_based"])],
                            [tl["backward_starts_at"]]):
        console.print(line, markup=False)

    render_unsized(r, console)


def render_unsized(r: Json, console: Console, where: str = "above") -> None:
    """Say that byte figures leave out tensors of unknown size, never print a silently partial total."""
    rows = r.get("unsized") or []
    if rows:
        missing = sorted({safe(d) for u in rows for d in u["missing_dims"]})
        names = ", ".join(safe(u["tensor"]) for u in rows[:5])
        console.print(f"[yellow]warning: {len(rows)} tensors have unknown size[/yellow] (e.g. {names}; "
                      f"unknown dimensions: {', '.join(missing)}): every byte figure {where} counts them as 0 B, "
                      "so totals are lower bounds.")


def render_rewrite(r: Json, console: Console) -> None:
    render_headline(r, console)
    render_unsized(r, console, "below")  # a plan on 0 B tensors (--allow-unsized) says so first
    render_facts(r, console)
    b, a = r["before"], r["after"]
    console.print(f"[bold]{safe(r['model'])}[/bold] -> [bold]{safe(r['output'])}[/bold]  ({safe(r['strategy'])})")
    for note in r["plan_notes"]:
        console.print(f"  {plain(note)}", markup=False)
    console.print(_before_after_table(r, console))
    if r["regions"]:
        console.print(_regions_table(r["regions"], console))
    console.print("Memory over the schedule (before vs after)")
    for line in chart_lines(console, [("before", b["timeline"]), ("after", a["timeline"])],
                            [b["backward_starts_at"], a["backward_starts_at"]]):
        console.print(line, markup=False)
    if r.get("no_gain_reason"):
        console.print(f"[yellow]No gain:[/yellow] {safe(r['no_gain_reason'])}.")
    if r.get("warning"):
        console.print(f"[yellow]Warning:[/yellow] {safe(r['warning'])}.")
    _render_pin(r.get("pin"), console)
    _render_mem_pattern_off(r.get("mem_pattern_off"), console)
    _render_ort_optimize(r.get("ort_optimize"), console)
    if not r.get("no_gain_reason"):
        console.print("The saving is measured under these ONNX Runtime session settings (`ckpt session OUTPUT`):")
    console.print("\n".join(map(plain, r["session_settings"].splitlines())), markup=False)


def _before_after_table(r: Json, console: Console) -> Table:
    b, a = r["before"], r["after"]
    t = _table("Before / after (predicted, PRIORITY_BASED order)", console, ("", "left"), ("before", "right"),
               ("after", "right"), ("change", "right"))
    for label, key, fmt in (("peak memory", "peak_bytes", human_bytes),
                            ("ORT CPU arena in use", "arena_in_use_bytes", human_bytes),
                            ("stashed activations", "stashed_bytes", human_bytes), ("nodes", "nodes", str)):
        change = percent(a[key] - b[key], b[key]) if b[key] else "n/a"
        t.add_row(label, fmt(b[key]), fmt(a[key]), change if change.startswith("-") else "+" + change)
    t.add_row("recompute FLOPs", "", human_flops(r["recompute_flops"]),
              f"{percent(r['recompute_flops'], r['forward_flops'])} of fwd, "
              f"{percent(r['recompute_flops'], r['step_flops'])} of step")
    return t


def _regions_table(regions: list[Json], console: Console) -> Table:
    """The regions in graph order; past ``MAX_REGION_ROWS``, the rest summed in one row
    (a 700-layer plan printed 700 lines, and rendering them took most of a second)."""
    shown, rest = regions[:MAX_REGION_ROWS], regions[MAX_REGION_ROWS:]
    title = f"Regions ({len(regions)}{f'; the first {len(shown)} shown, all in --json' if rest else ''})"
    t = _table(title, console, ("region", "left"), ("nodes", "right"), ("recomputed", "right"),
               ("no longer stashed", "right"), ("recompute FLOPs", "right"), ("notes", "left"))
    for row in shown:
        t.add_row(safe(row["name"]), str(row["nodes"]), str(row["recompute_nodes"]), human_bytes(row["freed_bytes"]),
                  human_flops(row["recompute_flops"]), _region_notes(row))
    if rest:
        noted = sum(1 for row in rest if _region_notes(row))
        t.add_row(f"... {len(rest)} more", str(sum(r["nodes"] for r in rest)),
                  str(sum(r["recompute_nodes"] for r in rest)), human_bytes(sum(r["freed_bytes"] for r in rest)),
                  human_flops(sum(r["recompute_flops"] for r in rest)), f"{noted} with notes" if noted else "")
    return t


def _region_notes(row: Json) -> str:
    notes: list[str] = []
    if row["kept_random"]:
        notes.append(f"kept random: {', '.join(map(safe, row['kept_random'][:3]))}")
    if row["kept_subgraph"]:
        notes.append(f"kept subgraph: {', '.join(map(safe, row['kept_subgraph'][:3]))}")
    if row.get("recomputed_twice"):
        notes.append(f"recomputed twice: {', '.join(safe(t['tensor']) for t in row['recomputed_twice'][:3])}")
    return "; ".join(notes)


def _render_pin(pin: Json | None, console: Console) -> None:
    if not pin:
        return
    if pin.get("skipped"):
        console.print(f"[yellow]Order not pinned:[/yellow] {safe(pin['skipped'])}.")
    if pin["guard_nodes"]:
        console.print(f"Order pinned: {pin['guard_nodes']} guard nodes ({pin['guarded_inputs']} guarded inputs, "
                      f"{pin['tied_outputs']} tied gradients, {pin['blocks']} blocks) keep recompute blocks in the "
                      "backward under any execution order and optimization level.")
    if pin.get("fresh_tensors"):
        console.print(f"Fresh tensors: {pin['fresh_tensors']} tensors get a buffer of their own under ORT's buffer "
                      f"reuse ({pin['fresh_nodes']} guard nodes hide their shapes), so no freed buffer is held "
                      "idle across the recompute gap.")


def _render_mem_pattern_off(off: Json | None, console: Console) -> None:
    if off:
        console.print(f"Memory pattern off: the optional input '{safe(off['input'])}' (nobody feeds it) makes ONNX "
                      "Runtime drop its memory pattern in every session; a plain session's peak is predicted "
                      f"{human_bytes(off['predicted_plain_without_pattern_bytes'])} without it, "
                      f"{human_bytes(off['predicted_plain_with_pattern_bytes'])} with it.")


def _render_ort_optimize(opt: Json | None, console: Console) -> None:
    if opt:
        fused = ", ".join(f"{n} {op}" for op, n in opt["fused_ops"].items()) or "no contrib ops"
        kept = ", ".join(f"{n} {op}" for op, n in opt["not_recomputable"].items())
        console.print(f"Optimized by ONNX Runtime {opt['onnxruntime']} for {opt['provider']} ({opt['level']}): "
                      f"{opt['nodes_before']} -> {opt['nodes_after']} nodes ({safe(fused)}); "
                      f"{opt['guard_nodes_after']} of {opt['guard_nodes_before']} guard nodes remain; the figures "
                      "above are the optimized graph's."
                      + (f" Forward ops ckpt cannot recompute (kept): {safe(kept)}." if kept else ""))


def _render_module_sessions(m: Json | None, console: Console) -> None:
    """The Module API's training sessions: four process peaks and whether the losses agree."""
    if not m or "skipped" in m:
        return
    for session, label in (("untuned", "untuned"), ("settings", "recorded settings")):
        o, w = m.get(f"original_{session}"), m.get(f"rewritten_{session}")
        peaks = " -> ".join(human_bytes(x["peak_bytes"]) if x else "did not run" for x in (o, w))
        change = f" ({percent(w['peak_bytes'] - o['peak_bytes'], o['peak_bytes'])})" if o and w and o["peak_bytes"] else ""
        same = m["losses_identical"][session]
        losses = "n/a" if same is None else "bit-identical" if same else "DIFFER"
        predicted = m.get("predicted_untuned") if session == "untuned" else None
        model = "" if not predicted else "; ckpt's model of it " + " -> ".join(
            human_bytes(predicted[side]) if predicted.get(side) is not None else "no prediction"
            for side in ("original", "rewritten")) + _long_run(m, predicted)
        console.print(f"Module API training, {m['steps']} steps, {label}: process peak {peaks}{change}; "
                      f"losses {losses}{model}")


def _long_run(m: Json, predicted: Json) -> str:
    """The model's figures once the arena's placements settle, where they differ from the
    steps measured."""
    long_run = m.get("predicted_untuned_long_run") or {}
    later: list[Json] = [x for x in (long_run.get(side) for side in ("original", "rewritten")) if x is not None]
    if len(later) < 2 or all(x["peak_bytes"] == predicted.get(side)
                             for x, side in zip(later, ("original", "rewritten"))):
        return ""
    settles = [x["settles_after_steps"] for x in later]
    when = f"from step {max(settles)} on" if all(settles) else "over a long run"
    return f" ({' -> '.join(human_bytes(x['peak_bytes']) for x in later)} {when})"


def render_check(r: Json, console: Console) -> None:
    o, w, d = r["original"], r["rewritten"], r["original_ort_default"]
    render_headline(r, console)  # none in a rewrite's check: the rewrite's report printed it
    console.print(f"[bold]{safe(r['model'])}[/bold] vs [bold]{safe(r['rewritten_model'])}[/bold] on {r['provider']} "
                  f"(ONNX Runtime {r['ort_version']})")
    t = _table("Measured (median of runs) and predicted", console, ("", "left"), ("peak in use", "right"),
               ("predicted", "right"), ("tensor bytes", "right"), ("predicted", "right"), ("step time", "right"))
    if d is not None:
        t.add_row("original, ORT default settings", human_bytes(d["peak_bytes"]), "", "", "",
                  f"{d['time_s'] * 1e3:.1f} ms")
    rd = r.get("rewritten_ort_default")
    if rd is not None:
        plain = r.get("predicted_plain")
        t.add_row("rewritten, ORT default settings", human_bytes(rd["peak_bytes"]),
                  human_bytes(plain) if plain is not None else "", "", "", f"{rd['time_s'] * 1e3:.1f} ms")
    for label, side, key in (("original, ckpt settings", o, "original"), ("rewritten, ckpt settings", w, "rewritten")):
        t.add_row(label, human_bytes(side["peak_bytes"]), human_bytes(r["predicted_in_use"][key]),
                  human_bytes(side["peak_requested_bytes"]), human_bytes(r["predicted"][key]),
                  f"{side['time_s'] * 1e3:.1f} ms")
    console.print(t)
    n = len(r["outputs"])
    same = sum(1 for e in r["outputs"].values() if e["bit_identical"])
    verdict = "[green]PASS[/green]" if r["passed"] else "[red]FAIL[/red]"
    console.print(f"outputs bit-identical: {same}/{n}; max |diff| {r['max_abs_diff']}; "
                  f"executed order matches file: {'yes' if r['order_matches'] else 'NO'}")
    # The ckpt-settings figure is the headline, printed first; here only the other baseline.
    if d is not None and d["peak_bytes"] and w["peak_bytes"]:
        console.print(f"against ORT's default settings: {human_bytes(d['peak_bytes'])} -> "
                      f"{human_bytes(w['peak_bytes'])} ({percent(w['peak_bytes'] - d['peak_bytes'], d['peak_bytes'])})")
    _render_module_sessions(r.get("module_sessions"), console)
    for label, key in (("peak in use", "prediction_error_in_use"), ("tensor bytes", "prediction_error")):
        errs = [f"{k} {v * 100:+.1f}%" for k, v in r[key].items() if v is not None]
        if errs:
            console.print(f"prediction vs measured {label}: {', '.join(errs)}")
    if r.get("prediction_error_plain") is not None:
        fused = r.get("prediction_error_plain_fused")
        console.print(f"prediction vs measured under ORT's defaults (rewritten; fusions not simulated): "
                      f"{r['prediction_error_plain'] * 100:+.1f}%"
                      + (f"; on ORT's fused graph: {fused * 100:+.1f}%" if fused is not None else ""))
    bad = [name for name, e in r["outputs"].items() if not e["bit_identical"]][:5]
    if bad:
        console.print(f"outputs that differ: {', '.join(map(safe, bad))}")
    for note in r.get("notes", []):
        console.print(f"note: {safe(note)}")
    for failure in r.get("failures", []):
        console.print(f"[red]failed:[/red] {safe(failure)}")
    console.print(f"verdict: {verdict}")


# ------------------------------------------------------------------------------ ckpt compare

def figure_text(value: float | None, kind: str) -> str:
    if value is None:
        return "-"
    if kind == "bytes":
        return human_bytes(value)
    if kind == "share":
        return f"{100.0 * value:.1f}%"
    if kind == "seconds":
        return f"{value * 1e3:.1f} ms"
    if kind == "bool":
        return "yes" if value else "NO"
    return str(value)


def _change_text(ch: Json | None, kind: str) -> str:
    """The second line of a cell: difference and ratio to the first column, coloured
    green when lower (every numeric figure compared is lower-is-better), red when higher."""
    if ch is None:
        return ""
    diff = ch["diff"]
    colour = "green" if diff < 0 else "red" if diff > 0 else "dim"
    return f"[{colour}]{change_words(ch, kind)}[/{colour}]"


def change_words(ch: Json, kind: str) -> str:
    """A change against the first column as plain words: difference, and ratio but for shares."""
    diff, ratio = ch["diff"], ch["ratio"]
    if kind == "bytes":
        text = ("+" if diff >= 0 else "-") + human_bytes(abs(diff))
    elif kind == "share":
        text = f"{100.0 * diff:+.1f} pp"
    elif kind == "seconds":
        text = f"{diff * 1e3:+.1f} ms"
    else:
        text = f"{diff:+d}" if isinstance(diff, int) else f"{diff:+g}"
    if ratio is not None and kind != "share":
        text += f" x{ratio:.2f}"
    return text


def render_compare(r: Json, console: Console) -> None:
    from .compare import FIGURES

    cols = r["inputs"]
    render_headline(r, console)
    console.print(f"[bold]Comparing {len(cols)} inputs[/bold] (second lines: change vs {safe(cols[0]['label'])}; "
                  "lower is green)")
    for k, c in enumerate(cols, 1):
        console.print(plain(f"  {k}. {c['label']}: {c['description']}"), markup=False)

    t = _table("Figures", console, ("", "left"), *((safe(c["label"]), "right") for c in cols))
    for key, label, kind in FIGURES:
        values = [c["figures"][key] for c in cols]
        if all(v is None for v in values):
            continue
        cells = []
        for k, (c, v) in enumerate(zip(cols, values)):
            text = figure_text(v, kind)
            if kind == "bool" and v is not None:
                text = f"[green]{text}[/green]" if v else f"[red]{text}[/red]"
            second = _change_text(c["vs_first"][key], kind) if k else ""
            cells.append(f"{text}\n{second}" if second else text)
        t.add_row(label, *cells)
    console.print(t)

    scoped = scoped_columns(r)
    if scoped:
        t = _table("Stashed bytes by scope, largest changes", console, ("scope", "left"),
                   *((safe(cols[k]["label"]), "right") for k in scoped))
        for row in r["scopes"]:
            cells = []
            for text, d in scope_cells(row, scoped):
                if d is not None:
                    colour = "green" if d < 0 else "red" if d > 0 else "dim"
                    text += f" [{colour}]{'+' if d >= 0 else '-'}{human_bytes(abs(d))}[/{colour}]"
                cells.append(text)
            t.add_row(safe(row["scope"]), *cells)
        console.print(t)

    for c in cols:
        if c["regions"]:
            t = _table(f"{safe(c['label'])}: regions that free the most", console, ("region", "left"),
                       ("no longer stashed", "right"), ("recompute FLOPs", "right"))
            for g in c["regions"][:5]:
                t.add_row(safe(g["name"]), human_bytes(g["freed_bytes"]), human_flops(g["recompute_flops"]))
            console.print(t)

    charted = [c for c in cols if c["timeline"]]
    if charted:
        console.print("Memory over the schedule (predicted; x: fraction of each schedule)")
        for line in chart_lines(console, [(c["label"], c["timeline"]) for c in charted],
                                [c["backward_starts_at"] for c in charted]):
            console.print(line, markup=False)

    for o in r["conditions"]:
        verdict = "[red]holds: FAIL[/red]" if o["held"] else "[green]ok[/green]"
        console.print(f"--fail-if {safe(o['condition'])}: "
                      f"{condition_value_text(o['operand'], o['actual'])} -> {verdict}")


def condition_value_text(operand: str, value: float) -> str:
    """A condition's left-hand value for people: ratios as percentages, bytes in units."""
    if operand.startswith("ratio("):
        return f"{value:.3f} ({100.0 * value:.1f}%)"
    if operand.endswith("bytes") and value == int(value):
        return f"{int(value)} ({human_bytes(value)})"
    return f"{value:g}"


def scoped_columns(r: Json) -> list[int]:
    """The compared files with stashed bytes by scope, when two or more have them; else []."""
    scoped = [k for k in range(len(r["inputs"])) if any(row["stashed_bytes"][k] is not None for row in r["scopes"])]
    return scoped if r["scopes"] and len(scoped) >= 2 else []


def scope_cells(row: Json, scoped: list[int]) -> list[tuple[str, int | None]]:
    """Per scoped file: its stashed bytes as text, and the change against the first (None there)."""
    vals, base = row["stashed_bytes"], scoped[0]
    return [(human_bytes(vals[k]), None if k == base else vals[k] - vals[base]) for k in scoped]
