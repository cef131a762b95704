"""Fuzzing ckpt's command line with mutated models.

Each case takes a seed model (the samples, a small hand-made training graph, one with
external data, two ORT training artifacts of the zoo with com.microsoft gradient ops) or a
generated one (tests/fixtures/randgraph.py: float32/float64 at opsets 7-18, float16 at 7-18,
bfloat16 at 13-18; tests/fixtures/tokens.py: two symbolic dimensions, rewritten at equal or
different values and run where they differ, every written shape matched against ORT's),
applies one to three protobuf-level or graph-level mutations (delete,
duplicate or rewire nodes; change shapes, types, attributes, opsets, external-data
fields and names; add an ONNX-domain op only ORT registers (LayerNormalization below
opset 17) with wrong arity, types or axis, a binary op over mixed element types, a local
function whose Constant keeps its value in external data; flip, cut or insert bytes), runs ``ckpt inspect``, ``plan`` or
``rewrite`` in-process (click's CliRunner, no ``--check``) and classifies the outcome:

- ``clean_error``: exit 2 or 3, one line ``ckpt: error: ...``, no traceback (a refusal
  given as ONNX Runtime's must be one: plain ORT refuses the input too);
- ``correct``: exit 0; a rewrite's output passes onnx.checker, and ONNX Runtime (CPU,
  ckpt's settings: one thread, ORT_DISABLE_ALL, PRIORITY_BASED) runs it and gives the
  input's outputs bit for bit on the same random feeds, wherever it runs the input
  (an input with unseeded random ops: it only has to run; float16 outputs may differ within
  the bound the README documents for ORT's CPU provider: ``float16_rounding`` counts those
  rewrites); where ORT refuses the input
  too, garbage in, same out (``garbage_passthrough``; the zoo artifacts' training ops need
  onnxruntime-training: a refusal for an op plain ORT lacks is ``correct`` there);
- ``defect``: anything else (exit 70, a traceback, a hang, an input changed, exit 0 with
  an invalid output, outputs that differ beyond what the README documents).

Three case kinds run no mutation: ``check_differs`` (``ckpt check`` of a model against a
copy with one constant changed: exit 1 naming the differing outputs in one failure line,
no traceback; exit 5 in one line where ORT's default session refuses the valid input), ``python_child``
(``ckpt check --python`` of an interpreter that misbehaves at the provider probe or the measuring run,
tests/fuzz_children.py: exit 5 in one line within the timeout and no child left running, or a
probe that fails cleanly and the run on CPU), ``concurrent`` (two ``ckpt rewrite --force`` processes writing one
``-o`` path at once: each exits 0 or with a clean error, and the file left passes the
checker, loads and runs in ORT with the input's outputs, with its external data beside it), and
``usage_json`` (a usage error under ``--json``: exit 2, one stderr line without a raw control
character, and stdout's error object valid against ckpt_cli/report/schema.json).

    python -m tests.fuzz --cases 10000 --seed 1        # make fuzz
    python -m tests.fuzz --cases 200 --seed 0          # what tests/test_fuzz.py runs
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_models"
CASE_SECONDS = 60
ZOO_SEEDS = ("mlp_dropout", "embed_ln17")  # DropoutGrad, ReluGrad; GatherGrad, LayerNormalizationGrad; both
# SoftmaxCrossEntropyLossGrad and InPlaceAccumulatorV2 (the zoo's others fail onnx.checker: ORT-only ops)
# what plain onnxruntime's CPU provider says of an op it has no kernel for (a seed with ort=False)
ORT_LACKS = ("is not a registered function/op", "NOT_IMPLEMENTED : Could not find an implementation")
FEED_ELEMENTS = 1 << 22  # an input model needing larger feeds is not run
RANDOM_OPS = {"Dropout", "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
              "Bernoulli"}
HOSTILE_NAMES = ["[/]", "[link=http://x]a[/link]", "\x1b]8;;x\x07", "", "a" * 300, "x/../y", "\u202e"]


# ------------------------------------------------------------------------------ seed models
def _small_training_graph(d_in: int = 4, hidden: int = 16) -> onnx.ModelProto:
    """relu(x @ W1) @ W2 summed, with its backward and an If reading an outer tensor."""
    rng = np.random.default_rng(0)
    branch = helper.make_graph([helper.make_node("Identity", ["h"], ["hb"], name="branch_id")], "b", [],
                               [helper.make_tensor_value_info("hb", TensorProto.FLOAT, [8, hidden])])
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"], name="/l0/MatMul"),
        helper.make_node("Relu", ["h"], ["r"], name="/l0/Relu"),
        helper.make_node("MatMul", ["r", "W2"], ["y"], name="/l1/MatMul"),
        helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0, name="/loss/ReduceSum"),
        helper.make_node("Shape", ["y"], ["ys"], name="/bwd/Shape"),
        helper.make_node("Expand", ["tangent", "ys"], ["dy"], name="/bwd/Expand"),
        helper.make_node("Transpose", ["r"], ["rt"], perm=[1, 0], name="/bwd/Transpose_r"),
        helper.make_node("MatMul", ["rt", "dy"], ["W2_grad"], name="/bwd/MatMul_dW2"),
        helper.make_node("Transpose", ["W2"], ["W2t"], perm=[1, 0], name="/bwd/Transpose_W2"),
        helper.make_node("MatMul", ["dy", "W2t"], ["dr"], name="/bwd/MatMul_dr"),
        helper.make_node("If", ["cond"], ["hh"], then_branch=branch, else_branch=branch, name="/bwd/If"),
        helper.make_node("Relu", ["hh"], ["hm"], name="/bwd/Relu_mask"),
        helper.make_node("Sign", ["hm"], ["mask"], name="/bwd/Sign"),
        helper.make_node("Mul", ["dr", "mask"], ["dh"], name="/bwd/Mul"),
        helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0], name="/bwd/Transpose_x"),
        helper.make_node("MatMul", ["xt", "dh"], ["W1_grad"], name="/bwd/MatMul_dW1"),
    ]
    graph = helper.make_graph(
        nodes, "small",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, d_in]),
         helper.make_tensor_value_info("tangent", TensorProto.FLOAT, [])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, []),
         helper.make_tensor_value_info("W1_grad", TensorProto.FLOAT, [d_in, hidden]),
         helper.make_tensor_value_info("W2_grad", TensorProto.FLOAT, [hidden, 8])],
        initializer=[numpy_helper.from_array(rng.standard_normal((d_in, hidden)).astype(np.float32), "W1"),
                     numpy_helper.from_array(rng.standard_normal((hidden, 8)).astype(np.float32), "W2"),
                     numpy_helper.from_array(np.array(True), "cond")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _randgraph(rng: random.Random, dtypes: tuple[str, ...], opsets) -> onnx.ModelProto:
    from randgraph import build_random_training_graph

    return build_random_training_graph(rng.getrandbits(32), rng.randint(3, 16), rng.choice(dtypes),
                                       opset=rng.choice(list(opsets)))


def _rand_f32_f64(rng):
    return _randgraph(rng, ("float32", "float64"), range(7, 19))


def _rand_f16(rng):
    return _randgraph(rng, ("float16",), range(7, 19))


def _rand_bf16(rng):
    return _randgraph(rng, ("bfloat16",), range(13, 19))


# The tokens seed's two symbolic dimensions: rewritten at equal values (ckpt's default 64 for
# both, or equal --dim values) or different ones, and run on ORT where they differ.
TOKEN_DIMS = ("batch", "seq")
TOKEN_DIM_OPTIONS = ([], ["--dim", "batch=8", "--dim", "seq=8"], ["--dim", "batch=4", "--dim", "seq=9"],
                     ["--dim", "seq=6"])


def _rand_tokens(rng):
    from tokens import tokens_model

    return tokens_model(rng.randint(1, 5), rng.choice([8, 16, 32]), rng.getrandbits(16),
                        rng.choice([TOKEN_DIMS, TOKEN_DIMS[::-1]]))


@dataclass
class Seed:
    name: str
    model: onnx.ModelProto | None
    data: bytes | None = None  # external data file contents, saved as <name>.data
    weight: float = 1.0
    make: Callable[[random.Random], onnx.ModelProto] | None = None  # a generator: a new model each case
    kind: str = "mutate"  # or "check_differs", "concurrent", "usage_json", "python_child" (no mutation)
    # symbolic dimensions: rewritten with one of these option lists, run on ORT at these values
    dim_options: tuple[list[str], ...] = ()
    run_dims: dict[str, int] = field(default_factory=dict)
    ort: bool = True  # plain onnxruntime loads it (the zoo's training ops need onnxruntime-training)

    def instance(self, rng: random.Random) -> onnx.ModelProto:
        return self.make(rng) if self.make is not None else self.model


def _external_seed(name: str, model: onnx.ModelProto, **kw) -> Seed:
    """``model`` with every initializer in ``ext.onnx.data`` (the seed's ``data``)."""
    with tempfile.TemporaryDirectory() as d:
        onnx.save(model, Path(d) / "ext.onnx", save_as_external_data=True, location="ext.onnx.data",
                  size_threshold=0)
        return Seed(name, onnx.load(Path(d) / "ext.onnx", load_external_data=False),
                    (Path(d) / "ext.onnx.data").read_bytes(), **kw)


def load_seeds() -> list[Seed]:
    sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))  # randgraph, as python -m tests.fuzz
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # fuzz_children, as python -m tests.fuzz
    seeds = [Seed("small", _small_training_graph(), weight=4)]
    for name, weight in (("mlp", 3), ("cnn", 1), ("gpt", 0.5)):
        path = SAMPLES / f"{name}.onnx"
        if path.exists():
            seeds.append(Seed(name, onnx.load(path), weight=weight))
    seeds.append(_external_seed("ext", _small_training_graph(), weight=2))
    seeds += [Seed("rand_opset", None, make=_rand_f32_f64, weight=2),
              Seed("rand_f16", None, make=_rand_f16, weight=1.5),
              Seed("rand_bf16", None, make=_rand_bf16, weight=0.75, ort=False),  # no bfloat16 CPU kernels
              Seed("tokens", None, make=_rand_tokens, weight=1, dim_options=TOKEN_DIM_OPTIONS,
                   run_dims={"batch": 3, "seq": 5})]
    for name in ZOO_SEEDS:
        path = SAMPLES / "zoo" / name / "training_model.onnx"
        if path.exists():
            seeds.append(Seed(f"zoo_{name}", onnx.load(path), weight=0.5, ort=False))
    # about 1.5 s and 1 s a case (ckpt check's child processes; two ckpt processes): a few in 200 cases
    seeds += [Seed("check_differs", None, make=_rand_f32_f64, kind="check_differs", weight=0.08),
              Seed("concurrent", None, make=_rand_f32_f64, kind="concurrent", weight=0.08),
              _external_seed("concurrent_ext", _small_training_graph(32, 128), kind="concurrent", weight=0.06),
              Seed("usage_json", _small_training_graph(), kind="usage_json", weight=0.5),
              # 1-7 s a case (a child that hangs is waited for up to its 2 s timeout, thrice)
              Seed("python_child", None, kind="python_child", weight=0.04)]
    return seeds


