"""Tensors stored as external data: finding them (initializers and tensor attributes, in
subgraphs too) and checking that each location is a regular file inside the model's folder
with its bytes really there. onnx and ORT refuse anything else, and a location is
model-controlled: ``/etc/passwd``, ``../..``, a FIFO or ``/dev/zero`` must never be read."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Iterator

import onnx

from ..errors import ModelError
from ..graph import expected_bytes

_GRAPH_TYPES = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
_TENSOR_TYPES = (onnx.AttributeProto.TENSOR, onnx.AttributeProto.TENSORS, onnx.AttributeProto.SPARSE_TENSOR,
                 onnx.AttributeProto.SPARSE_TENSORS)


@dataclass(frozen=True)
class Extent:
    """Where one external tensor's bytes are: a checked file, offset and length."""

    file: Path
    offset: int
    length: int


def is_external(t: onnx.TensorProto) -> bool:
    return t.data_location == onnx.TensorProto.EXTERNAL


def _attribute_tensors(a: onnx.AttributeProto) -> Iterator[onnx.TensorProto]:
    if a.type == onnx.AttributeProto.TENSOR:
        yield a.t
    elif a.type == onnx.AttributeProto.TENSORS:
        yield from a.tensors
    elif a.type == onnx.AttributeProto.SPARSE_TENSOR:
        yield a.sparse_tensor.values
        yield a.sparse_tensor.indices
    elif a.type == onnx.AttributeProto.SPARSE_TENSORS:
        for s in a.sparse_tensors:
            yield s.values
            yield s.indices
    elif a.type == onnx.AttributeProto.GRAPH:
        yield from graph_tensors(a.g)
    elif a.type == onnx.AttributeProto.GRAPHS:
        for g in a.graphs:
            yield from graph_tensors(g)


def graph_tensors(g: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every TensorProto of a graph: initializers, sparse initializers, node attributes
    (Constant values and any other tensor attribute), recursively into subgraphs."""
    yield from g.initializer
    yield from other_tensors(g)


def other_tensors(g: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """``graph_tensors`` but the graph's own initializers."""
    for s in g.sparse_initializer:
        yield s.values
        yield s.indices
    for node in g.node:
        for a in node.attribute:
            if a.type in _TENSOR_TYPES or a.type in _GRAPH_TYPES:
                yield from _attribute_tensors(a)


def function_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Every TensorProto in the attributes of the model's local functions' nodes."""
    for f in model.functions:
        for node in f.node:
            for a in node.attribute:
                if a.type in _TENSOR_TYPES or a.type in _GRAPH_TYPES:
                    yield from _attribute_tensors(a)


def external_tensors(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    """The externally stored tensors of the graph and of the local functions."""
    return [t for t in chain(graph_tensors(model.graph), function_tensors(model)) if is_external(t)]


def _fields(t: onnx.TensorProto, where: Path) -> dict[str, str]:
    fields = {e.key: e.value for e in t.external_data}
    if any(type(v) is not str for v in chain(fields, fields.values())):  # protobuf gives bytes for bad UTF-8
        raise ModelError(f"{where}: tensor '{t.name!s}' has external-data fields that are not valid UTF-8 text")
    return fields


def _int_field(t: onnx.TensorProto, fields: dict[str, str], key: str, where: Path) -> int | None:
    raw = fields.get(key)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ModelError(f"{where}: tensor '{t.name}' has a malformed external-data {key} '{raw[:40]}'")
    return value


def check_embedded(t: onnx.TensorProto, where: Path) -> None:
    """An embedded tensor's ``raw_data`` holds the bytes its shape and type need: not fewer
    (onnx.checker's rule, for the tensors ckpt hands it as typed inputs instead) and not
    more (a type relabelled without its data: the checker lets it pass, numpy cannot read it)."""
    need = expected_bytes(t)
    if t.HasField("raw_data") and need is not None and len(t.raw_data) != need:
        raise ModelError(f"{where}: not a valid ONNX model (tensor '{t.name}' needs {need} bytes for its shape "
                         f"and type but its raw_data holds {len(t.raw_data)})")


def locate(t: onnx.TensorProto, model_dir: Path, model_path: Path) -> Extent:
    """The checked extent of one external tensor; ModelError for a location outside the
    model's folder, a file that is not regular, or an offset/length beyond the file."""
    where = model_path
    fields = _fields(t, where)
    location = fields.get("location")
    if not location:
        raise ModelError(f"{where}: tensor '{t.name}' is stored externally but names no location")
    if "\0" in location or os.path.isabs(location) or location.startswith(("/", "\\")):
        raise ModelError(f"{where}: tensor '{t.name}' keeps its data at an absolute path "
                         f"'{location[:80]}'; external data must lie beside the model")
    parts = Path(location).parts
    if ".." in parts:
        raise ModelError(f"{where}: tensor '{t.name}' keeps its data at '{location[:80]}', outside the "
                         "model's folder; external data must lie beside the model")
    folder = model_dir.resolve()
    file = folder / location
    if file.is_symlink():  # onnx.checker refuses links too
        raise ModelError(f"{where}: external data '{location[:80]}' of tensor '{t.name}' is a symbolic link; "
                         "ckpt reads only regular files beside the model")
    try:
        real = file.resolve(strict=True)
    except (OSError, RuntimeError) as e:
        raise ModelError(f"{where}: tensor '{t.name}' keeps its data in '{location[:80]}', "
                         "which is missing beside the model") from e
    if not real.is_relative_to(folder):
        raise ModelError(f"{where}: tensor '{t.name}' keeps its data in '{location[:80]}', a link "
                         "leading outside the model's folder")
    try:
        st = real.stat()
    except OSError as e:
        raise ModelError(f"{where}: cannot read external data '{location[:80]}' ({e.strerror})") from e
    if not stat.S_ISREG(st.st_mode):
        raise ModelError(f"{where}: external data '{location[:80]}' of tensor '{t.name}' is not a "
                         "regular file")
    offset = _int_field(t, fields, "offset", where) or 0
    length = _int_field(t, fields, "length", where)
    if length is None:
        length = st.st_size - offset
    if offset + length > st.st_size or length < 0:
        raise ModelError(f"{where}: tensor '{t.name}' reads bytes {offset}..{offset + max(length, 0)} of "
                         f"'{location[:80]}', which has only {st.st_size} (truncated data file?)")
    need = expected_bytes(t)
    if need is not None and need != length:
        raise ModelError(f"{where}: tensor '{t.name}' needs {need} bytes for its shape and type but its "
                         f"external data holds {length}")
    return Extent(real, offset, length)


def check_external(tensors: list[onnx.TensorProto], path: Path) -> set[Path]:
    """Check every external tensor of a loaded model (``external_tensors``); returns the data files they read."""
    return {locate(t, path.parent, path).file for t in tensors}
