"""The recompute rewrite: region activations are recomputed before the backward needs them.

For every region, the forward tensors it produces that backward nodes read are
recomputed by copies of the region nodes, starting from tensors that are kept (the
region's inputs, tensors the plan keeps, outputs of random ops). The copies form one
block placed right before the first backward node that reads any of them; backward
readers are rewired to the copies, so the originals die at their last forward use.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import onnx

from ..analysis import Analysis
from ..analysis.shapes import TensorInfo
from ..graph import ABSENT, Graph, Node, unique_name
from ..markers import CSE_GUARD_ATTR, RECOMPUTE_META, REGION_META, SUFFIX
from ..ops import RANDOM_OPS, SHAPE_ONLY_OPS, VIEW_OPS, is_recomputable
from ..planning.decision import CHECKPOINT, NORM_INPUT, VIEW_KEPT, Reason, fixed_reason, record
from ..planning.plan import Plan



@dataclass
class RegionResult:
    name: str
    nodes: int
    copies: list[str] = field(default_factory=list)  # original node names that were copied
    recomputed: list[str] = field(default_factory=list)  # tensors the backward now reads from copies
    kept_random: list[str] = field(default_factory=list)
    kept_subgraph: list[str] = field(default_factory=list)
    placed_before: str | None = None
    # (tensor, the backward node its second copy is placed before): ``rewrite/twice.py``
    twice: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class Recompute:
    """The copies to make, before any ordering."""

    copies: dict[int, onnx.NodeProto]  # original node index -> copy
    renamed: dict[str, str]  # original tensor -> recomputed tensor, for backward readers
    blocks: list[list[int]]  # per region: original indices of its copies, in base order
    regions: list[RegionResult]
    tensors: dict[str, TensorInfo]
    found: dict[str, Reason] = field(default_factory=dict)  # buffer -> why the rewrite keeps it after all
    recomputed: set[str] = field(default_factory=set)  # buffers the backward no longer reads: copies replace them


def data_readers(a: Analysis, tensor: str) -> list[int]:
    g = a.graph
    return [c for c in g.consumers.get(tensor, ())
            if not a.phases.is_forward[c] and g.nodes[c].op_type not in SHAPE_ONLY_OPS]


def plan_recompute(a: Analysis, plan: Plan) -> Recompute:
    """Decide which nodes each region recomputes and build the copies."""
    g = a.graph
    owner = _forward_owners(a, plan)
    recomputable = {i: is_recomputable(g.nodes[i]) for i in owner}
    found: dict[str, Reason] = {}
    kept = _kept_tensors(a, plan, owner, recomputable, found)
    _tie_norm_statistics(a, owner, kept, recomputable, found)
    results = _region_results(g, plan, owner, recomputable)
    in_region = _in_region_test(g, owner, kept, recomputable)
    needed = _needed_by_backward(a, owner, in_region, len(plan.regions))
    copy_sets = _copy_sets(g, needed, in_region)
    _record_uncopied(a, owner, copy_sets, in_region, found)
    copies, renamed, info, blocks = _make_copies(a, plan, copy_sets, needed, results)
    recomputed = _recomputed_buffers(a, copies, renamed, found)
    return Recompute(copies, renamed, blocks, results, info, found, recomputed)


def _forward_owners(a: Analysis, plan: Plan) -> dict[int, int]:
    """Forward node index -> the first region that holds it."""
    owner: dict[int, int] = {}
    for r, region in enumerate(plan.regions):
        for i in region.nodes:
            if a.phases.is_forward[i]:
                owner.setdefault(i, r)
    return owner


def _kept_tensors(a: Analysis, plan: Plan, owner: dict[int, int], recomputable: dict[int, bool],
                  found: dict[str, Reason]) -> set[str]:
    """What the regions keep: the plan's keep sets, outputs of nodes that cannot be
    recomputed, and each region's inputs from another region (its checkpoints)."""
    g = a.graph
    kept: set[str] = set().union(*(region.keep for region in plan.regions)) if plan.regions else set()
    for i, r in owner.items():
        node = g.nodes[i]
        if not recomputable[i]:
            kept.update(t for t in node.outputs if t != ABSENT)
            fixed = fixed_reason(node)
            assert fixed is not None  # is_recomputable is False exactly where fixed_reason names why
            for t in node.outputs:
                if t != ABSENT:
                    record(found, a.roots.get(t, t), fixed)
        for t in node.inputs:
            p = g.producer.get(t)
            if p is not None and owner.get(p, r) != r:
                kept.add(t)
                record(found, a.roots.get(t, t), CHECKPOINT)
    return kept


