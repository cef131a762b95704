"""Model-controlled strings (node, tensor, model and region names) made safe for a terminal:
control and escape characters (ESC, OSC, other C0/C1, bidi overrides, undecodable bytes) shown as visible
escapes, and Rich markup escaped, so a name can neither spoof output nor break it."""

from __future__ import annotations

import re

from rich.markup import escape

# lone surrogates: the bytes of a command-line word that is not UTF-8 (Python keeps them so)
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _visible(m: re.Match[str]) -> str:
    code = ord(m.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def plain(value: object) -> str:
    """``value`` as text with every control character made visible (for markup=False output)."""
    return _CONTROL.sub(_visible, str(value))


def safe(value: object) -> str:
    """``value`` for Rich markup: controls made visible, then markup escaped."""
    return escape(plain(value))
