"""Report data: plain JSON-ready dicts, the source of truth for every rendering.

A report is a ``Report`` (its keys are described in ``schema.json``, which the tests hold
every report to); the rows and sections this module builds whole are ``TypedDict``s."""

from __future__ import annotations

import hashlib
import platform
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from onnx import ModelProto, TensorProto

from ..analysis import Analysis, buffer_bytes, default_order, lowest_peak
from ..analysis.scopes import UNSCOPED, top_scope
from ..graph import gc_paused
from ..markers import REGION_META, is_recompute_copy
from ..ops import KERNEL_DEFECT_OPS, declarations, ort_kernel_defects, thread_racing_outputs
from ..ort.registry import ort_only_ops
from ..planning.budget import Planned
from ..rewrite import RewriteResult
from ..rewrite.fresh import FreshResult
from ..rewrite.mem_pattern import PatternOff
from ..rewrite.pin import PinResult
from ..version import __version__
from .headline import check_headline, headline

SCHEMA_VERSION = 1
TOP_STASHED = 15

# A report, or a section of one, as JSON: its keys are schema.json's. The command's options
# (``Options``) are the command's own, each command's different.
Report = dict[str, Any]
Options = dict[str, Any]


class DimValue(TypedDict):
    value: int
    source: str  # "default" (ckpt chose it) or "given"


class ReducedPrecision(TypedDict):
    dtypes: list[str]
    cpu: str


class StashedRow(TypedDict):
    name: str
    shape: list[int | str] | None
    dtype: str
    bytes: int | None
    producer: str | None
    producer_op: str | None
    scope: str


class ScopeRow(TypedDict):
    scope: str
    stashed_bytes: int
    tensors: int


class FloorRow(TypedDict):
    bytes: int
    node: str | None
    working_bytes: int
    scratch_bytes: int
    resident_bytes: int
    output_bytes: int
    share_of_peak: float | None


class TwiceRow(TypedDict):
    tensor: str
    placed_before: str


class RegionRow(TypedDict):
    name: str
    nodes: int
    recompute_nodes: int
    freed_bytes: int
    recompute_flops: int
    placed_before: str | None
    kept_random: list[str]
    kept_subgraph: list[str]
    recomputed_twice: NotRequired[list[TwiceRow]]  # only where the plan makes a tensor twice


class ArenaFigures(TypedDict):
    arena_in_use_bytes: int
    arena_held_bytes: int
    ort_peak_bytes: int


class PinRow(TypedDict):
    guard_nodes: int
    guarded_inputs: int
    tied_outputs: int
    blocks: int
    fresh_tensors: int
    fresh_nodes: int
    skipped: str | None


class UnsizedRow(TypedDict):
    tensor: str
    missing_dims: list[str]


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def ort_version() -> str | None:
    """The installed onnxruntime's version, read from its package metadata (importing
    onnxruntime only for this would slow every command)."""
    return ort_release()[1]


def ort_release() -> tuple[str | None, str | None]:
    """The installed onnxruntime's distribution and version (None, None when none is)."""
    from importlib import metadata

    for dist in ("onnxruntime-gpu", "onnxruntime", "onnxruntime-training", "onnxruntime-training-cpu"):
        try:
            return dist, metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None, None


# The ONNX Runtime releases (major.minor) the memory model's predictions were measured
# against, and the distribution each holds for: 1.31 (inference builds, CPU and CUDA) and
# 1.19's training build (the 1.19 inference build measures the gpt sample's rewrite 11.7%
# above its prediction).
VALIDATED_ORT = {"1.31": "onnxruntime", "1.19": "onnxruntime-training"}


def ort_version_warning(dist: str | None, version: str | None) -> str | None:
    """One line to warn with when ``version`` of ``dist`` (the installed onnxruntime, as
    ``ort_release`` reads it) is not a release the memory model was validated on; None when
    it is, or when none is installed."""
    if version is None:
        return None
    validated = VALIDATED_ORT.get(".".join(version.split(".")[:2]))
    if validated is not None and (dist or "onnxruntime").startswith(validated):
        return None
    names = "; ".join(f"{release} {d.removeprefix('onnxruntime').lstrip('-') or 'any build'}"
                      for release, d in VALIDATED_ORT.items())
    return (f"ckpt: warning: {dist or 'onnxruntime'} {version} is not a release ckpt's memory model is validated "
            f"on ({names}): predicted peaks may differ from what it holds")


