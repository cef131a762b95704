"""The nodes ckpt simulates are the nodes ONNX Runtime runs, in its order, on every artifact
of the zoo: ORT training's function ops without a CPU kernel (DivGrad in the GroupNorm
denoiser) are expanded by ckpt as ORT inlines them, so no node of the file goes unrun and
ORT runs none that ckpt did not simulate.

Each artifact, as ckpt loaded it (expanded), runs once on onnxruntime-training 1.19.2 with
the profiler on; the executed kernels' names must equal ckpt's PRIORITY_BASED order.
"""

from __future__ import annotations

import json
import subprocess

import onnx
import pytest

from conftest import ROOT, SAMPLES
from test_ort_training import training_python  # noqa: F401 - the fixture
from ckpt_cli import inspect_model

pytestmark = pytest.mark.slow
ZOO = SAMPLES / "zoo"
MODELS = sorted(p.name for p in ZOO.iterdir() if (p / "training_model.onnx").exists())
BATCH = 4  # small: the order does not depend on it


@pytest.fixture(scope="module")
def runs(training_python, tmp_path_factory) -> dict[str, tuple[list[str], list[str]]]:  # noqa: F811
    """Per artifact: (ckpt's simulated node names, ORT's executed ones)."""
    folder = tmp_path_factory.mktemp("executed")
    simulated, spec = {}, []
    for name in MODELS:
        r = inspect_model(ZOO / name / "training_model.onnx", dims={"batch": BATCH})
        g = r.analysis.graph
        simulated[name] = [g.nodes[i].name for i in r.analysis.priority.order if g.nodes[i].op_type != "Constant"]
        path = folder / f"{name}.onnx"
        onnx.save(g.model, str(path))
        spec.append([str(path), {d: v["value"] for d, v in r.to_json()["dims"].items()}])
    out = subprocess.run([training_python, str(ROOT / "tests" / "fixtures" / "executed_order.py")],
                         input=json.dumps(spec), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-1000:]
    ran = json.loads(out.stdout)
    return {name: (simulated[name], ran[path]) for name, (path, _) in zip(MODELS, spec)}


@pytest.mark.parametrize("name", MODELS)
def test_simulated_nodes_are_the_executed_ones(runs, name):
    simulated, executed = runs[name]
    assert executed == simulated


def test_the_denoiser_runs_divgrad_expanded(runs):
    simulated, _ = runs["denoiser"]
    assert not any(n.endswith("DivGrad_0") for n in simulated)
    assert sum("/DivGrad_0/" in n for n in simulated) == 3 * 12  # three DivGrad, ORT's 12-node body each
