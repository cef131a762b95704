"""Checks for the two training-graph generators: tests/fixtures/synthetic (bench.synthetic's too) and
tests/randgraph."""

from __future__ import annotations

import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)

from randgraph import build_random_training_graph, param_names, random_feeds, training_graphs  # noqa: E402
import synthetic  # noqa: E402
from synthetic import build_transformer, estimate_nodes, save_transformer  # noqa: E402

TINY = dict(layers=2, d_model=16, heads=4, seq=8, batch=2, vocab=32)


def _session(model_or_path, threads=1):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    src = model_or_path if isinstance(model_or_path, str) else model_or_path.SerializeToString()
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])


def _transformer_feeds(model, seed=0):
    rng = np.random.default_rng(seed)
    feeds = {}
    for vi in model.graph.input:
        tt = vi.type.tensor_type
        dt = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        shape = [d.dim_value for d in tt.shape.dim]
        if vi.name in ("tokens", "labels"):
            feeds[vi.name] = rng.integers(0, TINY["vocab"], shape)
        elif vi.name == "tangent_loss":
            feeds[vi.name] = np.array(1.0, dt)
        elif len(shape) == 1:  # norm scales around 1, biases around 0
            base = 1.0 if vi.name.endswith(".weight") else 0.0
            feeds[vi.name] = (base + 0.2 * rng.standard_normal(shape)).astype(dt)
        else:
            feeds[vi.name] = (0.3 * rng.standard_normal(shape)).astype(dt)
    return feeds


def _central_difference(sess, feeds: dict, name: str, idx: tuple, eps: float) -> float:
    """d loss / d feeds[name][idx] by central differences."""
    losses = []
    for step in (eps, -eps):
        moved = feeds[name].copy()
        moved[idx] += step
        losses.append(sess.run(["loss"], {**feeds, name: moved})[0])
    return (losses[0] - losses[1]) / (2 * eps)


def _check_structure(model):
    g = model.graph
    assert model.ir_version <= 10
    names = [n.name for n in g.node]
    assert len(set(names)) == len(names), "node names must be unique"
    known = {i.name for i in g.input} | {i.name for i in g.initializer}
    for n in g.node:  # file order is topological
        for t in n.input:
            assert t == "" or t in known, f"{n.name} reads {t} before it is produced"
        known.update(n.output)
    outs = [o.name for o in g.output]
    assert outs[0] == "loss"
    params = [i.name for i in g.input if i.name not in ("tokens", "labels", "x", "tangent_loss")]
    assert outs[1:] == [f"{p}_grad" for p in params]


# --------------------------------------------------------------------------- transformer


def test_transformer_float64_matches_finite_differences():
    model = build_transformer(**TINY, dtype=np.float64)
    onnx.checker.check_model(model, full_check=True)
    _check_structure(model)
    sess = _session(model)
    feeds = _transformer_feeds(model)
    names = [o.name for o in model.graph.output]
    res = dict(zip(names, sess.run(None, feeds)))
    assert np.isfinite(res["loss"]) and res["loss"] > 0
    rng = np.random.default_rng(1)
    eps = 1e-5
    for out in names[1:]:
        p, g = out[: -len("_grad")], res[out]
        assert g.shape == feeds[p].shape
        assert np.abs(g).max() > 0, f"{out} is identically zero"
        for _ in range(4):
            idx = tuple(int(rng.integers(0, d)) for d in g.shape)
            if p == "tok_emb":  # rows of tokens that occur have non-zero grads
                idx = (int(feeds["tokens"].flat[rng.integers(feeds["tokens"].size)]),) + idx[1:]
            fd = _central_difference(sess, feeds, p, idx, eps)
            assert abs(fd - g[idx]) <= 1e-8 + 1e-5 * abs(fd), (out, idx, fd, g[idx])


