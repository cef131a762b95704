"""The mutant list of ``make mutate`` (tests/mutants.toml) stays applicable and complete:
every snippet occurs once in its file, every named test exists, and every rule of the
check's verdict has a mutant (and so a test that fails when the rule goes)."""

from __future__ import annotations

import inspect
import re

from conftest import ROOT

from ckpt_cli.verify import rules
from tests.mutate import load_mutants, snippet_problem

MUTANTS = load_mutants()


def test_every_mutant_applies_to_the_tree_once():
    problems = {m.name: snippet_problem(m) for m in MUTANTS}
    assert {k: v for k, v in problems.items() if v} == {}
    assert len({m.name for m in MUTANTS}) == len(MUTANTS)  # names are unique


def test_every_named_test_exists():
    missing = []
    for m in MUTANTS:
        assert m.tests, m.name
        for node in m.tests:
            path, _, name = node.partition("::")
            source = (ROOT / path).read_text(encoding="utf-8") if (ROOT / path).is_file() else ""
            if not re.search(rf"^def {re.escape(name.split('[')[0])}\(", source, re.M):
                missing.append(f"{m.name}: {node}")
    assert missing == []


def test_every_rule_of_the_verdict_has_a_mutant():
    """Each rule ``judge`` applies, and ``budget_held`` which the budget's check applies,
    is the ``rule`` of a mutant: its test fails when the rule is removed or broken."""
    named = {m.rule for m in MUTANTS}
    verdict = {r.__name__ for r in rules.RULES} | {"budget_held", "noise"}
    assert verdict <= {name for name, f in inspect.getmembers(rules, inspect.isfunction)
                       if f.__module__ == rules.__name__}
    assert sorted(verdict - named) == []
    dropped = {m.rule for m in MUTANTS if m.name.endswith(".dropped") and m.file == "ckpt_cli/verify/rules.py"}
    assert dropped == {r.__name__ for r in rules.RULES}  # each also dropped from the verdict whole


def test_every_kernel_scratch_rule_has_a_mutant_inside_it():
    """Each rule of ``ort/scratch.py`` (bytes a kernel holds outside ORT's allocator) is
    broken by a mutant of its own body."""
    from ckpt_cli.ort import scratch

    snippets = [m.original for m in MUTANTS if m.file == "ckpt_cli/ort/scratch.py"]
    bare = [f.__name__ for f in set(scratch._RULES.values())
            if not any(s in inspect.getsource(f) for s in snippets)]
    assert bare == []