# ------------------------------------------------------------------------------ mutations
def _tensor_names(m: onnx.ModelProto) -> list[str]:
    g = m.graph
    names = {v.name for v in g.input} | {t.name for t in g.initializer}
    for n in g.node:
        names.update(n.input)
        names.update(n.output)
    names.discard("")
    return sorted(names)


def m_delete_node(m, rng):
    if len(m.graph.node) > 1:
        del m.graph.node[rng.randrange(len(m.graph.node))]


def m_duplicate_node(m, rng):
    n = m.graph.node[rng.randrange(len(m.graph.node))]
    copy = onnx.NodeProto()
    copy.CopyFrom(n)
    if rng.random() < 0.5:
        copy.name += "_dup"
        copy.output[:] = [o + "_dup" if o else o for o in copy.output]
    m.graph.node.insert(rng.randrange(len(m.graph.node) + 1), copy)


def m_rewire(m, rng):
    names = _tensor_names(m)
    n = m.graph.node[rng.randrange(len(m.graph.node))]
    if n.input:
        n.input[rng.randrange(len(n.input))] = rng.choice(names + ["", "nowhere"])


def m_swap_nodes(m, rng):
    k = len(m.graph.node)
    i, j = rng.randrange(k), rng.randrange(k)
    a, b = onnx.NodeProto(), onnx.NodeProto()
    a.CopyFrom(m.graph.node[i])
    b.CopyFrom(m.graph.node[j])
    m.graph.node[i].CopyFrom(b)
    m.graph.node[j].CopyFrom(a)


def m_rename(m, rng):
    target = rng.choice(["node", "tensor", "output"])
    new = rng.choice(HOSTILE_NAMES + [rng.choice(_tensor_names(m))])
    if target == "node":
        m.graph.node[rng.randrange(len(m.graph.node))].name = new
    elif target == "tensor":
        old = rng.choice(_tensor_names(m))
        for n in m.graph.node:
            n.input[:] = [new if t == old else t for t in n.input]
            n.output[:] = [new if t == old else t for t in n.output]
        for v in list(m.graph.input) + list(m.graph.output) + list(m.graph.initializer):
            if v.name == old:
                v.name = new
    elif m.graph.output:
        m.graph.output[rng.randrange(len(m.graph.output))].name = new


def _value_infos(m):
    return list(m.graph.input) + list(m.graph.output) + list(m.graph.value_info)


