"""Progress of long work: the stage and elapsed time on stderr, live on a terminal and as
plain lines in a log (only for stages that last), never on stdout or under -q."""

from __future__ import annotations

import io
import json
import os
import pty
import subprocess
import sys

import pytest
from click.testing import CliRunner
from conftest import ROOT, SAMPLES

import ckpt_cli.cli.progress as shown
from ckpt_cli.cli import main
from ckpt_cli.cli.progress import Progress, elapsed_text
from ckpt_cli.progress import listening, stage

MLP = str(SAMPLES / "mlp.onnx")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _lines(stream: io.StringIO) -> list[str]:
    return stream.getvalue().splitlines()


def test_a_log_hears_of_stages_that_last_and_then_every_heartbeat():
    clock, out = Clock(), io.StringIO()
    p = Progress("reading", "lines", stream=out, clock=clock)
    clock.now += shown.LINE_AFTER_S - 0.1
    p.tick(clock.now)
    assert _lines(out) == []  # a stage quicker than LINE_AFTER_S says nothing
    p.stage("planning")
    clock.now += shown.LINE_AFTER_S
    p.tick(clock.now)
    assert _lines(out) == ["ckpt: 9 s: planning"]
    p.detail("planning: 40 plans evaluated")
    clock.now += shown.HEARTBEAT_S - 1
    p.tick(clock.now)
    assert len(_lines(out)) == 1
    clock.now += 1
    p.tick(clock.now)
    assert _lines(out)[-1] == "ckpt: 39 s: still planning: 40 plans evaluated"
    p.stage("ORT check: gpt.onnx, ckpt settings, 3 runs + warm-up")
    clock.now += 100
    p.tick(clock.now)
    assert _lines(out)[-1] == "ckpt: 2 min 19 s: ORT check: gpt.onnx, ckpt settings, 3 runs + warm-up"
    p.__exit__(None, None, None)
    assert _lines(out)[-1] == "ckpt: done in 2 min 19 s"


def test_quick_work_and_failures_print_no_progress():
    clock, out = Clock(), io.StringIO()
    p = Progress("reading", "lines", stream=out, clock=clock)
    for k in range(5):
        p.stage(f"stage {k}")
        clock.now += shown.LINE_AFTER_S - 1
        p.tick(clock.now)
    p.__exit__(None, None, None)
    assert out.getvalue() == ""
    p = Progress("reading", "lines", stream=out, clock=clock)
    clock.now += shown.LINE_AFTER_S
    p.tick(clock.now)
    p.__exit__(RuntimeError, RuntimeError("x"), None)  # the error says the rest: no "done"
    assert _lines(out) == ["ckpt: 5 s: reading"]


def test_elapsed_text():
    assert [elapsed_text(s) for s in (0.4, 59.9, 60, 125.2, 3600)] == ["0 s", "59 s", "1 min 00 s", "2 min 05 s",
                                                                       "60 min 00 s"]


def test_stages_reach_only_a_listener():
    heard: list[str] = []
    stage("nobody listens")
    with listening(heard.append):
        stage("planning")
    stage("after")
    assert heard == ["planning"]


@pytest.fixture
def eager(monkeypatch):
    """Every stage gets its line at once."""
    monkeypatch.setattr(shown, "LINE_AFTER_S", 0.0)
    monkeypatch.setattr(shown, "POLL_S", 0.01)


def test_rewrite_check_in_a_log_names_its_stages_on_stderr_only(eager, tmp_path):
    args = ["rewrite", MLP, "-o", str(tmp_path / "m.onnx"), "--check", "--runs", "1", "--provider", "cpu"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.stderr
    assert "verdict: PASS" in r.stdout and not any(line.startswith("ckpt: ") for line in r.stdout.splitlines())
    lines = r.stderr.splitlines()
    assert all(line.startswith("ckpt: ") for line in lines), lines
    assert any("ORT check: mlp.onnx, ckpt settings, 1 run + warm-up" in line for line in lines), lines
    assert any("ORT check: m.onnx, ort_default settings" in line for line in lines), lines
    assert lines[-1].startswith("ckpt: done in ")
    quiet = CliRunner().invoke(main, [*args, "-q", "--force"])
    assert quiet.exit_code == 0 and quiet.output == ""


@pytest.mark.parametrize("extra", [["--json"], ["--report", "r.json", "-q"]], ids=["json", "quiet"])
def test_check_in_a_log_under_json_or_quiet_says_nothing_more(eager, tmp_path, extra, monkeypatch):
    """Readers of --json often take both streams as one (2>&1): the JSON stays whole."""
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, ["check", MLP, MLP, "--runs", "1", "--provider", "cpu", *extra])
    assert r.exit_code in (0, 1) and r.stderr == "", r.stderr
    if "--json" in extra:
        assert json.loads(r.output)["command"] == "check"


def test_without_the_check_a_log_gets_no_progress(eager, tmp_path):
    r = CliRunner().invoke(main, ["rewrite", MLP, "-o", str(tmp_path / "m.onnx")])
    assert r.exit_code == 0 and r.stderr == ""


def test_a_terminal_sees_the_stage_live_and_stdout_keeps_the_report(tmp_path):
    """stderr a terminal, stdout a pipe: the live line (cleared at the end) goes to the
    terminal, the JSON report alone to stdout."""
    primary, secondary = pty.openpty()
    args = [sys.executable, "-m", "ckpt_cli.cli", "rewrite", MLP, "-o", str(tmp_path / "m.onnx"), "--check",
            "--runs", "1", "--provider", "cpu", "--json"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=secondary, env=env)
    os.close(secondary)
    seen = b""
    while True:
        try:
            chunk = os.read(primary, 1 << 16)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    stdout, _ = proc.communicate(timeout=120)
    os.close(primary)
    assert proc.returncode == 0, seen[-2000:]
    assert json.loads(stdout)["command"] == "rewrite"
    text = seen.decode(errors="replace")
    assert "planning" in text and "ORT check: mlp.onnx" in text and "0:00:0" in text
