"""Whether the whole-graph passes take their numpy (vectorized) or compiled (``native.py``)
path or the plain-Python one they fall back to. Both give identical results
(tests/test_fast_paths.py runs both); ``CKPT_PURE_PYTHON=1`` forces the plain-Python path,
to check or to bisect a difference."""

from __future__ import annotations

import functools
import importlib
import os

# Below this many steps the compiled passes do not repay their fixed cost: importing numba
# and loading the cached kernels takes 0.6-0.7 s once per process, and a rewrite's kernels
# save about 13 us per node (break-even near 50k nodes; measures in the commit that set it).
NATIVE_MIN_STEPS = 50_000


def vectorized() -> bool:
    return os.environ.get("CKPT_PURE_PYTHON", "") != "1"


def native(steps: int) -> bool:
    """Whether a pass over ``steps`` nodes takes its compiled kernel (``native.py``)."""
    return steps >= NATIVE_MIN_STEPS and vectorized() and has_numba()


@functools.cache
def has_numba() -> bool:
    """Whether numba imports: it is a dependency only where it has wheels (pyproject.toml)."""
    try:
        importlib.import_module("numba")
    except ImportError:
        return False
    return True
