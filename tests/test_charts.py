"""Memory charts: text charts at 80 columns against committed snapshots, and the SVG chart.

Regenerate the snapshots after an intended change with
``CKPT_UPDATE_SNAPSHOTS=1 .venv/bin/python -m pytest tests/test_charts.py`` and review
the diff.
"""

import io
import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from rich.console import Console

from ckpt_cli.report.charts import memory_chart
from ckpt_cli.report.render import render_compare
from ckpt_cli.report.svg import memory_chart_svg

SNAPSHOTS = Path(__file__).resolve().parent / "snapshots"
MiB = 1024**2


def _original(n: int = 240) -> list[int]:
    """A training step: parameters resident, activations pile up over the forward
    (first 40%), then the backward frees them while gradients come and go."""
    resident, fwd = 48 * MiB, int(n * 0.4)
    out = []
    for k in range(n):
        if k < fwd:
            out.append(resident + (k + 1) * 3 * MiB // 2)
        else:
            left = fwd - (k - fwd) * fwd // (n - fwd)
            out.append(resident + max(0, left) * 3 * MiB // 2 + (8 * MiB if k % 12 < 6 else 2 * MiB))
    return out


def _rewritten(n: int = 300) -> list[int]:
    """The same step with recompute: a low forward plateau, recompute bumps in the backward."""
    resident, fwd = 48 * MiB, int(n * 0.32)
    out = []
    for k in range(n):
        if k < fwd:
            out.append(resident + (k + 1) * MiB // 3)
        else:
            phase = (k - fwd) % 51
            bump = (phase if phase < 30 else 60 - phase) * MiB // 2
            out.append(resident + 24 * MiB + bump - (k - fwd) * 20 * MiB // (n - fwd))
    return out


SERIES = [("original", _original()), ("rewritten", _rewritten())]
BOUNDARIES = [96, 96]


def _check_snapshot(name: str, lines: list[str]) -> None:
    text = "\n".join(lines) + "\n"
    path = SNAPSHOTS / name
    if os.environ.get("CKPT_UPDATE_SNAPSHOTS"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"missing snapshot {path}; run with CKPT_UPDATE_SNAPSHOTS=1"
    expected = path.read_text(encoding="utf-8")
    assert text == expected, f"{name} changed; if intended, regenerate with CKPT_UPDATE_SNAPSHOTS=1:\n{text}"


def test_chart_80_columns_matches_snapshot():
    lines = memory_chart(SERIES, width=80, boundaries=BOUNDARIES, ascii_only=True)
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    _check_snapshot("chart_80.txt", lines)


def test_chart_80_columns_unicode_matches_snapshot():
    lines = memory_chart(SERIES, width=80, boundaries=BOUNDARIES)
    assert all(len(line) <= 80 for line in lines)
    _check_snapshot("chart_80_unicode.txt", lines)


def test_chart_marks_backward_start_and_peaks():
    lines = memory_chart(SERIES, width=80, boundaries=BOUNDARIES, ascii_only=True)
    axis = lines[-2]
    assert axis.startswith("        0 +")
    assert axis.count("^") == 2 and "|" in axis[11:]
    assert "# original" in lines[-1] and "o rewritten" in lines[-1]
    assert lines[0].startswith("200.0 MiB |")  # the top label is the highest value


@pytest.mark.parametrize("width", [40, 60, 80])
def test_long_legends_wrap_within_width(width):
    series = [(f"a very long input label number {k} of a comparison.json", _original(50 + k)) for k in range(6)]
    lines = memory_chart(series, width=width, boundaries=[20] * 6, ascii_only=True)
    assert all(len(line) <= width for line in lines), [line for line in lines if len(line) > width]
    legend = "\n".join(lines[11:])
    assert "| backward starts" in legend and "^ peak" in legend
    for glyph in "#o+*=%":
        assert f"{glyph} a very long" in legend


def test_axis_labels_fit_for_four_digit_values():
    # 1000 MiB would print "1000.0 MiB", one character too many for the label column.
    lines = memory_chart([("x", [1000 * MiB, 10 * MiB])], width=80, ascii_only=True)
    assert all(len(line) <= 80 for line in lines)
    assert lines[0].startswith(" 1000 MiB |")


def test_empty_and_flat_timelines_do_not_crash():
    lines = memory_chart([("empty", []), ("flat", [0, 0, 0])], width=80, ascii_only=True)
    assert len(lines) == 12 and all(len(line) <= 80 for line in lines)


# ---------------------------------------------------------------------------- compare render

def _compare_doc() -> dict:
    """A compare report as compare_report() builds it, with fixed figures."""
    def col(label, kind, figures, timeline, boundary, vs_first=None, regions=()):
        return {"path": label, "label": label, "kind": kind, "description": f"{kind} input",
                "model": "m.onnx", "model_sha256": None, "figures": figures, "vs_first": vs_first,
                "regions": list(regions), "timeline": timeline, "backward_starts_at": boundary}

    from ckpt_cli.report.compare import FIGURES, change

    a = {"peak_bytes": 8792956, "ort_peak_bytes": 9494392, "measured_peak_bytes": None, "stashed_bytes": 6506500, "recompute_share": 0.0,
         "step_time_s": None, "outputs_equal": None, "nodes": 644}
    b = {"peak_bytes": 6101884, "ort_peak_bytes": 6477312, "measured_peak_bytes": 5490548, "stashed_bytes": 657412,
         "recompute_share": 0.2494, "step_time_s": 0.01057, "outputs_equal": True, "nodes": 795}
    kinds = {k: kind for k, _, kind in FIGURES}
    return {
        "inputs": [col("gpt.onnx", "onnx", a, _original(), 96),
                   col("rewrite.json", "rewrite", b, _rewritten(), 96,
                       vs_first={k: change(a[k], b[k], kinds[k]) for k in a},
                       regions=[{"name": "blocks.3", "freed_bytes": 1511424, "recompute_flops": 30920000},
                                {"name": "blocks.0", "freed_bytes": 1445888, "recompute_flops": 22495232}])],
        "scopes": [{"scope": "blocks.3", "stashed_bytes": [1511424, None], "max_change_bytes": 0}],
        "conditions": [{"condition": "measured_peak_bytes>2GiB", "operand": "measured_peak_bytes", "op": ">",
                        "value": 2 * 1024**3, "actual": 5490548.0, "held": False},
                       {"condition": "ratio(peak_bytes)>90%", "operand": "ratio(peak_bytes)", "op": ">",
                        "value": 0.9, "actual": 6101884 / 8792956, "held": False}],
        "failed": False,
    }


def _render(doc, **console_args) -> str:
    buf = io.StringIO()
    console = Console(file=buf, width=80, **console_args)
    render_compare(doc, console)
    return buf.getvalue()


def test_compare_render_80_columns_matches_snapshot():
    text = _render(_compare_doc(), no_color=True, force_terminal=False, highlight=False, emoji=False)
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    assert "\x1b[" not in text
    _check_snapshot("compare_80.txt", [line.rstrip() for line in lines])


def test_compare_render_colours_by_direction_on_a_terminal(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    text = _render(_compare_doc(), force_terminal=True, color_system="standard", highlight=False)
    assert "\x1b[32m-2.6 MiB x0.69" in text  # lower memory: green
    assert "\x1b[31m+151 x1.23" in text  # more nodes: red
    assert "█ gpt.onnx" in text  # unicode chart glyphs on a colour terminal


def test_no_color_means_no_colour_even_on_a_terminal(monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    text = _render(_compare_doc(), force_terminal=True, color_system="standard", highlight=False)
    assert not re.search(r"\x1b\[3\dm", text)  # no foreground colours
    assert "# gpt.onnx" in text  # and the ASCII chart


# ---------------------------------------------------------------------------------------- svg

def test_svg_is_self_contained_and_well_formed():
    svg = memory_chart_svg(SERIES + [("<b>&\"odd\"</b>", [1, 2, 3])], [96, 96, None], title="A & B <x>")
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    assert root.tag == f"{ns}svg"
    assert root.find(f"{ns}title").text == "A & B <x>"
    lines = root.findall(f"{ns}polyline")
    assert [p.find(f"{ns}title").text for p in lines] == ["original", "rewritten", "<b>&\"odd\"</b>"]
    for p in lines:
        pts = [tuple(map(float, xy.split(","))) for xy in p.get("points").split()]
        xs = [x for x, _ in pts]
        assert xs == sorted(xs) and 80 <= xs[0] and xs[-1] <= 780
    assert len(root.findall(f"{ns}circle")) == 3  # one peak dot per series
    dashed = [e for e in root.iter(f"{ns}line") if e.get("stroke-dasharray")]
    assert len(dashed) == 2  # backward starts of the two series that have one
    for banned in ("<script", "href", "@import", "url("):
        assert banned not in svg


def test_svg_downsamples_long_timelines_keeping_the_peak():
    n = 100_000
    timeline = [k % 1000 for k in range(n)]
    timeline[77_777] = 5 * MiB
    svg = memory_chart_svg([("long", timeline)], [n // 2])
    root = ET.fromstring(svg)
    pts = root.find("{http://www.w3.org/2000/svg}polyline").get("points").split()
    assert len(pts) <= 2 * 720
    assert "5.0 MiB" in svg
