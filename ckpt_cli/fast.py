"""Whether the whole-graph passes take their numpy (vectorized) path or the plain-Python
one they fall back to. Both give identical results (tests/test_fast_paths.py runs both);
``CKPT_PURE_PYTHON=1`` forces the plain-Python path, to check or to bisect a difference."""

from __future__ import annotations

import os


def vectorized() -> bool:
    return os.environ.get("CKPT_PURE_PYTHON", "") != "1"
