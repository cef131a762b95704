"""Buffer reuse between tensors ORT knows only by symbols, against measured peaks.

ORT training artifacts declare most tensors with symbols of their own (``unk__35`` where a
dimension is the batch): ORT's planner reuses a freed buffer, or writes in place, only
between tensors whose declared or inferred shapes are equal symbol for symbol. Outputs of
ReduceSumTraining whose axes come from BroadcastGradientArgs have no shape before the run,
and their buffers are never reused. The function ops ORT inlines (DivGrad) are numbered
after the file's nodes, so ORT's PRIORITY_BASED order runs them late in a file that holds
the op, and where they stand in a file that holds their expansion.

``MEASURED`` holds each model's peak under ckpt's settings (arena off, process peak, bytes),
the median of three runs of ``tests/fixtures/zoo_peak.py`` on onnxruntime-training 1.19.2 CPU
at ckpt's default dimensions (the feeds ``ckpt check`` makes); the slow test measures again.
Before these rules ckpt predicted the denoiser's expansion 9.1% over, bert 17.6% and gpt
16.6% under.
"""

from __future__ import annotations

import json
import os
import subprocess

import onnx
import pytest

from conftest import ROOT, SAMPLES
from test_ort_training import training_python  # noqa: F401 - the fixture
from ckpt_cli import inspect_model
from ckpt_cli.verify.feeds import make_feeds, save_feeds
from ckpt_cli.verify.stage import predict

ZOO = SAMPLES / "zoo"
MEASURED = {"denoiser": 130875392, "denoiser_expanded": 118263808, "bert": 59166720, "bert17": 59482112,
            "gpt": 126832640, "unet": 68034560}
WITHIN = 0.02


def _model(case: str, folder) -> tuple[object, dict]:
    """The file of ``case`` and ckpt's analysis of it (the expansion: the denoiser as ckpt
    writes it, DivGrad's body where the op stood)."""
    src = ZOO / case.removesuffix("_expanded") / "training_model.onnx"
    if not case.endswith("_expanded"):
        return src, inspect_model(src).analysis
    path = folder / f"{case}.onnx"
    onnx.save(inspect_model(src).analysis.graph.model, str(path))
    return path, inspect_model(path).analysis


@pytest.mark.parametrize("case", sorted(MEASURED))
def test_prediction_meets_the_measured_peak(case, tmp_path):
    _, a = _model(case, tmp_path)
    predicted = predict(a, reuse_buffers=True).process_bytes
    assert abs(predicted / MEASURED[case] - 1) <= WITHIN, (predicted, MEASURED[case])


def test_the_denoiser_runs_its_inlined_divgrad_late_and_its_written_expansion_in_place(tmp_path):
    _, original = _model("denoiser", tmp_path)
    _, expanded = _model("denoiser_expanded", tmp_path)
    assert len(original.graph.inlined) == 3 * 12 and expanded.graph.inlined == ()

    def first_body_step(a) -> int:
        return next(k for k, i in enumerate(a.priority.order) if "/DivGrad_0/" in a.graph.nodes[i].name
                    and a.graph.nodes[i].op_type not in ("Shape", "Size"))

    assert first_body_step(original) > first_body_step(expanded)


