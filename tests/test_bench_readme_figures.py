"""README.md's figures are what the demo's command prints today (bench/readme_figures.py,
`make docs-figures` rewrites them)."""

import pytest

from bench import readme_figures


@pytest.mark.slow
def test_readme_figures_are_todays():
    lines = readme_figures.command_lines()
    assert [q for q in readme_figures.QUOTED if any(line.startswith(q) for line in lines)] == \
        list(readme_figures.QUOTED), lines  # each quoted line is still printed
    old = readme_figures.readme_block(readme_figures.README.read_text())
    new = readme_figures.block(lines)
    assert readme_figures.same_figures(old, new), f"README.md's figures are stale; run `make docs-figures`:\n{new}"


def test_only_the_step_time_may_differ():
    a = "peak memory (measured on ONNX Runtime): 7.3 MiB -> 2.5 MiB (-65.4%), step time +56.6%"
    assert readme_figures.same_figures(a, a.replace("+56.6%", "-3.0%"))
    assert not readme_figures.same_figures(a, a.replace("2.5 MiB", "2.6 MiB"))
