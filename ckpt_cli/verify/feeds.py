"""Deterministic input feeds for ONNX training graphs, and validation of given feeds.

``make_feeds(model, seed, dims)`` builds one array per graph input (inputs that are
also initializers are skipped: they have values already; so are optional inputs, which
ORT runs as None):

* float32 / float16 / float64: standard normal * 0.1, except
  - names starting with ``tangent`` (PyTorch joint graphs' loss-gradient seed) or
    ending in ``_grad``: ones;
  - ORT training artifacts' ``*.accumulation.buffer`` inputs: zeros.
* bool: uniform random, except ORT artifacts' ``lazy_reset_grad``: True.
* integers: uniform in ``[0, bound)`` where ``bound`` is the smallest bound found by
  following the input through value-preserving ops (Cast, Reshape, Unsqueeze,
  Squeeze, Flatten, Identity, Expand, Transpose, Slice, Tile, Concat, Where's
  value inputs) to a use that
  gives one (first match wins per use; all uses together take the minimum):
  - indices of Gather / GatherElements / Scatter / ScatterElements:
    ``data.shape[axis]``; of GatherND / ScatterND: the smallest indexed data dim;
  - indices of OneHot: ``depth`` (when it is a constant);
  - target of SoftmaxCrossEntropyLoss / NegativeLogLikelihoodLoss: ``scores.shape[1]``;
  - compared (Equal/Less/Greater/...) against a constant vector (not a scalar:
    that is a mask test such as ``!= ignore_index``): its max + 1; against an
    ArgMax/ArgMin output: the reduced axis' size; against a Range with constant
    limit: the limit.
  Shapes come from initializers, graph inputs/outputs, value_info and, when
  needed, ONNX shape inference.  Integer inputs with no such use get values in
  ``[0, FALLBACK_INT_BOUND)`` = ``[0, 2)``: valid for any index into a non-empty
  axis of size >= 2, for binary labels, and small enough not to overflow.
* symbolic dimensions are taken from ``dims`` (dim_param -> size); a missing one is
  a ``FeedError``.

Values depend only on (seed, input name, shape, dtype, bound), not on the order
of inputs.
"""

from __future__ import annotations

import os
import stat
import zlib
from collections import deque
from collections.abc import Mapping

from pathlib import Path
from typing import Any, cast

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from ..errors import UsageError

FALLBACK_INT_BOUND = 2

ModelLike = onnx.ModelProto | str | os.PathLike[str]
Feeds = dict[str, np.ndarray]
# A declared axis: its size, its symbolic name, or None where the model names neither.
Dim = int | str | None

_FLOAT_TYPES: dict[int, Any] = {
    TensorProto.FLOAT: np.float32,
    TensorProto.FLOAT16: np.float16,
    TensorProto.DOUBLE: np.float64,
}
_INT_TYPES: dict[int, Any] = {
    TensorProto.INT8: np.int8, TensorProto.INT16: np.int16, TensorProto.INT32: np.int32,
    TensorProto.INT64: np.int64, TensorProto.UINT8: np.uint8, TensorProto.UINT16: np.uint16,
    TensorProto.UINT32: np.uint32, TensorProto.UINT64: np.uint64,
}
_NUMPY_TYPES = {**_FLOAT_TYPES, **_INT_TYPES, TensorProto.BOOL: np.bool_}

# op type -> input positions through which index values pass unchanged
_PASSTHROUGH = {
    "Cast": (0,), "Reshape": (0,), "Unsqueeze": (0,), "Squeeze": (0,), "Flatten": (0,),
    "Identity": (0,), "Expand": (0,), "Transpose": (0,), "Slice": (0,), "Tile": (0,),
    "Concat": None,  # any input
    "Where": (1, 2),  # e.g. Where(label != ignore_index, label, 0)
}
_COMPARE = {"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"}


class FeedError(ValueError):
    """A feed cannot be made or does not fit the model.  The message is one line."""


def _type_name(elem_type: int) -> str:
    try:
        return str(TensorProto.DataType.Name(elem_type)).lower()
    except ValueError:
        return f"type {elem_type}"


def _as_model(model: ModelLike) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (str, os.PathLike)):
        return onnx.load(os.fspath(model), load_external_data=False)
    raise TypeError(f"expected onnx.ModelProto or a path, got {type(model).__name__}")


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """Graph inputs that need a feed: initializers and optional inputs (ORT runs an
    optional input left out as None, as ckpt's memory-pattern input is meant) are skipped."""
    inits = {t.name for t in model.graph.initializer}
    return [vi for vi in model.graph.input if vi.name not in inits and vi.type.WhichOneof("value") != "optional_type"]


