"""The bad-input matrix (issue 11): every row runs the command line on something wrong and
asserts the documented exit code, one line on stderr starting ``ckpt: error:``, no
traceback, and that no file in the folder changed and none appeared."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import threading
from pathlib import Path
from typing import Callable

import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper

from chain import chain_model
from ckpt_cli.cli import main
from conftest import SAMPLES


def _chain(folder: Path, change: Callable[[onnx.ModelProto], None] | None = None, name="m.onnx") -> Path:
    m = chain_model(layers=2, batch=8, width=16)
    if change:
        change(m)
    onnx.save(m, folder / name)
    return folder / name


def _ext(folder: Path, **fields) -> Path:
    """The chain with its weights in ``m.onnx.data``; ``fields`` override a tensor's external data."""
    m = chain_model(layers=2, batch=8, width=16)
    keep = [v for v in m.graph.input if not v.name.startswith("layers.")]
    for v in [v for v in m.graph.input if v.name.startswith("layers.")]:
        m.graph.initializer.append(onnx.numpy_helper.from_array(
            __import__("numpy").ones((16, 16), "float32"), v.name))
    del m.graph.input[:]
    m.graph.input.extend(keep)
    onnx.save(m, folder / "m.onnx", save_as_external_data=True, location="m.onnx.data", size_threshold=0)
    if fields:
        m = onnx.load(folder / "m.onnx", load_external_data=False)
        t = next(t for t in m.graph.initializer if t.data_location == TensorProto.EXTERNAL)
        for e in t.external_data:
            if e.key in fields:
                e.value = fields.pop(e.key)
        for k, v in fields.items():
            entry = t.external_data.add()
            entry.key, entry.value = k, v
        onnx.save(m, folder / "m.onnx")
    return folder / "m.onnx"


def _write(folder: Path, name: str, data: bytes | str) -> Path:
    p = folder / name
    p.write_bytes(data if isinstance(data, bytes) else data.encode())
    return p


def _cycle(m):
    m.graph.node[0].input[0] = m.graph.node[1].output[0]


def _inference(m):
    del m.graph.output[1:]


def _dangling_read(m):
    m.graph.node[1].input[0] = "ghost"


def _phantom_output(m):
    m.graph.output.append(helper.make_tensor_value_info("phantom", TensorProto.FLOAT, [1]))


def _no_opset(m):
    del m.opset_import[:]


def _negative_dim(m):
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = -3


def _huge_batch(m):
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1 << 50


def _symbolic(m):
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"


def _extra_output(m):
    m.graph.output.append(onnx.helper.make_tensor_value_info("a0", onnx.TensorProto.FLOAT, [8, 16]))


def _bad_dtype(m):
    m.graph.input[0].type.tensor_type.elem_type = 99


def _untyped_output(m):
    m.graph.output[-1].type.tensor_type.elem_type = TensorProto.UNDEFINED


def _relabelled_initializer(m):
    """An int64 initializer relabelled int32: its 8 bytes now hold two elements where its shape says one."""
    t = onnx.numpy_helper.from_array(__import__("numpy").array([2], "int64"), "two")
    t.data_type = TensorProto.INT32
    m.graph.initializer.append(t)


def _long_name(m):
    m.graph.node[0].name = "a" * 40 + "!"


def _fifo(folder: Path, name: str) -> Path:
    os.mkfifo(folder / name)
    return folder / name


def _pickled(folder: Path) -> Path:
    import numpy as np

    np.save(folder / "feeds.npy", np.array([{"x": 1}], dtype=object), allow_pickle=True)
    return folder / "feeds.npy"


def _plan(folder: Path, plan) -> Path:
    return _write(folder, "plan.json", json.dumps(plan))


