"""``ckpt compare``: inputs, figures, --fail-if grammar and exit codes, SVG, and the CI
recipe in examples/ci run end to end."""

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import ROOT, SAMPLES

from ckpt_cli.cli import CkptGroup, main
from ckpt_cli.cli.compare import compare
from ckpt_cli.errors import ModelError, UsageError
from ckpt_cli.report.conditions import lookup, parse_condition

MLP = str(SAMPLES / "mlp.onnx")
GiB = 1024**3


def _group() -> CkptGroup:
    """The ckpt group with compare registered, without touching the real one: errors
    become one line and their exit code, as under `ckpt`."""
    group = CkptGroup("ckpt")
    for name, cmd in main.commands.items():
        group.add_command(cmd, name)
    group.add_command(compare)
    return group


def ckpt(*args):
    return CliRunner().invoke(_group(), [str(a) for a in args])


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    """Real mlp reports: inspect, rewrite --check (1 run, CPU), check; and the rewritten model."""
    tmp = tmp_path_factory.mktemp("mlp")
    paths = {"dir": tmp, "model": MLP, "rewritten": tmp / "mlp.ckpt.onnx", "inspect": tmp / "inspect.json",
             "rewrite": tmp / "rewrite.json", "check": tmp / "check.json"}
    for args in (["inspect", MLP, "-q", "--report", paths["inspect"]],
                 ["rewrite", MLP, "-o", paths["rewritten"], "--auto", "layers", "-q", "--check", "--runs", 1,
                  "--provider", "cpu",
                  "--report", paths["rewrite"]],
                 ["check", MLP, paths["rewritten"], "-q", "--runs", 1, "--provider", "cpu",
                  "--report", paths["check"]]):
        r = ckpt(*args)
        assert r.exit_code == 0, r.output
    paths["reports"] = {k: json.loads(paths[k].read_text()) for k in ("inspect", "rewrite", "check")}
    return paths


# ------------------------------------------------------------------------------- the grammar

@pytest.mark.parametrize("text,field,ratio,op,value", [
    ("peak_bytes>2GiB", "peak_bytes", False, ">", 2 * GiB),
    ("  ratio( peak_bytes ) <= 90% ", "peak_bytes", True, "<=", 0.9),
    ("measured_peak_bytes >= 512 MiB", "measured_peak_bytes", False, ">=", 512 * 1024**2),
    ("outputs_equal==false", "outputs_equal", False, "==", 0.0),
    ("outputs_equal!=TRUE", "outputs_equal", False, "!=", 1.0),
    ("check.rewritten.time_s<0.25", "check.rewritten.time_s", False, "<", 0.25),
    ("regions.0.freed_bytes>1e3", "regions.0.freed_bytes", False, ">", 1000.0),
    ("stashed_bytes>1.5kib", "stashed_bytes", False, ">", 1536.0),
    ("ratio(step_time_s)>1.3", "step_time_s", True, ">", 1.3),
    ("recompute_share>35%", "recompute_share", False, ">", 0.35),
    ("nodes<100B", "nodes", False, "<", 100.0),
])
def test_conditions_parse(text, field, ratio, op, value):
    c = parse_condition(text)
    assert (c.field, c.ratio, c.op) == (field, ratio, op)
    assert c.value == pytest.approx(value)


@pytest.mark.parametrize("text", ["peak_bytes=>1", "peak_bytes>1XB", "peak_bytes>1e999", "ratio(peak_bytes)>1GiB",
                                  "peak_bytes", ">1", "peak bytes>1", "ratio(peak_bytes>1", "peak_bytes>",
                                  "peak_bytes>one", "peak_bytes=1", "ratio()>1"])
def test_bad_conditions_are_usage_errors(text):
    with pytest.raises(UsageError):
        parse_condition(text)


def test_condition_semantics():
    assert parse_condition("a>=1KiB").holds(1024) and not parse_condition("a>1KiB").holds(1024)
    assert parse_condition("a!=0").holds(1) and parse_condition("a==1").holds(1.0)
    doc = {"a": {"b": [{"c": 3}]}}
    assert lookup(doc, "a.b.0.c") == 3
    for missing in ("a.x", "a.b.1.c", "a.b.c"):
        with pytest.raises(KeyError):
            lookup(doc, missing)


# ------------------------------------------------------------------------------ comparisons

