"""Second copies: a recomputed tensor made again right before its late backward readers.

A region's copies form one block placed before the first backward reader of any of them,
so a copy whose backward readers lie far apart lives from the block to its last reader
(in a chain of convolutions, the first one's output is read by its GeluGrad at the very
end, yet copied before the last GeluGrad, because the next conv's copy reads it). A tensor
in its region's ``twice`` (``planning/plan.py``) gets a second copy right before its late
readers, which read that one instead: the first copy dies after the early readers.

The readers are split at the widest gap between the uses of the first copy, in the
input's backward order: the block (where the region's other copies read it) and its
backward readers; those after the gap are late. The second copy is made from what the
region keeps, or from first copies that are alive at the late readers anyway (read there
or later). Its nodes carry a block label of their own (``BLOCK_META``, and as the value of
the CSE guard attribute): pin guards them as a block of their own, so they run in the
backward under any order, and ORT's CSE merges them with neither their originals nor the
first copies.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from ..analysis import Analysis
from ..analysis.shapes import TensorInfo
from ..graph import ABSENT, Graph, unique_name
from ..markers import BLOCK_META, CSE_GUARD_ATTR, SUFFIX
from ..planning.plan import Plan
from .recompute import Recompute, copy_node, data_readers


@dataclass(frozen=True)
class LateBlock:
    """The second copies of one region placed before one backward position."""

    region: int
    label: str  # the copies' BLOCK_META and CSE guard value
    position: int  # in the input's backward order: the first late reader's
    copies: list[onnx.NodeProto]  # in the input's order
    sources: list[int]  # per copy, the index of the node it copies
    tensors: list[str]  # the original tensors the late readers read from this block


@dataclass(frozen=True)
class Twice:
    """Every region's second copies and the backward readers moved onto them."""

    blocks: list[LateBlock]
    rewired: dict[int, dict[str, str]]  # backward node index -> {original tensor: its second copy}
    tensors: dict[str, TensorInfo]  # the second copies' outputs

    def __bool__(self) -> bool:
        return bool(self.blocks)


NONE = Twice([], {}, {})


def backward_positions(a: Analysis) -> dict[int, int]:
    """Backward node index -> its position in the input's backward order (``apply.py``'s)."""
    backward = [i for i in a.priority.order if not a.phases.is_forward[i]]
    return {i: k for k, i in enumerate(backward)}


def late_readers(a: Analysis, rec: Recompute, r: int, tensor: str, position: dict[int, int]) -> list[int]:
    """The backward readers of ``tensor`` (recomputed by region ``r``) after the widest gap
    between the uses of its first copy; none where every use is at the block."""
    readers = {c: position[c] for c in data_readers(a, tensor) if c in position}
    start = _block_start(a, rec, r, position)
    uses = sorted({start, *readers.values()})
    if len(uses) < 2:
        return []
    k = max(range(len(uses) - 1), key=lambda j: (uses[j + 1] - uses[j], -j))
    return sorted((c for c, p in readers.items() if p >= uses[k + 1]), key=position.__getitem__)


def _block_start(a: Analysis, rec: Recompute, r: int, position: dict[int, int]) -> int:
    """Where the region's first block goes: before the first backward reader of its copies."""
    return min((position[c] for t in rec.regions[r].recomputed for c in data_readers(a, t) if c in position),
               default=0)


def second_copies(a: Analysis, plan: Plan, rec: Recompute) -> Twice:
    """The second copies ``plan``'s regions ask for (``Region.twice``) of tensors they
    recompute, one block per region and first late reader."""
    if not any(region.twice for region in plan.regions):
        return NONE
    position = backward_positions(a)
    moved: dict[int, dict[str, str]] = {}  # reader -> {tensor: ""}: names are given below
    groups: dict[tuple[int, int], list[str]] = {}  # (region, first late position) -> tensors
    for r, region in enumerate(plan.regions):
        for t in sorted(region.twice & set(rec.regions[r].recomputed)):
            late = late_readers(a, rec, r, t, position)
            if late:
                groups.setdefault((r, position[late[0]]), []).append(t)
                for c in late:
                    moved.setdefault(c, {})[t] = ""
    maker = _Maker(a, rec, moved, position)
    blocks = [maker.block(r, p, tensors) for (r, p), tensors in sorted(groups.items())]
    return Twice(blocks, moved, maker.info)