@pytest.mark.parametrize("gelu,fused", [("erf", True), ("tanh", True), ("erf", False)])
def test_transformer_float32_variants_directional_derivative(gelu, fused):
    """float32 (Erf / LayerNormalization have no double kernel on ORT CPU): check each
    gradient against a finite difference along a random direction."""
    model = build_transformer(**TINY, gelu=gelu, fused_layernorm=fused)
    onnx.checker.check_model(model, full_check=True)
    _check_structure(model)
    assert len(model.graph.node) == estimate_nodes(TINY["layers"], fused, gelu)
    sess = _session(model)
    feeds = _transformer_feeds(model)
    names = [o.name for o in model.graph.output]
    res = dict(zip(names, sess.run(None, feeds)))
    rng = np.random.default_rng(2)
    eps = 1e-2
    for out in names[1:]:
        p, g = out[: -len("_grad")], res[out].astype(np.float64)
        v = rng.standard_normal(g.shape)
        v /= np.linalg.norm(v)
        f2 = dict(feeds)
        f2[p] = (feeds[p] + eps * v).astype(np.float32)
        lp = float(sess.run(["loss"], f2)[0])
        f2[p] = (feeds[p] - eps * v).astype(np.float32)
        lm = float(sess.run(["loss"], f2)[0])
        fd = (lp - lm) / (2 * eps)
        an = float((g * v).sum())
        assert abs(fd - an) <= 5e-4 + 2e-2 * abs(an), (out, fd, an)


def test_transformer_gradients_deterministic_across_threads():
    model = build_transformer(**TINY)
    feeds = _transformer_feeds(model)
    a = _session(model, threads=1).run(None, feeds)
    b = _session(model, threads=4).run(None, feeds)
    c = _session(model, threads=4).run(None, feeds)
    for x, y, z in zip(a, b, c):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
        assert np.array_equal(y, z)


def test_transformer_node_counts_and_names():
    # 142 nodes per layer + 48 (default: decomposed LayerNorm, tanh GELU)
    for layers in (1, 7, 70):
        m = build_transformer(layers)
        assert len(m.graph.node) == estimate_nodes(layers) == 142 * layers + 48
    m = build_transformer(7)  # the ~1k-node benchmark size
    assert 1000 <= len(m.graph.node) <= 1100
    _check_structure(m)
    names = [n.name for n in m.graph.node]
    assert "/blocks.3/attn/MatMul_1" in names
    assert any(n.startswith("/blocks.3/attn/MatMul_1_grad/") for n in names)
    assert [o.name for o in m.graph.output][:3] == ["loss", "tok_emb_grad", "pos_emb_grad"]
    assert {i.name for i in m.graph.input} >= {"tokens", "labels", "tangent_loss", "blocks.6.attn.wq"}
    assert all(n.domain == "" for n in m.graph.node)
    big = build_transformer(200)  # its speed is a bench row (bench/run.py, "generate"), not a test
    assert len(big.graph.node) == estimate_nodes(200)


def test_transformer_embedded_weights_and_external_data(tmp_path):
    # weight_scale_mb raises d_model until the parameters reach the target size
    d = synthetic.big_weights_d_model(8 * 2**20, 2, 16, 4, 8, 32, 4)
    assert synthetic.count_params(2, d, 8, 32, 4) * 4 >= 8 * 2**20
    assert synthetic.count_params(2, d - 32, 8, 32, 4) * 4 < 8 * 2**20
    kw = dict(TINY, d_model=16, weight_scale_mb=8.0)
    path = str(tmp_path / "w.onnx")
    info = save_transformer(path, external_data=True, **kw)
    assert info["d_model"] == d and info["external_data"]
    assert os.path.getsize(path + ".data") >= 8 * 2**20
    assert os.path.getsize(path) < 1 * 2**20
    onnx.checker.check_model(path, full_check=True)
    mem = build_transformer(**kw)  # same seed, in memory
    on_disk = onnx.load(path)
    for a, b in zip(mem.graph.initializer, on_disk.graph.initializer):
        if a.name == "blocks.1.attn.wq":
            np.testing.assert_array_equal(onnx.numpy_helper.to_array(a), onnx.numpy_helper.to_array(b))
    sess = _session(path)
    fixed = {"tokens": np.zeros((2, 8), np.int64), "labels": np.ones((2, 8), np.int64),
             "tangent_loss": np.array(1.0, np.float32)}
    out = sess.run(None, fixed)  # parameters come from the embedded defaults
    assert all(np.isfinite(o).all() for o in out)
    # the CLI
    cli_path = str(tmp_path / "cli.onnx")
    assert synthetic.main(["--layers", "1", "--d-model", "16", "--external-data", "-o", cli_path]) == 0
    onnx.checker.check_model(cli_path, full_check=True)