def m_shape(m, rng):
    vs = [v for v in _value_infos(m) if v.type.HasField("tensor_type")]
    if not vs:
        return
    v = rng.choice(vs)
    dims = v.type.tensor_type.shape.dim
    choice = rng.random()
    if dims and choice < 0.7:
        d = dims[rng.randrange(len(dims))]
        value = rng.choice([0, 1, 3, -1, -7, 2**40, 2**62, 10**6])
        if rng.random() < 0.3:
            d.dim_param = rng.choice(["batch", "seq", "", "[/]"])
        else:
            d.dim_value = value
    elif choice < 0.85:
        v.type.tensor_type.shape.dim.add().dim_value = rng.choice([1, 2, 5])
    else:
        v.type.tensor_type.ClearField("shape")


def m_dtype(m, rng):
    vs = [v for v in _value_infos(m) if v.type.HasField("tensor_type")]
    ts = list(m.graph.initializer)
    if vs and rng.random() < 0.6:
        rng.choice(vs).type.tensor_type.elem_type = rng.choice([0, 1, 2, 6, 7, 8, 9, 10, 11, 16, 40, 99])
    elif ts:
        rng.choice(ts).data_type = rng.choice([0, 1, 6, 7, 10, 11, 99])


def m_initializer(m, rng):
    ts = list(m.graph.initializer)
    if not ts:
        return
    t = rng.choice(ts)
    r = rng.random()
    if r < 0.4:
        m.graph.initializer.remove(t)
    elif r < 0.7:
        t.dims[:] = [rng.choice([0, 1, 3, 100]) for _ in range(rng.randrange(0, 4))]
    else:
        t.raw_data = t.raw_data[: len(t.raw_data) // 2]


def m_attribute(m, rng):
    nodes = [n for n in m.graph.node if n.attribute]
    if not nodes:
        return
    n = rng.choice(nodes)
    a = n.attribute[rng.randrange(len(n.attribute))]
    if a.type == onnx.AttributeProto.INT:
        a.i = rng.choice([-5, -1, 0, 1, 7, 2**40])
    elif a.type == onnx.AttributeProto.INTS:
        a.ints[:] = [rng.choice([-1, 0, 1, 2, 9]) for _ in range(rng.randrange(0, 4))]
    elif a.type == onnx.AttributeProto.FLOAT:
        a.f = rng.choice([float("nan"), float("inf"), -1.0, 0.0])
    elif rng.random() < 0.5:
        n.attribute.remove(a)


def m_op_type(m, rng):
    n = m.graph.node[rng.randrange(len(m.graph.node))]
    n.op_type = rng.choice(["Relu", "MatMul", "Add", "NoSuchOp", "Dropout", "Loop", "Constant", "Identity"])
    if rng.random() < 0.2:
        n.domain = rng.choice(["com.microsoft", "x.custom", "ai.onnx"])


def m_opset(m, rng):
    r = rng.random()
    if r < 0.3 or not m.opset_import:
        del m.opset_import[:]
    elif r < 0.6:
        m.opset_import[0].version = rng.choice([1, 7, 13, 99, 0])
    elif r < 0.8:
        m.ir_version = rng.choice([0, 3, 7, 14, 99])
    else:
        m.opset_import.add(domain="com.microsoft", version=1)


def m_outputs(m, rng):
    r = rng.random()
    if r < 0.4 and m.graph.output:
        del m.graph.output[rng.randrange(len(m.graph.output))]
    elif r < 0.7:
        m.graph.output.add().CopyFrom(helper.make_tensor_value_info(rng.choice(_tensor_names(m) + ["ghost"]),
                                                                    TensorProto.FLOAT, None))
    else:
        m.graph.input.add().CopyFrom(helper.make_tensor_value_info(rng.choice(["extra", "W1", "x"]),
                                                                   TensorProto.FLOAT, [2]))


def m_external(m, rng):
    ts = [t for t in m.graph.initializer if t.data_location == TensorProto.EXTERNAL]
    if not ts:
        t = rng.choice(list(m.graph.initializer)) if m.graph.initializer else None
        if t is not None:  # claim external data that is not there
            t.data_location = TensorProto.EXTERNAL
            e = t.external_data.add()
            e.key, e.value = "location", rng.choice(["x.data", "/etc/passwd", "../x"])
        return
    t = rng.choice(ts)
    fields = {e.key: e for e in t.external_data}
    key = rng.choice(["location", "offset", "length", "drop", "flag", "checksum"])
    if key == "drop":
        if t.external_data:
            del t.external_data[rng.randrange(len(t.external_data))]
    elif key == "flag":
        t.data_location = TensorProto.DEFAULT
    else:
        value = rng.choice({
            "location": ["/etc/passwd", "../../../../etc/passwd", "/dev/zero", "nothere.data", "", ".",
                         "ext.onnx.data/../ext.onnx.data", "\0", "fifo.data", "link.data"],
            "offset": ["-1", "abc", "99999999999", "1", "0", "1e3", ""],
            "length": ["-1", "abc", "99999999999", "0", "4", ""],
            "checksum": ["x"],
        }[key])
        if key in fields:
            fields[key].value = value
        else:
            e = t.external_data.add()
            e.key, e.value = key, value


def m_shuffle_nodes(m, rng):
    """A valid graph in another file order: ckpt sorts it; its output must be sorted."""
    nodes = list(m.graph.node)
    rng.shuffle(nodes)
    copies = []
    for n in nodes:
        c = onnx.NodeProto()
        c.CopyFrom(n)
        copies.append(c)
    del m.graph.node[:]
    m.graph.node.extend(copies)


def m_names_only(m, rng):
    """Hostile but valid node names, doc strings and metadata."""
    for n in m.graph.node:
        if rng.random() < 0.3:
            n.name = rng.choice(HOSTILE_NAMES[:3] + ["[bold]x[/bold]", "\x9b31m"]) + n.name
    m.doc_string = rng.choice(HOSTILE_NAMES)
    entry = m.metadata_props.add()
    entry.key, entry.value = rng.choice(["ckpt.enable_mem_reuse", "x", ""]), rng.choice(["0", "1", "[/]"])


def m_drop_value_info(m, rng):
    del m.graph.value_info[:]


def _typed_tensor(m, rng, float_only: bool = False):
    """A graph input, value_info or initializer with a known type: its ValueInfoProto, or None."""
    vs = [v for v in _value_infos(m) if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type
          and v.type.tensor_type.HasField("shape") and v not in m.graph.output]
    vs += [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in m.graph.initializer]
    if float_only:
        vs = [v for v in vs if v.type.tensor_type.elem_type == TensorProto.FLOAT and v.type.tensor_type.shape.dim]
    return rng.choice(vs) if vs else None


def _as_output(m, v, name: str, elem_type: int | None = None) -> None:
    out = m.graph.output.add()
    out.CopyFrom(v)
    out.name = name
    if elem_type is not None:
        out.type.tensor_type.elem_type = elem_type


def m_ort_op(m, rng):
    """An ONNX-domain op only ORT registers below opset 17 (LayerNormalization), often with the
    wrong arity, input types, scale type or axis."""
    v = _typed_tensor(m, rng, float_only=True)
    if v is None:
        return
    last = v.type.tensor_type.shape.dim[-1]
    width = last.dim_value if last.HasField("dim_value") and 0 < last.dim_value < 4096 else 1
    scale_type = rng.choice([np.float32, np.float32, np.float64, np.float16, np.int32])
    tag = rng.randrange(10**6)
    names = [f"ln_s{tag}", f"ln_b{tag}", f"ln_e{tag}", f"ln_f{tag}"]
    m.graph.initializer.extend(numpy_helper.from_array(np.ones([width], scale_type), n) for n in names)
    x = v.name
    if rng.random() < 0.2:
        m.graph.node.append(helper.make_node("Cast", [x], [f"ln_x{tag}"], to=rng.choice([6, 11, 10])))
        x = f"ln_x{tag}"
    arity = rng.choice([1, 2, 3, 3, 3, 4, 5])
    op = rng.choice(["LayerNormalization", "LayerNormalization", "SimplifiedLayerNormalization"])
    m.graph.node.append(helper.make_node(op, [x] + names[:arity - 1], [f"ln_y{tag}"], name=f"ln{tag}",
                                         axis=rng.choice([-1, -1, -1, 0, 1, 7, -9])))
    if m.opset_import and rng.random() < 0.7:
        m.opset_import[0].version = rng.choice([14, 15, 16, 17])
    _as_output(m, v, f"ln_y{tag}")


def m_mixed_dtype(m, rng):
    """A binary op over two tensors or a tensor and a constant, often of different element types."""
    a = _typed_tensor(m, rng)
    if a is None:
        return
    tag = rng.randrange(10**6)
    if rng.random() < 0.5:
        b = _typed_tensor(m, rng).name
    else:
        b = f"mix_c{tag}"
        m.graph.initializer.append(numpy_helper.from_array(
            np.ones([1], rng.choice([np.float32, np.float64, np.float16, np.int64, np.bool_])), b))
    op = rng.choice(["Add", "Mul", "Sub", "Div", "MatMul", "Pow"])
    m.graph.node.append(helper.make_node(op, [a.name, b], [f"mix_y{tag}"], name=f"mix{tag}"))
    _as_output(m, a, f"mix_y{tag}")


def m_function_constant(m, rng):
    """A local function whose Constant keeps its value in external data (the ``ext`` seed's
    file, else missing), called on a float tensor; its result is a graph output."""
    v = _typed_tensor(m, rng, float_only=True)
    if v is None:
        return
    c = TensorProto(name="fc", data_type=TensorProto.FLOAT, dims=[1], data_location=TensorProto.EXTERNAL)
    fields = {"location": rng.choice(["ext.onnx.data", "ext.onnx.data", "nothere.data"]),
              "offset": rng.choice(["0", "0", "4", "99999999"]), "length": rng.choice(["4", "4", "8"])}
    for key, value in fields.items():
        e = c.external_data.add()
        e.key, e.value = key, value
    body = [helper.make_node("Constant", [], ["k"], value=c), helper.make_node("Add", ["a", "k"], ["b"])]
    opset = next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), 17)
    m.functions.append(helper.make_function("fuzz.local", "AddK", ["a"], ["b"], body,
                                            [helper.make_opsetid("", opset)]))
    m.opset_import.append(helper.make_opsetid("fuzz.local", 1))
    tag = rng.randrange(10**6)
    m.graph.node.append(helper.make_node("AddK", [v.name], [f"fc_y{tag}"], domain="fuzz.local", name=f"fc{tag}"))
    _as_output(m, v, f"fc_y{tag}")


