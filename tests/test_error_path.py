"""Every failure takes one path: one line on stderr, the documented exit code, and under
--json one error object on stdout that the shipped schema accepts; names the model or the
command line put in a message reach the terminal with their control characters made visible."""

from __future__ import annotations

import json
from importlib import resources

import onnx
import pytest
from click.testing import CliRunner
from conftest import SAMPLES

from ckpt_cli.cli import main

jsonschema = pytest.importorskip("jsonschema")
MLP = str(SAMPLES / "mlp.onnx")
TITLE, CLEAR = "\x1b]0;pwned\x07", "\x1b[2J"  # set the window title, clear the screen

# click's usage errors and ckpt's own, each with --json somewhere on the line
USAGE_ERRORS = {
    "unknown option": ["inspect", MLP, "--bogus", "--json"],
    "unknown group option": ["--bogus", "inspect", MLP, "--json"],
    "unknown command": ["bogus", "--json"],
    "missing argument": ["inspect", "--json"],
    "missing second argument": ["check", MLP, "--json"],
    "option without its value": ["inspect", MLP, "--json", "--dim"],
    "bad choice": ["check", MLP, MLP, "--json", "--provider", "tpu"],
    "bad strategy": ["plan", MLP, "--json", "--auto", "nope"],
    "not an integer": ["check", MLP, MLP, "--json", "--runs", "x"],
    "integer out of range": ["check", MLP, MLP, "--json", "--runs", "0"],
    "float out of range": ["check", MLP, MLP, "--json", "--rtol", "-1"],
    "flag given a value": ["rewrite", MLP, "--json", "--force=yes"],
    "extra argument": ["inspect", MLP, "extra", "--json"],
    "missing file": ["session", "nothere.onnx", "--json"],
    "no inputs": ["compare", "--json"],
    "bad dim": ["inspect", MLP, "--json", "--dim", "batch=0"],
    "svg without sweep": ["plan", MLP, "--json", "--svg", "x.svg"],
    "bad ort-optimize": ["rewrite", MLP, "--json", "--ort-optimize", "tpu"],
}


@pytest.fixture(scope="module")
def schema():
    return json.loads(resources.files("ckpt_cli.report").joinpath("schema.json").read_text())


def one_error(args: list[str], schema: dict, code: int = 2) -> dict:
    """The failure of ``args``: exit ``code``, one stderr line, one schema-valid error object."""
    r = CliRunner().invoke(main, args)
    assert r.exit_code == code, (r.exit_code, r.stderr, r.exception)
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ckpt: error: "), r.stderr
    doc = json.loads(r.stdout)
    assert not list(jsonschema.Draft202012Validator(schema).iter_errors(doc)), doc
    assert doc["error"] == {"exit_code": code, "message": lines[0][len("ckpt: error: "):]}
    return doc


@pytest.mark.parametrize("args", USAGE_ERRORS.values(), ids=USAGE_ERRORS.keys())
def test_usage_errors_under_json_print_the_error_object(args, schema, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    doc = one_error(args, schema)
    named = next((a for a in args if not a.startswith("-")), None)
    assert doc["command"] == (named if named != "bogus" else None)


def test_usage_error_without_json_is_one_line():
    r = CliRunner().invoke(main, ["inspect", MLP, "--bogus"])
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr.splitlines() == ["ckpt: error: No such option '--bogus'. Did you mean '--loss'? "
                                     "(see 'ckpt inspect --help')"]


def test_help_and_version_still_exit_0():
    assert CliRunner().invoke(main, ["inspect", "--help"]).exit_code == 0
    assert CliRunner().invoke(main, ["--version"]).exit_code == 0


@pytest.fixture(scope="module")
def hostile_model(tmp_path_factory):
    """The sample MLP with escape sequences in its node names and in its loss output's name."""
    m = onnx.load(MLP)
    loss = m.graph.output[0].name
    hostile = CLEAR + loss + TITLE
    m.graph.output[0].name = hostile
    for n in m.graph.node:
        n.name = TITLE + n.name
        n.input[:] = [hostile if t == loss else t for t in n.input]
        n.output[:] = [hostile if t == loss else t for t in n.output]
    path = tmp_path_factory.mktemp("hostile") / "m.onnx"
    onnx.save(m, str(path))
    return str(path)


@pytest.mark.parametrize("option", ["--loss", "--grad-output"])
def test_names_in_error_messages_are_escaped(hostile_model, schema, option):
    doc = one_error(["inspect", hostile_model, option, "nope", "--json"], schema)
    assert "\\x1b[2J" in doc["error"]["message"] and "\\x07" in doc["error"]["message"]
    r = CliRunner().invoke(main, ["inspect", hostile_model, option, "nope"])
    assert "\x1b" not in r.stderr and "\x07" not in r.stderr and r.exit_code == 2


def test_names_in_reports_are_escaped(hostile_model, tmp_path):
    rewrite = ["rewrite", hostile_model, "-o", str(tmp_path / "out.onnx")]
    for args in (["inspect", hostile_model], ["plan", hostile_model], rewrite):
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 0, r.stderr
        assert "\x1b" not in r.output and "\x07" not in r.output


@pytest.mark.parametrize("extra", [["-o", "plan.json"], ["--budget", "50%"], ["--auto", "sqrt"]])
def test_sweep_refuses_what_it_would_ignore(extra, schema, tmp_path, monkeypatch):
    """The sweep writes no plan and follows no strategy: -o, --auto and --budget are refused."""
    monkeypatch.chdir(tmp_path)
    doc = one_error(["plan", MLP, "--sweep", "--json", *extra], schema)
    assert extra[0] in doc["error"]["message"] and not (tmp_path / "plan.json").exists()


def test_a_file_name_in_the_fail_if_line_is_escaped(tmp_path):
    report = tmp_path / f"r{TITLE}.json"
    assert CliRunner().invoke(main, ["inspect", MLP, "--report", str(report), "-q"]).exit_code == 0
    r = CliRunner().invoke(main, ["compare", str(report), "--fail-if", "peak_bytes>1", "-q"])
    assert r.exit_code == 1 and "\x1b" not in r.stderr and "\x07" not in r.stderr
    assert "r\\x1b]0;pwned\\x07.json" in r.stderr
