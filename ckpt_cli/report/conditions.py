"""``--fail-if`` conditions of ``ckpt compare``: a tiny, documented grammar.

::

    CONDITION := OPERAND OP VALUE
    OPERAND   := FIELD | "ratio(" FIELD ")"
    FIELD     := NAME ("." NAME)*          NAME: letters, digits, _ (a number indexes a list)
    OP        := "<" | "<=" | ">" | ">=" | "==" | "!="
    VALUE     := NUMBER [UNIT] | "true" | "false"
    UNIT      := "B" | "KiB" | "MiB" | "GiB" | "TiB"   (binary, x1024^k; not with ratio())
               | "%"                                   (/100: ratio(peak_bytes)>90%)

FIELD is a figure of the comparison table (``peak_bytes``, ``measured_peak_bytes``,
``stashed_bytes``, ``recompute_share``, ``step_time_s``, ``outputs_equal``, ``nodes``)
or, when it is none of these, a dotted path into the JSON of the LAST input's report
(``check.rewritten.peak_bytes``, ``regions.0.freed_bytes``). ``ratio(FIELD)`` is the
last input's value divided by the first input's. Booleans count as 1 and 0.

A condition that holds makes the command fail (exit 1). A condition that does not
parse, or names a field that is missing or not a number, is a usage error (exit 2).
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from typing import Any, Callable

import math

from ..errors import UsageError
from ..units import unit_factor

OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le, ">=": operator.ge, "==": operator.eq, "!=": operator.ne,
    "<": operator.lt, ">": operator.gt,
}

_FIELD = r"[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)*"
_CONDITION = re.compile(
    rf"^\s*(?:(?P<ratio>ratio)\(\s*(?P<rfield>{_FIELD})\s*\)|(?P<field>{_FIELD}))"
    r"\s*(?P<op><=|>=|==|!=|<|>)\s*(?P<value>.+?)\s*$")
_VALUE = re.compile(r"^(?P<num>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*(?P<unit>[A-Za-z%]*)$")

GRAMMAR_HELP = ("FIELD OP VALUE or ratio(FIELD) OP VALUE, OP one of < <= > >= == !=, VALUE a number "
                "with an optional binary unit (KiB MiB GiB TiB), a percentage, true or false; "
                "e.g. 'measured_peak_bytes>2GiB', 'ratio(peak_bytes)>90%'")


@dataclass(frozen=True)
class Condition:
    text: str
    field: str
    ratio: bool
    op: str
    value: float

    @property
    def operand(self) -> str:
        return f"ratio({self.field})" if self.ratio else self.field

    def holds(self, x: float) -> bool:
        return OPS[self.op](x, self.value)


def parse_value(text: str, ratio: bool, condition: str) -> float:
    low = text.strip().lower()
    if low in ("true", "false"):
        return 1.0 if low == "true" else 0.0
    m = _VALUE.match(text.strip())
    if not m:
        raise UsageError(f"--fail-if '{condition}': '{text}' is not a number (expected {GRAMMAR_HELP})")
    number, unit = float(m.group("num")), m.group("unit")
    if not math.isfinite(number):  # 1e999 parses as inf: a gate that can never hold
        raise UsageError(f"--fail-if '{condition}': '{text}' is out of range")
    if not unit:
        return number
    if unit == "%":
        return number / 100.0
    factor = unit_factor(unit)
    if factor is None:
        raise UsageError(f"--fail-if '{condition}': unknown unit '{unit}' (binary units: "
                         "B, KiB, MiB, GiB, TiB, also written K/KB, M/MB, ...; or %)")
    if ratio:
        raise UsageError(f"--fail-if '{condition}': a ratio has no unit; write a number or a percentage")
    value = number * factor
    if not math.isfinite(value):
        raise UsageError(f"--fail-if '{condition}': '{text}' is out of range")
    return value


def parse_condition(text: str) -> Condition:
    m = _CONDITION.match(text)
    if not m:
        raise UsageError(f"--fail-if '{text}': cannot parse (expected {GRAMMAR_HELP})")
    ratio = m.group("ratio") is not None
    field = m.group("rfield") if ratio else m.group("field")
    return Condition(text=text.strip(), field=field, ratio=ratio, op=m.group("op"),
                     value=parse_value(m.group("value"), ratio, text.strip()))


def lookup(doc: Any, path: str) -> Any:
    """Follow a dotted path through dicts (keys) and lists (integer indices).
    Raises KeyError when a step is missing."""
    cur = doc
    for part in path.split("."):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            raise KeyError(part)
    return cur


def as_number(value: Any) -> float | None:
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, (int, float)):
        return float(value)
    return None