GRAPH_MUTATIONS = [m_delete_node, m_duplicate_node, m_rewire, m_swap_nodes, m_rename, m_shape, m_dtype,
                   m_initializer, m_attribute, m_op_type, m_opset, m_outputs, m_external, m_ort_op, m_mixed_dtype,
                   m_function_constant]
BENIGN_MUTATIONS = [m_shuffle_nodes, m_names_only, m_drop_value_info]


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    r = rng.random()
    b = bytearray(data)
    if r < 0.35:
        return bytes(b[: rng.randrange(len(b))])
    if r < 0.7:
        for _ in range(rng.randrange(1, 8)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        return bytes(b)
    pos = rng.randrange(len(b))
    return bytes(b[:pos] + rng.randbytes(rng.randrange(1, 32)) + b[pos:])


# ------------------------------------------------------------------------------ running
@dataclass
class Outcome:
    kind: str  # correct, clean_error, garbage_passthrough, defect
    detail: str = ""


@dataclass
class Summary:
    counts: Counter = field(default_factory=Counter)
    exit_codes: Counter = field(default_factory=Counter)
    defects: list[dict] = field(default_factory=list)
    passthrough: list[dict] = field(default_factory=list)  # inputs ORT refuses as it refuses the output
    ort_loaded: int = 0
    ort_compared: int = 0  # written models whose outputs were compared with the input's
    f16_rounding: list[dict] = field(default_factory=list)  # float16 outputs apart within the documented bound
    kinds: Counter = field(default_factory=Counter)  # seed model -> cases

    def to_json(self) -> dict:
        return {"counts": dict(self.counts), "exit_codes": {str(k): v for k, v in sorted(self.exit_codes.items())},
                "ort_loaded": self.ort_loaded, "ort_compared": self.ort_compared,
                "float16_rounding": {"count": len(self.f16_rounding), "examples": self.f16_rounding[:10]},
                "seed_models": dict(sorted(self.kinds.items())), "defects": self.defects[:50],
                "garbage_passthrough_examples": self.passthrough}


# The one documented loss (README, `ckpt check`): float16 on ORT's CPU provider, which runs ops
# without a float16 kernel in float32 between Casts it places from each node's neighbours, so a
# rewrite moves the rounding; "within 1.5 float16 eps of the output's largest value".
F16_NORMWISE_EPS = 1.5


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout()


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())
            if p.is_file() and not p.is_symlink()}


def _session_options():
    """ckpt's session settings, one thread (what bit-identical comparisons need)."""
    from ckpt_session import session_options

    return session_options(log_severity=4)


@dataclass
class OrtRun:
    state: str  # refused (no session), loaded (no feeds to run it with), failed (the run raised), ran
    why: str = ""
    outputs: dict | None = None


