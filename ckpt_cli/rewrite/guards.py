"""The guard nodes pin and fresh write: small int64 chains that end in a ``Reshape`` view of
a tensor by a shape of zeros (a zero entry copies the input's dimension, so the view is
the tensor itself, with no copy). What makes the shape a guard is where it comes from:
pin computes it from ``Size`` of a tensor written just before a recompute block (the block
cannot run before it), fresh passes it through a ``Slice`` so that ORT cannot know its
value (nor the view's shape).

Every guard node is a backward node (also when a re-analysis of the written file reads
it), carries its writer's mark, gets a name no tensor or node of the graph has, and has
its output's size recorded.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from ..analysis.phases import BACKWARD
from ..analysis.shapes import TensorInfo
from ..graph import Graph, unique_name
from ..markers import PHASE_META

INT64 = onnx.TensorProto.INT64


class GuardNodes:
    """Makes guard nodes for one graph; records their outputs in ``tensors`` (changed in place)."""

    def __init__(self, graph: Graph, tensors: dict[str, TensorInfo], mark_key: str) -> None:
        self.taken = set(graph.producer) | set(graph.resident) | {n.name for n in graph.nodes}
        self.tensors = tensors
        self.mark_key = mark_key

    def name(self, base: str) -> str:
        return unique_name(base, self.taken)

    def node(self, op: str, inputs: list[str], output: str, mark: str, **attrs) -> onnx.NodeProto:
        """A node named as its one output, marked and a backward node."""
        p = onnx.helper.make_node(op, inputs, [output], name=output, **attrs)
        for key, value in ((self.mark_key, mark), (PHASE_META, BACKWARD)):
            entry = p.metadata_props.add()
            entry.key, entry.value = key, value
        return p

    def int64(self, output: str, shape: tuple[int, ...]) -> str:
        self.tensors[output] = TensorInfo(INT64, shape, 8 * math.prod(shape))
        return output

    def size(self, source: str, output: str, mark: str) -> onnx.NodeProto:
        """``Size(source)``: a scalar that exists only once ``source`` does."""
        self.int64(output, ())
        return self.node("Size", [source], output, mark)

    def constant(self, output: str, values: list[int], mark: str) -> onnx.NodeProto:
        self.int64(output, (len(values),))
        return self.node("Constant", [], output, mark, value=onnx.numpy_helper.from_array(np.array(values, np.int64)))

    def view(self, x: str, shape: str, output: str, mark: str, info: TensorInfo) -> onnx.NodeProto:
        """``Reshape(x, shape)`` with ``shape`` all zeros: ``x`` itself, read through a guard."""
        self.tensors[output] = info
        return self.node("Reshape", [x, shape], output, mark)