# Each row: id, setup(folder) -> argv (paths as str), expected exit code, a word of the message.
ROWS: list[tuple[str, Callable[[Path], list], int, str]] = [
    ("missing file", lambda f: ["inspect", f / "nope.onnx"], 2, "no such file"),
    ("folder as model", lambda f: ["inspect", f], 2, "directory"),
    ("empty file", lambda f: ["inspect", _write(f, "e.onnx", b"")], 2, "empty"),
    ("text file", lambda f: ["inspect", _write(f, "t.onnx", "hello, world\n" * 20)], 2, "ONNX"),
    ("truncated gpt", lambda f: ["rewrite", _write(f, "t.onnx", (SAMPLES / "gpt.onnx").read_bytes()[:444298]),
                                 "-o", f / "o.onnx"], 2, ""),
    ("cycle", lambda f: ["inspect", _chain(f, _cycle)], 2, ""),
    ("inference model", lambda f: ["rewrite", _chain(f, _inference), "-o", f / "o.onnx"], 2, "backward"),
    ("region matching nothing", lambda f: ["rewrite", _chain(f), "--region", "nothing*", "-o", f / "o.onnx"],
     2, "nothing"),
    ("initializer bytes for another type", lambda f: ["inspect", _chain(f, _relabelled_initializer)], 2,
     "tensor 'two' needs 4 bytes for its shape and type but its raw_data holds 8"),
    ("backtracking --region", lambda f: ["rewrite", _chain(f, _long_name), "--region", "re:(a+)+$",
                                         "-o", f / "o.onnx"], 2, "matches no forward node"),
    ("backtracking --regions-by-scope", lambda f: ["rewrite", _chain(f, _long_name), "--regions-by-scope", "((a+)+)$",
                                                  "-o", f / "o.onnx"],
     2, "matches no forward node"),
    ("backreference --region", lambda f: ["rewrite", _chain(f), "--region", r"re:(l)\1", "-o", f / "o.onnx"], 2,
     "no backreferences"),
    ("lookahead --regions-by-scope", lambda f: ["rewrite", _chain(f), "--regions-by-scope", "(?=layers)(x)",
                                               "-o", f / "o.onnx"], 2,
     "no backreferences or lookaround"),
    ("-o the input", lambda f: ["rewrite", _chain(f), "-o", f / "m.onnx", "--force"], 2, "input"),
    ("-o a link to the input", lambda f: ["rewrite", _chain(f), "-o", _link(f, "l.onnx", "m.onnx"), "--force"],
     2, "input"),
    ("-o exists", lambda f: ["rewrite", _chain(f), "-o", _write(f, "o.onnx", "old")], 2, "--force"),
    ("-o the input's data", lambda f: ["rewrite", _ext(f), "-o", f / "m.onnx.data", "--force"], 2, "external data"),
    ("-o /dev/null", lambda f: ["rewrite", _chain(f), "-o", "/dev/null", "--force"], 2, "regular file"),
    ("-o a FIFO", lambda f: ["rewrite", _chain(f), "-o", _fifo(f, "p"), "--force"], 2, "regular file"),
    ("plan -o a FIFO", lambda f: ["plan", _chain(f), "-o", _fifo(f, "p"), "--force"], 2, "regular file"),
    ("-o in a missing folder", lambda f: ["rewrite", _chain(f), "-o", f / "no" / "o.onnx"], 2, "folder"),
    ("--report /dev/full", lambda f: ["inspect", _chain(f), "--report", "/dev/full"], 2, "regular file"),
    ("--report /dev/stdout", lambda f: ["inspect", _chain(f), "--report", "/dev/stdout"], 2, "/dev/stdout"),
    ("plan -o a dangling link", lambda f: ["plan", _chain(f), "-o", _link(f, "d.json", "gone/x.json"), "--force"],
     2, "symbolic link"),
    ("plan -o /proc", lambda f: ["plan", _chain(f), "-o", "/proc/x.json"], 2, "cannot write"),
    ("read never produced", lambda f: ["inspect", _chain(f, _dangling_read)], 2, "ghost"),
    ("output never produced", lambda f: ["rewrite", _chain(f, _phantom_output), "-o", f / "o.onnx"], 2, "phantom"),
    ("no opset", lambda f: ["rewrite", _chain(f, _no_opset), "-o", f / "o.onnx"], 2, "opset"),
    ("negative dim", lambda f: ["inspect", _chain(f, _negative_dim)], 2, "negative"),
    ("a tensor beyond int64 bytes", lambda f: ["inspect", _chain(f, _huge_batch)], 2, "more than 256 TiB"),
    ("unknown dtype", lambda f: ["inspect", _chain(f, _bad_dtype)], 2, ""),
    ("untyped output", lambda f: ["rewrite", _chain(f, _untyped_output), "-o", f / "o.onnx"], 2, "element type"),
    ("huge --dim", lambda f: ["inspect", _chain(f, _symbolic), "--dim", "batch=" + "9" * 30], 2, "out of range"),
    ("unknown --dim", lambda f: ["inspect", _chain(f), "--dim", "nosuch=3"], 2, "nosuch"),
    ("data at /etc/passwd", lambda f: ["rewrite", _ext(f, location="/etc/passwd"), "-o", f / "o.onnx"], 2,
     "absolute"),
    ("data via ..", lambda f: ["rewrite", _ext(f, location="../../../../etc/passwd"), "-o", f / "o.onnx"], 2,
     "outside"),
    ("data in a FIFO", lambda f: ["rewrite", _ext(f, location="p"), "-o", f / "o.onnx"] if _fifo(f, "p") else [],
     2, "regular file"),
    ("data link to /dev/zero", lambda f: ["inspect", _ext(f, location="z")] if _link(f, "z", "/dev/zero") else [],
     2, "symbolic link"),
    ("data offset beyond", lambda f: ["inspect", _ext(f, offset="99999999")], 2, "only"),
    ("data offset malformed", lambda f: ["inspect", _ext(f, offset="1e3")], 2, "malformed"),
    ("data missing", lambda f: ["inspect", _ext(f, location="gone.data")], 2, "missing"),
    ("plan: string for a list", lambda f: ["rewrite", _chain(f), "--plan", _plan(f, {"regions": [{"nodes": "abc"}]}),
                                           "-o", f / "o.onnx"], 2, "list"),
    ("plan: ckpt_plan true", lambda f: ["rewrite", _chain(f), "--plan",
                                        _plan(f, {"ckpt_plan": True, "regions": [{"match": "*"}]}),
                                        "-o", f / "o.onnx"], 2, "not supported"),
    ("plan: keep outside", lambda f: ["rewrite", _chain(f), "--plan", _plan(
        f, {"regions": [{"nodes": ["/layers.0/MatMul"], "keep": ["a1"]}]}), "-o", f / "o.onnx"], 2, "outside"),
    ("plan: not JSON", lambda f: ["rewrite", _chain(f), "--plan", _write(f, "plan.json", "{"), "-o", f / "o.onnx"],
     2, "JSON"),
    ("compare different models", lambda f: ["compare", SAMPLES / "mlp.onnx", SAMPLES / "cnn.onnx"], 2, "different"),
    ("compare a bad report", lambda f: ["compare", _chain(f), _write(f, "r.json", '{"command": "inspect"}')], 2,
     "schema_version"),
    ("--fail-if infinite", lambda f: ["compare", _chain(f), "--fail-if", "peak_bytes>1e999"], 2, "out of range"),
    ("--report the output's data name", lambda f: ["rewrite", _ext(f), "-o", f / "o.onnx", "--report",
                                                   f / "o.onnx.0123abcd.data"], 2, "data file of"),
    ("check: outputs differ", lambda f: ["check", _chain(f), _chain(f, _extra_output, "o.onnx")], 1,
     "outputs differ: only the rewritten model has a0"),
    ("--feeds /dev/zero", lambda f: ["check", _chain(f), _chain(f), "--feeds", "/dev/zero"], 2, "regular file"),
    ("--feeds a FIFO", lambda f: ["check", _chain(f), _chain(f), "--feeds", _fifo(f, "feeds.npz")], 2,
     "regular file"),
    ("--feeds pickled", lambda f: ["check", _chain(f), _chain(f), "--feeds", _pickled(f)], 2, "not an .npz"),
    ("--budget unreachable", lambda f: ["plan", _chain(f), "--budget", "1KiB"], 3, ""),
    ("--budget inf%", lambda f: ["plan", _chain(f), "--budget", "inf%"], 2, "--budget"),
]


