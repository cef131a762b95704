"""Activation-bound benchmark models, at full size: forward + backward in one ONNX graph each.

Run from the repository root with the torch venv (``make bench-models`` builds it)::

    .venv-gen/bin/python -W ignore -m bench.models --out-dir out/bench_models [--only gpt2s,bert_base]

Writes ``<name>.onnx`` and ``<name>.phases.json`` per model, with ``sample_models/generate.py``'s
own recipe (joint capture, export, post-processing, verification on ORT CPU against float64
PyTorch). Random weights, fixed seeds. The files are too big for the repository: keep them under
``out/`` (git-ignored).

- ``gpt2s``: GPT-2 small (12 layers, d_model 768, 12 heads, vocab 50257, learned positions up
  to 1024, pre-LN, GELU MLP, head tied to the token embedding as GPT-2's), batch 4, seq 512:
  at batch 1 the stashed activations (1.0 GiB) only match the parameters and their gradients
  (0.95 GiB). The causal mask is a non-persistent buffer (as Hugging Face GPT-2's ``attn.bias``),
  so a graph input rather than 12 folded int64 [seq, seq] constants.
- ``resnet18_224``: ResNet-18 for 224x224 ImageNet images (7x7 stride-2 stem, 3x3 max-pool,
  4 stages of 2 basic blocks, widths 64-128-256-512, 1000 classes), batch 16.
- ``bert_base``: BERT-base (12 layers, d 768, 12 heads, post-LN, GELU, vocab 30522, 512
  positions, 2 token types) with the MLM head (dense + GELU + LayerNorm, decoder tied to the
  word embedding), batch 2, seq 512, cross-entropy on 15% of the tokens (labels -100 elsewhere).

No dropout anywhere: it would put random ops into the graph and make ORT's run incomparable
with PyTorch's.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "sample_models"))

import generate  # noqa: E402  (the samples' capture, export and verification recipe)

Built = tuple[nn.Module, tuple[torch.Tensor, ...], tuple[str, ...]]
GENERATE_TOLERANCE = 1e-4  # generate.summarize's default: max |ORT - float64 PyTorch|
FLOAT32_SLACK = 3


# --------------------------------------------------------------------------------------
# gpt2s: GPT-2 small from generate.py's GPT blocks
# --------------------------------------------------------------------------------------
class MaskedAttention(generate.CausalSelfAttention):
    """generate.py's causal attention, the mask passed in.

    Built inline as generate.py does, each layer's mask folds into an int64 [seq, seq]
    initializer of the exported file (2 MiB per layer at seq 512).
    """

    def forward(self, x: torch.Tensor, causal_mask: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        H = self.n_heads
        q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in self.qkv(x).split(C, dim=2))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // H))
        att = att.masked_fill(~causal_mask, float("-inf"))
        y = (F.softmax(att, dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
        return self.proj(y)


class MaskedBlock(generate.Block):
    def __init__(self, d_model: int, n_heads: int):
        super().__init__(d_model, n_heads)
        self.attn = MaskedAttention(d_model, n_heads)

    def forward(self, x: torch.Tensor, causal_mask: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), causal_mask)
        return x + self.mlp(self.ln2(x))


class TiedHead(nn.Module):
    """Output projection by a weight held elsewhere (the token embedding's): its own module only
    so that the logits' nodes get the ``head`` scope in the ONNX metadata."""

    def __init__(self, bias_size: int | None = None):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(bias_size)) if bias_size else None

    def forward(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.linear(x, weight, self.bias)


class GPT2Small(nn.Module):
    """generate.py's GPT at GPT-2 small's shape, with two changes.

    The head multiplies by the token embedding's weight: a second module holding the same
    nn.Parameter would become a second graph input with its own gradient, as AOTAutograd lifts
    parameters per module path. The causal mask is one non-persistent buffer, so one graph
    input, like Hugging Face GPT-2's ``attn.bias``.
    """

    def __init__(self, seq: int, vocab: int = 50257, d_model: int = 768, n_heads: int = 12,
                 n_layers: int = 12, max_seq: int = 1024):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, d_model)
        self.pos_emb = nn.Embedding(max_seq, d_model)
        self.blocks = nn.ModuleList(MaskedBlock(d_model, n_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = TiedHead()
        self.register_buffer("causal_mask", torch.ones(seq, seq, dtype=torch.bool).tril(), persistent=False)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        B, T = input_ids.shape
        pos = torch.arange(T, device=input_ids.device)
        x = self.tok_emb(input_ids) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x, self.causal_mask)
        logits = self.head(self.ln_f(x), self.tok_emb.weight)
        return F.cross_entropy(logits.reshape(B * T, -1), labels.reshape(B * T))


def build_gpt2s() -> Built:
    batch, seq = 4, 512
    model = GPT2Small(seq)
    ids = torch.randint(0, 50257, (batch, seq))
    labels = torch.randint(0, 50257, (batch, seq))
    return model, (ids, labels), ("input_ids", "labels")


# --------------------------------------------------------------------------------------
# resnet18_224: ResNet-18 for ImageNet-sized images
# --------------------------------------------------------------------------------------
class ResNet18ImageNet(nn.Module):
    """torchvision's resnet18 layout, from generate.py's BasicBlock."""

    def __init__(self, n_classes: int = 1000, widths: tuple[int, ...] = (64, 128, 256, 512)):
        super().__init__()
        self.stem = nn.Conv2d(3, widths[0], 7, stride=2, padding=3, bias=False)
        self.bn = nn.BatchNorm2d(widths[0])
        self.pool = nn.MaxPool2d(3, stride=2, padding=1)
        blocks, c_in = [], widths[0]
        for stage, c_out in enumerate(widths):
            for k in range(2):
                blocks.append(generate.BasicBlock(c_in, c_out, 2 if stage and not k else 1))
                c_in = c_out
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Linear(widths[-1], n_classes)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.bn(self.stem(images))))
        for block in self.blocks:
            x = block(x)
        return F.cross_entropy(self.head(x.mean(dim=(2, 3))), labels)


