"""`make gpu-check` runs where a GPU is lent, rarely: its dry run on CPU keeps the script,
its session (b) and its table from rotting between leases."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_gpu_check_dry_run_on_cpu(tmp_path):
    results = tmp_path / "GPU_RESULTS.md"
    env = dict(os.environ, GPU_CHECK_PROVIDER="cpu", GPU_CHECK_SAMPLES="mlp", GPU_CHECK_CONFIGS="default budget50",
               GPU_RESULTS=str(results), BIN=str(Path(sys.executable).parent))
    done = subprocess.run(["bash", "bench/gpu_check.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in results.read_text().splitlines() if line.startswith("| mlp |")]
    default, budget = rows
    cells = [c.strip() for c in default.split("|")[1:-1]]
    assert cells[1] == "default" and cells[2] == "bit-identical" and cells[3] == "kept" and cells[-1] == "pass"
    assert cells[9].endswith("x)")  # session (b), measured by bench/gpu_sessions.py
    assert "budget unreachable (exit 3)" in budget  # the mlp's 50% is below its floor: reported, not failed
