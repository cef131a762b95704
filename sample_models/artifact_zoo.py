"""A zoo of ONNX Runtime training artifacts for common architectures, exported from PyTorch.

Run in an environment with onnxruntime-training-cpu 1.19.2, onnx 1.16.2, numpy<2 and torch
(CPU), e.g. from the repository root:

    python sample_models/artifact_zoo.py [--out-dir sample_models/zoo] [--only NAME[,NAME]]
                                         [--list] [--no-verify]

Every model follows ORT's on-device training recipe: ``torch.manual_seed(0)``, build the
module, ``torch.onnx.export`` with the TorchScript exporter (``dynamo=False``,
``TrainingMode.TRAINING``, no constant folding, dimension 0 of every input and output symbolic),
then ``onnxruntime.training.artifacts.generate_artifacts`` (the named loss, AdamW; parameters
trainable, BatchNorm running statistics frozen). For each NAME it writes OUT/NAME/ with
``training_model.onnx``, ``eval_model.onnx``, ``optimizer_model.onnx``, ``checkpoint`` and
``zoo.json``::

    {"name", "opset", "loss": "CrossEntropyLoss" | "MSELoss" | "BCEWithLogitsLoss" | "L1Loss"
             | "KLDivLoss",
     "batch": <batch for runs>, "seq"?: <sequence length for runs>,
     "inputs": [{"name", "shape", "dtype", "bound"?}], "label": {"name", "shape", "dtype",
     "bound"?}}

Shapes give the batch dimension as the string "batch"; "batch*32" means batch times 32;
"seq" is a second symbolic dimension (the tagger's sequence), ``seq`` long in runs, and
"tokens" batch times seq (the tagger's flattened logits and labels).
``bound`` (int inputs only) is the exclusive upper bound of valid values (vocabulary size,
number of classes). ``batch`` is small but makes the main activations 256 KiB or more each, so
that a process-RSS memory measurement resolves them. The training graph keeps the symbolic batch dimension; its parameters are
graph inputs whose values live in ``checkpoint``. One line per model is printed: size of
``training_model.onnx``, node count, and the op types in non-standard places (com.microsoft
ops, and ONNX-domain ops that ``onnx.defs.has`` does not know at the model's opset, such as
ORT's own ``LayerNormalization`` below opset 17 or ``MaxPoolGrad``).

Model notes:
- ``bert17`` / ``embed_ln17``: at opset 17 the exporter writes ``LayerNormalization`` with only
  output 0; ORT 1.19.2's gradient builder needs outputs 1 and 2 (Mean, InvStdDev), so
  ``generate_artifacts`` fails unless they are added (``<node>_mean``, ``<node>_invstddev``).
- ``gpt``: ``generate_artifacts``' CrossEntropyLoss takes the classes on the last axis of the
  output and makes the labels the output's shape without it, while SoftmaxCrossEntropyLoss wants
  the classes on axis 1: so the LM head's logits are flattened to [batch*32, vocab] and the
  labels are [batch*32] (output dimension 0 is named "batch_x_32").
- ``resnet_block``: ``generate_artifacts`` turns the exported training-mode BatchNormalization
  into ``training_mode=0`` in ``eval_model.onnx`` but keeps its running-statistics outputs, which
  ORT refuses to load (Module loads the eval model too); those unused outputs are removed from
  ``eval_model.onnx``. ``training_model.onnx`` is left as generated.
- ``enc_dropout_bce``: a post-LN encoder with dropout on its attention probabilities and
  ``generate_artifacts``' BCEWithLogitsLoss (a float ``target`` shaped like the one logit).
- ``tagger``: a tag per token, with the batch and the sequence both symbolic (its input is
  [batch, seq]); as gpt's, its logits are flattened to [tokens, tags] and its labels are [tokens].
- ``mobilenet_v2``: inverted residuals with depthwise 3x3 convolutions (``group`` = channels)
  and ReLU6, which ``generate_artifacts`` differentiates as ``Clip`` through comparison ops.
- ``vit``: a strided Conv cuts 4x4 patches; a class token and learned positions; pre-LN layers
  with ``scaled_dot_product_attention`` (written as MatMul / Softmax).
- ``seq2seq``: two token inputs; the decoder's layers attend to the encoder's output
  (cross-attention); logits flattened as gpt's.
- ``llama``: RMSNorm (fused by ``generate_artifacts`` into ORT's SimplifiedLayerNormalization),
  rotary embeddings from cos/sin buffers (frozen parameters), SwiGLU (SiLU becomes QuickGelu).
- ``frozen_backbone``: parameters with ``requires_grad=False`` go to ``frozen_params`` (with
  the buffers): the backbone gets no gradient and no optimizer state; ``L1Loss``.
- ``mixer``: MLP-Mixer; its LayerNormalization (opset 17) gets the Mean / InvStdDev outputs
  as bert17's.
- ``tcn``: causal dilated Conv1d pairs behind a left ``Pad``; ORT's gradient of ``Pad`` pads by
  ``Neg`` of the pads.
- ``keyword_kl``: ``KLDivLoss`` is an onnxblock loss of this file (``CUSTOM_LOSSES``), not a
  ``LossType``: KL(softmax(target) || softmax(logits)), ``target`` a teacher's logits.
- ``conformer``: the convolution module's depthwise convolution over time is a (7 x 1) Conv2d
  over an unsqueezed axis: a grouped Conv1d's CPU ``ConvGrad`` writes past its buffers on ORT
  1.19.2 (the README's limits); SiLU becomes QuickGelu, GLU a ``Split``.
- ``se_autoencoder``: MSE on a 3 x 32 x 32 reconstruction; squeeze-and-excitation gates
  multiply each feature map by a per-channel ``Sigmoid``; the upsampling is PixelShuffle
  written as ``Reshape`` + ``Transpose`` (no CPU ``ConvTransposeGrad``, no ``DepthToSpace``
  gradient builder).
- ``moe``: ``TopK`` routing; the two chosen experts' outputs are picked by ``GatherElements``
  with an index expanded to the model width (int64, as large as the picked outputs).
- ``gnn``: the edge list is a buffer (src, dst: 192 edges over 64 nodes); ``scatter_add``
  exports as ``ScatterElements`` with ``reduction="add"`` (``index_add`` with repeated targets
  does not export).
- ``swin``: windows cut and put back by ``Reshape`` + ``Transpose``; ``torch.roll`` exports as
  ``Slice`` + ``Concat``; the relative-position bias is a parameter table gathered by a fixed
  index buffer (``GatherGrad`` into the table); LayerNormalization gets Mean / InvStdDev.
- ``dual_encoder``: the text tower runs on a fixed prompt buffer, so its activations have no
  batch axis; ``F.normalize`` exports as ``ReduceL2`` + ``Clip`` + ``Expand`` + ``Div``.
- ``recommender``: two inputs, dense floats and multi-hot ids [batch, 8, 16];
  ``BCEWithLogitsLoss`` on one logit.
- ``linear_lm``: ``Elu`` and ``CumSum`` have no gradient builder in ORT 1.19.2: the feature map
  is ``exp(min(x, 0)) + relu(x)`` and the running sums a ``MatMul`` by a lower-triangular
  ones matrix.
- ``sampling_ae``: ``randn_like`` exports as ``RandomNormalLike`` without a seed, which ORT
  seeds from its global seed plus the node's index when it makes the kernel.
- ``pointnet``: the max over the points is a ``MaxPool`` over all of them (``ReduceMax``
  has no gradient builder).
- ``film``: two inputs, the image and an int64 condition id (16 values).
- ``ode``: one vector field applied sixteen times; its parameters' gradients meet in ``Sum``.
- ``capsules``: MNIST-sized input; routing by agreement unrolled three times.
- ``masked_lm``: ``attention_mask`` is [batch, 32] int64 of 0 and 1 (``bound`` 2); the
  output layer is the token embedding's weight, transposed (its gradient sums the two reads).
- ``diffusion``: two inputs, the noisy image and a float ``timestep`` per sample; SiLU
  becomes QuickGelu.
- ``selective_scan``: a Mamba-style scan unrolled over the 32 tokens: every step slices its
  token's ``dt``, ``B``, ``C`` and input (``Gather``), so each sliced tensor's gradient is a
  ``Sum`` of 32 ``GatherGrad`` outputs, thousands of tensors of 2-16 KiB at batch 64.
- ``densenet``: transitions pool with ``MaxPool``: an ``AveragePool``'s training graph kills the
  process with SIGFPE on ORT 1.19.2 (the README's limits).
- ``flow``: ``MeanLoss`` is an onnxblock loss of this file: the mean over the batch of the
  output (each sample's negative log-likelihood) less ``target`` (zeros in training).
- ``kan``: its LayerNormalization (opset 17) gets the Mean / InvStdDev outputs as bert17's.
- ``lstm`` / ``gru``: regressors; ``generate_artifacts``' MSELoss adds a float ``target`` input
  shaped like the output.

Deterministic: a rerun, of all models or any ``--only`` subset, writes byte-identical files.

Verification (on unless ``--no-verify``): ``training_model.onnx`` runs once in a plain
``InferenceSession`` (parameters fed from the exported forward model's initializers, gradient
buffers zeros, ``lazy_reset_grad`` True), then two ``Module`` + ``Optimizer`` (AdamW) steps run
from the checkpoint; all losses must be finite.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import sys
import tempfile
import warnings
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import numpy_helper
from onnxruntime.training import api, artifacts
from onnxruntime.training.onnxblock import _graph_utils, blocks
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
VOCAB, SEQ, CLASSES = 1000, 32, 10
TAGGER_SEQ, TAGS = 24, 9  # the tagger's symbolic sequence: its length in runs, other than any batch
LONG_SEQ = 256  # long_context's tokens


# ------------------------------------------------------------------ specs
@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int | str, ...]  # ints, "batch", or "batch*N"
    dtype: str = "float32"
    bound: int | None = None

    def to_json(self) -> dict:
        out = {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}
        if self.bound is not None:
            out["bound"] = self.bound
        return out


@dataclass(frozen=True)
class Spec:
    name: str
    opset: int
    loss: str
    build: Callable[[], nn.Module]
    inputs: tuple[Tensor, ...]
    output: Tensor
    batch: int
    ln_stats: bool = False  # add LayerNormalization's Mean/InvStdDev outputs (opset 17)
    label: Tensor = field(init=False)

    def __post_init__(self) -> None:
        # The label input generate_artifacts adds: CrossEntropyLoss drops the output's last
        # (class) axis and wants int64; the others (MSE, L1, BCE, KL) copy the output.
        if self.loss == "CrossEntropyLoss":
            label = Tensor("labels", self.output.shape[:-1], "int64", self.output.shape[-1])
        else:
            label = Tensor("target", self.output.shape, "float32")
        object.__setattr__(self, "label", label)


def dims(shape: tuple[int | str, ...], batch: int, seq: int = TAGGER_SEQ) -> list[int]:
    out = []
    for d in shape:
        if d in ("seq", "tokens"):
            d = seq * (batch if d == "tokens" else 1)
        elif isinstance(d, str):
            d = batch * (int(d.split("*")[1]) if "*" in d else 1)
        out.append(d)
    return out


# ------------------------------------------------------------------ models
class Attention(nn.Module):
    def __init__(self, d: int, heads: int, causal: bool):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (y.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for y in self.qkv(x).split(d, dim=2))
        att = q @ k.transpose(-2, -1) / float(np.sqrt(d // self.heads))
        if self.causal:
            att = att.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        y = att.softmax(-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    """Transformer layer: post-LN (BERT) or, if causal, pre-LN (GPT)."""

    def __init__(self, d: int, heads: int, ffn: int, causal: bool):
        super().__init__()
        self.causal = causal
        self.attn = Attention(d, heads, causal)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, ffn), nn.GELU(), nn.Linear(ffn, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.causal:
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))
        x = self.ln1(x + self.attn(x))
        return self.ln2(x + self.mlp(x))


class Transformer(nn.Module):
    """BERT-like classifier on token 0, or (causal) GPT with an LM head over every token."""

    def __init__(self, layers: int, d: int, causal: bool):
        super().__init__()
        self.causal = causal
        self.tok = nn.Embedding(VOCAB, d)
        self.pos = nn.Embedding(SEQ, d)
        self.ln = nn.LayerNorm(d)
        self.blocks = nn.ModuleList(Block(d, 4, 4 * d, causal) for _ in range(layers))
        self.head = nn.Linear(d, VOCAB if causal else CLASSES)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(input_ids) + self.pos.weight
        if not self.causal:
            x = self.ln(x)  # BERT normalizes the embeddings, GPT the last layer's output
        for block in self.blocks:
            x = block(x)
        if self.causal:
            return self.head(self.ln(x)).reshape(-1, VOCAB)
        return self.head(x[:, 0])


class DropoutAttention(Attention):
    """Attention with dropout on its probabilities (BERT's attention dropout)."""

    def __init__(self, d: int, heads: int, p: float):
        super().__init__(d, heads, causal=False)
        self.drop = nn.Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (y.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for y in self.qkv(x).split(d, dim=2))
        att = self.drop((q @ k.transpose(-2, -1) / float(np.sqrt(d // self.heads))).softmax(-1))
        return self.proj((att @ v).transpose(1, 2).reshape(b, t, d))


class DropoutEncoder(nn.Module):
    """Post-LN encoder with attention dropout and one logit (a binary classifier on token 0)."""

    def __init__(self, d: int = 64, layers: int = 2, p: float = 0.1):
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, d), nn.Embedding(SEQ, d)
        self.attn = nn.ModuleList(DropoutAttention(d, 4, p) for _ in range(layers))
        self.ln = nn.ModuleList(nn.LayerNorm(d) for _ in range(2 * layers))
        self.mlp = nn.ModuleList(nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
                                 for _ in range(layers))
        self.head = nn.Linear(d, 1)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(input_ids) + self.pos.weight
        for i, (attn, mlp) in enumerate(zip(self.attn, self.mlp)):
            x = self.ln[2 * i](x + attn(x))
            x = self.ln[2 * i + 1](x + mlp(x))
        return self.head(x[:, 0])


class Tagger(nn.Module):
    """A tag per token: embedding, a residual MLP block and a head, any batch and length."""

    def __init__(self, d: int = 64):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, TAGS)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(input_ids)
        # flattened as gpt's LM head: generate_artifacts' CrossEntropyLoss takes the classes last
        return self.head(self.ln(x + self.fc2(torch.relu(self.fc1(x))))).reshape(-1, TAGS)


class EmbedLN(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 256)
        self.ln = nn.LayerNorm(256)
        self.fc = nn.Linear(256, CLASSES)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.fc(self.ln(self.emb(input_ids)).mean(dim=1))


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = nn.Identity() if stride == 1 and c_in == c_out else nn.Sequential(
            nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class Recurrent(nn.Module):
    """LSTM/GRU regressor: a linear head on the last time step's hidden state."""

    def __init__(self, kind: str):
        super().__init__()
        self.rnn = getattr(nn, kind)(32, 128, num_layers=1, batch_first=True)
        self.head = nn.Linear(128, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(x)[0][:, -1])


def mlp(dropout: bool) -> nn.Module:
    layers, d_in = [], 256
    for width in (2048, 2048):  # activations of 512 KiB at batch 64: large enough for a process peak
        layers += [nn.Linear(d_in, width), nn.ReLU()] + ([nn.Dropout(0.1)] if dropout else [])
        d_in = width
    return nn.Sequential(*layers, nn.Linear(d_in, CLASSES))


def lenet() -> nn.Module:
    # LeNet's layout with 4x its channels: 2.4 MB for the first activation at batch 64 (with
    # 6 channels the whole step was 2.6 MB, and a process peak measured it within +-15%)
    return nn.Sequential(
        nn.Conv2d(1, 24, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(24, 64, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 4 * 4, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
        nn.Linear(84, CLASSES))


def resnet_block() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        BasicBlock(16, 16, 1), BasicBlock(16, 32, 2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, CLASSES))


def _double_tile(x: torch.Tensor) -> torch.Tensor:
    """Nearest 2x upsampling by Tile (``repeat``): each pixel repeated on new axes, then merged."""
    b, c, h, w = x.shape
    return x.reshape(b, c, h, 1, w, 1).repeat(1, 1, 1, 2, 1, 2).reshape(b, c, 2 * h, 2 * w)


def _double_expand(x: torch.Tensor) -> torch.Tensor:
    """Nearest 2x upsampling by broadcast: an Expand to a shape computed at run time."""
    b, c, h, w = x.shape
    return x.reshape(b, c, h, 1, w, 1).expand(b, c, h, 2, w, 2).reshape(b, c, 2 * h, 2 * w)


class UNet(nn.Module):
    """A two-level UNet: Conv+ReLU pairs, MaxPool down, Tile upsampling, Concat skips."""

    def __init__(self):
        super().__init__()
        def pair(c_in: int, c_out: int) -> nn.Module:
            return nn.Sequential(nn.Conv2d(c_in, c_out, 3, 1, 1), nn.ReLU(), nn.Conv2d(c_out, c_out, 3, 1, 1), nn.ReLU())
        self.down1, self.down2, self.mid = pair(3, 16), pair(16, 32), pair(32, 64)
        self.up2, self.up1 = pair(64 + 32, 32), pair(32 + 16, 16)
        self.head = nn.Conv2d(16, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s1 = self.down1(x)
        s2 = self.down2(nn.functional.max_pool2d(s1, 2))
        y = self.mid(nn.functional.max_pool2d(s2, 2))
        y = self.up2(torch.cat([_double_tile(y), s2], 1))
        return self.head(self.up1(torch.cat([_double_tile(y), s1], 1)))


class GroupNorm(nn.Module):
    """GroupNorm written out: Reshape, ReduceMean, Sub, Pow, Sqrt, Div (no fused op)."""

    def __init__(self, groups: int, channels: int):
        super().__init__()
        self.groups = groups
        self.weight = nn.Parameter(torch.ones(1, channels, 1, 1))
        self.bias = nn.Parameter(torch.zeros(1, channels, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        g = x.reshape(b, self.groups, -1)
        centred = g - g.mean(dim=2, keepdim=True)
        std = (centred.pow(2).mean(dim=2, keepdim=True) + 1e-5).sqrt()
        return (centred / std).reshape(b, c, h, w) * self.weight + self.bias


class Denoiser(nn.Module):
    """A conv denoiser: Conv+GroupNorm+ReLU, a strided Conv down, Expand upsampling, a skip."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Conv2d(3, 32, 3, 1, 1)
        self.gn1, self.gn2, self.gn3 = GroupNorm(4, 32), GroupNorm(4, 64), GroupNorm(4, 32)
        self.down = nn.Conv2d(32, 64, 3, 2, 1)
        self.up = nn.Conv2d(64, 32, 3, 1, 1)
        self.out = nn.Conv2d(32, 3, 3, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = torch.relu(self.gn1(self.inp(x)))
        y = torch.relu(self.gn2(self.down(s)))
        y = torch.relu(self.gn3(self.up(_double_expand(y)))) + s
        return x - self.out(y)


class InvertedResidual(nn.Module):
    """MobileNetV2's block: 1x1 expand, 3x3 depthwise (groups = channels), 1x1 linear project."""

    def __init__(self, c_in: int, c_out: int, stride: int, expand: int = 4):
        super().__init__()
        hidden = c_in * expand
        self.residual = stride == 1 and c_in == c_out
        self.body = nn.Sequential(
            nn.Conv2d(c_in, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6(),
            nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden), nn.ReLU6(),
            nn.Conv2d(hidden, c_out, 1, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x) if self.residual else self.body(x)


def mobilenet_v2() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU6(),
        InvertedResidual(16, 16, 1), InvertedResidual(16, 24, 2), InvertedResidual(24, 24, 1),
        nn.Conv2d(24, 64, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU6(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, CLASSES))


class MultiHead(nn.Module):
    """Attention of x's queries over mem's keys and values (mem is x: self-attention)."""

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q, self.kv, self.proj = nn.Linear(d, d), nn.Linear(d, 2 * d), nn.Linear(d, d)

    def split(self, y: torch.Tensor) -> torch.Tensor:
        b, t, d = y.shape
        return y.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)

    def forward(self, x: torch.Tensor, mem: torch.Tensor, causal: bool = False) -> torch.Tensor:
        b, t, d = x.shape
        k, v = self.kv(mem).split(d, dim=2)
        y = nn.functional.scaled_dot_product_attention(
            self.split(self.q(x)), self.split(k), self.split(v), is_causal=causal)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class PreNormLayer(nn.Module):
    """Pre-LN layer: self-attention, optional cross-attention over mem, GELU MLP."""

    def __init__(self, d: int, heads: int, cross: bool = False, causal: bool = False):
        super().__init__()
        self.causal = causal
        self.attn = MultiHead(d, heads)
        self.cross = MultiHead(d, heads) if cross else None
        self.ln = nn.ModuleList(nn.LayerNorm(d) for _ in range(3 if cross else 2))
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor, mem: torch.Tensor | None = None) -> torch.Tensor:
        h = self.ln[0](x)
        x = x + self.attn(h, h, self.causal)
        if self.cross is not None:
            x = x + self.cross(self.ln[1](x), mem)
        return x + self.mlp(self.ln[-1](x))


class ViT(nn.Module):
    """ViT: a strided Conv cuts 4x4 patches, a class token, learned positions, pre-LN layers."""

    def __init__(self, d: int = 64, layers: int = 2, patch: int = 4):
        super().__init__()
        self.patch = nn.Conv2d(3, d, patch, patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, d))
        self.pos = nn.Parameter(0.02 * torch.randn(1, 1 + (32 // patch) ** 2, d))
        self.layers = nn.ModuleList(PreNormLayer(d, 4) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
        for layer in self.layers:
            x = layer(x)
        return self.head(self.ln(x)[:, 0])


class Seq2Seq(nn.Module):
    """Encoder-decoder: a pre-LN encoder; decoder layers with causal self-attention and
    cross-attention over the encoder's output; an LM head over every target token."""

    def __init__(self, d: int = 64, layers: int = 2):
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, d), nn.Embedding(SEQ, d)
        self.enc = nn.ModuleList(PreNormLayer(d, 4) for _ in range(layers))
        self.dec = nn.ModuleList(PreNormLayer(d, 4, cross=True, causal=True) for _ in range(layers))
        self.ln_enc, self.ln_dec = nn.LayerNorm(d), nn.LayerNorm(d)
        self.head = nn.Linear(d, VOCAB)

    def forward(self, src_ids: torch.Tensor, tgt_ids: torch.Tensor) -> torch.Tensor:
        mem = self.tok(src_ids) + self.pos.weight
        for layer in self.enc:
            mem = layer(mem)
        mem = self.ln_enc(mem)
        y = self.tok(tgt_ids) + self.pos.weight
        for layer in self.dec:
            y = layer(y, mem)
        return self.head(self.ln_dec(y)).reshape(-1, VOCAB)


class RMSNorm(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding: each half of the head's features rotated against the other."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


class LlamaLayer(nn.Module):
    def __init__(self, d: int, heads: int, ffn: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = RMSNorm(d), RMSNorm(d)
        self.qkv, self.o = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.gate, self.up = nn.Linear(d, ffn, bias=False), nn.Linear(d, ffn, bias=False)
        self.down = nn.Linear(ffn, d, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (y.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for y in self.qkv(self.norm1(x)).split(d, dim=2))
        y = nn.functional.scaled_dot_product_attention(
            _rotate(q, cos, sin), _rotate(k, cos, sin), v, is_causal=True)
        x = x + self.o(y.transpose(1, 2).reshape(b, t, d))
        h = self.norm2(x)
        return x + self.down(nn.functional.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    """Llama-style decoder: RMSNorm, rotary positions (cos/sin buffers, frozen), SwiGLU, no biases."""

    def __init__(self, d: int = 64, layers: int = 2, heads: int = 4):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, d)
        self.layers = nn.ModuleList(LlamaLayer(d, heads, 172) for _ in range(layers))
        self.norm, self.head = RMSNorm(d), nn.Linear(d, VOCAB, bias=False)
        half = d // heads // 2
        angles = torch.arange(SEQ).float()[:, None] / 10000 ** (torch.arange(half).float() / half)
        self.register_buffer("rope_cos", torch.cat([angles.cos()] * 2, -1))
        self.register_buffer("rope_sin", torch.cat([angles.sin()] * 2, -1))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(input_ids)
        for layer in self.layers:
            x = layer(x, self.rope_cos, self.rope_sin)
        return self.head(self.norm(x)).reshape(-1, VOCAB)


class FrozenBackbone(nn.Module):
    """A box regressor: a convolution backbone whose weights are frozen (``frozen_params``: no
    gradients, no optimizer state) under a trainable head."""

    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Conv2d(3, 32, 3, 1, 1), nn.ReLU(), nn.Conv2d(32, 64, 3, 2, 1), nn.ReLU(),
            nn.Conv2d(64, 64, 3, 1, 1), nn.ReLU())
        self.backbone.requires_grad_(False)
        self.head = nn.Sequential(
            nn.Conv2d(64, 64, 3, 1, 1), nn.ReLU(), nn.Conv2d(64, 64, 3, 1, 1), nn.ReLU(),
            nn.Conv2d(64, 32, 3, 2, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
            nn.Linear(32, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))



class MixerBlock(nn.Module):
    """MLP-Mixer's block: an MLP across the tokens (through transposes), then across channels."""

    def __init__(self, tokens: int, dim: int) -> None:
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.tok = nn.Sequential(nn.Linear(tokens, 2 * tokens), nn.GELU(), nn.Linear(2 * tokens, tokens))
        self.ch = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.tok(self.n1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.ch(self.n2(x))


class Mixer(nn.Module):
    """MLP-Mixer: 4x4 patches by a strided Conv, four Mixer blocks, mean over the tokens."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Conv2d(3, 64, 4, 4)
        self.blocks = nn.Sequential(*[MixerBlock(64, 64) for _ in range(4)])
        self.norm = nn.LayerNorm(64)
        self.head = nn.Linear(64, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.embed(x).flatten(2).transpose(1, 2))
        return self.head(self.norm(x).mean(1))


class GatedTCN(nn.Module):
    """WaveNet-style: causal dilated Conv1d pairs (tanh * sigmoid gate), 1x1 residual convs."""

    def __init__(self, ch: int = 32, layers: int = 6) -> None:
        super().__init__()
        self.inp = nn.Conv1d(16, ch, 1)
        self.f = nn.ModuleList(nn.Conv1d(ch, ch, 2, dilation=2 ** i) for i in range(layers))
        self.g = nn.ModuleList(nn.Conv1d(ch, ch, 2, dilation=2 ** i) for i in range(layers))
        self.res = nn.ModuleList(nn.Conv1d(ch, ch, 1) for _ in range(layers))
        self.head = nn.Linear(ch, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for i, (f, g, r) in enumerate(zip(self.f, self.g, self.res)):
            p = nn.functional.pad(h, (2 ** i, 0))
            h = h + r(torch.tanh(f(p)) * torch.sigmoid(g(p)))
        return self.head(h.mean(2))


class Video3D(nn.Module):
    """A clip classifier: Conv3d over time x height x width, BatchNorm3d, a strided Conv3d."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Sequential(nn.Conv3d(3, 16, 3, padding=1), nn.BatchNorm3d(16), nn.ReLU())
        self.b = nn.Sequential(nn.Conv3d(16, 32, 3, stride=2, padding=1), nn.BatchNorm3d(32), nn.ReLU())
        self.c = nn.Sequential(nn.Conv3d(32, 32, 3, padding=1), nn.ReLU())
        self.head = nn.Linear(32, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.c(self.b(self.a(x))).mean((2, 3, 4)))


class LatentAttention(nn.Module):
    """Perceiver-style: 16 learned latents cross-attend to 64 input tokens, then self-attend."""

    def __init__(self) -> None:
        super().__init__()
        self.latents = nn.Parameter(torch.randn(16, 64) * 0.02)
        self.inp = nn.Linear(32, 64)
        self.q, self.kv = nn.Linear(64, 64), nn.Linear(64, 128)
        self.layers = nn.ModuleList(nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True,
                                                               norm_first=True) for _ in range(2))
        self.head = nn.Linear(64, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kv = self.inp(x)
        k, v = self.kv(kv).chunk(2, dim=-1)
        q = self.q(self.latents).unsqueeze(0)
        h = torch.softmax(q @ k.transpose(1, 2) / 8.0, dim=-1) @ v
        for layer in self.layers:
            h = layer(h)
        return self.head(h.mean(1))

class ConformerBlock(nn.Module):
    """Macaron feed-forwards (SiLU) around self-attention and a convolution module: pointwise
    Conv1d, GLU, depthwise convolution over time, BatchNorm1d, SiLU, pointwise Conv1d."""

    def __init__(self, d: int = 64, heads: int = 4, kernel: int = 7) -> None:
        super().__init__()
        def ffn() -> nn.Module:
            return nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 2 * d), nn.SiLU(), nn.Linear(2 * d, d))
        self.ff1, self.ff2 = ffn(), ffn()
        self.norm_att, self.att = nn.LayerNorm(d), nn.MultiheadAttention(d, heads, batch_first=True)
        self.norm_conv = nn.LayerNorm(d)
        self.pw1, self.glu = nn.Conv1d(d, 2 * d, 1), nn.GLU(dim=1)
        # depthwise as a (kernel x 1) Conv2d: ORT 1.19.2's grouped 1-D ConvGrad writes past its buffers
        self.dw = nn.Conv2d(d, d, (kernel, 1), padding=(kernel // 2, 0), groups=d)
        self.bn, self.act, self.pw2 = nn.BatchNorm1d(d), nn.SiLU(), nn.Conv1d(d, d, 1)
        self.norm_out = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + 0.5 * self.ff1(x)
        h = self.norm_att(x)
        x = x + self.att(h, h, h, need_weights=False)[0]
        c = self.glu(self.pw1(self.norm_conv(x).transpose(1, 2)))
        x = x + self.pw2(self.act(self.bn(self.dw(c.unsqueeze(-1)).squeeze(-1)))).transpose(1, 2)
        return self.norm_out(x + 0.5 * self.ff2(x))


class Conformer(nn.Module):
    """A speech-command classifier over 64 frames of 40 features: two Conformer blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(40, 64)
        self.blocks = nn.Sequential(ConformerBlock(), ConformerBlock())
        self.head = nn.Linear(64, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.inp(x)).mean(1))


class SqueezeExcite(nn.Module):
    def __init__(self, ch: int) -> None:
        super().__init__()
        self.gate = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(ch, ch // 4, 1), nn.ReLU(),
                                  nn.Conv2d(ch // 4, ch, 1), nn.Sigmoid())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gate(x)


def _shuffle(x: torch.Tensor) -> torch.Tensor:
    """PixelShuffle(2) as Reshape and Transpose."""
    b, c, h, w = x.shape
    return x.reshape(b, c // 4, 2, 2, h, w).permute(0, 1, 4, 2, 5, 3).reshape(b, c // 4, 2 * h, 2 * w)


class SEAutoencoder(nn.Module):
    """A convolutional autoencoder: strided Conv2d + squeeze-and-excitation down, sub-pixel (PixelShuffle) up."""

    def __init__(self) -> None:
        super().__init__()
        self.down = nn.Sequential(nn.Conv2d(3, 32, 3, 2, 1), nn.ReLU(), SqueezeExcite(32),
                                  nn.Conv2d(32, 64, 3, 2, 1), nn.ReLU(), SqueezeExcite(64))
        # sub-pixel upsampling written out: ORT 1.19.2 has no CPU ConvTransposeGrad, and no
        # gradient builder for DepthToSpace (nn.PixelShuffle)
        self.up1, self.up2 = nn.Conv2d(64, 128, 3, 1, 1), nn.Conv2d(32, 12, 3, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _shuffle(self.up2(torch.relu(_shuffle(self.up1(self.down(x))))))


class MoEBlock(nn.Module):
    """A pre-norm layer whose feed-forward is four experts, each token routed to its top two by
    a softmax router (``TopK``), the experts' outputs gathered (``GatherElements``) and mixed."""

    def __init__(self, d: int = 64, experts: int = 4) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.att = nn.MultiheadAttention(d, 4, batch_first=True)
        self.router = nn.Linear(d, experts)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
                                     for _ in range(experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.att(h, h, h, need_weights=False)[0]
        h = self.norm2(x)
        gates, chosen = torch.softmax(self.router(h), dim=-1).topk(2, dim=-1)  # [b, t, 2]
        outs = torch.stack([e(h) for e in self.experts], dim=2)  # [b, t, experts, d]
        index = chosen.unsqueeze(-1).expand(-1, -1, -1, h.shape[-1])
        picked = torch.gather(outs, 2, index)  # [b, t, 2, d]
        return x + (picked * gates.unsqueeze(-1)).sum(2)


class MoE(nn.Module):
    """A token classifier's encoder with two mixture-of-experts layers, mean-pooled."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 64)
        self.blocks = nn.Sequential(MoEBlock(), MoEBlock())
        self.head = nn.Linear(64, CLASSES)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(input_ids)).mean(1))


class GraphConvNet(nn.Module):
    """Message passing over a fixed ring-with-chords graph of 64 nodes: each layer gathers the
    source nodes' features along 192 edges (``Gather``), scales them by the edge weights, and
    sums them into the target nodes (``scatter_add``: ``ScatterElements`` with add)."""

    def __init__(self, nodes: int = 64, d: int = 32, layers: int = 3) -> None:
        super().__init__()
        src = torch.arange(nodes).repeat(3)
        dst = torch.cat([(src[:nodes] + k) % nodes for k in (1, 5, 17)])
        self.register_buffer("src", src)
        self.register_buffer("dst", dst)
        self.inp = nn.Linear(16, d)
        self.msg = nn.ModuleList(nn.Linear(d, d) for _ in range(layers))
        self.self_loop = nn.ModuleList(nn.Linear(d, d) for _ in range(layers))
        self.head = nn.Linear(d, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.inp(x))  # [b, nodes, d]
        for msg, loop in zip(self.msg, self.self_loop):
            m = msg(h)[:, self.src]  # [b, edges, d]
            index = self.dst.view(1, -1, 1).expand(m.shape[0], -1, m.shape[2])
            agg = torch.zeros_like(h).scatter_add(1, index, m)
            h = torch.relu(loop(h) + agg / 3.0)
        return self.head(h.mean(1))


class WindowAttention(nn.Module):
    """Self-attention inside each w x w window, with a learned bias per relative position
    (a table gathered by a fixed index buffer) and, for shifted windows, an additive mask."""

    def __init__(self, d: int, heads: int, w: int, mask: torch.Tensor | None) -> None:
        super().__init__()
        self.heads, self.w = heads, w
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.table = nn.Parameter(0.02 * torch.randn((2 * w - 1) ** 2, heads))
        yx = torch.stack(torch.meshgrid(torch.arange(w), torch.arange(w), indexing="ij")).flatten(1)
        rel = (yx[:, :, None] - yx[:, None, :] + w - 1)
        self.register_buffer("rel_index", (rel[0] * (2 * w - 1) + rel[1]).flatten())
        self.register_buffer("mask", mask if mask is not None else torch.zeros(1, w * w, w * w))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [b * windows, w * w, d]
        n, t, d = x.shape
        q, k, v = (y.reshape(n, t, self.heads, d // self.heads).transpose(1, 2)
                   for y in self.qkv(x).split(d, dim=2))
        bias = self.table[self.rel_index].reshape(t, t, self.heads).permute(2, 0, 1)
        att = q @ k.transpose(-2, -1) / float(np.sqrt(d // self.heads)) + bias
        windows = self.mask.shape[0]
        att = (att.reshape(-1, windows, self.heads, t, t) + self.mask[:, None]).reshape(n, self.heads, t, t)
        y = att.softmax(-1) @ v
        return self.proj(y.transpose(1, 2).reshape(n, t, d))


def _shift_mask(side: int, w: int, shift: int) -> torch.Tensor:
    """Swin's mask for shifted windows: -100 between tokens that came from different regions."""
    region = torch.zeros(side, side)
    cuts = (slice(0, -w), slice(-w, -shift), slice(-shift, None))
    for i, (ys, xs) in enumerate((ys, xs) for ys in cuts for xs in cuts):
        region[ys, xs] = i
    windows = region.reshape(side // w, w, side // w, w).transpose(1, 2).reshape(-1, w * w)
    return (windows[:, :, None] != windows[:, None, :]).float() * -100.0


class SwinBlock(nn.Module):
    """A Swin layer: windowed attention, windows shifted by ``torch.roll`` when ``shift``."""

    def __init__(self, d: int, side: int, w: int, shift: int) -> None:
        super().__init__()
        self.side, self.w, self.shift = side, w, shift
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = WindowAttention(d, 4, w, _shift_mask(side, w, shift) if shift else None)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [b, side, side, d]
        s, w, d = self.side, self.w, x.shape[-1]
        h = self.ln1(x)
        if self.shift:
            h = torch.roll(h, (-self.shift, -self.shift), (1, 2))
        h = h.reshape(-1, s // w, w, s // w, w, d).transpose(2, 3).reshape(-1, w * w, d)
        h = self.attn(h).reshape(-1, s // w, s // w, w, w, d).transpose(2, 3).reshape(-1, s, s, d)
        if self.shift:
            h = torch.roll(h, (self.shift, self.shift), (1, 2))
        x = x + h
        return x + self.mlp(self.ln2(x))


class Swin(nn.Module):
    """Swin-style: 2x2 patches, a regular and a shifted window layer, patch merging (strided
    slices concatenated, LayerNorm, Linear), two more window layers, mean pool."""

    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, d, 2, 2)
        self.stage1 = nn.Sequential(SwinBlock(d, 16, 4, 0), SwinBlock(d, 16, 4, 2))
        self.merge_ln, self.merge = nn.LayerNorm(4 * d), nn.Linear(4 * d, 2 * d, bias=False)
        self.stage2 = nn.Sequential(SwinBlock(2 * d, 8, 4, 0), SwinBlock(2 * d, 8, 4, 2))
        self.ln, self.head = nn.LayerNorm(2 * d), nn.Linear(2 * d, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stage1(self.patch(x).permute(0, 2, 3, 1))
        x = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], -1)
        x = self.stage2(self.merge(self.merge_ln(x)))
        return self.head(self.ln(x).mean((1, 2)))


class DualEncoder(nn.Module):
    """CLIP-style zero-shot classifier trained end to end: an image tower and a text tower over
    fixed class prompts (a token buffer, no batch axis), both L2-normalized; the logits are
    their cosine similarities scaled by a learned temperature (``exp``)."""

    def __init__(self, d: int = 64, prompt: int = 8) -> None:
        super().__init__()
        self.image = nn.Sequential(
            nn.Conv2d(3, 32, 3, 1, 1), nn.GELU(), nn.Conv2d(32, 64, 3, 2, 1), nn.GELU(),
            nn.Conv2d(64, 64, 3, 2, 1), nn.GELU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
            nn.Linear(64, d))
        self.register_buffer("prompts", (torch.arange(CLASSES * prompt).reshape(CLASSES, prompt) * 7) % VOCAB)
        self.tok = nn.Embedding(VOCAB, d)
        self.pos = nn.Parameter(0.02 * torch.randn(prompt, d))
        self.text = PreNormLayer(d, 4)
        self.text_proj = nn.Linear(d, d)
        self.logit_scale = nn.Parameter(torch.tensor(float(np.log(1 / 0.07))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        img = nn.functional.normalize(self.image(x), dim=-1)  # [b, d]
        t = self.text((self.tok(self.prompts) + self.pos)).mean(1)  # [classes, d]
        txt = nn.functional.normalize(self.text_proj(t), dim=-1)
        return self.logit_scale.exp() * img @ txt.t()


class Recommender(nn.Module):
    """DLRM-style click model: a bottom MLP over 13 dense features, 8 multi-hot sparse features
    (a bag of 16 ids each, embedded by ``Gather`` and summed), pairwise dot products of the 9
    vectors (a batched ``MatMul``; the upper triangle taken by a fixed index ``Gather``), and
    a wide top MLP to one logit."""

    def __init__(self, d: int = 256, tables: int = 8) -> None:
        super().__init__()
        self.bottom = nn.Sequential(nn.Linear(13, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                                    nn.Linear(256, d), nn.ReLU())
        self.tables = nn.ModuleList(nn.Embedding(VOCAB, d) for _ in range(tables))
        n = tables + 1
        rows, cols = torch.triu_indices(n, n, 1)
        self.register_buffer("pairs", rows * n + cols)
        widths = (d + len(rows), 1024, 1024, 512, 256)
        self.top = nn.Sequential(*(m for a, b in zip(widths, widths[1:]) for m in (nn.Linear(a, b), nn.ReLU())),
                                 nn.Linear(widths[-1], 1))

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:  # sparse [b, 8, 16]
        x = self.bottom(dense)
        bags = (t(sparse[:, i]).sum(1) for i, t in enumerate(self.tables))
        z = torch.stack([x, *bags], 1)  # [b, 9, d]
        dots = (z @ z.transpose(1, 2)).flatten(1)[:, self.pairs]
        return self.top(torch.cat([x, dots], 1))


class LinearAttention(nn.Module):
    """Causal linear attention (elu + 1 features): running sums over time of k v^T and of k
    (a MatMul by a lower-triangular ones matrix) stand in for the softmax's t x t matrix."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)

    @staticmethod
    def feature(x: torch.Tensor) -> torch.Tensor:
        return torch.exp(x.clamp(max=0)) + torch.relu(x)  # elu(x) + 1: Elu has no gradient builder

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (y.reshape(b, t, self.heads, d // self.heads)
                   for y in self.qkv(x).split(d, dim=2))
        q, k = self.feature(q), self.feature(k)
        prefix = torch.ones(t, t).tril()  # running sums as a MatMul: CumSum has no gradient builder
        kv = (prefix @ (k.unsqueeze(-1) * v.unsqueeze(-2)).reshape(b, t, -1)).reshape(
            b, t, self.heads, d // self.heads, d // self.heads)  # [b, t, h, dk, dv]
        num = (q.unsqueeze(-2) @ kv).squeeze(-2)  # [b, t, h, dv]
        den = (q * (prefix @ k.reshape(b, t, d)).reshape(k.shape)).sum(-1, keepdim=True)
        return self.proj((num / den).reshape(b, t, d))


class LinearLM(nn.Module):
    """A causal language model of two pre-norm linear-attention layers, logits per token."""

    def __init__(self, d: int = 64) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, d)
        self.ln = nn.ModuleList(nn.LayerNorm(d) for _ in range(5))
        self.attn = nn.ModuleList(LinearAttention(d, 4) for _ in range(2))
        self.mlp = nn.ModuleList(nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
                                 for _ in range(2))
        self.head = nn.Linear(d, CLASSES)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(input_ids)
        for i, (attn, mlp) in enumerate(zip(self.attn, self.mlp)):
            x = x + attn(self.ln[2 * i](x))
            x = x + mlp(self.ln[2 * i + 1](x))
        return self.head(self.ln[4](x)).reshape(-1, CLASSES)


class SelectiveScan(nn.Module):
    """A Mamba-style selective state-space layer, its scan unrolled over the sequence: the step
    size ``dt``, the input and output projections ``B`` and ``C`` depend on the token; the state
    decays by ``exp(dt * A)`` per channel and state slot; a sigmoid gate on the output."""

    def __init__(self, d: int, state: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.inp = nn.Linear(d, 2 * d)
        self.dt = nn.Linear(d, d)
        self.bc = nn.Linear(d, 2 * state)
        self.a_log = nn.Parameter(torch.log(torch.arange(1, state + 1, dtype=torch.float32)).repeat(d, 1))
        self.out = nn.Linear(d, d)
        self.state = state

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [b, seq, d]
        u, gate = self.inp(self.norm(x)).chunk(2, -1)
        dt = torch.relu(self.dt(u)) + 0.01
        b_in, c_out = self.bc(u).chunk(2, -1)
        a = -torch.exp(self.a_log)
        h = torch.zeros(x.shape[0], x.shape[2], self.state)
        ys = []
        for t in range(x.shape[1]):
            step = dt[:, t, :, None]
            h = torch.exp(step * a) * h + step * b_in[:, t, None, :] * u[:, t, :, None]
            ys.append((h * c_out[:, t, None, :]).sum(-1))
        return x + self.out(torch.stack(ys, 1) * torch.sigmoid(gate))


class SelectiveScanLM(nn.Module):
    """A language model of two selective-scan layers, logits per token."""

    def __init__(self, d: int = 64, state: int = 8) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, d)
        self.layers = nn.ModuleList(SelectiveScan(d, state) for _ in range(2))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, CLASSES)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x)).reshape(-1, CLASSES)


class SamplingAutoencoder(nn.Module):
    """A VAE's encoder and decoder: strided convs to a mean and a log-variance per latent
    pixel, a sample drawn by the reparameterization (``randn_like``: ``RandomNormalLike``),
    dropout in the decoder, upsampling by ``Tile``. Trained on the reconstruction (MSE) only:
    ``generate_artifacts`` puts its loss on one output, so the KL term is left out."""

    def __init__(self, latent: int = 16) -> None:
        super().__init__()
        self.encode = nn.Sequential(nn.Conv2d(3, 32, 3, 2, 1), nn.ReLU(), nn.Conv2d(32, 64, 3, 2, 1), nn.ReLU())
        self.stats = nn.Conv2d(64, 2 * latent, 1)
        self.decode = nn.Sequential(nn.Conv2d(latent, 64, 3, 1, 1), nn.ReLU(), nn.Dropout(0.1))
        self.up1, self.up2 = nn.Conv2d(64, 32, 3, 1, 1), nn.Conv2d(32, 3, 3, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mu, logvar = self.stats(self.encode(x)).chunk(2, dim=1)
        z = mu + torch.exp(0.5 * logvar) * torch.randn_like(mu)
        h = _double_tile(self.decode(z))
        return self.up2(_double_tile(torch.relu(self.up1(h))))


class PointNet(nn.Module):
    """PointNet over 512 points of (x, y, z): a T-Net predicts a 3 x 3 transform applied by a
    batched ``MatMul``, shared per-point MLPs (1 x 1 ``Conv1d``, BatchNorm), a symmetric max
    over the points, and a classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.tnet = nn.Sequential(nn.Conv1d(3, 64, 1), nn.ReLU(), nn.Conv1d(64, 128, 1), nn.ReLU())
        self.tnet_head = nn.Linear(128, 9)
        self.mlp = nn.Sequential(nn.Conv1d(3, 64, 1), nn.BatchNorm1d(64), nn.ReLU(), nn.Conv1d(64, 128, 1),
                                 nn.BatchNorm1d(128), nn.ReLU(), nn.Conv1d(128, 256, 1))
        self.head = nn.Sequential(nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, CLASSES))

    @staticmethod
    def pool(x: torch.Tensor) -> torch.Tensor:
        """The max over the points, as a ``MaxPool`` over all of them: ``ReduceMax`` has no
        gradient builder."""
        return nn.functional.max_pool1d(x, x.shape[2]).flatten(1)

    def forward(self, points: torch.Tensor) -> torch.Tensor:  # [b, 3, n]
        t = self.tnet_head(self.pool(self.tnet(points))).reshape(-1, 3, 3) + torch.eye(3)
        x = self.mlp(t.transpose(1, 2) @ points)
        return self.head(self.pool(x))


class FiLMNet(nn.Module):
    """A conditional conv net: a class id picks (``Gather``) a per-channel scale and shift
    that modulate every block's features (FiLM: broadcast ``Mul`` and ``Add`` over [b, c, 1, 1])."""

    def __init__(self, conditions: int = 16) -> None:
        super().__init__()
        widths = (3, 32, 64, 64)
        self.convs = nn.ModuleList(nn.Conv2d(a, b, 3, 1 + (k > 0), 1) for k, (a, b) in enumerate(zip(widths, widths[1:])))
        self.film = nn.ModuleList(nn.Embedding(conditions, 2 * b) for b in widths[1:])
        self.head = nn.Linear(widths[-1], CLASSES)

    def forward(self, x: torch.Tensor, condition: torch.Tensor) -> torch.Tensor:
        for conv, film in zip(self.convs, self.film):
            scale, shift = film(condition)[:, :, None, None].chunk(2, dim=1)
            x = torch.relu(conv(x) * (1 + scale) + shift)
        return self.head(x.mean((2, 3)))


class ODEClassifier(nn.Module):
    """A neural ODE unrolled: four fixed RK4 steps of one MLP vector field (each step calls it
    four times, so its weights' gradients sum sixteen contributions), then a classifier."""

    def __init__(self, d: int = 64, steps: int = 4) -> None:
        super().__init__()
        self.inp = nn.Linear(32, d)
        self.field = nn.Sequential(nn.Linear(d, 2 * d), nn.Tanh(), nn.Linear(2 * d, d))
        self.steps = steps
        self.head = nn.Linear(d, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [b, t, 32]: each token its own trajectory
        h, dt = self.inp(x), 1.0 / self.steps
        for _ in range(self.steps):
            k1 = self.field(h)
            k2 = self.field(h + dt / 2 * k1)
            k3 = self.field(h + dt / 2 * k2)
            k4 = self.field(h + dt * k3)
            h = h + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        return self.head(h.mean(1))


def _squash(s: torch.Tensor) -> torch.Tensor:
    n2 = (s * s).sum(-1, keepdim=True)
    return s * (n2 / (1 + n2)) / torch.sqrt(n2 + 1e-8)


class CapsuleNet(nn.Module):
    """A capsule network: primary capsules from a conv, votes for 10 class capsules by a
    batched ``MatMul``, three rounds of routing by agreement (softmax over the classes), and
    the class capsules' lengths as logits."""

    def __init__(self, caps: int = 8, dim: int = 16) -> None:
        super().__init__()
        self.caps, self.dim = caps, dim
        self.conv = nn.Sequential(nn.Conv2d(1, 64, 5, 2, 2), nn.ReLU(), nn.Conv2d(64, 16 * caps, 3, 2, 1))
        self.votes = nn.Parameter(0.05 * torch.randn(16 * 7 * 7, CLASSES * dim, caps))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [b, 1, 28, 28]
        u = _squash(self.conv(x).reshape(x.shape[0], -1, self.caps))  # [b, 784 capsules, caps]
        n = u.shape[1]
        v = (self.votes @ u.unsqueeze(-1)).reshape(x.shape[0], n, CLASSES, self.dim)  # [b, n, 10, dim]
        logits = torch.zeros(x.shape[0], n, CLASSES)
        for _ in range(3):
            c = logits.softmax(-1)
            out = _squash((c.unsqueeze(-1) * v).sum(1))  # [b, 10, dim]
            logits = logits + (v * out.unsqueeze(1)).sum(-1)
        return torch.sqrt((out * out).sum(-1) + 1e-8) * 10.0


class ConvNeXtBlock(nn.Module):
    """A ConvNeXt block: depthwise 7 x 7 conv, channels-last LayerNorm (``Transpose``), an
    inverted 4x MLP with GELU, a learned per-channel layer scale, the residual."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.dw = nn.Conv2d(d, d, 7, 1, 3, groups=d)
        self.ln = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.gamma = nn.Parameter(torch.full((d,), 0.1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.mlp(self.ln(self.dw(x).permute(0, 2, 3, 1))) * self.gamma
        return x + h.permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    """ConvNeXt-style: a 2 x 2 patchify stem, two stages of two blocks, a LayerNorm'd strided
    downsample between them, global mean pool."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 2, 2)
        self.stage1 = nn.Sequential(ConvNeXtBlock(32), ConvNeXtBlock(32))
        self.down_ln, self.down = nn.LayerNorm(32), nn.Conv2d(32, 64, 2, 2)
        self.stage2 = nn.Sequential(ConvNeXtBlock(64), ConvNeXtBlock(64))
        self.ln, self.head = nn.LayerNorm(64), nn.Linear(64, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stage1(self.stem(x))
        x = self.down(self.down_ln(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2))
        return self.head(self.ln(self.stage2(x).mean((2, 3))))


class MaskedLM(nn.Module):
    """A masked language model: a padding mask as a second input (its zeros hide keys through
    ``Equal`` + ``Where``), post-LN encoder layers, and an output layer tied to the input
    embedding (one weight read by ``Gather`` and by a transposed ``MatMul``)."""

    def __init__(self, d: int = 64, layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.tok, self.pos = nn.Embedding(VOCAB, d), nn.Parameter(0.02 * torch.randn(SEQ, d))
        nn.init.normal_(self.tok.weight, std=0.02)  # as BERT's: the tied head's logits start small
        self.qkv = nn.ModuleList(nn.Linear(d, 3 * d) for _ in range(layers))
        self.proj = nn.ModuleList(nn.Linear(d, d) for _ in range(layers))
        self.ln = nn.ModuleList(nn.LayerNorm(d) for _ in range(2 * layers))
        self.mlp = nn.ModuleList(nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
                                 for _ in range(layers))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        x = self.tok(input_ids) + self.pos
        b, t, d = x.shape
        hidden = (attention_mask == 0)[:, None, None, :]
        for k, (qkv, proj, mlp) in enumerate(zip(self.qkv, self.proj, self.mlp)):
            q, kk, v = (y.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for y in qkv(x).split(d, 2))
            att = (q @ kk.transpose(-2, -1) / float(np.sqrt(d // self.heads))).masked_fill(hidden, -1e4)
            x = self.ln[2 * k](x + proj((att.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d)))
            x = self.ln[2 * k + 1](x + mlp(x))
        return (x @ self.tok.weight.t()).reshape(-1, VOCAB)


class TimeConditionedUNet(nn.Module):
    """A diffusion model's noise predictor: a float timestep input embedded sinusoidally
    (``Sin``, ``Cos`` of the time times fixed frequencies), an MLP of it added per channel to
    each block, a two-level conv encoder-decoder with a skip concatenation."""

    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.register_buffer("freqs", torch.exp(-np.log(1000.0) * torch.arange(8) / 8))
        self.time = nn.Sequential(nn.Linear(16, 4 * d), nn.SiLU(), nn.Linear(4 * d, 4 * d))
        self.down1, self.down2 = nn.Conv2d(3, d, 3, 1, 1), nn.Conv2d(d, 2 * d, 3, 2, 1)
        self.t1, self.t2 = nn.Linear(4 * d, d), nn.Linear(4 * d, 2 * d)
        self.mid = nn.Conv2d(2 * d, 2 * d, 3, 1, 1)
        self.up = nn.Conv2d(2 * d + d, d, 3, 1, 1)
        self.out = nn.Conv2d(d, 3, 3, 1, 1)

    def forward(self, x: torch.Tensor, timestep: torch.Tensor) -> torch.Tensor:
        angles = timestep[:, None] * 1000.0 * self.freqs
        emb = self.time(torch.cat([torch.sin(angles), torch.cos(angles)], 1))
        h1 = nn.functional.silu(self.down1(x) + self.t1(emb)[:, :, None, None])
        h2 = nn.functional.silu(self.down2(h1) + self.t2(emb)[:, :, None, None])
        h2 = nn.functional.silu(self.mid(h2))
        up = _double_tile(h2)
        return self.out(nn.functional.silu(self.up(torch.cat([up, h1], 1))))


class DenseLayer(nn.Module):
    """DenseNet-BC's layer: BN-ReLU-1x1 conv to 4 x growth, BN-ReLU-3x3 conv to ``growth``,
    its output concatenated to its input (every earlier feature map stays an input)."""

    def __init__(self, c: int, growth: int) -> None:
        super().__init__()
        self.f = nn.Sequential(nn.BatchNorm2d(c), nn.ReLU(), nn.Conv2d(c, 4 * growth, 1, bias=False),
                               nn.BatchNorm2d(4 * growth), nn.ReLU(),
                               nn.Conv2d(4 * growth, growth, 3, 1, 1, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, self.f(x)], 1)


class DenseNet(nn.Module):
    """DenseNet-BC: three dense blocks of four layers (growth 12) with compressing transitions
    (BN-ReLU-1x1 conv, 2 x 2 max pool: see the README on average pooling) between them: the concatenations keep every
    feature map of a block alive to its end (the memory-efficient DenseNet's case)."""

    def __init__(self, growth: int = 12, layers: int = 4) -> None:
        super().__init__()
        c = 2 * growth
        parts: list[nn.Module] = [nn.Conv2d(3, c, 3, 1, 1, bias=False)]
        for block in range(3):
            for _ in range(layers):
                parts.append(DenseLayer(c, growth))
                c += growth
            if block < 2:
                parts += [nn.BatchNorm2d(c), nn.ReLU(), nn.Conv2d(c, c // 2, 1, bias=False), nn.MaxPool2d(2)]
                c //= 2
        self.features = nn.Sequential(*parts, nn.BatchNorm2d(c), nn.ReLU())
        self.head = nn.Linear(c, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean((2, 3)))


class Coupling(nn.Module):
    """RealNVP's affine coupling: half the features, through an MLP, give the other half's
    log-scale (``tanh``-bounded) and shift; ``flip`` swaps the halves' roles."""

    def __init__(self, d: int, hidden: int, flip: bool) -> None:
        super().__init__()
        self.flip = flip
        self.net = nn.Sequential(nn.Linear(d // 2, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, d))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = x.chunk(2, -1)
        if self.flip:
            a, b = b, a
        log_s, t = self.net(a).chunk(2, -1)
        log_s = torch.tanh(log_s)
        b = b * torch.exp(log_s) + t
        out = torch.cat([b, a] if self.flip else [a, b], -1)
        return out, log_s.sum(-1)


class RealNVP(nn.Module):
    """A normalizing flow over 8 x 8 images flattened to 64 features: 12 affine couplings
    with alternating halves; the output is each sample's negative log-likelihood under a
    standard normal base (``0.5 * |z|^2 - log|det J|``, constants dropped)."""

    def __init__(self, d: int = 64, hidden: int = 1024, couplings: int = 12) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Coupling(d, hidden, k % 2 == 1) for k in range(couplings))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [b, 64]
        log_det = torch.zeros(x.shape[0])
        for layer in self.layers:
            x, ld = layer(x)
            log_det = log_det + ld
        return (0.5 * (x * x).sum(-1) - log_det).unsqueeze(-1)


class RBFKANLayer(nn.Module):
    """A Kolmogorov-Arnold layer with radial basis functions: every input feature is spread
    over ``grid`` Gaussian bumps (``exp(-((x - c) / h)^2)``, an [batch, in, grid] tensor) and
    a linear map of all bumps, plus a SiLU base path, gives the outputs."""

    def __init__(self, d_in: int, d_out: int, grid: int = 8) -> None:
        super().__init__()
        self.register_buffer("centers", torch.linspace(-2.0, 2.0, grid))
        self.width = 4.0 / (grid - 1)
        self.spline = nn.Linear(d_in * grid, d_out, bias=False)
        self.base = nn.Linear(d_in, d_out)
        self.norm = nn.LayerNorm(d_in)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x)
        bumps = torch.exp(-((x.unsqueeze(-1) - self.centers) / self.width) ** 2)
        return self.spline(bumps.flatten(1)) + self.base(x * torch.sigmoid(x))


def kan() -> nn.Module:
    """A three-layer RBF KAN classifier over 256 features."""
    return nn.Sequential(RBFKANLayer(256, 128), RBFKANLayer(128, 128), RBFKANLayer(128, CLASSES))


class GQALayer(nn.Module):
    """A decoder layer with grouped-query attention (8 query heads share 2 key/value heads,
    ``repeat_interleave``) and ALiBi: a fixed per-head linear distance penalty added to the
    scores, with the causal mask, instead of position embeddings; pre-LN, a GELU MLP."""

    def __init__(self, d: int, heads: int, kv_heads: int, alibi: torch.Tensor) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.dh = heads, kv_heads, d // heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.q = nn.Linear(d, d)
        self.kv = nn.Linear(d, 2 * kv_heads * self.dh)
        self.o = nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.alibi = alibi

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.ln1(x)
        q = self.q(h).reshape(b, t, self.heads, self.dh).transpose(1, 2)
        k, v = (y.reshape(b, t, self.kv_heads, self.dh).transpose(1, 2)
                for y in self.kv(h).split(self.kv_heads * self.dh, dim=2))
        group = self.heads // self.kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = q @ k.transpose(-1, -2) / self.dh ** 0.5 + self.alibi
        y = scores.softmax(-1) @ v
        x = x + self.o(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class GQADecoder(nn.Module):
    """A decoder LM with grouped-query attention and ALiBi (a [heads, t, t] buffer: slopes
    2^-(8k/heads) times the key's distance back, -inf ahead)."""

    def __init__(self, d: int = 128, layers: int = 3, heads: int = 8, kv_heads: int = 2) -> None:
        super().__init__()
        slopes = torch.tensor([2.0 ** (-8.0 * (k + 1) / heads) for k in range(heads)])
        pos = torch.arange(SEQ)
        distance = (pos[None, :] - pos[:, None]).float()  # key - query: <= 0 behind
        bias = slopes[:, None, None] * distance.clamp(max=0)
        self.register_buffer("alibi", bias.masked_fill(distance > 0, float("-inf")))
        self.tok = nn.Embedding(VOCAB, d)
        self.layers = nn.ModuleList(GQALayer(d, heads, kv_heads, self.alibi) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, VOCAB)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.ln(x)).reshape(-1, VOCAB)


class ResNeXtBlock(nn.Module):
    """A ResNeXt bottleneck: 1x1 conv, a grouped 3x3 conv (cardinality 8), 1x1 conv, each with
    BatchNorm, ReLU between, the residual added before the last ReLU."""

    def __init__(self, c: int, width: int, groups: int = 8) -> None:
        super().__init__()
        self.f = nn.Sequential(nn.Conv2d(c, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                               nn.Conv2d(width, width, 3, 1, 1, groups=groups, bias=False), nn.BatchNorm2d(width),
                               nn.ReLU(), nn.Conv2d(width, c, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.f(x))


class ResNeXt(nn.Module):
    """ResNeXt-style: a stem conv, two stages of two grouped-convolution bottlenecks with a
    strided conv between them, global mean pool."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU())
        self.stage1 = nn.Sequential(ResNeXtBlock(64, 64), ResNeXtBlock(64, 64))
        self.down = nn.Sequential(nn.Conv2d(64, 128, 3, 2, 1, bias=False), nn.BatchNorm2d(128), nn.ReLU())
        self.stage2 = nn.Sequential(ResNeXtBlock(128, 128), ResNeXtBlock(128, 128))
        self.head = nn.Linear(128, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stage2(self.down(self.stage1(self.stem(x)))).mean((2, 3)))


class LongContextEncoder(nn.Module):
    """An encoder over 256 tokens (d 64, 4 heads, two post-LN layers): the [batch, 4, 256,
    256] attention scores and probabilities outweigh every other activation, the case
    FlashAttention-style recompute is for."""

    def __init__(self, d: int = 64, layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, d)
        self.pos = nn.Parameter(0.02 * torch.randn(LONG_SEQ, d))
        self.layers = nn.ModuleList(nn.TransformerEncoderLayer(d, heads, 2 * d, dropout=0.0, batch_first=True)
                                    for _ in range(layers))
        self.head = nn.Linear(d, CLASSES)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(input_ids) + self.pos
        for layer in self.layers:
            x = layer(x)
        return self.head(x.mean(1))


class WavEncoder(nn.Module):
    """A wav2vec-style feature encoder over 1 s of 16 kHz audio: five strided Conv1d (kernel
    10, 3, 3, 3, 2; strides 5, 2, 2, 2, 2) with GELU, the first one's [batch, 64, 3199]
    output the largest activation; LayerNorm over channels (``Transpose``), mean pool."""

    def __init__(self, c: int = 64) -> None:
        super().__init__()
        shapes = ((1, 10, 5), (c, 3, 2), (c, 3, 2), (c, 3, 2), (c, 2, 2))
        self.convs = nn.Sequential(*(m for c_in, k, stride in shapes
                                     for m in (nn.Conv1d(c_in, c, k, stride), nn.GELU())))
        self.ln, self.head = nn.LayerNorm(c), nn.Linear(c, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [b, 1, 16000]
        return self.head(self.ln(self.convs(x).transpose(1, 2)).mean(1))


class HyperNet(nn.Module):
    """A hypernetwork: a context vector per sample generates the weights of the main
    network's two layers (a [batch, 64, 64] tensor each, from ``Linear`` + ``Reshape``),
    which a batched ``MatMul`` applies to that sample's features."""

    def __init__(self, d: int = 64, ctx: int = 16) -> None:
        super().__init__()
        self.d = d
        self.embed = nn.Linear(d, d)
        self.gen = nn.ModuleList(nn.Sequential(nn.Linear(ctx, 128), nn.ReLU(), nn.Linear(128, d * d))
                                 for _ in range(2))
        self.head = nn.Linear(d, CLASSES)

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:  # [b, 64], [b, 16]
        h = torch.relu(self.embed(x)).unsqueeze(1)  # [b, 1, d]
        for gen in self.gen:
            w = gen(context).reshape(-1, self.d, self.d) / self.d ** 0.5
            h = torch.relu(h @ w)
        return self.head(h.squeeze(1))


def keyword_net() -> nn.Module:
    """A keyword spotter over 40 x 128 audio features: Conv1d + GELU layers, mean pool.
    (With ``groups=4`` in its second Conv1d ORT 1.19.2 corrupts its heap: see the README.)"""
    return nn.Sequential(
        nn.Conv1d(40, 64, 5, 1, 2), nn.GELU(), nn.Conv1d(64, 128, 3, 2, 1), nn.GELU(),
        nn.Conv1d(128, 128, 3, 1, 1), nn.GELU(), nn.AdaptiveAvgPool1d(1), nn.Flatten(),
        nn.Linear(128, CLASSES))


class KLDivLoss(blocks.Block):
    """Distillation loss: KL(softmax(target) || softmax(logits)), summed over the classes and
    averaged over the batch; ``target`` holds a teacher's logits, shaped like the output."""

    def build(self, logits: str, target: str = "target") -> str:
        if not _graph_utils.node_arg_exists(self.base, target):
            target = blocks.InputLike(logits)(target)
        graph = self.base.graph
        axes = _graph_utils.generate_graph_name("kl.axes")
        graph.initializer.append(numpy_helper.from_array(np.array([-1], np.int64), axes))

        def node(op: str, inputs: list[str], **attrs) -> str:
            out = _graph_utils.generate_graph_name(f"kl.{op.lower()}")
            graph.node.append(onnx.helper.make_node(
                op, inputs, [out], _graph_utils.generate_graph_name(f"kl.{op}"), **attrs))
            return out

        log_q = node("LogSoftmax", [logits], axis=-1)
        log_p = node("LogSoftmax", [target], axis=-1)
        p = node("Softmax", [target], axis=-1)
        per_row = node("ReduceSum", [node("Mul", [p, node("Sub", [log_p, log_q])]), axes],
                       keepdims=0)
        return node("ReduceMean", [per_row], keepdims=0)


class MeanLoss(blocks.Block):
    """The mean over the batch of the output less ``target``: for a model whose output is
    already each sample's loss (a flow's negative log-likelihood); ``target`` a per-sample
    baseline, shaped like the output (zeros in training)."""

    def build(self, output: str, target: str = "target") -> str:
        if not _graph_utils.node_arg_exists(self.base, target):
            target = blocks.InputLike(output)(target)
        graph = self.base.graph
        diff = _graph_utils.generate_graph_name("mean_loss.sub")
        loss = _graph_utils.generate_graph_name("mean_loss.mean")
        graph.node.append(onnx.helper.make_node("Sub", [output, target], [diff],
                                                _graph_utils.generate_graph_name("mean_loss.Sub")))
        graph.node.append(onnx.helper.make_node("ReduceMean", [diff], [loss],
                                                _graph_utils.generate_graph_name("mean_loss.ReduceMean"),
                                                keepdims=0))
        return loss


CUSTOM_LOSSES = {"KLDivLoss": KLDivLoss, "MeanLoss": MeanLoss}  # onnxblock losses of this file, not a LossType


def specs() -> list[Spec]:
    CE, MSE = "CrossEntropyLoss", "MSELoss"
    logits = Tensor("logits", ("batch", CLASSES))
    ids = (Tensor("input_ids", ("batch", SEQ), "int64", VOCAB),)
    ids64 = (Tensor("input_ids", ("batch", 64), "int64", VOCAB),)
    seq = (Tensor("input", ("batch", SEQ, 32)),)
    return [
        Spec("mlp", 17, CE, lambda: mlp(False), (Tensor("input", ("batch", 256)),), logits, 256),
        Spec("mlp_dropout", 17, CE, lambda: mlp(True), (Tensor("input", ("batch", 256)),),
             logits, 256),
        Spec("lenet", 15, CE, lenet, (Tensor("input", ("batch", 1, 28, 28)),), logits, 256),
        Spec("resnet_block", 17, CE, resnet_block, (Tensor("input", ("batch", 3, 32, 32)),),
             logits, 32),
        Spec("bert", 16, CE, lambda: Transformer(2, 128, False), ids, logits, 64),
        Spec("bert17", 17, CE, lambda: Transformer(2, 128, False), ids, logits, 64,
             ln_stats=True),
        Spec("gpt", 15, CE, lambda: Transformer(4, 128, True), ids,
             Tensor("logits", (f"batch*{SEQ}", VOCAB)), 32),
        Spec("embed_ln", 14, CE, EmbedLN, ids64, logits, 64),
        Spec("embed_ln17", 17, CE, EmbedLN, ids64, logits, 64, ln_stats=True),
        Spec("lstm", 14, MSE, lambda: Recurrent("LSTM"), seq, Tensor("pred", ("batch", 4)), 64),
        Spec("enc_dropout_bce", 16, "BCEWithLogitsLoss", DropoutEncoder, ids, Tensor("logits", ("batch", 1)), 64),
        Spec("tagger", 17, CE, Tagger, (Tensor("input_ids", ("batch", "seq"), "int64", VOCAB),),
             Tensor("logits", ("tokens", TAGS)), 64, ln_stats=True),
        Spec("gru", 14, MSE, lambda: Recurrent("GRU"), seq, Tensor("pred", ("batch", 4)), 64),
        Spec("unet", 17, MSE, UNet, (Tensor("input", ("batch", 3, 32, 32)),), Tensor("pred", ("batch", 3, 32, 32)), 16),
        Spec("denoiser", 17, MSE, Denoiser, (Tensor("input", ("batch", 3, 32, 32)),),
             Tensor("pred", ("batch", 3, 32, 32)), 16),
        Spec("mobilenet_v2", 17, CE, mobilenet_v2, (Tensor("input", ("batch", 3, 32, 32)),),
             logits, 32),
        Spec("vit", 17, CE, ViT, (Tensor("input", ("batch", 3, 32, 32)),), logits, 32,
             ln_stats=True),
        Spec("seq2seq", 17, CE, Seq2Seq, (*(Tensor(n, ("batch", SEQ), "int64", VOCAB)
                                            for n in ("src_ids", "tgt_ids")),),
             Tensor("logits", (f"batch*{SEQ}", VOCAB)), 16, ln_stats=True),
        Spec("llama", 17, CE, Llama, ids, Tensor("logits", (f"batch*{SEQ}", VOCAB)), 16),
        Spec("frozen_backbone", 17, "L1Loss", FrozenBackbone,
             (Tensor("input", ("batch", 3, 32, 32)),), Tensor("pred", ("batch", 4)), 16),
        Spec("keyword_kl", 17, "KLDivLoss", keyword_net, (Tensor("input", ("batch", 40, 128)),),
             logits, 64),
        Spec("mixer", 17, CE, Mixer, (Tensor("input", ("batch", 3, 32, 32)),), logits, 32, ln_stats=True),
        Spec("tcn", 17, CE, GatedTCN, (Tensor("input", ("batch", 16, 256)),), logits, 32),
        Spec("video3d", 17, CE, Video3D, (Tensor("input", ("batch", 3, 4, 16, 16)),), logits, 8),
        Spec("latent", 17, CE, LatentAttention, (Tensor("input", ("batch", 64, 32)),), logits, 32, ln_stats=True),
        Spec("conformer", 17, CE, Conformer, (Tensor("input", ("batch", 64, 40)),), logits, 32, ln_stats=True),
        Spec("moe", 17, CE, MoE, ids, logits, 32, ln_stats=True),
        Spec("gnn", 17, CE, GraphConvNet, (Tensor("input", ("batch", 64, 16)),), logits, 64),
        Spec("se_autoencoder", 17, MSE, SEAutoencoder, (Tensor("input", ("batch", 3, 32, 32)),),
             Tensor("pred", ("batch", 3, 32, 32)), 16),
        Spec("swin", 17, CE, Swin, (Tensor("input", ("batch", 3, 32, 32)),), logits, 32, ln_stats=True),
        Spec("dual_encoder", 17, CE, DualEncoder, (Tensor("input", ("batch", 3, 32, 32)),), logits, 32,
             ln_stats=True),
        Spec("recommender", 17, "BCEWithLogitsLoss", Recommender,
             (Tensor("dense", ("batch", 13)), Tensor("sparse", ("batch", 8, 16), "int64", VOCAB)),
             Tensor("logits", ("batch", 1)), 64),
        Spec("sampling_ae", 17, MSE, SamplingAutoencoder, (Tensor("input", ("batch", 3, 32, 32)),),
             Tensor("pred", ("batch", 3, 32, 32)), 16),
        Spec("pointnet", 17, CE, PointNet, (Tensor("input", ("batch", 3, 512)),), logits, 32),
        Spec("film", 17, CE, FiLMNet, (Tensor("input", ("batch", 3, 32, 32)),
                                       Tensor("condition", ("batch",), "int64", 16)), logits, 32),
        Spec("ode", 17, CE, ODEClassifier, (Tensor("input", ("batch", SEQ, 32)),), logits, 32),
        Spec("capsules", 17, CE, CapsuleNet, (Tensor("input", ("batch", 1, 28, 28)),), logits, 16),
        Spec("convnext", 17, CE, ConvNeXt, (Tensor("input", ("batch", 3, 32, 32)),), logits, 32, ln_stats=True),
        Spec("masked_lm", 17, CE, MaskedLM, (*ids, Tensor("attention_mask", ("batch", SEQ), "int64", 2)),
             Tensor("logits", (f"batch*{SEQ}", VOCAB)), 16, ln_stats=True),
        Spec("diffusion", 17, MSE, TimeConditionedUNet, (Tensor("input", ("batch", 3, 32, 32)),
                                                        Tensor("timestep", ("batch",))),
             Tensor("pred", ("batch", 3, 32, 32)), 16),
        Spec("linear_lm", 17, CE, LinearLM, ids, Tensor("logits", (f"batch*{SEQ}", CLASSES)), 16,
             ln_stats=True),
        Spec("selective_scan", 17, CE, SelectiveScanLM, ids, Tensor("logits", (f"batch*{SEQ}", CLASSES)), 16,
             ln_stats=True),
        Spec("densenet", 17, CE, DenseNet, (Tensor("input", ("batch", 3, 32, 32)),), logits, 16),
        Spec("flow", 17, "MeanLoss", RealNVP, (Tensor("input", ("batch", 64)),), Tensor("nll", ("batch", 1)), 128),
        Spec("kan", 17, CE, kan, (Tensor("input", ("batch", 256)),), logits, 128, ln_stats=True),
        Spec("gqa", 17, CE, GQADecoder, ids, Tensor("logits", (f"batch*{SEQ}", VOCAB)), 16, ln_stats=True),
        Spec("resnext", 17, CE, ResNeXt, (Tensor("input", ("batch", 3, 16, 16)),), logits, 16),
        Spec("long_context", 17, CE, LongContextEncoder,
             (Tensor("input_ids", ("batch", LONG_SEQ), "int64", VOCAB),), logits, 8, ln_stats=True),
        Spec("wav_encoder", 17, CE, WavEncoder, (Tensor("input", ("batch", 1, 16000)),), logits, 8, ln_stats=True),
        Spec("hypernet", 17, CE, HyperNet, (Tensor("input", ("batch", 64)), Tensor("context", ("batch", 16))),
             logits, 64),
    ]


# ------------------------------------------------------------------ make
@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
    """Keep fd 2 (the exporter's warnings, the gradient builder's INFO log of every graph
    transformer) in a file and show it only if the block fails."""
    sys.stderr.flush()
    with tempfile.TemporaryFile() as log:
        saved = os.dup(2)
        os.dup2(log.fileno(), 2)
        try:
            yield
        except BaseException:
            sys.stderr.flush()
            os.dup2(saved, 2)
            log.seek(0)
            sys.stderr.write(log.read().decode(errors="replace")[-5000:])
            raise
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def axis_name(dim: str) -> str:
    return dim.replace("*", "_x_")


def export(spec: Spec) -> tuple[onnx.ModelProto, nn.Module]:
    torch.manual_seed(0)
    model = spec.build()
    model.train()
    args = tuple(torch.zeros(dims(t.shape, 2), dtype=getattr(torch, t.dtype))
                 for t in spec.inputs)
    axes = {t.name: {k: axis_name(d) for k, d in enumerate(t.shape) if isinstance(d, str)}
            for t in (*spec.inputs, spec.output)}
    buf = io.BytesIO()
    with quiet_stderr(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model, args, buf, input_names=[t.name for t in spec.inputs],
            output_names=[spec.output.name], dynamic_axes=axes, opset_version=spec.opset,
            training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
            dynamo=False, export_params=True)
    onnx_model = onnx.load_from_string(buf.getvalue())
    if spec.ln_stats:
        add_layernorm_stats(onnx_model)
    return onnx_model, model


def add_layernorm_stats(model: onnx.ModelProto) -> None:
    # ORT 1.19.2's LayerNormalization gradient reads the forward's Mean and InvStdDev outputs,
    # which the TorchScript exporter leaves out at opset 17.
    for node in model.graph.node:
        if node.op_type == "LayerNormalization" and node.domain in ("", "ai.onnx"):
            base = node.name or node.output[0]
            while len(node.output) < 3:
                node.output.append(f"{base}_{('mean', 'invstddev')[len(node.output) - 1]}")


def fix_eval_batchnorm(path: str) -> None:
    """Drop the running-statistics outputs of inference-mode BatchNormalization nodes.

    The exporter writes training-mode BatchNormalization with outputs Y, running_mean,
    running_var; generate_artifacts sets training_mode=0 in the eval model but keeps the three
    outputs, which ORT's shape inference rejects when Module loads the eval model.
    """
    model = onnx.load(path)
    used = {name for node in model.graph.node for name in node.input}
    used |= {o.name for o in model.graph.output}
    changed = False
    for node in model.graph.node:
        mode = next((a.i for a in node.attribute if a.name == "training_mode"), 0)
        if node.op_type == "BatchNormalization" and not mode and len(node.output) > 1:
            if any(name in used for name in node.output[1:]):
                raise RuntimeError(f"{node.name}: running statistics used in the eval model")
            del node.output[1:]
            changed = True
    if changed:
        onnx.save(model, path)


def generate(spec: Spec, out_dir: str) -> onnx.ModelProto:
    """Export and write the artifacts and zoo.json; return the exported forward model."""

    onnx_model, module = export(spec)
    inits = {i.name for i in onnx_model.graph.initializer}
    params = [n for n, p in module.named_parameters() if p.requires_grad]
    missing = [n for n in params if n not in inits]
    if missing:
        raise RuntimeError(f"parameters not exported as initializers: {missing}")
    frozen = [n for n, _ in module.named_buffers() if n in inits]
    frozen += [n for n, p in module.named_parameters() if not p.requires_grad]
    os.makedirs(out_dir, exist_ok=True)
    # onnxblock numbers the names it makes (onnx::loss::2) with a process-wide counter: restart
    # it so that a model's files do not depend on which models ran before it.
    _graph_utils._GRAPH_TOKEN = 0
    with quiet_stderr():
        artifacts.generate_artifacts(
            onnx_model, requires_grad=params, frozen_params=frozen,
            loss=CUSTOM_LOSSES[spec.loss]() if spec.loss in CUSTOM_LOSSES
            else getattr(artifacts.LossType, spec.loss), optimizer=artifacts.OptimType.AdamW,
            artifact_directory=out_dir)
    fix_eval_batchnorm(os.path.join(out_dir, "eval_model.onnx"))
    with open(os.path.join(out_dir, "zoo.json"), "w", encoding="utf-8") as f:
        json.dump(zoo_json(spec), f, indent=2)
        f.write("\n")
    return onnx_model


def zoo_json(spec: Spec) -> dict:
    out = {"name": spec.name, "opset": spec.opset, "loss": spec.loss, "batch": spec.batch,
           "inputs": [t.to_json() for t in spec.inputs], "label": spec.label.to_json()}
    if any("seq" in t.shape or "tokens" in t.shape for t in (*spec.inputs, spec.output)):
        out["seq"] = TAGGER_SEQ
    return out


def summary(spec: Spec, path: str) -> str:
    model = onnx.load(path)
    odd: dict[str, int] = {}
    for node in model.graph.node:
        onnx_domain = node.domain in ("", "ai.onnx")
        if not onnx_domain or not onnx.defs.has(node.op_type, spec.opset):
            key = f"{node.domain if not onnx_domain else 'onnx'}::{node.op_type}"
            odd[key] = odd.get(key, 0) + 1
    with open(path, "rb") as f:
        md5 = hashlib.md5(f.read()).hexdigest()[:12]
    ops = ", ".join(f"{k} x{v}" for k, v in sorted(odd.items())) or "-"
    return (f"{spec.name:13s} {os.path.getsize(path) / 1e3:8.1f} kB  md5 {md5}  "
            f"{len(model.graph.node):5d} nodes  non-standard: {ops}")


# ------------------------------------------------------------------ verify
def random_data(spec: Spec, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.RandomState(seed)
    out = {}
    for t in (*spec.inputs, spec.label):
        shape = dims(t.shape, spec.batch)
        if t.dtype == "int64":
            out[t.name] = rng.randint(0, t.bound, shape).astype(np.int64)
        else:
            out[t.name] = rng.randn(*shape).astype(np.float32)
    return out


def _session_options() -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return so


def session_loss(path: str, data: dict[str, np.ndarray], params: dict[str, np.ndarray]) -> float:
    """One run of the training graph in a plain InferenceSession, every input fed by hand."""
    sess = ort.InferenceSession(path, _session_options(), providers=["CPUExecutionProvider"])
    feeds = {}
    for inp in sess.get_inputs():
        name = inp.name
        if name in data:
            feeds[name] = data[name]
        elif name in params:
            feeds[name] = params[name]
        elif name.endswith("_grad.accumulation.buffer"):
            feeds[name] = np.zeros_like(params[name[:-len("_grad.accumulation.buffer")]])
        elif name == "lazy_reset_grad":
            feeds[name] = np.array([True])
        else:
            raise RuntimeError(f"unexpected training-graph input {name} {inp.shape}")
    return float(sess.run([sess.get_outputs()[0].name], feeds)[0])


def module_losses(out_dir: str, spec: Spec, steps: int = 2) -> list[float]:
    state = api.CheckpointState.load_checkpoint(os.path.join(out_dir, "checkpoint"))
    module = api.Module(os.path.join(out_dir, "training_model.onnx"), state,
                        os.path.join(out_dir, "eval_model.onnx"),
                        session_options=_session_options())
    optimizer = api.Optimizer(os.path.join(out_dir, "optimizer_model.onnx"), module)
    module.train()
    losses = []
    for step in range(steps):
        data = random_data(spec, seed=1 + step)
        loss = module(*(data[n] for n in module.input_names()))
        optimizer.step()
        module.lazy_reset_grad()
        losses.append(float(loss))
    return losses


def verify(spec: Spec, out_dir: str, forward: onnx.ModelProto) -> str:
    params = {i.name: numpy_helper.to_array(i) for i in forward.graph.initializer}
    with quiet_stderr():
        losses = [session_loss(os.path.join(out_dir, "training_model.onnx"),
                               random_data(spec, seed=1), params)]
        losses += module_losses(out_dir, spec)
    if not np.all(np.isfinite(losses)):
        raise RuntimeError(f"non-finite loss: {losses}")
    return (f"  verify ok at batch {spec.batch}: session loss {losses[0]:.4f}, "
            f"Module+AdamW losses {', '.join(f'{v:.4f}' for v in losses[1:])}")


# ------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", default=os.path.join(HERE, "zoo"))
    ap.add_argument("--only", type=lambda s: s.split(","), default=None, metavar="NAME[,NAME]")
    ap.add_argument("--list", action="store_true", help="list the model names and exit")
    ap.add_argument("--verify", action=argparse.BooleanOptionalAction, default=True)
    args = ap.parse_args(argv)
    zoo = {s.name: s for s in specs()}
    if args.list:
        for s in zoo.values():
            shapes = ", ".join(f"{t.name}{list(t.shape)}" for t in s.inputs)
            print(f"{s.name:13s} opset {s.opset}  {s.loss:16s} batch {s.batch:3d}  {shapes}")
        return 0
    unknown = sorted(set(args.only or []) - set(zoo))
    if unknown:
        ap.error(f"unknown model(s) {unknown}; --list shows them")
    failed = []
    for name in args.only or list(zoo):
        spec, out_dir = zoo[name], os.path.join(args.out_dir, name)
        try:
            forward = generate(spec, out_dir)
            print(summary(spec, os.path.join(out_dir, "training_model.onnx")), flush=True)
            if args.verify:
                print(verify(spec, out_dir, forward), flush=True)
        except Exception as err:  # one broken model must not stop the others
            print(f"{name:13s} FAILED: {type(err).__name__}: {err}", flush=True)
            failed.append(name)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