@pytest.mark.slow
def test_measured_peaks_are_still_the_recorded_ones(training_python, tmp_path):  # noqa: F811
    spec, cases = [], sorted(MEASURED)
    for case in cases:
        path, a = _model(case, tmp_path)
        feeds = tmp_path / f"{case}.npz"
        save_feeds(feeds, make_feeds(onnx.load(str(path), load_external_data=False), 0, dict(a.dims)))
        spec.append([str(path), str(feeds)])
    r = subprocess.run([training_python, str(ROOT / "tests" / "fixtures" / "zoo_peak.py")], input=json.dumps(spec),
                       capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536"))
    assert r.returncode == 0, r.stderr[-1000:]
    peaks = json.loads(r.stdout)
    for case, (path, _) in zip(cases, spec):
        median = sorted(peaks[path])[1]
        assert abs(median / MEASURED[case] - 1) <= WITHIN, (case, median, MEASURED[case])


def test_reduce_sum_training_by_computed_axes_has_no_shape_before_the_run(tmp_path):
    """ORT's ReduceSumTraining infers no shape unless its axes are an initializer: DivGrad's
    reductions (axes from BroadcastGradientArgs) take buffers its planner never reuses."""
    _, a = _model("denoiser", tmp_path)
    reduced = [t for n in a.graph.nodes if n.op_type == "ReduceSumTraining" for t in n.outputs]
    assert len(reduced) == 3 * 2 and all(a.tensors[t].nbytes for t in reduced)
    assert all(a.tensors[t].planner_shape is None for t in reduced)


def test_a_dimension_onnx_names_itself_is_unknown_to_ort():
    """ORT infers bert's weight-gradient views (Reshape of dY to [-1, 128]) as [None, 128]:
    the rows there are a product of the file's ``unk__N`` and 32, which neither ORT nor onnx
    names; onnx's inference names it with a symbol of its own (``unk__M`` past the file's).
    ckpt takes such a dimension as ORT does: unknown before the run (no shape for its
    planner), where the file's own symbols stay ORT's shape."""
    tensors = inspect_model(ZOO / "bert" / "training_model.onnx").analysis.tensors
    view = tensors["/blocks.1/mlp/mlp.2/MatMul_Grad/dY_reshape_2d"]
    assert view.nbytes == 2048 * 128 * 4 and not view.static_shape and view.ort_shape is None
    declared = tensors["/blocks.1/mlp/mlp.2/MatMul_output_0_grad"]
    assert not declared.static_shape and declared.ort_shape is not None
    assert str(declared.ort_shape[0]).startswith("unk__") and declared.ort_shape[1:] == (32, 128)


def test_weight_gradients_of_orts_ops_have_no_shape_before_the_run():
    """ORT 1.19.2's inference gives ConvGrad's and BatchNormalizationGrad's weight gradients
    no shape (their input gradients it sizes), nor GatherGrad's embedding gradient: ckpt
    sizes them all, for ORT's planner none."""
    resnet = inspect_model(ZOO / "resnet_block" / "training_model.onnx").analysis.tensors
    for t in ("4.conv2.weight_grad", "4.bn2.weight_grad", "4.bn2.bias_grad"):
        assert resnet[t].nbytes and not resnet[t].static_shape and resnet[t].ort_shape is None, t
    known = resnet["/4/Relu_output_0_grad"]  # ConvGrad's dX
    assert known.nbytes and (known.static_shape or known.ort_shape is not None)
    gpt = inspect_model(ZOO / "gpt" / "training_model.onnx").analysis.tensors
    assert gpt["tok.weight_grad"].nbytes == 1000 * 128 * 4 and gpt["tok.weight_grad"].ort_shape is None
    assert not gpt["tok.weight_grad"].static_shape


@pytest.mark.parametrize("name", ["bert", "resnet_block", "conformer"])
def test_what_ort_sizes_before_the_run_is_what_ckpt_says(name, training_python, tmp_path):  # noqa: F811
    """Tensor by tensor against ORT's own inferred shapes of the file: every output of a node
    ORT runs as written (its own ops' and onnx's) that ckpt takes as known to ORT's planner
    (a static shape, or one by symbols) has a shape there with no unknown dimension, and the
    reverse."""
    import shutil

    from ckpt_cli.verify.module_model import ort_shapes

    src = ZOO / name / "training_model.onnx"
    shutil.copy(src, tmp_path / "m.onnx")
    ort = ort_shapes(tmp_path / "m.onnx", 600, training_python)
    a = inspect_model(src).analysis
    outputs = set(a.graph.outputs)
    disagree = []
    for node in a.graph.nodes:
        for t in node.outputs:
            if not t or t in outputs or t not in ort:
                continue
            info = a.tensors[t]
            ours = info.static_shape or info.ort_shape is not None
            theirs = ort[t] is not None and all(d is not None for d in ort[t])
            if ours != theirs:
                disagree.append((node.op_type, t, info.shape, ort[t]))
    assert disagree == []
