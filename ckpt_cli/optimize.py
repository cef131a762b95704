"""``--ort-optimize cpu|cuda``: ONNX Runtime's own offline optimization of a rewritten graph.

Part of the save stage: the rewritten model is written to a folder, ORT optimizes it at
ORT_ENABLE_EXTENDED for the target provider (``optimized_model_filepath``, in a child
process, so a provider that cannot start gives one line, not ORT's log), and the file ORT
wrote is loaded back through ckpt's load and analysis.

ORT writes its graph in its DEFAULT order and drops node metadata. Every node is put back
where the rewrite scheduled it: a node ORT kept has its name, a fused node takes the place
(and the ``ckpt.*`` tags: recompute source, region, phase, guard) of the rewritten node that
produced one of its outputs. The result is sorted by those places and normalised through
PRIORITY_BASED, so under the recorded settings (ORT_DISABLE_ALL) the executed order is the
file order, and re-simulated: the prediction describes ORT's fused graph.
"""

from __future__ import annotations

import heapq
import json
import os
import sys
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence, cast

import onnx

from .analysis import Analysis, analyse
from .analysis.cost import node_cost
from .errors import ModelError, RunFailed, RuntimeUnavailable
from .io.external import external_tensors
from .graph import ABSENT, Graph
from .io.load import load_graph
from .markers import GUARD_META, PIN_META, PROVENANCE_PREFIX, SessionPlan, is_recompute_copy
from .ops import DEVICE_COPY_OPS, is_recomputable
from .options import DEFAULT_TIMEOUT_S
from .rewrite import RewriteResult
from .rewrite.order import executed_order
from .ort import child
from .io.save import build_model, save_model

LEVEL = "ORT_ENABLE_EXTENDED"
PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}

# Runs in a child: ORT logs to the process's stderr, and a provider library that fails to
# load must end in one line, not a log or a crash of ckpt itself.
_CHILD = r"""
import json, sys
specs = json.loads(sys.argv[1])
def say(answer):
    print(json.dumps(answer), flush=True)
try:
    import onnxruntime as ort
except Exception as e:
    for _ in specs:
        say({"ok": False, "kind": "load_failed", "message": f"cannot import onnxruntime: {e}"})
    sys.exit()
def optimize(spec):
    if spec["provider"] not in ort.get_available_providers():
        return {"ok": False, "kind": "provider_unavailable", "message": f"this onnxruntime build has no {spec['provider']}"}
    so = ort.SessionOptions()
    so.log_severity_level = 4
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, spec["level"])
    so.optimized_model_filepath = spec["output"]
    if spec["external"]:
        so.add_session_config_entry("session.optimized_model_external_initializers_file_name", spec["external"])
        so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    try:
        s = ort.InferenceSession(spec["model"], so, providers=[spec["provider"]])
    except Exception as e:
        first = next((l for l in str(e).splitlines() if l.strip()), type(e).__name__)
        return {"ok": False, "kind": "load_failed", "message": first[:300]}
    ran = s.get_providers()
    if ran[0] != spec["provider"]:
        return {"ok": False, "kind": "provider_unavailable",
                "message": f"ONNX Runtime could not create {spec['provider']} here and fell back to {ran[0]}"}
    return {"ok": True, "onnxruntime": ort.__version__}
for spec in specs:
    say(optimize(spec))
"""


@dataclass
class Optimized:
    """A rewrite after ORT's optimization: what to write, and what the report says of it."""

    model: onnx.ModelProto  # external data (if any) relative to the folder it was made in
    result: RewriteResult  # the rewrite's figures for the optimized graph
    provider: str
    onnxruntime: str
    nodes_before: int
    fused_ops: dict[str, int]  # contrib ops ORT made, by type
    guards_before: int
    guards_after: int  # guard nodes still in the graph (ORT folds Constants, merges Reshapes)
    not_recomputable: dict[str, int] = field(default_factory=dict)  # forward ops ckpt keeps, by type

    @property
    def external(self) -> bool:
        return bool(external_tensors(self.model))

    def to_json(self) -> dict[str, Any]:
        return {"provider": self.provider, "level": LEVEL, "onnxruntime": self.onnxruntime,
                "nodes_before": self.nodes_before, "nodes_after": len(self.result.graph.nodes),
                "fused_ops": self.fused_ops, "guard_nodes_before": self.guards_before,
                "guard_nodes_after": self.guards_after, "not_recomputable": self.not_recomputable}


def run_ort_optimizer(model_path: Path, output: Path, provider: str, external: str | None = None,
                      level: str = LEVEL, timeout: float | None = DEFAULT_TIMEOUT_S,
                      python: str | None = None) -> str:
    """Let ORT optimize ``model_path`` into ``output`` for ``provider`` ("cpu"/"cuda") at
    ``level``, under the interpreter ``python`` (None: this one); returns ORT's version. Raises RuntimeUnavailable when the provider cannot
    start, RunFailed (exit 5) when the child runs past ``timeout`` seconds (its whole process
    group is killed) or ends without an answer."""
    outcome = run_ort_optimizers([(model_path, output, external)], provider, level, timeout, python)[0]
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


