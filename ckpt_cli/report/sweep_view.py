"""The ``ckpt plan --sweep`` report: a table, a text scatter chart and an SVG of
predicted peak against recompute share."""

from __future__ import annotations

from html import escape
from math import ceil
from typing import TYPE_CHECKING, Any

from rich.console import Console

from .headline import headline
from .model import Source, envelope
from .render import _table, render_headline
from .svg import Axes
from .text import safe
from ..units import human_bytes, human_flops

if TYPE_CHECKING:
    from ..analysis import Analysis

CHART_W, CHART_H = 60, 14  # text chart cells
SVG_W, SVG_H, MARGIN = 720, 420, 70


def sweep_report(a: Analysis, source: Source | None, points: list[dict[str, Any]], options: dict[str, Any],
                 notes: list[str]) -> dict[str, Any]:
    knee = next((p["peak_bytes"] for p in points if p.get("knee")), None)
    return {**envelope("plan", source, options), "headline": headline(a.priority.peak_bytes, knee),
            "sweep": points, "notes": notes,
            "peak_bytes_before": a.priority.peak_bytes, "ort_peak_bytes_before": a.ort_peak_bytes}


def chart_lines(points: list[dict[str, Any]], width: int = CHART_W, height: int = CHART_H) -> list[str]:
    """Peak (rows, top = highest) against recompute share (columns); ``*`` on the front, ``.`` off it."""
    top = max(p["peak_bytes"] for p in points)
    low = min(p["peak_bytes"] for p in points)
    right = max(p["recompute_share"] for p in points) or 1.0
    grid = [[" "] * width for _ in range(height)]
    for p in sorted(points, key=lambda p: p["pareto"]):  # front points drawn last, on top
        col = min(width - 1, round(p["recompute_share"] / right * (width - 1)))
        row = 0 if top == low else min(height - 1, round((top - p["peak_bytes"]) / (top - low) * (height - 1)))
        grid[row][col] = "*" if p["pareto"] else "."
    lines = []
    for r, cells in enumerate(grid):
        value = top - (top - low) * r / max(1, height - 1)
        label = human_bytes(value) if r in (0, height // 2, height - 1) else ""
        lines.append(f"{label:>10} |{''.join(cells)}")
    lines.append(" " * 11 + "+" + "-" * width)
    lines.append(" " * 12 + f"0%{'recompute share of the step':^{width - 10}}{100 * right:.0f}%")
    return lines


def render_sweep(r: dict[str, Any], console: Console) -> None:
    points = r["sweep"]
    render_headline(r, console)
    console.print(f"[bold]{safe(r['model'])}[/bold]: predicted peak against recompute")
    console.print(f"  {len(points)} plans from the min-cut front; original {human_bytes(r['peak_bytes_before'])}")
    for note in r["notes"]:
        console.print(f"  {safe(note)}")
    for line in chart_lines(points):
        console.print(line, highlight=False, markup=False)
    t = _table("Plans (* on the front: no other plan has both a lower peak and less recompute; K the knee)", console,
               ("", "left"), ("predicted peak", "right"), ("kept", "right"), ("recompute", "right"),
               ("share of step", "right"), ("--budget", "right"))
    base, ort_base = r["peak_bytes_before"], r["ort_peak_bytes_before"]
    for p in points:
        t.add_row(("*" if p["pareto"] else "") + ("K" if p.get("knee") else ""), human_bytes(p["peak_bytes"]),
                  human_bytes(p["kept_bytes"]), human_flops(p["recompute_flops"]),
                  f"{100 * p['recompute_share']:.1f}%", _budget_share(p["ort_peak_bytes"], ort_base))
    console.print(t)
    console.print("  --budget: ORT's arena in use plus inputs, as a share of the original's")
    knee = next((p for p in points if p.get("knee")), None)
    if knee is not None:
        console.print(f"Knee (K): {human_bytes(knee['peak_bytes'])}, {100 * knee['peak_bytes'] / base:.0f}% of the "
                      f"original, for {100 * knee['recompute_share']:.1f}% of a step's FLOPs")
        console.print("  past it, 1% more of a step saves under 1% of the peak "
                      f"(`--budget {_budget_share(knee['ort_peak_bytes'], ort_base)}`)")


def _budget_share(ort_peak: int, ort_base: int) -> str:
    """The smallest whole percentage of the original's ORT peak that admits ``ort_peak``."""
    return f"{ceil(100 * ort_peak / ort_base)}%"

def sweep_svg(points: list[dict[str, Any]], title: str) -> str:
    top = max(p["peak_bytes"] for p in points) * 1.05
    right = max(max(p["recompute_share"] for p in points), 1e-9) * 1.05
    plot_w, plot_h = SVG_W - 2 * MARGIN, SVG_H - 2 * MARGIN
    axes = Axes(MARGIN, MARGIN, plot_w, plot_h, right, top)
    x, y = axes.x, axes.y
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{SVG_W}" height="{SVG_H}" font-family="sans-serif" '
           f'font-size="12"><title>{escape(title)}</title>',
           f'<rect width="{SVG_W}" height="{SVG_H}" fill="#ffffff"/>',
           f'<text x="{MARGIN}" y="30" font-size="15" font-weight="bold">{escape(title)}</text>',
           f'<line x1="{MARGIN}" y1="{MARGIN}" x2="{MARGIN}" y2="{MARGIN + plot_h}" stroke="#000"/>',
           f'<line x1="{MARGIN}" y1="{MARGIN + plot_h}" x2="{MARGIN + plot_w}" y2="{MARGIN + plot_h}" stroke="#000"/>',
           f'<text x="{MARGIN + plot_w / 2}" y="{SVG_H - 20}" text-anchor="middle">recompute share of the step</text>',
           f'<text x="18" y="{MARGIN + plot_h / 2}" transform="rotate(-90 18 {MARGIN + plot_h / 2})" '
           'text-anchor="middle">predicted peak</text>']
    for k in range(5):
        share, peak = right * k / 4, top * k / 4
        out.append(f'<text x="{x(share)}" y="{MARGIN + plot_h + 16}" text-anchor="middle">{100 * share:.0f}%</text>')
        out.append(f'<text x="{MARGIN - 6}" y="{y(peak) + 4}" text-anchor="end">{escape(human_bytes(peak))}</text>')
    front = sorted((p for p in points if p["pareto"]), key=lambda p: p["recompute_share"])
    if front:
        coords = " ".join(f"{x(p['recompute_share'])},{y(p['peak_bytes'])}" for p in front)
        out.append(f'<polyline fill="none" stroke="#1f77b4" stroke-width="1.5" points="{coords}"/>')
    for p in points:
        colour = "#1f77b4" if p["pareto"] else "#aaaaaa"
        label = f"{human_bytes(p['peak_bytes'])}, {100 * p['recompute_share']:.1f}% recompute"
        out.append(f'<circle cx="{x(p["recompute_share"])}" cy="{y(p["peak_bytes"])}" r="4" fill="{colour}">'
                   f"<title>{escape(label)}</title></circle>")
    out.append("</svg>")
    return "\n".join(out) + "\n"
