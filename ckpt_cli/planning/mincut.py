"""Tensor-level planning: which forward tensors the backward reads are kept and which
are recomputed, solved exactly as a minimum cut.

Each forward node ``p`` is either copied into the backward (``y_p``) or not; each
forward tensor ``u`` is either needed by the backward (``z_u``) or not. A tensor a
backward node reads is needed; a copied node needs its inputs (the closure); a needed
tensor whose producer is not copied is kept. Random ops, ops with subgraphs and
non-ONNX-domain ops are never copied. Minimise

    sum of recompute cost over copied nodes + price * sum of bytes over kept tensors

where a node's recompute cost is its FLOPs plus the bytes it moves (pointwise ops are
cheap, not free). That is a closure (project-selection) problem, a minimum s-t cut:

    source -> y_p   capacity cost(p)           cut when p is copied
    y_p    -> z_u   capacity price * bytes(u)  cut when u is needed and p not copied
    z_u    -> y_q   infinite, u an input of q  a copied node's inputs are needed
    z_u    -> sink  infinite, u read backward  what the backward reads is needed

Sweeping the price traces the lower convex hull of (kept bytes, recompute cost) in a
few max-flow calls (``maxflow``: Dinic's algorithm, integer capacities). Views
alias their input, so a view is never kept by itself: it is copied (for free) and its
input is kept or recomputed. A transpose of a parameter costs only the bytes it
moves, so recomputing it rather than keeping it falls out of the cut by itself.

A solution becomes a plan of regions (connected parts of the copied nodes, no keep
sets needed: every input of a region is kept), so plan files, explanations and
``--plan`` work as for every other strategy; the real cost model then judges it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from ..analysis import Analysis
from ..analysis.scopes import layer_of
from ..graph import ABSENT
from ..ops import SHAPE_ONLY_OPS, VIEW_OPS, is_recomputable
from .decision import cut_decisions
from .maxflow import Network
from .plan import Plan, Policy, Region
from ..units import human_bytes

# A byte moved by a recompute costs as much as this many FLOPs (a CPU core does a few
# FLOPs per byte of memory bandwidth; pointwise ops are bandwidth-bound).
BYTE_COST = 1
# Reading only a tensor's shape moves none of its bytes.
SHAPE_OP_COST = 1
# Finite capacities are scaled to sum below this, far under INFINITE: no finite cut reaches
# an infinite edge's capacity (``maxflow`` merges what infinite edges tie to the sink).
FINITE_TOTAL = 1 << 29
INFINITE = (1 << 31) - 1
# Price sweeps stop after this many max-flow solves (each is cheap next to a rewrite).
MAX_SOLVES = 40


@dataclass
class Problem:
    """The cut problem of one graph, built once and solved at many prices."""

    nodes: list[int]  # forward nodes that may be copied (graph indices)
    cost: np.ndarray  # recompute cost per entry of ``nodes``
    tensors: list[str]  # forward tensors (z nodes)
    nbytes: np.ndarray  # bytes kept per tensor when it is needed and not recomputed
    must_recompute: np.ndarray  # bool per tensor: never kept (views, policy)
    producer: np.ndarray  # per tensor: position in ``nodes``, -1 when its producer cannot be copied
    heads: np.ndarray  # closure edges: tensor -> node position (tensor position, node position)
    tails: np.ndarray
    read_backward: np.ndarray  # tensor positions the backward reads
    buffer: list[str]  # per tensor: the buffer it holds (its own, or a view's root)
    matmul_flops: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    flops: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    # Per copyable node: the tensor positions it reads and those it makes.
    node_tensors: tuple[list[list[int]], list[list[int]]] = field(init=False, repr=False)
    # The flow network of the cut: only its capacities change with the price.
    network: Network = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.node_tensors = _node_tensors(self)
        self.network = _network(self)


def _node_tensors(p: Problem) -> tuple[list[list[int]], list[list[int]]]:
    inputs: list[list[int]] = [[] for _ in p.nodes]
    for h, k in zip(p.heads.tolist(), p.tails.tolist()):
        inputs[k].append(h)
    outputs: list[list[int]] = [[] for _ in p.nodes]
    for u, k in enumerate(p.producer.tolist()):
        if k >= 0:
            outputs[k].append(u)
    return inputs, outputs


def build(a: Analysis, policy: Policy = Policy()) -> Problem:
    g = a.graph
    fwd = [i for i in a.priority.order if a.phases.is_forward[i]]
    resident = set(g.resident)
    outputs = set(g.outputs)
    nodes: list[int] = []
    position: dict[int, int] = {}
    for i in fwd:
        n = g.nodes[i]
        if is_recomputable(n) and n.op_type not in policy.keep_ops:
            position[i] = len(nodes)
            nodes.append(i)
    cost = np.zeros(len(nodes), dtype=np.int64)
    flops = np.zeros(len(nodes), dtype=np.int64)
    matmul = np.zeros(len(nodes), dtype=np.int64)
    for k, i in enumerate(nodes):
        n, c = g.nodes[i], a.costs[i]
        flops[k] = c.flops
        matmul[k] = c.matmul_flops
        if n.op_type in VIEW_OPS:
            cost[k] = 0
        elif n.op_type in SHAPE_ONLY_OPS:
            cost[k] = SHAPE_OP_COST
        else:
            cost[k] = c.flops + BYTE_COST * (c.bytes_read + c.bytes_written)

    tensors: list[str] = []
    index: dict[str, int] = {}
    nbytes, must, prod, buffers = [], [], [], []
    for i in fwd:
        n = g.nodes[i]
        for t in n.outputs:
            if t == ABSENT or t in index:
                continue
            root = a.roots.get(t, t)
            info = a.tensors.get(root)
            size = (info.nbytes or 0) if info is not None else 0
            if root in resident or t in outputs or root in outputs:
                size = 0  # held anyway
            index[t] = len(tensors)
            tensors.append(t)
            buffers.append(root)
            nbytes.append(size)
            p = position.get(i, -1)
            prod.append(p)
            # A view holds its input's buffer: copy it (free) rather than keep it, unless it cannot be copied.
            must.append(p >= 0 and (n.op_type in VIEW_OPS or n.op_type in policy.recompute_ops))
    heads, tails = [], []
    for k, i in enumerate(nodes):
        for t in set(g.nodes[i].inputs):
            if t in index:
                heads.append(index[t])
                tails.append(k)
    read = sorted({index[t] for t in index for c in g.consumers.get(t, ())
                   if not a.phases.is_forward[c] and g.nodes[c].op_type not in SHAPE_ONLY_OPS})
    return Problem(nodes, cost, tensors, np.asarray(nbytes, dtype=np.int64), np.asarray(must, dtype=bool),
                   np.asarray(prod, dtype=np.int64), np.asarray(heads, dtype=np.int64),
                   np.asarray(tails, dtype=np.int64), np.asarray(read, dtype=np.int64), buffers, matmul, flops)


@dataclass(frozen=True)
class Cut:
    """One solution: the nodes copied and the tensors kept, with what they cost."""

    price: float
    copied: frozenset[int]  # graph node indices
    kept: frozenset[str]  # tensors
    kept_bytes: int  # distinct buffers
    cost: int  # recompute cost (FLOPs + bytes moved)
    flops: int
    matmul_flops: int


def solve(problem: Problem, price: float) -> Cut:
    """The minimum cut at ``price`` (recompute cost per kept byte); among optimal cuts,
    the one that recomputes the most: the smallest source side, what the source reaches
    in the residual graph of a maximum flow. That side is the same for every maximum
    flow, so the cut does not depend on the max-flow algorithm."""
    p = problem
    keep_cost = p.nbytes.astype(np.float64) * price
    finite = float(p.cost.sum()) + float(keep_cost[~p.must_recompute].sum())
    unit = max(1.0, finite / FINITE_TOTAL)
    rec = np.ceil(p.cost / unit).astype(np.int64)
    keep = np.where(p.must_recompute, INFINITE, np.ceil(keep_cost / unit)).astype(np.int64)
    caps = np.concatenate([rec, keep, np.full(len(p.heads) + len(p.read_backward), INFINITE)])
    reached = p.network.source_side(caps)
    return _cut(p, price, ~reached[2:2 + len(p.nodes)])


def _network(p: Problem) -> Network:
    """The cut problem's flow network; only the capacities change with the price:

        source (0) -> y_p        recompute cost of node p
        y_p or 0   -> z_u        price * bytes of tensor u (infinite: never kept)
        z_u        -> y_q        infinite, u an input of q
        z_u        -> sink (1)   infinite, u read backward

    with y_p = 2 + p and z_u = 2 + len(nodes) + u. The arcs are in the order of
    ``solve``'s capacities."""
    n_nodes, n_tensors = len(p.nodes), len(p.tensors)
    source, sink = 0, 1
    y0, z0 = 2, 2 + n_nodes
    # A tensor whose producer cannot be copied is on the source side of its "keep" edge.
    keep_tail = np.where(p.producer >= 0, y0 + p.producer, source)
    tails = np.concatenate([np.full(n_nodes, source), keep_tail, z0 + p.heads, z0 + p.read_backward])
    heads = np.concatenate([y0 + np.arange(n_nodes), z0 + np.arange(n_tensors), y0 + p.tails,
                            np.full(len(p.read_backward), sink)])
    infinite = np.concatenate([np.zeros(n_nodes, dtype=bool), p.must_recompute,
                               np.ones(len(p.heads) + len(p.read_backward), dtype=bool)])
    return Network(tails, heads, infinite, z0 + n_tensors)


