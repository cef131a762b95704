"""Ways to mark checkpoint regions: each is a function ``Analysis -> Plan``.

Regions only ever hold forward nodes; recompute copies made by an earlier rewrite
are backward nodes, so rewriting a rewritten graph never nests copies.
"""

from __future__ import annotations

import fnmatch
import math
from collections import defaultdict
from typing import Any, Callable, Protocol

import re2

from ..analysis import Analysis
from ..analysis.scopes import layer_of
from ..errors import UsageError
from .decision import region_decisions
from .plan import Plan, Region


class RegexMatch(Protocol):
    """A match of an RE2 pattern, as ckpt reads one."""

    def group(self, index: int, /) -> str | None: ...


class Regex(Protocol):
    """A compiled RE2 pattern, as ckpt uses one."""

    @property
    def groups(self) -> int: ...

    def search(self, text: str, /) -> RegexMatch | None: ...


def compile_regex(pattern: str, option: str) -> Regex:
    """Node names come from the model, so a backtracking engine could be made to run for
    hours by a pattern such as ``(a+)+$``; RE2 matches in time linear in the name, and
    refuses the two features that need backtracking (backreferences and lookaround)."""
    options = re2.Options()
    options.log_errors = False
    try:
        compiled: Regex = re2.compile(pattern, options=options)
    except re2.error as e:
        reason = e.args[0].decode(errors="replace") if e.args and isinstance(e.args[0], bytes) else str(e)
        raise UsageError(f"bad {option} expression '{pattern}': {reason} (ckpt matches with RE2: "
                         "no backreferences or lookaround)") from e
    return compiled


def _matcher(pattern: str) -> Callable[[str], bool]:
    if pattern.startswith("re:"):
        rx = compile_regex(pattern[3:], "--region")
        return lambda s: rx.search(s) is not None
    return lambda s: fnmatch.fnmatchcase(s, pattern)


def _forward(a: Analysis) -> list[int]:
    return [i for i in a.priority.order if a.phases.is_forward[i]]


def regions_from_patterns(a: Analysis, patterns: list[str]) -> Plan:
    """One region per pattern: forward nodes whose name matches a glob or ``re:`` regex."""
    regions = []
    for p in patterns:
        match = _matcher(p)
        nodes = {i for i in _forward(a) if match(a.graph.nodes[i].name)}
        if not nodes:
            raise UsageError(f"--region '{p}' matches no forward node")
        regions.append(Region(p, nodes))
    return Plan(regions, "patterns", decisions=region_decisions(a, regions))


def regions_by_scope(a: Analysis, regex: str) -> Plan:
    """One region per distinct first capture group of ``regex`` over node names (or, for
    nodes whose names carry no scope, over their module path with dots)."""
    rx = compile_regex(regex, "--regions-by-scope")
    if rx.groups < 1:
        raise UsageError(f"--regions-by-scope '{regex}' needs a capture group, e.g. 'layers\\.(\\d+)'")
    groups: dict[str, set[int]] = defaultdict(set)
    labels: dict[str, str] = {}
    for i in _forward(a):
        name = a.graph.nodes[i].name
        m = rx.search(name) or rx.search(a.scopes[i].replace("/", "."))
        scope = m.group(1) if m else None
        if m and scope is not None:
            groups[scope].add(i)
            labels.setdefault(scope, (m.group(0) or "").strip("/."))  # group 0, the whole match, is never None
    if not groups:
        raise UsageError(f"--regions-by-scope '{regex}' matches no forward node")
    regions = [Region(labels[k], v) for k, v in groups.items()]
    return Plan(regions, "scope", decisions=region_decisions(a, regions))


