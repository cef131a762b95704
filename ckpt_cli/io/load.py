"""Reading ONNX files into a :class:`Graph`, with clear errors for bad input.

Tensor bytes stored as external data are never read here: analysis needs only their
shapes, and the writer streams them from the source file when it saves.
"""

from __future__ import annotations

import os
from itertools import chain
from operator import attrgetter
from pathlib import Path
from typing import Iterator

import onnx
from google.protobuf.message import DecodeError

from ..background import Background
from ..errors import ModelError
from ..ort.expand import expand_functions
from .external import check_embedded, check_external, external_tensors
from ..graph import ABSENT, Graph, Node, embedded_bytes, gc_paused, weightless_copy
from ..ort.registry import ort_only_nodes
from ..ort import asked_in_a_child
from ..ort.validate import check_on_ort
from .serialize import read_model

_PROTOBUF_LIMIT = 2**31 - 1
# onnx.checker's time grows with the graph; past this size only ckpt's own checks run,
# to keep loading near the I/O floor.
_CHECKER_MAX_NODES = 20_000
# Embedded initializers above this size reach onnx.checker as typed graph inputs.
_CHECKER_INLINE_BYTES = 1 << 20
_DATA_TYPES = frozenset(onnx.TensorProto.DataType.values())
# Where the checker's copy moves ONNX-domain ops that ORT registers and onnx does not know:
# the checker passes nodes of a domain it has no schemas for.
_ORT_REGISTERED_DOMAIN = "ckpt.ort-registered"
# Data files each loaded model reads (resolved), so writers can refuse to overwrite them.
_data_files: dict[Path, set[Path]] = {}


def data_files_of(path: Path) -> set[Path] | None:
    """The external-data files of a model loaded in this process (None if not loaded)."""
    return _data_files.get(Path(path).resolve())


def loaded_data_files() -> set[Path]:
    """The external-data files of every model loaded in this process."""
    return set().union(*_data_files.values())


class Acceptance:
    """Whether onnx's checker and ONNX Runtime's CPU session accept a loaded file, decided
    in a forked child (``Background``) while the caller goes on; ``confirm()`` waits for
    the decision and raises the refusal (ModelError)."""

    def __init__(self, pending: Background[str | None] | None = None) -> None:
        self._pending = pending

    def confirm(self) -> None:
        pending, self._pending = self._pending, None
        refusal = pending.result() if pending is not None else None
        if refusal is not None:
            raise ModelError(refusal)


def load_graph(path: str | Path) -> Graph:
    """Load an ONNX model file (with or without external data) and index it.

    Raises :class:`ModelError` for a missing file, something that is not ONNX, a
    truncated file, a graph onnx.checker or ckpt's own checks refuse, external data
    outside the model's folder, or a graph with a cycle.
    """
    return _opened(Path(path), beside=False)[0]


def open_graph(path: str | Path) -> tuple[Graph, Acceptance]:
    """``load_graph``, with onnx's checker and ORT's load of the file left to run beside
    the caller's next work where a child process can (their refusal then comes from
    ``Acceptance.confirm``). ORT's load holds the interpreter's lock, so a thread would not
    overlap it; the child also keeps the session's memory out of this process."""
    return _opened(Path(path), beside=True)


