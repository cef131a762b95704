"""Recompute copies must survive ONNX Runtime's common-subexpression elimination.

CSE (level BASIC and up) merges nodes with equal op, domain, attributes and inputs, so a
plain copy of a forward node would be merged back into its original and the activation
stashed again. ckpt gives every copy that reads only original tensors an
extra ``__ckpt_recompute`` attribute (the copies downstream of it differ by their inputs). Other optimizers legitimately change the rewritten graph at each level
(ConstantFolding, MatMul+Add -> Gemm, fusions that rename and merge nodes), so the copies
are not counted against the written file but against the same optimization level with
CSE switched off: CSE must then change nothing. A control graph whose copies lack the
guard must lose its copies under CSE, which shows that the test can fail.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import SAMPLES

from ckpt_cli.analysis import analyse
from ckpt_cli.io.load import load_graph
from ckpt_cli.planning import default_regions
from ckpt_cli.markers import CSE_GUARD_ATTR, SUFFIX, is_recompute_copy
from ckpt_cli.rewrite import rewrite
from ckpt_cli.verify.feeds import make_feeds
from ckpt_cli.io.save import build_model

LEVELS = {
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
DISABLE_CSE = ("optimization.disable_specified_optimizers", "CommonSubexpressionElimination")


@pytest.fixture(scope="module")
def gpt():
    """(original model, rewritten model, rewritten model without the CSE guard, #copies, feeds)."""
    a = analyse(load_graph(SAMPLES / "gpt.onnx"))
    res = rewrite(a, default_regions(a), pin=False)  # pinned copies read guarded inputs: CSE cannot match them
    assert res.recompute_nodes > 50
    written = build_model(res.graph, [n.proto for n in res.graph.nodes])
    stripped = onnx.ModelProto()
    stripped.CopyFrom(written)
    removed = 0
    for node in stripped.graph.node:
        kept = [at for at in node.attribute if at.name != CSE_GUARD_ATTR]
        if len(kept) != len(node.attribute):
            removed += 1
            del node.attribute[:]
            node.attribute.extend(kept)
    copies = [n for n in written.graph.node if is_recompute_copy(n)]
    copy_outputs = {t for n in copies for t in n.output}
    roots = sum(1 for n in copies if not copy_outputs.intersection(n.input))
    assert 0 < removed == roots, "every copy that reads only original tensors carries the CSE guard"
    feeds = make_feeds(a.graph.model, 0, {})
    return a.graph.model, written, stripped, res.recompute_nodes, feeds


def _optimize(model: onnx.ModelProto, level, directory, feeds=None, cse: bool = True):
    """Optimize with ORT at ``level``; returns (optimized ModelProto, outputs or None)."""
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    so.intra_op_num_threads = 1  # ScatterND-add in gpt.onnx is racy with more threads
    so.log_severity_level = 3
    path = os.path.join(directory, f"opt_{level}_{int(cse)}_{id(model)}.onnx")
    so.optimized_model_filepath = path
    if not cse:
        so.add_session_config_entry(*DISABLE_CSE)
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    outputs = None
    if feeds is not None:
        outputs = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    return onnx.load(path), outputs


def _signature(model: onnx.ModelProto) -> list[tuple[str, str, str]]:
    return sorted((n.domain, n.op_type, n.name) for n in model.graph.node)


def _copies(model: onnx.ModelProto) -> int:
    # ORT's optimized model drops the metadata of nodes its optimizers touch: in ORT's
    # output the names are all that is left of the copies.
    return sum(SUFFIX in n.name for n in model.graph.node)


@pytest.mark.parametrize("level", list(LEVELS))
def test_copies_survive_cse(gpt, level, tmp_path):
    original, written, stripped, n_copies, feeds = gpt
    lv = LEVELS[level]
    with_cse, _ = _optimize(written, lv, tmp_path)
    without_cse, _ = _optimize(written, lv, tmp_path, cse=False)
    baseline, _ = _optimize(original, lv, tmp_path)
    # CSE merges nothing in the guarded graph: same nodes as with CSE off.
    assert _signature(with_cse) == _signature(without_cse)
    surviving = _copies(with_cse)
    # Other optimizers fold or fuse some copies (weight Transposes into Gemm), not most.
    assert surviving >= 0.75 * n_copies, (surviving, n_copies)
    # The copies are really there as extra nodes, not renamed originals (a fusion or two
    # may apply to the rewritten graph only, hence the margin).
    assert len(with_cse.graph.node) - len(baseline.graph.node) >= 0.95 * surviving

    # Control: the same graph without the guard loses its copies to CSE.
    ctl_with, _ = _optimize(stripped, lv, tmp_path)
    ctl_without, _ = _optimize(stripped, lv, tmp_path, cse=False)
    assert _signature(ctl_without) == _signature(without_cse)  # the guard changes nothing else
    lost = len(ctl_without.graph.node) - len(ctl_with.graph.node)
    assert lost >= 0.75 * surviving, f"CSE merged only {lost} of {surviving} unguarded copies"


@pytest.mark.parametrize("level", list(LEVELS))
def test_outputs_with_optimizations_on(gpt, level, tmp_path):
    """At BASIC the optimized rewrite computes exactly what the optimized original does.
    EXTENDED/ALL fuse differently (e.g. Add+LayerNormalization -> SkipLayerNormalization
    applies in the rewritten forward once its residual sum has no backward reader), so
    float32 results there may differ in the last bits: compare within a tolerance."""
    original, written, _, _, feeds = gpt
    lv = LEVELS[level]
    _, expected = _optimize(original, lv, tmp_path, feeds)
    _, got = _optimize(written, lv, tmp_path, feeds)
    _, reference = _optimize(original, ort.GraphOptimizationLevel.ORT_DISABLE_ALL, tmp_path, feeds)
    assert set(got) == set(expected)
    for name, x in expected.items():
        y = got[name]
        assert x.dtype == y.dtype and x.shape == y.shape, name
        if level == "basic":
            assert x.tobytes() == y.tobytes(), f"{name} differs at BASIC"
        else:
            np.testing.assert_allclose(y, x, rtol=1e-5, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(y, reference[name], rtol=1e-5, atol=1e-6, err_msg=name)