def region_from_boundary(a: Analysis, spec: str) -> Plan:
    """``IN1,IN2:OUT1,OUT2``: the forward nodes that depend on an input tensor and that an
    output tensor depends on (libnnc-style checkpoints)."""
    left, sep, right = spec.partition(":")
    if not sep:
        raise UsageError(f"--boundary expects INPUTS:OUTPUTS (comma-separated tensor names), got '{spec}'")
    ins = [t for t in left.split(",") if t]
    outs = [t for t in right.split(",") if t]
    g = a.graph
    for t in ins + outs:
        if t not in g.producer and t not in g.consumers and t not in g.resident:
            raise UsageError(f"--boundary: no tensor named '{t}' in the graph")
    down: set[int] = set()
    stack = [c for t in ins for c in g.consumers.get(t, ()) if a.phases.is_forward[c]]
    while stack:
        i = stack.pop()
        if i in down:
            continue
        down.add(i)
        stack.extend(c for c in g.successors(g.nodes[i]) if a.phases.is_forward[c] and c not in down)
    up: set[int] = set()
    stack = [g.producer[t] for t in outs if t in g.producer]
    while stack:
        i = stack.pop()
        if i in up or i not in down:
            continue
        up.add(i)
        stack.extend(p for p in g.predecessors(g.nodes[i]) if p not in up)
    if not up:
        raise UsageError(f"--boundary '{spec}' encloses no forward node")
    regions = [Region(spec, up)]
    return Plan(regions, "boundary", decisions=region_decisions(a, regions))


def layer_regions(a: Analysis) -> Plan | None:
    """One region per detected repeated layer (``blocks.3``, ``layers.0``...), or None."""
    groups: dict[str, set[int]] = defaultdict(set)
    for i in _forward(a):
        layer = layer_of(a.scopes[i])
        if layer:
            groups[layer].add(i)
    if len(groups) >= 2:
        regions = [Region(k.replace("/", "."), v) for k, v in groups.items()]
        plan = Plan(regions, "layers", decisions=region_decisions(a, regions))
        plan.notes.append(f"{len(groups)} repeated layers detected from name scopes and parameter names")
        return plan
    return repeated_structure_layers(a)


MIN_LAYER_NODES = 4
MAX_LAYER_NODES = 2000


