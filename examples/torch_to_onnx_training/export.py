"""Export the joint forward + backward graph of a PyTorch module to one ONNX training graph.

    python export.py [--out small_gpt.onnx]      # the small GPT of this recipe

Use it on your own model by calling ``export_training_graph(model, example_inputs,
input_names, "model.onnx")``, where ``model(*example_inputs)`` returns the scalar loss.

What it writes
  ``model.onnx``       forward and backward in one graph (standard ONNX ops, opset 20, IR 10).
                       Inputs: every parameter and buffer (named by module path, e.g.
                       ``blocks.0.attn.qkv.weight``), your inputs (``input_names``) and
                       ``tangent_loss`` (the loss gradient seed: feed 1.0). Outputs: ``loss``,
                       ``<param>_grad`` for every parameter, and ``<buffer>_updated`` for
                       buffers the forward changes (BatchNorm running statistics).
  ``model.init.npz``   the module's initial parameters and buffers, by the same names.

How (``sample_models/generate.py`` does the same, with phase bookkeeping for ckpt's tests):
  1. ``aot_export_joint_with_descriptors`` traces forward and autograd's backward into one FX
     graph of core ATen ops. Forward hooks record each op's module path, which AOTAutograd
     copies onto the backward ops it makes; ckpt later finds the repeated layers from it.
  2. ``torch.export`` of a wrapper that runs that FX graph, then
     ``torch.onnx.export(dynamo=True)``.
  3. Inputs and outputs are renamed after AOTAutograd's descriptors, the exporter's folded
     all-zero initializers become ConstantOfShape nodes again (small files), IR version 10.
  4. The ONNX graph is run on ONNX Runtime and compared with eager PyTorch.

Known limits
  * Shapes are static: batch size and sequence length are those of ``example_inputs``.
  * The module's forward must return one scalar loss, and must not call
    ``torch.autograd.grad`` itself (saved activations get baked in as constants).
  * Random ops (dropout) export as ONNX random ops: the graph trains, but its masks are not
    PyTorch's, and ckpt never recomputes them (it keeps their outputs).
  * ``aten.convolution_backward`` and ``aten.max_pool2d_with_indices_backward`` have neither a
    decomposition nor an ONNX translation: add the two small decompositions from
    ``sample_models/generate.py`` to ``decompositions()`` for CNNs.
  * Embedding gradients are ScatterND-add, which ONNX Runtime 1.31 CPU computes wrongly with
    more than one intra-op thread when indices repeat: run such graphs with
    ``intra_op_num_threads = 1`` (``train.py`` does).

Needs torch 2.13 (CPU), onnx, onnxscript and onnxruntime (``pip install .[examples]``); ckpt
itself never needs torch.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys

import numpy as np
import torch
import torch.fx.traceback as fx_traceback
import torch.nn as nn
import torch.nn.functional as F

aten = torch.ops.aten
HERE = os.path.dirname(os.path.abspath(__file__))


# ------------------------------------------------------------------ the recipe's model
class Attention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        B, T, C = x.shape
        H = self.heads
        q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in self.qkv(x).split(C, dim=2))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // H)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        return self.proj((att @ v).transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(d), Attention(d, heads)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class SmallGPT(nn.Module):
    """A byte-level GPT whose forward returns the next-token cross-entropy loss."""

    def __init__(self, vocab=256, d=64, heads=4, layers=4, max_seq=64):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, d)
        self.pos_emb = nn.Embedding(max_seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, input_ids, labels):
        B, T = input_ids.shape
        x = self.tok_emb(input_ids) + self.pos_emb(torch.arange(T))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.reshape(B * T, -1), labels.reshape(B * T))


# ------------------------------------------------------------------ the export
def decompositions():
    """Core ATen decompositions, with PyTorch's own decomposition of training-mode BatchNorm
    (the exporter would translate it as inference-mode BatchNormalization)."""
    from torch._decomp import core_aten_decompositions, decomposition_table

    table = dict(core_aten_decompositions())
    bn = aten._native_batch_norm_legit_functional.default
    table[bn] = decomposition_table[bn]
    return table


class _RunJoint(nn.Module):
    """Runs the joint FX graph node by node, so torch.export keeps each node's metadata."""

    def __init__(self, gm, keep):
        super().__init__()
        self.gm, self.keep = gm, keep

    def forward(self, *args):
        out = torch.fx.Interpreter(self.gm).run(*args)
        out = torch.utils._pytree.tree_leaves(out, is_leaf=lambda x: x is None)
        return tuple(out[i] for i in self.keep)


