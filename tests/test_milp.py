"""The binary-program helper of the exact solvers (HiGHS through highspy)."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import numpy as np
from hypothesis import given, settings, strategies as st

from ckpt_cli.planning.milp import Triples, solve_binary


def _brute(cost, a, lo, hi):
    best = None
    for x in itertools.product((0, 1), repeat=len(cost)):
        v = np.asarray(x, dtype=float)
        r = a @ v
        if (r >= lo - 1e-9).all() and (r <= hi + 1e-9).all():
            val = float(cost @ v)
            best = val if best is None or val < best else best
    return best


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 7).flatmap(lambda n: st.tuples(
    st.lists(st.integers(-20, 20), min_size=n, max_size=n),
    st.lists(st.lists(st.integers(0, 9), min_size=n, max_size=n), min_size=1, max_size=3),
    st.lists(st.integers(0, 30), min_size=3, max_size=3))))
def test_a_knapsack_is_solved_to_the_optimum(case):
    cost, matrix, limits = case
    cost = np.asarray(cost, dtype=float)
    a = np.asarray(matrix, dtype=float)
    hi = np.asarray(limits[:len(a)], dtype=float)
    lo = np.full(len(a), -np.inf)
    rows, cols = np.nonzero(a)
    x = solve_binary(cost, Triples(rows, cols, a[rows, cols]), lo, hi)
    best = _brute(cost, a, lo, hi)  # x = 0 always fits: there is an optimum
    assert x is not None and set(np.unique(np.round(x))) <= {0.0, 1.0}
    assert (a @ x <= hi + 1e-6).all()
    assert abs(float(cost @ x) - best) <= 1e-9 * max(1.0, abs(best))  # solved to the optimum


def test_an_infeasible_program_has_no_solution():
    # x0 + x1 >= 3 cannot hold for binaries
    assert solve_binary(np.array([1.0, 1.0]), Triples(np.array([0, 0]), np.array([0, 1]), np.array([1.0, 1.0])),
                        np.array([3.0]), np.array([np.inf])) is None


def test_bounds_fix_variables():
    x = solve_binary(np.array([-1.0, -1.0, -1.0]), Triples(np.zeros(0, dtype=int), np.zeros(0, dtype=int), np.zeros(0)),
                     np.zeros(0), np.zeros(0), col_lower=np.array([0.0, 1.0, 0.0]), col_upper=np.array([0.0, 1.0, 1.0]))
    assert x is not None and list(np.round(x)) == [0.0, 1.0, 1.0]


def test_a_solve_writes_nothing_to_stdout():
    """A --json report goes to stdout: HiGHS's banner must not (highspy.Highs() prints it,
    once per process: hence a fresh one)."""
    code = ("import numpy as np; from ckpt_cli.planning.milp import Triples, solve_binary; "
            "print(solve_binary(np.array([-1.0, -2.0]), Triples(np.array([0, 0]), np.array([0, 1]), "
            "np.array([1.0, 1.0])), np.array([-np.inf]), np.array([1.0])).tolist())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parent.parent)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "[0.0, 1.0]\n" and out.stderr == ""


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 7).flatmap(lambda n: st.tuples(
    st.lists(st.tuples(st.integers(0, 11), st.integers(0, 11), st.integers(1, 9), st.integers(0, 20)),
             min_size=n, max_size=n),
    st.lists(st.integers(0, 12), min_size=12, max_size=12),
    st.integers(12, 40))))
def test_the_structure_milp_keeps_what_saves_the_most_under_every_step(case):
    """``solver._solve`` (one row per stretch of steps with the same activations kept)
    against brute force over every keep set, one row per step."""
    from ckpt_cli.planning.solver import _solve
    from ckpt_cli.planning.strategies import Candidate

    items, timeline, limit = case
    ranked = [Candidate(f"t{j}", nbytes, flops) for j, (_, _, nbytes, flops) in enumerate(items)]
    spans = {f"t{j}": (min(a, b), max(a, b)) for j, (a, b, _, _) in enumerate(items)}
    kept = _solve(ranked, spans, tuple(timeline), limit)
    if any(t > limit for t in timeline):
        assert kept is None
        return

    def fits(keep) -> bool:
        use = list(timeline)
        for c in keep:
            lo, hi = spans[c.tensor]
            for k in range(lo, hi + 1):
                use[k] += c.nbytes
        return max(use) <= limit

    best = max(sum(c.flops for c, x in zip(ranked, xs) if x)
               for xs in itertools.product((0, 1), repeat=len(ranked))
               if fits([c for c, x in zip(ranked, xs) if x]))
    chosen = [c for c in ranked if c.tensor in kept]
    assert fits(chosen) and sum(c.flops for c in chosen) == best


def test_repeated_triples_are_summed():
    # 0.5 x0 + 0.5 x0 + x1 <= 1: with the halves summed, x0 and x1 cannot both be kept
    halves = Triples(np.array([0, 0, 0]), np.array([0, 0, 1]), np.array([0.5, 0.5, 1.0]))
    x = solve_binary(np.array([-2.0, -1.0]), halves, np.array([-np.inf]), np.array([1.0]))
    assert x is not None and list(np.round(x)) == [1.0, 0.0]


def test_highspy_is_used_through_its_public_names_only():
    """highspy's private modules (``highspy._core``) change between releases."""
    sources = (Path(__file__).parent.parent / "ckpt_cli").rglob("*.py")
    assert not [p.name for p in sources if "highspy._" in p.read_text(encoding="utf-8")]