def _cut(p: Problem, price: float, copied_mask: np.ndarray) -> Cut:
    """The cut's plan, pruned to what the backward really needs (nodes copied for free
    that nothing needs are dropped), and its exact (unscaled) costs."""
    needed = _needed(p, copied_mask)
    producers = p.producer[needed]
    copied = np.zeros(len(p.nodes), dtype=bool)
    producers = producers[producers >= 0]
    copied[producers[copied_mask[producers]]] = True
    kept_mask = needed & ~((p.producer >= 0) & copied[np.maximum(p.producer, 0)])
    positions = np.flatnonzero(kept_mask).tolist()
    kept = [p.tensors[u] for u in positions]
    sizes: dict[str, int] = {}
    nbytes = p.nbytes.tolist()
    for u in positions:
        b = p.buffer[u]
        sizes[b] = max(sizes.get(b, 0), nbytes[u])
    nodes = np.asarray(p.nodes, dtype=np.int64)[copied]
    return Cut(price, frozenset(nodes.tolist()), frozenset(kept), sum(sizes.values()), int(p.cost[copied].sum()),
               int(p.flops[copied].sum()), int(p.matmul_flops[copied].sum()))


def _needed(p: Problem, copied_mask: np.ndarray) -> np.ndarray:
    """The tensors the backward needs under a cut: those it reads, and the inputs of every
    copied node that makes a needed tensor, transitively. ``nodes`` are in topological
    order, so one pass from the last node back settles each node after all its readers."""
    inputs, outputs = p.node_tensors
    need = np.zeros(len(p.tensors), dtype=bool)
    need[p.read_backward] = True
    needed = need.tolist()
    for k in np.flatnonzero(copied_mask)[::-1].tolist():
        for u in outputs[k]:
            if needed[u]:
                for h in inputs[k]:
                    needed[h] = True
                break
    return np.asarray(needed, dtype=bool)




