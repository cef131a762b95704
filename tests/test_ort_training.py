"""The ORT training artifact (com.microsoft training ops) checked through ``ckpt check --python``.

Plain onnxruntime cannot load ``sample_models/ort_artifact/training_model.onnx`` (it uses
com.microsoft training ops that only onnxruntime-training has), so ``ckpt check`` must say
so in one line (exit 4) and, given ``--python`` pointing at an interpreter with
onnxruntime-training-cpu 1.19.2, run both graphs there with equal outputs, the executed
order as written and the process peak as predicted; and the default rewrite measures below
the original in each session people run.

That interpreter is a venv built once into ``.venv-ort-training`` in the repository root
(gitignored by ``.venv-*/``; about 15 s with the local package mirror) and reused after;
``CKPT_ORT_TRAINING_PYTHON`` may point at an existing one instead. If the build fails
(no python3.11, no package index) the tests that need it are skipped, with pip's reason.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, SAMPLES
from fixtures.venvs import VenvSpec, built_python, tail_of

ARTIFACT = SAMPLES / "ort_artifact" / "training_model.onnx"
PACKAGES = ["onnxruntime-training-cpu==1.19.2", "numpy<2"]
ORT_VERSION = "1.19.2"

# Cold (fresh clone, as in CI) the module takes ~20 s, 13-16 s of it building the venv.
pytestmark = pytest.mark.slow

def _ckpt(*args, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ckpt_cli.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, env=dict(os.environ, NO_COLOR="1"))


_PROBE = ("import numpy, onnxruntime as o; "
          f"assert o.__version__ == {ORT_VERSION!r}, o.__version__; "
          "assert int(numpy.__version__.split('.')[0]) < 2")
TRAINING_VENV = VenvSpec(ROOT / ".venv-ort-training", tuple(PACKAGES), _PROBE, "CKPT_ORT_TRAINING_PYTHON",
                         f"onnxruntime-training-cpu {ORT_VERSION} with numpy<2",
                         shutil.which("python3.11"), timeout=900)  # the wheel is for 3.11 only


@pytest.fixture(scope="session")
def training_python() -> str:
    """An interpreter with onnxruntime-training-cpu 1.19.2 and numpy<2."""
    return built_python(TRAINING_VENV)


@pytest.fixture(scope="module")
def rewritten(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ort_training") / "training_model.ckpt.onnx"
    r = _ckpt("rewrite", ARTIFACT, "-o", out, "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert sum(reg["recompute_nodes"] for reg in report["regions"]) > 0, "nothing recomputed: a vacuous check"
    assert report["mem_pattern_off"] is None  # the Module API would take the switch for a user input
    assert out.exists()
    return out


def test_plain_onnxruntime_cannot_load_the_artifact():
    import onnxruntime as ort

    with pytest.raises(Exception, match="is not a registered function/op"):
        ort.InferenceSession(str(ARTIFACT), providers=["CPUExecutionProvider"])


def test_check_without_python_exits_4(rewritten):
    r = _ckpt("check", ARTIFACT, rewritten, "--json")
    assert r.returncode == 4, (r.returncode, r.stdout[-500:], r.stderr[-500:])
    assert json.loads(r.stdout)["error"]["exit_code"] == 4  # --json: the failure as JSON too
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
    assert report["rewritten"]["method"] == "process_peak"
    # Large enough for VmHWM to resolve (1 MiB activations), and measured as predicted.
    assert min(report["predicted"].values()) > 4 * 2**20
    assert all(abs(e) <= 0.10 for e in report["prediction_error"].values()), report["prediction_error"]
    assert report["rewritten"]["peak_bytes"] < 0.8 * report["original"]["peak_bytes"]
    assert report["rewritten_ort_default"]["peak_bytes"] < report["original_ort_default"]["peak_bytes"]


@pytest.mark.slow
def test_process_peak_reads_every_run_alike_and_the_gru_within_5_percent(training_python):
    """The check's children give malloc's free heap pages back before each run: without that
    a block taken from free pages earlier runs left resident went unseen, and one process's
    runs of the zoo's GRU read 6.8 down to 6.2 MB (ckpt predicted 6.9 MB: +2% to +8%)."""
    gru = SAMPLES / "zoo" / "gru" / "training_model.onnx"
    r = _ckpt("check", gru, gru, "--python", training_python, "--provider", "cpu", "--runs", "6", "--json",
              timeout=600)
    assert r.returncode == 0, r.stderr[-1000:]
    report = json.loads(r.stdout)
    for side in ("original", "rewritten"):
        runs = [run["peak_bytes"] for run in report[side]["runs"]]
        assert max(runs) - min(runs) <= 256 * 1024, (side, runs)
        assert abs(report["prediction_error"][side]) <= 0.05, report["prediction_error"]


def test_check_fails_a_process_peak_prediction_far_off(training_python, rewritten):
    """The premise that makes the memory figures mean anything is judged under process_peak too."""
    from dataclasses import replace

    from ckpt_cli import api
    from ckpt_cli.verify.stage import check_files, predict

    loaded = {k: api.analyse_input(api.load_input(p)) for k, p in (("original", ARTIFACT), ("rewritten", rewritten))}
    reuse = loaded["rewritten"].reuse_buffers
    predicted = {k: predict(a, reuse) for k, a in loaded.items()}
    p = predicted["rewritten"]  # a process peak is judged against the prediction with kernel scratch
    predicted["rewritten"] = replace(p, tensor_bytes=int(p.tensor_bytes * 1.3), process_bytes=int(p.process_bytes * 1.3))
    f = check_files(ARTIFACT, rewritten, predicted, api.CheckOptions(python=training_python, runs=1),
                    enable_mem_reuse=reuse)
    assert f.measured.rewritten.method == "process_peak"
    assert any("rewritten peak prediction" in line for line in f.failures), f.failures
    assert not any("original peak prediction" in line for line in f.failures), f.failures