def _tensor_type(vi: onnx.ValueInfoProto) -> onnx.TypeProto.Tensor:
    t = vi.type
    if t.WhichOneof("value") != "tensor_type":
        raise FeedError(f"input {vi.name!r} is not a tensor ({t.WhichOneof('value')}); "
                        "only tensor inputs are supported")
    return t.tensor_type


def _declared_dims(vi: onnx.ValueInfoProto) -> list[Dim] | None:
    """[int | str | None] for each axis; str = dim_param, None = unknown."""
    tt = _tensor_type(vi)
    if not tt.HasField("shape"):
        return None
    out: list[Dim] = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            out.append(int(d.dim_value))
        elif d.HasField("dim_param") and d.dim_param:
            out.append(d.dim_param)
        else:
            out.append(None)
    return out


def _resolve_shape(vi: onnx.ValueInfoProto, dims: dict[str, int]) -> tuple[int, ...]:
    decl = _declared_dims(vi)
    if decl is None:
        raise FeedError(f"input {vi.name!r} has no shape in the model; cannot make a feed")
    shape: list[int] = []
    for axis, d in enumerate(decl):
        if isinstance(d, int):
            shape.append(d)
        elif isinstance(d, str):
            if d not in dims:
                raise FeedError(f"input {vi.name!r} axis {axis} is the symbolic dimension "
                                f"{d!r}; give its size with --dim {d}=N")
            shape.append(int(dims[d]))
        else:
            raise FeedError(f"input {vi.name!r} axis {axis} has no size and no name; "
                            "cannot make a feed")
    return tuple(shape)


class _ShapeIndex:
    """Static shapes and constant values of tensors, lazily completed by inference."""

    def __init__(self, model: onnx.ModelProto, dims: dict[str, int]):
        self.model = model
        self.dims = dims
        self.shapes: dict[str, list[int | None]] = {}
        self.consts: dict[str, np.ndarray] = {}
        self.producer: dict[str, onnx.NodeProto] = {}
        self._inferred = False
        g = model.graph
        for t in g.initializer:
            self.shapes[t.name] = list(t.dims)
            if _small(t):
                try:
                    self.consts[t.name] = numpy_helper.to_array(t)
                except Exception:  # noqa: BLE001 - a tensor numpy_helper cannot read (its dtype, its size): unknown
                    pass
        for n in g.node:
            for o in n.output:
                self.producer[o] = n
            if n.op_type == "Constant" and n.output:
                for a in n.attribute:
                    if a.name == "value" and _small(a.t):
                        self.consts[n.output[0]] = numpy_helper.to_array(a.t)
                        self.shapes[n.output[0]] = list(a.t.dims)
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            self._add_vi(vi)

    def _add_vi(self, vi: onnx.ValueInfoProto) -> None:
        if vi.name in self.shapes or vi.type.WhichOneof("value") != "tensor_type":
            return
        decl = _declared_dims(vi)
        if decl is not None:
            self.shapes[vi.name] = [self.dims.get(d) if isinstance(d, str) else d for d in decl]

    def shape(self, name: str) -> list[int | None] | None:
        if name not in self.shapes and not self._inferred:
            self._inferred = True
            try:
                inferred = onnx.shape_inference.infer_shapes(self.model, strict_mode=False)
                for vi in inferred.graph.value_info:
                    self._add_vi(vi)
            except Exception:  # noqa: BLE001 - onnx's inference fails many ways: the declared shapes stand
                pass
        return self.shapes.get(name)

    def dim(self, name: str, axis: int) -> int | None:
        s = self.shape(name)
        if s is None:
            return None
        if axis < 0:
            axis += len(s)
        if not 0 <= axis < len(s):
            return None
        d = s[axis]
        return d if isinstance(d, int) and d > 0 else None


def _small(t: onnx.TensorProto) -> bool:
    n = 1
    for d in t.dims:
        n *= d
    return n <= 4096 and t.data_location != TensorProto.EXTERNAL