class _Maker:
    """Builds the late blocks of one rewrite, with names no other node or tensor has."""

    def __init__(self, a: Analysis, rec: Recompute, moved: dict[int, dict[str, str]],
                 position: dict[int, int]) -> None:
        g = a.graph
        self.a, self.g, self.rec, self.moved, self.position = a, g, rec, moved, position
        self.taken_nodes = {n.name for n in g.nodes} | {p.name for p in rec.copies.values()}
        # the first copies' outputs too: one without a size has no entry in ``rec.tensors``
        self.taken_tensors = set(g.producer) | set(g.resident) | {t for p in rec.copies.values() for t in p.output}
        self.first = _first_names(g, rec)
        self.info: dict[str, TensorInfo] = {}
        self.count: dict[int, int] = {}

    def block(self, r: int, at: int, tensors: list[str]) -> LateBlock:
        g, rec = self.g, self.rec
        members = set(rec.blocks[r])
        alive = self._alive_at(r, at)
        nodes = _closure(g, tensors, members, alive)
        self.count[r] = self.count.get(r, 0) + 1
        region = rec.regions[r].name
        label = f"{region}#late{self.count[r]}"
        guard = onnx.helper.make_attribute(CSE_GUARD_ATTR, label)
        local: dict[str, str] = {t: self.first[t] for t in alive}
        made: set[str] = set()
        copies = []
        for i in [j for j in rec.blocks[r] if j in nodes]:  # the first block's order: the input's
            node = g.nodes[i]
            for t in node.outputs:
                if t != ABSENT:
                    local[t] = unique_name(t + SUFFIX, self.taken_tensors)
                    made.add(local[t])
                    if t in rec.tensors:
                        self.info[local[t]] = rec.tensors[t]
            p = copy_node(node, local, unique_name(node.name + SUFFIX, self.taken_nodes), region, guard)
            if not any(x in made for x in p.input) and not any(x.name == CSE_GUARD_ATTR for x in p.attribute):
                # it reads first copies only: as alike to theirs as they are to the originals
                p.attribute.append(guard)
            entry = p.metadata_props.add()
            entry.key, entry.value = BLOCK_META, label
            copies.append(p)
        for names in self.moved.values():
            for t in names.keys() & set(tensors):
                names[t] = local[t]
        return LateBlock(r, label, at, copies, [i for i in rec.blocks[r] if i in nodes], list(tensors))

    def _alive_at(self, r: int, at: int) -> set[str]:
        """The region's recomputed tensors whose first copy a backward node reads at ``at``
        or later: a second copy may read them without keeping them longer."""
        out = set()
        for t in self.rec.regions[r].recomputed:
            if any(self.position.get(c, -1) >= at and t not in self.moved.get(c, {})
                   for c in data_readers(self.a, t)):
                out.add(t)
        return out


def _first_names(g: Graph, rec: Recompute) -> dict[str, str]:
    """Original tensor -> the name of its first copy, for every output of a first copy."""
    return {t: c for i, p in rec.copies.items() for t, c in zip(g.nodes[i].outputs, p.output) if t != ABSENT}


def _closure(g: Graph, tensors: list[str], members: set[int], alive: set[str]) -> set[int]:
    """The first block's nodes that make ``tensors`` again from what is kept or ``alive``."""
    out: set[int] = set()
    stack = [g.producer[t] for t in tensors]
    while stack:
        i = stack.pop()
        if i in out:
            continue
        out.add(i)
        stack.extend(g.producer[x] for x in g.nodes[i].inputs
                     if x not in alive and g.producer.get(x) in members)
    return out