def _link(folder: Path, name: str, target: str) -> Path:
    os.symlink(target, folder / name)
    return folder / name


@contextlib.contextmanager
def _hang_guard(seconds: int):
    """A hang (a FIFO read, a backtracking regex) fails the row instead of stalling the suite."""
    def expire(signum, frame):
        raise TimeoutError(f"the command ran past {seconds} s")

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _state(folder: Path) -> dict[str, str]:
    out = {}
    for p in sorted(folder.rglob("*")):
        if p.is_symlink():
            out[str(p)] = "link:" + os.readlink(p)
        elif p.is_file():
            out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            out[str(p)] = "other"
    return out


@pytest.mark.parametrize("case", ROWS, ids=[r[0] for r in ROWS])
def test_bad_input(tmp_path, case):
    _, setup, code, word = case
    folder = tmp_path / "work"
    folder.mkdir()
    _write(folder, "unrelated.txt", "keep me")
    argv = [str(a) for a in setup(folder)]
    before = _state(folder)
    with _hang_guard(120):
        r = CliRunner().invoke(main, argv)
    assert r.exit_code == code, (argv, r.output)
    assert "Traceback" not in r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ckpt: error:"), r.stderr
    assert word in lines[0], lines[0]
    assert _state(folder) == before, "a file changed or appeared"
    assert Path("/dev/null").is_char_device() and Path("/dev/full").is_char_device()


@pytest.mark.parametrize("case", [r for r in ROWS if r[0] in ("--budget unreachable", "--budget inf%")],
                         ids=lambda r: r[0])
def test_bad_input_under_json_prints_a_json_error(tmp_path, case):
    """A CI step that parses stdout gets the exit code and the message, not an empty document."""
    _, setup, code, word = case
    argv = [str(a) for a in setup(tmp_path)] + ["--json"]
    r = CliRunner().invoke(main, argv)
    assert r.exit_code == code, (argv, r.output)
    error = json.loads(r.stdout)["error"]
    assert error["exit_code"] == code and word in error["message"]
    assert r.stderr.strip() == "ckpt: error: " + error["message"]