def _ort_run(path: Path, feeds: dict | None) -> OrtRun:
    import onnxruntime as ort

    try:
        sess = ort.InferenceSession(str(path), _session_options(), providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - any refusal by ORT
        return OrtRun("refused", str(e).splitlines()[0][:200])
    if feeds is None:
        return OrtRun("loaded")
    names = {i.name for i in sess.get_inputs()}
    try:
        values = sess.run(None, {k: v for k, v in feeds.items() if k in names})
    except Exception as e:  # noqa: BLE001
        return OrtRun("failed", str(e).splitlines()[0][:200])
    return OrtRun("ran", outputs=dict(zip([o.name for o in sess.get_outputs()], values)))


def _feeds(path: Path, dims: dict[str, int] | None = None) -> dict | None:
    """Random inputs for the model at ``path`` (symbolic dimensions: ``dims``, else 2; integers in [0, 2),
    valid indices into any axis of 2 or more; ``tangent*``: ones), or None when it cannot
    be read or fed (an untyped or unsized input, too many elements)."""
    import zlib

    try:
        m = onnx.load(str(path), load_external_data=False)
    except Exception:  # noqa: BLE001
        return None
    inits = {t.name for t in m.graph.initializer}
    feeds, total = {}, 0
    for vi in m.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type") or not tt.HasField("shape"):
            return None
        try:
            dt = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type))
        except Exception:  # noqa: BLE001
            return None
        shape = [d.dim_value if d.HasField("dim_value") else (dims or {}).get(d.dim_param, 2) for d in tt.shape.dim]
        if any(d < 0 for d in shape):
            return None
        total += int(np.prod(shape, dtype=np.float64))
        if total > FEED_ELEMENTS:
            return None
        rng = np.random.default_rng(zlib.crc32(vi.name.encode("utf-8", "replace")))
        if dt.kind == "f" or dt.name == "bfloat16":
            value = np.ones(shape) if vi.name.startswith("tangent") else rng.standard_normal(shape) * 0.5
        elif dt.kind in "iu":
            value = rng.integers(0, 2, size=shape)
        elif dt.kind == "b":
            value = rng.random(shape) < 0.5
        else:
            return None
        feeds[vi.name] = np.asarray(value).astype(dt)
    return feeds


def _unseeded_random(path: Path) -> bool:
    try:
        m = onnx.load(str(path), load_external_data=False)
    except Exception:  # noqa: BLE001
        return True
    return any(n.op_type in RANDOM_OPS and not any(a.name == "seed" for a in n.attribute) for n in m.graph.node)


def _f16_normwise(expected: np.ndarray, got: np.ndarray) -> float | None:
    """max |got - expected| in float16 eps of max |expected| (None: not two finite float16 arrays)."""
    if expected.dtype != np.float16 or got.dtype != np.float16 or expected.shape != got.shape:
        return None
    a, b = expected.astype(np.float64), got.astype(np.float64)
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return None
    top = float(np.abs(a).max()) * float(np.finfo(np.float16).eps)
    return float(np.abs(a - b).max()) / top if top else None


def _declared_dim(dim, values: dict[str, int]) -> int | None:
    """A written dimension at ``values``: a number, a product of symbols and numbers, or None."""
    if dim.HasField("dim_value"):
        return dim.dim_value
    parts = dim.dim_param.split("*") if dim.dim_param else []
    if not parts or not all(p in values or p.isdigit() for p in parts):
        return None
    return int(np.prod([values[p] if p in values else int(p) for p in parts]))


def _wrong_declared_shapes(out: Path, feeds: dict, values: dict[str, int]) -> list[str]:
    """Tensors whose written value_info shape, at ``values`` of the symbolic dimensions, is
    not the shape ORT makes (a dimension named for another one that had the same value)."""
    m = onnx.load(str(out))
    declared = {v.name: [_declared_dim(d, values) for d in v.type.tensor_type.shape.dim]
                for v in m.graph.value_info if v.type.HasField("tensor_type") and v.type.tensor_type.HasField("shape")}
    m.graph.output.extend(v for v in m.graph.value_info if v.name in declared)
    exposed = out.with_name("exposed.onnx")
    onnx.save(m, str(exposed))
    got = _ort_run(exposed, feeds)
    if got.state != "ran":
        return [f"({got.state}: {got.why})"]
    return [f"{t} declared {shape}, ORT made {list(got.outputs[t].shape)}" for t, shape in declared.items()
            if any(d is not None and d != g for d, g in zip(shape, got.outputs[t].shape))]


def _ort_verdict(seed: Seed, src: Path, out: Path, summary: Summary) -> Outcome | None:
    """ONNX Runtime on the written model: loads where the input loads, runs where the input
    runs, and gives the input's outputs bit for bit. None: nothing wrong."""
    feeds = _feeds(src, seed.run_dims)
    got = _ort_run(out, feeds)
    summary.ort_loaded += got.state != "refused"
    if got.state == "refused":
        if _ort_run(src, None).state != "refused":
            return Outcome("defect", f"output does not load in ORT but the input does: {got.why}")
        if not seed.ort and any(m in got.why for m in ORT_LACKS):
            return None  # the zoo's training ops (onnxruntime-training runs them: make test-ort-training), bfloat16
        return Outcome("garbage_passthrough", got.why)
    if feeds is None:
        return None
    expected = _ort_run(src, feeds)
    if expected.state != "ran":
        return None  # garbage in: the input does not run either
    if got.state != "ran":
        return Outcome("defect", f"output fails to run in ORT where the input runs: {got.why}")
    summary.ort_compared += 1
    wrong = _wrong_declared_shapes(out, feeds, seed.run_dims) if seed.run_dims else []
    if wrong:
        return Outcome("defect", f"written shapes at {seed.run_dims} are not ORT's: {'; '.join(wrong[:3])[:300]}")
    if _unseeded_random(src):
        return None
    differ = {}
    for name, a in expected.outputs.items():
        b = got.outputs.get(name)
        if b is None or a.dtype != b.dtype or a.shape != b.shape or a.tobytes() != b.tobytes():
            differ[name] = b
    if not differ:
        return None
    parts = []
    for name, b in differ.items():
        a = expected.outputs[name]
        if b is None or a.shape != b.shape or a.dtype != b.dtype:
            parts.append(f"{name} {a.dtype}{list(a.shape)} -> {None if b is None else f'{b.dtype}{list(b.shape)}'}")
        else:
            diff = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
            parts.append(f"{name} max |diff| {diff:g}")
    normwise = [None if b is None else _f16_normwise(expected.outputs[n], b) for n, b in differ.items()]
    if all(e is not None and e <= F16_NORMWISE_EPS for e in normwise):
        summary.f16_rounding.append({"model": src.name, "normwise_eps": round(max(normwise), 3),
                                     "outputs": sorted(differ)})
        return None  # documented: float16 on ORT's CPU provider
    return Outcome("defect", f"outputs differ from the input's on ORT: {'; '.join(parts)[:300]}")


