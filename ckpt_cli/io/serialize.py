"""A model's serialization read and written a piece at a time: what ``onnx.load`` parses
and ``SerializeToString`` writes, without all of the file's bytes in memory at once.

One ``SerializeToString`` of a model with embedded weights holds two more copies of them
(protobuf builds the whole message in one buffer, then copies it into a Python bytes), and
``onnx.load`` holds the file's bytes beside the model it parses from them. Protobuf's
wire format is a sequence of fields, and parsing a concatenation
merges what its parts parse to, so the model is read and written field by field, its
graph's initializers one tensor at a time: at most one tensor's bytes are held beyond
the model itself. A large graph's nodes are written a piece at a time as well. When
writing, the graph's length prefix comes first, from each element's ``ByteSize``.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import Any, Callable, Iterator, cast

import onnx
from google.protobuf import unknown_fields
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message

from ..graph import embedded_bytes

# Below this many bytes (a file's, or a graph's embedded initializers) one parse or one
# SerializeToString is as cheap and simpler.
STREAM_MIN_BYTES = 64 << 20
# A graph of this many nodes is written a piece at a time too: at 100k nodes its
# serialization in one buffer was 20 MiB above the rest of a rewrite's peak.
STREAM_MIN_NODES = 20_000
# While reading, graph fields smaller than this are parsed together, up to _CHUNK_BYTES at a time.
_PIECE_BYTES = 1 << 20
_CHUNK_BYTES = 16 << 20
_LENGTH_DELIMITED = 2
_GRAPH_FIELD = onnx.ModelProto.DESCRIPTOR.fields_by_name["graph"].number
_INITIALIZER_FIELD = onnx.GraphProto.DESCRIPTOR.fields_by_name["initializer"].number
# A graph's fields written an element at a time: its weights, and its nodes (held whole, a
# large graph's serialization is a copy of it beside the model, the peak of a rewrite's save)
_STREAMED_FIELDS = (_INITIALIZER_FIELD, onnx.GraphProto.DESCRIPTOR.fields_by_name["node"].number)
Write = Callable[[bytes], object]  # a file's write, a hash's update


def write_model(model: onnx.ModelProto, write: Write, stream_min_bytes: int | None = None,
                stream_min_nodes: int | None = None) -> None:
    """``write(model.SerializeToString(deterministic=True))``, streamed when its
    graph embeds at least ``stream_min_bytes`` of initializers or has at least
    ``stream_min_nodes`` nodes."""
    graph = model.graph
    limit = STREAM_MIN_BYTES if stream_min_bytes is None else stream_min_bytes
    nodes = STREAM_MIN_NODES if stream_min_nodes is None else stream_min_nodes
    small = sum(map(embedded_bytes, graph.initializer)) < limit and len(graph.node) < nodes
    if small or _has_unknown_fields(model) or _has_unknown_fields(graph):
        write(model.SerializeToString(deterministic=True))  # unknown fields go last: let protobuf place them
        return
    for field, value in model.ListFields():  # in field-number order, as protobuf writes them
        if field.number == _GRAPH_FIELD:
            _write_graph(value, write)
        else:
            write(_field_bytes(model, field, value))


# A repeated field's tag, its elements and their ByteSize (ints only: a list of the
# elements would hold a Python object per node while the graph is written)
Sized = tuple[bytes, Any, list[int]]


def _write_graph(graph: onnx.GraphProto, write: Write) -> None:
    """The model's graph field: its length first, then its fields, each initializer and
    node serialized only as it is written."""
    parts: list[bytes | Sized] = []
    size = 0
    for field, value in graph.ListFields():
        if field.number in _STREAMED_FIELDS:
            tag = _tag(field.number)
            sizes = [t.ByteSize() for t in value]
            size += len(tag) * len(sizes) + sum(sizes) + _varint_bytes(sizes)
            parts.append((tag, value, sizes))
        else:
            data = _field_bytes(graph, field, value)
            size += len(data)
            parts.append(data)
    write(_tag(_GRAPH_FIELD) + _varint(size))
    for part in parts:
        if isinstance(part, bytes):
            write(part)
        else:
            _write_elements(*part, write)


def _write_elements(tag: bytes, elements: Any, sizes: list[int], write: Write) -> None:
    """A repeated field's elements, each serialized as it is written; small ones (nodes)
    gathered into pieces of about _PIECE_BYTES, a write per element being slow."""
    pending: list[bytes] = []
    held = 0
    heads: dict[int, bytes] = {}  # the tag and length prefix, by length: most nodes share a few lengths
    for t, n in zip(elements, sizes, strict=True):
        data = t.SerializeToString(deterministic=True)
        if len(data) != n:  # the prefix already written would lie about the graph's length
            raise RuntimeError(f"'{getattr(t, 'name', '')}' serialized to {len(data)} bytes, not its ByteSize {n}")
        if n >= _PIECE_BYTES:  # a tensor's bytes are written as they are, never copied into a piece
            if pending:
                write(b"".join(pending))
                pending, held = [], 0
            write(tag + _varint(n))
            write(data)
            continue
        head = heads.get(n)
        if head is None:
            head = heads[n] = tag + _varint(n)
        pending += (head, data)
        held += len(head) + n
        if held >= _PIECE_BYTES:
            write(b"".join(pending))
            pending, held = [], 0
    if pending:
        write(b"".join(pending))


def _field_bytes(message: Message, field: FieldDescriptor, value: Any) -> bytes:
    """The serialization of ``message`` with only this field set."""
    part = type(message)()
    if field.is_repeated:
        getattr(part, field.name).extend(value)
    elif field.message_type is not None:
        getattr(part, field.name).CopyFrom(value)
    else:
        setattr(part, field.name, value)
    return cast(bytes, part.SerializeToString(deterministic=True))


def _has_unknown_fields(message: Message) -> bool:
    return len(unknown_fields.UnknownFieldSet(message)) > 0


def _tag(number: int) -> bytes:
    return _varint(number << 3 | _LENGTH_DELIMITED)


def _varint_bytes(values: list[int]) -> int:
    """The bytes of the varints of ``values`` (non-negative): one per started 7 bits."""
    count, rest = 0, values
    while rest:
        count += len(rest)
        rest = [v >> 7 for v in rest if v >> 7]
    return count


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low = n & 0x7F
        n >>= 7
        if n:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def read_model(path: str | os.PathLike[str], stream_min_bytes: int | None = None,
               embedded_weights: bool = True) -> onnx.ModelProto:
    """``onnx.load(path, load_external_data=False)``, parsed a piece at a time when the file
    is protobuf of at least ``stream_min_bytes``. Raises DecodeError for a file that is
    not protobuf or is cut short, as onnx.load does. Without ``embedded_weights`` a
    streamed read leaves out the initializers of over _PIECE_BYTES embedded in the file
    (for readers of metadata or of external-data locations: an external tensor's proto
    is small)."""
    path = Path(path)
    limit = STREAM_MIN_BYTES if stream_min_bytes is None else stream_min_bytes
    if (os.path.getsize(path) < limit
            or onnx.serialization.registry.get_format_from_file_extension(path.suffix) not in (None, "protobuf")):
        return onnx.load(str(path), load_external_data=False)
    try:
        return _read_streamed(path, embedded_weights)
    except DecodeError:
        # what the scanner refuses (a cut-short file, or unknown fields of group wire type,
        # which protobuf skips): onnx.load decides, with its own error
        return onnx.load(str(path), load_external_data=False)


def _read_streamed(path: Path, embedded_weights: bool) -> onnx.ModelProto:
    model = onnx.ModelProto()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as view:
        # The map only finds field boundaries (the pages it touches are headers and small
        # fields); bytes are read with pread, so a tensor's pages never stay mapped.
        fd = f.fileno()
        for number, start, payload, end in _fields(view, 0, len(view)):
            if number == _GRAPH_FIELD and payload is not None:
                model.graph.SetInParent()
                _read_graph(model.graph, view, fd, payload, end, embedded_weights)
            else:
                model.MergeFromString(os.pread(fd, end - start, start))
    return model


def _read_graph(graph: onnx.GraphProto, view: mmap.mmap, fd: int, start: int, end: int, weights: bool) -> None:
    chunk = start  # the small fields not yet parsed begin here
    for number, begin, payload, stop in _fields(view, start, end):
        big = payload is not None and stop - payload >= _PIECE_BYTES
        if chunk < begin and (big or begin - chunk >= _CHUNK_BYTES):
            graph.MergeFromString(os.pread(fd, begin - chunk, chunk))
            chunk = begin
        if big:
            if weights or number != _INITIALIZER_FIELD:
                graph.MergeFromString(os.pread(fd, stop - begin, begin))
            chunk = stop
    if chunk < end:
        graph.MergeFromString(os.pread(fd, end - chunk, chunk))


def _fields(view: mmap.mmap, pos: int, end: int) -> Iterator[tuple[int, int, int | None, int]]:
    """(field number, start, payload start of a length-delimited field else None, end) of
    each field of the message in ``view[pos:end]``."""
    while pos < end:
        start = pos
        key, pos = _read_varint(view, pos, end)
        number, wire = key >> 3, key & 7
        payload = None
        if wire == 0:
            _, pos = _read_varint(view, pos, end)
        elif wire == 1:
            pos += 8
        elif wire == _LENGTH_DELIMITED:
            size, pos = _read_varint(view, pos, end)
            payload, pos = pos, pos + size
        elif wire == 5:
            pos += 4
        else:  # groups (3, 4) are not in ONNX's messages; 6 and 7 are no wire type
            raise DecodeError(f"wire type {wire} of field {number} at byte {start}")
        if pos > end or number == 0:
            raise DecodeError(f"field {number} at byte {start} runs past the end of its message (truncated?)")
        yield number, start, payload, pos


def _read_varint(view: mmap.mmap, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while pos < end and shift < 64:
        byte = view[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    raise DecodeError(f"varint cut short at byte {pos}")
