"""SIGINT, SIGTERM and SIGKILL during a rewrite of a model with external data (issue 11,
items 3 and 14): the output is always the old model with its data or the new one with
its data, never a mix, and no temporary file survives the next run."""

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from synthetic import save_transformer

pytestmark = pytest.mark.slow


def _weights(path: Path) -> dict[str, np.ndarray]:
    m = onnx.load(path)  # with its external data
    return {t.name: numpy_helper.to_array(t) for t in m.graph.initializer if len(t.dims) >= 2}


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def _ckpt(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ckpt_cli.cli", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """Two models of the same shape with different weights, and their rewrites' weights."""
    folder = tmp_path_factory.mktemp("kill")
    for name, seed in (("a", 1), ("b", 2)):
        (folder / name).mkdir()
        save_transformer(str(folder / name / "m.onnx"), layers=2, d_model=256, embed_weights=True,
                         external_data=True, seed=seed)
    return folder


def _kill_during_write(proc: subprocess.Popen, folder: Path, sig: int, rng: random.Random) -> None:
    """Send ``sig`` right after a temporary file appears (inside the write), or at a random time."""
    deadline = time.time() + 60
    on_write = rng.random() < 0.7
    delay = rng.uniform(0.0, 0.03) if on_write else rng.uniform(0.5, 3.0)
    start = time.time()
    while proc.poll() is None and time.time() < deadline:
        if on_write and any(p.name.endswith(".tmp") for p in folder.iterdir()):
            time.sleep(delay)
            break
        if not on_write and time.time() - start >= delay:
            break
        time.sleep(0.0005)
    if proc.poll() is None:
        proc.send_signal(sig)
    proc.wait(timeout=60)


@pytest.mark.parametrize("sig,seed", [(signal.SIGKILL, 0), (signal.SIGKILL, 1), (signal.SIGTERM, 3),
                                      (signal.SIGINT, 5)])
def test_interrupted_rewrite_keeps_a_whole_pair(pair, tmp_path, sig, seed):
    rng = random.Random(seed)
    out = tmp_path / "out.onnx"
    first = _ckpt("rewrite", str(pair / "a" / "m.onnx"), "-o", str(out), "-q")
    assert first.wait(timeout=120) == 0
    old = _weights(out)
    proc = _ckpt("rewrite", str(pair / "b" / "m.onnx"), "-o", str(out), "--force", "-q")
    _kill_during_write(proc, tmp_path, sig, rng)
    now = _weights(out)  # loads: the model names a data file that exists, whole
    new_expected = None
    if not _same(now, old):
        fresh = tmp_path / "fresh"
        fresh.mkdir()
        assert _ckpt("rewrite", str(pair / "b" / "m.onnx"), "-o", str(fresh / "out.onnx"), "-q").wait(120) == 0
        new_expected = _weights(fresh / "out.onnx")
        assert _same(now, new_expected), "the model reads another model's data"
    if sig != signal.SIGKILL:
        assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")], "SIGINT/SIGTERM leave no temp"
    again = _ckpt("rewrite", str(pair / "b" / "m.onnx"), "-o", str(out), "--force", "-q")
    assert again.wait(timeout=120) == 0
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")], "the next run sweeps stale temps"
    assert list(tmp_path.glob("out.onnx.*.data"))