@dataclass(frozen=True)
class Source:
    """The model a report is about: its path (or a label for an in-memory model) and hash."""

    label: str
    sha256: str

    @classmethod
    def of_file(cls, path: str | Path) -> "Source":
        return cls(str(path), file_sha256(path))

    @classmethod
    def of_proto(cls, model: ModelProto) -> "Source":
        from ..io.serialize import write_model

        digest = hashlib.sha256()
        write_model(model, digest.update)
        return cls("<in-memory model>", digest.hexdigest())


def envelope(command: str, source: Source | None, options: Options) -> Report:
    """The fields every report starts with."""
    head: Report = {
        "schema_version": SCHEMA_VERSION,
        "command": command,
        "ckpt_version": __version__,
        "ort_version": ort_version(),
        "python": platform.python_version(),
        "options": options,
    }
    if source is not None:
        head["model"] = source.label
        head["model_sha256"] = source.sha256
    return head


def model_facts(a: Analysis) -> Report:
    """What the figures rest on: the symbolic dimension values, and the ONNX-domain ops
    accepted because ONNX Runtime registers them where onnx does not."""
    return {
        "dims": {d: DimValue(value=v, source="default" if d in a.default_dims else "given") for d, v in a.dims},
        "ort_registered_ops": ort_only_ops(a.graph.model),
        "reduced_precision": reduced_precision(a),
        "ort_kernel_defects": _kernel_defects(a),
        "thread_racing_outputs": _racing_outputs(a),
    }


def _kernel_defects(a: Analysis) -> list[str]:
    nodes = [n.proto for n in a.graph.nodes if n.op_type in KERNEL_DEFECT_OPS]
    return ort_kernel_defects(nodes, declarations(a.graph.model.graph) if nodes else None)


def _racing_outputs(a: Analysis) -> list[str]:
    """``thread_racing_outputs`` of ``a``'s graph; a graph without a ScatterND (most) has
    none, told by the indexed op types instead of a walk of every proto."""
    if not any(n.op_type == "ScatterND" for n in a.graph.nodes):
        return []
    return thread_racing_outputs((n.proto for n in a.graph.nodes), a.graph.outputs)


# ONNX Runtime's CPU provider has float16 kernels for few ops: it runs the others in float32
# between Casts it inserts, rounding to float16 only where its Casts sit, and places them by
# each node's neighbours. A rewrite gives nodes new neighbours, so on CPU the rounding moves.
CPU_FLOAT16_NOTE = ("ONNX Runtime's CPU provider runs ops without {dtype} kernels in float32 and rounds only "
                    "where it inserts Casts; a rewrite moves those points, so on CPU its results can differ "
                    "from the original's in the last {dtype} bits, and `ckpt check` on CPU fails it (check on CUDA)")
# bfloat16 gets no such Casts: the CPU provider has no bfloat16 kernel for most ops (Mul, MatMul,
# Add, Tanh...) and refuses the session (NOT_IMPLEMENTED), at every optimization level.
CPU_BFLOAT16_NOTE = ("ONNX Runtime's CPU provider has no bfloat16 kernels for most ops (Mul, MatMul, Add...) "
                     "and refuses to load such a model; run and check it on CUDA")


def reduced_precision(a: Analysis) -> ReducedPrecision | None:
    """The float16/bfloat16 types the graph computes in, and what that means on CPU."""
    names: dict[int, str] = {TensorProto.FLOAT16: "float16", TensorProto.BFLOAT16: "bfloat16"}
    found = sorted({names[t.dtype] for t in a.tensors.values() if t.dtype in names})
    if not found:
        return None
    notes = [CPU_BFLOAT16_NOTE] if "bfloat16" in found else []
    if "float16" in found:
        notes.insert(0, CPU_FLOAT16_NOTE.format(dtype="float16"))
    return ReducedPrecision(dtypes=found, cpu="; ".join(notes))


