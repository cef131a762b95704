"""ORT training's own ops: which are recomputed, and the sizes of their outputs.

Random ops of ORT's training and contrib schemas are kept (a recompute would draw a new
mask); ConcatTraining and SplitTraining, deterministic, are recomputed like Concat and
Split. SplitTraining, BroadcastGradientArgs and DivGrad have shape rules, and shapes the
graph computes from known sizes (an ``expand`` by broadcast) are folded: the UNet and
GroupNorm-denoiser artifacts of the zoo have no tensor of unknown size.
"""

from __future__ import annotations

import onnx
import pytest
from onnx import helper

from conftest import SAMPLES
from ckpt_cli.api import inspect_model, rewrite_model
from ckpt_cli.graph import Node
from ckpt_cli.markers import RECOMPUTE_META
from ckpt_cli.ops import ORT_TRAINING_SCHEMAS, RANDOM_OPS, is_recomputable
from ckpt_cli.ort.shapes import broadcast_gradient_axes
from ckpt_cli.planning.decision import fixed_reason

ZOO = SAMPLES / "zoo"


def _node(op: str, domain: str) -> Node:
    return Node.from_proto(0, helper.make_node(op, ["x"], ["y"], name=op, domain=domain))


@pytest.mark.parametrize("op", sorted(op for op, (_, rand) in ORT_TRAINING_SCHEMAS.items() if rand))
def test_random_training_ops_are_never_recomputed(op):
    domain = ORT_TRAINING_SCHEMAS[op][0]
    node = _node(op, domain)
    assert op in RANDOM_OPS
    assert not is_recomputable(node)
    assert fixed_reason(node).code == "random"


def test_every_seeded_schema_of_onnxruntime_is_kept():
    """The installed ORT's schemas (contrib ops included): an op with a seed draws numbers."""
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

    seeded = {(s.domain, s.name) for s in ort_state.get_all_operator_schema() if "seed" in s.attributes}
    assert ("com.microsoft", "BitmaskDropout") in seeded  # the walk sees contrib schemas
    for domain, op in sorted(seeded):
        assert not is_recomputable(_node(op, domain)), (domain, op)


def test_training_concat_and_split_are_recomputable():
    assert is_recomputable(_node("ConcatTraining", "com.microsoft"))
    assert is_recomputable(_node("SplitTraining", "com.microsoft"))
    assert not is_recomputable(_node("ConcatTraining", "com.example"))


def _copied(node: onnx.NodeProto) -> bool:
    return any(p.key == RECOMPUTE_META for p in node.metadata_props)


def _with_trainable_dropout(tmp_path):
    """The zoo's mlp_dropout with ORT training's TrainableDropout (ONNX domain) for Dropout."""
    m = onnx.load(str(ZOO / "mlp_dropout" / "training_model.onnx"))
    for n in m.graph.node:
        if n.op_type == "Dropout":
            n.op_type = "TrainableDropout"
            del n.input[2:]
    path = tmp_path / "trainable_dropout.onnx"
    onnx.save(m, str(path))
    return path


def test_trainable_dropout_is_kept_under_a_region(tmp_path):
    path = _with_trainable_dropout(tmp_path)
    r = rewrite_model(path, tmp_path / "out.onnx", regions=["/*"])
    copies = [n for n in r.model.graph.node if _copied(n)]
    assert copies, "the region recomputes its other nodes"
    assert not any(n.op_type == "TrainableDropout" for n in copies)
    assert sorted(k for reg in r.report["regions"] for k in reg["kept_random"]) == ["/2/Dropout", "/5/Dropout"]


def test_unet_skip_concat_is_recomputed(tmp_path):
    r = rewrite_model(ZOO / "unet" / "training_model.onnx", tmp_path / "out.onnx", regions=["/Concat*"])
    copied = {n.op_type for n in r.model.graph.node if _copied(n)}
    assert copied == {"ConcatTraining"}


@pytest.mark.parametrize("model", ["unet", "denoiser"])
def test_artifacts_have_no_unsized_tensor(model):
    a = inspect_model(ZOO / model / "training_model.onnx").analysis
    assert a.unsized == {}


def test_split_and_divgrad_shapes():
    a = inspect_model(ZOO / "denoiser" / "training_model.onnx").analysis
    t = a.tensors
    # DivGrad, expanded as ORT inlines it: dB is summed back to B's shape (not dY's)
    d_b = next(n for n in a.graph.nodes if n.name == "/gn3/Div_Grad/DivGrad_0/Reshape_11")
    b = next(n for n in a.graph.nodes if n.name == "/gn3/Div_Grad/DivGrad_0/Shape_1").inputs[0]
    assert t[d_b.outputs[0]].shape == t[b].shape == (64, 4, 1)
    a = inspect_model(ZOO / "unet" / "training_model.onnx").analysis
    split = next(n for n in a.graph.nodes if n.op_type == "SplitTraining")
    assert [a.tensors[o].shape for o in split.outputs] == [(64, 32, 32, 32), (64, 16, 32, 32)]


@pytest.mark.parametrize("a,b,axes", [
    ((4, 3, 8), (4, 3, 8), ([], [])),
    ((4, 3, 8), (1, 3, 1), ([], [2, 0])),
    ((4, 1, 8), (3, 1), ([1], [2, 0])),
    ((5,), (2, 3, 5), ([1, 0], [])),
    ((1, 1), (3, 4), ([1, 0], [])),
])
def test_broadcast_gradient_axes(a, b, axes):
    """The rows are what onnxruntime-training 1.19.2's CPU BroadcastGradientArgs returns."""
    assert broadcast_gradient_axes(a, b) == axes


def _nonzero_model(tmp_path):
    from chain import chain_model

    model = chain_model(layers=2, batch=8, width=16)
    model.graph.node.append(helper.make_node("NonZero", ["x"], ["nonzero"], name="/side/NonZero"))
    model.graph.node.append(helper.make_node("Size", ["nonzero"], ["found"], name="/side/Size"))
    model.graph.output.append(helper.make_tensor_value_info("found", onnx.TensorProto.INT64, []))
    path = tmp_path / "nz.onnx"
    onnx.save(model, path)
    return path


@pytest.mark.parametrize("command", [["plan"], ["plan", "--sweep"], ["rewrite", "-o", "{out}"]])
def test_plan_and_rewrite_refuse_unsized_tensors(tmp_path, command):
    from click.testing import CliRunner

    from ckpt_cli.cli import main as cli

    path, out = _nonzero_model(tmp_path), tmp_path / "out.onnx"
    args = [c.format(out=out) for c in command]
    r = CliRunner().invoke(cli, [args[0], str(path), *args[1:]])
    assert r.exit_code == 2, r.output
    assert "size known only at run time" in r.output and "nonzero (NonZero)" in r.output
    assert not out.exists()
    r = CliRunner().invoke(cli, [args[0], str(path), *args[1:], "--allow-unsized"])
    assert r.exit_code == 0, r.output
    if "--sweep" not in args:
        # the headline, then the warning, before anything else
        assert r.output.splitlines()[1].startswith("warning: 1 tensors have unknown size"), r.output[:300]