def build_resnet18_224() -> Built:
    batch = 16
    model = ResNet18ImageNet()
    images = torch.randn(batch, 3, 224, 224)
    labels = torch.randint(0, 1000, (batch,))
    return model, (images, labels), ("images", "labels")


# --------------------------------------------------------------------------------------
# bert_base: BERT-base encoder with the masked-LM head
# --------------------------------------------------------------------------------------
class BertSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.query = nn.Linear(d_model, d_model)
        self.key = nn.Linear(d_model, d_model)
        self.value = nn.Linear(d_model, d_model)

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        B, T, C = t.shape
        return t.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self._heads(self.query(x)), self._heads(self.key(x)), self._heads(self.value(x))
        att = F.softmax((q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // self.n_heads)), dim=-1)
        return (att @ v).transpose(1, 2).reshape(B, T, C)


class BertLayer(nn.Module):
    """Post-LN: LayerNorm after each residual add."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.attn = BertSelfAttention(d_model, n_heads)
        self.attn_out = nn.Linear(d_model, d_model)
        self.ln1 = nn.LayerNorm(d_model, eps=1e-12)
        self.mlp = generate.MLPBlock(d_model)
        self.ln2 = nn.LayerNorm(d_model, eps=1e-12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.ln1(x + self.attn_out(self.attn(x)))
        return self.ln2(x + self.mlp(x))


class BertMLM(nn.Module):
    def __init__(self, vocab: int = 30522, d_model: int = 768, n_heads: int = 12, n_layers: int = 12,
                 max_seq: int = 512, n_types: int = 2):
        super().__init__()
        self.word_emb = nn.Embedding(vocab, d_model)
        self.pos_emb = nn.Embedding(max_seq, d_model)
        self.type_emb = nn.Embedding(n_types, d_model)
        self.emb_ln = nn.LayerNorm(d_model, eps=1e-12)
        self.layers = nn.ModuleList(BertLayer(d_model, n_heads) for _ in range(n_layers))
        self.transform = nn.Linear(d_model, d_model)
        self.transform_ln = nn.LayerNorm(d_model, eps=1e-12)
        self.decoder = TiedHead(vocab)  # the word embedding's weight, as in GPT2Small

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                labels: torch.Tensor) -> torch.Tensor:
        B, T = input_ids.shape
        pos = torch.arange(T, device=input_ids.device)
        x = self.emb_ln(self.word_emb(input_ids) + self.pos_emb(pos) + self.type_emb(token_type_ids))
        for layer in self.layers:
            x = layer(x)
        logits = self.decoder(self.transform_ln(F.gelu(self.transform(x))), self.word_emb.weight)
        return F.cross_entropy(logits.reshape(B * T, -1), labels.reshape(B * T))


def build_bert_base() -> Built:
    batch, seq, vocab = 2, 512, 30522
    model = BertMLM(vocab=vocab)
    ids = torch.randint(0, vocab, (batch, seq))
    token_types = (torch.arange(seq) >= seq // 2).long().expand(batch, seq).contiguous()
    masked = torch.rand(batch, seq) < 0.15
    labels = torch.where(masked, ids, torch.full_like(ids, -100))
    return model, (ids, token_types, labels), ("input_ids", "token_type_ids", "labels")


# --------------------------------------------------------------------------------------
# Registry and generation
# --------------------------------------------------------------------------------------
BUILDERS: dict[str, Callable[[], Built]] = {
    "gpt2s": build_gpt2s,
    "resnet18_224": build_resnet18_224,
    "bert_base": build_bert_base,
}
MODELS = tuple(BUILDERS)


def build(name: str) -> Built:
    """(module, example inputs, input names), as generate.build: seeded, deterministic."""
    torch.manual_seed(0)
    return BUILDERS[name]()


def float32_error(model: nn.Module, example_inputs: tuple[torch.Tensor, ...]) -> float:
    """Max |float32 PyTorch - float64 PyTorch| over the loss, gradients and updated buffers."""
    ref32 = generate.reference(model, example_inputs)
    ref64 = generate.reference(copy.deepcopy(model).double(),
                               tuple(x.double() if x.is_floating_point() else x for x in example_inputs))
    return max(float((ref32[k].double() - ref64[k]).abs().max()) for k in ref32)


def tolerance(worst: float, model: nn.Module, example_inputs: tuple[torch.Tensor, ...]) -> float:
    """generate.py's 1e-4, or FLOAT32_SLACK times eager float32's own error where that is larger.

    At ResNet-18's size float32 rounding flips a few ReLU and max-pool decisions, each moving a
    weight gradient by ~1% (eager float32 is 8e-4 off float64 at batch 16, ORT 1.2e-3): the ONNX graph is
    held to the same float32 noise, not to 1e-4.
    """
    if worst <= GENERATE_TOLERANCE:
        return GENERATE_TOLERANCE
    return max(GENERATE_TOLERANCE, FLOAT32_SLACK * float32_error(model, example_inputs))


def generate_one(name: str, out_dir: str) -> None:
    model, example_inputs, input_names = build(name)
    model.train()
    start = time.perf_counter()
    path, in_names, in_values, info = generate.export_onnx(name, model, example_inputs, input_names, out_dir)
    exported = time.perf_counter()
    worst, worst_name, proto = generate.verify(name, model, example_inputs, path, in_names, in_values)
    tol = tolerance(worst, model, example_inputs)
    print(f"   export {exported - start:.0f} s, verification {time.perf_counter() - exported:.0f} s, "
          f"tolerance {tol:.3g}")
    generate.summarize(name, path, proto, worst, worst_name, info, tolerance=tol)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", default=str(ROOT / "out" / "bench_models"))
    ap.add_argument("--only", default=",".join(MODELS))
    args = ap.parse_args(argv)
    torch.use_deterministic_algorithms(True)
    os.makedirs(args.out_dir, exist_ok=True)
    for name in args.only.split(","):
        generate_one(name, args.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
