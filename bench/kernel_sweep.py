"""Every kernel of a training graph that reads floats (and indices), measured alone against ckpt's model.

    python -m bench.kernel_sweep MODEL [MODEL ...] [--dims batch=64] [--ops Sum,GatherGrad] [--json FILE]

For each node whose float inputs have static shapes at ``--dims`` (by default the batch and
sequence of the ``zoo.json`` beside the model, else 64), a one-node model: its float inputs
as graph inputs, its int and small initializers kept, computed indices as zeros and computed
shapes as its output's (``INDEX_INPUTS``, ``SHAPE_INPUTS``), its outputs as graph outputs. Nodes
alike (op, attributes, input shapes) are built once. Each runs alone in the ORT training
interpreter (``tests/fixtures/kernel_peak.py``: process peak above the state before the run,
arena off, blocks of 64 KiB and more from mmap, after a warm-up run), and the bytes it held
above its outputs are compared with ckpt's kernel scratch (``ort.scratch``). A kernel whose
working memory ckpt does not know shows as a row far above zero; the measurement reads up to
about 256 KiB low (Linux batches RSS per thread), so ``--threshold`` (default 300 KB) hides
the noise. This is how the variadic Sum's temporaries, ReduceSum's index lists, the scatter
kernels' int64 copies of their indices and Expand's run offsets were found.

Needs the training interpreter (``--python``, default ``.venv-ort-training-full/bin/python``).
About a second per distinct node.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ckpt_cli.analysis.shapes import TensorInfo, infer_tensors, sized_by
from ckpt_cli.graph import Graph, Node
from ckpt_cli.ort.scratch import scratch_bytes

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "fixtures" / "kernel_peak.py"
DEFAULT_PYTHON = ROOT / ".venv-ort-training-full" / "bin" / "python"
KEPT_INITIALIZER_ELEMENTS = 16  # a float initializer this small stays one (a scale, an epsilon)
INT_TYPES = (onnx.TensorProto.INT64, onnx.TensorProto.INT32)
# Computed int inputs the sweep can make: indices (by op, the input's slot) and shapes the
# output has (GatherGrad's and the others' data shape, Expand's and Reshape's target).
INDEX_INPUTS = {("", "Gather"): 1, ("", "GatherElements"): 1, ("", "GatherND"): 1, ("", "ScatterElements"): 1,
                ("", "Scatter"): 1, ("", "ScatterND"): 1, ("com.microsoft", "GatherGrad"): 1,
                ("com.microsoft", "GatherElementsGrad"): 2, ("com.microsoft", "GatherNDGrad"): 1}
SHAPE_INPUTS = {("com.microsoft", "GatherGrad"): 0, ("com.microsoft", "GatherElementsGrad"): 1,
                ("com.microsoft", "GatherNDGrad"): 0, ("", "Expand"): 1, ("", "Reshape"): 1,
                ("", "ConstantOfShape"): 0}


def _dims(model: Path, given: list[str]) -> dict[str, int]:
    if given:
        return {k: int(v) for k, v in (d.split("=", 1) for d in given)}
    spec = model.parent / "zoo.json"
    if not spec.exists():
        return {"batch": 64}
    zoo = json.loads(spec.read_text())
    return {"batch": zoo["batch"], **({"seq": zoo["seq"]} if "seq" in zoo else {})}


def _static(info: TensorInfo | None) -> bool:
    return info is not None and info.shape is not None and all(isinstance(d, int) for d in info.shape)


def _made_int(node: Node, slot: int, info: TensorInfo, tensors: dict[str, TensorInfo]) -> onnx.TensorProto | None:
    """A computed int input of ``node`` (at ``slot``) as a constant that its kernel accepts:
    zeros for indices (every index 0 is in bounds), the output's shape for a shape input
    (what the shape was, since the output has it); None for any other."""
    key = (node.domain or "", node.op_type)
    name, dtype = node.inputs[slot], onnx.helper.tensor_dtype_to_np_dtype(info.dtype)
    if INDEX_INPUTS.get(key) == slot:
        return numpy_helper.from_array(np.zeros(info.shape or (), dtype), name)
    out = tensors.get(node.outputs[0]) if node.outputs else None
    if SHAPE_INPUTS.get(key) == slot and _static(out) and out is not None and len(out.shape or ()) == math.prod(info.shape or ()):
        return numpy_helper.from_array(np.array(out.shape, dtype), name)
    return None


def _one_node(graph: Graph, node: Node, tensors: dict[str, TensorInfo], model: onnx.ModelProto
              ) -> onnx.ModelProto | None:
    """``node`` alone, or None where an input is not a static float tensor, a kept constant or
    an int input ``_made_int`` can make."""
    inputs, inits = [], []
    for slot, t in enumerate(node.inputs):
        if not t:
            continue
        proto, info = graph.initializers.get(t), tensors.get(t)
        if proto is not None and (proto.data_type != onnx.TensorProto.FLOAT
                                  or numpy_helper.to_array(proto).size <= KEPT_INITIALIZER_ELEMENTS):
            inits.append(proto)
        elif _static(info) and info is not None and info.dtype == onnx.TensorProto.FLOAT:
            inputs.append(helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, list(info.shape or ())))
        elif _static(info) and info is not None and info.dtype in INT_TYPES and (made := _made_int(node, slot, info, tensors)):
            inits.append(made)
        else:
            return None
    outputs = [t for t in node.outputs if t]
    if not outputs or not all(_static(tensors.get(t)) and tensors[t].nbytes is not None for t in outputs):
        return None
    values = [helper.make_tensor_value_info(t, tensors[t].dtype, list(tensors[t].shape or ())) for t in outputs]
    g = helper.make_graph([node.proto], "one", inputs, values, initializer=inits)
    return helper.make_model(g, opset_imports=list(model.opset_import), ir_version=model.ir_version)


def build(path: Path, dims: dict[str, int], folder: Path, ops: set[str] | None = None) -> list[dict[str, Any]]:
    """The one-node models of ``path``'s distinct nodes (``_one_node``), written to ``folder``, each with
    its outputs' bytes and ckpt's scratch; ``ops``: only nodes of these op types."""
    model = onnx.load(str(path))
    graph = Graph.from_model(model)
    tensors = infer_tensors(graph, dims)
    sized = sized_by(tensors)
    rows: dict[tuple[str, ...], dict[str, Any]] = {}
    for node in graph.nodes:
        if ops is not None and node.op_type not in ops:
            continue
        one = _one_node(graph, node, tensors, model)
        if one is None:
            continue
        # the outputs too: nodes alike in their inputs differ by the shapes the sweep made (Expand's target)
        key = (node.domain, node.op_type, str(node.proto.attribute), str(list(one.graph.input)),
               str(list(one.graph.output)))
        if key in rows:
            rows[key]["count"] += 1
            continue
        file = folder / f"{path.parent.name}_{len(rows):04d}.onnx"
        onnx.save(one, str(file))
        rows[key] = {"model": str(path), "node": node.name, "op": node.op_type, "count": 1, "file": str(file),
                     "inputs": [list(tensors[t].shape or ()) for t in node.inputs if t and _static(tensors.get(t))],
                     "outputs_bytes": sum(tensors[t].nbytes or 0 for t in node.outputs if t),
                     "scratch_bytes": scratch_bytes(node, sized, graph.int_constant)}
    return list(rows.values())


def measure(python: str, rows: list[dict[str, Any]]) -> None:
    """Each row's measured peak (the highest of two runs after a warm-up), in one child."""
    r = subprocess.run([python, str(SCRIPT), *(row["file"] for row in rows), "--runs", "2", "--keep-going"],
                       capture_output=True, text=True, timeout=3600,
                       env=dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536"))
    if r.returncode != 0:
        raise SystemExit(f"kernel_sweep: the measuring child failed: {r.stderr.strip().splitlines()[-1:]}")
    peaks = json.loads(r.stdout)
    for row in rows:
        found = peaks[row["file"]]
        if isinstance(found, str):  # ORT cannot run the node alone (an op that needs its graph)
            row["error"] = found
            continue
        row["measured_bytes"] = max(found)
        row["unexplained_bytes"] = row["measured_bytes"] - row["outputs_bytes"] - row["scratch_bytes"]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.kernel_sweep", description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", type=Path)
    ap.add_argument("--dims", action="append", default=[], metavar="NAME=SIZE")
    ap.add_argument("--python", default=str(DEFAULT_PYTHON), help="the ORT training interpreter")
    ap.add_argument("--threshold", type=int, default=300_000, help="bytes off before a row is shown")
    ap.add_argument("--json", type=Path, help="write every row here")
    ap.add_argument("--ops", type=lambda v: set(v.split(",")), help="only these op types, e.g. Sum,GatherGrad")
    args = ap.parse_args(argv)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ckpt-kernels-") as tmp:
        for path in args.models:
            rows += build(path, _dims(path, args.dims), Path(tmp), args.ops)
        measure(args.python, rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    ran = [r for r in rows if "error" not in r]
    off = [r for r in ran if abs(r["unexplained_bytes"]) > args.threshold]
    print(f"{len(ran)} distinct nodes measured ({len(rows) - len(ran)} would not run alone); "
          f"{len(off)} more than {args.threshold} bytes off")
    for r in sorted(off, key=lambda r: -abs(r["unexplained_bytes"])):
        print(f"  {Path(r['model']).parent.name} {r['op']} x{r['count']} {r['node']}: outputs {r['outputs_bytes']}, "
              f"scratch {r['scratch_bytes']}, measured {r['measured_bytes']}, unexplained {r['unexplained_bytes']} "
              f"(inputs {r['inputs']})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
