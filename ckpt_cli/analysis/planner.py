"""ONNX Runtime's allocation planner, replayed: which buffer each tensor lands in.

The rules of ``PlannerImpl::ComputeSingleStreamReusePlan`` and ``FindReusableInput`` /
``FindReusableTensor`` (onnxruntime/core/framework/allocation_planner.cc), walked over
the order node by node, output by output:

- a graph output gets a buffer of its own (``kAllocateOutput``);
- a view op's output aliases its first input (the kernel's ``Alias(0, 0)``); a view of a
  graph input or initializer allocates nothing;
- an op whose kernel says ``MayInplace(0, 0)`` writes into its first input's buffer when
  that buffer has one use left (this node's single read of it: the last remaining reader,
  however many read it earlier) and input and output have the same static shape and
  element size. This rule does not depend on ``enable_mem_reuse``: ORT writes in place with
  reuse off too;
- an output nobody reads gets a fresh buffer (measured on ORT 1.31);
- with ``enable_mem_reuse`` on, an output takes the most recently freed buffer of the
  same shape and element size (never a scalar's);
- otherwise a fresh buffer.
After each node, every input read and then every output's definition uses its buffer
once; a buffer whose uses reach zero goes to the free list (inputs in node order, then
outputs). At run time a buffer is released after the last node that reads any tensor in
it (``GenerateDeallocationPlan``); a buffer nobody reads is held to the end of the run.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterable, Iterator, Sequence, overload

import numpy as np

from ..fast import native
from ..graph import Graph
from ..ops import IN_PLACE_OPS, VIEW_OPS
from .lifetimes import Lifetimes, life_arrays
from .shapes import Dims, TensorInfo, itemsize, unknown_to_ort

_VIEW, _IN_PLACE = 1, 2
_OP_KINDS = {**{op: _IN_PLACE for op in IN_PLACE_OPS}, **{op: _VIEW for op in VIEW_OPS}}


@dataclass
class Buffers:
    """The planner's buffers, by id in allocation order. A buffer is allocated when the
    node at ``born`` runs and released after the node at ``dies`` (the order's length:
    held to the end of the run)."""

    size: list[int]
    born: list[int]
    dies: list[int]
    holders: Sequence[list[tuple[int, int]]]  # per buffer: (step, tensor id) in assignment order
    unsized: list[str]  # tensors of unknown size, given a buffer of 0 bytes
    # (buffer, holder position) each time a buffer was allocated or taken from the free
    # list, in order: with reuse off every take would have been an allocation of its own
    takes: Sequence[tuple[int, int]] = field(default_factory=list)


class FlatHolders(Sequence[list[tuple[int, int]]]):
    """``Buffers.holders`` as a compiled walk leaves them: buffer ``b``'s holders are the
    (step, tensor) pairs ``start[b]`` to ``start[b + 1]`` of two flat arrays, listed where
    read (a large graph's simulations read the holders of few buffers, if any)."""

    __hash__ = None  # type: ignore[assignment]

    def __init__(self, start: np.ndarray, step: np.ndarray, tensor: np.ndarray) -> None:
        self.start, self.step, self.tensor = start, step, tensor

    def __len__(self) -> int:
        return len(self.start) - 1

    @overload
    def __getitem__(self, b: int) -> list[tuple[int, int]]: ...

    @overload
    def __getitem__(self, b: slice) -> list[list[tuple[int, int]]]: ...

    def __getitem__(self, b: int | slice) -> list[tuple[int, int]] | list[list[tuple[int, int]]]:
        if isinstance(b, slice):
            return list(self)[b]
        first, stop = self.start[range(len(self))[b]:][:2].tolist()
        return list(zip(self.step[first:stop].tolist(), self.tensor[first:stop].tolist()))

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        pairs, start = list(zip(self.step.tolist(), self.tensor.tolist())), self.start.tolist()
        return (pairs[start[b]:start[b + 1]] for b in range(len(start) - 1))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)


