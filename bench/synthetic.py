"""Synthetic transformer *training* graphs (forward + hand-written backward) in plain ONNX.

The graphs look like what a PyTorch joint-graph export produces: parameters are graph inputs
named by module path (``blocks.3.attn.wq``), data inputs ``tokens`` / ``labels`` (int64
[batch, seq]), a backward seed ``tangent_loss`` (scalar, feed 1.0); outputs are ``loss``
followed by ``<param>_grad`` for every parameter, in parameter order.  Node names carry
TorchScript-style scopes (``/blocks.3/attn/MatMul_1``); backward nodes live under the scope of
the forward node they differentiate (``/blocks.3/attn/MatMul_1_grad/Transpose``).  Only
standard ONNX ops (opset 18) are used and the embedding gradient is a one-hot MatMul, so the
gradients are deterministic on ORT CPU at any thread count.

The builder writes NodeProtos straight into one GraphProto (no per-node checks), so 100k+
nodes take a few seconds.

Big models: ``weight_scale_mb`` embeds random parameter values as initializers (parameters
stay graph inputs, i.e. overridable defaults) and raises ``d_model`` until the parameters
reach that size.  :func:`save_transformer` streams such weights chunk by chunk into one
external data file, so generating a > 2 GB model needs little RAM.

CLI::

    python -m bench.synthetic --layers 12 -o gpt12.onnx
    python -m bench.synthetic --layers 4 --big-weights 2.5 -o big.onnx   # > 2 GB, external
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import GraphProto, TensorProto, helper, numpy_helper

OPSET = 18
IR_VERSION = 10
_TWO_GB = 2**31
_ALIGN = 4096

__all__ = [
    "build_transformer",
    "save_transformer",
    "param_specs",
    "count_params",
    "big_weights_d_model",
    "estimate_nodes",
    "OPSET",
    "IR_VERSION",
]


# --------------------------------------------------------------------------- parameters


@dataclass(frozen=True)
class ParamSpec:
    name: str
    shape: tuple[int, ...]
    init: str  # "normal", "ones", "zeros"
    std: float = 0.02


def param_specs(layers: int, d_model: int, seq: int, vocab: int, ffn_mult: int) -> list[ParamSpec]:
    """Parameters in graph-input order (also the order of the ``*_grad`` outputs)."""
    d, f = d_model, ffn_mult * d_model
    out = [ParamSpec("tok_emb", (vocab, d), "normal"), ParamSpec("pos_emb", (seq, d), "normal")]
    for i in range(layers):
        p = f"blocks.{i}"
        out += [
            ParamSpec(f"{p}.ln1.weight", (d,), "ones"),
            ParamSpec(f"{p}.ln1.bias", (d,), "zeros"),
            ParamSpec(f"{p}.attn.wq", (d, d), "normal"),
            ParamSpec(f"{p}.attn.wk", (d, d), "normal"),
            ParamSpec(f"{p}.attn.wv", (d, d), "normal"),
            ParamSpec(f"{p}.attn.wo", (d, d), "normal"),
            ParamSpec(f"{p}.ln2.weight", (d,), "ones"),
            ParamSpec(f"{p}.ln2.bias", (d,), "zeros"),
            ParamSpec(f"{p}.mlp.fc1.weight", (d, f), "normal"),
            ParamSpec(f"{p}.mlp.fc1.bias", (f,), "zeros"),
            ParamSpec(f"{p}.mlp.fc2.weight", (f, d), "normal"),
            ParamSpec(f"{p}.mlp.fc2.bias", (d,), "zeros"),
        ]
    out += [
        ParamSpec("ln_f.weight", (d,), "ones"),
        ParamSpec("ln_f.bias", (d,), "zeros"),
        ParamSpec("lm_head.weight", (d, vocab), "normal"),
    ]
    return out


def count_params(layers: int, d_model: int, seq: int, vocab: int, ffn_mult: int) -> int:
    d, f = d_model, ffn_mult * d_model
    per_layer = 4 * d * d + 2 * d * f + f + 5 * d
    return layers * per_layer + 2 * vocab * d + seq * d + 2 * d


def big_weights_d_model(
    target_bytes: float, layers: int, d_model: int, heads: int, seq: int, vocab: int,
    ffn_mult: int, itemsize: int = 4,
) -> int:
    """Smallest d_model >= ``d_model`` (multiple of ``heads``*8) whose parameters reach
    ``target_bytes``."""
    step = heads * 8
    d = max(step, -(-d_model // step) * step)
    while count_params(layers, d, seq, vocab, ffn_mult) * itemsize < target_bytes:
        d += step
    return d


def estimate_nodes(layers: int, fused_layernorm: bool = False, gelu: str = "tanh") -> int:
    """Exact node count of :func:`build_transformer` (checked by the tests)."""
    ln_f, ln_b = (1, 2) if fused_layernorm else (10, 0)
    g_f, g_b = (9, 9) if gelu == "tanh" else (5, 7)
    ln_bwd = ln_b + 11
    per_layer_fwd = 2 * ln_f + 3 + 6 + 1 + 1 + 1 + 1 + 1 + 2 + 1 + 1 + 1 + 1 + g_f + 1 + 1 + 1
    lin_bwd = 6  # Transpose W, MatMul dX, Reshape X, Transpose X, Reshape dY, MatMul dW
    per_layer_bwd = (
        2 * ln_bwd + 2  # two norms + their residual accumulations
        + 6 * lin_bwd - 2 * 2  # q/k/v/o/fc1/fc2, q/k/v share Reshape+Transpose of ln1 out
        + 2  # accumulate the three q/k/v contributions to the ln1 output
        + 2  # fc1/fc2 bias grads
        + g_b
        + 2  # Reshape + Transpose into heads
        + 4  # attn-out MatMul grads
        + 4  # softmax grad
        + 1  # scale
        + 4  # scores MatMul grads
        + 6  # heads -> [B,S,D] for dq, dk, dv
    )
    head_fwd = 2 + ln_f + 1 + 2 + 1  # Gather, Add pos, final norm, lm head, reshapes, loss
    head_bwd = (
        1 + 2 + 1 + 1 + 1 + 1 + 1  # Exp, Reshape+Equal, Cast, Sub, Div, Mul, Reshape
        + lin_bwd + ln_bwd
        + 1 + 2 + 1 + 1 + 1 + 1  # pos grad, tokens Reshape+Equal, Cast, Transpose, Reshape dY, MatMul
    )
    return layers * (per_layer_fwd + per_layer_bwd) + head_fwd + head_bwd


# --------------------------------------------------------------------------- graph builder


class _Builder:
    """Appends NodeProtos to one GraphProto; names nodes TorchScript-style."""

    def __init__(self, dtype: np.dtype):
        self.graph = GraphProto()
        self.dtype = np.dtype(dtype)
        self.elem = helper.np_dtype_to_tensor_dtype(self.dtype)
        self._count: dict[tuple[str, str], int] = {}
        self._consts: dict[tuple, str] = {}

    def op(self, scope: str, op_type: str, inputs, n_out: int = 1, **attrs):
        key = (scope, op_type)
        k = self._count.get(key, 0)
        self._count[key] = k + 1
        name = f"{scope}/{op_type}" if k == 0 else f"{scope}/{op_type}_{k}"
        outs = [f"{name}_output_{j}" for j in range(n_out)]
        node = self.graph.node.add()
        node.op_type = op_type
        node.name = name
        node.input.extend(inputs)
        node.output.extend(outs)
        for a, v in attrs.items():
            node.attribute.append(helper.make_attribute(a, v))
        return outs[0] if n_out == 1 else outs

    def _init(self, name: str, arr: np.ndarray) -> str:
        self.graph.initializer.append(numpy_helper.from_array(arr, name))
        return name

    def scalar(self, v: float) -> str:
        key = ("f", float(v))
        if key not in self._consts:
            self._consts[key] = self._init(f"/const/scalar_{len(self._consts)}", np.array(v, dtype=self.dtype))
        return self._consts[key]

    def ints(self, vals) -> str:
        vals = tuple(int(v) for v in vals)
        key = ("i",) + vals
        if key not in self._consts:
            tag = "_".join(str(v).replace("-", "m") for v in vals)
            self._consts[key] = self._init(f"/const/i64_{tag}", np.array(vals, dtype=np.int64))
        return self._consts[key]

    def named(self, name: str, arr: np.ndarray) -> str:
        key = ("n", name)
        if key not in self._consts:
            self._consts[key] = self._init(name, arr)
        return self._consts[key]


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, list(shape))


# --------------------------------------------------------------------------- model pieces


@dataclass
class _Cfg:
    layers: int
    d: int
    heads: int
    seq: int
    batch: int
    vocab: int
    ffn: int
    fused_ln: bool
    gelu: str
    eps: float = 1e-5

    @property
    def dh(self):
        return self.d // self.heads

    @property
    def n(self):
        return self.batch * self.seq


class _Transformer:
    def __init__(self, b: _Builder, c: _Cfg):
        self.b, self.c = b, c
        self._flat_t: dict[str, str] = {}

    # --- forward helpers --------------------------------------------------------------
    def layernorm(self, scope, x, w, bias):
        b, c = self.b, self.c
        if self.c.fused_ln:
            y, mean, rstd = b.op(scope, "LayerNormalization", [x, w, bias], 3, axis=-1, epsilon=c.eps)
            return y, {"x": x, "mean": mean, "rstd": rstd, "w": w, "scope": scope, "xhat": None}
        ax = b.ints([-1])
        mean = b.op(scope, "ReduceMean", [x, ax], keepdims=1)
        xc = b.op(scope, "Sub", [x, mean])
        sq = b.op(scope, "Mul", [xc, xc])
        var = b.op(scope, "ReduceMean", [sq, ax], keepdims=1)
        ve = b.op(scope, "Add", [var, b.scalar(c.eps)])
        sd = b.op(scope, "Sqrt", [ve])
        rstd = b.op(scope, "Reciprocal", [sd])
        xhat = b.op(scope, "Mul", [xc, rstd])
        yw = b.op(scope, "Mul", [xhat, w])
        y = b.op(scope, "Add", [yw, bias])
        return y, {"x": x, "rstd": rstd, "w": w, "scope": scope, "xhat": xhat}

    def linear(self, scope, x, w):
        y = self.b.op(scope, "MatMul", [x, w])
        return y, {"x": x, "w": w, "scope": y.rsplit("_output_", 1)[0] + "_grad"}

    def gelu(self, scope, a):
        b = self.b
        if self.c.gelu == "tanh":
            a2 = b.op(scope, "Mul", [a, a])
            a3 = b.op(scope, "Mul", [a2, a])
            a3c = b.op(scope, "Mul", [a3, b.scalar(0.044715)])
            inner = b.op(scope, "Add", [a, a3c])
            z = b.op(scope, "Mul", [inner, b.scalar(math.sqrt(2.0 / math.pi))])
            t = b.op(scope, "Tanh", [z])
            t1 = b.op(scope, "Add", [t, b.scalar(1.0)])
            half = b.op(scope, "Mul", [t1, b.scalar(0.5)])
            g = b.op(scope, "Mul", [a, half])
            return g, {"a": a, "a2": a2, "t": t, "half": half, "scope": g.rsplit("_output_", 1)[0] + "_grad"}
        z = b.op(scope, "Mul", [a, b.scalar(1.0 / math.sqrt(2.0))])
        e = b.op(scope, "Erf", [z])
        e1 = b.op(scope, "Add", [e, b.scalar(1.0)])
        half = b.op(scope, "Mul", [e1, b.scalar(0.5)])
        g = b.op(scope, "Mul", [a, half])
        return g, {"a": a, "half": half, "scope": g.rsplit("_output_", 1)[0] + "_grad"}

    # --- backward helpers -------------------------------------------------------------
    def flat_t(self, scope, x, width):
        """Transpose(Reshape(x, [N, width])), shared by every weight gradient that needs it."""
        if x not in self._flat_t:
            b = self.b
            x2 = b.op(scope, "Reshape", [x, b.ints([self.c.n, width])])
            self._flat_t[x] = b.op(scope, "Transpose", [x2], perm=[1, 0])
        return self._flat_t[x]

    def linear_grad(self, s, dy, din, dout, need_dx=True):
        b = self.b
        scope = s["scope"]
        dx = None
        if need_dx:
            wt = b.op(scope, "Transpose", [s["w"]], perm=[1, 0])
            dx = b.op(scope, "MatMul", [dy, wt])
        xt = self.flat_t(scope, s["x"], din)
        dy2 = b.op(scope, "Reshape", [dy, b.ints([self.c.n, dout])])
        dw = b.op(scope, "MatMul", [xt, dy2])
        return dx, dw

    def layernorm_grad(self, s, dy):
        b, scope = self.b, s["scope"] + "_grad"
        xhat = s["xhat"]
        if xhat is None:  # fused LayerNormalization: rebuild x_hat from the saved statistics
            xc = b.op(scope, "Sub", [s["x"], s["mean"]])
            xhat = b.op(scope, "Mul", [xc, s["rstd"]])
        ax01, ax = b.ints([0, 1]), b.ints([-1])
        dyx = b.op(scope, "Mul", [dy, xhat])
        dw = b.op(scope, "ReduceSum", [dyx, ax01], keepdims=0)
        db = b.op(scope, "ReduceSum", [dy, ax01], keepdims=0)
        g = b.op(scope, "Mul", [dy, s["w"]])
        m1 = b.op(scope, "ReduceMean", [g, ax], keepdims=1)
        gx = b.op(scope, "Mul", [g, xhat])
        m2 = b.op(scope, "ReduceMean", [gx, ax], keepdims=1)
        t = b.op(scope, "Mul", [xhat, m2])
        u = b.op(scope, "Sub", [g, m1])
        u2 = b.op(scope, "Sub", [u, t])
        dx = b.op(scope, "Mul", [u2, s["rstd"]])
        return dx, dw, db

    def gelu_grad(self, s, dg):
        b, scope, a = self.b, s["scope"], s["a"]
        if self.c.gelu == "tanh":
            t2 = b.op(scope, "Mul", [s["t"], s["t"]])
            omt = b.op(scope, "Sub", [b.scalar(1.0), t2])
            k = b.op(scope, "Mul", [s["a2"], b.scalar(3 * 0.044715)])
            k1 = b.op(scope, "Add", [k, b.scalar(1.0)])
            m = b.op(scope, "Mul", [omt, k1])
            m2 = b.op(scope, "Mul", [m, b.scalar(0.5 * math.sqrt(2.0 / math.pi))])
            m3 = b.op(scope, "Mul", [m2, a])
            d = b.op(scope, "Add", [m3, s["half"]])
            return b.op(scope, "Mul", [dg, d])
        a2 = b.op(scope, "Mul", [a, a])
        n = b.op(scope, "Mul", [a2, b.scalar(-0.5)])
        ex = b.op(scope, "Exp", [n])
        pdf = b.op(scope, "Mul", [ex, b.scalar(1.0 / math.sqrt(2.0 * math.pi))])
        ap = b.op(scope, "Mul", [a, pdf])
        d = b.op(scope, "Add", [ap, s["half"]])
        return b.op(scope, "Mul", [dg, d])

    def onehot(self, scope, idx):
        b, c = self.b, self.c
        col = b.op(scope, "Reshape", [idx, b.ints([c.n, 1])])
        eq = b.op(scope, "Equal", [col, b.named("/const/vocab_range", np.arange(c.vocab, dtype=np.int64))])
        return b.op(scope, "Cast", [eq], to=b.elem)

    # --- the model ----------------------------------------------------------------------
    def build(self):
        b, c = self.b, self.c
        B, S, D, H, Dh, F = c.batch, c.seq, c.d, c.heads, c.dh, c.ffn
        grads: dict[str, str] = {}

        # ---------------- forward
        emb = b.op("/tok_emb", "Gather", ["tok_emb", "tokens"], axis=0)
        x = b.op("", "Add", [emb, "pos_emb"])
        mask = np.triu(np.full((S, S), -1e9, dtype=b.dtype), k=1)
        mask_name = b.named("/const/causal_mask", mask)
        scale = b.scalar(1.0 / math.sqrt(Dh))
        saved = []
        for i in range(c.layers):
            p, ps = f"blocks.{i}", f"/blocks.{i}"
            sv = {"x_in": x}
            h1, sv["ln1"] = self.layernorm(f"{ps}/ln1", x, f"{p}.ln1.weight", f"{p}.ln1.bias")
            a = f"{ps}/attn"
            q, sv["q"] = self.linear(a, h1, f"{p}.attn.wq")
            k, sv["k"] = self.linear(a, h1, f"{p}.attn.wk")
            v, sv["v"] = self.linear(a, h1, f"{p}.attn.wv")
            sh4 = b.ints([B, S, H, Dh])
            qh = b.op(a, "Transpose", [b.op(a, "Reshape", [q, sh4])], perm=[0, 2, 1, 3])
            kt = b.op(a, "Transpose", [b.op(a, "Reshape", [k, sh4])], perm=[0, 2, 3, 1])
            vh = b.op(a, "Transpose", [b.op(a, "Reshape", [v, sh4])], perm=[0, 2, 1, 3])
            scores = b.op(a, "MatMul", [qh, kt])
            sv["scores_scope"] = scores.rsplit("_output_", 1)[0] + "_grad"
            scaled = b.op(a, "Mul", [scores, scale])
            sv["scale_scope"] = scaled.rsplit("_output_", 1)[0] + "_grad"
            masked = b.op(a, "Add", [scaled, mask_name])
            prob = b.op(a, "Softmax", [masked], axis=-1)
            sv["softmax_scope"] = prob.rsplit("_output_", 1)[0] + "_grad"
            ctx = b.op(a, "MatMul", [prob, vh])
            sv["ctx_scope"] = ctx.rsplit("_output_", 1)[0] + "_grad"
            ctx2 = b.op(a, "Reshape", [b.op(a, "Transpose", [ctx], perm=[0, 2, 1, 3]), b.ints([B, S, D])])
            sv["heads_scope"] = ctx2.rsplit("_output_", 1)[0] + "_grad"
            o, sv["o"] = self.linear(a, ctx2, f"{p}.attn.wo")
            sv.update(qh=qh, kt=kt, vh=vh, prob=prob)
            x = b.op(ps, "Add", [x, o])
            sv["res1_scope"] = x.rsplit("_output_", 1)[0] + "_grad"
            h2, sv["ln2"] = self.layernorm(f"{ps}/ln2", x, f"{p}.ln2.weight", f"{p}.ln2.bias")
            m = f"{ps}/mlp"
            f1, sv["fc1"] = self.linear(f"{m}/fc1", h2, f"{p}.mlp.fc1.weight")
            f1b = b.op(f"{m}/fc1", "Add", [f1, f"{p}.mlp.fc1.bias"])
            sv["fc1b_scope"] = f1b.rsplit("_output_", 1)[0] + "_grad"
            g, sv["gelu"] = self.gelu(f"{m}/act", f1b)
            f2, sv["fc2"] = self.linear(f"{m}/fc2", g, f"{p}.mlp.fc2.weight")
            f2b = b.op(f"{m}/fc2", "Add", [f2, f"{p}.mlp.fc2.bias"])
            sv["fc2b_scope"] = f2b.rsplit("_output_", 1)[0] + "_grad"
            x = b.op(ps, "Add", [x, f2b])
            saved.append(sv)

        hf, ln_f = self.layernorm("/ln_f", x, "ln_f.weight", "ln_f.bias")
        logits, lm = self.linear("/lm_head", hf, "lm_head.weight")
        l2 = b.op("/loss", "Reshape", [logits, b.ints([c.n, c.vocab])])
        lab = b.op("/loss", "Reshape", ["labels", b.ints([c.n])])
        loss_node = self.b.graph.node.add()
        loss_node.op_type = "SoftmaxCrossEntropyLoss"
        loss_node.name = "/loss/SoftmaxCrossEntropyLoss"
        logp = "/loss/SoftmaxCrossEntropyLoss_output_1"
        loss_node.input.extend([l2, lab])
        loss_node.output.extend(["loss", logp])
        loss_node.attribute.append(helper.make_attribute("reduction", "mean"))

        # ---------------- backward (reverse order)
        sc = "/loss/SoftmaxCrossEntropyLoss_grad"
        sm = b.op(sc, "Exp", [logp])
        oh = self.onehot(sc, lab)
        diff = b.op(sc, "Sub", [sm, oh])
        seed = b.op(sc, "Div", ["tangent_loss", b.scalar(float(c.n))])
        dl2 = b.op(sc, "Mul", [diff, seed])
        dlogits = b.op(l2.rsplit("_output_", 1)[0] + "_grad", "Reshape", [dl2, b.ints([B, S, c.vocab])])
        dhf, grads["lm_head.weight"] = self.linear_grad(lm, dlogits, D, c.vocab)
        dx, grads["ln_f.weight"], grads["ln_f.bias"] = self.layernorm_grad(ln_f, dhf)

        for i in reversed(range(c.layers)):
            p, ps, sv = f"blocks.{i}", f"/blocks.{i}", saved[i]
            # x_out = x_mid + fc2b ; grads of both are dx
            grads[f"{p}.mlp.fc2.bias"] = b.op(sv["fc2b_scope"], "ReduceSum", [dx, b.ints([0, 1])], keepdims=0)
            dg, grads[f"{p}.mlp.fc2.weight"] = self.linear_grad(sv["fc2"], dx, F, D)
            df1 = self.gelu_grad(sv["gelu"], dg)
            grads[f"{p}.mlp.fc1.bias"] = b.op(sv["fc1b_scope"], "ReduceSum", [df1, b.ints([0, 1])], keepdims=0)
            dh2, grads[f"{p}.mlp.fc1.weight"] = self.linear_grad(sv["fc1"], df1, D, F)
            dmid, grads[f"{p}.ln2.weight"], grads[f"{p}.ln2.bias"] = self.layernorm_grad(sv["ln2"], dh2)
            dx = b.op(sv["res1_scope"], "Add", [dx, dmid])
            # attention
            dctx2, grads[f"{p}.attn.wo"] = self.linear_grad(sv["o"], dx, D, D)
            hs = sv["heads_scope"]
            dctx = b.op(hs, "Transpose", [b.op(hs, "Reshape", [dctx2, b.ints([B, S, H, Dh])])], perm=[0, 2, 1, 3])
            cs = sv["ctx_scope"]
            dprob = b.op(cs, "MatMul", [dctx, b.op(cs, "Transpose", [sv["vh"]], perm=[0, 1, 3, 2])])
            dvh = b.op(cs, "MatMul", [b.op(cs, "Transpose", [sv["prob"]], perm=[0, 1, 3, 2]), dctx])
            ss = sv["softmax_scope"]
            t = b.op(ss, "Mul", [dprob, sv["prob"]])
            r = b.op(ss, "ReduceSum", [t, b.ints([-1])], keepdims=1)
            dmasked = b.op(ss, "Mul", [b.op(ss, "Sub", [dprob, r]), sv["prob"]])
            dscores = b.op(sv["scale_scope"], "Mul", [dmasked, scale])
            qs = sv["scores_scope"]
            dqh = b.op(qs, "MatMul", [dscores, b.op(qs, "Transpose", [sv["kt"]], perm=[0, 1, 3, 2])])
            dkt = b.op(qs, "MatMul", [b.op(qs, "Transpose", [sv["qh"]], perm=[0, 1, 3, 2]), dscores])
            sh3 = b.ints([B, S, D])
            dq = b.op(qs, "Reshape", [b.op(qs, "Transpose", [dqh], perm=[0, 2, 1, 3]), sh3])
            dk = b.op(qs, "Reshape", [b.op(qs, "Transpose", [dkt], perm=[0, 3, 1, 2]), sh3])
            dv = b.op(cs, "Reshape", [b.op(cs, "Transpose", [dvh], perm=[0, 2, 1, 3]), sh3])
            dh1_q, grads[f"{p}.attn.wq"] = self.linear_grad(sv["q"], dq, D, D)
            dh1_k, grads[f"{p}.attn.wk"] = self.linear_grad(sv["k"], dk, D, D)
            dh1_v, grads[f"{p}.attn.wv"] = self.linear_grad(sv["v"], dv, D, D)
            acc = f"{ps}/ln1_grad_accumulate"
            dh1 = b.op(acc, "Add", [b.op(acc, "Add", [dh1_q, dh1_k]), dh1_v])
            dres, grads[f"{p}.ln1.weight"], grads[f"{p}.ln1.bias"] = self.layernorm_grad(sv["ln1"], dh1)
            dx = b.op(f"{ps}_grad", "Add", [dx, dres])

        # embeddings: x0 = Gather(tok_emb, tokens) + pos_emb
        grads["pos_emb"] = b.op("/pos_emb_grad", "ReduceSum", [dx, b.ints([0])], keepdims=0)
        es = "/tok_emb/Gather_grad"
        oht = b.op(es, "Transpose", [self.onehot(es, "tokens")], perm=[1, 0])
        grads["tok_emb"] = b.op(es, "MatMul", [oht, b.op(es, "Reshape", [dx, b.ints([c.n, D])])])
        return grads


# --------------------------------------------------------------------------- weights


def _param_chunks(spec: ParamSpec, dtype, rng: np.random.Generator, chunk_elems: int):
    n = int(np.prod(spec.shape))
    dt = np.dtype(dtype)
    for start in range(0, n, chunk_elems):
        m = min(chunk_elems, n - start)
        if spec.init == "ones":
            yield np.ones(m, dtype=dt)
        elif spec.init == "zeros":
            yield np.zeros(m, dtype=dt)
        else:
            a = rng.standard_normal(m, dtype=np.float32 if dt == np.float32 else np.float64)
            a *= spec.std
            yield a.astype(dt, copy=False)


def _external_tensor(name, elem, dims, location, offset, length) -> TensorProto:
    t = TensorProto()
    t.name = name
    t.data_type = elem
    t.dims.extend(dims)
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", str(offset)), ("length", str(length))):
        e = t.external_data.add()
        e.key, e.value = k, v
    return t


# --------------------------------------------------------------------------- public API


def build_transformer(
    layers: int,
    d_model: int = 64,
    heads: int = 4,
    seq: int = 32,
    batch: int = 2,
    vocab: int = 128,
    ffn_mult: int = 4,
    weight_scale_mb: float | None = None,
    seed: int = 0,
    *,
    dtype=np.float32,
    fused_layernorm: bool = False,
    gelu: str = "tanh",
    embed_weights: bool | None = None,
    _external: tuple[str, str] | None = None,
) -> onnx.ModelProto:
    """Build a GPT-style training graph (forward + full backward) as one ModelProto.

    dtype: float32 or float64 (float64 needs ``gelu="tanh"`` and ``fused_layernorm=False``
    on ORT CPU, which lacks double Erf and double LayerNormalization).
    fused_layernorm: LayerNormalization op (Mean/InvStdDev outputs saved for backward)
    instead of the 10-op decomposition.
    gelu: "tanh" (GPT-2 approximation) or "erf" (exact).
    weight_scale_mb: raise d_model (never lowers it) until the parameters take at least this
    many MiB, and embed random parameter values (see ``embed_weights``).
    embed_weights: store parameter values as initializers with the same names as the
    parameter inputs (overridable defaults); default: True iff weight_scale_mb is set.
    """
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise ValueError("dtype must be float32 or float64")
    if gelu not in ("tanh", "erf"):
        raise ValueError("gelu must be 'tanh' or 'erf'")
    if weight_scale_mb is not None:
        d_model = big_weights_d_model(weight_scale_mb * 2**20, layers, d_model, heads, seq, vocab,
                                      ffn_mult, dtype.itemsize)
    if d_model % heads:
        raise ValueError("d_model must be divisible by heads")
    if embed_weights is None:
        embed_weights = weight_scale_mb is not None

    c = _Cfg(layers, d_model, heads, seq, batch, vocab, ffn_mult * d_model, fused_layernorm, gelu)
    b = _Builder(dtype)
    specs = param_specs(layers, d_model, seq, vocab, ffn_mult)
    grads = _Transformer(b, c).build()

    g = b.graph
    g.name = f"synthetic_gpt_L{layers}_d{d_model}"
    elem = b.elem
    g.input.extend(_vi(s.name, elem, s.shape) for s in specs)
    g.input.extend([
        _vi("tokens", TensorProto.INT64, (batch, seq)),
        _vi("labels", TensorProto.INT64, (batch, seq)),
        _vi("tangent_loss", elem, ()),
    ])
    g.output.append(_vi("loss", elem, ()))
    for s in specs:
        # rename the gradient producer's output to <param>_grad
        g.output.append(_vi(f"{s.name}_grad", elem, s.shape))
    _rename_outputs(g, {grads[s.name]: f"{s.name}_grad" for s in specs})

    if embed_weights:
        rng = np.random.default_rng(seed)
        if _external is None:
            for s in specs:
                arr = np.concatenate(list(_param_chunks(s, dtype, rng, 1 << 24))).reshape(s.shape)
                g.initializer.append(numpy_helper.from_array(arr, s.name))
        else:
            data_path, location = _external
            with open(data_path, "wb") as fh:
                for s in specs:
                    pad = (-fh.tell()) % _ALIGN
                    if pad:
                        fh.write(b"\0" * pad)
                    off = fh.tell()
                    for chunk in _param_chunks(s, dtype, rng, 1 << 22):
                        fh.write(chunk.tobytes())
                    g.initializer.append(_external_tensor(s.name, elem, s.shape, location, off, fh.tell() - off))

    model = helper.make_model(
        g,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="bench.synthetic",
        ir_version=IR_VERSION,
    )
    meta = {"layers": layers, "d_model": d_model, "heads": heads, "seq": seq, "batch": batch,
            "vocab": vocab, "ffn_mult": ffn_mult, "dtype": dtype.name, "gelu": gelu,
            "fused_layernorm": int(fused_layernorm), "seed": seed}
    for k, v in meta.items():
        e = model.metadata_props.add()
        e.key, e.value = f"synthetic.{k}", str(v)
    return model


def _rename_outputs(g: GraphProto, mapping: dict[str, str]) -> None:
    """Gradient producers are the last writers of those names; rename in place (the
    gradient tensors are not consumed by any other node)."""
    todo = dict(mapping)
    for node in reversed(g.node):
        if not todo:
            break
        for j, o in enumerate(node.output):
            if o in todo:
                node.output[j] = todo.pop(o)
    if todo:
        raise AssertionError(f"gradient producers not found: {list(todo)[:3]}")


def save_transformer(path: str, *, external_data: bool | None = None, **kw) -> dict:
    """Build and save. Parameters with embedded weights are streamed into ``<name>.data``
    when ``external_data`` is true, or when unset and the weights reach 2 GB. Without
    embedded weights, ``external_data=True`` moves the large constants (the mask) out with
    ``onnx.save(save_as_external_data=True)``. Returns timing / size info."""
    t0 = time.perf_counter()
    layers = kw.pop("layers")
    dtype = np.dtype(kw.get("dtype", np.float32))
    d_model, heads = kw.get("d_model", 64), kw.get("heads", 4)
    seq, vocab, ffn_mult = kw.get("seq", 32), kw.get("vocab", 128), kw.get("ffn_mult", 4)
    if kw.get("weight_scale_mb") is not None:
        d_model = big_weights_d_model(kw["weight_scale_mb"] * 2**20, layers, d_model, heads, seq,
                                      vocab, ffn_mult, dtype.itemsize)
    embed = kw.get("embed_weights")
    if embed is None:
        embed = kw.get("weight_scale_mb") is not None
    wbytes = count_params(layers, d_model, seq, vocab, ffn_mult) * dtype.itemsize if embed else 0
    if external_data is None:
        external_data = wbytes >= _TWO_GB - (64 << 20)
    out_dir = os.path.dirname(os.path.abspath(path))
    location = os.path.basename(path) + ".data"
    data_path = os.path.join(out_dir, location)
    if os.path.exists(data_path):
        os.remove(data_path)
    ext = (data_path, location) if (external_data and embed) else None
    model = build_transformer(layers, **kw, _external=ext)
    t1 = time.perf_counter()
    if external_data and not embed:
        onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                  location=location, size_threshold=1024)
    else:
        onnx.save(model, path)
    t2 = time.perf_counter()
    size = os.path.getsize(path) + (os.path.getsize(data_path) if os.path.exists(data_path) else 0)
    return {"path": path, "nodes": len(model.graph.node), "d_model": d_model,
            "external_data": bool(external_data), "build_s": t1 - t0, "save_s": t2 - t1,
            "bytes": size, "param_bytes": count_params(layers, d_model, seq, vocab, ffn_mult) * dtype.itemsize}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.synthetic", description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=128)
    ap.add_argument("--ffn-mult", type=int, default=4)
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    ap.add_argument("--gelu", choices=["tanh", "erf"], default="tanh")
    ap.add_argument("--fused-layernorm", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--with-weights", action="store_true",
                    help="embed random parameter values as (overridable) initializers")
    ap.add_argument("--big-weights", type=float, metavar="GB", default=None,
                    help="raise d_model until the embedded weights reach GB GiB (> 2 forces external data)")
    ap.add_argument("--external-data", action="store_true")
    ap.add_argument("-o", "--output", required=True)
    a = ap.parse_args(argv)
    info = save_transformer(
        a.output, layers=a.layers, d_model=a.d_model, heads=a.heads, seq=a.seq, batch=a.batch,
        vocab=a.vocab, ffn_mult=a.ffn_mult, dtype=np.dtype(a.dtype), gelu=a.gelu,
        fused_layernorm=a.fused_layernorm, seed=a.seed,
        weight_scale_mb=None if a.big_weights is None else a.big_weights * 1024,
        embed_weights=True if (a.with_weights or a.big_weights is not None) else False,
        external_data=True if a.external_data else None,
    )
    print(f"{info['path']}: {info['nodes']} nodes, d_model={info['d_model']}, "
          f"{info['bytes'] / 2**20:.1f} MiB on disk (params {info['param_bytes'] / 2**20:.1f} MiB), "
          f"external={info['external_data']}, build {info['build_s']:.2f}s, save {info['save_s']:.2f}s",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