def front(problem: Problem, max_solves: int = MAX_SOLVES) -> list[Cut]:
    """The cuts at the corners of the lower convex hull of (kept bytes, recompute cost),
    from keeping everything to recomputing the most, by the parametric recursion
    (Eisner and Severance): solve at the price where two known corners cost the same;
    a cheaper cut there is a new corner between them. Sorted by kept bytes, descending."""
    total_cost = float(problem.cost.sum()) + 1.0
    low = solve(problem, 1.0 / (1.0 + float(problem.nbytes.sum())))  # almost free bytes: keep what helps
    high = solve(problem, total_cost)  # a byte costs more than recomputing everything
    cuts = {_key(low): low, _key(high): high}
    pending = [(low, high)]
    solves = 2
    while pending and solves < max_solves:
        pending.sort(key=lambda pair: pair[0].kept_bytes - pair[1].kept_bytes)
        left, right = pending.pop()
        if left.kept_bytes <= right.kept_bytes or right.cost <= left.cost:
            continue
        price = (right.cost - left.cost) / (left.kept_bytes - right.kept_bytes)
        mid = solve(problem, price)
        solves += 1
        if _key(mid) in cuts:
            continue
        if mid.cost + price * mid.kept_bytes < left.cost + price * left.kept_bytes - 1e-6 * (left.cost + 1):
            cuts[_key(mid)] = mid
            pending += [(left, mid), (mid, right)]
    return sorted(cuts.values(), key=lambda c: (-c.kept_bytes, c.cost))