def test_a_bug_under_json_is_one_line_and_a_json_error(tmp_path, monkeypatch):
    import ckpt_cli.api

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(ckpt_cli.api, "plan_model", broken)
    r = CliRunner().invoke(main, ["plan", str(_chain(tmp_path)), "--json"])
    assert r.exit_code == 70
    assert r.stderr.strip() == "ckpt: internal error: RuntimeError: boom (rerun with --debug for details)"
    assert json.loads(r.stdout) == {"schema_version": 1, "command": "plan",
                                    "error": {"exit_code": 70,
                                              "message": "RuntimeError: boom (rerun with --debug for details)"}}


@pytest.mark.parametrize("opset", [9, 11])
def test_old_opsets_get_no_guards_and_a_file_ort_loads(tmp_path, opset):
    """The pin guards use Max on int64 (opset 12): below it the rewrite writes none, says so,
    and ORT loads and runs the file as ckpt checks it (was: ORT refused the file, exit 0)."""
    import onnxruntime as ort

    model = chain_model(layers=4, batch=64, width=256)
    model.opset_import[0].version = opset
    model.ir_version = 7
    src, out = tmp_path / "m.onnx", tmp_path / "m.ckpt.onnx"
    onnx.save(model, src)
    r = CliRunner().invoke(main, ["rewrite", str(src), "-o", str(out), "--auto", "layers", "--json"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["recompute_nodes"] > 0 and report["pin"]["guard_nodes"] == 0
    assert f"no guards at opset {opset}" in report["pin"]["skipped"]
    ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    checked = CliRunner().invoke(main, ["check", str(src), str(out)])
    assert checked.exit_code == 0, checked.output


@pytest.mark.parametrize("args", [[], ["--no-recompute"]])
def test_float16_function_ops_are_written_without_orts_casts(tmp_path, args):
    """ORT's CPU provider wraps ops it has no float16 kernel for in Casts named
    InsertedPrecisionFreeCast_*; the expansion copied them into the file, and ORT then
    refused it ("Duplicate definition of name"), exit 0, even with --no-recompute."""
    import onnxruntime as ort

    src, out = tmp_path / "f.onnx", tmp_path / "f.ckpt.onnx"
    onnx.save(_float16_model(), src)
    r = CliRunner().invoke(main, ["rewrite", str(src), "-o", str(out), "-q", *args])
    assert r.exit_code == 0, r.output
    written = onnx.load(out)
    assert not any(t.startswith("InsertedPrecisionFreeCast_") for n in written.graph.node
                   for t in n.input if n.op_type == "Cast")
    ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])


def test_a_float16_rewrite_says_cpu_results_can_differ_and_the_check_names_why(tmp_path):
    """On CPU, ORT computes float16 ops without a float16 kernel in float32 and rounds where
    its own Casts sit, which a rewrite moves: the rewrite says so before anyone runs it,
    and the check's failure names the Casts as the cause."""
    src, out = tmp_path / "f.onnx", tmp_path / "f.ckpt.onnx"
    onnx.save(_float16_model(), src)
    r = CliRunner().invoke(main, ["rewrite", str(src), "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["reduced_precision"]["dtypes"] == ["float16"]
    r = CliRunner().invoke(main, ["rewrite", str(src), "-o", str(out), "--force"])
    assert "float16 graph: ONNX Runtime's CPU provider runs ops without float16 kernels in float32" in r.output
    r = CliRunner().invoke(main, ["check", str(src), str(out), "--json"])
    failures = json.loads(r.stdout)["failures"]
    assert any("wrapped the ops that have no float16 kernel in Casts" in line for line in failures), failures
    plain = _chain(tmp_path)
    r = CliRunner().invoke(main, ["inspect", str(plain), "--json"])
    assert json.loads(r.stdout)["reduced_precision"] is None


def _float16_model() -> onnx.ModelProto:
    import numpy as np

    half = TensorProto.FLOAT16
    w = onnx.numpy_helper.from_array(np.random.default_rng(0).standard_normal((16, 16)).astype(np.float16), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["z"], name="mm"),
             helper.make_node("Softmax", ["z"], ["s"], name="sm", axis=-1),
             helper.make_node("ReduceSum", ["s"], ["loss"], name="rs", keepdims=0),
             helper.make_node("Mul", ["s", "seed"], ["ds"], name="bwd_mul"),
             helper.make_node("Transpose", ["x"], ["xt"], name="bwd_t"),
             helper.make_node("MatMul", ["xt", "ds"], ["w_grad"], name="bwd_mm")]
    graph = helper.make_graph(nodes, "fp16", [helper.make_tensor_value_info("x", half, [8, 16]),
                                              helper.make_tensor_value_info("seed", half, [])],
                              [helper.make_tensor_value_info("loss", half, []),
                               helper.make_tensor_value_info("w_grad", half, [16, 16])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model