class FlatTakes(Sequence[tuple[int, int]]):
    """``Buffers.takes`` as a compiled walk leaves them: two flat arrays."""

    __hash__ = None  # type: ignore[assignment]

    def __init__(self, buffer: np.ndarray, position: np.ndarray) -> None:
        self.buffer, self.position = buffer, position

    def __len__(self) -> int:
        return len(self.buffer)

    @overload
    def __getitem__(self, e: int) -> tuple[int, int]: ...

    @overload
    def __getitem__(self, e: slice) -> list[tuple[int, int]]: ...

    def __getitem__(self, e: int | slice) -> tuple[int, int] | list[tuple[int, int]]:
        if isinstance(e, slice):
            return list(self)[e]
        return int(self.buffer[e]), int(self.position[e])

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return zip(self.buffer.tolist(), self.position.tolist())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)


def _reuse_key(info: TensorInfo | None) -> tuple[Dims, int] | None:
    if info is None:
        return None
    shape = info.planner_shape
    # a statically sized tensor is reused by its sizes (symbols bound); a symbolic one by
    # names; one with a dimension ORT does not know ("?") never
    if not shape or "?" in shape or (info.static_shape and not all(isinstance(d, int) for d in shape)):
        return None
    return (shape, itemsize(info.dtype))


def _size_key(info: TensorInfo | None) -> tuple[Dims, int] | None:
    """What ORT's ``SameSize`` compares for an in-place write: the element size and the
    known dimensions (symbols by name). None: a tensor it matches to none."""
    if info is None:
        return None
    shape, size = info.planner_shape, itemsize(info.dtype)
    if shape is None or size <= 0 or not all(isinstance(d, int) or (d and d != "?") for d in shape):
        return None
    return shape, size


def reuse_classes(infos: list[TensorInfo | None]) -> tuple[list[int], int, list[int]]:
    """Per tensor, the class of buffers it can reuse (same shape and element size;
    -1: never reused), the number of those classes, and per tensor its class by
    ``_size_key`` (-1: an in-place write matches it to none)."""
    classes: dict[tuple[Dims, int], int] = {}  # reuse key -> class
    sizes: dict[tuple[Dims, int], int] = {}  # size key -> class
    # (shape, dtype, static, ORT's shape) -> (reuse class, size class)
    class_of: dict[tuple[Dims | None, int, bool, Dims | None] | None, tuple[int, int]] = {}
    reuse: list[int] = []
    same: list[int] = []
    for info in infos:
        kind = None if info is None else (info.shape, info.dtype, info.static_shape, info.ort_shape)
        if kind not in class_of:
            key, size = _reuse_key(info), _size_key(info)
            class_of[kind] = (-1 if key is None else classes.setdefault(key, len(classes)),
                              -1 if size is None else sizes.setdefault(size, len(sizes)))
        r, c = class_of[kind]
        reuse.append(r)
        same.append(c)
    return reuse, len(classes), same


@dataclass(frozen=True)
class TensorFacts:
    """What ORT's planner reads of a graph's tensors, by tensor id: each one's info, reuse
    class (``reuse_classes``) and bytes (-1: unknown); and per node its op's kind (view,
    in place or neither). A caller that walks the same tensors many times makes them once."""

    infos: list[TensorInfo | None]
    reuse: list[int]
    classes: int
    sizes: list[int]
    kinds: list[int]
    same: list[int]  # per tensor its class by ``_size_key`` (-1: an in-place write matches it to none)
    # ``kinds``, ``reuse``, ``sizes`` and ``same`` as arrays, made with the facts of a graph
    # whose walks are compiled
    arrays: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = field(default=None, compare=False,
                                                                               repr=False)

    def hiding(self, ids: Iterable[int]) -> TensorFacts:
        """These facts with the tensors ``ids`` made unknown to ORT's planner
        (``shapes.unknown_to_ort``): it never reuses a buffer for them, nor writes them in place."""
        infos, reuse, same = list(self.infos), list(self.reuse), list(self.same)
        for t in ids:
            info = infos[t]
            if info is not None:
                infos[t], reuse[t], same[t] = unknown_to_ort(info), -1, -1
        hidden = replace(self, infos=infos, reuse=reuse, same=same, arrays=None)
        return replace(hidden, arrays=facts_arrays(hidden)) if self.arrays is not None else hidden


