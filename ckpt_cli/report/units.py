"""Binary byte units and FLOP counts for people; raw integers stay in JSON."""

from __future__ import annotations

import re

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")
_PARSE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([KMGT]?i?B?)\s*$", re.IGNORECASE)
_FACTORS = {"": 1, "B": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


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
    """'2GiB', '512 MiB', '1.5G', '1000' -> bytes (binary units; 'GB' is read as GiB)."""
    m = _PARSE.match(text)
    if not m:
        raise ValueError(f"'{text}' is not a size (examples: 2GiB, 512MiB, 1000000)")
    number, unit = float(m.group(1)), m.group(2).upper()
    return int(number * _FACTORS[unit[:1] if unit not in ("", "B") else unit])


def percent(part: float, whole: float) -> str:
    return "n/a" if not whole else f"{100.0 * part / whole:.1f}%"
