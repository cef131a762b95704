"""Make a small ONNX Runtime training artifact (ORT's own training-graph format).

Run in an environment with onnxruntime-training-cpu 1.19.2, onnx 1.16.2 and numpy<2 (no torch):

    python sample_models/make_artifact.py [--out-dir sample_models/ort_artifact]

The forward model is built with ``onnx.helper``: an MLP
of three ``Gemm -> BatchNormalization -> Relu`` blocks and a ``Gemm`` head (batch 256,
256 -> 1024 -> 1024 -> 1024 -> 10: activations of 1 MiB, large enough for the process-peak
measurement a training build of ORT allows)
whose parameters are initializers named like PyTorch module paths (``fc1.weight``,
``bn1.running_mean``, ...). ``onnxruntime.training.artifacts.generate_artifacts`` adds a
cross-entropy loss, builds the gradient graph and writes training/eval/optimizer models and a
checkpoint. Only ``training_model.onnx`` is kept: it uses com.microsoft ops (e.g.
SoftmaxCrossEntropyLossGrad, BatchNormInternal, InPlaceAccumulatorV2) that only a training build
of ORT can run. Its conventions: the nodes ORT added for the backward carry ``doc_string =
"Backward pass"``, and each gradient is accumulated (InPlaceAccumulatorV2) into its
``<param>_grad.accumulation.buffer`` input and leaves as ``<param>_grad.accumulation.out``.

The script checks that the kept file loads and runs in a plain InferenceSession of the training
build (parameters, gradient-accumulation buffers and ``lazy_reset_grad`` fed by hand).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
BATCH, D_IN, HIDDEN, BLOCKS, N_CLASSES = 256, 256, 1024, 3, 10
OPSET = 17


def build_forward_model() -> onnx.ModelProto:
    rng = np.random.RandomState(0)

    def linear(name, d_in, d_out):
        bound = 1.0 / np.sqrt(d_in)
        w = rng.uniform(-bound, bound, (d_out, d_in)).astype(np.float32)
        b = rng.uniform(-bound, bound, (d_out,)).astype(np.float32)
        return [numpy_helper.from_array(w, f"{name}.weight"),
                numpy_helper.from_array(b, f"{name}.bias")]

    inits, nodes, x, d_in = [], [], "input", D_IN
    for i in range(1, BLOCKS + 1):
        inits += linear(f"fc{i}", d_in, HIDDEN)
        inits += [
            numpy_helper.from_array(np.ones(HIDDEN, np.float32), f"bn{i}.weight"),
            numpy_helper.from_array(np.zeros(HIDDEN, np.float32), f"bn{i}.bias"),
            numpy_helper.from_array(np.zeros(HIDDEN, np.float32), f"bn{i}.running_mean"),
            numpy_helper.from_array(np.ones(HIDDEN, np.float32), f"bn{i}.running_var"),
        ]
        nodes += [
            helper.make_node("Gemm", [x, f"fc{i}.weight", f"fc{i}.bias"], [f"fc{i}_out"],
                             name=f"fc{i}/Gemm", transB=1),
            helper.make_node("BatchNormalization",
                             [f"fc{i}_out", f"bn{i}.weight", f"bn{i}.bias", f"bn{i}.running_mean",
                              f"bn{i}.running_var"], [f"bn{i}_out"],
                             name=f"bn{i}/BatchNormalization", epsilon=1e-5, momentum=0.9),
            helper.make_node("Relu", [f"bn{i}_out"], [f"relu{i}_out"], name=f"relu{i}/Relu"),
        ]
        x, d_in = f"relu{i}_out", HIDDEN
    inits += linear("head", HIDDEN, N_CLASSES)
    nodes.append(helper.make_node("Gemm", [x, "head.weight", "head.bias"], ["logits"],
                                  name="head/Gemm", transB=1))
    graph = helper.make_graph(
        nodes, "mlp_bn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [BATCH, D_IN])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [BATCH, N_CLASSES])],
        initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="ckpt-sample-models")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def _import_artifacts():
    """Import onnxruntime.training.artifacts without torch.

    ``onnxruntime/training/__init__.py`` imports ``optim``, which imports torch, although
    ``artifacts`` itself needs only onnx and the ORT core. If torch is missing, register a bare
    package object for ``onnxruntime.training`` so that its ``__init__`` is skipped.
    """
    try:
        from onnxruntime.training import artifacts
        return artifacts
    except ModuleNotFoundError as err:
        if err.name != "torch":
            raise
    import importlib
    import types

    import onnxruntime

    for mod in [m for m in sys.modules if m.startswith("onnxruntime.training")]:
        del sys.modules[mod]
    pkg = types.ModuleType("onnxruntime.training")
    pkg.__path__ = [os.path.join(os.path.dirname(onnxruntime.__file__), "training")]
    sys.modules["onnxruntime.training"] = pkg
    return importlib.import_module("onnxruntime.training.artifacts")


def make(out_dir: str) -> str:
    artifacts = _import_artifacts()
    model = build_forward_model()
    requires_grad = [i.name for i in model.graph.initializer if "running" not in i.name]
    frozen = [i.name for i in model.graph.initializer if "running" in i.name]
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryFile() as log:
        # The gradient builder logs every graph transformer at INFO level on the C++ stderr:
        # keep that log and show it only if something fails.
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(log.fileno(), 2)
        try:
            artifacts.generate_artifacts(
                model,
                requires_grad=requires_grad,
                frozen_params=frozen,
                loss=artifacts.LossType.CrossEntropyLoss,
                optimizer=artifacts.OptimType.AdamW,
                artifact_directory=tmp,
            )
        except BaseException:
            os.dup2(saved, 2)
            log.seek(0)
            sys.stderr.write(log.read().decode(errors="replace")[-5000:])
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        os.makedirs(out_dir, exist_ok=True)
        dst = os.path.join(out_dir, "training_model.onnx")
        shutil.copyfile(os.path.join(tmp, "training_model.onnx"), dst)
    return dst


def verify(path: str) -> None:
    import onnxruntime as ort

    m = onnx.load(path)
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    rng = np.random.RandomState(1)
    fwd = {i.name: numpy_helper.to_array(i) for i in build_forward_model().graph.initializer}
    feeds = {}
    for inp in sess.get_inputs():
        shape = [d if isinstance(d, int) else BATCH for d in inp.shape]
        if inp.name == "input":
            feeds[inp.name] = rng.randn(*shape).astype(np.float32)
        elif inp.name == "labels":
            feeds[inp.name] = rng.randint(0, N_CLASSES, shape).astype(np.int64)
        elif inp.name == "lazy_reset_grad":
            feeds[inp.name] = np.array([True])
        elif inp.name in fwd:
            feeds[inp.name] = fwd[inp.name]
        elif inp.name.endswith(".accumulation.buffer"):
            feeds[inp.name] = np.zeros(shape, np.float32)
        else:
            raise RuntimeError(f"unexpected input {inp.name} {inp.shape}")
    outs = sess.run(None, feeds)
    ops = {}
    for n in m.graph.node:
        key = f"{n.domain + '::' if n.domain else ''}{n.op_type}"
        ops[key] = ops.get(key, 0) + 1
    bwd = sum(1 for n in m.graph.node if n.doc_string == "Backward pass")
    size = os.path.getsize(path)
    md5 = hashlib.md5(open(path, "rb").read()).hexdigest()[:12]
    print(f"== ort_artifact/training_model.onnx: {size / 1e6:.3f} MB md5 {md5}, "
          f"{len(m.graph.node)} nodes ({bwd} with doc_string 'Backward pass'), "
          f"{len(m.graph.input)} inputs, {len(m.graph.output)} outputs, {len(inits)} initializers")
    print(f"   inputs: {[i.name for i in m.graph.input]}")
    print(f"   outputs: {[o.name for o in m.graph.output]} -> loss {float(outs[0]):.4f}")
    print(f"   ops: {dict(sorted(ops.items()))}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", default=os.path.join(HERE, "ort_artifact"))
    args = ap.parse_args(argv)
    path = make(args.out_dir)
    verify(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
