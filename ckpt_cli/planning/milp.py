"""Binary programs for the exact solvers, on HiGHS through its own binding (highspy).

scipy's ``milp`` wraps the same solver, but importing ``scipy.optimize`` costs more than
most of its MILPs; highspy loads quickly, and its newer HiGHS solves the byte-budget MILPs
far faster. Every variable here is 0/1 and every constraint a row range over a sparse
matrix given as (row, column, value) triples.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import highspy

# Solved to the optimum, not to HiGHS's default 0.01% gap: the gap lets tied-looking
# solutions differ in saved FLOPs, and gap 0 stays cheap with one row per stretch of steps
# (``solver._solve``).
MIP_REL_GAP = 0.0


@dataclass(frozen=True)
class Triples:
    """A sparse matrix as (row, column, value) triples: the sum of those at one place."""

    rows: np.ndarray
    cols: np.ndarray
    vals: np.ndarray


def solve_binary(cost: np.ndarray, matrix: Triples, row_lower: np.ndarray, row_upper: np.ndarray,
                 col_lower: np.ndarray | None = None, col_upper: np.ndarray | None = None,
                 time_limit: float = 30.0) -> np.ndarray | None:
    """Minimise ``cost @ x`` over x in {0, 1} (within ``col_lower``/``col_upper``) subject to
    ``row_lower <= A x <= row_upper``, A the ``matrix``; the best x found within
    ``time_limit`` seconds, or None when there is none (infeasible, or none found in time)."""
    import highspy

    n, m = len(cost), len(row_lower)
    inf = highspy.kHighsInf
    # HiGHS takes each (row, column) once, sorted by row: repeated triples are summed here.
    keys = np.asarray(matrix.rows, dtype=np.int64) * max(n, 1) + np.asarray(matrix.cols, dtype=np.int64)
    order = np.argsort(keys, kind="stable")
    keys, vals = keys[order], np.asarray(matrix.vals, dtype=np.float64)[order]
    keys, first = np.unique(keys, return_index=True)
    vals = np.add.reduceat(vals, first) if len(keys) else vals
    rows, cols = keys // max(n, 1), keys % max(n, 1)
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = n, m
    lp.col_cost_ = np.asarray(cost, dtype=np.float64)
    lp.col_lower_ = np.zeros(n) if col_lower is None else np.asarray(col_lower, dtype=np.float64)
    lp.col_upper_ = np.ones(n) if col_upper is None else np.asarray(col_upper, dtype=np.float64)
    lp.row_lower_ = np.maximum(np.asarray(row_lower, dtype=np.float64), -inf)
    lp.row_upper_ = np.minimum(np.asarray(row_upper, dtype=np.float64), inf)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.start_ = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=m))]).astype(np.int32)
    lp.a_matrix_.index_ = cols.astype(np.int32)
    lp.a_matrix_.value_ = vals
    lp.integrality_ = [highspy.HighsVarType.kInteger] * n
    h = _quiet_highs()
    h.setOptionValue("time_limit", float(time_limit))
    h.setOptionValue("mip_rel_gap", MIP_REL_GAP)
    h.setOptionValue("threads", 1)
    for status in (h.passModel(lp), h.run()):
        if status == highspy.HighsStatus.kError:  # a malformed program: ckpt's bug, never a plan
            raise RuntimeError(f"HiGHS refused a {m}-row, {n}-column program")
    info = h.getInfo()
    if info.primal_solution_status != highspy.SolutionStatus.kSolutionStatusFeasible:
        return None
    return np.asarray(h.getSolution().col_value)


def _quiet_highs() -> highspy.Highs:
    """A silent ``highspy.Highs``. Its constructor enables callbacks, which writes HiGHS's
    banner to file descriptor 1 before any option can turn output off (github.com/ERGO-Code/HiGHS/issues/2749),
    and a --json report there must hold nothing else: descriptor 1 points at the null
    device while it is built (HiGHS flushes each log line)."""
    import highspy

    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no descriptor 1: nothing to keep clean
        saved = -1
    if saved >= 0:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.close(null)
    try:
        h = highspy.Highs()
    finally:
        if saved >= 0:
            os.dup2(saved, 1)
            os.close(saved)
    h.silent()
    return h