def _command(rng: random.Random, model: Path, out: Path) -> list[str]:
    kind = rng.choices(["inspect", "rewrite", "plan"], weights=[3, 5, 2])[0]
    args = [kind, str(model)]
    if kind == "rewrite":
        args += ["-o", str(out)]
        args += rng.choice([[], [], ["--auto", "sqrt"], ["--no-recompute"], ["--budget", "90%"], ["--json"]])
    elif kind == "plan":
        args += rng.choice([["--auto", "sqrt"], ["--auto", "layers"], ["--budget", "80%"], ["--json"]])
    elif rng.random() < 0.3:
        args.append("--json")
    if rng.random() < 0.1:
        args += ["--dim", "batch=2"]
    return args


def _json_error(stdout: str, code: int, line: str) -> bool:
    """Under --json a failure prints the schema's error object on stdout too:
    {"schema_version": 1, "command": ..., "error": {"exit_code", "message"}}, the message stderr's line."""
    import jsonschema
    from importlib import resources

    try:
        doc = json.loads(stdout)
    except ValueError:
        return False
    schema = json.loads(resources.files("ckpt_cli.report").joinpath("schema.json").read_text())
    if list(jsonschema.Draft202012Validator(schema).iter_errors(doc)):
        return False
    return doc.get("error") == {"exit_code": code, "message": line[len("ckpt: error: "):]}


# Usage errors, each a command line that click or ckpt refuses before any work (M: the model,
# V: a hostile or random value); --json is put at a random place after the command.
USAGE_ERRORS = [
    ["inspect", "M", "--V"], ["--V", "inspect", "M"], ["V"], ["inspect"], ["check", "M"], ["plan"],
    ["inspect", "M", "--dim"], ["check", "M", "M", "--provider", "V"], ["plan", "M", "--auto", "V"],
    ["check", "M", "M", "--runs", "V"], ["check", "M", "M", "--runs", "0"], ["check", "M", "M", "--rtol", "-1"],
    ["check", "M", "M", "--seed", "-3"], ["rewrite", "M", "--force=V"], ["inspect", "M", "V"],
    ["session", "V"], ["compare"], ["inspect", "M", "--dim", "V=0"], ["plan", "M", "--svg", "x.svg"],
    ["rewrite", "M", "--ort-optimize", "V"], ["rewrite", "M", "--region", "re:V(", "-o", "o.onnx"],
    ["inspect", "M", "--loss", "V"], ["rewrite", "M", "--auto", "layers", "--budget", "1GiB"],
    ["rewrite", "M", "--budget", "V"], ["plan", "M", "--activation-budget", "2"], ["compare", "M", "--fail-if", "V"],
    ["compare", "M", "M", "--format", "V"], ["check", "M", "M", "--timeout", "0"], ["check", "M", "V"],
    ["check", "M", "M", "--max-prediction-error", "11"], ["rewrite", "M", "--check", "--rtol", "2"],
    ["plan", "M", "--sweep", "--auto", "sqrt"], ["plan", "M", "--budget", "1GiB", "--activation-budget", "0.5"],
    ["inspect", "M", "--dim", "batch=V"], ["session", "M", "--provider", "V"],
]


def _usage_args(rng: random.Random, model: Path) -> list[str]:
    value = rng.choice(HOSTILE_NAMES[:3] + ["\x1b]0;t\x07", "\x1b[2J", "\udcff", "nope", "x y"]) or "v"
    args = [str(model) if a == "M" else a.replace("V", value) for a in rng.choice(USAGE_ERRORS)]
    at = next((i + 1 for i, a in enumerate(args) if not a.startswith("-")), len(args))
    # never right after an option, which would take --json for its value
    places = [at] + [i for i in range(at + 1, len(args) + 1) if not args[i - 1].startswith("-")]
    args.insert(rng.choice(places), "--json")
    return args


def run_usage_case(seed: Seed, rng: random.Random, folder: Path, summary: Summary) -> Outcome:
    """A usage error under --json: exit 2, one line on stderr with no raw control character,
    and the schema's error object on stdout."""
    model = folder / "m.onnx"
    onnx.save(seed.instance(rng), str(model))
    args = _usage_args(rng, model)
    result = _invoke(args)
    if result is None:
        return Outcome("defect", f"hang over {CASE_SECONDS}s: {args!r}")
    summary.exit_codes[result.exit_code] += 1
    lines = result.stderr.strip().splitlines()
    if result.exit_code != 2 or len(lines) != 1 or not lines[0].startswith("ckpt: error:"):
        return Outcome("defect", f"usage error {args!r}: exit {result.exit_code}, {result.output[:300]!r}")
    if any(c in lines[0] for c in "\x1b\x07\x9b") or not _json_error(result.stdout, 2, lines[0]):
        return Outcome("defect", f"usage error {args!r}: stderr {lines[0][:200]!r}, stdout {result.stdout[:200]!r}")
    return Outcome("clean_error")


def run_child_case(rng: random.Random, folder: Path) -> Outcome:
    """``ckpt check --python`` of a misbehaving interpreter (tests/fuzz_children.py judges it)."""
    from chain import chain_model
    from fuzz_children import run_case as run_child

    model = folder / "chain.onnx"
    onnx.save(chain_model(layers=2, batch=16, width=16), str(model))
    kind, detail = run_child(rng, folder, model)
    if kind == "defect":
        return Outcome("defect", f"--python child: {detail}")
    return Outcome("clean_error" if kind == "clean_error" else "correct")


