"""Keep ORT's buffer reuse from parking memory across the recompute gap.

With ``enable_mem_reuse`` on (ORT's default) a freed buffer goes to the next tensor of the
same shape and stays allocated from its first holder's birth to its last holder's death.
In a recomputed backward that next holder often comes much later (a recompute copy, a
gradient of the same shape), so the buffer sits idle across the gap and the saving is
lost. ORT's planner only reuses buffers of tensors whose shape it knows before the run;
a tensor made by a node that reads an input of unknown shape, with no ``value_info``
for it in the file, gets a buffer of its own, released at its last read.

So the tensors that would pick up an idle buffer at the peak are made "fresh": their
producer reads its data inputs through ``Reshape(x, z)``, an identity view whose shape
``z`` is all zeros (a 0 copies the input's dimension) computed as
``Slice(Mul(Size(input), zeros), 0, rank)``. ORT propagates shape values through Size and
Mul but not through Slice, so it cannot size the view; it never folds Size either. The
written model declares the shapes of every other tensor (``value_info``), which ORT merges
into what it infers: exactly the chosen tensors are unknown to it. No view goes on an edge
that ORT's fusions merge (``ops.ORT_FUSED_EDGES``): it would stop the fusion, and the fused
kernel rounds otherwise, so the rewrite would no longer train bit for bit as the original.
Of an op whose output shape needs all its inputs' shapes, the other inputs are viewed; an
input made by a backward Transpose is hidden behind it (the Transpose's input is viewed,
its output is hidden too); else the tensor is not made fresh. The choice is greedy on
ckpt's planner model: simulate the written order and ORT's DEFAULT order with reuse on,
take the buffers that are idle at the higher peak, mark the tensor that would take each
of them next, and repeat while the peak drops. The best set is kept only where the
settings the model records (its file order, its ``enable_mem_reuse``) predict no higher
arena peak: with reuse off, fresh tensors cost ORT's in-place writes and can only add.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import onnx

from ..analysis import schedules
from ..analysis.arena import ArenaResult, predict_in_use
from ..analysis.lifetimes import Lifetimes, lifetimes
from ..analysis.memory import MemoryProfile, profile_of
from ..analysis.planner import Buffers, plan_buffers, tensor_facts
from ..analysis.shapes import TensorInfo, unknown_to_ort
from ..analysis.timeline import bytes_in_use, peak_of
from ..graph import ABSENT, Graph, Node
from ..markers import FRESH_META
from ..ops import ALL_INPUT_SHAPES_OPS, RESHAPE_FUSED_OPS, SHAPE_FROM_INPUTS_OPS
from .guards import GuardNodes, fused_edge, read_by_fusion
from .order import executed_order
from .pin import trigger_of

_ROUNDS = 400  # greedy rounds at most; each adds the takers of the buffers idle at the peak
# Node steps the greedy may simulate in all (a round simulates every order once): rounds
# grow with the layers, and on deep graphs they would take most of a plan, so large graphs
# stop early, with the best set found by then.
_STEP_BUDGET = 250_000
# A graph where the first rounds lower the worst peak by less than this share is one the
# greedy barely bites on: it stops there and writes nothing, a gain that small not being
# worth its nodes. On graphs it helps, the first rounds already gain more than this.
_PROBE_ROUNDS, _PROBE_GAIN = 2, 0.01
# Graphs above this many nodes skip the greedy: on large transformers its probe gains too
# little to write anything, yet slows the pinned rewrite; the graphs it helps are smaller.
_GREEDY_NODES = 8_000


@dataclass(frozen=True)
class FreshResult:
    graph: Graph
    tensors: dict[str, TensorInfo]
    fresh: tuple[str, ...]  # tensors ORT now allocates on their own (no reuse, no in-place)
    guard_nodes: int  # nodes added
    # set by unshare: the written graph simulated with the recorded enable_mem_reuse, and its arena there
    profile: MemoryProfile | None = None
    arena: ArenaResult | None = None


def _eligible(graph: Graph, tensors: dict[str, TensorInfo], forward: frozenset[str]) -> list[bool]:
    """Per tensor id: a backward node's output this module can hide the shape of (guards in
    the forward would be recomputed by a second rewrite like any forward node)."""
    ids = graph.ids
    constants = set(graph.initializers) | {t for n in graph.nodes if n.op_type == "Constant" for t in n.outputs}
    outputs = set(graph.outputs)
    ok = [False] * len(ids.names)
    for i, node in enumerate(graph.nodes):
        if node.op_type not in SHAPE_FROM_INPUTS_OPS or node.domain not in ("", "ai.onnx") or node.name in forward:
            continue
        if not _viewed(graph, node, tensors, constants, forward):
            continue
        for t in ids.outputs[i]:
            if t >= 0 and ids.names[t] not in outputs:
                ok[t] = True
    return ok


def _viewed(graph: Graph, node: Node, tensors: dict[str, TensorInfo], constants: set[str],
            forward: frozenset[str]) -> list[tuple[Node, str]]:
    """The (reader, input) edges whose views hide the shapes of ``node``'s outputs from ORT,
    none if it cannot be done: each data input (of known rank) of ``node``, or, for an op
    whose output shape ORT infers only from all of them, those of them on no edge that ORT
    fuses over (a view there would stop the fusion, and the fused kernel rounds otherwise).
    An input on such an edge is hidden behind its producer instead where that is a backward
    Transpose: the view goes on the Transpose's input, and the fused pair stays."""
    if node.op_type in RESHAPE_FUSED_OPS:
        return []  # a view must not feed one (ops.RESHAPE_FUSED_OPS); after a guard it may go
    data = [x for x in node.inputs if x != ABSENT and x not in constants and _rank(tensors.get(x))]
    free = [(node, x) for x in data if not fused_edge(graph, x, node)]
    if free and node.op_type in ALL_INPUT_SHAPES_OPS:
        return free
    edges = []
    for x in data:
        edge = (node, x) if not fused_edge(graph, x, node) else _behind(graph, x, tensors, constants, forward)
        if edge is None:
            return []
        edges.append(edge)
    return edges


