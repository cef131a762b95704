"""What ``pip install`` resolves and declares: one ONNX Runtime package on every platform,
the license, and the warning when the installed ORT is not one the memory model knows."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner
from packaging.requirements import Requirement

from conftest import SAMPLES
from ckpt_cli.cli import main as cli_main
from ckpt_cli.report import model as report_model

ROOT = Path(__file__).parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]

# (sys_platform, platform_machine) as pip reports them, and the ORT package that has wheels there
PLATFORMS = [("linux", "x86_64", "onnxruntime-gpu"), ("win32", "AMD64", "onnxruntime-gpu"),
             ("darwin", "arm64", "onnxruntime"), ("darwin", "x86_64", "onnxruntime"),
             ("linux", "aarch64", "onnxruntime")]


@pytest.mark.parametrize("platform, machine, expected", PLATFORMS)
def test_each_platform_installs_exactly_the_ort_package_it_has_wheels_for(platform, machine, expected):
    env = {"sys_platform": platform, "platform_machine": machine, "python_version": "3.11"}
    wanted = [r.name for r in map(Requirement, PROJECT["dependencies"])
              if r.name.startswith("onnxruntime") and (r.marker is None or r.marker.evaluate(env))]
    assert wanted == [expected]


def test_no_dependency_pulls_in_a_dataframe_library():
    names = {Requirement(r).name for r in PROJECT["dependencies"]}
    assert not names & {"ortools", "pandas"}


def test_the_license_is_declared_in_the_pep_639_form():
    assert PROJECT["license"] == "MIT" and PROJECT["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text(encoding="utf-8").startswith("MIT License")


@pytest.mark.parametrize("version, dist, warns", [
    ("1.31.1", "onnxruntime-gpu", False), ("1.31.0", "onnxruntime", False),
    ("1.19.2", "onnxruntime-training", False), ("1.19.2", "onnxruntime-training-cpu", False),
    ("1.19.0", "onnxruntime-gpu", True),  # the inference build: the gpt rewrite 11.7% off the prediction
    ("1.25.0", "onnxruntime-gpu", True), ("1.32.0", "onnxruntime", True), (None, None, False)])
def test_the_runtime_warning_names_releases_outside_the_validated_ones(version, dist, warns):
    message = report_model.ort_version_warning(dist, version)
    assert (message is not None) == warns
    if warns:
        assert "\n" not in message and version in message and dist in message and "1.31" in message


def test_the_cli_warns_once_on_stderr_of_an_unvalidated_runtime(monkeypatch):
    import importlib

    main_module = importlib.import_module("ckpt_cli.cli.main")
    monkeypatch.setattr(report_model, "ort_release", lambda: ("onnxruntime", "1.25.0"))
    monkeypatch.setattr(main_module, "_warned", [])
    runner = CliRunner()
    first = runner.invoke(cli_main, ["inspect", str(SAMPLES / "mlp.onnx"), "--json"])
    second = runner.invoke(cli_main, ["inspect", str(SAMPLES / "mlp.onnx"), "--json"])
    assert first.exit_code == 0 and second.exit_code == 0
    assert first.stderr.count("onnxruntime 1.25.0 is not a release") == 1
    assert "onnxruntime 1.25.0" not in first.stdout + second.stderr
