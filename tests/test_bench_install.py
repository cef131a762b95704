"""bench/install.py builds the wheel out of the checkout: setuptools leaves build/ and an
egg-info folder in the tree it builds, and a stale build/ would go into the next wheel."""

from __future__ import annotations

import subprocess
from pathlib import Path

from bench import install


def test_the_wheel_is_built_from_a_copy_of_the_files_git_sees(tmp_path, monkeypatch):
    built = []

    def fake_run(cmd, *args, **kw):
        if cmd[0] == "git":  # what git lists (the suite may run in a copy without .git)
            listed = b"pyproject.toml\0ckpt_cli/planning/maxflow.py\0gone.py\0"
            return subprocess.CompletedProcess(cmd, 0, stdout=listed)
        tree = Path(cmd[-1])
        built.append((tree, (tree / "pyproject.toml").is_file(), (tree / "ckpt_cli" / "planning" / "maxflow.py").is_file()))
        (tmp_path / "out" / "onnx_ckpt-0-py3-none-any.whl").write_bytes(b"")
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(install.subprocess, "run", fake_run)
    (tmp_path / "out").mkdir()
    wheel = install.build_wheel(tmp_path / "out")
    assert wheel.name == "onnx_ckpt-0-py3-none-any.whl"
    assert [(t.resolve() != install.REPO.resolve(), t.is_relative_to(tmp_path), a, b) for t, a, b in built] == \
        [(True, True, True, True)]
