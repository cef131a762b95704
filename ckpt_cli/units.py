"""Byte sizes and FLOP counts: one grammar for every option that reads a size
(``--budget``, ``--fail-if``) and one way of printing them; raw integers stay in JSON.

Sizes are binary: B, K/KB/KiB, M/MB/MiB, G/GB/GiB, T/TB/TiB all count powers of 1024
(``2GB`` is 2 GiB, as most memory tools read it), case-insensitive."""

from __future__ import annotations

import math
import re

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")
_NUMBER = re.compile(r"^\s*(?P<num>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*(?P<unit>[A-Za-z]*)\s*$")
_FACTORS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
SIZE_HELP = "a size such as 2GiB, 512MiB, 1.5G or 1000000 (binary units: B KiB MiB GiB TiB)"


def unit_factor(unit: str) -> int | None:
    """Bytes per ``unit`` ('' is bytes), or None when it is not a size unit."""
    u = unit.lower()
    if u in ("", "b"):
        return 1
    if len(u) in (1, 2, 3) and u[0] in _FACTORS and u[1:] in ("", "b", "ib"):
        return _FACTORS[u[0]]
    return None


def human_bytes(n: float | None) -> str:
    if n is None:
        return "?"
    value, unit = float(n), 0
    while abs(value) >= 1024 and unit < len(_UNITS) - 1:
        value /= 1024
        unit += 1
    if unit == 0:
        return f"{int(value)} B"
    return f"{value:.1f} {_UNITS[unit]}"


def human_flops(n: float | None) -> str:
    if n is None:
        return "?"
    for factor, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= factor:
            return f"{n / factor:.2f} {suffix}FLOP"
    return f"{int(n)} FLOP"


def parse_bytes(text: str) -> int:
    """'2GiB', '512 MiB', '1.5G', '2GB', '1000' -> bytes. Raises ValueError on anything
    else, negative and non-finite sizes included."""
    m = _NUMBER.match(text)
    factor = unit_factor(m.group("unit")) if m else None
    if m is None or factor is None:
        raise ValueError(f"'{text}' is not {SIZE_HELP}")
    number = float(m.group("num")) * factor
    if not math.isfinite(number) or number < 0 or number >= 2**63:
        raise ValueError(f"'{text}' is not {SIZE_HELP}")
    return int(number)


def percent(part: float, whole: float) -> str:
    return "n/a" if not whole else f"{100.0 * part / whole:.1f}%"