def test_session_matrix_below_the_original(training_python, tmp_path):
    """bench/sessions.py's row for the artifact: (a) a plain InferenceSession, (b) DEFAULT order
    with ORT_ENABLE_ALL, (c) the recorded settings; each below the original in a plain session."""
    from sessions import make_feeds, measure_process_peak

    feeds = tmp_path / "feeds.npz"
    make_feeds(ARTIFACT, feeds)
    rewrite = tmp_path / "rewrite.onnx"
    assert _ckpt("rewrite", ARTIFACT, "-o", rewrite).returncode == 0
    original = measure_process_peak(ARTIFACT, "plain", feeds, training_python)["peak_bytes"]
    for session in ("plain", "default_all", "ckpt"):
        r = measure_process_peak(rewrite, session, feeds, training_python)
        assert r["peak_bytes"] < 0.95 * original, (session, r["peak_bytes"], original)


_SHAPES_PROBE = """
import json, sys, numpy as np, onnxruntime as ort
so = ort.SessionOptions()
so.intra_op_num_threads = 1
s = ort.InferenceSession(sys.argv[1], so, providers=["CPUExecutionProvider"])
feeds = dict(np.load(sys.argv[2]))
names = [o.name for o in s.get_outputs()]
print(json.dumps({n: [list(v.shape), v.dtype.itemsize * v.size] for n, v in zip(names, s.run(names, feeds))}))
"""


@pytest.mark.parametrize("name", sorted(p.name for p in (SAMPLES / "zoo").iterdir()))
def test_every_tensor_has_the_size_ort_gives_it(training_python, tmp_path, name):
    """ckpt's sizes for every tensor of each zoo artifact, at the default batch, against the
    arrays ORT 1.19.2's training build returns when each is made a graph output."""
    import numpy as np
    import onnx

    from ckpt_cli.api import analyse_input, load_input
    from ckpt_cli.verify.feeds import make_feeds

    path = SAMPLES / "zoo" / name / "training_model.onnx"
    a = analyse_input(load_input(path))
    model = onnx.load(path)
    outputs = {o.name for o in model.graph.output}
    produced = [t for n in model.graph.node for t in n.output if t and t not in outputs]
    model.graph.output.extend(onnx.helper.make_empty_tensor_value_info(t) for t in produced)
    probe = tmp_path / "probe.onnx"
    onnx.save(model, probe)
    np.savez(tmp_path / "feeds.npz", **make_feeds(model, dims=dict(a.dims)))
    r = subprocess.run([training_python, "-c", _SHAPES_PROBE, str(probe), str(tmp_path / "feeds.npz")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, tail_of(r.stderr)
    ran = json.loads(r.stdout.strip().splitlines()[-1])
    wrong = {t: (a.tensors[t].shape, shape) for t, (shape, nbytes) in ran.items()
             if t in a.tensors and (a.tensors[t].nbytes != nbytes or tuple(shape) != tuple(a.tensors[t].shape or ()))}
    assert not wrong, wrong
    assert set(ran) <= set(a.tensors)  # every tensor ORT made is sized


@pytest.mark.parametrize("name", ["embed_ln", "gpt"])
def test_kernel_working_memory_is_predicted(training_python, tmp_path, name):
    """embed_ln's LayerNormalizationGrad holds four copies of X outside ORT's allocator, gpt's
    SoftmaxCrossEntropyLoss a copy of the logits: without them the prediction was -57% and
    -8% off the process peak; with them both sides are within the default 10%."""
    src = SAMPLES / "zoo" / name / "training_model.onnx"
    out = tmp_path / f"{name}.ckpt.onnx"
    assert _ckpt("rewrite", src, "-o", out).returncode == 0
    r = _ckpt("check", src, out, "--python", training_python, "--provider", "cpu", "--json")
    report = json.loads(r.stdout)
    assert report["original"]["method"] == "process_peak"
    assert all(abs(e) <= 0.10 for e in report["prediction_error"].values()), report["prediction_error"]
    assert r.returncode == 0 and report["passed"], report["failures"]


def test_a_rewrite_planned_at_the_default_batch_runs_at_any_batch(training_python, tmp_path):
    """The rewrite's value_info keeps the symbolic batch ("batch", not 64): with 64 written in,
    ORT at its defaults folds Shape nodes into constants and the file fails at any other batch."""
    import onnx

    # bert17: zoo bert's default is written unchanged (predicted 0.90x in the Module session,
    # short of the margin), so it has no copies to declare
    src = SAMPLES / "zoo" / "bert17" / "training_model.onnx"
    out = tmp_path / "bert.ckpt.onnx"
    assert _ckpt("rewrite", src, "-o", out).returncode == 0
    declared = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
                for v in onnx.load(out).graph.value_info}
    copies = [shape for name, shape in declared.items() if name.endswith("_recompute")]
    assert copies and any(shape[:1] == ["batch"] for shape in copies)
    assert not any(64 in shape for shape in copies)
    r = _ckpt("check", src, out, "--dim", "batch=16", "--python", training_python, "--provider", "cpu", "--json")
    report = json.loads(r.stdout)
    assert report["rewritten_ort_default"] is not None, report.get("rewritten_ort_default_error")
    assert report["outputs_equal"] and report["other_dims"]["all_bit_identical"], report["failures"]
    assert r.returncode == 0 and report["passed"], report["failures"]
