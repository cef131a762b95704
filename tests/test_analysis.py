"""Analysis details: overrides, symbolic dimensions, IR versions ORT refuses, random ops."""

import json

import numpy as np
import onnx
import onnxruntime as ort
from click.testing import CliRunner

from chain import chain_feeds, chain_model
from ckpt_cli.analysis import analyse
from ckpt_cli.cli import main
from ckpt_cli.io.load import load_graph
from ckpt_cli.markers import is_recompute_copy
from ckpt_cli.planning import layer_regions
from ckpt_cli.rewrite import rewrite
from ckpt_cli.io.save import build_model


def run(*args):
    r = CliRunner().invoke(main, [str(a) for a in args])
    return r.exit_code, r.output


def test_loss_and_grad_output_overrides(chain_path):
    grads = [a for i in range(4) for a in ("--grad-output", f"layers.{i}.weight_grad")]
    code, out = run("inspect", chain_path, "--json", "--loss", "loss", *grads)
    assert code == 0, out
    explicit = json.loads(out)
    auto = json.loads(run("inspect", chain_path, "--json")[1])
    assert explicit["phases"] == auto["phases"] and explicit["gradient_outputs"] == 4
    # Naming only one gradient makes the others forward outputs: then nothing is backward.
    code, out = run("inspect", chain_path, "--grad-output", "layers.0.weight_grad")
    assert code == 2 and "no backward part" in out
    code, out = run("inspect", chain_path, "--loss", "nosuch")
    assert code == 2 and "not an output" in out


def test_symbolic_batch_takes_the_default_and_says_so(tmp_path):
    """ORT training artifacts leave the batch symbolic: every command works without --dim,
    at a value its first lines and its JSON state, and never on a silently partial total."""
    from ckpt_cli.analysis.shapes import DEFAULT_DIM

    model = chain_model(layers=2, batch=8, width=16)
    for v in list(model.graph.input)[:1]:
        v.type.tensor_type.shape.dim[0].dim_param = "batch"
    path = tmp_path / "sym.onnx"
    onnx.save(model, path)
    for command in ("inspect", "plan", "rewrite"):
        args = ["-o", str(tmp_path / "out.onnx"), "--force"] if command == "rewrite" else []
        r = CliRunner().invoke(main, [command, str(path), "--json", *args])
        assert r.exit_code == 0, r.output
        report = json.loads(r.stdout)
        assert report["dims"] == {"batch": {"value": DEFAULT_DIM, "source": "default"}}
        assert not report["unsized"]
        text = CliRunner().invoke(main, [command, str(path), *args]).stdout
        assert text.splitlines()[0].startswith("peak memory (predicted): ")  # the headline, then the sizes
        assert text.splitlines()[1].startswith(f"sizes at batch = {DEFAULT_DIM} (batch: ckpt's default; "
                                               "set with --dim batch=N)"), text[:300]
    defaulted = json.loads(run("inspect", path, "--json")[1])
    explicit = json.loads(run("inspect", path, "--json", "--dim", f"batch={DEFAULT_DIM}")[1])
    assert explicit["dims"] == {"batch": {"value": DEFAULT_DIM, "source": "given"}}
    assert explicit["peak_bytes"] == defaulted["peak_bytes"] and explicit["timeline"] == defaulted["timeline"]
    small = json.loads(run("inspect", path, "--json", "--dim", "batch=8")[1])
    assert not small["unsized"] and 0 < small["peak_bytes"] < defaulted["peak_bytes"]


def test_ir_version_ort_refuses_is_analysed_and_written_loadable(tmp_path):
    model = chain_model(layers=2, batch=8, width=16)
    model.ir_version = 14
    path = tmp_path / "ir14.onnx"
    onnx.save(model, path)
    out = tmp_path / "ir14.ckpt.onnx"
    code, text = run("rewrite", path, "-o", out, "-q")
    assert code == 0, text
    written = onnx.load(out)
    assert written.ir_version <= 10
    ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])


def test_random_ops_are_kept_not_recomputed():
    model = chain_model(layers=3, batch=16, width=32, dropout_layer=1)
    a = analyse(load_graph_from(model))
    result = rewrite(a, layer_regions(a))
    region = next(r for r in result.regions if r.name == "layers.1")
    assert region.kept_random == ["/layers.1/Dropout"]
    assert not any(n.op_type == "Dropout" and is_recompute_copy(n) for n in result.graph.nodes)
    written = build_model(result.graph, [n.proto for n in result.graph.nodes])
    feeds = chain_feeds(model)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    so.intra_op_num_threads = 1
    run_a = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)
    run_b = ort.InferenceSession(written.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)
    for x, y in zip(run_a, run_b):
        assert np.array_equal(x, y)


