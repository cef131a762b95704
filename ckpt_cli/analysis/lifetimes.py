"""What one node order fixes about each tensor before any buffer is placed: when it is
last read and how many uses ONNX Runtime's allocation planner counts for it.

ORT's ``PlannerImpl::ComputeReuseCount`` (onnxruntime/core/framework/allocation_planner.cc)
gives every value one use per node input that reads it, one for its definition, and one
more for each graph input, initializer and graph output ("the caller's use"), so those
never reach zero. The planner then counts uses down as it walks the order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..fast import native
from ..graph import ABSENT, Graph


@dataclass(frozen=True)
class Lifetimes:
    """Per tensor id (``graph.ids``), for one order of ``steps`` nodes."""

    steps: int
    last_read: list[int]  # step of the last read; ``steps`` for graph outputs; -1: never read
    uses: list[int]  # ORT's use count before the first node runs
    resident: list[bool]  # graph inputs and initializers: present before the run, never freed
    is_output: list[bool]
    # the four lists above as arrays, where a compiled walk (``native``) made them
    arrays: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = field(default=None, compare=False,
                                                                               repr=False)


def life_arrays(life: Lifetimes) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``life.arrays``, made from its lists where the walk was not compiled."""
    if life.arrays is not None:
        return life.arrays
    return (np.array(life.last_read, dtype=np.int64), np.array(life.uses, dtype=np.int64),
            np.array(life.resident, dtype=np.bool_), np.array(life.is_output, dtype=np.bool_))


def lifetimes(graph: Graph, order: list[int] | tuple[int, ...]) -> Lifetimes:
    ids = graph.ids
    count = len(ids.names)
    steps = len(order)
    if native(steps):
        return _compiled(graph, order)
    node_inputs, node_outputs = ids.inputs, ids.outputs
    last_read = [-1] * count
    uses = [0] * count
    for k, i in enumerate(order):
        for t in node_inputs[i]:
            if t >= 0:
                last_read[t] = k
                uses[t] += 1
        for t in node_outputs[i]:
            if t >= 0:
                uses[t] += 1
    resident = [False] * count
    for name in graph.resident:
        resident[ids.of[name]] = True
        uses[ids.of[name]] += 1
    is_output = [False] * count
    for name in graph.outputs:
        if name != ABSENT:
            last_read[ids.of[name]] = steps
            is_output[ids.of[name]] = True
            uses[ids.of[name]] += 1
    return Lifetimes(steps, last_read, uses, resident, is_output)


def _compiled(graph: Graph, order: list[int] | tuple[int, ...]) -> Lifetimes:
    """``lifetimes``, its walk in ``native``'s kernel."""
    from ..native import reads_and_uses

    ids, steps = graph.ids, len(order)
    last_read, uses = reads_and_uses(np.asarray(order, dtype=np.int64), graph.csr, len(ids.names))
    held = np.array([ids.of[name] for name in graph.resident], dtype=np.int64)
    returned = np.array([ids.of[name] for name in graph.outputs if name != ABSENT], dtype=np.int64)
    resident, is_output = np.zeros(len(ids.names), dtype=np.bool_), np.zeros(len(ids.names), dtype=np.bool_)
    resident[held] = is_output[returned] = True
    last_read[returned] = steps
    np.add.at(uses, np.concatenate([held, returned]), 1)  # the caller's use of each
    return Lifetimes(steps, last_read.tolist(), uses.tolist(), resident.tolist(), is_output.tolist(),
                     (last_read, uses, resident, is_output))
