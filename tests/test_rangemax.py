"""The range add / range max structure behind the greedy keep-set fill, against a plain list."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ckpt_cli.planning.rangemax import RangeMax


@st.composite
def operations(draw):
    n = draw(st.integers(1, 300))
    values = draw(st.lists(st.integers(0, 2**40), min_size=n, max_size=n))
    ops = []
    for _ in range(draw(st.integers(1, 60))):
        lo = draw(st.integers(0, n - 1))
        hi = draw(st.integers(lo, n - 1))
        ops.append((draw(st.booleans()), lo, hi, draw(st.integers(0, 2**33))))
    return values, ops


@settings(max_examples=200, deadline=None)
@given(operations())
def test_matches_a_list(case):
    values, ops = case
    tree, plain = RangeMax(values), list(values)
    for is_add, lo, hi, v in ops:
        if is_add:
            tree.add(lo, hi, v)
            for k in range(lo, hi + 1):
                plain[k] += v
        else:
            assert tree.max(lo, hi) == max(plain[lo:hi + 1])
    assert tree.max(0, len(plain) - 1) == max(plain)


def test_exact_beyond_float_precision():
    tree = RangeMax([2**53, 0, 0])
    tree.add(0, 2, 1)
    assert tree.max(0, 0) == 2**53 + 1  # a float tree would round this away