@gc_paused
def _opened(path: Path, beside: bool) -> tuple[Graph, Acceptance]:
    if not path.exists():
        raise ModelError(f"{path}: no such file")
    if path.is_dir():
        raise ModelError(f"{path}: is a directory, expected an .onnx file")
    size = path.stat().st_size
    if size == 0:
        raise ModelError(f"{path}: empty file, not an ONNX model")
    if size > _PROTOBUF_LIMIT:
        raise ModelError(f"{path}: {size} bytes is over protobuf's 2 GiB limit; "
                         "save the weights as external data")
    try:
        model = read_model(path)
    except (DecodeError, ValueError, RuntimeError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ModelError(f"{path}: not a readable ONNX model (truncated or not protobuf: {first})") from e
    except OSError as e:
        raise ModelError(f"{path}: cannot read ({e.strerror or e})") from e
    except MemoryError as e:
        raise ModelError(f"{path}: not enough memory to read the model") from e
    if model.ir_version == 0 or not model.HasField("graph") or not model.graph.node:
        raise ModelError(f"{path}: not an ONNX model (no graph with nodes in it)")
    if not any(o.domain in ("", "ai.onnx") for o in model.opset_import):
        raise ModelError(f"{path}: no opset_import for the ONNX domain (a truncated file?)")
    external = external_tensors(model)  # one walk of every tensor proto, for both checks
    files = check_external(external, path)
    graph = Graph.from_model(model, path=path)
    check_graph(graph, path)
    order = graph.topological_order()  # raises on a cycle
    acceptance = Acceptance()
    if len(model.graph.node) <= _CHECKER_MAX_NODES:
        acceptance = _accepted(graph, path, order, external, beside)
    _data_files[path.resolve()] = files
    graph = expand_functions(graph)  # plan on the nodes ORT runs
    graph.topological_order()
    return graph, acceptance


def _accepted(graph: Graph, path: Path, order: list[int], external: list[onnx.TensorProto],
              beside: bool) -> Acceptance:
    """onnx's checker and ORT's load of ``graph``: run here (raising the refusal), or with
    ``beside`` in a forked child where one can run."""
    if not (beside and asked_in_a_child()):
        _refuse_unaccepted(graph, path, order, external)
        return Acceptance()
    parent = os.getpid()

    def refusal() -> str | None:
        # The child sees the graph as it was at the fork. The parent runs this only when no
        # child answered, after expanding the graph in place (its model is spent): it reads
        # the file again.
        g, o, ext = (graph, order, external) if os.getpid() != parent else _reread(path)
        try:
            _refuse_unaccepted(g, path, o, ext)
        except ModelError as e:
            return str(e)
        return None

    return Acceptance(Background(refusal))


def _refuse_unaccepted(graph: Graph, path: Path, order: list[int], external: list[onnx.TensorProto]) -> None:
    _run_checker(graph.model, path, order, external)
    check_on_ort(graph, path, order)


def _reread(path: Path) -> tuple[Graph, list[int], list[onnx.TensorProto]]:
    model = read_model(path)
    graph = Graph.from_model(model, path=path)
    return graph, graph.topological_order(), external_tensors(model)


def _checked_copy(model: onnx.ModelProto, order: list[int]) -> onnx.ModelProto:
    """What onnx.checker is given for a graph whose file order is not topological (ckpt
    sorts it) or whose weights are external or big (ckpt checked them): nodes sorted,
    those initializers as typed graph inputs."""
    if model.ir_version < 4:  # what the checker says of the original
        inputs = {v.name for v in model.graph.input}
        for t in model.graph.initializer:
            lifted = t.data_location == onnx.TensorProto.EXTERNAL or embedded_bytes(t) > _CHECKER_INLINE_BYTES
            if lifted and t.name not in inputs:
                raise onnx.checker.ValidationError(f"{t.name} in initializer but not in graph input")
    return weightless_copy(model, (model.graph.node[i] for i in order), inline_bytes=_CHECKER_INLINE_BYTES)


def _without_ort_ops(copy: onnx.ModelProto, ops: set[str]) -> onnx.ModelProto:
    """The checker's copy with the ORT-registered ops moved out of the ONNX domain."""
    for node in copy.graph.node:
        if node.domain in ("", "ai.onnx") and node.op_type in ops:
            node.domain = _ORT_REGISTERED_DOMAIN
    copy.opset_import.append(onnx.helper.make_opsetid(_ORT_REGISTERED_DOMAIN, 1))
    return copy


def _run_checker(model: onnx.ModelProto, path: Path, order: list[int], external: list[onnx.TensorProto]) -> None:
    in_attributes = len(external) > sum(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
    # The checker serializes what it is given: big embedded weights go to it as typed
    # inputs, their raw_data checked here, which is faster and keeps peak memory to what
    # onnx.load alone needs.
    heavy = [t for t in model.graph.initializer if embedded_bytes(t) > _CHECKER_INLINE_BYTES]
    for t in heavy:
        check_embedded(t, path)
    ort_ops = {n.op_type for n in ort_only_nodes(model)}
    try:
        if ort_ops:
            onnx.checker.check_model(_without_ort_ops(_checked_copy(model, order), ort_ops))
        elif in_attributes:  # by path: the checker then finds Constant values beside the model
            onnx.checker.check_model(str(path))
        elif external or heavy or order != list(range(len(order))):
            onnx.checker.check_model(_checked_copy(model, order))
        else:
            onnx.checker.check_model(model)
    except UnicodeDecodeError as e:
        raise ModelError(f"{path}: names in the model are not valid UTF-8 text") from e
    except onnx.checker.ValidationError as e:
        first = next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
        raise ModelError(f"{path}: not a valid ONNX model ({first[:300]})") from e


def _model_strings(graph: Graph) -> Iterator[str]:
    m, g = graph.model, graph.model.graph
    yield from (m.producer_name, m.producer_version, m.domain, m.doc_string, g.name, g.doc_string)  # copied out
    yield from (v.name for v in chain(g.input, g.output, g.value_info, g.initializer))
    yield from (x for p in graph.model.metadata_props for x in (p.key, p.value))


def _node_strings(node: Node) -> Iterator[str]:
    yield from chain((node.name, node.op_type, node.domain), node.reads, node.outputs)
    yield from (x for p in node.proto.metadata_props for x in (p.key, p.value))


def _indexed_strings(graph: Graph) -> Iterator[str]:
    """The strings of every node's ``_node_strings``, each tensor name once: the names the
    links index (every tensor a node reads or makes, ABSENT aside), then per node what
    they do not hold."""
    nodes = graph.nodes
    yield from graph.producer
    yield from graph.consumers
    yield from map(attrgetter("name"), nodes)
    yield from map(attrgetter("op_type"), nodes)
    yield from map(attrgetter("domain"), nodes)
    yield from (x for n in nodes if n.proto.metadata_props for p in n.proto.metadata_props for x in (p.key, p.value))


def _check_text(graph: Graph, path: Path) -> None:
    """Every name and metadata string ckpt reads is text: protobuf hands invalid UTF-8 over as bytes."""
    try:  # str.join refuses bytes: one C-level pass where every string is text (the usual case)
        "".join(chain(_model_strings(graph), _indexed_strings(graph)))
        return
    except TypeError:
        pass  # name what is not text
    for node in graph.nodes:
        if any(type(t) is not str for t in _node_strings(node)):
            raise ModelError(f"{path}: node {node.index} has names that are not valid UTF-8 text")
    if any(type(t) is not str for t in _model_strings(graph)):
        raise ModelError(f"{path}: names or metadata in the model are not valid UTF-8 text")


def check_graph(graph: Graph, path: Path) -> None:
    """ckpt's own checks (also for graphs too large for onnx.checker): every tensor read is
    produced, fed or stored, every output is produced, and a file holds a typed graph."""
    g = graph.model.graph
    for v in chain(g.input, g.output, g.value_info):
        if v.type.HasField("tensor_type"):
            bad = [d.dim_value for d in v.type.tensor_type.shape.dim if d.dim_value < 0]
            if bad:
                raise ModelError(f"{path}: tensor '{v.name}' has a negative dimension {bad[0]}")
            if v.type.tensor_type.elem_type not in _DATA_TYPES:
                raise ModelError(f"{path}: tensor '{v.name}' has an unknown element type "
                                 f"{v.type.tensor_type.elem_type}")
    for v in chain(g.input, g.output):
        if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type == onnx.TensorProto.UNDEFINED:
            raise ModelError(f"{path}: graph {'input' if v in g.input else 'output'} '{v.name}' has no element type")
    for t in g.initializer:
        if t.data_type not in _DATA_TYPES or t.data_type == onnx.TensorProto.UNDEFINED:
            raise ModelError(f"{path}: initializer '{t.name}' has an unknown element type {t.data_type}")
        if embedded_bytes(t) <= _CHECKER_INLINE_BYTES:  # the heavy ones: in _run_checker, once
            check_embedded(t, path)
    _check_text(graph, path)
    available = set(graph.resident) | set(graph.producer)
    for node in graph.nodes:
        for t in node.reads:
            if t != ABSENT and t not in available:
                raise ModelError(f"{path}: node '{node.name}' ({node.op_type}) reads '{t}', which no node, "
                                 "graph input or initializer provides")
    for t in graph.outputs:
        if t == ABSENT or t not in available:
            raise ModelError(f"{path}: graph output '{t}' is produced by no node")