OptimizerJob = tuple[Path, Path, str | None]  # model, output, external data file name (None: none)


def run_ort_optimizers(jobs: Sequence[OptimizerJob], provider: str, level: str = LEVEL,
                       timeout: float | None = DEFAULT_TIMEOUT_S, python: str | None = None
                       ) -> list[str | ModelError | RuntimeUnavailable]:
    """``run_ort_optimizer`` of each job in one child, which starts the interpreter and ORT
    once (most of a small model's run): per job ORT's version, or the error that job's own
    run raises. The child may take ``timeout`` seconds per job; past that, or ending without
    every answer, it raises RunFailed for all."""
    specs = [{"model": str(model), "output": str(output), "provider": PROVIDERS[provider], "level": level,
              "external": external} for model, output, external in jobs]
    what = "ONNX Runtime's optimization"
    limit = None if timeout is None else timeout * len(jobs)
    done = child.run_child([python or sys.executable, "-c", _CHILD, json.dumps(specs)], dict(os.environ), limit, what)
    lines = [line for line in done.stdout.splitlines() if line.strip()][-len(jobs):]
    try:
        answers = [child.parse_json_line(line) for line in lines]
        if len(answers) < len(jobs):
            raise ValueError("an answer is missing")
    except (ValueError, RecursionError) as e:
        tail = child.printable(" | ".join(done.stderr.strip().splitlines()[-3:]), 300)
        raise RunFailed("crashed", f"{what} gave no result ({child.how_it_ended(done.returncode)})"
                        + (f": {tail}" if tail else ""), done.stderr) from e
    return [_optimizer_outcome(child.checked_answer(answer, what), provider) for answer in answers]


def _optimizer_outcome(answer: dict[str, Any], provider: str) -> str | ModelError | RuntimeUnavailable:
    if answer["ok"]:
        return str(answer.get("onnxruntime", "?"))
    message = child.printable(str(answer.get("message", "")))
    if answer.get("kind") == "provider_unavailable":
        return RuntimeUnavailable("provider_unavailable", f"--ort-optimize {provider}: {message}")
    return ModelError(f"ONNX Runtime cannot optimize the rewritten model: {message}")


def ort_optimize(rewritten: onnx.ModelProto, result: RewriteResult, before: Analysis, provider: str,
                 folder: Path, source_dir: Path | None, timeout: float | None = DEFAULT_TIMEOUT_S) -> Optimized:
    """Optimize ``rewritten`` (the model of ``result``) with ORT for ``provider`` in ``folder``
    and bring the tags, order and prediction back. ``before`` is the analysis of the input
    (its loss and gradient outputs classify the optimized graph). The model's metadata is
    kept, with the figures of the optimized graph. ORT's child may run ``timeout`` seconds."""
    src = folder / "rewritten.onnx"
    written = save_model(rewritten, src, source_dir=source_dir, force=True)
    out = folder / "optimized.onnx"
    version = run_ort_optimizer(src, out, provider, "optimized.data" if len(written) > 1 else None, timeout=timeout)
    _drop_device_copies(out)
    loaded = load_graph(out)
    graph, guards = _restore(loaded, result.graph)
    after = analyse(graph, loss=before.phases.loss, grad_outputs=list(before.phases.grad_outputs),
                    reuse_buffers=result.mem_reuse)
    unsized = after.unsized
    if unsized:
        raise ModelError(f"ORT's optimized graph has tensors of unknown size (e.g. {next(iter(unsized))})")
    copies = [n for n in graph.nodes if is_recompute_copy(n)]
    flops = sum(node_cost(n, after.tensors).flops for n in copies)
    # fresh.py's hidden shapes are ORT's to re-infer in its output: not claimed for it
    new = replace(result, graph=graph, after=after, recompute_nodes=len(copies), recompute_flops=flops, fresh=None)
    recorded = replace(SessionPlan.read(rewritten), ort_optimize={"provider": provider, "level": LEVEL,
                                                                   "onnxruntime": version})
    figures = {**{p.key: p.value for p in rewritten.metadata_props}, **recorded.to_metadata(),
               PROVENANCE_PREFIX + "recompute_nodes": str(len(copies)),
               PROVENANCE_PREFIX + "recompute_flops": str(flops),
               PROVENANCE_PREFIX + "predicted_peak_bytes": str(after.priority.peak_bytes)}
    if guards:
        figures[PIN_META] = str(guards)
    model = build_model(graph, [n.proto for n in graph.nodes], figures)
    _keep_used_opsets(model)
    fused = Counter(n.op_type for n in graph.nodes if n.domain not in ("", "ai.onnx"))
    kept = Counter(n.op_type for n in graph.nodes if after.phases.is_forward[n.index] and not is_recomputable(n))
    return Optimized(model, new, provider, version, len(result.graph.nodes), dict(sorted(fused.items())),
                     result.guard_nodes, guards, dict(sorted(kept.items())))


