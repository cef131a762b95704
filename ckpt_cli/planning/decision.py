"""Why each stashed activation is kept or recomputed, recorded by whoever decides it.

A strategy records its intent per stashed buffer when it makes a plan (``Plan.decisions``);
the rewrite records what it finds moot (a node it cannot copy, a region input another
region recomputes from) and ``settle`` gives the final word, which explanations and
reports read. Like PyTorch's checkpoint policies and ORT's recompute plans, the
reason is recorded where the choice is made, never rebuilt from strategy names.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, AbstractSet, Any, Callable, Iterable, Mapping

from ..analysis import Analysis
from ..graph import Node
from ..ops import RANDOM_OPS, is_recomputable

if TYPE_CHECKING:
    from .plan import Region

KEEP = "keep"
RECOMPUTE = "recompute"


@dataclass(frozen=True)
class Reason:
    code: str  # machine-readable, stable: what reports and tests match on
    text: str  # for people


@dataclass(frozen=True)
class Decision:
    tensor: str  # the stashed buffer (a view's decision is its buffer's)
    action: str  # KEEP or RECOMPUTE
    reason: Reason
    bytes: int | None  # None when its size is unknown
    flops: int  # what recomputing it costs (its producer)


_RECOMPUTED = "recomputed from the region's kept inputs"
REGION = Reason("region", _RECOMPUTED)
CUT_RECOMPUTE = Reason("mincut", _RECOMPUTED)
WITH_NODE = Reason("with_node", "recomputed with another output of its node")
NOTHING = Reason("no_recompute", "no recompute needed: the original already fits")
REORDER = Reason("no_recompute", "no recompute needed: reordering alone gives the lowest peak")
NO_GAIN = Reason("no_gain", "the plan lowered nothing: the graph is written unchanged")
CUT_KEEP = Reason("mincut", "min cut: recomputing it (and the inputs it needs) costs more than its bytes are "
                            "worth here")
OUTSIDE = Reason("outside", "outside every region")
RANDOM = Reason("random", "random op: a recompute would draw different numbers")
SUBGRAPH = Reason("subgraph", "node with a subgraph (If/Loop/Scan) is never recomputed")
CHECKPOINT = Reason("checkpoint", "region boundary: another region recomputes from it (checkpoint)")
COMPUTE_BOUND = Reason("compute_bound", "compute-bound output (balanced policy keeps these)")
IN_PLAN = Reason("plan", "kept by the plan")
VIEW_KEPT = Reason("view_kept", "the backward reads it through a view that is kept")
NOT_NEEDED = Reason("not_needed", "not needed by the backward after the rewrite")
PEAK_KEEP = Reason("peak", "peak descent: its recompute copy was live at the predicted peak; kept, the peak is lower")
PEAK_RECOMPUTE = Reason("peak", "peak descent: kept, it was live at the predicted peak; recomputed, the peak is lower")
NORM_INPUT = Reason("norm_input", "input of a LayerNormalization whose statistics the gradient reads: kept with "
                                  "them (ORT training's SkipLayerNormFusion drops recomputed ones)")

# When the plan keeps a tensor and the rewrite also finds a reason to, the earlier code
# here is the one reported (the most fundamental: a cut's choice or a node outside every
# region before a region input, a region input before a keep set that it makes moot).
KEEP_ORDER = ("no_recompute", "no_gain", "mincut", "peak", "outside", "policy", "random", "subgraph", "domain",
              "checkpoint", "norm_input", "compute_bound", "budget", "plan", "view_kept", "not_needed")


def domain_reason(domain: str, op: str) -> Reason:
    return Reason("domain", f"{domain} op {op} is not known to be deterministic: never recomputed")


def fixed_reason(node: Node) -> Reason | None:
    """Why ``node`` is never copied into the backward, or None when it may be."""
    if node.op_type in RANDOM_OPS:
        return RANDOM
    if node.has_subgraph:
        return SUBGRAPH
    if not is_recomputable(node):  # an op of another domain that ckpt does not know to be deterministic
        return domain_reason(node.domain, node.op_type)
    return None


def policy_reason(action: str, op: str) -> Reason:
    if action == KEEP:
        return Reason("policy", f"policy: {op} outputs are always kept (--keep-ops)")
    return Reason("policy", f"policy: {op} outputs are always recomputed (--recompute-ops)")


BUDGET_CODE = "budget"


def budget_reason(d: Decision) -> Reason:
    text = (f"the budget has room for it (recomputing costs {d.flops / d.bytes:.1f} FLOP per byte)" if d.bytes
            else "kept within the budget")
    return Reason(BUDGET_CODE, text)


def buffers(a: Analysis) -> dict[str, Decision]:
    """Every stashed buffer, undecided (kept, no reason yet), with its bytes and FLOPs
    (every plan a search makes starts from it: one pass over the stashed tensors)."""
    g = a.graph
    out: dict[str, Decision] = {}
    for s in a.stashed:
        if s.buffer in out:
            continue
        info = a.tensors.get(s.buffer)
        flops = a.costs[g.producer[s.buffer]].flops if s.buffer in g.producer else 0
        out[s.buffer] = Decision(s.buffer, KEEP, NOTHING, info.nbytes if info is not None else None, flops)
    return out


def all_kept(a: Analysis, reason: Reason) -> dict[str, Decision]:
    return {t: replace(d, reason=reason) for t, d in buffers(a).items()}


def region_decisions(a: Analysis, regions: Iterable[Region], keep: Reason = IN_PLAN) -> dict[str, Decision]:
    """A region plan's intent: a buffer made inside a region is recomputed unless the
    region keeps it (for ``keep``); one made outside every region is kept."""
    owner: dict[int, Any] = {}
    for r in regions:
        for i in r.nodes:
            owner.setdefault(i, r)
    out: dict[str, Decision] = {}
    for t, d in buffers(a).items():
        region = owner.get(a.graph.producer.get(t, -1))
        if region is None:
            out[t] = replace(d, reason=OUTSIDE)
        elif t in region.keep:
            out[t] = replace(d, reason=keep)
        else:
            out[t] = replace(d, action=RECOMPUTE, reason=REGION)
    return out


def cut_decisions(a: Analysis, copied: AbstractSet[int]) -> dict[str, Decision]:
    """A min cut's choice: buffers whose producer it copies are recomputed, the others
    kept because the cut found that cheaper (or because their producer cannot be copied)."""
    out: dict[str, Decision] = {}
    for t, d in buffers(a).items():
        p = a.graph.producer.get(t)
        if p is None:
            out[t] = replace(d, reason=OUTSIDE)
        elif p in copied:
            out[t] = replace(d, action=RECOMPUTE, reason=CUT_RECOMPUTE)
        else:
            out[t] = replace(d, reason=fixed_reason(a.graph.nodes[p]) or CUT_KEEP)
    return out


def kept_instead(decisions: Mapping[str, Decision], tensors: Iterable[str],
                 reason: Reason | Callable[[Decision], Reason]) -> dict[str, Decision]:
    """``decisions`` with ``tensors`` kept for ``reason`` (a Reason, or a function of the
    decision it replaces) where the plan recomputed them."""
    out = dict(decisions)
    for t in tensors:
        d = out.get(t)
        if d is not None and d.action == RECOMPUTE:
            out[t] = replace(d, action=KEEP, reason=reason(d) if callable(reason) else reason)
    return out


def record(found: dict[str, Reason], tensor: str, reason: Reason) -> None:
    """Note why the rewrite keeps ``tensor``; of several reasons, the most fundamental."""
    if tensor not in found or _rank(reason) < _rank(found[tensor]):
        found[tensor] = reason


def settle(planned: Mapping[str, Decision], found: Mapping[str, Reason], recomputed: set[str]
           ) -> dict[str, Decision]:
    """The final decisions: what the rewrite really recomputes (``recomputed``), for the
    plan's reason, or for what the rewrite found (``found``: why it kept a buffer)."""
    out: dict[str, Decision] = {}
    for t, d in planned.items():
        why = found.get(t)
        if t in recomputed:
            out[t] = d if d.action == RECOMPUTE else replace(d, action=RECOMPUTE, reason=WITH_NODE)
        elif d.action == KEEP and (why is None or _rank(d.reason) <= _rank(why)):
            out[t] = d
        else:
            out[t] = replace(d, action=KEEP, reason=why or NOT_NEEDED)
    return out


def _rank(reason: Reason) -> int:
    return KEEP_ORDER.index(reason.code) if reason.code in KEEP_ORDER else len(KEEP_ORDER)
