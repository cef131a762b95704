"""Export the joint forward + backward graph of a PyTorch module to one ONNX training graph.

    python export.py [--out small_gpt.onnx]      # the small GPT of this recipe

A thin wrapper over ckpt's own exporter: for your model, run ``ckpt export`` or call
``ckpt_cli.export_training_graph(model, example_inputs, "model.onnx")``, where
``model(*example_inputs)`` returns the scalar loss (``docs/commands.md``, "export").

What it writes
  ``model.onnx``       forward and backward in one graph (standard ONNX ops, opset 20, IR 10).
                       Inputs: every parameter and buffer (named by module path, e.g.
                       ``blocks.0.attn.qkv.weight``), your inputs (``input_names``) and
                       ``tangent_loss`` (the loss gradient seed: feed 1.0). Outputs: ``loss``,
                       ``<param>_grad`` for every parameter, and ``<buffer>_updated`` for
                       buffers the forward changes (BatchNorm running statistics).
  ``model.init.npz``   the module's initial parameters and buffers, by the same names.

How: ``ckpt_cli/export/trace.py`` (AOTAutograd's joint graph, annotated with module paths,
then ``torch.export`` and ``torch.onnx.export(dynamo=True)``); the ONNX graph is then run on
ONNX Runtime and compared with eager PyTorch.

Embedding gradients are ScatterND-add, which ONNX Runtime 1.31 CPU computes wrongly with more
than one intra-op thread when indices repeat: run such graphs with ``intra_op_num_threads = 1``
(``train.py`` does).

Needs torch 2.13 (CPU) and onnxscript (``pip install '.[torch]'``); ckpt itself never needs torch.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

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
def export_training_graph(model, example_inputs, input_names, path):
    """Write the training graph of ``model`` to ``path`` and its initial state to
    ``<path without .onnx>.init.npz``. Returns the largest difference from eager PyTorch
    (relative to each output's largest magnitude, at least 1)."""
    try:
        from ckpt_cli import export_training_graph as export
    except ImportError:  # run from a clone where ckpt is not installed
        sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
        from ckpt_cli import export_training_graph as export

    return export(model, example_inputs, path, input_names=input_names).max_error


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
          f"max |onnxruntime - torch| / max(1, |torch|) = {diff:.2g}")
    if diff > 1e-4:
        raise SystemExit(f"the ONNX graph's loss or gradients differ from torch by {diff}")


if __name__ == "__main__":
    sys.exit(main())
