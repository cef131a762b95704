"""ckpt's guards leave ORT's fusions of the original's nodes as they were.

A fused kernel rounds otherwise than the ops it replaces (FusedMatMul with ``transB`` against
a MatMul after a Transpose, Gemm with swapped operands against Gemm then Transpose). A view
that ckpt's fresh tensors or pin guards put between two nodes ORT fuses, or a ``Size`` that
reads the first one's output, stops the fusion: the zoo GPT's rewrite, trained by the Module
API with ORT's defaults, then lost 1 ulp on its second loss. Here both graphs are optimized by
onnxruntime-training 1.19.2 at ORT_ENABLE_ALL: every node of the original ends in the same
fusion (a node the rewrite recomputes may fuse further, its backward readers gone to the
copy: BiasGelu), every copy in its source's, and ten training steps give the same losses
and gradients bit for bit, untuned and under the recorded settings.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import onnx
import pytest

from conftest import ROOT, SAMPLES
from test_ort_training import training_python  # noqa: F401 - the fixture
from ckpt_cli import inspect_model
from ckpt_cli.markers import recompute_source
from ckpt_cli.io.session import recorded_settings
from ckpt_cli.verify.feeds import make_feeds, save_feeds

GPT = SAMPLES / "zoo" / "gpt" / "training_model.onnx"
STEPS = 10
pytestmark = pytest.mark.slow


def fusions(source: onnx.GraphProto, optimized: onnx.GraphProto) -> dict[str, str]:
    """Per node of ``source``, what ORT made of it: "kept", the fused node named after it
    ("FusedMatMul by MatmulTransposeFusion"), or "gone" (into another node's fusion)."""
    ops = {n.name: n.op_type for n in optimized.node}
    out = {}
    for n in source.node:
        if ops.get(n.name) == n.op_type:
            out[n.name] = "kept"
            continue
        pattern = re.compile(re.escape(n.name) + r"/(\w+)/")
        fused = [f"{m.op_type} by {hit.group(1)}" for m in optimized.node if (hit := pattern.fullmatch(m.name))]
        out[n.name] = fused[0] if fused else "gone"
    return out


@pytest.fixture(scope="module")
def runs(training_python, tmp_path_factory) -> dict:  # noqa: F811
    tmp = tmp_path_factory.mktemp("fusions_kept")
    rewritten = tmp / "gpt.ckpt.onnx"
    r = subprocess.run([sys.executable, "-m", "ckpt_cli.cli", "rewrite", GPT, "-o", rewritten], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    feeds = tmp / "feeds.npz"
    save_feeds(feeds, make_feeds(onnx.load(str(GPT), load_external_data=False), 0,
                                 dict(inspect_model(GPT).analysis.dims)))
    spec = {"models": [str(GPT), str(rewritten)], "feeds": str(feeds), "steps": STEPS,
            "settings": recorded_settings(rewritten), "out_dir": str(tmp)}
    r = subprocess.run([training_python, str(ROOT / "tests" / "fixtures" / "fused_steps.py")],
                       input=json.dumps(spec), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads(r.stdout)
    graphs = {}
    for side, path in (("original", GPT), ("rewritten", rewritten)):
        graphs[side] = (onnx.load(str(path), load_external_data=False).graph,
                        onnx.load(result[str(path)]["optimized"], load_external_data=False).graph)
    return {"graphs": graphs, "original": result[str(GPT)], "rewritten": result[str(rewritten)]}


def test_the_rewrite_recomputes(runs):
    assert sum(recompute_source(n) is not None for n in runs["graphs"]["rewritten"][0].node) > 0


def test_the_originals_nodes_fuse_as_in_the_original(runs):
    before, after = (fusions(*runs["graphs"][side]) for side in ("original", "rewritten"))
    copied = {recompute_source(n) for n in runs["graphs"]["rewritten"][0].node} - {None}
    assert any(kind != "kept" for kind in before.values())  # ORT fuses something: not vacuous
    changed = {n: (before[n], after[n]) for n in before
               if before[n] != after[n] and not (n in copied and before[n] == "kept")}
    assert changed == {}


def test_each_copy_fuses_as_its_source_did(runs):
    before, after = (fusions(*runs["graphs"][side]) for side in ("original", "rewritten"))
    sources = {n.name: recompute_source(n) for n in runs["graphs"]["rewritten"][0].node}
    changed = {c: (before[s], after[c]) for c, s in sources.items() if s is not None and before[s] != after[c]}
    assert changed == {}


@pytest.mark.parametrize("session", ["untuned", "settings"])
def test_training_steps_are_bit_identical(runs, session):
    original, rewritten = runs["original"][session], runs["rewritten"][session]
    assert min(original["grads_nonzero"]) > original["params"] // 2  # the gradients were written
    assert rewritten["losses_hex"] == original["losses_hex"]
    assert rewritten["grads_sha256"] == original["grads_sha256"]
