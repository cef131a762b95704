"""``ckpt compare --format markdown``: the figures compare prints, as GitHub-flavoured
markdown for a CI step summary (``>> $GITHUB_STEP_SUMMARY``)."""

from __future__ import annotations

import re
from typing import Any

from .render import change_words, condition_value_text, figure_text, scope_cells, scoped_columns
from .text import plain
from ..units import human_bytes, human_flops

# Characters that would start markup, a table cell or HTML inside a cell: backslash-escaped
# (CommonMark escapes any ASCII punctuation), so a file or scope name stays one plain cell.
_MARKUP = re.compile(r"([\\`*_\[\]<>|~#&])")
TOP_REGIONS = 5


def md(value: object) -> str:
    """``value`` as the text of one markdown table cell: controls visible, markup escaped."""
    return _MARKUP.sub(r"\\\1", plain(value).replace("\n", " "))


def _table(header: list[str], rows: list[list[str]], align: list[str]) -> list[str]:
    rule = ["---:" if a == "right" else "---" for a in align]
    return ["| " + " | ".join(cells) + " |" for cells in (header, rule, *rows)]


def _figures(cols: list[dict[str, Any]]) -> list[str]:
    from .compare import FIGURES

    rows = []
    for key, label, kind in FIGURES:
        values = [c["figures"][key] for c in cols]
        if all(v is None for v in values):
            continue
        cells = []
        for k, (c, v) in enumerate(zip(cols, values)):
            change = c["vs_first"][key] if k and v is not None else None
            text = figure_text(v, kind)
            cells.append(f"{text} ({change_words(change, kind)})" if change else text)
        rows.append([label, *cells])
    return _table(["", *(md(c["label"]) for c in cols)], rows, ["left"] + ["right"] * len(cols))


def _scopes(r: dict[str, Any]) -> list[str]:
    cols = r["inputs"]
    scoped = scoped_columns(r)
    if not scoped:
        return []
    rows = []
    for row in r["scopes"]:
        cells = [text if d is None else f"{text} ({'+' if d >= 0 else '-'}{human_bytes(abs(d))})"
                 for text, d in scope_cells(row, scoped)]
        rows.append([md(row["scope"]), *cells])
    header = ["scope", *(md(cols[k]["label"]) for k in scoped)]
    return ["", "**Stashed bytes by scope, largest changes**", "",
            *_table(header, rows, ["left"] + ["right"] * len(scoped))]


def _regions(c: dict[str, Any]) -> list[str]:
    if not c["regions"]:
        return []
    rows = [[md(g["name"]), human_bytes(g["freed_bytes"]), human_flops(g["recompute_flops"])]
            for g in c["regions"][:TOP_REGIONS]]
    return ["", f"**{md(c['label'])}: regions that free the most**", "",
            *_table(["region", "no longer stashed", "recompute FLOPs"], rows, ["left", "right", "right"])]


def _conditions(r: dict[str, Any]) -> list[str]:
    lines = [f"- `--fail-if` {md(o['condition'])}: {md(condition_value_text(o['operand'], o['actual']))}: "
             + ("**holds: FAIL**" if o["held"] else "ok") for o in r["conditions"]]
    return ["", *lines] if lines else []


def compare_markdown(r: dict[str, Any]) -> str:
    """The compare report as markdown: inputs, figures (change against the first input in
    parentheses), stashed bytes by scope, regions, and each --fail-if outcome."""
    cols = r["inputs"]
    lines = [f"### ckpt compare: {len(cols)} inputs", "",
             *(f"{k}. {md(c['label'])}: {md(c['description'])}" for k, c in enumerate(cols, 1)), "",
             f"Changes in parentheses are against {md(cols[0]['label'])}.", "", *_figures(cols), *_scopes(r)]
    for c in cols:
        lines += _regions(c)
    lines += _conditions(r)
    return "\n".join(lines) + "\n"
