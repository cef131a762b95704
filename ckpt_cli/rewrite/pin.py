"""Pin the written schedule into the data flow, so that ONNX Runtime keeps it under any
execution order and optimization level: ORT's fusions make nodes with the highest indices,
which PRIORITY_BASED runs as late as it can, and a file cannot set node priority; only a
data edge survives every optimizer.

Each recompute block reads its inputs through guards that depend on the backward tensor
written just before the block (its trigger): ``Reshape(x, Mul(Size(trigger), zeros))``
is ``x`` itself (a shape entry 0 copies the input's dimension), costs no copy (Reshape is
a view) and cannot run before the trigger exists. ORT constant-folds ``Shape`` but never
``Size``, and the guarded copies read tensors their originals do not, so neither
ConstantFolding nor CSE can undo it. Weight gradients written before a block are tied
into its trigger (``Max`` of their sizes): fused weight-gradient nodes that ORT adds
with the highest indices cannot be pushed past the next block, where they would keep
their inputs alive. With ``waits``, so are the backward tensors that the block's readers
read and that are written before it: ORT's DEFAULT order (a reverse depth-first walk that
visits a node's highest-index producer first) otherwise runs the block, the newest input
of its reader, before the reader's older inputs, and the copies live while those are
computed. Only the Module choice (``verify/module_choice.py``) pins so, and keeps the
result only where training measures it no higher: on the ORT example artifact the waits
moved fresh.py's choice and a plain InferenceSession measured 13.0 MiB against 8.8
without them (the original: 10.0), before triggers had to be computed (below).

A trigger is never a backward node that reads nothing the forward computes (``_static``),
with waits or without: ORT's DEFAULT order, which a plain InferenceSession and the Module
run, reaches such a node first, so a guard on it holds nothing back (zoo unet: most
copies of its plain pin ran before the nodes they copy).

Only copies none of whose inputs come from another copy of the block get a guard (on
one input): every other copy depends on those. Every copy then reads a tensor its
original does not, so CSE cannot merge them and the ``__ckpt_recompute`` attribute is
dropped: ORT's fusions copy attributes into fused nodes (Gemm + Relu into FusedGemm
gets ``activation___ckpt_recompute``), which makes the session fail to load.

Guards stay off the edges ORT's fusions merge (``ops.ORT_FUSED_EDGES``): a copy's guard
goes on an input it reads on no such edge where it has one, and a trigger is never a
tensor that ORT fuses into its reader (its ``Size`` would be one reader too many). A fused
kernel rounds otherwise, and the rewrite would not train bit for bit as the original.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from ..analysis.shapes import TensorInfo
from ..graph import ABSENT, Graph, Node
from ..markers import BLOCK_META, CSE_GUARD_ATTR, GUARD_META, REGION_META, is_recompute_copy
from ..ops import HOST_INPUT_SLOTS, RESHAPE_FUSED_OPS, SHAPE_ONLY_OPS
from .guards import GuardNodes, fused_edge, read_by_fusion
from .order import executed_order


@dataclass(frozen=True)
class PinResult:
    graph: Graph
    tensors: dict[str, TensorInfo]
    guard_nodes: int  # nodes added (Constant, Size, Max, Mul, Reshape)
    guarded_inputs: int  # block inputs read through a guard
    tied_outputs: int  # weight gradients tied into a later block's trigger
    blocks: int  # recompute blocks pinned
    waits: int = 0  # older backward inputs of the blocks' readers waited for (``pin``'s ``waits``)
    skipped: str | None = None  # why no guard was written, where that is not for want of copies


# The guards' ops at the ONNX opset of the graph: Max on int64 from 12 (fresh.py's Slice
# with tensor inputs from 10). Below it ORT refuses a file with guards.
GUARD_MIN_OPSET = 12


def _unmarked(proto: onnx.NodeProto) -> onnx.NodeProto:
    """A copy of ``proto`` without the CSE guard attribute."""
    p = onnx.NodeProto()
    p.CopyFrom(proto)
    for k in range(len(p.attribute) - 1, -1, -1):
        if p.attribute[k].name == CSE_GUARD_ATTR:
            del p.attribute[k]
    return p


def _same_node(n: Node, p: onnx.NodeProto, inputs: tuple[str, ...] | None = None) -> Node:
    """``n`` made from ``p``, a copy of its proto with other attributes (and ``inputs``):
    not indexed again (reading protos back is slow on large graphs)."""
    return Node(n.index, n.name, n.op_type, n.domain, n.inputs if inputs is None else inputs, n.outputs, p,
                n.implicit)


def trigger_of(graph: Graph, position: int, forward: set[str] | frozenset[str],
               skip: set[int] | frozenset[int] = frozenset()) -> str | None:
    """The output of the nearest node written before ``position`` (not in ``skip``) that
    computes data at run time: ORT folds Constant and Shape, and Size runs as soon as its
    input exists. A forward tensor only if it is a graph output (the loss): under ORT's
    DEFAULT order the guard's read could keep any other one alive until the block. Never
    one ORT fuses into its reader: the guard's read would stop the fusion."""
    return triggers_of(graph, [position], forward, skip)[0]