def stashed_rows(a: Analysis, limit: int | None = TOP_STASHED) -> list[StashedRow]:
    """Stashed activations, one row per buffer, largest first."""
    seen: dict[str, StashedRow] = {}
    for s in a.stashed:
        row = seen.get(s.buffer)
        if row is not None:
            continue
        owner = a.graph.nodes[a.graph.producer[s.buffer]] if s.buffer in a.graph.producer else None
        info = a.tensors.get(s.buffer)
        seen[s.buffer] = StashedRow(
            name=s.buffer,
            shape=list(info.shape) if info is not None and info.shape is not None else None,
            dtype=info.dtype_name if info is not None else "?",
            bytes=info.nbytes if info is not None else None,
            producer=owner.name if owner else None,
            producer_op=owner.op_type if owner else None,
            scope=a.scopes[owner.index].replace("/", ".") if owner else UNSCOPED,
        )
    rows = sorted(seen.values(), key=lambda r: (-(r["bytes"] or 0), r["name"]))
    return rows if limit is None else rows[:limit]


def scope_rows(a: Analysis) -> list[ScopeRow]:
    """Stashed activation bytes grouped by layer-level scope, in forward order."""
    groups: dict[str, set[str]] = defaultdict(set)
    first: dict[str, int] = {}
    for s in a.stashed:
        scope = top_scope(a.scopes[s.producer]).replace("/", ".") or "(no scope)"
        groups[scope].add(s.buffer)
        first.setdefault(scope, s.producer)
    return [ScopeRow(scope=k, stashed_bytes=buffer_bytes(v, a.tensors), tensors=len(v))
            for k, v in sorted(groups.items(), key=lambda kv: first[kv[0]])]


def boundary_step(a: Analysis, order: tuple[int, ...]) -> int | None:
    """Position in ``order`` of the first backward node."""
    return next((k for k, i in enumerate(order) if not a.phases.is_forward[i]), None)


@gc_paused
def inspect_report(a: Analysis, source: Source | None, options: Options) -> Report:
    g = a.graph
    param_bytes = buffer_bytes(g.resident, a.tensors)
    default = default_order(a)
    return {
        **envelope("inspect", source, options),
        "headline": headline(a.priority.peak_bytes),
        **model_facts(a),
        "nodes": len(g.nodes),
        "forward_nodes": a.phases.forward_count,
        "backward_nodes": a.phases.backward_count,
        "loss": a.phases.loss,
        "forward_outputs": list(a.phases.forward_outputs),
        "gradient_outputs": len(a.phases.grad_outputs),
        "phases": {n.name: a.phases.phase(n.index) for n in g.nodes},
        "resident_bytes": param_bytes,
        "stashed_bytes": a.stashed_bytes,
        "stashed_tensors": len({s.buffer for s in a.stashed}),
        "peak_bytes": a.priority.peak_bytes,
        "peak_node": g.nodes[a.priority.order[a.priority.peak_step]].name,
        "peak_bytes_ort_default": default.peak_bytes,
        # what a process-peak measurement sees: kernel working memory outside ORT's allocator too
        "peak_bytes_with_kernel_scratch": a.working_peak_bytes,
        "floor": floor_row(a),
        **_arena(a),
        "forward_flops": a.forward_flops,
        "backward_flops": a.backward_flops,
        # ckpt's copies already in the graph (a model ckpt wrote): compare reads its share
        "recompute_nodes": sum(1 for n in g.nodes if is_recompute_copy(n)),
        "recompute_flops": a.recompute_flops,
        "top_stashed": stashed_rows(a),
        "scopes": scope_rows(a),
        "unsized": unsized_rows(a),
        "timeline": {
            "priority_based": list(a.priority.timeline),
            "ort_default": list(default.timeline),
            "backward_starts_at": boundary_step(a, a.priority.order),
        },
    }


def floor_row(a: Analysis) -> FloorRow:
    """The peak no order or recompute plan goes below, and what sets it."""
    f = lowest_peak(a)
    return FloorRow(bytes=f.bytes, node=f.node, working_bytes=f.working_bytes, scratch_bytes=f.scratch_bytes,
                    resident_bytes=f.resident_bytes, output_bytes=f.output_bytes,
                    share_of_peak=round(f.bytes / a.working_peak_bytes, 4) if a.working_peak_bytes else None)