def run_case(seed: Seed, rng: random.Random, work: Path, ort_every: int, case: int, summary: Summary,
             debug: bool = False) -> Outcome:
    folder = work / f"case{case}"
    folder.mkdir()
    if seed.kind == "check_differs":
        return run_check_case(seed, rng, folder, summary, debug)
    if seed.kind == "concurrent":
        return run_concurrent_case(seed, rng, folder, summary)
    if seed.kind == "usage_json":
        return run_usage_case(seed, rng, folder, summary)
    if seed.kind == "python_child":
        return run_child_case(rng, folder)
    base = seed.instance(rng)
    model = onnx.ModelProto()
    model.CopyFrom(base)
    if rng.random() < 0.3:  # exercise the success path too
        rng.choice(BENIGN_MUTATIONS)(model, rng)
    else:
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            mutation = rng.choice(GRAPH_MUTATIONS)
            try:
                mutation(model, rng)
            except (IndexError, ValueError, TypeError):  # it does not apply to what earlier ones left
                pass
    name = "ext.onnx" if seed.data is not None else f"{seed.name}.onnx"
    path = folder / name
    try:
        data = model.SerializeToString()
    except Exception:  # noqa: BLE001 - a mutation protobuf itself refuses to encode
        data = base.SerializeToString()
    if rng.random() < 0.15:
        data = mutate_bytes(data, rng)
    path.write_bytes(data)
    if seed.data is not None:
        (folder / "ext.onnx.data").write_bytes(seed.data)
        (folder / "link.data").symlink_to("/etc/hostname")
    (folder / "unrelated.txt").write_text("keep me")
    before = _digest(folder)
    out = folder / "out.onnx"
    args = _command(rng, path, out)
    if seed.dim_options and args[0] != "inspect":
        args += rng.choice(seed.dim_options)
    if debug:  # replaying one case: show the traceback
        args = ["--debug", *args]
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(CASE_SECONDS)
    try:
        result = CliRunner().invoke(main_command(), args)
    except _Timeout:
        return Outcome("defect", f"hang over {CASE_SECONDS}s: {args}")
    finally:
        signal.alarm(0)
    code, text = result.exit_code, result.output
    if debug:
        print(args, code, text, sep="\n", file=sys.stderr)
        args = args[1:]
        text = text if code == 0 else text.strip().splitlines()[-1] + "\n"
    summary.exit_codes[code] += 1
    after = _digest(folder)
    changed = [k for k, v in before.items() if after.get(k) != v]
    if changed:
        return Outcome("defect", f"input files changed {changed}: {args}")
    if isinstance(result.exception, _Timeout):
        return Outcome("defect", f"hang over {CASE_SECONDS}s: {args}")
    if "Traceback" in text or code not in (0, 2, 3):
        return Outcome("defect", f"exit {code}: {text.strip()[-300:]} ({args[0]})")
    if code != 0:
        lines = (text if debug else result.stderr).strip().splitlines()
        if len(lines) == 1 and lines[0].startswith("ckpt: error:"):
            if out.exists():
                return Outcome("defect", f"output written despite exit {code}")
            if "--json" in args and not debug and not _json_error(result.stdout, code, lines[0]):
                return Outcome("defect", f"exit {code} under --json without its JSON error: {result.stdout[:300]!r}")
            if seed.ort and "ONNX Runtime refuses the model" in lines[0] and _ort_run(path, None).state != "refused":
                return Outcome("defect", f"refused as ORT's refusal, but ORT loads it: {lines[0][:300]}")
            return Outcome("clean_error")
        return Outcome("defect", f"exit {code} with a message of {len(lines)} lines: {text[:300]!r}")
    if args[0] != "rewrite":
        return Outcome("correct")
    refused = _checker_verdict(path, out)
    if refused is not None:
        return refused
    if case % ort_every == 0:
        verdict = _ort_verdict(seed, path, out, summary)
        if verdict is not None:
            return verdict
    leftovers = [p.name for p in folder.iterdir() if p.name.endswith(".tmp")]
    if leftovers:
        return Outcome("defect", f"temporary files left: {leftovers}")
    return Outcome("correct")


_NO_SCHEMA = re.compile(r"No Op registered for (\S+) with domain_version of (\d+)")


def _checker_verdict(src: Path, out: Path) -> Outcome | None:
    """onnx.checker on a written model (None: it passes, or it refuses only an ONNX-domain op
    that ORT registers where onnx does not, which ORT's verdict judges)."""
    try:
        onnx.checker.check_model(str(out))
        return None
    except Exception as e:  # noqa: BLE001
        error = str(e)
    from ckpt_cli.ort.registry import ort_registers

    unknown = _NO_SCHEMA.search(error)
    if unknown and ort_registers(unknown[1], int(unknown[2])):
        return None
    try:
        onnx.checker.check_model(str(src))
        return Outcome("defect", f"rewrite exit 0, output fails the checker: {error[:200]}")
    except Exception:  # noqa: BLE001 - the input fails it too: ckpt should have refused it
        return Outcome("defect", f"accepted an input the checker refuses: {error[:200]}")


def _invoke(args: list[str]):
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(CASE_SECONDS)
    try:
        return CliRunner().invoke(main_command(), args)
    except _Timeout:
        return None
    finally:
        signal.alarm(0)


def _changed_copy(path: Path, out: Path, rng: random.Random, feeds: dict, expected: dict) -> bool:
    """Write to ``out`` the model at ``path`` with one float constant changed (or, failing
    that, one Add made a Sub) so that its outputs differ from ``expected``."""
    m = onnx.load(str(path))
    floats = [i for i, t in enumerate(m.graph.initializer)
              if t.data_type in (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16)]
    adds = [i for i, n in enumerate(m.graph.node) if n.op_type == "Add"]
    tries = [("init", i) for i in rng.sample(floats, len(floats))] + [("node", i) for i in adds]
    for what, i in tries[:8]:
        c = onnx.ModelProto()
        c.CopyFrom(m)
        if what == "init":
            t = c.graph.initializer[i]
            a = numpy_helper.to_array(t)
            t.CopyFrom(numpy_helper.from_array((a * 1.5 + 0.25).astype(a.dtype), t.name))
        else:
            c.graph.node[i].op_type = "Sub"
        onnx.save(c, str(out))
        got = _ort_run(out, feeds)
        if got.state == "ran" and any(v.tobytes() != got.outputs[k].tobytes() for k, v in expected.items()):
            return True
    return False


