"""Checkpoint regions and plans, and the JSON plan file format.

A region is a set of forward nodes whose internal activations are not kept for the
backward pass; ``keep`` lists tensors inside it that are kept anyway (for example an
expensive MatMul output). A plan is a list of regions plus how it was chosen.

Plan file (the ``plan`` field of ``ckpt rewrite --json``; read by ``ckpt rewrite --plan plan.json``)::

    {
      "ckpt_plan": 1,
      "strategy": "layers",                 # informative
      "regions": [
        {"name": "blocks.0",
         "nodes": ["node_view_3", ...],     # forward node names, or:
         "match": "re:^/blocks\\.0/",       # a glob or re: pattern over node names
         "keep": ["node_mm_7_out"],         # optional: tensors kept inside the region
         "twice": ["node_mm_3_out"]}        # optional: recomputed a second time for late readers
      ]
    }
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..graph import Graph
from .decision import KEEP, OUTSIDE, RECOMPUTE, Decision, policy_reason

PLAN_FORMAT = 1


@dataclass
class Region:
    name: str
    nodes: set[int]  # forward node indices
    keep: set[str] = field(default_factory=set)
    # tensors of the region recomputed a second time, right before their late backward
    # readers (``rewrite/twice.py``), so that their first copy dies after the early ones
    twice: set[str] = field(default_factory=set)


@dataclass
class Plan:
    """Regions, how they were chosen, and per stashed buffer what the strategy meant to do
    and why (``decision.py``; plan files carry regions only, and read back as regions)."""

    regions: list[Region]
    strategy: str
    notes: list[str] = field(default_factory=list)  # what was decided and why, for the report
    decisions: dict[str, Decision] = field(default_factory=dict)  # per stashed buffer, by whoever chose it

    def to_json(self, node_names: list[str]) -> dict[str, Any]:
        return {
            "ckpt_plan": PLAN_FORMAT,
            "strategy": self.strategy,
            "regions": [{"name": r.name, "nodes": sorted((node_names[i] for i in r.nodes), key=_natural),
                         "keep": sorted(r.keep), **({"twice": sorted(r.twice)} if r.twice else {})}
                        for r in self.regions],
        }


@dataclass(frozen=True)
class Policy:
    """Per-op rules: ``keep_ops`` outputs are never recomputed, ``recompute_ops``
    outputs are never kept (recomputed whenever the backward needs them)."""

    keep_ops: frozenset[str] = frozenset()
    recompute_ops: frozenset[str] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.keep_ops or self.recompute_ops)

    def describe(self) -> str:
        parts = []
        if self.recompute_ops:
            parts.append("always recomputes " + ",".join(sorted(self.recompute_ops)))
        if self.keep_ops:
            parts.append("always keeps " + ",".join(sorted(self.keep_ops)))
        return "policy: " + "; ".join(parts)


def apply_policy(plan: Plan, policy: Policy, graph: Graph) -> Plan:
    """``plan`` with the policy honoured inside its regions: outputs of ``keep_ops`` are
    kept, outputs of ``recompute_ops`` are not (a node outside every region is never
    recomputed, whatever its op)."""
    if not policy:
        return plan
    regions = []
    for r in plan.regions:
        keep = set(r.keep)
        for i in r.nodes:
            node = graph.nodes[i]
            if node.op_type in policy.keep_ops:
                keep.update(t for t in node.outputs if t)
            elif node.op_type in policy.recompute_ops:
                keep.difference_update(node.outputs)
        regions.append(Region(r.name, set(r.nodes), keep, set(r.twice)))
    notes = list(plan.notes)
    if policy.describe() not in notes:
        notes.append(policy.describe())
    return Plan(regions, plan.strategy, notes, _policy_decisions(plan, policy, graph))


def _policy_decisions(plan: Plan, policy: Policy, graph: Graph) -> dict[str, Decision]:
    """The plan's decisions with the policy's reason where it decides: a ``keep_ops``
    output the plan could recompute (in a region, or any a min cut built under the
    policy left out), a ``recompute_ops`` output in a region."""
    inside = {i for r in plan.regions for i in r.nodes}
    out = dict(plan.decisions)
    for t, d in plan.decisions.items():
        i = graph.producer.get(t)
        op = graph.nodes[i].op_type if i is not None else None
        if op in policy.keep_ops and d.reason.code != OUTSIDE.code:
            out[t] = Decision(t, KEEP, policy_reason(KEEP, op), d.bytes, d.flops)
        elif op in policy.recompute_ops and i in inside:
            out[t] = Decision(t, RECOMPUTE, policy_reason(RECOMPUTE, op), d.bytes, d.flops)
    return out


def _natural(s: str) -> list[int | str]:
    import re
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", s)]


def read_plan_file(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError as e:
        raise UsageError(f"{path}: no such plan file") from e
    except json.JSONDecodeError as e:
        raise UsageError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from e
    except (OSError, UnicodeDecodeError, RecursionError, MemoryError) as e:
        raise UsageError(f"{path}: cannot read the plan file ({getattr(e, 'strerror', None) or type(e).__name__})") from e
    if not isinstance(data, dict) or not isinstance(data.get("regions"), list):
        raise UsageError(f"{path}: a plan is an object with a 'regions' list (see ckpt rewrite --help)")
    version = data.get("ckpt_plan", PLAN_FORMAT)
    if type(version) is not int or version != PLAN_FORMAT:  # True == 1 in Python: not a version
        raise UsageError(f"{path}: plan format {json.dumps(version)[:40]} is not supported "
                         f"(this ckpt reads \"ckpt_plan\": {PLAN_FORMAT})")
    if not isinstance(data.get("strategy", ""), str):
        raise UsageError(f"{path}: 'strategy' must be a string")
    for k, r in enumerate(data["regions"]):
        if not isinstance(r, dict) or not ("nodes" in r or "match" in r):
            raise UsageError(f"{path}: region {k} needs 'nodes' (a list of node names) or 'match' (a pattern)")
        for key in ("nodes", "keep", "twice"):
            if key in r and not (isinstance(r[key], list) and all(isinstance(x, str) for x in r[key])):
                raise UsageError(f"{path}: region {k}: '{key}' must be a list of names, not {_kind(r[key])}")
        for key in ("match", "name"):
            if key in r and not isinstance(r[key], str):
                raise UsageError(f"{path}: region {k}: '{key}' must be a string, not {_kind(r[key])}")
    return data


def _kind(value: object) -> str:
    return {str: "a string", list: "a list", dict: "an object", bool: "true/false", type(None): "null"}.get(
        type(value), "a number")