def _key(c: Cut) -> tuple[frozenset[int], frozenset[str]]:
    return (c.copied, c.kept)


def to_plan(a: Analysis, cut: Cut, strategy: str = "mincut") -> Plan:
    """Regions from a cut: the copied nodes grouped by layer (or by connected part when
    the graph names no layers). Every region input is kept or resident, so no keep
    sets are needed: the rewrite recomputes exactly the cut's copies."""
    g = a.graph
    groups: dict[str, set[int]] = {}
    parent = {i: i for i in cut.copied}

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in cut.copied:
        for t in g.nodes[i].inputs:
            p = g.producer.get(t)
            if p in parent:
                parent[find(p)] = find(i)
    rank = {i: k for k, i in enumerate(a.priority.order)}
    parts: dict[int, set[int]] = {}
    for i in cut.copied:
        parts.setdefault(find(i), set()).add(i)
    for part in parts.values():
        labels = Counter(layer_of(a.scopes[i]) or a.scopes[i].split("/")[0] for i in part)
        labels.pop("", None)
        label = labels.most_common(1)[0][0] if labels else "recompute"
        groups.setdefault(label.replace("/", "."), set()).update(part)
    ordered = sorted(groups.items(), key=lambda kv: min(rank[i] for i in kv[1]))
    regions = [Region(name, nodes) for name, nodes in ordered]
    plan = Plan(regions, strategy, decisions=cut_decisions(a, cut.copied))
    how = (f"min cut at {cut.price:.3g} FLOP per byte" if cut.price == cut.price
           else "MILP between two corners of the min-cut front")  # NaN price: from solve_bytes
    plan.notes.append(f"tensor-level {how}: keeps {len(cut.kept)} tensors ({human_bytes(cut.kept_bytes)}), "
                      f"recomputes {len(cut.copied)} nodes")
    return plan


# HiGHS holds a row within its primal feasibility tolerance (1e-7, on scaled rows): on a byte
# budget of a GiB a few bytes over (gpt2s at PyTorch's 0.5 and 0.2: 4 bytes, the same cut
# at 12 bytes below the budget). A cut over the budget is solved again this many times,
# the budget lowered by the excess, then also by a margin of the tolerance's size, doubled.
BYTE_RETRIES = 4
BYTE_TOLERANCE = 1e-7