def _default_session_refuses(path: Path) -> bool:
    """Whether ORT refuses ``path`` in a default session (ORT_ENABLE_ALL) that it loads with
    optimizations off: an ORT optimizer failing on a valid graph."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 4
    try:
        ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001 - any refusal by ORT
        return _ort_run(path, None).state == "loaded"
    return False


def _one_error_line(stderr: str) -> bool:
    lines = stderr.strip().splitlines()
    return len(lines) == 1 and lines[0].startswith("ckpt: error:")


def run_check_case(seed: Seed, rng: random.Random, folder: Path, summary: Summary, debug: bool) -> Outcome:
    """``ckpt check`` of a model and a rewrite of it whose outputs differ: exit 1, the
    differing outputs named in one failure line, no traceback."""
    a, b = folder / "a.onnx", folder / "b.onnx"
    onnx.save(seed.instance(rng), str(a))
    r = _invoke(["rewrite", str(a), "-o", str(b), "-q"])
    if r is None or r.exit_code != 0:
        return Outcome("defect", f"rewrite of a generated model: {'hang' if r is None else r.exit_code}: "
                                 f"{'' if r is None else r.output[-300:]}")
    feeds = _feeds(a)
    expected = _ort_run(a, feeds)
    if expected.state != "ran" or not _changed_copy(b, b, rng, feeds, expected.outputs):
        return Outcome("correct")  # (no constant changes its outputs)
    mode = rng.choice([[], ["--json"], ["-q"]])
    args = ["check", str(a), str(b), "--provider", "cpu", "--runs", "1", *mode]
    result = _invoke((["--debug"] if debug else []) + args)
    if result is None:
        return Outcome("defect", f"hang over {CASE_SECONDS}s: {args}")
    code, text = result.exit_code, result.output
    summary.exit_codes[code] += 1
    if debug:
        print(args, code, text, sep="\n", file=sys.stderr)
    if code == 5 and _default_session_refuses(a) and (debug or _one_error_line(result.stderr)):
        return Outcome("clean_error")  # ORT's own optimizer breaks the valid input: ORT's failure (README)
    if "Traceback" in text or code != 1:
        return Outcome("defect", f"check of differing outputs: exit {code}, expected 1: {text.strip()[-300:]}")
    if mode == ["--json"]:
        try:
            report = json.loads(result.stdout)
        except ValueError:
            return Outcome("defect", f"check --json printed no JSON: {result.stdout[:300]!r}")
        failures = report.get("failures") or []
        if report.get("passed") is not False or report.get("outputs_equal") is not False or \
                not any(f.startswith("outputs differ") for f in failures):
            return Outcome("defect", f"check --json of differing outputs: passed={report.get('passed')}, "
                                     f"failures={failures}")
    elif mode == ["-q"]:
        if len(result.stdout.strip().splitlines()) > 1:
            return Outcome("defect", f"check -q printed {result.stdout[:300]!r}")
    else:
        lines = [line for line in text.splitlines() if line.startswith("failed: outputs differ")]
        if len(lines) != 1 or "verdict: FAIL" not in text:
            return Outcome("defect", f"check of differing outputs: {len(lines)} 'failed: outputs differ' lines: "
                                     f"{text.strip()[-300:]!r}")
    return Outcome("correct")


def run_concurrent_case(seed: Seed, rng: random.Random, folder: Path, summary: Summary) -> Outcome:
    """Two ``ckpt rewrite --force`` processes writing one output path at once."""
    base = seed.instance(rng)
    path = folder / ("ext.onnx" if seed.data is not None else "in.onnx")
    path.write_bytes(base.SerializeToString())
    if seed.data is not None:
        (folder / "ext.onnx.data").write_bytes(seed.data)
    out = folder / "out.onnx"
    if rng.random() < 0.5:  # an older output to replace
        out.write_bytes(b"not a model")
    before = _digest(folder)
    before.pop(out.name, None)
    options = [[], ["--auto", "sqrt"], ["--no-recompute"], ["--json"]]  # each succeeds on these models
    commands = [[sys.executable, "-m", "ckpt_cli.cli", "rewrite", str(path), "-o", str(out), "--force",
                 *rng.choice(options)] for _ in range(2)]
    env = {**os.environ, "NO_COLOR": "1"}
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=folder, env=env)
             for c in commands]
    results = []
    for p in procs:
        try:
            stdout, stderr = p.communicate(timeout=CASE_SECONDS)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            return Outcome("defect", f"concurrent rewrite: hang over {CASE_SECONDS}s")
        results.append((p.returncode, stdout, stderr))
    for code, stdout, stderr in results:
        summary.exit_codes[code] += 1
        lines = stderr.strip().splitlines()
        if "Traceback" in stderr or code not in (0, 2, 3):
            return Outcome("defect", f"concurrent rewrite: exit {code}: {stderr.strip()[-300:]}")
        if code != 0 and not (len(lines) == 1 and lines[0].startswith("ckpt: error:")):
            return Outcome("defect", f"concurrent rewrite: exit {code} with {len(lines)} lines: {stderr[:300]!r}")
    if all(code != 0 for code, _, _ in results):
        return Outcome("defect", f"concurrent rewrite: neither writer succeeded: {[r[2].strip() for r in results]}")
    after = _digest(folder)
    changed = [k for k, v in before.items() if after.get(k) != v]
    if changed:
        return Outcome("defect", f"concurrent rewrite: input files changed {changed}")
    try:
        onnx.checker.check_model(str(out))
        written = onnx.load(str(out), load_external_data=False)
    except Exception as e:  # noqa: BLE001
        return Outcome("defect", f"concurrent rewrite: the output fails the checker: {str(e)[:200]}")
    locations = set()
    for t in written.graph.initializer:
        if t.data_location == TensorProto.EXTERNAL:
            location = next((e.value for e in t.external_data if e.key == "location"), "")
            locations.add(location)
            if not (folder / location).is_file():
                return Outcome("defect", f"concurrent rewrite: external data {location!r} of {t.name} is missing")
    orphans = [p.name for p in folder.glob(f"{out.name}.*.data") if p.name not in locations]
    if orphans:  # the previous output's data goes once the new model is in place
        return Outcome("defect", f"concurrent rewrite: data files no model reads: {orphans}")
    verdict = _ort_verdict(seed, path, out, summary)
    if verdict is not None:
        verdict.detail = f"concurrent rewrite: {verdict.detail}"
        return verdict
    leftovers = [p.name for p in folder.iterdir() if p.name.endswith(".tmp")]
    if leftovers:
        return Outcome("defect", f"concurrent rewrite: temporary files left: {leftovers}")
    return Outcome("correct")


def main_command():
    from ckpt_cli.cli import main

    return main


def run_fuzz(cases: int, seed: int = 0, ort_every: int = 1, log=None, only: int | None = None) -> Summary:
    rng = random.Random(seed)
    seeds = load_seeds()
    weights = [s.weight for s in seeds]
    summary = Summary()
    work = Path(tempfile.mkdtemp(prefix="ckpt_fuzz_"))
    try:
        for case in range(cases):
            s = rng.choices(seeds, weights)[0]
            case_rng = random.Random(rng.getrandbits(64))
            if only is not None and case != only:
                continue
            outcome = run_case(s, case_rng, work, ort_every, case, summary, debug=only is not None)
            summary.counts[outcome.kind] += 1
            summary.kinds[s.name] += 1
            if outcome.kind == "garbage_passthrough" and len(summary.passthrough) < 20:
                summary.passthrough.append({"case": case, "seed_model": s.name, "ort_says": outcome.detail})
            if outcome.kind == "defect":
                summary.defects.append({"case": case, "seed_model": s.name, "detail": outcome.detail})
                if log is not None:
                    log(f"defect in case {case} ({s.name}): {outcome.detail}")
            if only is None:
                shutil.rmtree(work / f"case{case}", ignore_errors=True)
            if log is not None and (case + 1) % 500 == 0:
                log(f"{case + 1}/{cases}: {dict(summary.counts)}")
    finally:
        if only is None:
            shutil.rmtree(work, ignore_errors=True)
    return summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--ort-every", type=int, default=1,
                    help="run every Nth written model in ONNX Runtime and compare its outputs (default: every one)")
    ap.add_argument("--json", dest="json_path", help="write the summary here")
    ap.add_argument("--case", type=int, help="replay only this case, with --debug (its traceback)")
    a = ap.parse_args(argv)
    started = time.time()
    summary = run_fuzz(a.cases, a.seed, a.ort_every, log=lambda m: print(m, file=sys.stderr, flush=True),
                       only=a.case)
    result = {"cases": a.cases, "seed": a.seed, "seconds": round(time.time() - started, 1), **summary.to_json()}
    text = json.dumps(result, indent=2)
    if a.json_path:
        Path(a.json_path).write_text(text + "\n")
    print(text)
    return 1 if summary.counts.get("defect") else 0


if __name__ == "__main__":
    sys.exit(main())
