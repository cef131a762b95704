"""A short, seeded run of the misbehaving-child fuzzer: every misbehaving ``--python`` child
ends in exit 5, one line, within the timeout, with no process of it left."""

import pytest
from fuzz_children import run_fuzz

pytestmark = pytest.mark.slow


def test_misbehaving_children_fuzz_finds_no_defect():
    summary = run_fuzz(cases=12, seed=0)
    assert not summary["defects"], summary["defects"][:5]
    assert summary["counts"].get("clean_error", 0) >= 6, summary["counts"]
