"""Pin the written schedule into the data flow, so that ONNX Runtime keeps it under any
execution order and optimization level (ORT_FACTS §8).

Each recompute block reads its inputs through guards that depend on the backward tensor
written just before the block (its trigger): ``Reshape(x, Mul(Size(trigger), zeros))``
is ``x`` itself (a shape entry 0 copies the input's dimension), costs no copy (Reshape is
a view) and cannot run before the trigger exists. ORT constant-folds ``Shape`` but never
``Size``, and the guarded copies read tensors their originals do not, so neither
ConstantFolding nor CSE can undo it. Weight gradients written before a block are tied
into its trigger (``Max`` of their sizes): fused weight-gradient nodes that ORT adds
with the highest indices cannot be pushed past the next block, where they would keep
their inputs alive.

Only copies none of whose inputs come from another copy of the block get a guard (on
one input): every other copy depends on those. Every copy then reads a tensor its
original does not, so CSE cannot merge them and the ``__ckpt_recompute`` attribute is
dropped: ORT's fusions copy attributes into fused nodes (Gemm + Relu into FusedGemm
gets ``activation___ckpt_recompute``), which makes the session fail to load.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from ..analysis.phases import BACKWARD
from ..analysis.shapes import TensorInfo
from ..graph import ABSENT, Graph, Node, unique_name
from ..markers import CSE_GUARD_ATTR, GUARD_META, PHASE_META, REGION_META, is_recompute_copy
from ..ops import HOST_INPUT_SLOTS, SHAPE_ONLY_OPS
from .order import executed_order
_INT64 = onnx.TensorProto.INT64


@dataclass(frozen=True)
class PinResult:
    graph: Graph
    tensors: dict[str, TensorInfo]
    guard_nodes: int  # nodes added (Constant, Size, Max, Mul, Reshape)
    guarded_inputs: int  # block inputs read through a guard
    tied_outputs: int  # weight gradients tied into a later block's trigger
    blocks: int  # recompute blocks pinned
    skipped: str | None = None  # why no guard was written, where that is not for want of copies


# The guards' ops at the ONNX opset of the graph: Max on int64 from 12 (fresh.py's Slice
# with tensor inputs from 10). Below it ORT refuses a file with guards.
GUARD_MIN_OPSET = 12


def _node(op: str, inputs: list[str], output: str, name: str, region: str) -> onnx.NodeProto:
    p = onnx.helper.make_node(op, inputs, [output], name=name)
    # Backward nodes, also for a re-analysis of the written file (which would put a guard
    # written among forward nodes into the forward, where a plan could copy it).
    for key, value in ((GUARD_META, region), (PHASE_META, BACKWARD)):
        entry = p.metadata_props.add()
        entry.key, entry.value = key, value
    return p


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
    not indexed again (reading protos back was a tenth of a 100k-node pin)."""
    return Node(n.index, n.name, n.op_type, n.domain, n.inputs if inputs is None else inputs, n.outputs, p,
                n.implicit)


def trigger_of(graph: Graph, position: int, forward: set[str] | frozenset[str],
               skip: set[int] | frozenset[int] = frozenset()) -> str | None:
    """The output of the nearest node written before ``position`` (not in ``skip``) that
    computes data at run time: ORT folds Constant and Shape, and Size runs as soon as its
    input exists. A forward tensor only if it is a graph output (the loss): under ORT's
    DEFAULT order the guard's read could keep any other one alive until the block."""
    return triggers_of(graph, [position], forward, skip)[0]


def triggers_of(graph: Graph, positions: list[int], forward: set[str] | frozenset[str],
                skip: set[int] | frozenset[int] = frozenset()) -> list[str | None]:
    """``trigger_of`` for each of ``positions``, each node looked at once at most: the
    nearest one before a position lies after the previous position, or is that one's
    (a scan per block from its start was 0.6 s of a 100k-node pin)."""
    outputs = set(graph.outputs)
    found: dict[int, str | None] = {}
    previous, answer = 0, None
    for position in sorted(set(positions)):
        for k in range(position - 1, previous - 1, -1):
            node = graph.nodes[k]
            if k in skip or node.op_type in SHAPE_ONLY_OPS or node.op_type == "Constant":
                continue
            out = next((t for t in node.outputs if t != ABSENT and (node.name not in forward or t in outputs)), None)
            if out is not None:
                answer = out
                break
        found[position] = answer
        previous = position
    return [found[p] for p in positions]