def repeated_structure_layers(a: Analysis) -> Plan | None:
    """Layers found from the graph's shape alone, for graphs whose names say nothing: the
    forward op sequence's shortest period P that repeats over the longest stretch; each
    period of that stretch becomes a region. numpy compares the sequence with itself
    shifted by P, for every P up to MAX_LAYER_NODES."""
    import numpy as np

    fwd = _forward(a)
    n = len(fwd)
    if n < 2 * MIN_LAYER_NODES:
        return None
    kinds: dict[tuple[str, int], int] = {}
    codes = np.array([kinds.setdefault((a.graph.nodes[i].op_type, len(a.graph.nodes[i].inputs)), len(kinds))
                      for i in fwd])
    runs: list[tuple[int, int, int]] = []  # (run length, period, start)
    for period in range(MIN_LAYER_NODES, min(MAX_LAYER_NODES, n // 2) + 1):
        same = np.concatenate(([0], (codes[:-period] == codes[period:]).astype(np.int8), [0]))
        edges = np.flatnonzero(np.diff(same))
        if len(edges) < 2:
            continue
        lengths = edges[1::2] - edges[::2]
        k = int(np.argmax(lengths))
        if lengths[k] >= period:  # at least two whole repeats
            runs.append((int(lengths[k]), period, int(edges[2 * k])))
    if not runs:
        return None
    longest = max(length + period for length, period, _ in runs)
    length, period, start = min((r for r in runs if r[0] + r[1] >= 0.9 * longest), key=lambda r: r[1])
    count = (length + period) // period
    regions = [Region(f"layer.{k}", set(fwd[start + k * period:start + (k + 1) * period])) for k in range(count)]
    plan = Plan(regions, "layers", decisions=region_decisions(a, regions))
    plan.notes.append(f"{count} repeated layers of {period} forward nodes detected from the graph's structure "
                      "(no layer names in the graph)")
    return plan


def sqrt_regions(a: Analysis, segments: int | None = None) -> Plan:
    """About sqrt(n) segments of the forward pass, cut where few bytes cross (Chen et al. 2016)."""
    fwd = _forward(a)
    n = len(fwd)
    k = segments or max(1, round(math.sqrt(n)))
    crossing = _crossing_bytes(a, fwd)
    cuts: list[int] = []
    window = max(1, n // (4 * k))
    for s in range(1, k):
        ideal = s * n // k
        lo, hi = max(cuts[-1] + 1 if cuts else 1, ideal - window), min(n - 1, ideal + window)
        if lo > hi:
            continue
        cuts.append(min(range(lo, hi + 1), key=lambda p: (crossing[p], abs(p - ideal))))
    bounds = [0] + cuts + [n]
    regions = [Region(f"segment.{s}", set(fwd[bounds[s]:bounds[s + 1]]))
               for s in range(len(bounds) - 1) if bounds[s + 1] > bounds[s]]
    plan = Plan(regions, "sqrt", decisions=region_decisions(a, regions))
    plan.notes.append(f"{len(regions)} segments of ~{n // max(1, len(regions))} forward nodes, "
                      "cut where the fewest activation bytes cross")
    return plan


def _crossing_bytes(a: Analysis, fwd: list[int]) -> list[int]:
    """crossing[p]: bytes of forward tensors made before position p and read at or after it."""
    pos = {i: p for p, i in enumerate(fwd)}
    delta = [0] * (len(fwd) + 1)
    for i in fwd:
        for t in a.graph.nodes[i].outputs:
            readers = [pos[c] for c in a.graph.consumers.get(t, ()) if c in pos]
            info = a.tensors.get(t)
            if readers and info is not None and info.nbytes:
                delta[pos[i] + 1] += info.nbytes
                delta[max(readers) + 1] -= info.nbytes
    out, run = [], 0
    for d in delta:
        run += d
        out.append(run)
    return out


def default_regions(a: Analysis) -> Plan:
    """One region per repeated layer if the graph has any, else sqrt(n) segments."""
    plan = layer_regions(a)
    if plan is not None:
        return plan
    plan = sqrt_regions(a)
    plan.notes.insert(0, "no repeated layers detected")
    return plan


def regions_from_plan(a: Analysis, data: dict[str, Any]) -> Plan:
    names = {a.graph.nodes[i].name: i for i in _forward(a)}
    all_names = {n.name for n in a.graph.nodes}
    regions = []
    for k, r in enumerate(data["regions"]):
        name = str(r.get("name", f"region.{k}"))
        nodes: set[int] = set()
        for node_name in r.get("nodes", []):
            if node_name not in names:
                why = "is a backward node" if node_name in all_names else "is not in the graph"
                raise UsageError(f"plan region '{name}': node '{node_name}' {why}")
            nodes.add(names[node_name])
        if "match" in r:
            match = _matcher(r["match"])
            found = {i for n, i in names.items() if match(n)}
            if not found:
                raise UsageError(f"plan region '{name}': pattern '{r['match']}' matches no forward node")
            nodes |= found
        keep = set(r.get("keep", []))
        for t in keep:
            if t not in a.graph.producer:
                raise UsageError(f"plan region '{name}': keep '{t}' is not a tensor made by a node")
            if nodes and a.graph.producer[t] not in nodes:
                raise UsageError(f"plan region '{name}': keep '{t}' is made outside the region")
        if not nodes:
            raise UsageError(f"plan region '{name}' has no nodes")
        twice = set(r.get("twice", []))
        for t in twice:
            if a.graph.producer.get(t) not in nodes:
                raise UsageError(f"plan region '{name}': twice '{t}' is not a tensor made in the region")
        regions.append(Region(name, nodes, keep, twice))
    return Plan(regions, str(data.get("strategy", "plan file")), decisions=region_decisions(a, regions))
