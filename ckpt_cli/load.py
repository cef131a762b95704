"""Reading ONNX files into a :class:`Graph`, with clear errors for bad input.

Tensor bytes stored as external data are never read here: analysis needs only their
shapes, and the writer streams them from the source file when it saves.
"""

from __future__ import annotations

from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from .errors import ModelError
from .expand import expand_functions
from .graph import Graph, gc_paused

_PROTOBUF_LIMIT = 2**31 - 1


@gc_paused
def load_graph(path: str | Path) -> Graph:
    """Load an ONNX model file (with or without external data) and index it.

    Raises :class:`ModelError` for a missing file, something that is not ONNX, a
    truncated file, or a graph with a cycle.
    """
    path = Path(path)
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
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ModelError(f"{path}: not a readable ONNX model (truncated or not protobuf: {first})") from None
    except OSError as e:
        raise ModelError(f"{path}: cannot read ({e.strerror or e})") from None
    if model.ir_version == 0 or not model.HasField("graph") or not model.graph.node:
        raise ModelError(f"{path}: not an ONNX model (no graph with nodes in it)")
    _check_external_files(model, path)
    graph = expand_functions(Graph.from_model(model, path=path))  # plan on the nodes ORT runs
    graph.topological_order()  # raises on a cycle
    return graph


def _check_external_files(model: onnx.ModelProto, path: Path) -> None:
    for t in model.graph.initializer:
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        location = next((e.value for e in t.external_data if e.key == "location"), None)
        if location is None or not (path.parent / location).exists():
            raise ModelError(f"{path}: initializer '{t.name}' keeps its data in "
                             f"'{location}', which is missing beside the model")
