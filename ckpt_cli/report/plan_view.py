"""The plan report (``ckpt plan``, and the planning part of ``ckpt rewrite --auto/--budget``)."""

from __future__ import annotations

from rich.console import Console

from ..units import human_bytes, human_flops, percent
from .model import envelope, unsized_rows
from .render import _table, render_unsized
from .text import plain, safe

TOP_EXPLANATIONS = 12


def planning_section(a, planned, result, rows: list[dict]) -> dict:
    """Figures of a plan: its budget, predicted effect and why each activation is kept or not."""
    step = a.forward_flops + a.backward_flops
    search = planned.search
    return {
        "strategy": planned.plan.strategy if planned.plan else "none",
        "budget_bytes": planned.budget,
        "budget_met": None if planned.budget is None else result.after.priority.peak_bytes <= planned.budget,
        "evaluations": search.evaluations if search else None,
        "peak_bytes_before": a.priority.peak_bytes,
        "peak_bytes_after": result.after.priority.peak_bytes,
        "raises_peak": result.after.priority.peak_bytes > a.priority.peak_bytes,
        "recompute_flops": result.recompute_flops,
        "recompute_share_of_step": result.recompute_flops / step if step else 0.0,
        "explanations": rows,
    }


def plan_report(a, source, planned, result, rows: list[dict], output: str | None, options: dict) -> dict:
    plan_json = planned.plan.to_json([n.name for n in a.graph.nodes]) if planned.plan else None
    return {
        **envelope("plan", source, options),
        "output": output,
        **planning_section(a, planned, result, rows),
        "notes": planned.plan.notes if planned.plan else [],
        "regions": [{"name": r["name"], "nodes": len(r["nodes"]), "keep": len(r["keep"])}
                    for r in (plan_json or {}).get("regions", [])],
        "plan": plan_json,
        "unsized": unsized_rows(a),
    }


def render_explanations(rows: list[dict], console: Console, limit: int = TOP_EXPLANATIONS) -> None:
    kept = sum(1 for r in rows if r["status"] == "kept")
    t = _table(f"Stashed activations: {len(rows) - kept} recomputed, {kept} kept (top {min(limit, len(rows))} by size)",
               console, ("tensor", "left"), ("bytes", "right"), ("recompute", "right"), ("status", "left"),
               ("why", "left"))
    for r in rows[:limit]:
        t.add_row(safe(r["tensor"]), human_bytes(r["bytes"]), human_flops(r["recompute_flops"]), safe(r["status"]),
                  safe(r["why"]))
    console.print(t)


def render_plan(r: dict, console: Console) -> None:
    target = f", budget {human_bytes(r['budget_bytes'])}" if r["budget_bytes"] is not None else ""
    console.print(f"[bold]{safe(r['model'])}[/bold]: plan '{safe(r['strategy'])}'{target} -> "
                  f"{safe(r['output'] or '(not written)')}")
    for note in r["notes"]:
        console.print(f"  {plain(note)}", markup=False)
    console.print(f"predicted peak {human_bytes(r['peak_bytes_before'])} -> {human_bytes(r['peak_bytes_after'])} "
                  f"({percent(r['peak_bytes_after'] - r['peak_bytes_before'], r['peak_bytes_before'])}); "
                  f"recompute {human_flops(r['recompute_flops'])} = {100 * r['recompute_share_of_step']:.1f}% "
                  f"of the step; {len(r['regions'])} regions")
    if r["raises_peak"]:
        console.print("[yellow]warning: this plan raises the predicted peak; the graph's peak is not in the "
                      "stashed activations it recomputes. Try another --auto strategy or --budget.[/yellow]")
    render_explanations(r["explanations"], console)
    render_unsized(r, console)