def _drop_device_copies(path: Path) -> int:
    """Remove the Memcpy nodes ORT wrote for a GPU provider (not ONNX ops; ORT places them
    again at load). ORT renames the copied tensor (``x_CUDAExecutionProvider``) and gives the
    copy its name; the producer gets the name back, so every tensor keeps the name (and the
    size) the rewrite gave it. Returns how many copies there were."""
    model = onnx.load(str(path), load_external_data=False)
    graph = model.graph
    copies = [n for n in graph.node if n.op_type in DEVICE_COPY_OPS and n.domain in ("", "ai.onnx")]
    if not copies:
        return 0
    produced = {t for n in graph.node for t in n.output}
    outside = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    outputs = {o.name for o in graph.output}
    rename: dict[str, str] = {}  # tensor -> the name it takes
    dropped = set()
    for n in copies:
        src, dst = n.input[0], n.output[0]
        if src in produced and src not in outside and src not in outputs:
            rename[src] = dst  # the producer writes the copy's (the rewrite's) name
            dropped.add(id(n))
        elif dst not in outputs:
            rename[dst] = src  # a graph input or initializer: readers read it directly
            dropped.add(id(n))
        else:
            n.op_type, n.domain = "Identity", ""  # input to output: keep both names

    def final(name: str) -> str:
        seen = set()
        while name in rename and name not in seen:
            seen.add(name)
            name = rename[name]
        return name

    keep = [n for n in graph.node if id(n) not in dropped]
    for n in keep:
        for k, name in enumerate(n.input):
            n.input[k] = final(name)
        for k, name in enumerate(n.output):
            n.output[k] = final(name)
    del graph.node[:]
    graph.node.extend(keep)
    kept_info = [v for v in graph.value_info if v.name not in rename]
    del graph.value_info[:]
    graph.value_info.extend(kept_info)
    onnx.save(model, str(path))
    return len(copies)


def _tags(proto: onnx.NodeProto) -> list[tuple[str, str]]:
    return [(p.key, p.value) for p in proto.metadata_props if p.key.startswith(PROVENANCE_PREFIX)]


def _restore(optimized: Graph, rewritten: Graph) -> tuple[Graph, int]:
    """``optimized`` in the rewrite's order, with the rewrite's node tags; and how many guard
    nodes it holds. A node ORT kept is found by its name; a fused node by the rewritten node
    that produced one of its outputs (the earliest), whose place and tags it takes."""
    by_name = {n.name: n for n in rewritten.nodes}
    place: list[float | None] = []
    source = []
    for node in optimized.nodes:
        kept = by_name.get(node.name)
        if kept is None or kept.op_type != node.op_type:
            producers = [rewritten.producer[t] for t in node.outputs if t != ABSENT and t in rewritten.producer]
            kept = rewritten.nodes[min(producers)] if producers else None
        source.append(kept)
        place.append(float(kept.index) if kept is not None else None)
    # A node with no counterpart (new outputs only) runs just before its first reader.
    succs = optimized.succs
    for i in reversed(optimized.topological_order()):
        if place[i] is None:
            later = [p for p in (place[j] for j in succs[i]) if p is not None]
            place[i] = min(later) - 0.5 if later else float(len(rewritten.nodes))
    order = _sorted_by(optimized, cast(list[float], place))  # every place is set by now
    protos = []
    for i in order:
        node, kept = optimized.nodes[i], source[i]
        p = onnx.NodeProto()
        p.CopyFrom(node.proto)
        have = {e.key for e in p.metadata_props}
        for key, value in (_tags(kept.proto) if kept is not None else []):
            if key not in have:
                entry = p.metadata_props.add()
                entry.key, entry.value = key, value
        protos.append(p)
    graph = executed_order(optimized.with_nodes(protos))
    guards = sum(n.meta(GUARD_META) is not None for n in graph.nodes)
    return graph, guards


def _sorted_by(graph: Graph, place: list[float]) -> list[int]:
    """A topological order that takes, among ready nodes, the one with the lowest place."""
    indegree = [len(p) for p in graph.preds]
    ready = [(place[i], i) for i, d in enumerate(indegree) if d == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, i = heapq.heappop(ready)
        order.append(i)
        for j in graph.succs[i]:
            indegree[j] -= 1
            if indegree[j] == 0:
                heapq.heappush(ready, (place[j], j))
    return order


def _keep_used_opsets(model: onnx.ModelProto) -> None:
    """ORT lists every domain it knows; keep the ONNX domain and those the nodes use."""
    used = {n.domain for n in model.graph.node} | {"", "ai.onnx"}
    kept = [o for o in model.opset_import if o.domain in used]
    del model.opset_import[:]
    model.opset_import.extend(kept)