def _attr(node: onnx.NodeProto, name: str, default: Any) -> Any:
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _bound_from_use(node: onnx.NodeProto, idx: int, tensor: str, index: _ShapeIndex) -> int | None:
    op = node.op_type
    if op in ("Gather", "GatherElements") and idx == 1:
        return index.dim(node.input[0], _attr(node, "axis", 0))
    if op in ("Scatter", "ScatterElements") and idx == 1:
        return index.dim(node.input[0], _attr(node, "axis", 0))
    if op in ("GatherND", "ScatterND") and idx == 1:
        b = _attr(node, "batch_dims", 0) if op == "GatherND" else 0
        data = index.shape(node.input[0])
        ind = index.shape(tensor)
        if data is None:
            return None
        k = ind[-1] if ind and isinstance(ind[-1], int) else len(data) - b
        sizes = [d for d in data[b:b + k] if isinstance(d, int) and d > 0]
        return min(sizes) if sizes else None
    if op == "OneHot" and idx == 0 and len(node.input) > 1:
        depth = index.consts.get(node.input[1])
        return int(np.asarray(depth).reshape(-1)[0]) if depth is not None else None
    if op in ("SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss") and idx == 1:
        return index.dim(node.input[0], 1)
    if op in _COMPARE and len(node.input) == 2:
        other = node.input[1 - idx]
        c = index.consts.get(other)
        # A vector like arange(C) (one-hot by broadcasting); a scalar is a mask test
        # such as `ids != padding_idx` or `label != ignore_index`, not a bound.
        if c is not None and np.size(c) > 1 and np.issubdtype(np.asarray(c).dtype, np.integer):
            return int(np.max(c)) + 1
        p = index.producer.get(other)
        if p is not None and p.op_type in ("ArgMax", "ArgMin"):
            return index.dim(p.input[0], _attr(p, "axis", 0))
        if p is not None and p.op_type == "Range" and len(p.input) >= 2:
            lim = index.consts.get(p.input[1])
            return int(np.asarray(lim).reshape(-1)[0]) if lim is not None else None
    return None


Consumers = dict[str, list[tuple[onnx.NodeProto, int]]]


def _int_bound(name: str, consumers: Consumers, index: _ShapeIndex) -> int | None:
    """Smallest index bound found downstream of `name`, or None."""
    bounds: list[int] = []
    seen = {name}
    todo = deque([name])
    while todo:
        t = todo.popleft()
        for node, idx in consumers.get(t, ()):
            b = _bound_from_use(node, idx, t, index)
            if b is not None and b > 0:
                bounds.append(b)
                continue
            through = _PASSTHROUGH.get(node.op_type, ())
            if through is None or idx in through:
                for o in node.output[:1]:
                    if o and o not in seen:
                        seen.add(o)
                        todo.append(o)
    return min(bounds) if bounds else None


def _rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, zlib.crc32(name.encode("utf-8"))])


def make_feeds(model: ModelLike, seed: int = 0, dims: dict[str, int] | None = None) -> Feeds:
    """One deterministic array per graph input; see the module docstring for the rules."""
    model = _as_model(model)
    dims = dict(dims or {})
    for k, v in dims.items():
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 0:
            raise FeedError(f"dimension {k!r} must be a non-negative integer, got {v!r}")
    index: _ShapeIndex | None = None
    consumers: Consumers = {}
    for node in model.graph.node:
        for i, name in enumerate(node.input):
            if name:
                consumers.setdefault(name, []).append((node, i))
    feeds: Feeds = {}
    for vi in graph_inputs(model):
        name = vi.name
        elem = _tensor_type(vi).elem_type
        shape = _resolve_shape(vi, dims)
        rng = _rng(seed, name)
        low = name.lower()
        arr: np.ndarray
        if elem in _FLOAT_TYPES:
            dt = _FLOAT_TYPES[elem]
            if low.endswith(".accumulation.buffer"):
                arr = np.zeros(shape, dt)
            elif low.startswith("tangent") or low.endswith("_grad"):
                arr = np.ones(shape, dt)
            else:
                arr = (rng.standard_normal(shape) * 0.1).astype(dt)
        elif elem == TensorProto.BOOL:
            if low == "lazy_reset_grad":
                arr = np.ones(shape, np.bool_)
            else:
                arr = rng.random(shape) < 0.5
        elif elem in _INT_TYPES:
            if index is None:
                index = _ShapeIndex(model, dims)
            bound = _int_bound(name, consumers, index) or FALLBACK_INT_BOUND
            dt = _INT_TYPES[elem]
            bound = min(bound, int(np.iinfo(dt).max) + 1)
            arr = rng.integers(0, bound, size=shape, dtype=np.int64).astype(dt)
        else:
            raise FeedError(f"input {name!r} has element type {_type_name(elem)}, "
                            "which ckpt cannot generate; pass feeds from a file")
        feeds[name] = np.asarray(arr, order="C")  # (ascontiguousarray makes 0-d arrays 1-d)
    return feeds


def save_feeds(path: str | os.PathLike[str], feeds: Mapping[str, np.ndarray]) -> None:
    """Write feeds as an .npz file (one array per input name)."""
    np.savez(os.fspath(path), **cast(dict[str, Any], {k: np.asarray(v) for k, v in feeds.items()}))


def feed_dims(model: ModelLike, feeds: Mapping[str, np.ndarray]) -> dict[str, tuple[int, str]]:
    """The size each symbolic dimension has in ``feeds`` (checked by ``load_feeds``), and
    the first input that shows it."""
    sizes: dict[str, tuple[int, str]] = {}
    for vi in graph_inputs(_as_model(model)):
        # np.shape(None) is (): an input without a feed shows no sizes
        for d, size in zip(_declared_dims(vi) or (), np.shape(cast(Any, feeds.get(vi.name)))):
            if isinstance(d, str):
                sizes.setdefault(d, (int(size), vi.name))
    return sizes