def load_graph_from(model):
    import tempfile
    from pathlib import Path

    d = tempfile.mkdtemp()
    onnx.save(model, Path(d) / "m.onnx")
    return load_graph(Path(d) / "m.onnx")


def test_reuse_off_derived_from_reuse_on_is_the_same_simulation():
    """``simulate_both`` derives ORT's enable_mem_reuse=False plan from the reuse-on one
    (a take of a freed buffer becomes an allocation of its own): equal, buffer for
    buffer, to walking the order with reuse off, on samples (original and rewritten) and
    random graphs, under both of ORT's orders."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from randgraph import build_random_training_graph

    from ckpt_cli.analysis import schedules
    from ckpt_cli.analysis.memory import simulate, simulate_both
    from ckpt_cli.graph import Graph
    from ckpt_cli.rewrite.select import make_plan

    samples = Path(__file__).resolve().parent.parent / "sample_models"
    graphs = []
    for name in ("gpt", "cnn"):
        a = analyse(load_graph(samples / f"{name}.onnx"))
        r = rewrite(a, make_plan(a).plan)
        graphs += [(a.graph, a.tensors), (r.graph, r.after.tensors)]
    for seed in range(20):
        g = Graph.from_model(build_random_training_graph(seed, 12))
        graphs.append((g, analyse(g).tensors))
    split = 0
    for g, tensors in graphs:
        for order in (schedules.priority_based(g), schedules.ort_default(g)):
            on, off = simulate_both(g, order, tensors)
            assert on == simulate(g, order, tensors, reuse_buffers=True)
            assert off == simulate(g, order, tensors, reuse_buffers=False)
            split += len(off.buffers) > len(on.buffers)
    assert split >= 10  # the derivation had buffers to split, not only copies to make


def test_remembered_arena_peaks_are_the_replayed_ones():
    """The rewrite records the arena peaks it replayed while choosing (unpinned and pinned
    graphs); each equals a fresh replay of the written graph."""
    from pathlib import Path

    from ckpt_cli.analysis.arena import predict_in_use
    from ckpt_cli.analysis.memory import simulate
    from ckpt_cli.rewrite.select import make_plan, rewrite_plan

    samples = Path(__file__).resolve().parent.parent / "sample_models"
    for name in ("gpt", "cnn"):
        a = analyse(load_graph(samples / f"{name}.onnx"))
        planned = make_plan(a)
        for result in (rewrite(a, planned.plan, pin=False), rewrite_plan(a, planned)):
            remembered = result.after.replayed
            assert remembered is not None and result.after.reuse_buffers == result.mem_reuse
            g = result.graph
            profile = simulate(g, list(range(len(g.nodes))), result.after.tensors, reuse_buffers=result.mem_reuse)
            assert remembered == predict_in_use(g, profile, result.after.tensors)  # peak, held bytes, timelines


def test_buffer_roots_follow_view_chains_in_any_file_order():
    """A view's buffer is its source's, through chains of views, whatever order the file
    lists them in; a cycle of views is refused."""
    import pytest
    from onnx import TensorProto, helper

    from ckpt_cli.analysis.memory import buffer_roots
    from ckpt_cli.errors import ModelError
    from ckpt_cli.graph import Graph

    shape = helper.make_tensor("s", TensorProto.INT64, [1], [4])
    nodes = [helper.make_node("Reshape", ["v1", "s"], ["v2"], name="r2"),  # reads a view made below
             helper.make_node("Identity", ["y"], ["v1"], name="r1"),
             helper.make_node("Relu", ["x"], ["y"], name="relu"),
             helper.make_node("Reshape", ["x", "s"], ["v0"], name="r0")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("v2", TensorProto.FLOAT, [4]),
                               helper.make_tensor_value_info("v0", TensorProto.FLOAT, [4])], [shape])
    g = Graph.from_model(helper.make_model(graph))
    assert buffer_roots(g) == {"v2": "y", "v1": "y", "y": "y", "v0": "x"}
    looped = [helper.make_node("Identity", ["b"], ["a"], name="i0"), helper.make_node("Identity", ["a"], ["b"], name="i1")]
    g = Graph.from_model(helper.make_model(helper.make_graph(looped, "g", [], [helper.make_tensor_value_info(
        "a", TensorProto.FLOAT, [1])])))
    with pytest.raises(ModelError):
        buffer_roots(g)