def _trace_joint(model, example_inputs):
    """AOTAutograd's joint graph, every op annotated with the module path that ran it."""
    from torch._functorch.aot_autograd import aot_export_joint_with_descriptors

    open_scopes = []

    def enter(path):
        def hook(module, args):
            scope = fx_traceback.annotate({"module": path})
            scope.__enter__()
            open_scopes.append(scope)
        return hook

    def leave(module, args, out):
        open_scopes.pop().__exit__(None, None, None)

    hooks = []
    for path, sub in model.named_modules():
        if path:
            hooks += [sub.register_forward_pre_hook(enter(path)), sub.register_forward_hook(leave)]
    try:
        with fx_traceback.preserve_node_meta(), contextlib.ExitStack() as stack:
            joint = aot_export_joint_with_descriptors(
                stack, model, tuple(example_inputs), decompositions=decompositions())
    finally:
        for h in hooks:
            h.remove()
    return joint.graph_module


def _module_stack(model, path):
    """``nn_module_stack`` as torch.export writes it; the exporter turns it into name scopes."""
    stack = {"L__self__": ("", f"{type(model).__module__}.{type(model).__qualname__}")}
    parts = path.split(".") if path else []
    for i in range(1, len(parts) + 1):
        sub_path = ".".join(parts[:i])
        sub = model.get_submodule(sub_path)
        if isinstance(sub, (nn.ModuleList, nn.ModuleDict)) and i < len(parts):
            continue
        stack["L__self___" + sub_path.replace(".", "_")] = (
            sub_path, f"{type(sub).__module__}.{type(sub).__qualname__}")
    return stack


def _names(gm, model, example_inputs, input_names):
    """Graph input names/values and kept output indices/names, from AOTAutograd's descriptors."""
    from torch._functorch._aot_autograd import descriptors as D

    state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    in_names, in_values = [], []
    for node in gm.graph.find_nodes(op="placeholder"):
        desc = node.meta["desc"]
        if isinstance(desc, (D.ParamAOTInput, D.BufferAOTInput)):
            in_names.append(desc.target)
            in_values.append(state[desc.target].detach().clone())
        elif isinstance(desc, D.PlainAOTInput):
            in_names.append(input_names[desc.idx])
            in_values.append(example_inputs[desc.idx])
        elif isinstance(desc, D.TangentAOTInput):
            in_names.append("tangent_loss")
            in_values.append(torch.ones((), dtype=torch.float32))
        else:
            raise NotImplementedError(f"graph input {desc!r}")
    keep, out_names = [], []
    out_node = gm.graph.find_nodes(op="output")[0]
    for i, (arg, desc) in enumerate(zip(out_node.args[0], out_node.meta["desc"])):
        if arg is None:  # gradient of an integer input
            continue
        if isinstance(desc, D.PlainAOTOutput):
            name = "loss"
        elif isinstance(desc, D.GradAOTOutput):
            name = f"{desc.grad_of.target}_grad"
        elif isinstance(desc, D.InputMutationAOTOutput):
            name = f"{desc.mutated_input.target}_updated"
        else:
            raise NotImplementedError(f"graph output {desc!r}")
        keep.append(i)
        out_names.append(name)
    return in_names, in_values, keep, out_names