def load_feeds(path: str | os.PathLike[str], model: ModelLike) -> Feeds:
    """Load an .npz of feeds and check it against the model's inputs.

    Every graph input must be present with the exact element type and a shape
    that matches its static dimensions; a symbolic dimension must have the same
    size in every input that uses it; names that are not inputs are an error.
    """
    model = _as_model(model)
    path = os.fspath(path)
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO or a device would block or never end
            raise FeedError(f"feeds file {path} is not a regular file (expected an .npz archive of arrays)")
        with np.load(path, allow_pickle=False) as z:
            if not isinstance(z, np.lib.npyio.NpzFile):
                raise FeedError(f"feeds file {path} is one array, not an .npz archive of arrays (numpy.savez)")
            data = {k: z[k] for k in z.files}
    except FileNotFoundError as e:
        raise FeedError(f"feeds file not found: {path}") from e
    except FeedError:
        raise
    except ValueError as e:
        if "pickle" in str(e):  # numpy suggests allow_pickle: never load pickled objects
            raise FeedError(f"feeds file {path} is not an .npz archive of arrays (numpy.savez)") from e
        raise FeedError(f"cannot read feeds file {path}: {' '.join(str(e).split())}") from e
    except Exception as e:  # numpy's reader raises many types on a bad file
        raise FeedError(f"cannot read feeds file {path}: {' '.join(str(e).split())}") from e
    inputs = graph_inputs(model)
    names = [vi.name for vi in inputs]
    for name in names:
        if name not in data:
            raise FeedError(f"missing feed for input {name!r} in {path}")
    known = set(names)
    extra = [k for k in data if k not in known]
    if extra:
        raise FeedError(f"feed {extra[0]!r} in {path} is not an input of the model")
    sym: dict[str, tuple[int, str]] = {}
    for vi in inputs:
        arr = data[vi.name]
        elem = _tensor_type(vi).elem_type
        want = _NUMPY_TYPES.get(elem)
        if want is None:
            raise FeedError(f"input {vi.name!r} has element type {_type_name(elem)}, "
                            "which ckpt cannot check")
        if arr.dtype != np.dtype(want):
            raise FeedError(f"input {vi.name!r}: feed has dtype {arr.dtype}, "
                            f"model wants {_type_name(elem)} ({np.dtype(want).name})")
        decl = _declared_dims(vi)
        if decl is None:
            continue
        if arr.ndim != len(decl):
            raise FeedError(f"input {vi.name!r}: feed has shape {list(arr.shape)} "
                            f"(rank {arr.ndim}), model wants rank {len(decl)} {decl}")
        for axis, (d, a) in enumerate(zip(decl, arr.shape)):
            if isinstance(d, int) and d != a:
                raise FeedError(f"input {vi.name!r}: feed has shape {list(arr.shape)}, "
                                f"model wants {decl} (axis {axis})")
            if isinstance(d, str):
                prev = sym.setdefault(d, (a, vi.name))
                if prev[0] != a:
                    raise FeedError(f"input {vi.name!r}: dimension {d!r} is {a} here but "
                                    f"{prev[0]} in input {prev[1]!r}")
    return data


def _feeds_at_dims(model: ModelLike, feeds: Mapping[str, np.ndarray], dims: dict[str, int]) -> None:
    """Feeds at other sizes than the analysis would be judged against a prediction for
    those: the check names the dimension instead of failing on the prediction."""
    for name, (size, where) in feed_dims(model, feeds).items():
        if name in dims and dims[name] != size:
            raise FeedError(f"--feeds: input {where!r} has {name} = {size}, but the models are analysed at "
                            f"{name} = {dims[name]}: give --dim {name}={size}")


def prepare_feeds(model: ModelLike, out_path: Path, seed: int, dims: dict[str, int], feeds_file: Path | None) -> None:
    """The check's feeds written to ``out_path``: ``feeds_file``'s at ``dims``, or made from ``seed``."""
    try:
        feeds = load_feeds(feeds_file, model) if feeds_file is not None else make_feeds(model, seed, dims)
        if feeds_file is not None:
            _feeds_at_dims(model, feeds, dims)
    except FeedError as e:
        raise UsageError(str(e)) from e
    except (MemoryError, ValueError) as e:  # numpy: too large an array for this machine
        raise UsageError(f"cannot make the feeds: {type(e).__name__}: {e} (a --dim too large?)") from e
    save_feeds(out_path, feeds)
