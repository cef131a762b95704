"""Tests of ckpt_cli.verify: the standalone worker, feeds and the check helpers.

The memory tests use ops that ORT 1.31 CPU neither runs in place nor aliases
(Expand, Neg, ReduceSum, Add), so the arena's bytes in use follow a plain liveness
simulation: a tensor is allocated when its producer runs and freed right after
its last consumer in the executed order; graph inputs are not counted, graph
outputs are; each allocation is rounded up to 256 bytes (BFC arena chunk size).
The measured ``peak_above_baseline_bytes`` must match that estimate within 5%
plus LIVENESS_SLACK = 4 KiB (a few 256-byte chunks of small tensors).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from anywhere without an installed package
    sys.path.insert(0, str(ROOT))

from ckpt_cli import verify as check
from ckpt_cli.errors import RunFailed, RuntimeUnavailable
from ckpt_cli.ort import settings  # noqa: E402
from ckpt_cli.verify.feeds import FeedError, load_feeds, make_feeds, save_feeds  # noqa: E402

MiB = 1 << 20
LIVENESS_SLACK = 4096
CHUNK = 256
X_SHAPE = [256, 1024]            # 1 MiB float32
BIG_SHAPE = [4, 256, 1024]       # 4 MiB float32
K = 3                            # branches


def _save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def _branch_nodes(i: int) -> dict:
    return {
        "E": helper.make_node("Expand", ["X", "big_shape"], [f"E{i}"], name=f"expand{i}"),
        "N": helper.make_node("Neg", [f"E{i}"], [f"N{i}"], name=f"neg{i}"),
        "R": helper.make_node("ReduceSum", [f"N{i}"], [f"R{i}"], keepdims=0, name=f"sum{i}"),
    }


def branches_model(order: str) -> onnx.ModelProto:
    """K independent branches X -> Expand (4 MiB) -> Neg (4 MiB) -> ReduceSum.

    "sequential": each branch runs to its end before the next starts (peak: one
    Expand + one Neg = 8 MiB).  "interleaved": all Expands, then all Negs, then
    all ReduceSums (peak 16 MiB for K = 3).  Same graph, two topological orders.
    """
    br = [_branch_nodes(i) for i in range(K)]
    if order == "sequential":
        nodes = [br[i][k] for i in range(K) for k in "ENR"]
    else:
        nodes = [br[i][k] for k in "ENR" for i in range(K)]
    acc = "R0"
    for i in range(1, K):
        out = "Y" if i == K - 1 else f"S{i}"
        nodes.append(helper.make_node("Add", [acc, f"R{i}"], [out], name=f"acc{i}"))
        acc = out
    g = helper.make_graph(
        nodes, "branches",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, X_SHAPE)],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [])],
        [numpy_helper.from_array(np.array(BIG_SHAPE, np.int64), "big_shape")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def liveness_peak(model: onnx.ModelProto, sizes: dict) -> int:
    """Peak bytes of a plain liveness simulation in file order (see module doc)."""
    g = model.graph
    nodes = list(g.node)
    outputs = {o.name for o in g.output}
    last_use = {}
    for k, n in enumerate(nodes):
        for t in n.input:
            last_use[t] = k
    live: dict = {}
    peak = 0
    for k, n in enumerate(nodes):
        for t in n.output:
            live[t] = -(-sizes[t] // CHUNK) * CHUNK
        peak = max(peak, sum(live.values()))
        for t in list(live):
            if t not in outputs and last_use.get(t, -1) <= k:
                del live[t]
    return peak


def branch_sizes() -> dict:
    sizes = {"Y": 4}
    for i in range(K):
        sizes.update({f"E{i}": 4 * MiB, f"N{i}": 4 * MiB, f"R{i}": 4, f"S{i}": 4})
    return sizes


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("runtime")


@pytest.fixture(scope="module")
def branch_files(workdir):
    seq = _save(branches_model("sequential"), workdir / "sequential.onnx")
    inter = _save(branches_model("interleaved"), workdir / "interleaved.onnx")
    feeds = workdir / "branches_feeds.npz"
    save_feeds(feeds, make_feeds(onnx.load(str(seq)), seed=0))
    return seq, inter, feeds


@pytest.fixture(scope="module")
def measured(branch_files, workdir):
    seq, inter, feeds = branch_files
    out = {}
    for name, path in (("sequential", seq), ("interleaved", inter)):
        out[name] = check.run_model(path, feeds, provider="cpu", settings="ckpt", runs=2,
                                    outputs_path=workdir / f"{name}_out.npz",
                                    worker=check.WorkerOptions(extra_outputs=("timeline",)))
    return out


# --------------------------------------------------------------------------- memory / order


def test_peak_follows_file_order_and_liveness(branch_files, measured):
    seq, inter, _ = branch_files
    sizes = branch_sizes()
    for name, path in (("sequential", seq), ("interleaved", inter)):
        r = measured[name]
        assert r["ok"] and r["method"] == "profiler" and r["provider"] == "CPUExecutionProvider"
        expected = liveness_peak(onnx.load(str(path)), sizes)
        got = r["peak_above_baseline_bytes"]
        assert abs(got - expected) <= 0.05 * expected + LIVENESS_SLACK, (name, got, expected)
        # only the 24-byte shape initializer lives in the arena before the run
        assert 0 <= r["baseline_bytes"] < LIVENESS_SLACK
        assert r["peak_bytes"] == r["baseline_bytes"] + got
        assert len(r["runs"]) == 2 and all(x["peak_bytes"] == r["peak_bytes"] for x in r["runs"])
    # the two orders differ by one Expand + one Neg (8 MiB)
    diff = measured["interleaved"]["peak_bytes"] - measured["sequential"]["peak_bytes"]
    assert abs(diff - 8 * MiB) <= LIVENESS_SLACK


def test_executed_order_is_file_order(branch_files, measured):
    seq, inter, _ = branch_files
    for name, path in (("sequential", seq), ("interleaved", inter)):
        file_order = check.file_node_order(path)
        assert measured[name]["executed_order"] == file_order
        assert check.order_check(file_order, measured[name]["executed_order"]).matches
        assert [t[0] for t in measured[name]["timeline"]] == file_order


def test_outputs_of_two_runs_identical(branch_files, measured, workdir):
    seq, _, feeds = branch_files
    again = workdir / "sequential_again.npz"
    check.run_model(seq, feeds, provider="cpu", settings="ckpt", runs=1, outputs_path=again)
    a = dict(np.load(workdir / "sequential_out.npz"))
    b = dict(np.load(again))
    cmp = check.compare_outputs(a, b)
    assert cmp["all_bit_identical"] and cmp["n_outputs"] == 1 and cmp["max_abs_diff"] == 0.0


def test_check_pair(branch_files):
    seq, inter, feeds = branch_files
    r = check.check_pair(seq, inter, feeds, check.PairOptions(provider="cpu", runs=1))
    assert r.provider == "cpu"
    assert r.outputs_equal and r.max_abs_diff == 0.0
    assert r.order_matches and r.order.compared == 3 * K + K - 1
    assert r.rewritten.ckpt.peak_bytes - r.original.ckpt.peak_bytes > 6 * MiB
    assert r.original.ort_default.peak_bytes > 0
    assert "PRIORITY_BASED" in r.settings_snippet


def test_process_peak_method(branch_files, workdir):
    _, inter, feeds = branch_files
    r = check.run_model(inter, feeds, provider="cpu", settings="ckpt", runs=2,
                        worker=check.WorkerOptions(memory_method="process_peak"))
    assert r["method"] == "process_peak" and r["executed_order"]
    expected = liveness_peak(onnx.load(str(inter)), branch_sizes())
    # page-granular RSS plus small malloc noise
    assert abs(r["peak_bytes"] - expected) <= 0.10 * expected + 512 * 1024, r["runs"]


@pytest.mark.slow
def test_process_peak_under_ort_defaults_keeps_the_arena(branch_files):
    """ORT's defaults are measured with the arena on in a process-peak build too: the
    process holds at least the arena's bytes in use at the peak (the profiler's figure of
    the same session), run after run, and the chunks the arena keeps besides (ORT 1.31:
    17.7 MB against 8.39 MB in use; with the arena off it read 8.26-8.32 MB)."""
    _, inter, feeds = branch_files
    profiled = check.run_model(inter, feeds, provider="cpu", settings="ort_default", runs=2)
    pp = check.WorkerOptions(memory_method="process_peak")
    r = check.run_model(inter, feeds, provider="cpu", settings="ort_default", runs=2, worker=pp)
    defaults = settings.ort_default_session_settings("cpu")
    arena_off = dict(defaults, measurement_only=dict(defaults["measurement_only"], process_peak_with_arena=False))
    off = check.run_model(inter, feeds, provider="cpu", settings=arena_off, runs=2, worker=pp)
    assert profiled["method"] == "profiler" and r["method"] == off["method"] == "process_peak"
    assert all(run["peak_bytes"] >= profiled["peak_bytes"] for run in r["runs"]), (r["runs"], profiled["peak_bytes"])
    assert r["peak_bytes"] > off["peak_bytes"] + 1 * MiB, (r["runs"], off["runs"])


# Another interpreter for the worker: this one by default (the --python plumbing), one with
# onnxruntime-training 1.19.2 when CKPT_ORT_TRAINING_PYTHON names it (tests/test_ort_training.py
# builds such a venv).
OTHER_PYTHONS = [sys.executable] + [p for p in [os.environ.get("CKPT_ORT_TRAINING_PYTHON")] if p]


@pytest.mark.parametrize("python", OTHER_PYTHONS)
def test_worker_under_other_interpreter(branch_files, python):
    _, inter, feeds = branch_files
    r = check.run_model(inter, feeds, provider="cpu", settings="ckpt", runs=1,
                        worker=check.WorkerOptions(python=python))
    assert r["ort_version"] != "" and r["executed_order"] == check.file_node_order(inter)
    if r["method"] == "process_peak":  # 1.19.2 profiler has no mem_* fields
        expected = liveness_peak(onnx.load(str(inter)), branch_sizes())
        assert abs(r["peak_bytes"] - expected) <= 0.10 * expected + 512 * 1024
    else:
        assert r["method"] == "profiler" and r["peak_bytes"] > 0


def test_order_check_reports_mismatch():
    r = check.order_check(["a", "b", "c", "const"], ["a", "c", "b", "Add_7"])
    assert not r.matches
    assert r.first_mismatch is not None and r.first_mismatch.to_json() == {"position": 1, "file": "b", "executed": "c"}
    assert r.not_executed == ("const",) and r.not_in_file == ("Add_7",)


def test_order_check_lists_provider_copies_apart():
    # CUDA runs: ORT's Memcpy nodes between devices are listed, not failed; any other
    # node ORT adds still is.
    r = check.order_check(["a", "b"], ["a", "Memcpy", "b", "Add_7"], ["Add", "MemcpyToHost", "Mul", "Add"])
    assert r.matches and r.provider_copies == ("Memcpy",) and r.n_provider_copies == 1
    assert r.not_in_file == ("Add_7",) and r.n_not_in_file == 1


def test_order_check_per_provider():
    # CUDA runs a CPU stream beside the CUDA one and interleaves them at waits: each
    # device's nodes must follow the file, their interleaving may differ.
    file = ["size", "emb", "mul", "reshape", "mm"]
    provs = {"size": "CPU", "mul": "CPU", "emb": "CUDA", "reshape": "CUDA", "mm": "CUDA"}
    ran = ["emb", "size", "mul", "reshape", "mm"]
    r = check.order_check(file, ran, None, [provs[n] for n in ran])
    assert r.matches and r.nodes_per_provider == {"CUDA": 3, "CPU": 2}
    ran = ["emb", "size", "mul", "mm", "reshape"]
    r = check.order_check(file, ran, None, [provs[n] for n in ran])
    assert not r.matches and r.first_mismatch is not None and r.first_mismatch.provider == "CUDA"
    assert r.first_mismatch.file == "reshape" and r.first_mismatch.executed == "mm"
    # One provider: the whole order is compared, as before.
    assert not check.order_check(file, ran, None, ["CPU"] * 5).matches


# --------------------------------------------------------------------------- providers


def test_cuda_request_is_unavailable_without_gpu(branch_files):
    if check.probe_provider("cuda")[0]:
        pytest.skip("a usable GPU is present")
    seq, _, feeds = branch_files
    with pytest.raises(RuntimeUnavailable) as e:
        check.run_model(seq, feeds, provider="cuda", settings="ckpt", runs=1)
    assert e.value.kind == "provider_unavailable" and "CUDA" in e.value.message
    assert check.resolve_provider("auto") == "cpu"


def test_settings_snippet_builds_session(branch_files, tmp_path, monkeypatch):
    import onnxruntime as ort

    seq, _, _ = branch_files
    (tmp_path / "model.ckpt.onnx").write_bytes(Path(seq).read_bytes())
    monkeypatch.chdir(tmp_path)
    ns: dict = {}
    exec(settings.settings_snippet("cpu"), ns)  # noqa: S102 - our own snippet
    so = ns["so"]
    assert so.execution_order == ort.ExecutionOrder.PRIORITY_BASED
    assert so.graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    assert not so.enable_mem_pattern
    cuda = settings.settings_snippet("cuda")
    assert "kSameAsRequested" in cuda and "HEURISTIC" in cuda
    assert settings.ckpt_session_settings("cpu")["execution_order"] == "PRIORITY_BASED"


# --------------------------------------------------------------------------- feeds


def _training_like_model() -> onnx.ModelProto:
    V, D, B, T, C = 50, 8, 2, 16, 7
    nodes = [
        helper.make_node("Cast", ["ids"], ["ids64"], to=TensorProto.INT64, name="cast"),
        helper.make_node("Gather", ["emb", "ids64"], ["h"], name="gather"),       # [B,T,D]
        helper.make_node("Reshape", ["h", "flat"], ["h2"], name="reshape"),       # [B*T,D]
        helper.make_node("MatMul", ["h2", "head"], ["logits"], name="head_mm"),   # [B*T,C]
        helper.make_node("Unsqueeze", ["labels", "ax1"], ["labels_u"], name="unsq"),
        helper.make_node("Squeeze", ["labels_u", "ax1"], ["labels_s"], name="sq"),
        helper.make_node("SoftmaxCrossEntropyLoss", ["logits", "labels_s"], ["loss0"],
                         reduction="mean", name="xent"),
        helper.make_node("Mul", ["loss0", "tangents_1"], ["loss"], name="seed"),
        helper.make_node("Add", ["w_grad.accumulation.buffer", "tangents_1"], ["acc"], name="acc"),
        helper.make_node("Not", ["lazy_reset_grad"], ["not_reset"], name="not"),
        helper.make_node("Gather", ["pos_table", "pos"], ["pe"], axis=0, name="pos_gather"),
    ]
    inits = [
        numpy_helper.from_array(np.random.RandomState(0).randn(V, D).astype(np.float32), "emb"),
        numpy_helper.from_array(np.random.RandomState(1).randn(D, C).astype(np.float32), "head"),
        numpy_helper.from_array(np.array([-1, D], np.int64), "flat"),
        numpy_helper.from_array(np.array([1], np.int64), "ax1"),
        numpy_helper.from_array(np.zeros((5, D), np.float32), "pos_table"),
    ]
    f = TensorProto.FLOAT
    g = helper.make_graph(nodes, "train", [
        helper.make_tensor_value_info("ids", TensorProto.INT32, ["batch", T]),
        helper.make_tensor_value_info("labels", TensorProto.INT64, [B * T]),
        helper.make_tensor_value_info("tangents_1", f, []),
        helper.make_tensor_value_info("w_grad.accumulation.buffer", f, [3]),
        helper.make_tensor_value_info("lazy_reset_grad", TensorProto.BOOL, [1]),
        helper.make_tensor_value_info("pos", TensorProto.INT64, [T]),
        helper.make_tensor_value_info("x", f, [B, D]),
    ], [helper.make_tensor_value_info("loss", f, []),
        helper.make_tensor_value_info("acc", f, [3]),
        helper.make_tensor_value_info("not_reset", TensorProto.BOOL, [1]),
        helper.make_tensor_value_info("pe", f, [T, D])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_make_feeds_valid_indices_and_special_inputs(tmp_path):
    m = _training_like_model()
    feeds = make_feeds(m, seed=3, dims={"batch": 2})
    assert feeds["ids"].dtype == np.int32 and feeds["ids"].shape == (2, 16)
    assert feeds["ids"].min() >= 0 and feeds["ids"].max() < 50
    assert len(np.unique(feeds["ids"])) > 2          # really uses the vocabulary
    assert feeds["labels"].min() >= 0 and feeds["labels"].max() < 7
    assert feeds["pos"].max() < 5                    # Gather on a small table
    assert np.all(feeds["tangents_1"] == 1.0)
    assert np.all(feeds["w_grad.accumulation.buffer"] == 0.0)
    assert feeds["lazy_reset_grad"].dtype == np.bool_ and feeds["lazy_reset_grad"].all()
    assert feeds["x"].dtype == np.float32 and 0 < feeds["x"].std() < 0.5
    again = make_feeds(m, seed=3, dims={"batch": 2})
    assert all(np.array_equal(feeds[k], again[k]) for k in feeds)
    assert not np.array_equal(make_feeds(m, seed=4, dims={"batch": 2})["x"], feeds["x"])
    # and ORT runs the model with them
    model_path = _save(m, tmp_path / "train.onnx")
    feeds_path = tmp_path / "feeds.npz"
    save_feeds(feeds_path, feeds)
    assert set(load_feeds(feeds_path, m)) == set(feeds)
    r = check.run_model(model_path, feeds_path, provider="cpu", settings="ckpt", runs=1)
    assert r["ok"] and "gather" in r["executed_order"]


def test_symbolic_dim_needs_a_size():
    with pytest.raises(FeedError, match=r"'ids'.*'batch'"):
        make_feeds(_training_like_model())


def test_load_feeds_errors_name_the_input(tmp_path):
    m = _training_like_model()
    good = make_feeds(m, dims={"batch": 2})

    def write(**changes):
        d = dict(good)
        for k, v in changes.items():
            if v is None:
                d.pop(k)
            else:
                d[k] = v
        p = tmp_path / "f.npz"
        np.savez(p, **d)
        return p

    with pytest.raises(FeedError, match="missing feed for input 'labels'"):
        load_feeds(write(labels=None), m)
    with pytest.raises(FeedError, match="'ids'.*dtype int64"):
        load_feeds(write(ids=good["ids"].astype(np.int64)), m)
    with pytest.raises(FeedError, match="'x'.*shape"):
        load_feeds(write(x=np.zeros((3, 8), np.float32)), m)
    with pytest.raises(FeedError, match="'bogus'"):
        load_feeds(write(bogus=np.zeros(1)), m)
    with pytest.raises(FeedError, match="dimension 'batch'"):
        m2 = onnx.ModelProto()
        m2.CopyFrom(m)
        m2.graph.input[6].type.tensor_type.shape.dim[1].dim_param = "batch"  # x: [2, 8]
        load_feeds(write(), m2)


def test_worker_reports_bad_feeds(branch_files, tmp_path):
    seq, _, _ = branch_files
    bad = tmp_path / "bad.npz"
    np.savez(bad, X=np.zeros(X_SHAPE, np.float64))
    with pytest.raises(RunFailed) as e:
        check.run_model(seq, bad, provider="cpu", settings="ckpt", runs=1)
    assert e.value.kind == "bad_feeds" and "'X'" in e.value.message


def test_compare_outputs():
    a = {"y": np.array([1.0, np.nan, 3.0], np.float32), "z": np.arange(3), "w": np.ones(2)}
    b = {"y": np.array([1.0, np.nan, 3.0 + 3e-6], np.float32), "z": np.arange(3),
         "v": np.ones(1)}
    r = check.compare_outputs(a, b, rtol=1e-5, atol=0)
    assert not r["outputs"]["y"]["bit_identical"] and r["outputs"]["y"]["within_tolerance"]
    assert 0 < r["outputs"]["y"]["max_abs_diff"] < 1e-5
    assert r["outputs"]["z"]["bit_identical"]
    assert r["missing"] == ["w"] and r["extra"] == ["v"]
    assert r["n_outputs"] == 4 and r["n_bit_identical"] == 1 and r["n_failed"] == 2
    assert not r["all_within_tolerance"]