def solve_bytes(problem: Problem, max_bytes: int, matmul_first: bool = False,
                time_limit: float = 30.0) -> Cut | None:
    """The cut with the least recompute cost that keeps at most ``max_bytes``: between
    the corners of the price sweep, the same closure problem with a byte budget is a
    MILP (HiGHS). ``matmul_first``: least matmul FLOPs, then least cost.
    None when no cut keeps that little."""
    limit, margin = max_bytes, 0
    for _ in range(BYTE_RETRIES):
        cut = _solve_bytes_once(problem, limit, matmul_first, time_limit)
        if cut is None or cut.kept_bytes <= max_bytes:
            return cut
        limit -= cut.kept_bytes - max_bytes + margin
        margin = 2 * margin or max(1, int(BYTE_TOLERANCE * max_bytes))
    return None


def _solve_bytes_once(problem: Problem, max_bytes: int, matmul_first: bool, time_limit: float) -> Cut | None:
    """``solve_bytes`` as HiGHS answers it, within its feasibility tolerance."""
    from .milp import Triples, solve_binary

    p = problem
    n, m = len(p.nodes), len(p.tensors)
    y, z, k = 0, n, n + m  # variable offsets
    rows: list[np.ndarray] = []
    cols: list[np.ndarray] = []
    vals: list[np.ndarray] = []
    lower: list[np.ndarray] = []
    upper: list[np.ndarray] = []
    row = 0

    def add(r_cols: list[np.ndarray], r_vals: list[float], lo: float, hi: float, count: int) -> None:
        nonlocal row
        ids = row + np.arange(count)
        for c, v in zip(r_cols, r_vals):
            rows.append(ids)
            cols.append(c)
            vals.append(np.full(count, v))
        lower.append(np.full(count, lo))
        upper.append(np.full(count, hi))
        row += count

    # A copied node needs its inputs: z_h - y_t >= 0.
    add([z + p.heads, y + p.tails], [1.0, -1.0], 0.0, np.inf, len(p.heads))
    copyable = np.flatnonzero(p.producer >= 0)
    fixed = np.flatnonzero(p.producer < 0)
    # A needed tensor is kept unless its producer is copied: k_u - z_u + y_p >= 0.
    add([k + copyable, z + copyable, y + p.producer[copyable]], [1.0, -1.0, 1.0], 0.0, np.inf, len(copyable))
    add([k + fixed, z + fixed], [1.0, -1.0], 0.0, np.inf, len(fixed))
    # Views and policy-recomputed tensors are never kept: z_u - y_p <= 0.
    must = np.flatnonzero(p.must_recompute)
    add([z + must, y + p.producer[must]], [1.0, -1.0], -np.inf, 0.0, len(must))
    # The byte budget: the kept tensors' bytes.
    rows.append(np.full(m, row))
    cols.append(k + np.arange(m))
    vals.append(p.nbytes.astype(float))
    lower.append(np.full(1, -np.inf))
    upper.append(np.full(1, float(max_bytes)))
    lo_z = np.zeros(m)
    lo_z[p.read_backward] = 1.0
    hi_k = np.where(p.must_recompute, 0.0, 1.0)
    cost = p.cost.astype(float)
    # Least cost, then (under one unit in all) the fewest kept bytes.
    tie = p.nbytes.astype(float) / (1.0 + float(p.nbytes.sum()))
    if matmul_first:  # matmul FLOPs, then cost, then bytes: each tier under one unit of the one above
        scale = 1.0 + float(cost.sum())
        cost, tie = p.matmul_flops.astype(float) + cost / scale, tie / scale
    matrix = Triples(np.concatenate(rows), np.concatenate(cols), np.concatenate(vals))
    x = solve_binary(np.concatenate([cost, np.zeros(m), tie]), matrix, np.concatenate(lower), np.concatenate(upper),
                     np.concatenate([np.zeros(n), lo_z, np.zeros(m)]), np.concatenate([np.ones(n), np.ones(m), hi_k]),
                     time_limit=time_limit)
    if x is None:
        return None
    return _cut(p, float("nan"), x[y:z] > 0.5)
