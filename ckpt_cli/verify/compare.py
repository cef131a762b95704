"""Comparing two runs: outputs (bit for bit, or within a tolerance) and the executed
node order against the file order."""

from __future__ import annotations

from collections import Counter
from typing import AbstractSet, Any

import numpy as np

from ..ops import DEVICE_COPY_OPS
from .records import Mismatch, OrderCheck

DEFAULT_RTOL = 1e-5
DEFAULT_ATOL = 1e-6


def _diffs(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Elementwise (|a-b|, relative diff, |b|) in float64 for same-shape arrays."""
    if a.dtype == np.bool_ or b.dtype == np.bool_:
        a, b = a.astype(np.int8), b.astype(np.int8)
    af, bf = a.astype(np.float64), b.astype(np.float64)
    nan_a, nan_b = np.isnan(af), np.isnan(bf)
    both_nan = nan_a & nan_b
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(af - bf)
        same_inf = np.isinf(af) & np.isinf(bf) & (af == bf)
        d = np.where(both_nan | same_inf, 0.0, d)
        d = np.where(nan_a ^ nan_b, np.inf, d)
        scale = np.maximum(np.abs(af), np.abs(bf))
        rel = np.where(d == 0, 0.0, d / np.where(scale == 0, 1.0, scale))
    return d, rel, np.where(nan_b, 0.0, np.abs(bf))


def _kind_problem(x: np.ndarray, y: np.ndarray) -> str | None:
    """Why two outputs are not the same kind of value: a shape or element type changed."""
    if x.shape != y.shape:
        return f"shape {list(x.shape)} vs {list(y.shape)}"
    if x.dtype != y.dtype:
        return f"dtype {x.dtype} vs {y.dtype}"
    return None


def compare_one(x: np.ndarray, y: np.ndarray, rtol: float, atol: float) -> dict[str, Any]:
    """One output: the reference ``x`` against the candidate ``y``. Another shape or element
    type is a difference whatever the values (a float64 output where float32 was is a
    changed model), with no |diff| to report."""
    entry = {"dtype": str(x.dtype), "shape": list(x.shape), "bit_identical": False, "max_abs_diff": None,
             "max_rel_diff": None, "within_tolerance": False}
    problem = _kind_problem(x, y)
    if problem is not None:
        entry["problem"] = problem
        return entry
    entry["bit_identical"] = np.ascontiguousarray(x).tobytes() == np.ascontiguousarray(y).tobytes()
    if x.size == 0:
        entry.update(max_abs_diff=0.0, max_rel_diff=0.0, within_tolerance=True)
    else:
        d, rel, mag = _diffs(x, y)
        entry.update(max_abs_diff=float(np.max(d)), max_rel_diff=float(np.max(rel)),
                     within_tolerance=bool(np.all(d <= atol + rtol * mag)))
    return entry


def compare_outputs(a: dict[str, Any], b: dict[str, Any], *, rtol: float = DEFAULT_RTOL,
                    atol: float = DEFAULT_ATOL) -> dict[str, Any]:
    """Compare two {name: array} dicts (a = reference, b = candidate), each in the order
    the model returns its outputs.

    Per output: bit_identical (same dtype, shape and bytes; NaNs with equal bits
    count as identical), max_abs_diff, max_rel_diff (|a-b| / max(|a|,|b|)),
    within_tolerance (|a-b| <= atol + rtol*|b| elementwise, NaN == NaN); ``problem`` when
    its shape, element type or position changed (a session returns outputs by position).
    Outputs present on one side only are listed in missing / extra and count as
    failures.
    """
    per = {}
    position_b = {name: i for i, name in enumerate(b)}
    for i, name in enumerate(a):
        if name not in b:
            continue
        entry = compare_one(np.asarray(a[name]), np.asarray(b[name]), rtol, atol)
        if position_b[name] != i and "problem" not in entry:
            entry.update(problem=f"position {i} vs {position_b[name]} (the outputs come in another order)",
                         bit_identical=False, within_tolerance=False)
        per[name] = entry
    missing = [n for n in a if n not in b]
    extra = [n for n in b if n not in a]
    abs_diffs = [e["max_abs_diff"] for e in per.values() if e["max_abs_diff"] is not None]
    n_bit = sum(e["bit_identical"] for e in per.values())
    n_tol = sum(e["within_tolerance"] for e in per.values())
    total = len(per) + len(missing) + len(extra)
    return {
        "outputs": per,
        "n_outputs": total,
        "n_bit_identical": n_bit,
        "n_within_tolerance": n_tol,
        "n_failed": total - n_tol,
        "missing": missing,
        "extra": extra,
        "all_bit_identical": n_bit == total,
        "all_within_tolerance": n_tol == total,
        "max_abs_diff": max(abs_diffs) if abs_diffs else (None if total else 0.0),
        "rtol": rtol,
        "atol": atol,
    }




def order_check(file_order: list[str], executed: list[str], executed_ops: list[str] | None = None,
                executed_providers: list[str] | None = None,
                kernelless: AbstractSet[str] = frozenset()) -> OrderCheck:
    """Does the executed order follow the file order?

    Compared on the nodes present in both: ORT runs no kernel for Constant nodes
    (``kernelless``: they become initializers), and unnamed nodes get generated names in
    the profile, so both are left out. Any other node of the file that ORT never ran is
    listed in ``not_executed``: the check fails on it.
    ORT's copies between devices (``executed_ops`` in DEVICE_COPY_OPS) are not nodes ckpt
    could have written: they are listed apart, not failed.

    With several providers (CUDA plus the CPU nodes ORT places beside it), ORT runs one
    stream per device and interleaves them at cross-device waits, so the order is
    compared per provider: each device must run its nodes in file order.
    """
    file_set = set(file_order)
    ops = executed_ops or [""] * len(executed)
    provs = executed_providers or [""] * len(executed)
    copies = [n for n, op in zip(executed, ops) if op in DEVICE_COPY_OPS and n not in file_set]
    skip = set(copies)
    foreign_ops = Counter(op or "?" for n, op in zip(executed, ops) if n not in file_set and n not in skip)
    kept = [(n, p) for n, p in zip(executed, provs) if n not in skip]
    executed = [n for n, _ in kept]
    executed_set = set(executed)
    per_provider = {p: sum(1 for _, q in kept if q == p) for p in dict.fromkeys(q for _, q in kept)}
    groups = sorted(per_provider) if len(per_provider) > 1 else [None]
    mismatch, compared = None, 0
    for group in groups:
        mine = {n for n, p in kept if group is None or p == group}
        a = [n for n in file_order if n in mine]
        b = [n for n, p in kept if (group is None or p == group) and n in file_set]
        compared += min(len(a), len(b))
        mismatch = _first_mismatch(a, b, group)
        if mismatch is not None:
            break
    # a node ORT runs no kernel for (``kernelless``: Constant) or without a name is not judged
    not_executed = [n for n in file_order if n and n not in executed_set and n not in kernelless]
    return OrderCheck(mismatch is None, compared, mismatch, tuple(not_executed[:50]), len(not_executed),
                      tuple(n for n in executed if n not in file_set)[:50], sum(1 for n in executed if n not in file_set),
                      dict(foreign_ops.most_common()), tuple(copies[:50]), len(copies),
                      {p: n for p, n in per_provider.items() if p})


def _first_mismatch(a: list[str], b: list[str], group: str | None) -> Mismatch | None:
    """Where ``b`` (executed on ``group``) first leaves ``a`` (the file's order there)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return Mismatch(i, x, y, group)
    if len(a) != len(b):  # duplicate names
        return Mismatch(min(len(a), len(b)), None, None, group)
    return None