def triggers_of(graph: Graph, positions: list[int], forward: set[str] | frozenset[str],
                skip: set[int] | frozenset[int] = frozenset(), computed: bool = False) -> list[str | None]:
    """``trigger_of`` for each of ``positions``, each node looked at once at most: the
    nearest one before a position lies after the previous position, or is that one's
    (a scan per block from its start would cross the same nodes again and again).
    ``computed``: never a node that reads nothing the forward computes (``_static``)."""
    outputs = set(graph.outputs)
    static = _static(graph, forward) if computed else [False] * len(graph.nodes)
    found: dict[int, str | None] = {}
    previous, answer = 0, None
    for position in sorted(set(positions)):
        for k in range(position - 1, previous - 1, -1):
            node = graph.nodes[k]
            if k in skip or node.op_type in SHAPE_ONLY_OPS or node.op_type == "Constant" or static[k]:
                continue
            out = next((t for t in node.outputs if t != ABSENT and (node.name not in forward or t in outputs)), None)
            if out is not None and not read_by_fusion(graph, out):
                answer = out
                break
        found[position] = answer
        previous = position
    return [found[p] for p in positions]


def _static(graph: Graph, forward: set[str] | frozenset[str]) -> list[bool]:
    """The backward nodes that read no tensor the forward computes, even through other
    nodes (graph inputs, initializers and such nodes' outputs alone): ORT's DEFAULT order
    reaches them first, so a guard on one holds nothing back (zoo unet's descended plan:
    its one block's trigger was ``Sub(2, 1)`` of the loss's ``Pow`` gradient, and its
    copies ran before the forward)."""
    preds = graph.preds
    dynamic = [False] * len(graph.nodes)
    for i in graph.topological_order():
        dynamic[i] = graph.nodes[i].name in forward or any(map(dynamic.__getitem__, preds[i]))
    return [not d for d in dynamic]


def pin(graph: Graph, tensors: dict[str, TensorInfo], forward: set[str], waits: bool = False,
        split: bool = False) -> PinResult:
    """Add guards to every recompute block of ``graph`` (nodes in the written order, copies
    tagged with ``ckpt.recompute_of``) and return the graph in its new executed order.
    ``forward`` names the forward nodes (their outputs are never tied); ``waits``: each block
    also waits for the older backward inputs of its readers (``_Pinner.read_with``); no
    trigger is a node that reads nothing the forward computes (``_static``); ``split``: each
    run of a block's copies written apart is a block of its own (``_runs``)."""
    copies: dict[str, list[Node]] = {}  # block (its region, or a second copies' label) -> its copies in written order
    for n in graph.nodes:
        if is_recompute_copy(n):
            copies.setdefault(n.meta(BLOCK_META) or n.meta(REGION_META) or n.name, []).append(n)
    tensors = dict(tensors)
    if not copies:
        return PinResult(graph, tensors, 0, 0, 0, 0)
    pinner = _Pinner(graph, tensors, forward, {n.index for block in copies.values() for n in block}, split)
    # Blocks by the position of their first copy; weight gradients written in between are
    # tied into the next block.
    blocks = sorted(_runs(copies) if split else copies.items(), key=lambda kv: kv[1][0].index)
    starts = [block[0].index for _, block in blocks]
    previous = 0
    triggers = triggers_of(graph, starts, forward, pinner.copies, computed=True)
    for (region, block), start, trigger in zip(blocks, starts, triggers):
        ties = pinner.ties(previous, start, trigger)
        pinner.block(region, block, start, trigger, ties,
                     pinner.read_with(block, start, [trigger, *ties]) if waits else [])
        previous = start
    return PinResult(executed_order(graph.with_node_list(pinner.written())), tensors, pinner.guard_nodes,
                     pinner.guarded_inputs, pinner.tied, len(pinner.before), waits=pinner.waited)


