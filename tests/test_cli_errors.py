"""Command-line failures a CI job must be able to tell apart: each gets its documented
exit code and one line, and nothing the command reads is replaced."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import onnx
import pytest
from chain import chain_model
from click.testing import CliRunner
from conftest import ROOT, SAMPLES

from ckpt_cli.cli import main

pytestmark = pytest.mark.slow


def run(*args) -> tuple[int, str, str]:
    r = CliRunner().invoke(main, [str(a) for a in args])
    return r.exit_code, r.stdout, r.stderr


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ckpt: error:"), stderr
    assert "Traceback" not in stderr
    return lines[0]


@pytest.mark.parametrize("command", ["inspect", "plan"])
def test_report_never_replaces_the_model(tmp_path, command):
    model = tmp_path / "m.onnx"
    shutil.copy(SAMPLES / "mlp.onnx", model)
    before = digest(model)
    code, _, err = run(command, model, "--report", model)
    assert code == 2 and "--report" in one_error_line(err)
    assert digest(model) == before
    onnx.load(str(model))


def test_report_never_replaces_the_output_or_the_plan(tmp_path):
    model = tmp_path / "m.onnx"
    shutil.copy(SAMPLES / "mlp.onnx", model)
    out = tmp_path / "out.onnx"
    code, _, err = run("rewrite", model, "-o", out, "--report", out)
    assert code == 2 and not out.exists(), err
    plan = tmp_path / "plan.json"
    code, _, err = run("plan", model, "--auto", "layers", "-o", plan, "--report", plan)
    assert code == 2 and not plan.exists(), err


@pytest.mark.parametrize("dim", ["batch=0", "batch=-1", "batch=²", "batch", "=4"])
def test_bad_dims_are_usage_errors(dim):
    code, _, err = run("inspect", SAMPLES / "mlp.onnx", "--dim", dim)
    assert code == 2 and "--dim" in one_error_line(err)


@pytest.mark.parametrize("opt", [["--rtol", "-1"], ["--atol", "-0.5"], ["--timeout", "0"]])
def test_bad_check_tolerances_are_usage_errors(opt):
    code, _, err = run("check", SAMPLES / "mlp.onnx", SAMPLES / "mlp.onnx", *opt)
    assert code == 2 and "Traceback" not in err


def test_output_folder_gets_the_default_name(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    code, out, err = run("rewrite", SAMPLES / "mlp.onnx", "-o", str(folder) + "/", "--json", "-q")
    assert code == 0, err
    assert (folder / "mlp.ckpt.onnx").exists()
    missing = tmp_path / "newdir"
    code, _, err = run("rewrite", SAMPLES / "mlp.onnx", "-o", str(missing) + "/")
    assert code == 2 and "does not exist" in one_error_line(err)
    assert not missing.exists()  # no file named like the folder


def test_unwritable_output_is_a_clean_error(tmp_path):
    if os.geteuid() == 0:
        target = Path("/proc/ckpt-test/out.onnx")  # not writable even as root
    else:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        target = ro / "out.onnx"
    code, _, err = run("inspect", SAMPLES / "mlp.onnx", "--report", target.with_suffix(".json"))
    assert code == 2, err
    one_error_line(err)


def test_json_has_no_infinity():
    from ckpt_cli.cli.options import report_text

    text = report_text({"a": float("inf"), "b": [float("nan"), 1.5], "c": {"d": -float("inf")}})
    assert json.loads(text) == {"a": None, "b": [None, 1.5], "c": {"d": None}}


def test_a_large_report_is_written_a_piece_per_entry(monkeypatch, capsys):
    """A report above PRETTY_JSON_LIMIT goes out compact, an entry at a time (a 100k-node
    rewrite's is 6 MB: joined, then encoded, it held two more copies of itself at the
    process's peak), and what is written is json.dumps's text."""
    from ckpt_cli.cli import options

    monkeypatch.setattr(options, "PRETTY_JSON_LIMIT", 64)
    report = {"a": list(range(40)), "b": {"c": "é", "d": float("nan")}, "e": None}
    pieces = options.report_pieces(report)
    expected = json.dumps({"a": list(range(40)), "b": {"c": "é", "d": None}, "e": None})
    assert len(pieces) == len(report) and "".join(pieces) == expected
    options.emit(report, lambda r, c: None, True, None, False)
    assert capsys.readouterr().out == expected + "\n"


def test_non_python_interpreter_exits_5(tmp_path):
    rewritten = tmp_path / "mlp.ckpt.onnx"
    assert run("rewrite", SAMPLES / "mlp.onnx", "-o", rewritten, "-q")[0] == 0
    for python in ("/bin/false", str(tmp_path / "no-such-python")):
        code, _, err = run("check", SAMPLES / "mlp.onnx", rewritten, "--python", python, "--runs", "1")
        assert code == 5, err
        one_error_line(err)


def test_dropout_model_checks_against_itself(tmp_path):
    """ORT's random generator is seeded in every child: an unseeded Dropout draws the
    same mask in both runs, so a model compares equal to itself."""
    m = chain_model(layers=3, batch=16, width=16, dropout_layer=1)
    for node in m.graph.node:
        if node.op_type == "Dropout":
            del node.attribute[:]  # no seed attribute: ORT's global generator decides
    path = tmp_path / "dropout.onnx"
    onnx.save(m, str(path))
    code, out, err = run("check", path, path, "--json", "--runs", "1")
    report = json.loads(out)
    assert report["outputs_equal"] is True, report["outputs"]
    assert code == 0, report["failures"]
    code, out, _ = run("check", path, path, "--json", "--runs", "1", "--seed", "3")
    assert json.loads(out)["outputs_equal"] is True


def _worker_pids(tmp: Path) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "worker.py" in cmdline and str(tmp) in cmdline:
            pids.append(int(proc.name))
    return pids


def test_sigterm_during_check_leaves_no_worker_and_no_temp_folder(tmp_path):
    rewritten = tmp_path / "gpt.ckpt.onnx"
    assert run("rewrite", SAMPLES / "gpt.onnx", "-o", rewritten, "-q")[0] == 0
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp))
    p = subprocess.Popen([sys.executable, "-m", "ckpt_cli.cli", "check", str(SAMPLES / "gpt.onnx"), str(rewritten),
                          "--runs", "50"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not _worker_pids(tmp) and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.05)
    assert _worker_pids(tmp), "the check never started its worker"
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 143, err
    assert b"terminated" in err
    deadline = time.monotonic() + 10
    while _worker_pids(tmp) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _worker_pids(tmp), "the worker outlived ckpt"
    # ckpt's temporary folders are all named ckpt_*; ORT itself leaves a '.ses' id file in $TMPDIR.
    left = [p.name for p in tmp.iterdir() if p.name.startswith("ckpt_")]
    assert left == [], left


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_broken_pipe_exits_141_without_a_traceback(json_flag):
    """`ckpt inspect m.onnx | head -1`: the reader goes away; that is not a failed gate (1)."""
    p = subprocess.Popen([sys.executable, "-m", "ckpt_cli.cli", "inspect", str(SAMPLES / "gpt.onnx"), *json_flag],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # before ckpt writes anything
    err = p.stderr.read()
    assert p.wait(timeout=120) == 141, err
    assert b"Traceback" not in err and b"error" not in err