def _behind(graph: Graph, x: str, tensors: dict[str, TensorInfo], constants: set[str],
            forward: frozenset[str]) -> tuple[Node, str] | None:
    """The input edge of ``x``'s producer to view in place of ``x``: a backward Transpose
    (its output shape is its input's, permuted) whose input is on no fused edge."""
    p = graph.nodes[graph.producer[x]]
    if p.op_type != "Transpose" or p.domain not in ("", "ai.onnx") or p.name in forward or x in graph.outputs:
        return None
    y = p.inputs[0]
    if y in constants or not _rank(tensors.get(y)) or fused_edge(graph, y, p):
        return None
    return p, y


def _rank(info: TensorInfo | None) -> int:
    return len(info.shape) if info is not None and info.shape is not None else 0


def candidates(graph: Graph, tensors: dict[str, TensorInfo], orders: list[list[int]],
               forward: frozenset[str] = frozenset(), first: tuple[Lifetimes, Buffers] | None = None
               ) -> list[set[str]]:
    """Sets of tensors to make fresh, best first: the rounds of a greedy on the highest peak
    over ``orders`` with reuse on that end below the peak with none; none at all when its
    first _PROBE_ROUNDS rounds lower that peak by under _PROBE_GAIN. ``first``: the first
    order's lifetimes and buffers with reuse on, when the caller has them."""
    names = graph.ids.names
    hidden = tensor_facts(graph, tensors)  # each round hides a few more of them
    eligible = _eligible(graph, tensors, forward)
    lives = [first[0] if first is not None and k == 0 else lifetimes(graph, o) for k, o in enumerate(orders)]
    fresh: set[int] = set()
    rounds: list[tuple[int, set[int]]] = []
    rounds_allowed = max(2, min(_ROUNDS, _STEP_BUDGET // max(1, sum(len(o) for o in orders))))
    for _ in range(rounds_allowed):
        worst: tuple[int, int, Buffers, Lifetimes] | None = None
        for order, life in zip(orders, lives):
            if first is not None and not fresh and order is orders[0]:
                buffers = first[1]
            else:
                buffers = plan_buffers(graph, order, hidden, life, True)
            peak, step = peak_of(bytes_in_use(buffers, len(order), 0), 0)
            if worst is None or peak > worst[0]:
                worst = (peak, step, buffers, life)
        assert worst is not None, "candidates of no order"
        peak, step, buffers, life = worst
        rounds.append((peak, set(fresh)))
        if len(rounds) == _PROBE_ROUNDS + 1 and peak > (1 - _PROBE_GAIN) * rounds[0][0]:
            return []
        takers = set()
        for b, (born, dies) in enumerate(zip(buffers.born, buffers.dies)):
            if not born <= step <= dies:
                continue
            holders = buffers.holders[b]
            if any(k <= step and (life.last_read[t] < 0 or step <= life.last_read[t]) for k, t in holders):
                continue  # in use at the peak, not idle
            after = [t for k, t in holders if k > step]
            if after and eligible[after[0]]:
                takers.add(after[0])
        if not takers - fresh:
            break
        hidden = hidden.hiding(takers - fresh)
        fresh |= takers
    better = sorted((r for r in rounds if r[0] < rounds[0][0]), key=lambda r: (r[0], len(r[1])))
    return [{names[t] for t in chosen} for _, chosen in better]


def _recorded_peak(graph: Graph, tensors: dict[str, TensorInfo], reuse: bool
                   ) -> tuple[ArenaResult, MemoryProfile, tuple[Lifetimes, Buffers]]:
    """The arena ckpt predicts for the file order with ``enable_mem_reuse = reuse``, its
    simulation, and the lifetimes and buffers that gave it."""
    order = list(range(len(graph.nodes)))
    life = lifetimes(graph, order)
    buffers = plan_buffers(graph, order, tensors, life, reuse)
    profile = profile_of(graph, order, tensors, buffers)
    return predict_in_use(graph, profile, tensors), profile, (life, buffers)


def apply(graph: Graph, tensors: dict[str, TensorInfo], fresh: set[str], local: bool = False,
          forward: frozenset[str] = frozenset()) -> FreshResult:
    """Write the guards that hide the shapes of ``fresh`` from ORT, and mark those tensors
    (and the guard views) as shapes ORT does not know.

    The zero shapes come from ``Size`` of an initializer, one per rank, written first (fewest
    nodes, no new dependency). ``local`` writes them before each fresh tensor's node instead,
    from the size of the tensor written just before (pin's trigger, else the node's newest
    input): their few bytes then live a few steps, where shared ones are held across the run
    and can split the arena where a large buffer would have gone (with reuse off)."""
    tensors = dict(tensors)
    if not fresh:
        return FreshResult(graph, tensors, (), 0)
    constants = set(graph.initializers) | {t for n in graph.nodes if n.op_type == "Constant" for t in n.outputs}
    make = GuardNodes(graph, tensors, FRESH_META)
    fresh_name = make.name

    def zero_shape(source: str, rank: int, chain: list[onnx.NodeProto]) -> str:
        """A shape of ``rank`` zeros ORT cannot know, from ``Size(source)``."""
        z, size, m, s, e, out = (fresh_name(f"ckpt_fresh_{k}{rank}") for k in ("zeros", "size", "mul", "start",
                                                                                "end", "shape"))
        chain.extend([make.size(source, size, "1"), make.constant(z, [0] * rank, "1"),
                      make.node("Mul", [size, z], make.int64(m, (rank,)), "1"),
                      make.constant(s, [0], "1"), make.constant(e, [rank], "1"),
                      make.node("Slice", [m, s, e], make.int64(out, (rank,)), "1")])  # its value is unknown to ORT
        return out

    initializer = next(t for t in graph.resident if _rank(tensors.get(t)) and tensors[t].nbytes)
    head: list[onnx.NodeProto] = []
    shared: dict[int, str] = {}
    position = {t: k for k, n in enumerate(graph.nodes) for t in n.outputs}
    views: dict[str, str] = {}
    before: dict[int, list[onnx.NodeProto]] = {}
    rewired: dict[int, onnx.NodeProto] = {}
    reads: dict[int, list[str]] = {}  # reader -> its inputs to read through a view
    for node in graph.nodes:
        if not fresh.intersection(node.outputs):
            continue
        hidden = [t for t in node.outputs if t in fresh]
        for reader, x in _viewed(graph, node, tensors, constants, forward):
            reads.setdefault(reader.index, []).append(x)
            if reader is not node:  # a Transpose in front: its output is hidden too
                hidden.extend(t for t in reader.outputs if t in tensors)
        tensors.update({t: unknown_to_ort(tensors[t]) for t in hidden})
    for index in sorted(reads):
        node = graph.nodes[index]
        p = rewired[index] = onnx.NodeProto()
        p.CopyFrom(node.proto)
        data = reads[index]
        source = (trigger_of(graph, index, forward)
                  or max((x for x in data if not read_by_fusion(graph, x)),
                         key=lambda x: position.get(x, -1), default=initializer)) if local else initializer
        shapes = {} if local else shared
        chain = before.setdefault(index, [])
        for j, x in enumerate(node.inputs):
            if x not in data:
                continue
            if x not in views:
                rank = _rank(tensors[x])
                if rank not in shapes:
                    shapes[rank] = zero_shape(source, rank, chain) if local else zero_shape(initializer, rank, head)
                views[x] = fresh_name(f"{x}_ckpt_fresh")
                chain.append(make.view(x, shapes[rank], views[x], "1", unknown_to_ort(tensors[x])))
            p.input[j] = views[x]
    protos = list(head)
    for node in graph.nodes:
        protos.extend(before.get(node.index, ()))
        protos.append(rewired.get(node.index, node.proto))
    new = executed_order(graph.with_nodes(protos))
    return FreshResult(new, tensors, tuple(sorted(fresh)), len(protos) - len(graph.nodes))


def unshare(graph: Graph, tensors: dict[str, TensorInfo], recorded_reuse: bool = True,
            forward: frozenset[str] = frozenset()) -> FreshResult:
    """Choose the fresh tensors for the written order and ORT's DEFAULT order, and write
    them: the greedy's best set, in the first construction whose written graph ckpt predicts
    no higher a peak than without it under the settings the model records (its file order,
    its ``enable_mem_reuse``: what the rewrite was chosen for); none if neither does."""
    unfresh, profile, planned = _recorded_peak(graph, tensors, recorded_reuse)
    limit = unfresh.peak_in_use_bytes
    if len(graph.nodes) > _GREEDY_NODES:
        return replace(apply(graph, tensors, set()), profile=profile, arena=unfresh)
    orders = [list(range(len(graph.nodes))), schedules.ort_default(graph)]
    sets = candidates(graph, tensors, orders, forward, planned if recorded_reuse else None)
    # Whether a set fits the recorded settings turns on the construction, not on the set,
    # so the best set alone is tried, under both: trying every set would multiply a
    # rewrite's time for nothing.
    for local in (False, True):
        if not sets:
            break
        result = apply(graph, tensors, sets[0], local, forward)
        arena, written, _ = _recorded_peak(result.graph, result.tensors, recorded_reuse)
        if arena.peak_in_use_bytes <= limit:
            return replace(result, profile=written, arena=arena)
    return replace(apply(graph, tensors, set()), profile=profile, arena=unfresh)


def unshared(graph: Graph, tensors: dict[str, TensorInfo], recorded_reuse: bool = True,
             forward: frozenset[str] = frozenset()) -> FreshResult | None:
    """``unshare``, for a caller that may do without it where it is slow: None for a graph
    above ``_GREEDY_NODES`` nodes, which stays as it is, without the simulation and arena
    replay of the whole graph that ``unshare`` runs for its profile (two of each per large
    rewrite)."""
    if len(graph.nodes) > _GREEDY_NODES:
        return None
    return unshare(graph, tensors, recorded_reuse, forward)