def _region_results(g: Graph, plan: Plan, owner: dict[int, int], recomputable: dict[int, bool]) -> list[RegionResult]:
    """Per region its result so far: its node count, its random and subgraph nodes (kept)."""
    results = [RegionResult(region.name, sum(1 for i in region.nodes if owner.get(i) == r))
               for r, region in enumerate(plan.regions)]
    for i, r in owner.items():
        node = g.nodes[i]
        if node.op_type in RANDOM_OPS:
            results[r].kept_random.append(node.name)
        elif not recomputable[i] and node.has_subgraph:
            results[r].kept_subgraph.append(node.name)
    return results


def _in_region_test(g: Graph, owner: dict[int, int], kept: set[str],
                    recomputable: dict[int, bool]) -> Callable[[str, int], bool]:
    """Whether region ``r`` can recompute a tensor: a recomputable node of its own makes it
    and nothing keeps it."""

    def in_region(t: str, r: int) -> bool:
        p = g.producer.get(t)
        return p is not None and owner.get(p) == r and t not in kept and recomputable[p]
    return in_region


def _needed_by_backward(a: Analysis, owner: dict[int, int], in_region: Callable[[str, int], bool],
                        regions: int) -> list[list[str]]:
    """Per region, the tensors it can recompute that backward nodes read."""
    needed: list[list[str]] = [[] for _ in range(regions)]
    for i, r in owner.items():
        for t in a.graph.nodes[i].outputs:
            if t != ABSENT and in_region(t, r) and data_readers(a, t):
                needed[r].append(t)
    return needed


def _copy_sets(g: Graph, needed: list[list[str]], in_region: Callable[[str, int], bool]) -> list[set[int]]:
    """Per region, the nodes to copy: those that make its needed tensors from what is kept."""
    copy_sets: list[set[int]] = [set() for _ in needed]
    for r, tensors in enumerate(needed):
        stack = [g.producer[t] for t in tensors]
        while stack:
            i = stack.pop()
            if i in copy_sets[r]:
                continue
            copy_sets[r].add(i)
            stack.extend(g.producer[t] for t in g.nodes[i].inputs if in_region(t, r))
    return copy_sets


def _record_uncopied(a: Analysis, owner: dict[int, int], copy_sets: list[set[int]],
                     in_region: Callable[[str, int], bool], found: dict[str, Reason]) -> None:
    """Note the tensors that are recomputable and not kept, yet no backward reader needs a copy of."""
    for i, r in owner.items():
        if i not in copy_sets[r]:
            for t in a.graph.nodes[i].outputs:
                if t != ABSENT and in_region(t, r):
                    record(found, a.roots.get(t, t), VIEW_KEPT)


def _make_copies(a: Analysis, plan: Plan, copy_sets: list[set[int]], needed: list[list[str]],
                 results: list[RegionResult]) -> tuple[dict[int, onnx.NodeProto], dict[str, str],
                                                       dict[str, TensorInfo], list[list[int]]]:
    """The copies of each region's nodes in base order, the names backward readers take
    instead of the originals, the tensor infos with the copies' and each region's block."""
    g = a.graph
    taken_nodes = {n.name for n in g.nodes}
    taken_tensors = set(g.producer) | set(g.resident)
    rank = {i: k for k, i in enumerate(a.priority.order)}
    copies: dict[int, onnx.NodeProto] = {}
    renamed: dict[str, str] = {}
    info = dict(a.tensors)
    blocks: list[list[int]] = []
    for r, members in enumerate(copy_sets):
        block = sorted(members, key=rank.__getitem__)
        blocks.append(block)
        region = plan.regions[r].name
        guard = onnx.helper.make_attribute(CSE_GUARD_ATTR, region)
        local: dict[str, str] = {}
        for i in block:
            node = g.nodes[i]
            for t in node.outputs:
                if t != ABSENT:
                    local[t] = unique_name(t + SUFFIX, taken_tensors)
                    if t in info:
                        info[local[t]] = info[t]
            copies[i] = copy_node(node, local, unique_name(node.name + SUFFIX, taken_nodes), region, guard)
            results[r].copies.append(node.name)
        for t in needed[r]:
            renamed[t] = local[t]
        results[r].recomputed = sorted(needed[r])
    return copies, renamed, info, blocks


# Normalizations whose statistics outputs (mean, inverse std) their gradient reads.
_NORMS = frozenset({"LayerNormalization", "SimplifiedLayerNormalization"})


