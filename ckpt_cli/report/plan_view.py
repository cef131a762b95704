"""The plan report in a terminal (``ckpt plan``, and the planning part of ``ckpt rewrite --auto/--budget``);
``report.model`` builds it."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from ..units import human_bytes, human_flops, percent
from .render import _table, render_facts, render_headline, render_unsized
from .text import plain, safe

TOP_EXPLANATIONS = 12


def render_explanations(rows: list[dict[str, Any]], console: Console, limit: int = TOP_EXPLANATIONS) -> None:
    kept = sum(1 for r in rows if r["status"] == "kept")
    t = _table(f"Stashed activations: {len(rows) - kept} recomputed, {kept} kept (top {min(limit, len(rows))} by size)",
               console, ("tensor", "left"), ("bytes", "right"), ("recompute", "right"), ("status", "left"),
               ("why", "left"))
    for r in rows[:limit]:
        t.add_row(safe(r["tensor"]), human_bytes(r["bytes"]), human_flops(r["recompute_flops"]), safe(r["status"]),
                  safe(r["why"]))
    console.print(t)


def render_budget(planning: dict[str, Any], console: Console) -> None:
    """One line on the budget, when there is one: met or not, on the figure it bounds."""
    if planning["budget_bytes"] is None:
        return
    met = "met" if planning["budget_met"] else "[red]not met[/red]"
    console.print(f"budget {human_bytes(planning['budget_bytes'])} {met}: it bounds what ORT holds (arena in use "
                  f"plus inputs), predicted {human_bytes(planning['ort_peak_bytes_before'])} -> "
                  f"{human_bytes(planning['ort_peak_bytes_after'])}")


def render_plan(r: dict[str, Any], console: Console) -> None:
    render_headline(r, console)
    render_unsized(r, console, "below")  # a plan on 0 B tensors (--allow-unsized) says so first
    render_facts(r, console)
    target = f", budget {human_bytes(r['budget_bytes'])}" if r["budget_bytes"] is not None else ""
    console.print(f"[bold]{safe(r['model'])}[/bold]: plan '{safe(r['strategy'])}'{target} -> "
                  f"{safe(r['output'] or '(not written)')}")
    for note in r["notes"]:
        console.print(f"  {plain(note)}", markup=False)
    console.print(f"predicted peak {human_bytes(r['peak_bytes_before'])} -> {human_bytes(r['peak_bytes_after'])} "
                  f"({percent(r['peak_bytes_after'] - r['peak_bytes_before'], r['peak_bytes_before'])}); "
                  f"recompute {human_flops(r['recompute_flops'])} = {100 * r['recompute_share_of_step']:.1f}% "
                  f"of the step; {len(r['regions'])} regions")
    if r.get("no_gain_reason"):
        console.print(f"[yellow]No gain:[/yellow] {safe(r['no_gain_reason'])}.")
    render_budget(r, console)
    if r["raises_peak"]:
        console.print("[yellow]warning: this plan raises the predicted peak; the graph's peak is not in the "
                      "stashed activations it recomputes. Try another --auto strategy or --budget.[/yellow]")
    render_explanations(r["explanations"], console)