def _region_rows(before: Analysis, result: RewriteResult, after: Analysis) -> list[RegionRow]:
    still = {s.buffer for s in after.stashed}
    freed_by: dict[int, set[str]] = defaultdict(set)  # producer -> stashed buffers no longer stashed
    for b, p in {s.buffer: s.producer for s in before.stashed}.items():
        if b not in still:
            freed_by[p].add(b)
    name_to_index = {n.name: n.index for n in before.graph.nodes}
    flops: dict[str | None, int] = defaultdict(int)  # by region (a copy without one: None)
    for n in after.graph.nodes:
        if is_recompute_copy(n):
            flops[n.meta(REGION_META)] += after.costs[n.index].flops  # priced when the written graph was analysed
    rows = []
    for r in result.regions:
        freed: set[str] = set().union(*(freed_by[name_to_index[c]] for c in r.copies))
        row = RegionRow(
            name=r.name,
            nodes=r.nodes,
            recompute_nodes=len(r.copies),
            freed_bytes=buffer_bytes(freed, before.tensors),
            recompute_flops=flops.get(r.name, 0),
            placed_before=r.placed_before,
            kept_random=r.kept_random,
            kept_subgraph=r.kept_subgraph,
        )
        if r.twice:  # the key only where the plan makes a tensor twice: other rows read as before
            row["recomputed_twice"] = [TwiceRow(tensor=t, placed_before=b) for t, b in r.twice]
        rows.append(row)
    return rows


def _arena(a: Analysis) -> ArenaFigures:
    """What ORT's CPU arena will report for the PRIORITY_BASED order: bytes in use at the
    peak (the profiler's mem_bytes_in_use: activations, outputs and small initializers,
    rounded and fragmented as the arena does) and bytes it reserves."""
    arena = a.replayed
    return ArenaFigures(arena_in_use_bytes=arena.peak_in_use_bytes, arena_held_bytes=arena.held_bytes,
                        ort_peak_bytes=a.ort_peak_bytes)


def _side(a: Analysis) -> Report:
    return {
        **_arena(a),
        "peak_bytes": a.priority.peak_bytes,
        "stashed_bytes": a.stashed_bytes,
        "nodes": len(a.graph.nodes),
        "forward_nodes": a.phases.forward_count,
        "backward_nodes": a.phases.backward_count,
        "timeline": list(a.priority.timeline),
        "backward_starts_at": boundary_step(a, a.priority.order),
        "scopes": scope_rows(a),
    }


@gc_paused
def rewrite_report(before: Analysis, source: Source | None, result: RewriteResult, output: str | None,
                   plan_json: Report | None, plan_notes: list[str], settings_snippet: str, options: Options) -> Report:
    """``result``'s report: its ``after`` is the written graph's full analysis (``rewrite.written``)."""
    after = result.after
    assert isinstance(after, Analysis), "rewrite.written analyses the graph to be written in full"
    step_flops = before.forward_flops + before.backward_flops
    return {
        **envelope("rewrite", source, options),
        "headline": headline(before.priority.peak_bytes, result.after.priority.peak_bytes),
        **model_facts(before),
        "output": output,
        "strategy": plan_json["strategy"] if plan_json else "reorder only",
        "plan_notes": plan_notes,
        "regions": _region_rows(before, result, after),
        "before": _side(before),
        "after": _side(after),
        "recompute_nodes": result.recompute_nodes,
        "recompute_flops": result.recompute_flops,
        "forward_flops": before.forward_flops,
        "step_flops": step_flops,
        "recompute_share_of_forward": result.recompute_flops / before.forward_flops if before.forward_flops else 0.0,
        "recompute_share_of_step": result.recompute_flops / step_flops if step_flops else 0.0,
        "session_settings": settings_snippet,
        "enable_mem_reuse": result.mem_reuse,
        "pin": _pin_row(result.pinned, result.fresh),
        "mem_pattern_off": result.pattern_off.to_json() if result.pattern_off is not None else None,
        "mem_pattern_advice": _advice(result.pattern_advice),
        "no_gain_reason": result.no_gain_reason,
        "warning": result.warning,
        "plan": plan_json,
        "unsized": unsized_rows(before),
    }


