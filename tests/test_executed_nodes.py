"""The nodes ckpt simulates are the nodes ONNX Runtime runs, in its order, on every artifact
of the zoo: ORT training's function ops without a CPU kernel (DivGrad in the GroupNorm
denoiser) are expanded by ckpt as ORT inlines them, so no node of the file goes unrun and
ORT runs none that ckpt did not simulate.

Each artifact runs once on onnxruntime-training 1.19.2 with the profiler on, as it is and
as ckpt loaded it (expanded, as ckpt writes it). The file as it is: ORT numbers the nodes it
inlines after the file's, so its PRIORITY_BASED order runs them late; ckpt's order for the
file must be ORT's (by op type where ORT names the inlined nodes itself, by name elsewhere).
The expanded file: ORT runs its nodes where they stand, and ckpt's order for that file must
be ORT's by name.
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


Order = list[tuple[str, str]]  # (node name, op type) in execution order


def _order(path) -> tuple[Order, dict]:
    r = inspect_model(path, dims={"batch": BATCH})
    g = r.analysis.graph
    inlined = {g.nodes[i].name for i in g.inlined}
    order = [(g.nodes[i].name if g.nodes[i].name not in inlined else "", g.nodes[i].op_type)
             for i in r.analysis.priority.order if g.nodes[i].op_type != "Constant"]
    return order, {d: v["value"] for d, v in r.to_json()["dims"].items()}


@pytest.fixture(scope="module")
def runs(training_python, tmp_path_factory) -> dict[str, dict[str, tuple[Order, Order]]]:  # noqa: F811
    """Per artifact, as it is ("file") and expanded: (ckpt's simulated order, ORT's executed one)."""
    folder = tmp_path_factory.mktemp("executed")
    simulated, spec = {}, []
    for name in MODELS:
        src = ZOO / name / "training_model.onnx"
        expanded = folder / f"{name}.onnx"
        onnx.save(inspect_model(src, dims={"batch": BATCH}).analysis.graph.model, str(expanded))
        for kind, path in (("file", src), ("expanded", expanded)):
            simulated[name, kind], dims = _order(path)
            spec.append([str(path), dims])
    out = subprocess.run([training_python, str(ROOT / "tests" / "fixtures" / "executed_order.py")],
                         input=json.dumps(spec), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-1000:]
    ran = json.loads(out.stdout)
    return {name: {kind: (simulated[name, kind], [tuple(e) for e in ran[path]])
                   for (n, kind), (path, _) in zip(simulated, spec) if n == name} for name in MODELS}


@pytest.mark.parametrize("name", MODELS)
def test_simulated_nodes_are_the_executed_ones(runs, name):
    simulated, executed = runs[name]["expanded"]
    assert executed == simulated


@pytest.mark.parametrize("name", MODELS)
def test_the_file_runs_in_the_simulated_order(runs, name):
    """ORT's own names for the nodes it inlines are not ckpt's: those compare by op type."""
    simulated, executed = runs[name]["file"]
    assert [op for _, op in executed] == [op for _, op in simulated]
    assert [n for (n, _), (s, _) in zip(executed, simulated) if s] == [s for s, _ in simulated if s]


def test_the_denoiser_runs_divgrad_expanded(runs):
    simulated, _ = runs["denoiser"]["expanded"]
    assert not any(n.endswith("DivGrad_0") for n, _ in simulated)
    assert sum("/DivGrad_0/" in n for n, _ in simulated) == 3 * 12  # three DivGrad, ORT's 12-node body each