# --------------------------------------------------------------------------- randgraph


@pytest.mark.parametrize("seed", range(20))
def test_randgraph_matches_finite_differences(seed):
    model = build_random_training_graph(seed, n_ops=4 + seed % 13)
    onnx.checker.check_model(model, full_check=True)
    _check_structure(model)
    assert all(n.name.startswith(("fwd_", "bwd_")) for n in model.graph.node)
    feeds = random_feeds(model, seed)
    model = _frozen_dropout(model, feeds)  # finite differences need the same masks every run
    sess = _session(model)
    names = [o.name for o in model.graph.output]
    res = dict(zip(names, sess.run(None, feeds)))
    eps = 1e-6
    for p in param_names(model):
        g = res[f"{p}_grad"]
        fd = np.empty_like(g)
        for idx in np.ndindex(g.shape):
            fd[idx] = _central_difference(sess, feeds, p, idx, eps)
        scale = max(1.0, float(np.abs(fd).max()))
        np.testing.assert_allclose(g, fd, rtol=1e-5, atol=1e-6 * scale, err_msg=p)


def _frozen_dropout(model: onnx.ModelProto, feeds: dict) -> onnx.ModelProto:
    """The model with each Dropout replaced by a multiplication with the mask and scale it
    drew in a first run (ratio 0.5)."""
    from onnx import helper, numpy_helper

    drops = [n for n in model.graph.node if n.op_type == "Dropout"]
    if not drops:
        return model
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    masks = []
    for n in probe.graph.node:
        if n.op_type == "Dropout":
            if len(n.output) < 2:
                n.output.append(f"{n.name}_mask")
            masks.append(n.output[1])
            probe.graph.output.append(helper.make_tensor_value_info(n.output[1], onnx.TensorProto.BOOL, None))
    drawn = dict(zip(masks, _session(probe).run(masks, feeds)))
    out = onnx.ModelProto()
    out.CopyFrom(model)
    dtype = helper.tensor_dtype_to_np_dtype(model.graph.input[0].type.tensor_type.elem_type)
    nodes = []
    for n, mask in zip(drops, masks):
        scale = f"{n.name}_frozen_scale"
        out.graph.initializer.append(numpy_helper.from_array(drawn[mask].astype(dtype) * 2, scale))
        nodes.append(helper.make_node("Mul", [n.input[0], scale], [n.output[0]], name=n.name))
        if len(n.output) > 1:
            out.graph.initializer.append(numpy_helper.from_array(drawn[mask], f"{n.name}_frozen_mask"))
            nodes.append(helper.make_node("Identity", [f"{n.name}_frozen_mask"], [n.output[1]], name=f"{n.name}_m"))
    by_name = {n.name: k for k, n in enumerate(drops)}
    kept = []
    for n in out.graph.node:
        if n.op_type == "Dropout":
            k = by_name[n.name]
            kept.extend(x for x in nodes if x.name in (drops[k].name, f"{drops[k].name}_m"))
        else:
            kept.append(n)
    del out.graph.node[:]
    out.graph.node.extend(kept)
    return out


def test_randgraph_is_deterministic():
    a = build_random_training_graph(123, 10)
    b = build_random_training_graph(123, 10)
    assert a.SerializeToString() == b.SerializeToString()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(training_graphs(max_ops=12))
def test_randgraph_strategy_produces_runnable_graphs(model):
    onnx.checker.check_model(model, full_check=True)
    _check_structure(model)
    out = _session(model).run(None, random_feeds(model))
    assert all(np.isfinite(o).all() for o in out)
