"""Small random ONNX *training graphs* (forward DAG + hand-built reverse-mode backward).

For property-based tests of the rewrite engine. ``build_random_training_graph(seed, n_ops)``
is deterministic in its arguments; ``training_graphs()`` is a hypothesis strategy over it.

Graph layout (mirrors real joint graphs, standard ONNX ops, opset 18 and IR 10 by default):
  inputs   p0..pk (parameters), x (data), tangent_loss (scalar seed, feed 1.0)
  outputs  loss, then p{i}_grad for every parameter
  nodes    forward ``fwd_<i>_<Op>`` (loss terms included), then backward ``bwd_<j>_<Op>``
           (doc_string names the forward node it differentiates); topological file order.
Forward ops: Relu, Tanh, Sigmoid, Exp (only on Tanh/Sigmoid outputs), Neg, Mul-by-constant,
broadcasting Add/Sub/Mul, MatMul, ReduceSum/ReduceMean (keepdims=1), Split into 2,
Reshape (target constant, or computed from ``Shape`` with int64 Slice/Concat/Div/Mul),
Transpose, views (Identity, Flatten, Unsqueeze then Squeeze), Dropout in training mode
(seeded, so two sessions draw the same mask; its optional mask output is omitted, unread or
read by the backward). The loss adds one ReduceSum / ReduceMean / ReduceSumSquare term per
sink (tensor no forward op consumes, including unused parameters and Split halves). The
backward reads forward tensors through ``Shape`` and ``Size`` too (Reshape and Expand
targets, the ReduceMean scale).

``opset`` (7 to 18, ``OPSETS``, or a newer one onnx knows, ``NEWER_OPSETS``) picks each op's
form at that opset: axes of ReduceSum (from 13), ReduceMean / ReduceSumSquare (from 18) and
Squeeze / Unsqueeze (from 13) as an input, else an attribute; Split's ``num_outputs`` only
from 18 (below: an equal split by output count); Slice's tensor inputs from 10 (below: its
attributes); no Dropout below 12 (its ratio and training_mode inputs); no Expand at 7 (the
broadcast is a Mul by a ones initializer, then a Reshape to the ``Shape`` of the forward tensor
where the backward reads it). The IR version is 10 at opset 18, else the lowest for the opset
but at least 7. Opset 18 graphs are what they always were.

``dtype``: float32, float64, float16 or bfloat16 (``"bfloat16"`` or ``ml_dtypes.bfloat16``;
ONNX allows it from opset 13 only, and ONNX Runtime's CPU provider has no bfloat16 kernels for
these ops: such graphs are valid but run on no CPU session). Every constant but Dropout's ratio
(a float32 scalar in bfloat16 graphs: its schema has no bfloat16 below opset 22) has the graph's
dtype. In float16 a rare graph overflows to inf (products of products: 1 of 60 seeds).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import GraphProto, helper, numpy_helper

OPSET = 18
IR_VERSION = 10
MIN_OPSET = 7
MIN_IR_VERSION = 7
OPSETS = tuple(range(MIN_OPSET, OPSET + 1))  # what the tests run: 7-18
# Newer opsets change none of these ops' forms: valid graphs too, but ONNX Runtime 1.31 loads
# only up to opset 26 (27 and 28 are "under development" to it, though onnx 1.23 has them).
NEWER_OPSETS = tuple(range(OPSET + 1, onnx.defs.onnx_opset_version() + 1))
BF16_MIN_OPSET = 13
BASE_SHAPES = ((4, 4), (4, 8), (8, 4))

__all__ = ["build_random_training_graph", "training_graphs", "random_feeds", "param_names", "OPSETS", "NEWER_OPSETS",
           "graph_dtype", "supports"]


def graph_dtype(dtype) -> np.dtype:
    """``dtype`` as a numpy dtype; ``"bfloat16"`` (or ``ml_dtypes.bfloat16``) is ml_dtypes' one."""
    if isinstance(dtype, str) and dtype.lower() in ("bfloat16", "bf16"):
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