def facts_arrays(facts: TensorFacts) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``facts.arrays``, made from its lists where the facts were made without them."""
    if facts.arrays is not None:
        return facts.arrays
    return (np.array(facts.kinds, dtype=np.int64), np.array(facts.reuse, dtype=np.int64),
            np.array(facts.sizes, dtype=np.int64), np.array(facts.same, dtype=np.int64))


def tensor_facts(graph: Graph, tensors: dict[str, TensorInfo]) -> TensorFacts:
    infos = [tensors.get(t) for t in graph.ids.names]
    reuse, classes, same = reuse_classes(infos)
    sizes = [info.nbytes if info is not None and info.nbytes is not None else -1 for info in infos]
    facts = TensorFacts(infos, reuse, classes, sizes, [_OP_KINDS.get(n.op_type, 0) for n in graph.nodes], same)
    return replace(facts, arrays=facts_arrays(facts)) if native(len(graph.nodes)) else facts


def plan_buffers(graph: Graph, order: list[int] | tuple[int, ...], tensors: dict[str, TensorInfo] | TensorFacts,
                 life: Lifetimes, reuse_buffers: bool = True) -> Buffers:
    """The buffers ORT's planner gives the tensors of ``order`` (the rules in the module doc);
    ``tensors`` as they are or their ``tensor_facts``."""
    facts = tensors if isinstance(tensors, TensorFacts) else tensor_facts(graph, tensors)
    if native(len(order)):
        return _compiled_walk(graph, facts, life, order, reuse_buffers)
    return _Walk(graph, facts, life).run(order, reuse_buffers)


def _compiled_walk(graph: Graph, facts: TensorFacts, life: Lifetimes, order: list[int] | tuple[int, ...],
                   reuse_buffers: bool) -> Buffers:
    """``_Walk.run`` in ``native``'s kernel."""
    from ..native import Facts, Life, planner_walk

    steps = life.steps
    (size, born, dies, held, h_buf, h_step, h_t, take_b, take_pos, unsized) = planner_walk(
        np.asarray(order, dtype=np.int64), graph.csr, Facts(*facts_arrays(facts)), Life(*life_arrays(life)),
        facts.classes, reuse_buffers)
    by_buffer = np.argsort(h_buf, kind="stable")
    start = np.zeros(len(held) + 1, dtype=np.int64)
    np.cumsum(held, out=start[1:])
    names = graph.ids.names
    return Buffers(size.tolist(), born.tolist(), np.where(dies < 0, steps, np.minimum(dies, steps)).tolist(),
                   FlatHolders(start, h_step[by_buffer], h_t[by_buffer]), [names[t] for t in unsized.tolist()],
                   FlatTakes(take_b, take_pos))


class _Walk:
    """ORT's planner walking one order (a walk runs once). Per tensor its buffer; per buffer
    the reuse class of the tensor that allocated it and the uses not yet counted down (ORT's
    UseCount of the original); per reuse class its free list."""

    def __init__(self, graph: Graph, facts: TensorFacts, life: Lifetimes) -> None:
        ids = graph.ids
        self.names, self.node_inputs, self.node_outputs = ids.names, ids.inputs, ids.outputs
        self.same, self.reuse, self.sizes, self.kinds = facts.same, facts.reuse, facts.sizes, facts.kinds
        n_classes = facts.classes
        self.life = life
        self.resident = list(life.resident)  # views of resident tensors join them
        self.buffer_of = [-1] * len(self.names)
        self.owner_class: list[int] = []
        self.left: list[int] = []
        self.free_lists: list[list[int]] = [[] for _ in range(n_classes)]

    def run(self, order: list[int] | tuple[int, ...], reuse_buffers: bool) -> Buffers:
        # One pass over the order, run for every candidate of every plan a search judges:
        # the helpers are inlined and the per-tensor facts read from flat lists (locals).
        names, node_inputs, node_outputs, kinds = self.names, self.node_inputs, self.node_outputs, self.kinds
        same, reuse, sizes, resident = self.same, self.reuse, self.sizes, self.resident
        last_read, uses, is_output = self.life.last_read, self.life.uses, self.life.is_output
        buffer_of, owner_class, left, free_lists = self.buffer_of, self.owner_class, self.left, self.free_lists
        size: list[int] = []
        born: list[int] = []
        dies: list[int] = []
        holders: list[list[tuple[int, int]]] = []
        unsized: list[str] = []
        takes: list[tuple[int, int]] = []
        for k, i in enumerate(order):
            kind = kinds[i]
            inputs, outputs = node_inputs[i], node_outputs[i]
            src = inputs[0] if inputs else -1
            for pos, t in enumerate(outputs):
                if t < 0:
                    continue
                if is_output[t]:
                    b = -1
                elif pos == 0 and kind == _VIEW and src >= 0 and (resident[src] or buffer_of[src] >= 0):
                    if resident[src]:
                        resident[t] = True
                        continue
                    b = buffer_of[src]
                elif (pos == 0 and kind == _IN_PLACE and src >= 0 and buffer_of[src] >= 0
                      and left[buffer_of[src]] == 1 and same[src] >= 0 and same[src] == same[t]):
                    b = buffer_of[src]
                elif last_read[t] < 0 or not reuse_buffers or reuse[t] < 0 or not free_lists[reuse[t]]:
                    b = -1
                else:
                    b = free_lists[reuse[t]].pop()
                    takes.append((b, len(holders[b])))
                if b < 0:  # a new buffer
                    b = len(left)
                    n = sizes[t]
                    if n < 0:
                        unsized.append(names[t])
                        n = 0
                    owner_class.append(reuse[t])
                    left.append(0)
                    size.append(n)
                    born.append(k)
                    dies.append(-1)
                    holders.append([])
                    takes.append((b, 0))
                buffer_of[t] = b
                left[b] += uses[t]
                holders[b].append((k, t))
                if last_read[t] > dies[b]:
                    dies[b] = last_read[t]
            for group in (inputs, outputs):
                for t in group:
                    if t >= 0 and not resident[t]:
                        b = buffer_of[t]
                        if b >= 0:  # (an input no node in the order makes)
                            left[b] -= 1
                            if left[b] == 0 and owner_class[b] >= 0:
                                free_lists[owner_class[b]].append(b)
        steps = self.life.steps
        return Buffers(size, born, [steps if d < 0 else min(d, steps) for d in dies], holders, unsized, takes)