def _pin_row(pinned: PinResult | None, fresh: FreshResult | None) -> PinRow | None:
    """What holding the order in the data flow added (None: written with --no-pin), and the
    fresh tensors' guards (rewrite/fresh.py)."""
    if pinned is None:
        return None
    return PinRow(guard_nodes=pinned.guard_nodes, guarded_inputs=pinned.guarded_inputs,
                  tied_outputs=pinned.tied_outputs, blocks=pinned.blocks,
                  fresh_tensors=len(fresh.fresh) if fresh is not None else 0,
                  fresh_nodes=fresh.guard_nodes if fresh is not None else 0, skipped=pinned.skipped)


def unsized_rows(a: Analysis) -> list[UnsizedRow]:
    """Tensors of unknown size (data-dependent shapes): every byte figure counts them as 0."""
    return [UnsizedRow(tensor=t, missing_dims=list(m)) for t, m in sorted(a.unsized.items())]


def check_report(original: Source, rewritten: Source, figures: Report, options: Options) -> Report:
    head = envelope("check", original, options)
    head["rewritten_model"] = rewritten.label
    head["rewritten_sha256"] = rewritten.sha256
    return {**head, "headline": check_headline(figures), **figures}


def planning_section(a: Analysis, planned: Planned, result: RewriteResult, rows: list[Report]) -> Report:
    """Figures of a plan: its budget, predicted effect and why each activation is kept or not."""
    step = a.forward_flops + a.backward_flops
    search = planned.search
    return {
        "strategy": planned.plan.strategy if planned.plan else "none",
        "budget_bytes": planned.budget,
        "budget_met": None if planned.budget is None else result.after.ort_peak_bytes <= planned.budget,
        "evaluations": search.evaluations if search else None,
        "peak_bytes_before": a.priority.peak_bytes,
        "peak_bytes_after": result.after.priority.peak_bytes,
        "ort_peak_bytes_before": a.ort_peak_bytes,
        "ort_peak_bytes_after": result.after.ort_peak_bytes,
        "raises_peak": result.after.priority.peak_bytes > a.priority.peak_bytes,
        "recompute_flops": result.recompute_flops,
        "recompute_share_of_step": result.recompute_flops / step if step else 0.0,
        "knee": planned.knee.to_json() if planned.knee else None,
        "activation_budget": planned.activation.to_json() if planned.activation else None,
        "plain_session": planned.plain.to_json() if planned.plain else None,
        "module_session": planned.module.to_json() if planned.module else None,
        "explanations": rows,
    }


def plan_report(a: Analysis, source: Source | None, planned: Planned, result: RewriteResult, rows: list[Report],
                output: str | None, options: Options) -> Report:
    plan_json = planned.plan.to_json([n.name for n in a.graph.nodes]) if planned.plan else None
    return {
        **envelope("plan", source, options),
        "headline": headline(a.priority.peak_bytes, result.after.priority.peak_bytes),
        **model_facts(a),
        "output": output,
        **planning_section(a, planned, result, rows),
        "notes": (list(planned.plan.notes) + [n for n in result.notes if n not in planned.plan.notes]
                  if planned.plan else []),
        "regions": [{"name": r["name"], "nodes": len(r["nodes"]), "keep": len(r["keep"])}
                    for r in (plan_json or {}).get("regions", [])],
        "plan": plan_json,
        "no_gain_reason": result.no_gain_reason,
        "unsized": unsized_rows(a),
    }


def _advice(advice: PatternOff | None) -> Report | None:
    """The memory pattern's predicted cost for a graph written unchanged (no input written)."""
    if advice is None:
        return None
    return {k: v for k, v in advice.to_json().items() if k != "input"}


def session_report(model: Path, provider: str, settings: Report, undone: str | None) -> Report:
    """``ckpt session``: the settings a ckpt-written model records (``settings``), and the
    Python that builds them (``session_settings``, the same snippet a rewrite report holds)."""
    from ..ort.settings import settings_snippet

    snippet = settings_snippet(provider, settings["enable_mem_reuse"], str(model), settings["settings"],
                               settings.get("mem_pattern_off_input"), bool(settings.get("enable_cpu_mem_arena", True)))
    return {**envelope("session", Source.of_file(model), {"provider": provider}), "headline": None,
            "provider": provider,
            "settings": settings, "session_settings": snippet, "undone_rewrite": undone}