def pin(graph: Graph, tensors: dict[str, TensorInfo], forward: set[str]) -> PinResult:
    """Add guards to every recompute block of ``graph`` (nodes in the written order, copies
    tagged with ``ckpt.recompute_of``) and return the graph in its new executed order.
    ``forward`` names the forward nodes (their outputs are never tied)."""
    nodes = graph.nodes
    copies: dict[str, list[Node]] = {}  # region -> its copies in written order
    for n in nodes:
        if is_recompute_copy(n):
            copies.setdefault(n.meta(REGION_META) or n.name, []).append(n)
    tensors = dict(tensors)
    if not copies:
        return PinResult(graph, tensors, 0, 0, 0, 0)
    copy_index = {n.index for block in copies.values() for n in block}
    outputs = set(graph.outputs)
    resident = set(graph.resident)
    # Blocks by the position of their first copy; weight gradients written in between are
    # tied into the next block.
    blocks = sorted(copies.items(), key=lambda kv: kv[1][0].index)
    starts = [block[0].index for _, block in blocks]

    taken = set(graph.producer) | resident | {n.name for n in nodes}
    new_protos: dict[int, list[onnx.NodeProto]] = {}  # position -> guard nodes written before it
    # Size guards go right after the node whose output they read: PRIORITY_BASED runs them
    # there (they are ready, and Shape/Size go first), so the file is its executed order
    # without reordering it (executed_order: 1.75 -> 0.52 s under cProfile, 100k nodes).
    sizes_after: dict[int, list[onnx.NodeProto]] = {}
    rewired: dict[int, onnx.NodeProto] = {}
    zeros: dict[int, str] = {}  # rank -> a Constant of that many int64 zeros (one per graph)
    unpinned: set[int] = set()  # copies with nothing to guard: tensors of unknown rank, host inputs
    counts = {"nodes": 0, "inputs": 0, "ties": 0}

    def fresh(base: str) -> str:
        return unique_name(base, taken)

    previous = 0
    for (region, block), start, trigger in zip(blocks, starts, triggers_of(graph, starts, forward, copy_index)):
        ties = [t for k in range(previous, start) if nodes[k].name not in forward and k not in copy_index
                for t in nodes[k].outputs if t in outputs and t not in resident and t != trigger]
        previous = start
        if trigger is None:  # nothing is written before the block: it keeps its CSE marks
            unpinned.update(n.index for n in block)
            continue
        guards: list[onnx.NodeProto] = []
        sizes = []
        for t in [trigger] + ties:
            s = fresh(f"{t}_ckpt_size")
            sizes_after.setdefault(graph.producer[t], []).append(_node("Size", [t], s, s, region))
            tensors[s] = TensorInfo(_INT64, (), 8)
            sizes.append(s)
        gate = sizes[0]
        if len(sizes) > 1:
            gate = fresh(f"{region}_ckpt_gate")
            guards.append(_node("Max", sizes, gate, gate, region))
            tensors[gate] = TensorInfo(_INT64, (), 8)
        counts["ties"] += len(ties)
        produced = {t for n in block for t in n.outputs}
        by_rank: dict[int, str] = {}
        guarded: dict[str, str] = {}
        for n in block:
            host = HOST_INPUT_SLOTS.get(n.op_type, frozenset())
            device = [t for k, t in enumerate(n.inputs) if t != ABSENT and k not in host]
            if any(t in produced for t in n.inputs):
                continue  # it runs after an earlier copy of the block
            if not device:
                if any(t != ABSENT for t in n.inputs):
                    unpinned.add(n.index)  # only host inputs (ConstantOfShape): it keeps its CSE mark
                continue
            x = next((t for t in device if t in guarded), None) or device[0]
            info = tensors.get(x)
            if x not in guarded:
                if info is None or info.shape is None:
                    unpinned.add(n.index)  # rank unknown: no zeros vector fits; it keeps its CSE mark
                    continue
                rank = len(info.shape)
                if rank not in zeros:
                    zeros[rank] = fresh(f"ckpt_pin_zeros_{rank}")
                    p = _node("Constant", [], zeros[rank], zeros[rank], region)
                    p.attribute.append(onnx.helper.make_attribute(
                        "value", onnx.numpy_helper.from_array(np.zeros(rank, np.int64))))
                    guards.append(p)
                    tensors[zeros[rank]] = TensorInfo(_INT64, (rank,), 8 * rank)
                if rank not in by_rank:
                    shape = by_rank[rank] = fresh(f"{region}_ckpt_shape{rank}")
                    guards.append(_node("Mul", [gate, zeros[rank]], shape, shape, region))
                    tensors[shape] = TensorInfo(_INT64, (rank,), 8 * rank)
                out = guarded[x] = fresh(f"{x}_ckpt_pinned")
                guards.append(_node("Reshape", [x, by_rank[rank]], out, out, region))
                tensors[out] = info
            rewired[n.index] = p = _unmarked(n.proto)
            p.input[list(n.inputs).index(x)] = guarded[x]
        counts["inputs"] += len(guarded)
        counts["nodes"] += len(guards) + len(sizes)
        new_protos[start] = guards

    # Nodes whose proto is unchanged are not indexed again (a tenth of the pin at 100k nodes).
    written: list[Node] = []
    unmark = copy_index - unpinned
    for n in nodes:
        written.extend(Node.from_proto(0, p) for p in new_protos.get(n.index, ()))
        if n.index in rewired:
            p = rewired[n.index]
            written.append(_same_node(n, p, tuple(p.input)))
        else:
            written.append(_same_node(n, _unmarked(n.proto)) if n.index in unmark else n)
        written.extend(Node.from_proto(0, p) for p in sizes_after.get(n.index, ()))
    return PinResult(executed_order(graph.with_node_list(written)), tensors, counts["nodes"], counts["inputs"],
                     counts["ties"], len(new_protos))