def test_two_models_side_by_side(mlp):
    r = ckpt("compare", MLP, mlp["rewritten"])
    assert r.exit_code == 0, r.output
    out = r.stdout
    for text in ("predicted peak", "stashed activations", "recompute FLOPs / step", "nodes",
                 "Stashed bytes by scope", "Memory over the schedule", "# mlp.onnx", "o mlp.ckpt.onnx"):
        assert text in out
    assert "\x1b[" not in out  # not a terminal: no colours
    assert all(len(line) <= 80 for line in out.splitlines()), max(out.splitlines(), key=len)
    assert "measured peak" not in out  # no input has measured figures: the row is left out


def test_json_figures_follow_the_reports(mlp):
    rep = mlp["reports"]
    r = ckpt("compare", MLP, mlp["inspect"], mlp["rewrite"], mlp["check"], "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["command"] == "compare" and doc["schema_version"] == 1
    cols = doc["inputs"]
    assert [c["kind"] for c in cols] == ["onnx", "inspect", "rewrite", "check"]
    onnx, inspect, rewrite, check = (c["figures"] for c in cols)
    assert onnx["peak_bytes"] == inspect["peak_bytes"] == rep["inspect"]["peak_bytes"]
    assert onnx["stashed_bytes"] == rep["inspect"]["stashed_bytes"]
    assert onnx["recompute_share"] == inspect["recompute_share"] == 0.0
    assert rewrite["peak_bytes"] == rep["rewrite"]["after"]["peak_bytes"]
    assert rewrite["recompute_share"] == rep["rewrite"]["recompute_share_of_step"]
    assert rewrite["measured_peak_bytes"] == rep["rewrite"]["check"]["rewritten"]["peak_bytes"]
    assert rewrite["outputs_equal"] is True
    assert check["measured_peak_bytes"] == rep["check"]["rewritten"]["peak_bytes"]
    assert check["peak_bytes"] is None and check["step_time_s"] == rep["check"]["rewritten"]["time_s"]
    # differences and ratios against the first column, raw integers for bytes
    ch = cols[2]["vs_first"]["peak_bytes"]
    assert ch["diff"] == rewrite["peak_bytes"] - onnx["peak_bytes"] and isinstance(ch["diff"], int)
    assert ch["ratio"] == pytest.approx(rewrite["peak_bytes"] / onnx["peak_bytes"])
    assert cols[0]["vs_first"] is None
    assert cols[3]["vs_first"]["peak_bytes"] is None  # the check report has no prediction
    assert cols[2]["timeline"] == rep["rewrite"]["after"]["timeline"]
    assert cols[2]["regions"][0]["freed_bytes"] == max(g["freed_bytes"] for g in rep["rewrite"]["regions"])


def test_the_original_takes_its_measured_figures_from_the_check_beside_it(mlp):
    """The rewrite --check report measured the original too: its column shows them, and a
    --fail-if on the measured ratio is judged instead of exiting 2."""
    rep = mlp["reports"]
    for report in ("rewrite", "check"):
        r = ckpt("compare", MLP, mlp[report], "--json")
        original = json.loads(r.stdout)["inputs"][0]["figures"]
        measured = (rep["rewrite"]["check"] if report == "rewrite" else rep["check"])["original"]
        assert original["measured_peak_bytes"] == measured["peak_bytes"] and original["measured_peak_bytes"]
        assert original["step_time_s"] == measured["time_s"]
    r = ckpt("compare", MLP, mlp["rewrite"], "--fail-if", "ratio(measured_peak_bytes)>1000%")
    assert r.exit_code == 0, r.output
    r = ckpt("compare", MLP, mlp["rewrite"], "--fail-if", "ratio(measured_peak_bytes)>0.01")
    assert r.exit_code == 1 and "holds" in r.output, r.output


def test_rewritten_model_recompute_share_matches_the_rewrite_report(mlp):
    doc = json.loads(ckpt("compare", MLP, mlp["rewritten"], "--json").stdout)
    share = doc["inputs"][1]["figures"]["recompute_share"]
    assert share == pytest.approx(mlp["reports"]["rewrite"]["recompute_share_of_step"])


def test_scopes_that_changed_most_come_first(mlp):
    doc = json.loads(ckpt("compare", MLP, mlp["rewritten"], "--json").stdout)
    rows = doc["scopes"]
    assert rows, "the rewrite frees stashed bytes in some scope"
    changes = [r["max_change_bytes"] for r in rows]
    assert changes == sorted(changes, reverse=True) and all(changes)
    before = {s["scope"]: s["stashed_bytes"] for s in mlp["reports"]["inspect"]["scopes"]}
    for r in rows:
        assert r["stashed_bytes"][0] == before.get(r["scope"], 0)
        assert r["max_change_bytes"] == abs(r["stashed_bytes"][1] - r["stashed_bytes"][0])


def test_svg_and_report_files(mlp, tmp_path):
    svg, report = tmp_path / "m.svg", tmp_path / "c.json"
    r = ckpt("compare", MLP, mlp["rewrite"], mlp["check"], "--svg", svg, "--report", report, "-q")
    assert r.exit_code == 0 and r.stdout == ""
    root = ET.parse(svg).getroot()
    assert len(root.findall("{http://www.w3.org/2000/svg}polyline")) == 2  # the check report has no timeline
    assert json.loads(report.read_text())["inputs"][1]["kind"] == "rewrite"


def test_labels_are_unique(mlp, tmp_path):
    other = tmp_path / "b" / "rewrite.json"
    other.parent.mkdir()
    other.write_text(mlp["rewrite"].read_text())
    doc = json.loads(ckpt("compare", mlp["rewrite"], other, mlp["rewrite"], "--json").stdout)
    labels = [c["label"] for c in doc["inputs"]]
    assert len(set(labels)) == 3


def _markdown_table(text: str, first_cell: str) -> dict[str, list[str]]:
    """The markdown table whose header starts with ``first_cell``: its rows by first cell."""
    for block in text.split("\n\n"):
        rows = [[c.strip() for c in line.strip("|").split(" | ")] for line in block.splitlines()]
        if block.startswith("|") and rows[0][0] == first_cell:
            return {row[0]: row[1:] for row in rows}
    raise AssertionError(f"no table starts with {first_cell!r}")


def test_markdown_gives_the_figures_compare_prints(mlp):
    from ckpt_cli.report.compare import FIGURES
    from ckpt_cli.report.render import change_words, figure_text

    args = ("compare", MLP, mlp["check"], mlp["rewrite"], "--fail-if", "ratio(peak_bytes)>100%")
    r = ckpt(*args, "--format", "markdown")
    assert r.exit_code == 0, r.output
    doc = json.loads(ckpt(*args, "--json").stdout)
    text = r.stdout
    assert text.startswith("### ckpt compare: 3 inputs\n") and "\x1b[" not in text
    table = _markdown_table(text, "")
    assert table[""] == ["mlp.onnx", "check.json", "rewrite.json"] and set(table["---"]) <= {"---:"}
    shown = [label for _, label, _ in FIGURES if label in table]
    assert shown == [label for key, label, _ in FIGURES if any(c["figures"][key] is not None for c in doc["inputs"])]
    for key, label, kind in FIGURES:
        for k, c in enumerate(doc["inputs"]):
            if label in table:
                change = c["vs_first"] and c["figures"][key] is not None and c["vs_first"][key]
                value = figure_text(c["figures"][key], kind)
                assert table[label][k] == (f"{value} ({change_words(change, kind)})" if change else value)
    assert "measured peak (ORT)" in table and table["outputs bit-identical"][1:] == ["yes", "yes"]
    scopes = _markdown_table(text, "scope")
    assert list(scopes)[2:] == [row["scope"].replace("_", "\\_") for row in doc["scopes"]]
    assert "- `--fail-if` ratio(peak\\_bytes)\\>100%: " in text and text.rstrip().endswith(": ok")


def test_markdown_escapes_names_and_keeps_the_gate(mlp, tmp_path):
    odd = tmp_path / "a|b*c.json"
    odd.write_text(mlp["rewrite"].read_text())
    r = ckpt("compare", MLP, odd, "--format", "markdown", "--fail-if", "peak_bytes>1B")
    assert r.exit_code == 1 and "ckpt: --fail-if 'peak_bytes>1B' holds" in r.stderr
    assert "| mlp.onnx | a\\|b\\*c.json |" in r.stdout and "**holds: FAIL**" in r.stdout
    assert ckpt("compare", MLP, odd, "--format", "markdown", "-q").stdout == ""
    both = ckpt("compare", MLP, "--format", "markdown", "--json")
    assert both.exit_code == 2 and "--format and --json" in both.stderr


# ---------------------------------------------------------------------------------- the gate

def test_fail_if_holds_exits_1(mlp):
    r = ckpt("compare", MLP, mlp["rewrite"], "--fail-if", "measured_peak_bytes>1KiB",
             "--fail-if", "measured_peak_bytes>1TiB")
    assert r.exit_code == 1, r.output
    assert "ckpt: --fail-if 'measured_peak_bytes>1KiB' holds on rewrite.json" in r.stderr
    assert "1TiB" not in r.stderr
    assert "holds: FAIL" in r.stdout and "-> ok" in r.stdout


def test_fail_if_not_holding_exits_0(mlp):
    r = ckpt("compare", MLP, mlp["rewrite"], "--fail-if", "ratio(peak_bytes)>100%", "--fail-if",
             "outputs_equal==false", "--fail-if", "check.rewritten.peak_bytes>1GiB", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["failed"] is False and [c["held"] for c in doc["conditions"]] == [False] * 3
    ratio = mlp["reports"]["rewrite"]["after"]["peak_bytes"] / mlp["reports"]["inspect"]["peak_bytes"]
    assert doc["conditions"][0]["actual"] == pytest.approx(ratio)


def test_quiet_gate_prints_only_the_failure(mlp):
    r = ckpt("compare", MLP, mlp["rewrite"], "-q", "--fail-if", "peak_bytes>1B")
    assert r.exit_code == 1 and r.stdout == ""
    assert r.stderr.count("\n") == 1


@pytest.mark.parametrize("condition,message", [
    ("measured_peak_bytes>1GiB", "no value for 'measured_peak_bytes'"),  # last input: an inspect report
    ("no_such_figure>1", "has no field 'no_such_figure'"),
    ("top_stashed.99.bytes>1", "has no field 'top_stashed.99.bytes'"),
    ("model>1", "'model' in inspect.json is a str, not a number"),
    ("ratio(recompute_share)>1", "is 0 in the first input"),
    ("peak_bytes>2XB", "unknown unit 'XB'"),
    ("peak_bytes=>2", "cannot parse"),
])
def test_bad_conditions_exit_2_with_one_line(mlp, condition, message):
    r = ckpt("compare", MLP, mlp["inspect"], "--fail-if", condition)
    assert r.exit_code == 2, r.output
    assert r.stdout == ""  # nothing is printed before the conditions are known to be sound
    assert r.stderr.startswith("ckpt: error: --fail-if") and r.stderr.count("\n") == 1
    assert message in r.stderr


def test_command_object_raises_usage_error_without_the_group(mlp):
    """Invoked on its own (not under ckpt's group) the command raises the error the
    group turns into exit code 2."""
    r = CliRunner().invoke(compare, [MLP, "--fail-if", "measured_peak_bytes>1"])
    assert isinstance(r.exception, UsageError)
    r = CliRunner().invoke(compare, [str(SAMPLES / "missing.onnx")])
    assert isinstance(r.exception, ModelError)


@pytest.mark.parametrize("content,message", [
    (None, "no such file"),
    (b"", "empty file"),
    (b"{ not json", "not valid JSON"),
    (b'{"a": 1}', "not a ckpt inspect, plan, rewrite or check report"),
    (b'{"command": "inspect", "schema_version": 99}', "newer than this ckpt reads"),
    (b'{"command": "inspect", "schema_version": 1}', "not a complete ckpt inspect report"),
    (b"truncated", "not a readable ONNX model"),
    (b'{"command": "check", "schema_version": 1, "rewritten": 3, "outputs_equal": true}',
     "not a well-formed ckpt check report"),
])
def test_bad_inputs_exit_2_with_one_line(tmp_path, content, message):
    bad = tmp_path / ("bad.json" if content and content.startswith(b"{") else "bad.onnx")
    if content == b"truncated":
        bad.write_bytes(Path(MLP).read_bytes()[:300])
    elif content is not None:
        bad.write_bytes(content)
    r = ckpt("compare", MLP, bad)
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("ckpt: error:") and r.stderr.count("\n") == 1
    assert message in r.stderr


def test_bad_options_exit_2(mlp):
    r = ckpt("compare", MLP, "--dim", "batch=4")
    assert r.exit_code == 2 and "no ONNX input has this symbolic dimension" in r.stderr
    r = ckpt("compare", mlp["check"], "--svg", mlp["dir"] / "x.svg")
    assert r.exit_code == 2 and "no input has a memory timeline" in r.stderr
    r = ckpt("compare")
    assert r.exit_code == 2  # click: missing argument


# ---------------------------------------------------------------------------- the CI recipe

SCRIPT = ROOT / "examples" / "ci" / "memory_gate.sh"


@pytest.fixture
def gate_env(tmp_path):
    """The venv's ckpt on PATH, and CKPT pointing at a launcher with compare registered
    (a no-op once cli.py registers it itself)."""
    launcher = tmp_path / "ckpt-launcher"
    launcher.write_text(f"#!{sys.executable}\n"
                        "from ckpt_cli.cli import main\n"
                        "from ckpt_cli.cli.compare import compare\n"
                        "if 'compare' not in main.commands:\n"
                        "    main.add_command(compare)\n"
                        "main()\n")
    launcher.chmod(0o755)
    env = dict(os.environ, CKPT=str(launcher), CKPT_RUNS="1", CKPT_PROVIDER="cpu", NO_COLOR="1",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    return env


def _gate(env, *args, cwd):
    return subprocess.run(["bash", str(SCRIPT), *map(str, args)], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def test_memory_gate_script_passes_a_generous_budget(gate_env, tmp_path):
    r = _gate(gate_env, MLP, "1GiB", tmp_path / "out", cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr
    out = tmp_path / "out"
    for name in ("mlp.ckpt.onnx", "rewrite.json", "compare.json", "compare.txt", "compare.md", "memory.svg"):
        assert (out / name).exists(), name
    assert (out / "compare.md").read_text().startswith("### ckpt compare: 2 inputs")
    doc = json.loads((out / "compare.json").read_text())
    assert doc["failed"] is False
    assert [c["condition"] for c in doc["conditions"]] == ["measured_peak_bytes>1GiB", "ratio(peak_bytes)>100%"]
    assert json.loads((out / "rewrite.json").read_text())["check"]["passed"] is True


def test_memory_gate_script_fails_an_impossible_budget(gate_env, tmp_path):
    r = _gate(gate_env, MLP, "1KiB", "out", cwd=tmp_path)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr
    assert "--fail-if 'measured_peak_bytes>1KiB' holds" in r.stderr
    assert json.loads((tmp_path / "out" / "compare.json").read_text())["failed"] is True
    assert "**holds: FAIL**" in (tmp_path / "out" / "compare.md").read_text()


def test_memory_gate_script_usage_errors_exit_2(gate_env, tmp_path):
    assert _gate(gate_env, MLP, cwd=tmp_path).returncode == 2
    assert _gate(gate_env, tmp_path / "missing.onnx", "1GiB", cwd=tmp_path).returncode == 2


def test_workflow_calls_the_script():
    text = (ROOT / "examples" / "ci" / "memory-gate.yml").read_text()
    assert "examples/ci/memory_gate.sh" in text and "upload-artifact" in text
    assert "\t" not in text  # YAML forbids tabs


@pytest.mark.parametrize("size", ["2GiB", "2GB", "2G", "2 gib", "512MiB", "1.5K", "1000"])
def test_one_byte_grammar_for_budget_and_fail_if(size):
    """--budget and --fail-if read sizes with the same grammar (ckpt_cli.units)."""
    from ckpt_cli.planning.strategies import parse_budget
    from ckpt_cli.units import parse_bytes

    assert parse_condition(f"peak_bytes>{size}").value == parse_bytes(size) == parse_budget(size, 1)


def test_compare_reads_plan_reports(tmp_path):
    plan = tmp_path / "plan.json"
    r = CliRunner().invoke(main, ["plan", str(SAMPLES / "gpt.onnx"), "--budget", "75%", "--report", str(plan), "-q"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["compare", str(SAMPLES / "gpt.onnx"), str(plan), "--json",
                                  "--fail-if", "ratio(ort_peak_bytes)>75%"])  # what the budget bounds
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["inputs"][1]["kind"] == "plan"
    assert report["inputs"][1]["figures"]["peak_bytes"] == json.loads(plan.read_text())["peak_bytes_after"]
    assert report["inputs"][1]["figures"]["ort_peak_bytes"] == json.loads(plan.read_text())["ort_peak_bytes_after"]
