"""bench/native.py: the compiled passes against plain Python, measured and rendered."""

import pytest

from bench import native


def test_the_passes_are_measured_both_ways_and_agree():
    pytest.importorskip("numba")
    res = native.measure(layers=2, repeats=1, rewrites=1)
    assert {r["pass"] for r in res["passes"]} == {
        "ORT's PRIORITY_BASED order, of the file reversed (Kahn's queue)", "ORT's DEFAULT order", "buffer_reads",
        "memory_aware order (backward movable)", "lifetimes", "ORT's planner walk (plan_buffers, reuse on)",
        "without_reuse", "arena_peak, reuse on", "arena_peak, reuse off"}
    assert all(r["same"] and r["plain_s"] > 0 and r["compiled_s"] > 0 for r in res["passes"])
    assert res["import_s"] > 0 and res["nodes"] > 100
    lines: list[str] = []
    native.render(res, lines.append)
    assert lines[0] == "## 9. Compiled passes" and sum(line.startswith("| ") for line in lines) == 1 + 9  # the header and a row a pass
    e = res["end_to_end"]
    assert e["same_output"] and [r["rc"] for r in e["plain"] + e["compiled"]] == [0, 0]
    assert any(line.startswith("End to end, `ckpt rewrite") and "byte-identical" in line for line in lines)


def test_a_run_without_numba_says_so():
    lines: list[str] = []
    native.render({"error": "numba is not installed (pip install 'onnx-ckpt[fast]')"}, lines.append)
    assert "Not measured: numba is not installed" in lines[2]