def supports(dtype, opset: int) -> bool:
    """Whether ``build_random_training_graph`` can make a valid graph of ``dtype`` at ``opset``."""
    dt = graph_dtype(dtype)
    if opset < MIN_OPSET or opset > onnx.defs.onnx_opset_version():
        return False
    if dt.name == "bfloat16":
        return opset >= BF16_MIN_OPSET
    return dt in (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


@dataclass
class _T:
    name: str
    shape: tuple[int, int]
    grad: bool  # requires grad (depends on a parameter)
    bounded: bool = False  # |value| <= 1, safe to Exp
    uses: int = 0


class _G:
    def __init__(self, dtype, opset: int = OPSET):
        self.g = GraphProto()
        self.dtype = graph_dtype(dtype)
        self.elem = helper.np_dtype_to_tensor_dtype(self.dtype)
        self.opset = opset
        self.consts: dict[tuple, str] = {}
        self.nb = 0

    def node(self, name, op, inputs, outputs, doc=None, **attrs):
        n = helper.make_node(op, inputs, outputs, name=name, **attrs)
        if doc:
            n.doc_string = doc
        self.g.node.append(n)

    def bwd(self, op, inputs, doc, out=None, **attrs):
        name = f"bwd_{self.nb}_{op}"
        self.nb += 1
        out = out or f"{name}_y"
        self.node(name, op, inputs, [out], doc, **attrs)
        return out

    def scalar(self, v, dtype=None):
        dtype = self.dtype if dtype is None else np.dtype(dtype)
        key = ("f", float(v)) if dtype == self.dtype else ("f", float(v), dtype.name)
        if key not in self.consts:
            name = f"c{len(self.consts)}_f" if dtype == self.dtype else f"c{len(self.consts)}_{dtype.name}"
            self.g.initializer.append(numpy_helper.from_array(np.array(v, dtype), name))
            self.consts[key] = name
        return self.consts[key]

    def ints(self, vals):
        key = ("i",) + tuple(int(v) for v in vals)
        if key not in self.consts:
            name = f"c{len(self.consts)}_i64"
            self.g.initializer.append(numpy_helper.from_array(np.array(key[1:], np.int64), name))
            self.consts[key] = name
        return self.consts[key]

    def bool_true(self):
        if ("b",) not in self.consts:
            name = f"c{len(self.consts)}_true"
            self.g.initializer.append(numpy_helper.from_array(np.array(True), name))
            self.consts[("b",)] = name
        return self.consts[("b",)]

    def zeros(self, shape):
        key = ("z",) + tuple(shape)
        if key not in self.consts:
            name = f"c{len(self.consts)}_zeros"
            self.g.initializer.append(numpy_helper.from_array(np.zeros(shape, self.dtype), name))
            self.consts[key] = name
        return self.consts[key]

    def ones(self, shape):
        key = ("o",) + tuple(shape)
        if key not in self.consts:
            name = f"c{len(self.consts)}_ones"
            self.g.initializer.append(numpy_helper.from_array(np.ones(shape, self.dtype), name))
            self.consts[key] = name
        return self.consts[key]

    # ---- op forms that change with the opset
    def axes_args(self, op: str, inputs: list, axes, attrs: dict) -> None:
        """Axes of a Reduce*, Squeeze or Unsqueeze: an int64 input from the opset that made them
        one (ReduceSum, Squeeze, Unsqueeze: 13; ReduceMean, ReduceSumSquare: 18), else an attribute."""
        since = 13 if op in ("ReduceSum", "Squeeze", "Unsqueeze") else 18
        if self.opset >= since:
            inputs.append(self.ints(axes))
        else:
            attrs["axes"] = [int(a) for a in axes]

    def bwd_expand(self, dy: str, shape, doc, shape_of: str | None = None) -> str:
        """``dy`` broadcast to ``shape`` (the shape of ``shape_of`` when given, read with Shape):
        Expand from opset 8; at 7 a Mul by ones, then a Reshape to the read shape."""
        if self.opset >= 8:
            target = self.bwd("Shape", [shape_of], doc) if shape_of else self.ints(shape)
            return self.bwd("Expand", [dy, target], doc)
        g = self.bwd("Mul", [dy, self.ones(shape)], doc)
        if shape_of:
            g = self.bwd("Reshape", [g, self.bwd("Shape", [shape_of], doc)], doc)
        return g


def _bcast(a, b):
    out = []
    for x, y in zip(a, b):
        if x != y and x != 1 and y != 1:
            return None
        out.append(max(x, y))
    return tuple(out)


def _reshape_target(G: _G, prefix: str, a: _T, shape: tuple[int, int]) -> str:
    """``shape`` computed from ``Shape(a)`` with int64 arithmetic: (n, m) by swapping the
    two dimensions, (m/2, 2n) by Div and Mul."""
    s = f"{prefix}s_y0"
    G.node(f"{prefix}s_Shape", "Shape", [a.name], [s])
    if shape == (a.shape[1], a.shape[0]):
        lo = f"{prefix}a_y0"
        hi = f"{prefix}b_y0"
        if G.opset >= 10:
            G.node(f"{prefix}a_Slice", "Slice", [s, G.ints([1]), G.ints([2])], [lo])
            G.node(f"{prefix}b_Slice", "Slice", [s, G.ints([0]), G.ints([1])], [hi])
        else:  # Slice-1: starts, ends (and axes) are attributes
            G.node(f"{prefix}a_Slice", "Slice", [s], [lo], starts=[1], ends=[2], axes=[0])
            G.node(f"{prefix}b_Slice", "Slice", [s], [hi], starts=[0], ends=[1], axes=[0])
        G.node(f"{prefix}c_Concat", "Concat", [lo, hi], [f"{prefix}c_y0"], axis=0)
        return f"{prefix}c_y0"
    G.node(f"{prefix}a_Div", "Div", [s, G.ints([2, 1])], [f"{prefix}a_y0"])
    G.node(f"{prefix}b_Mul", "Mul", [f"{prefix}a_y0", G.ints([1, 2])], [f"{prefix}b_y0"])
    return f"{prefix}b_y0"


def build_random_training_graph(seed: int, n_ops: int, dtype=np.float64, scale: int = 1,
                                opset: int = OPSET) -> onnx.ModelProto:
    """A random forward DAG of ``n_ops`` ops, a scalar loss and the full backward.
    ``scale`` multiplies every dimension of the base shapes (bigger buffers, same graph).
    ``opset``: the default-domain opset the graph is valid at (``OPSETS``; bfloat16 from 13)."""
    if not supports(dtype, opset):
        raise ValueError(f"no random training graph of {graph_dtype(dtype).name} at opset {opset} "
                         f"(opsets {MIN_OPSET}-{onnx.defs.onnx_opset_version()}; bfloat16 from {BF16_MIN_OPSET})")
    rng = np.random.default_rng(seed)
    G = _G(dtype, opset)
    shapes = [(m * scale, n * scale) for m, n in BASE_SHAPES]
    n_params = int(rng.integers(1, 5))
    params = [_T(f"p{i}", shapes[rng.integers(len(shapes))], True) for i in range(n_params)]
    x = _T("x", shapes[rng.integers(len(shapes))], False)
    pool: list[_T] = params + [x]
    fwd: list[tuple] = []  # (index, op, inputs [_T], outputs [_T], info)

    def pick(cands=None):
        cands = pool if cands is None else cands
        fresh = [t for t in cands if t.uses == 0]
        src = fresh if fresh and rng.random() < 0.6 else cands
        return src[rng.integers(len(src))]

    kinds = (["unary"] * 4 + ["binary"] * 4 + ["matmul"] * 2
             + ["reduce", "split", "reshape", "transpose", "view", "dropout"])
    i = 0
    while i < n_ops:
        kind = kinds[rng.integers(len(kinds))]
        a = pick()
        ins, outs_shapes, info, op = [a], [a.shape], {}, None
        if kind == "binary":
            cands = [t for t in pool if _bcast(a.shape, t.shape)]
            b = pick(cands)
            op = ("Add", "Sub", "Mul")[rng.integers(3)]
            ins = [a, b] if rng.random() < 0.5 else [b, a]
            outs_shapes = [_bcast(a.shape, b.shape)]
        elif kind == "matmul":
            cands = [t for t in pool if t.shape[0] == a.shape[1] and t.shape[1] > 1]
            if a.shape[0] > 1 and cands:
                b = pick(cands)
                op, ins, outs_shapes = "MatMul", [a, b], [(a.shape[0], b.shape[1])]
        elif kind == "reduce":
            axes = [ax for ax in (0, 1) if a.shape[ax] > 1]
            if axes:
                ax = axes[rng.integers(len(axes))]
                op = ("ReduceSum", "ReduceMean")[rng.integers(2)]
                info["axis"] = ax
                s = list(a.shape)
                s[ax] = 1
                outs_shapes = [tuple(s)]
        elif kind == "split":
            axes = [ax for ax in (0, 1) if a.shape[ax] >= 4]
            if axes:
                ax = axes[rng.integers(len(axes))]
                op = "Split"
                info["axis"] = ax
                s = list(a.shape)
                s[ax] //= 2
                outs_shapes = [tuple(s), tuple(s)]
        elif kind == "reshape":
            m, n = a.shape
            if m != n:
                op, outs_shapes = "Reshape", [(n, m)]
            elif m % 2 == 0:
                op, outs_shapes = "Reshape", [(m // 2, n * 2)]
        elif kind == "transpose":
            op, outs_shapes = "Transpose", [(a.shape[1], a.shape[0])]
        elif kind == "view":
            op = ("Identity", "Flatten", "UnsqueezeSqueeze")[rng.integers(3)]
            info["bwd_identity"] = bool(rng.random() < 0.5)
        elif kind == "dropout" and opset >= 12:  # (ratio and training_mode are inputs from 12)
            op = "Dropout"
            info["mask"] = ("omit", "unread")[rng.integers(2)] if not a.grad else "read"
        if op == "Reshape":
            info["computed"] = bool(rng.random() < 0.5)
        if op is None:  # unary (also the fallback when the drawn op does not fit)
            op = ("Relu", "Tanh", "Sigmoid", "Neg", "MulConst", "Exp")[rng.integers(6)]
            if op == "Exp" and not a.bounded:
                bounded = [t for t in pool if t.bounded]
                if bounded:
                    a = pick(bounded)
                else:
                    op = "Tanh"
            if op == "MulConst":
                info["c"] = float((0.5, -1.5, 2.0)[rng.integers(3)])
            ins, outs_shapes = [a], [a.shape]
        # emit forward node
        onnx_op = {"MulConst": "Mul", "UnsqueezeSqueeze": "Squeeze"}.get(op, op)
        name = f"fwd_{i}_{onnx_op}"
        outs = [_T(f"{name}_y{k}", s, any(t.grad for t in ins), bounded=op in ("Tanh", "Sigmoid"))
                for k, s in enumerate(outs_shapes)]
        in_names = [t.name for t in ins]
        out_names = [o.name for o in outs]
        attrs = {}
        if op == "MulConst":
            in_names.append(G.scalar(info["c"]))
        elif op in ("ReduceSum", "ReduceMean"):
            G.axes_args(op, in_names, [info["axis"]], attrs)
            attrs["keepdims"] = 1
        elif op == "Split":
            attrs["axis"] = info["axis"]
            if opset >= 18:  # below: an equal split by the number of outputs
                attrs["num_outputs"] = 2
        elif op == "Reshape":
            in_names.append(_reshape_target(G, f"fwd_{i}", a, outs_shapes[0]) if info["computed"]
                            else G.ints(outs_shapes[0]))
        elif op == "Transpose":
            attrs["perm"] = [1, 0]
        elif op == "Flatten":
            attrs["axis"] = 1
        elif op == "UnsqueezeSqueeze":
            u_in, u_attrs = [a.name], {}
            G.axes_args("Unsqueeze", u_in, [0], u_attrs)
            G.node(f"fwd_{i}u_Unsqueeze", "Unsqueeze", u_in, [f"fwd_{i}u_y0"], **u_attrs)
            in_names = [f"fwd_{i}u_y0"]
            G.axes_args("Squeeze", in_names, [0], attrs)
        elif op == "Dropout":
            # ratio: T1 has no bfloat16 below opset 22
            ratio = G.scalar(0.5, np.float32) if G.dtype.name == "bfloat16" and opset < 22 else G.scalar(0.5)
            in_names += [ratio, G.bool_true()]
            attrs["seed"] = seed % 1000 + i
            if info["mask"] != "omit":
                out_names.append(f"{name}_mask")
        G.node(name, onnx_op, in_names, out_names, **attrs)
        for t in ins:
            t.uses += 1
        pool.extend(outs)
        fwd.append((i, op, ins, outs, info))
        i += 1

    # ---- loss: one reduction per sink, summed
    sinks = [t for t in pool if t.uses == 0]
    terms, loss_terms = [], []
    for t in sinks:
        red = ("ReduceSum", "ReduceMean", "ReduceSumSquare")[rng.integers(3)]
        name = f"fwd_{i}_{red}"
        i += 1
        out = "loss" if len(sinks) == 1 else f"{name}_y0"
        G.node(name, red, [t.name], [out], keepdims=0)
        terms.append(out)
        loss_terms.append((name, red, t))
    acc = terms[0]
    for k, term in enumerate(terms[1:]):
        name = f"fwd_{i}_Add"
        i += 1
        out = "loss" if k == len(terms) - 2 else f"{name}_y0"
        G.node(name, "Add", [acc, term], [out])
        acc = out

    # ---- backward
    contribs: dict[str, list[str]] = {}

    def add_grad(t: _T, g: str):
        if t.grad:
            contribs.setdefault(t.name, []).append(g)

    def total(t: _T, doc, out=None):
        gs = contribs.get(t.name)
        if not gs:
            return None
        acc = gs[0]
        for k, g in enumerate(gs[1:]):
            acc = G.bwd("Add", [acc, g], doc, out=out if k == len(gs) - 2 else None)
        if out is not None and acc != out:
            acc = G.bwd("Identity", [acc], doc, out=out)
        return acc

    def unbroadcast(g, shape, out_shape, doc):
        axes = [ax for ax in (0, 1) if shape[ax] == 1 and out_shape[ax] > 1]
        if not axes:
            return g
        ins, attrs = [g], {"keepdims": 1}
        G.axes_args("ReduceSum", ins, axes, attrs)
        return G.bwd("ReduceSum", ins, doc, **attrs)

    for name, red, t in loss_terms:
        if not t.grad:
            continue
        doc = f"grad of {name}"
        if red == "ReduceSumSquare":
            two_dy = G.bwd("Mul", ["tangent_loss", G.scalar(2.0)], doc)
            add_grad(t, G.bwd("Mul", [t.name, two_dy], doc))
        else:
            dy = "tangent_loss"
            from_shape = rng.random() < 0.5  # read t's shape and size in the backward
            if red == "ReduceMean" and from_shape:
                size = G.bwd("Cast", [G.bwd("Size", [t.name], doc)], doc, to=G.elem)
                dy = G.bwd("Div", [dy, size], doc)
            elif red == "ReduceMean":
                dy = G.bwd("Mul", [dy, G.scalar(1.0 / (t.shape[0] * t.shape[1]))], doc)
            add_grad(t, G.bwd_expand(dy, t.shape, doc, shape_of=t.name if from_shape else None))

    for idx, op, ins, outs, info in reversed(fwd):
        if not any(t.grad for t in ins):
            continue
        onnx_op = "Mul" if op == "MulConst" else op
        doc = f"grad of fwd_{idx}_{onnx_op}"
        dys = [total(o, doc) for o in outs]
        if all(d is None for d in dys):
            continue
        dy, y = dys[0], outs[0]
        if op == "Split":
            parts = [d if d is not None else G.zeros(o.shape) for d, o in zip(dys, outs)]
            add_grad(ins[0], G.bwd("Concat", parts, doc, axis=info["axis"]))
            continue
        if dy is None:
            continue
        if op == "Relu":
            m = G.bwd("Cast", [G.bwd("Greater", [y.name, G.scalar(0.0)], doc)], doc, to=G.elem)
            add_grad(ins[0], G.bwd("Mul", [dy, m], doc))
        elif op == "Tanh":
            y2 = G.bwd("Mul", [y.name, y.name], doc)
            add_grad(ins[0], G.bwd("Mul", [dy, G.bwd("Sub", [G.scalar(1.0), y2], doc)], doc))
        elif op == "Sigmoid":
            om = G.bwd("Sub", [G.scalar(1.0), y.name], doc)
            add_grad(ins[0], G.bwd("Mul", [dy, G.bwd("Mul", [y.name, om], doc)], doc))
        elif op == "Exp":
            add_grad(ins[0], G.bwd("Mul", [dy, y.name], doc))
        elif op == "Neg":
            add_grad(ins[0], G.bwd("Neg", [dy], doc))
        elif op == "MulConst":
            add_grad(ins[0], G.bwd("Mul", [dy, G.scalar(info["c"])], doc))
        elif op in ("Add", "Sub", "Mul"):
            a, b = ins
            if a.grad:
                ga = G.bwd("Mul", [dy, b.name], doc) if op == "Mul" else dy
                add_grad(a, unbroadcast(ga, a.shape, y.shape, doc))
            if b.grad:
                gb = G.bwd("Mul", [dy, a.name], doc) if op == "Mul" else dy
                gb = unbroadcast(gb, b.shape, y.shape, doc)
                add_grad(b, G.bwd("Neg", [gb], doc) if op == "Sub" else gb)
        elif op == "MatMul":
            a, b = ins
            if a.grad:
                add_grad(a, G.bwd("MatMul", [dy, G.bwd("Transpose", [b.name], doc, perm=[1, 0])], doc))
            if b.grad:
                add_grad(b, G.bwd("MatMul", [G.bwd("Transpose", [a.name], doc, perm=[1, 0]), dy], doc))
        elif op in ("ReduceSum", "ReduceMean"):
            a = ins[0]
            g = G.bwd_expand(dy, a.shape, doc)
            if op == "ReduceMean":
                g = G.bwd("Mul", [g, G.scalar(1.0 / a.shape[info["axis"]])], doc)
            add_grad(a, g)
        elif op == "Reshape":
            target = G.bwd("Shape", [ins[0].name], doc) if info["computed"] else G.ints(ins[0].shape)
            add_grad(ins[0], G.bwd("Reshape", [dy, target], doc))
        elif op == "Transpose":
            add_grad(ins[0], G.bwd("Transpose", [dy], doc, perm=[1, 0]))
        elif op in ("Identity", "Flatten", "UnsqueezeSqueeze"):
            add_grad(ins[0], G.bwd("Identity", [dy], doc) if info["bwd_identity"] else dy)
        elif op == "Dropout":
            keep = G.bwd("Cast", [f"fwd_{idx}_Dropout_mask"], doc, to=G.elem)
            add_grad(ins[0], G.bwd("Mul", [dy, G.bwd("Mul", [keep, G.scalar(2.0)], doc)], doc))
        else:  # pragma: no cover
            raise AssertionError(op)

    for p in params:
        if total(p, f"accumulate grad of {p.name}", out=f"{p.name}_grad") is None:
            # cannot happen (every tensor reaches a loss term); keep the output well-defined
            G.bwd("Identity", [G.zeros(p.shape)], f"zero grad of {p.name}", out=f"{p.name}_grad")

    g = G.g
    g.name = f"randgraph_seed{seed}_ops{n_ops}"
    g.input.extend(helper.make_tensor_value_info(p.name, G.elem, list(p.shape)) for p in params)
    g.input.append(helper.make_tensor_value_info("x", G.elem, list(x.shape)))
    g.input.append(helper.make_tensor_value_info("tangent_loss", G.elem, []))
    g.output.append(helper.make_tensor_value_info("loss", G.elem, []))
    g.output.extend(helper.make_tensor_value_info(f"{p.name}_grad", G.elem, list(p.shape)) for p in params)
    opset_id = helper.make_opsetid("", opset)
    ir_version = IR_VERSION if opset == OPSET else max(helper.find_min_ir_version_for([opset_id]), MIN_IR_VERSION)
    return helper.make_model(g, opset_imports=[opset_id], ir_version=ir_version, producer_name="tests.randgraph")


def param_names(model: onnx.ModelProto) -> list[str]:
    return [i.name for i in model.graph.input if i.name not in ("x", "tangent_loss")]


def random_feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs for a randgraph model (``tangent_loss`` = 1), in each input's dtype
    (ml_dtypes' bfloat16 for bfloat16 inputs)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for vi in model.graph.input:
        tt = vi.type.tensor_type
        dt = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        shape = [d.dim_value for d in tt.shape.dim]
        if vi.name == "tangent_loss":
            feeds[vi.name] = np.array(1.0, dt)
        else:
            feeds[vi.name] = (rng.standard_normal(shape) * 0.7).astype(dt)
    return feeds


def training_graphs(min_ops: int = 1, max_ops: int = 16, dtype=np.float64, opset: int = OPSET):
    """Hypothesis strategy of random training graphs (shrinks towards small seeds/sizes)."""
    from hypothesis import strategies as st

    return st.builds(
        build_random_training_graph,
        seed=st.integers(0, 2**32 - 1),
        n_ops=st.integers(min_ops, max_ops),
        dtype=st.just(dtype),
        opset=st.just(opset),
    )
