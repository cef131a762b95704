"""Memory-over-schedule charts as plain text lines (80 columns by default).

Several timelines can be overlaid (original vs rewritten); each keeps its own glyph.
Timelines of different lengths are stretched to the same width, so the x axis is the
fraction of the schedule done.
"""

from __future__ import annotations

from ..units import human_bytes

_GLYPHS_UNICODE = ("█", "▒", "░", "▓", "▞", "▚")
_GLYPHS_ASCII = ("#", "o", "+", "*", "=", "%")
_LABEL_WIDTH = 11  # "123.4 MiB |"


def _axis_label(n: float) -> str:
    """A y-axis label of at most 9 characters ("1000.0 MiB" becomes "1000 MiB")."""
    text = human_bytes(n)
    if len(text) > 9:
        value, unit = text.split(" ")
        text = f"{float(value):.0f} {unit}"
    return text


def _legend_lines(items: list[str], width: int, ascii_only: bool) -> list[str]:
    """Legend entries joined by three spaces, wrapped so that no line exceeds ``width``."""
    room = max(10, width - _LABEL_WIDTH)
    ellipsis = "..." if ascii_only else "…"
    lines: list[str] = []
    current = ""
    for item in items:
        if len(item) > room:
            item = item[:room - len(ellipsis)] + ellipsis
        if current and len(current) + 3 + len(item) > room:
            lines.append(current)
            current = item
        else:
            current = f"{current}   {item}" if current else item
    if current:
        lines.append(current)
    return [" " * _LABEL_WIDTH + line for line in lines]


def _buckets(timeline: list[int] | tuple[int, ...], width: int) -> list[int]:
    n = len(timeline)
    if n == 0:
        return [0] * width
    out = []
    for c in range(width):
        lo = c * n // width
        hi = max(lo + 1, (c + 1) * n // width)
        out.append(max(timeline[lo:hi]))
    return out


def memory_chart(series: list[tuple[str, list[int]]], width: int = 80, height: int = 10,
                 boundaries: list[int | None] | None = None, ascii_only: bool = False) -> list[str]:
    """Render timelines (bytes after each step) as text; ``boundaries`` marks the step
    where the backward pass starts in each series (drawn as ``|`` on the axis)."""
    plot_width = max(10, width - _LABEL_WIDTH)
    glyphs = _GLYPHS_ASCII if ascii_only else _GLYPHS_UNICODE
    columns = [_buckets(t, plot_width) for _, t in series]
    top = max((max(c) for c in columns if c), default=0) or 1
    rows: list[str] = []
    for r in range(height, 0, -1):
        threshold = top * (r - 0.5) / height
        line = []
        for x in range(plot_width):
            # The lowest series that reaches this cell is drawn in front of the taller ones.
            filled = [(col[x], s) for s, col in enumerate(columns) if col[x] >= threshold]
            line.append(glyphs[min(filled)[1] % len(glyphs)] if filled else " ")
        label = _axis_label(top * r / height) if r in (height, (height + 1) // 2) else ""
        rows.append(f"{label:>9} |" + "".join(line).rstrip())
    axis = ["-"] * plot_width
    for s, b in enumerate(boundaries or []):
        n = len(series[s][1])
        if b is not None and n:
            axis[min(plot_width - 1, b * plot_width // n)] = "|"
    for s, col in enumerate(columns):
        peak_x = col.index(max(col)) if col else 0
        axis[peak_x] = "^"
    rows.append(f"{'0':>9} +" + "".join(axis))
    legend = [f"{glyphs[s % len(glyphs)]} {name}" for s, (name, _) in enumerate(series)]
    rows.extend(_legend_lines(legend + ["| backward starts", "^ peak"], width, ascii_only))
    return rows