def without_reuse(buffers: Buffers, life: Lifetimes) -> Buffers:
    """``plan_buffers(..., reuse_buffers=False)`` from the same order's plan with reuse on,
    without walking the graph again: views and in-place writes do not depend on reuse
    (a reused buffer's use count starts from zero like a new one's), so each take of a
    freed buffer becomes an allocation of its own, holding the holders up to the next take."""
    if isinstance(buffers.holders, FlatHolders) and isinstance(buffers.takes, FlatTakes):
        return _compiled_without_reuse(buffers, buffers.holders, buffers.takes, life)
    last_read, steps = life.last_read, life.steps
    all_holders, takes = buffers.holders, buffers.takes
    end = [0] * len(takes)  # per take: where its holders end
    nxt: list[int] = [-1] * len(buffers.size)
    for e in range(len(takes) - 1, -1, -1):
        b, pos = takes[e]
        end[e] = len(all_holders[b]) if nxt[b] < 0 else nxt[b]
        nxt[b] = pos
    size: list[int] = []
    born: list[int] = []
    dies: list[int] = []
    holders: list[list[tuple[int, int]]] = []
    for e, (b, pos) in enumerate(takes):
        own = all_holders[b]
        if pos == 0 and end[e] == len(own):  # never reused: the buffer as it is
            dies.append(buffers.dies[b])
        else:
            own = own[pos:end[e]]
            d = max(last_read[t] for _, t in own)
            dies.append(steps if d < 0 else min(d, steps))
        size.append(buffers.size[b])
        born.append(own[0][0])
        holders.append(own)
    return Buffers(size, born, dies, holders, list(buffers.unsized), [(b, 0) for b in range(len(size))])


def _compiled_without_reuse(buffers: Buffers, holders: FlatHolders, takes: FlatTakes, life: Lifetimes) -> Buffers:
    """``without_reuse`` in ``native``'s kernel, from a compiled walk's buffers."""
    from ..native import Taken, takes_apart

    walked = Taken(np.asarray(buffers.size, dtype=np.int64), np.asarray(buffers.dies, dtype=np.int64), holders.start,
                   holders.step, holders.tensor, takes.buffer, takes.position)
    size, born, dies, start, taken = takes_apart(walked, life_arrays(life)[0], life.steps)
    n = len(size)
    return Buffers(size.tolist(), born.tolist(), dies.tolist(), FlatHolders(start, holders.step[taken],
                   holders.tensor[taken]), list(buffers.unsized),
                   FlatTakes(np.arange(n, dtype=np.int64), np.zeros(n, dtype=np.int64)))
