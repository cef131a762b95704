"""The ORT training artifact (com.microsoft training ops) checked through ``ckpt check --python``.

Plain onnxruntime cannot load ``sample_models/ort_artifact/training_model.onnx``
(ORT_FACTS §1), so ``ckpt check`` must say so in one line (exit 4) and, given
``--python`` pointing at an interpreter with onnxruntime-training-cpu 1.19.2, run both
graphs there with equal outputs.

That interpreter is a venv built once into ``.venv-ort-training`` in the repository root
(gitignored by ``.venv-*/``; about 15 s with the local package mirror) and reused after;
``CKPT_ORT_TRAINING_PYTHON`` may point at an existing one instead. If the build fails
(no python3.11, no package index) the tests that need it are skipped, with pip's reason.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import ROOT, SAMPLES

ARTIFACT = SAMPLES / "ort_artifact" / "training_model.onnx"
VENV = ROOT / ".venv-ort-training"
READY = VENV / ".ckpt-ready"
PACKAGES = ["onnxruntime-training-cpu==1.19.2", "numpy<2"]
ORT_VERSION = "1.19.2"
# Below this, process_peak (VmHWM, page granular, malloc noise) cannot tell two peaks apart.

# Cold (fresh clone, as in CI) the module takes ~20 s, 13-16 s of it building the venv.
pytestmark = pytest.mark.slow

def _ckpt(*args, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ckpt_cli.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, env=dict(os.environ, NO_COLOR="1"))


def _has_training_ort(python: str) -> bool:
    probe = ("import numpy, onnxruntime as o; "
             f"assert o.__version__ == {ORT_VERSION!r}, o.__version__; "
             "assert int(numpy.__version__.split('.')[0]) < 2")
    try:
        return subprocess.run([python, "-c", probe], capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@contextlib.contextmanager
def _build_lock():
    with open(os.path.join(tempfile.gettempdir(), "ckpt-ort-training-venv.lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _tail(text: str, n: int = 3) -> str:
    lines = [l for l in text.strip().splitlines() if not l.startswith("WARNING: Location")]
    return " | ".join(lines[-n:]) or "(no output)"


@pytest.fixture(scope="session")
def training_python() -> str:
    """An interpreter with onnxruntime-training-cpu 1.19.2 and numpy<2."""
    given = os.environ.get("CKPT_ORT_TRAINING_PYTHON")
    if given:
        if not _has_training_ort(given):
            pytest.fail(f"CKPT_ORT_TRAINING_PYTHON={given} lacks onnxruntime-training-cpu {ORT_VERSION}")
        return given
    python = str(VENV / "bin" / "python")
    with _build_lock():
        if READY.exists() and _has_training_ort(python):
            return python
        base = shutil.which("python3.11")
        if base is None:
            pytest.skip("python3.11 is not installed; onnxruntime-training-cpu 1.19.2 needs it")
        shutil.rmtree(VENV, ignore_errors=True)
        start = time.perf_counter()
        made = subprocess.run([base, "-m", "venv", str(VENV)], capture_output=True, text=True)
        if made.returncode != 0:
            pytest.skip(f"python3.11 -m venv failed: {_tail(made.stderr)}")
        pip = subprocess.run([python, "-m", "pip", "install", "-q", *PACKAGES], capture_output=True,
                             text=True, timeout=900)
        if pip.returncode != 0:
            shutil.rmtree(VENV, ignore_errors=True)
            pytest.skip(f"cannot install {' '.join(PACKAGES)} (offline?): {_tail(pip.stderr or pip.stdout)}")
        if not _has_training_ort(python):
            pytest.fail(f"{VENV} was built but cannot import onnxruntime {ORT_VERSION} with numpy<2")
        READY.write_text(f"{' '.join(PACKAGES)}\nbuilt in {time.perf_counter() - start:.1f} s\n")
    return python


@pytest.fixture(scope="module")
def rewritten(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ort_training") / "training_model.ckpt.onnx"
    r = _ckpt("rewrite", ARTIFACT, "-o", out, "--auto", "layers", "--json")  # the default finds no gain here
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert sum(reg["recompute_nodes"] for reg in report["regions"]) > 0, "nothing recomputed: a vacuous check"
    assert out.exists()
    return out


def test_plain_onnxruntime_cannot_load_the_artifact():
    import onnxruntime as ort

    with pytest.raises(Exception, match="is not a registered function/op"):
        ort.InferenceSession(str(ARTIFACT), providers=["CPUExecutionProvider"])


def test_check_without_python_exits_4(rewritten):
    r = _ckpt("check", ARTIFACT, rewritten, "--json")
    assert r.returncode == 4, (r.returncode, r.stdout[-500:], r.stderr[-500:])
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("ckpt: error:") and "--python" in lines[0]


def test_check_with_training_python(training_python, rewritten):
    r = _ckpt("check", ARTIFACT, rewritten, "--python", training_python, "--json")
    assert r.returncode in (0, 1), (r.returncode, r.stderr[-1000:])
    report = json.loads(r.stdout)
    assert report["ort_version"] == ORT_VERSION
    assert report["outputs_equal"] is True
    assert report["outputs"] and all(o["bit_identical"] for o in report["outputs"].values())
    assert report["order_matches"] is True
    assert r.returncode == 0, report
    assert report["passed"] is True
