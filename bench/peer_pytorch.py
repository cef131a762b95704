"""PyTorch's min-cut partitioner on the models the gpt and gpt12 samples come from: the
peer figures that ``bench/peer.py`` compares ckpt's front against.

Run with a torch venv (torch 2.13 CPU; never imported by ckpt)::

    python bench/peer_pytorch.py [--only gpt,gpt12] [-o bench/peer_pytorch.json]

``--only`` also takes the full-size models of ``bench/models.py`` (gpt2s, resnet18_224,
bert_base). For each model: the joint graph as ``sample_models/generate.py`` captures it (same
module, seed, inputs and decompositions), partitioned by
``min_cut_rematerialization_partition`` with ``activation_memory_budget`` 1.0, 0.8, 0.5,
0.35 and 0.2, and by ``default_partition`` (no recompute) as the reference. Per point:

- activation bytes: tensors the forward saves for the backward, de-duplicated,
  excluding parameters, inputs and views of them;
- recompute FLOPs: forward nodes of the joint graph that the backward graph runs again.
  ``matmul``: 2*M*N*K for mm/addmm/bmm/convolution, other ops 0 (torch's flop counter);
  ``elements``: matmul FLOPs plus one per output element of every other recomputed op
  that is not a view (the same rule ``bench/peer.py`` applies to ckpt's ONNX copies).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "sample_models"))
sys.path.insert(0, str(HERE.parent))  # run as a script: bench/ is on the path, not the repository

import generate  # noqa: E402  (the sample models and their capture recipe)
from bench import models as bench_models  # noqa: E402

aten = torch.ops.aten
BUDGETS = (1.0, 0.8, 0.5, 0.35, 0.2)
MATMUL = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default, aten.convolution.default}
VIEWS = {aten.view.default, aten._unsafe_view.default, aten.t.default, aten.transpose.int, aten.permute.default,
         aten.expand.default, aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.slice.Tensor,
         aten.select.int, aten.alias.default, aten.reshape.default, aten.split_with_sizes.default,
         aten.split.Tensor, aten.as_strided.default}
SHAPELESS = {"getitem"}


def _val(node):
    v = node.meta.get("val")
    return v if isinstance(v, torch.Tensor) else None


def matmul_flops(node) -> int:
    out = _val(node)
    if node.target not in MATMUL or out is None:
        return 0
    if node.target == aten.convolution.default:
        w = _val(node.args[1])
        return 2 * out.numel() * math.prod(w.shape[1:])
    a = _val(node.args[1] if node.target in (aten.addmm.default, aten.baddbmm.default) else node.args[0])
    return 2 * out.numel() * a.shape[-1]


def element_flops(node) -> int:
    if node.target in MATMUL:
        return matmul_flops(node)
    if node.target in VIEWS or getattr(node.target, "__name__", "") in SHAPELESS:
        return 0
    out = _val(node)
    return out.numel() if out is not None else 0


def _is_view_of_input(node) -> bool:
    while node.op == "call_function" and node.target in VIEWS:
        node = node.args[0]
    return node.op == "placeholder"


def activation_bytes(fw) -> int:
    out = fw.graph.find_nodes(op="output")[0]
    saved = out.args[0][num_outputs(fw):]
    seen, total = set(), 0
    for node in saved:
        if not isinstance(node, torch.fx.Node) or _is_view_of_input(node) or node.name in seen:
            continue
        v = _val(node)
        if v is None:
            continue
        seen.add(node.name)
        total += v.numel() * v.element_size()
    return total


_NUM_OUTPUTS = {}


def num_outputs(fw) -> int:
    return _NUM_OUTPUTS[id(fw)]


def partition(gm, num_fwd_outputs: int, budget: float | None):
    from torch._functorch import config
    from torch._functorch.partitioners import default_partition, min_cut_rematerialization_partition

    gm = copy.deepcopy(gm)
    if budget is None:
        fw, bw = default_partition(gm, [], num_fwd_outputs=num_fwd_outputs)
    else:
        with config.patch(activation_memory_budget=budget):
            fw, bw = min_cut_rematerialization_partition(gm, [], compiler="inductor",
                                                         num_fwd_outputs=num_fwd_outputs)
    _NUM_OUTPUTS[id(fw)] = num_fwd_outputs
    return fw, bw


def build(name: str) -> bench_models.Built:
    """A sample's model (generate.py) or a full-size bench model (bench/models.py)."""
    return bench_models.build(name) if name in bench_models.MODELS else generate.build(name)


def measure(name: str) -> dict:
    model, example_inputs, input_names = build(name)
    gm, jd, *_ = generate.capture_joint(model, example_inputs, input_names)
    num_fwd_outputs = jd._aot_state.fw_metadata.num_forward_returns
    forward = {n.name: n for n in gm.graph.nodes if n.op == "call_function"
               and n.meta.get("partitioner_tag") == "is_forward"}
    fwd_matmul = sum(matmul_flops(n) for n in forward.values())
    fwd_elements = sum(element_flops(n) for n in forward.values())
    base_fw, _ = partition(gm, num_fwd_outputs, None)
    points = [{"partitioner": "default", "budget": None, "activation_bytes": activation_bytes(base_fw),
               "recompute_matmul_flops": 0, "recompute_element_flops": 0, "recomputed_nodes": 0}]
    for budget in BUDGETS:
        fw, bw = partition(gm, num_fwd_outputs, budget)
        again = [forward[n.name] for n in bw.graph.nodes if n.op == "call_function" and n.name in forward]
        points.append({"partitioner": "min_cut", "budget": budget, "activation_bytes": activation_bytes(fw),
                       "recompute_matmul_flops": sum(matmul_flops(n) for n in again),
                       "recompute_element_flops": sum(element_flops(n) for n in again),
                       "recomputed_nodes": len(again)})
    return {"model": name, "forward_matmul_flops": fwd_matmul, "forward_element_flops": fwd_elements,
            "points": points}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="gpt,gpt12,gpt2s,resnet18_224,bert_base")
    p.add_argument("-o", "--output", default=str(HERE / "peer_pytorch.json"))
    args = p.parse_args(argv)
    results = {"torch": torch.__version__, "models": [measure(m) for m in args.only.split(",")]}
    Path(args.output).write_text(json.dumps(results, indent=1) + "\n")
    for m in results["models"]:
        for pt in m["points"]:
            print(f"{m['model']} {pt['partitioner']:8} {pt['budget']!s:5} activations {pt['activation_bytes'] / 2**20:7.3f} MiB "
                  f"matmul recompute {pt['recompute_matmul_flops'] / m['forward_matmul_flops']:6.1%} "
                  f"elements {pt['recompute_element_flops'] / 1e6:7.2f} M ({pt['recomputed_nodes']} nodes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