def _runs(copies: dict[str, list[Node]]) -> list[tuple[str, list[Node]]]:
    """Each block split where other nodes are written between its copies: ORT's DEFAULT
    order runs a copy as soon as its guard allows, so one guard for copies written apart
    runs the later ones with the first (zoo unet's descended plan, one region whose copies
    are written in three runs through the backward: 75.7 MiB simulated in that order, buffer
    reuse off, against 53.2 split and 34.4 as written)."""
    out: list[tuple[str, list[Node]]] = []
    for label, block in copies.items():
        runs = [[block[0]]]
        for n in block[1:]:
            if n.index == runs[-1][-1].index + 1:
                runs[-1].append(n)
            else:
                runs.append([n])
        out.extend((label if k == 0 else f"{label}.{k}", run) for k, run in enumerate(runs))
    return out


class _Pinner:
    """The guards of one graph, block by block, and the graph written with them."""

    def __init__(self, graph: Graph, tensors: dict[str, TensorInfo], forward: set[str], copies: set[int],
                 split: bool = False) -> None:
        self.graph, self.forward, self.copies, self.split = graph, forward, copies, split
        # built once: ``ties`` runs per block, and these grow with the graph
        self.outputs, self.resident = set(graph.outputs), set(graph.resident)
        self.make = GuardNodes(graph, tensors, GUARD_META)
        self.before: dict[int, list[onnx.NodeProto]] = {}  # position -> guard nodes written before it
        # Size guards go right after the node whose output they read: PRIORITY_BASED runs them
        # there (they are ready, and Shape/Size go first), so the file is its executed order
        # without reordering it.
        self.sizes_after: dict[int, list[onnx.NodeProto]] = {}
        self.rewired: dict[int, onnx.NodeProto] = {}
        self.zeros: dict[int, str] = {}  # rank -> a Constant of that many int64 zeros (one per graph)
        self.unpinned: set[int] = set()  # copies with nothing to guard: tensors of unknown rank, host inputs
        self.guard_nodes = self.guarded_inputs = self.tied = self.waited = 0

    def ties(self, previous: int, start: int, trigger: str | None) -> list[str]:
        """Weight gradients written since the last block: graph outputs of backward nodes."""
        g, outputs, resident = self.graph, self.outputs, self.resident
        return [t for k in range(previous, start) if g.nodes[k].name not in self.forward and k not in self.copies
                for t in g.nodes[k].outputs
                if t in outputs and t not in resident and t != trigger and not read_by_fusion(g, t)]

    def read_with(self, block: list[Node], start: int, tied: list[str | None]) -> list[str]:
        """The backward tensors written before the block (at ``start``) that its copies'
        other readers read: each such reader runs only once they exist, so the block waits
        for them too."""
        g, produced = self.graph, [t for n in block for t in n.outputs]
        out: list[str] = []
        for t in produced:
            for c in sorted(g.consumers.get(t, ())):
                for x in g.nodes[c].inputs:
                    p = g.producer.get(x)
                    if (p is None or p >= start or p in self.copies or g.nodes[p].name in self.forward
                            or x in tied or x in out or read_by_fusion(g, x)):
                        continue
                    out.append(x)
        return out

    def block(self, region: str, block: list[Node], start: int, trigger: str | None, ties: list[str],
              waits: list[str]) -> None:
        if trigger is None:  # nothing is written before the block: it keeps its CSE marks
            self.unpinned.update(n.index for n in block)
            return
        guards: list[onnx.NodeProto] = []
        gate, sizes = self._gate(region, [trigger] + ties + waits, guards)
        self.tied += len(ties)
        self.waited += len(waits)
        produced = {t for n in block for t in n.outputs}
        by_rank: dict[int, str] = {}
        guarded: dict[str, str] = {}
        views: set[str] = set()  # outputs of the block's unguarded view copies
        for n in block:
            if any(t in produced and t not in views for t in n.inputs):
                continue  # it runs after an earlier guarded copy of the block
            if n.op_type in RESHAPE_FUSED_OPS:
                self._leave_view(n, views)
                continue
            self._guard_input(n, region, gate, guards, by_rank, guarded)
        self.guarded_inputs += len(guarded)
        self.guard_nodes += len(guards) + sizes
        self.before[start] = guards

    def _leave_view(self, n: Node, views: set[str]) -> None:
        """A Reshape, Squeeze, Unsqueeze or Flatten copy gets no guard: its readers in the block
        get one in its place. A guard is a Reshape with a computed shape, which must not feed
        one of those (``ops.RESHAPE_FUSED_OPS``); one after them loads. Unguarded, the copy is
        a view of a tensor the block keeps alive anyway, so running it early costs nothing; it
        keeps its CSE mark."""
        self.unpinned.add(n.index)
        views.update(n.outputs)

    def _gate(self, region: str, reads: list[str], guards: list[onnx.NodeProto]) -> tuple[str, int]:
        """The scalar every guard of the block hangs on: ``Size`` of the trigger, or the
        ``Max`` of its and the tied gradients' sizes; and how many ``Size`` nodes it took."""
        sizes = []
        for t in reads:
            s = self.make.name(f"{t}_ckpt_size")
            self.sizes_after.setdefault(self.graph.producer[t], []).append(self.make.size(t, s, region))
            sizes.append(s)
        if len(sizes) == 1:
            return sizes[0], 1
        gate = self.make.int64(self.make.name(f"{region}_ckpt_gate"), ())
        guards.append(self.make.node("Max", sizes, gate, region))
        return gate, len(sizes)

    def _guard_input(self, n: Node, region: str, gate: str, guards: list[onnx.NodeProto],
                     by_rank: dict[int, str], guarded: dict[str, str]) -> None:
        """Read one device input of copy ``n`` through a view that waits for ``gate``."""
        host = HOST_INPUT_SLOTS.get(n.op_type, frozenset())
        device = [t for k, t in enumerate(n.inputs) if t != ABSENT and k not in host and not self._shape_data(t)]
        if not device:
            if any(t != ABSENT for t in n.inputs):
                self.unpinned.add(n.index)  # only host inputs (ConstantOfShape): it keeps its CSE mark
            return
        # Not on an edge ORT fuses over (the copy would round other than its original),
        # unless every input is on one.
        free = [t for t in device if not fused_edge(self.graph, t, n)] or device
        x = next((t for t in free if t in guarded), None) or free[0]
        info = self.make.tensors.get(x)
        if x not in guarded:
            if info is None or info.shape is None:
                self.unpinned.add(n.index)  # rank unknown: no zeros vector fits; it keeps its CSE mark
                return
            shape = self._zero_shape(len(info.shape), region, gate, guards, by_rank)
            guarded[x] = self.make.name(f"{x}_ckpt_pinned")
            guards.append(self.make.view(x, shape, guarded[x], region, info))
        self.rewired[n.index] = p = _unmarked(n.proto)
        p.input[list(n.inputs).index(x)] = guarded[x]

    def _shape_data(self, t: str) -> bool:
        """Whether ``t`` is an int64 tensor kept off the guards (with ``split``, where a
        copy can read a shape that another block computes): behind
        a guard ckpt's inference could no longer read its value, and the sizes that follow
        from it go unknown (zoo llama's Reshape and lstm's ConstantOfShape copies)."""
        info = self.make.tensors.get(t)
        return self.split and info is not None and info.dtype == onnx.TensorProto.INT64

    def _zero_shape(self, rank: int, region: str, gate: str, guards: list[onnx.NodeProto],
                    by_rank: dict[int, str]) -> str:
        """``Mul(gate, zeros)``: a shape of ``rank`` zeros computed from the gate (one per rank
        and block; the zeros Constant one per rank and graph)."""
        if rank not in self.zeros:
            self.zeros[rank] = self.make.name(f"ckpt_pin_zeros_{rank}")
            guards.append(self.make.constant(self.zeros[rank], [0] * rank, region))
        if rank not in by_rank:
            by_rank[rank] = self.make.int64(self.make.name(f"{region}_ckpt_shape{rank}"), (rank,))
            guards.append(self.make.node("Mul", [gate, self.zeros[rank]], by_rank[rank], region))
        return by_rank[rank]

    def written(self) -> list[Node]:
        """The graph's nodes with the guards in place. Nodes whose proto is unchanged are not
        indexed again (reading protos back is slow on large graphs)."""
        out: list[Node] = []
        unmark = self.copies - self.unpinned
        before, rewired, after = self.before, self.rewired, self.sizes_after
        for n in self.graph.nodes:
            i = n.index
            # most nodes have no guard and keep their proto: one membership test each
            if i in before:
                out.extend(Node.from_proto(0, p) for p in before[i])
            if i in rewired:
                p = rewired[i]
                out.append(_same_node(n, p, tuple(p.input)))
            else:
                out.append(_same_node(n, _unmarked(n.proto)) if i in unmark else n)
            if i in after:
                out.extend(Node.from_proto(0, p) for p in after[i])
        return out
