"""ONNX Runtime training artifacts: make them, and train with the Module/Optimizer API.

Runs in a Python with onnxruntime-training-cpu 1.19.2 and numpy<2 (the last training wheel;
it cannot share a venv with onnxruntime or with ckpt, which needs numpy 2). ``run.py`` drives
it from ckpt's environment; by hand:

    python artifacts.py make DIR
        A residual MLP (6 blocks x = x + W2 silu(W1 x), width 256, hidden 1024, batch 256,
        10 classes), built with onnx.helper, then ``generate_artifacts`` (cross-entropy loss,
        AdamW): DIR/training_model.onnx, eval_model.onnx, optimizer_model.onnx, checkpoint.

    python artifacts.py train DIR TRAINING_MODEL [--steps 20] [--settings JSON]
        ``Module(TRAINING_MODEL, checkpoint, eval_model)`` + ``Optimizer``: ``--steps`` steps of
        a fixed synthetic classification task (labels from a random linear teacher). Prints one
        JSON object: per-step losses and step times, and the process peak.

Session: without ``--settings`` the Module's session is ORT's defaults (the Module API makes its
own session; only ``intra_op_num_threads = 1`` is set, for bit-identical comparisons). With
``--settings '{"execution_order": "PRIORITY_BASED", ...}'`` (the attributes of the
``SessionOptions`` that ``ckpt_cli.session_options(path)`` returns) those are applied too.

Memory: this ORT build's profiler has no memory fields, so the process peak is read from
Linux's counters: the process starts with ``MALLOC_MMAP_THRESHOLD_=65536`` (``run.py`` sets
it), everything (artifacts, optimizer state, all batches) is loaded first, ``5`` is written to
``/proc/self/clear_refs`` to reset VmHWM, and the peak is VmHWM after the last step minus VmRSS
before the first: what training added on top of the loaded state (activations, gradients,
ORT's arena; page granular).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

BATCH, WIDTH, HIDDEN, BLOCKS, CLASSES = 256, 256, 1024, 6, 10
OPSET = 17


def _import_training(module):
    """Import ``onnxruntime.training.<module>`` without torch: the package's ``__init__``
    imports its torch-based optimizers, although ``artifacts`` and ``api`` need only the ORT
    core. Without torch, skip that ``__init__``."""
    import importlib
    import types

    try:
        return importlib.import_module(f"onnxruntime.training.{module}")
    except ModuleNotFoundError as err:
        if err.name != "torch":
            raise
    import onnxruntime

    for name in [m for m in sys.modules if m.startswith("onnxruntime.training")]:
        del sys.modules[name]
    package = types.ModuleType("onnxruntime.training")
    package.__path__ = [os.path.join(os.path.dirname(onnxruntime.__file__), "training")]
    sys.modules["onnxruntime.training"] = package
    return importlib.import_module(f"onnxruntime.training.{module}")


# ------------------------------------------------------------------ make
def forward_model():
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.RandomState(0)
    inits, nodes = [], []

    def linear(name, x, d_in, d_out, out):
        bound = 1 / np.sqrt(d_in)
        inits.append(numpy_helper.from_array(
            rng.uniform(-bound, bound, (d_out, d_in)).astype(np.float32), f"{name}.weight"))
        inits.append(numpy_helper.from_array(
            rng.uniform(-bound, bound, d_out).astype(np.float32), f"{name}.bias"))
        nodes.append(helper.make_node("Gemm", [x, f"{name}.weight", f"{name}.bias"], [out],
                                      name=f"{name}/Gemm", transB=1))

    x = "input"
    for i in range(BLOCKS):
        p = f"blocks.{i}"
        linear(f"{p}.fc", x, WIDTH, HIDDEN, f"{p}/fc")
        nodes += [
            helper.make_node("Sigmoid", [f"{p}/fc"], [f"{p}/sigmoid"], name=f"{p}/Sigmoid"),
            helper.make_node("Mul", [f"{p}/fc", f"{p}/sigmoid"], [f"{p}/silu"], name=f"{p}/Mul"),
        ]
        linear(f"{p}.proj", f"{p}/silu", HIDDEN, WIDTH, f"{p}/proj")
        nodes.append(helper.make_node("Add", [x, f"{p}/proj"], [f"{p}/out"], name=f"{p}/Add"))
        x = f"{p}/out"
    linear("head", x, WIDTH, CLASSES, "logits")
    graph = helper.make_graph(
        nodes, "residual_mlp",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [BATCH, WIDTH])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [BATCH, CLASSES])],
        initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def make(out_dir):
    import onnx

    artifacts = _import_training("artifacts")
    model = forward_model()
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryFile() as log:
        # The gradient builder logs every graph transformer on the C++ stderr: show that only
        # if it fails.
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(log.fileno(), 2)
        try:
            artifacts.generate_artifacts(
                model, requires_grad=[i.name for i in model.graph.initializer],
                loss=artifacts.LossType.CrossEntropyLoss, optimizer=artifacts.OptimType.AdamW,
                artifact_directory=out_dir)
        except BaseException:
            os.dup2(saved, 2)
            log.seek(0)
            sys.stderr.write(log.read().decode(errors="replace")[-5000:])
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)
    # onnx >= 1.17 (which onnxruntime-training-cpu pulls in) writes the optimizer model with an
    # IR version ORT 1.19.2 refuses ("max supported IR version: 10"); it uses nothing newer.
    for name in os.listdir(out_dir):
        if name.endswith(".onnx"):
            path = os.path.join(out_dir, name)
            m = onnx.load(path)
            if m.ir_version > 10:
                m.ir_version = 10
                onnx.save(m, path)
    print(json.dumps({"artifacts": sorted(os.listdir(out_dir))}))


# ------------------------------------------------------------------ train
def batches(steps, seed=0):
    rng = np.random.RandomState(seed)
    teacher = rng.randn(WIDTH, CLASSES).astype(np.float32)
    out = []
    for _ in range(steps):
        x = rng.randn(BATCH, WIDTH).astype(np.float32)
        out.append((x, np.argmax(x @ teacher, axis=1).astype(np.int64)))
    return out


def _status():
    with open("/proc/self/status", encoding="ascii") as f:
        fields = dict(line.split(":", 1) for line in f)
    return {k: int(fields[k].split()[0]) * 1024 for k in ("VmRSS", "VmHWM")}


def session_options(settings):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    for key, value in (settings or {}).items():
        if key == "execution_order":
            value = getattr(ort.ExecutionOrder, value)
        elif key == "graph_optimization_level":
            value = getattr(ort.GraphOptimizationLevel, value)
        setattr(so, key, value)
    return so


def train(art_dir, training_model, steps, settings):
    api = _import_training("api")
    state = api.CheckpointState.load_checkpoint(os.path.join(art_dir, "checkpoint"))
    module = api.Module(training_model, state, os.path.join(art_dir, "eval_model.onnx"),
                        device="cpu", session_options=session_options(settings))
    optimizer = api.Optimizer(os.path.join(art_dir, "optimizer_model.onnx"), module)
    data = batches(steps)
    module.train()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _status()["VmRSS"]
    losses, times = [], []
    for x, labels in data:
        start = time.perf_counter()
        loss = module(x, labels)
        optimizer.step()
        module.lazy_reset_grad()
        times.append(time.perf_counter() - start)
        losses.append(float(loss))
    peak = _status()["VmHWM"] - before
    return {"losses": losses, "step_s": times, "process_peak_bytes": peak,
            "malloc_mmap_threshold": os.environ.get("MALLOC_MMAP_THRESHOLD_")}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    m = sub.add_parser("make")
    m.add_argument("dir")
    t = sub.add_parser("train")
    t.add_argument("dir")
    t.add_argument("training_model")
    t.add_argument("--steps", type=int, default=20)
    t.add_argument("--settings", type=json.loads, default=None)
    args = ap.parse_args(argv)
    if args.command == "make":
        make(args.dir)
    else:
        print(json.dumps(train(args.dir, args.training_model, args.steps, args.settings)))


if __name__ == "__main__":
    sys.exit(main())