def _tie_norm_statistics(a: Analysis, owner: dict[int, int], kept: set[str], recomputable: dict[int, bool],
                         found: dict[str, Reason]) -> None:
    """In ORT training graphs a LayerNormalization's statistics follow its input: recomputed
    with it, or the input kept. The training build's SkipLayerNormFusion (ORT 1.19.2,
    ORT_ENABLE_ALL: the Module API's session) fuses an Add into the LayerNormalization once
    the backward reads only a copy of the Add's output, and moves the statistics onto a
    SkipLayerNormalization whose CPU kernel never writes them: the LayerNormalizationGrad
    still reading the forward statistics then fails to run."""
    g = a.graph
    for node in g.nodes:
        if node.op_type not in _NORMS or not a.phases.is_forward[node.index]:
            continue
        i, x = node.index, node.inputs[0]
        p = g.producer.get(x)
        stats = [t for t in node.outputs[1:] if t != ABSENT and _read_by_ort_gradient(a, t)]
        if p is None or not stats or x in kept or owner.get(p) is None:
            continue
        if owner.get(p) == owner.get(i) and recomputable[i] and recomputable[p]:
            kept.difference_update(stats)
        else:
            kept.add(x)
            record(found, a.roots.get(x, x), NORM_INPUT)


def _read_by_ort_gradient(a: Analysis, tensor: str) -> bool:
    return any(a.graph.nodes[c].domain == "com.microsoft" for c in data_readers(a, tensor))


def _recomputed_buffers(a: Analysis, copies: dict[int, onnx.NodeProto], renamed: dict[str, str],
                        found: dict[str, Reason]) -> set[str]:
    """Outputs of copied nodes that the backward no longer reads as they are: not a kept
    output of a node copied for another one, nor a buffer that the backward or a copy
    still reads through an original view (that one is noted in ``found``)."""
    g = a.graph
    still_read: set[str] = set()
    for s in a.stashed:
        if s.tensor not in renamed and data_readers(a, s.tensor):
            still_read.add(s.buffer)
            if s.tensor != s.buffer:
                record(found, s.buffer, VIEW_KEPT)
    for i, p in copies.items():
        if g.nodes[i].op_type in SHAPE_ONLY_OPS:
            continue
        for t in p.input:
            if t in g.producer and a.phases.is_forward[g.producer[t]]:
                root = a.roots.get(t, t)
                still_read.add(root)
                if root != t:
                    record(found, root, VIEW_KEPT)
    return {t for i in copies if g.nodes[i].op_type not in VIEW_OPS
            for t in g.nodes[i].outputs if t != ABSENT and t not in still_read}


def copy_node(node: Node, local: dict[str, str], name: str, region: str,
               guard: onnx.AttributeProto) -> onnx.NodeProto:
    p = onnx.NodeProto()
    p.CopyFrom(node.proto)
    p.name = name
    del p.input[:]
    p.input.extend(local.get(t, t) for t in node.inputs)
    del p.output[:]
    p.output.extend(local.get(t, t) if t != ABSENT else ABSENT for t in node.outputs)
    if not any(t in local for t in node.inputs):
        # CSE merges only nodes with equal inputs: a copy reading another copy is distinct
        # already. An attribute on it could also travel into a fused node that refuses it
        # (GemmActivationFusion copies an activation's attributes into FusedGemm).
        p.attribute.append(guard)
    for k, v in ((REGION_META, region), (RECOMPUTE_META, node.name)):
        entry = p.metadata_props.add()
        entry.key, entry.value = k, v
    return p


def rewire_backward(a: Analysis, renamed: dict[str, str],
                    late: dict[int, dict[str, str]] | None = None) -> list[onnx.NodeProto]:
    """Protos of the original nodes with backward data readers moved to the copies (the
    readers in ``late`` to the second copies it names). Nodes that change are copied; the
    input graph is left untouched."""
    out = []
    for node in a.graph.nodes:
        if (a.phases.is_forward[node.index] or node.op_type in SHAPE_ONLY_OPS
                or not any(t in renamed for t in node.inputs)):
            out.append(node.proto)
            continue
        p = onnx.NodeProto()
        p.CopyFrom(node.proto)
        del p.input[:]
        second = late.get(node.index, {}) if late else {}
        p.input.extend(second.get(t) or renamed.get(t, t) for t in node.inputs)
        out.append(p)
    return out


def drop_unused_optional_outputs(graph: Graph, copy_names: set[str]) -> list[int]:
    """Blank optional outputs of copies that nothing reads (e.g. BatchNorm running stats), in
    their protos; returns the indices of the nodes changed (the graph's index is then stale)."""
    outputs = set(graph.outputs)
    changed: list[int] = []
    for node in graph.nodes:
        if node.name not in copy_names or len(node.outputs) < 2:
            continue
        try:
            schema = onnx.defs.get_schema(node.op_type, graph.opset(node.domain) or 1, node.domain)
        except Exception:  # noqa: BLE001 - an op onnx has no schema for: no formal outputs to check
            continue
        formal = schema.outputs
        for k, t in enumerate(node.outputs):
            if k == 0 or t == ABSENT or t in outputs or graph.consumers.get(t):
                continue
            if k < len(formal) and formal[k].option == onnx.defs.OpSchema.FormalParameterOption.Optional:
                node.proto.output[k] = ABSENT
                changed.append(node.index)
    return sorted(set(changed))
