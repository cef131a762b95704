"""Memory-over-schedule charts as a self-contained SVG document (no dependency, no
external fonts, styles or scripts), for CI artifacts and pull-request comments.

Like the text chart, timelines of different lengths are stretched to the same width:
the x axis is the fraction of each schedule done.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence
from xml.sax.saxutils import escape

from ..units import human_bytes

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")
WIDTH, HEIGHT = 800, 400
_LEFT, _RIGHT, _TOP, _BOTTOM = 80, 20, 40, 50
_MAX_POINTS = 720  # one point per plot pixel at most: the maximum of its steps


def _attr(text: str) -> str:
    return escape(str(text), {'"': "&quot;"})


def _points(timeline: Sequence[int], plot_w: float) -> list[tuple[float, int]]:
    """(fraction of schedule, bytes) pairs as a step line, downsampled by maximum."""
    n = len(timeline)
    if n == 0:
        return []
    if n <= _MAX_POINTS:
        pts = []
        for k, v in enumerate(timeline):
            pts.append((k / n, v))
            pts.append(((k + 1) / n, v))
        return pts
    buckets = min(_MAX_POINTS, int(plot_w))
    pts = []
    for c in range(buckets):
        lo = c * n // buckets
        hi = max(lo + 1, (c + 1) * n // buckets)
        v = max(timeline[lo:hi])
        pts.append((lo / n, v))
        pts.append((hi / n, v))
    return pts


def _nice_step(top: float, ticks: int = 5) -> float:
    """A round tick step in binary units (1, 2 or 5 times a power of 1024 * 10^k)."""
    raw = top / ticks
    unit = 1
    while raw >= 1024 * unit:
        unit *= 1024
    scaled = raw / unit
    base = 1.0
    while base * 10 <= scaled:
        base *= 10
    for m in (1, 2, 5, 10):
        if m * base >= scaled:
            return m * base * unit
    return 10 * base * unit  # pragma: no cover


@dataclass(frozen=True)
class Axes:
    """Where values land in an SVG plot area: x from ``left`` rightwards over ``width`` as
    values go from 0 to ``x_top``; y from ``top + height`` upwards over ``height`` as values
    go from 0 to ``y_top``."""

    left: float
    top: float
    width: float
    height: float
    x_top: float
    y_top: float

    def x(self, value: float) -> float:
        return round(self.left + value / self.x_top * self.width, 2)

    def y(self, value: float) -> float:
        return round(self.top + self.height - value / self.y_top * self.height, 2)


def memory_chart_svg(series: list[tuple[str, list[int]]], boundaries: list[int | None] | None = None,
                     title: str = "Memory over the schedule") -> str:
    """An SVG line chart of memory timelines (bytes in use after each step).

    ``series`` is ``[(name, timeline), ...]``; ``boundaries`` gives, per series, the
    step where the backward pass starts (a dashed line), or None. Each series' peak is
    marked with a dot and its value.
    """
    boundaries = list(boundaries or [])
    top_value = max((max(t) for _, t in series if len(t)), default=0) or 1
    step = _nice_step(top_value)
    y_max = step * -(-top_value // step)  # round up to a whole tick
    axes = Axes(_LEFT, _TOP, WIDTH - _LEFT - _RIGHT, HEIGHT - _TOP - _BOTTOM, 1, y_max)  # x: fraction done
    out = _frame(title) + _grid(axes, step)
    for s, (name, timeline) in enumerate(series):
        boundary = boundaries[s] if s < len(boundaries) else None
        out += _series_lines(axes, COLOURS[s % len(COLOURS)], name, timeline, boundary)
    out += _legend([name for name, _ in series])
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _frame(title: str) -> list[str]:
    """The document's opening: size, title and white background."""
    return [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
            f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">',
            f"<title>{escape(title)}</title>",
            f'<rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill="#ffffff"/>',
            f'<text x="{_LEFT}" y="22" font-size="15" font-weight="bold">{escape(title)}</text>']


def _grid(axes: Axes, step: float) -> list[str]:
    """Horizontal grid lines with their byte labels, the x axis's percentages and both axes."""
    out: list[str] = []
    v = 0.0
    while v <= axes.y_top + step / 2:
        out.append(f'<line x1="{_LEFT}" y1="{axes.y(v)}" x2="{WIDTH - _RIGHT}" y2="{axes.y(v)}" stroke="#e0e0e0"/>')
        out.append(f'<text x="{_LEFT - 6}" y="{axes.y(v) + 4}" text-anchor="end">{escape(human_bytes(v))}</text>')
        v += step
    bottom = _TOP + axes.height
    for k in range(0, 11, 2):
        out.append(f'<text x="{axes.x(k / 10)}" y="{bottom + 16}" text-anchor="middle">{k * 10}%</text>')
    out.append(f'<text x="{_LEFT + axes.width / 2}" y="{HEIGHT - 12}" text-anchor="middle">'
               "fraction of the schedule executed (dashed: backward starts)</text>")
    out.append(f'<line x1="{_LEFT}" y1="{_TOP}" x2="{_LEFT}" y2="{bottom}" stroke="#000000"/>')
    out.append(f'<line x1="{_LEFT}" y1="{bottom}" x2="{WIDTH - _RIGHT}" y2="{bottom}" stroke="#000000"/>')
    return out


def _series_lines(axes: Axes, colour: str, name: str, timeline: Sequence[int], boundary: int | None) -> list[str]:
    """One timeline: its step line, its peak (a dot and the value) and where its backward
    starts (a dashed line)."""
    out: list[str] = []
    n = len(timeline)
    pts = _points(list(timeline), axes.width)
    if pts:
        coords = " ".join(f"{axes.x(f)},{axes.y(b)}" for f, b in pts)
        out.append(f'<polyline class="series" fill="none" stroke="{colour}" stroke-width="1.5" '
                   f'points="{coords}"><title>{escape(name)}</title></polyline>')
        peak = max(timeline)
        k = list(timeline).index(peak)
        px, py = axes.x((k + 0.5) / n), axes.y(peak)
        out.append(f'<circle cx="{px}" cy="{py}" r="3.5" fill="{colour}"/>')
        out.append(f'<text x="{px}" y="{py - 7}" text-anchor="middle" fill="{colour}">'
                   f"{escape(human_bytes(peak))}</text>")
    if boundary is not None and n:
        bx = axes.x(boundary / n)
        out.append(f'<line x1="{bx}" y1="{_TOP}" x2="{bx}" y2="{_TOP + axes.height}" stroke="{colour}" '
                   'stroke-dasharray="4 3"/>')
    return out


def _legend(names: list[str]) -> list[str]:
    """Top right, one row per series."""
    out: list[str] = []
    if names:
        out.append(f'<rect x="{WIDTH - _RIGHT - 246}" y="{_TOP + 2}" width="244" height="{16 * len(names) + 6}" '
                   'fill="#ffffff" fill-opacity="0.85" stroke="#cccccc"/>')
    for s, name in enumerate(names):
        colour = COLOURS[s % len(COLOURS)]
        ly = _TOP + 18 + 16 * s
        lx = WIDTH - _RIGHT - 240
        out.append(f'<rect x="{lx}" y="{ly - 6}" width="14" height="4" fill="{colour}"/>')
        out.append(f'<text x="{lx + 20}" y="{ly}">{escape(name[:36])}</text>')
    return out