def _unfold_zeros(graph, min_elements=1024):
    """The exporter folds ``zeros``/``full`` into initializers (loss seeds, embedding-gradient
    buffers): put back a ConstantOfShape node, so the file does not carry them."""
    import onnx_ir as ir

    nodes = list(graph)
    for name in list(graph.initializers):
        value = graph.initializers[name]
        if value.is_graph_input() or value.is_graph_output() or value.const_value is None:
            continue
        arr = value.const_value.numpy()
        if arr.size < min_elements or not (arr == arr.flat[0]).all():
            continue
        first_user = min((u for u, _ in value.uses()), key=nodes.index)
        shape = ir.Value(name=f"{name}_shape", const_value=ir.tensor(np.array(arr.shape, np.int64)))
        graph.register_initializer(shape)
        node = ir.Node("", "ConstantOfShape", [shape], name=f"node_{name}", num_outputs=1,
                       attributes=[ir.AttrTensor("value", ir.tensor(arr.flat[:1].copy()))])
        graph.insert_before(first_user, node)
        graph.initializers.pop(name)
        value.replace_all_uses_with(node.outputs[0])
        node.outputs[0].name, node.outputs[0].shape, node.outputs[0].dtype = name, ir.Shape(arr.shape), value.dtype


def export_training_graph(model, example_inputs, input_names, path):
    """Write the training graph of ``model`` to ``path`` and its initial state to
    ``<path without .onnx>.init.npz``. Returns the largest difference from eager PyTorch."""
    import onnx
    import onnx_ir as ir

    model.train()
    gm = _trace_joint(model, example_inputs)
    in_names, in_values, keep, out_names = _names(gm, model, example_inputs, input_names)
    with fx_traceback.preserve_node_meta():
        ep = torch.export.export(_RunJoint(gm, keep), tuple(in_values), strict=False)
    for node in ep.graph.nodes:  # module paths -> ONNX name scopes
        if node.op == "call_function":
            path_ = (node.meta.get("custom") or {}).get("module", "")
            node.meta["nn_module_stack"] = _module_stack(model, path_)

    program = torch.onnx.export(ep, dynamo=True, optimize=True, verbose=False)
    graph = program.model.graph
    for value, name in zip(graph.inputs, in_names):
        value.name = name
    outputs = list(graph.outputs)
    for value, name in zip(outputs, out_names):
        value.name = name
    graph.outputs.clear()  # loss first, then gradients, then updated buffers
    for i in sorted(range(len(outputs)), key=lambda i: (
            out_names[i] != "loss", not out_names[i].endswith("_grad"), i)):
        graph.outputs.append(outputs[i])
    _unfold_zeros(graph)
    for node in graph:  # the stack trace only points at _RunJoint: drop it
        node.metadata_props.pop("pkg.torch.onnx.stack_trace", None)
    proto = ir.serde.serialize_model(program.model)
    proto.ir_version = 10  # ONNX Runtime 1.31 loads IR <= 13; ckpt writes <= 10
    onnx.checker.check_model(proto, full_check=True)
    onnx.save_model(proto, path)

    state = {n: v.numpy() for n, v in zip(in_names, in_values)
             if n not in input_names and n != "tangent_loss"}
    np.savez(os.path.splitext(path)[0] + ".init.npz", **state)
    return _compare_with_torch(model, example_inputs, path, in_names, in_values)


def _compare_with_torch(model, example_inputs, path, in_names, in_values):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1  # ScatterND-add (embedding gradients) is racy with more
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    got = dict(zip([o.name for o in sess.get_outputs()],
                   sess.run(None, {n: v.numpy() for n, v in zip(in_names, in_values)})))
    loss = model(*example_inputs)
    loss.backward()
    ref = {"loss": loss.detach(), **{f"{n}_grad": p.grad for n, p in model.named_parameters()}}
    return max(float(np.abs(got[k] - ref[k].numpy()).max()) for k in ref)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(HERE, "small_gpt.onnx"))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    model = SmallGPT(max_seq=args.seq)
    tokens = torch.randint(0, 256, (args.batch, args.seq + 1))
    example = (tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())
    diff = export_training_graph(model, example, ("input_ids", "labels"), args.out)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"wrote {os.path.basename(args.out)} ({os.path.getsize(args.out) / 2**20:.2f} MiB, "
          f"{n_params} parameters, batch {args.batch} x {args.seq} tokens); "
          f"max |onnxruntime - torch| = {diff:.2g}")
    if diff > 1e-4:
        raise SystemExit(f"the ONNX graph's loss or gradients differ from torch by {diff}")


if __name__ == "__main__":
    sys.exit(main())
