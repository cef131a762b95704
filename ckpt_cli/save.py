"""Writing graphs and reports: atomically, with external data streamed, ORT-loadable IR.

Nothing is ever written over the input, and a failed write leaves no partial file:
everything goes to a temporary file in the target folder and is renamed at the end.
"""

from __future__ import annotations

import os
import tempfile
from itertools import chain
from pathlib import Path

import onnx

from .errors import UsageError
from .graph import Graph, Node, gc_paused

# ORT 1.31 refuses IR 14, which onnx 1.23 writes by default (see ORT_FACTS.md §1).
_PREFERRED_IR = 10
_MAX_ORT_IR = 13
_EMBED_LIMIT = 1_800_000_000  # beyond this, large tensors go to external data
_EXTERNAL_MIN_BYTES = 1024
_COPY_CHUNK = 16 << 20


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _temp_beside(path: Path) -> Path:
    """A temporary file next to ``path`` with the permissions a new file would get
    (mkstemp makes it private, and the rename would keep that)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_umask())
    return Path(tmp)


def write_text_atomic(path: str | Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_beside(path)
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def check_output_path(output: Path, source: Path | None, force: bool) -> None:
    """Refuse to overwrite the input or an existing file without ``force``."""
    if source is not None and output.exists() and output.resolve() == source.resolve():
        raise UsageError(f"{output}: refusing to overwrite the input model; choose another -o")
    if output.exists() and not force:
        raise UsageError(f"{output}: exists; pass --force to overwrite it")
    if not output.parent.exists():
        raise UsageError(f"{output.parent}: output folder does not exist")


def output_ir_version(model: onnx.ModelProto) -> int:
    try:
        needed = onnx.helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True)
    except Exception:
        needed = _PREFERRED_IR
    return min(model.ir_version, max(_PREFERRED_IR, needed), _MAX_ORT_IR)


@gc_paused
def build_model(graph: Graph, nodes: list[onnx.NodeProto], metadata: dict[str, str] | None = None
                ) -> onnx.ModelProto:
    """A new ModelProto with ``nodes`` in this order; unused initializers and value_info dropped."""
    src = graph.model
    if len(nodes) == len(graph.nodes) and all(p is n.proto for p, n in zip(nodes, graph.nodes)):
        indexed = graph.nodes  # the graph's own nodes: their names are known without reading protos
    else:
        indexed = [Node.from_proto(k, p) for k, p in enumerate(nodes)]
    used = set(chain.from_iterable(n.inputs for n in indexed)) | set(graph.outputs)
    produced = set(chain.from_iterable(n.outputs for n in indexed))
    g = onnx.GraphProto(name=src.graph.name, doc_string=src.graph.doc_string)
    g.node.extend(nodes)
    g.input.extend(v for v in src.graph.input if v.name in used or v.name not in graph.initializers)
    g.output.extend(src.graph.output)
    g.initializer.extend(t for t in src.graph.initializer if t.name in used)
    g.sparse_initializer.extend(src.graph.sparse_initializer)
    g.value_info.extend(v for v in src.graph.value_info if v.name in produced)
    m = onnx.ModelProto(ir_version=output_ir_version(src), producer_name="ckpt",
                        producer_version=src.producer_version or "", domain=src.domain,
                        model_version=src.model_version, doc_string=src.doc_string, graph=g)
    m.opset_import.extend(src.opset_import)
    metadata = metadata or {}
    m.metadata_props.extend(p for p in src.metadata_props if p.key not in metadata)
    for key, value in sorted(metadata.items()):
        entry = m.metadata_props.add()
        entry.key, entry.value = key, value
    m.functions.extend(src.functions)
    return m


def save_model(model: onnx.ModelProto, path: str | Path, source_dir: Path | None = None) -> list[Path]:
    """Write ``model`` atomically. Initializers stored externally in the source (relative to
    ``source_dir``) are streamed into ``<path>.data`` beside the output. Returns the files written."""
    path = Path(path)
    data_path = path.with_name(path.name + ".data")
    external = [t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    embedded_bytes = sum(len(t.raw_data) for t in model.graph.initializer if t.HasField("raw_data"))
    spill = embedded_bytes > _EMBED_LIMIT
    written: list[Path] = []
    tmp_data = _temp_beside(data_path) if (external or spill) else None
    tmp_model = _temp_beside(path)
    try:
        if tmp_data is not None:
            with open(tmp_data, "wb") as out:
                for t in model.graph.initializer:
                    if t.data_location == onnx.TensorProto.EXTERNAL:
                        _copy_external(t, out, source_dir or Path("."), data_path.name)
                    elif spill and t.HasField("raw_data") and len(t.raw_data) >= _EXTERNAL_MIN_BYTES:
                        _spill(t, out, data_path.name)
        with open(tmp_model, "wb") as f:
            f.write(model.SerializeToString(deterministic=True))
        if tmp_data is not None:
            os.replace(tmp_data, data_path)
            written.append(data_path)
        os.replace(tmp_model, path)
        written.insert(0, path)
    finally:
        tmp_model.unlink(missing_ok=True)
        if tmp_data is not None:
            tmp_data.unlink(missing_ok=True)
    return written


def _external_fields(t: onnx.TensorProto) -> dict[str, str]:
    return {e.key: e.value for e in t.external_data}


def _set_external(t: onnx.TensorProto, location: str, offset: int, length: int) -> None:
    del t.external_data[:]
    for k, v in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = t.external_data.add()
        entry.key, entry.value = k, v
    t.data_location = onnx.TensorProto.EXTERNAL


def _align(out) -> int:
    pos = out.tell()
    pad = (-pos) % 64
    if pad:
        out.write(b"\0" * pad)
    return pos + pad


def _copy_external(t: onnx.TensorProto, out, source_dir: Path, location: str) -> None:
    fields = _external_fields(t)
    src = source_dir / fields["location"]
    offset = int(fields.get("offset", 0))
    length = int(fields["length"]) if "length" in fields else src.stat().st_size - offset
    start = _align(out)
    with open(src, "rb") as f:
        f.seek(offset)
        left = length
        while left:
            chunk = f.read(min(left, _COPY_CHUNK))
            if not chunk:
                raise UsageError(f"{src}: external data of '{t.name}' is truncated")
            out.write(chunk)
            left -= len(chunk)
    _set_external(t, location, start, length)


def _spill(t: onnx.TensorProto, out, location: str) -> None:
    start = _align(out)
    out.write(t.raw_data)
    length = len(t.raw_data)
    t.ClearField("raw_data")
    _set_external(t, location, start, length)
