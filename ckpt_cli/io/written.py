"""The ModelProto a rewrite is saved as (save stage: the rewrite itself writes nothing)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import onnx

from ..markers import (FRESH_META, GUARD_META, MEM_PATTERN_META, MEM_REUSE_META, PIN_META, PROVENANCE_PREFIX,
                       RECOMPUTE_META, SESSION_META, SessionPlan, is_recompute_copy)
from ..ops import SHAPE_FROM_DECLARATION_OPS
from .save import build_model

if TYPE_CHECKING:
    from ..analysis.scaling import SymbolicShapes
    from ..analysis.shapes import TensorInfo
    from ..rewrite import RewriteResult


def to_model(result: RewriteResult, metadata: dict[str, str] | None = None,
             shapes: SymbolicShapes | None = None) -> onnx.ModelProto:
    """The ModelProto to save: nodes in the written order, and the session setting the
    rewrite chose recorded in the model's metadata (ckpt check and inspect read it),
    with ``metadata`` (provenance) beside it. ``shapes`` gives the value_info shapes of
    tensors whose sizes were taken at values of symbolic dimensions (with the symbols)."""
    shapes = shapes or {}
    plan = SessionPlan(result.mem_reuse, result.session,
                       result.pattern_off.input if result.pattern_off is not None else None,
                       mem_arena=result.mem_arena).to_metadata()
    # the settings first, then what pin and fresh added, then the rest of the plan
    metadata = {**(metadata or {}), **{k: plan[k] for k in (MEM_REUSE_META, SESSION_META)}}
    pinned = result.pinned
    if pinned is not None and pinned.guard_nodes:
        metadata[PIN_META] = str(pinned.guard_nodes)
    fresh = result.fresh
    if fresh is not None and fresh.guard_nodes:
        metadata[FRESH_META] = str(len(fresh.fresh))
    metadata.update(plan)
    model = build_model(result.graph, [n.proto for n in result.graph.nodes], metadata)
    if result.pattern_off is not None:
        model.graph.input.append(pattern_off_input(result.pattern_off.input))
    if fresh is not None and fresh.guard_nodes:
        # ORT merges value_info into the shapes it infers: declaring every other tensor
        # leaves exactly the fresh tensors (and their guard views) unknown to it.
        del model.graph.value_info[:]
        model.graph.value_info.extend(_static_value_info(result, shapes))
    else:
        model.graph.value_info.extend(_copy_value_info(result, shapes))
        _guard_value_info(model, result, shapes)
    return _kernel_shapes_declared(_without_inner_symbols(model, result), result, shapes)


def _guard_value_info(model: onnx.ModelProto, result: RewriteResult, shapes: SymbolicShapes) -> None:
    pinned = result.pinned
    if pinned is not None and pinned.guard_nodes:
        # Guards read shapes from a runtime tensor: onnx inference cannot follow them, so
        # their outputs' types are written out (same as their inputs).
        guarded = {n.outputs[0]: n.inputs[0] for n in result.graph.nodes
                   if n.op_type == "Reshape" and n.meta(GUARD_META) is not None}
        for out, x in guarded.items():
            info = result.after.tensors.get(x)
            if info is not None and info.shape is not None:
                shape = shapes.get(out, shapes.get(x, list(info.shape)))
                model.graph.value_info.append(onnx.helper.make_tensor_value_info(out, info.dtype, shape))


def _without_inner_symbols(model: onnx.ModelProto, result: RewriteResult) -> onnx.ModelProto:
    """``model`` with the shapes dropped from value_info that names a dimension no graph
    input or output has (ORT's ``unk__N``, from the tool that wrote the input's value_info),
    where it recomputes anything: a graph written unchanged keeps the input's value_info,
    which the same session can hold for less (zoo unet does).
    ORT merges a declared symbol into what it infers for the rewrite, where the same name
    need not mean the same size, and its planner then reuses buffers by those names: the
    Module API's untuned session holds the rewrite's buffers longer with them (the commit
    that made this has the measurements)."""
    if not result.recompute_nodes:
        return model
    g = model.graph
    outer = _outer_symbols(g)
    for v in g.value_info:
        t = v.type.tensor_type if v.type.HasField("tensor_type") else None
        if t is not None and t.HasField("shape") and any(d.dim_param and d.dim_param not in outer for d in t.shape.dim):
            t.ClearField("shape")
    return model


def _outer_symbols(g: onnx.GraphProto) -> set[str]:
    """The symbolic dimensions the graph's inputs and outputs name."""
    return {d.dim_param for v in (*g.input, *g.output) if v.type.HasField("tensor_type")
            for d in v.type.tensor_type.shape.dim if d.dim_param}


def _kernel_shapes_declared(model: onnx.ModelProto, result: RewriteResult,
                            shapes: SymbolicShapes) -> onnx.ModelProto:
    """``model`` with a shape declared for every output whose ORT kernel sizes it from the
    declaration (``ops.SHAPE_FROM_DECLARATION_OPS``: without one ORT crashes while making the
    session): the declared or inferred shape, a symbol kept where the graph's inputs or
    outputs name it and left unnamed otherwise (``_without_inner_symbols`` says why)."""
    g = model.graph
    ends = {o.name for o in g.output}
    wanted = [n.outputs[0] for n in result.graph.nodes if n.op_type in SHAPE_FROM_DECLARATION_OPS
              and n.outputs and n.outputs[0] and n.outputs[0] not in ends]
    if not wanted:
        return model
    outer = _outer_symbols(g)
    declared = {v.name: v for v in g.value_info}
    for t in wanted:
        info = result.after.tensors.get(t)
        old = declared.get(t)
        dims = _declared_dims(old) or _inferred_dims(info, shapes.get(t))
        dtype = old.type.tensor_type.elem_type if old is not None else (info.dtype if info is not None else 0)
        if dims is None or not dtype:
            continue
        kept = [d if isinstance(d, int) or d in outer else None for d in dims]
        made = onnx.helper.make_tensor_value_info(t, dtype, kept)
        if old is not None:
            old.CopyFrom(made)
        else:
            g.value_info.append(made)
    return model


def _declared_dims(v: onnx.ValueInfoProto | None) -> list[int | str | None] | None:
    if v is None or not v.type.HasField("tensor_type") or not v.type.tensor_type.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in v.type.tensor_type.shape.dim]


def _inferred_dims(info: TensorInfo | None, symbolic: list[int | str | None] | None) -> list[int | str | None] | None:
    if symbolic is not None:
        return list(symbolic)
    if info is None:
        return None
    if info.ort_shape is not None:
        return list(info.ort_shape)
    return list(info.shape) if info.static_shape and info.shape is not None else None

# The symbols ``unplanned_shapes`` declares, one per dimension, numbered through the file.
UNPLANNED_SYMBOL = "ckpt_unplanned_"


def unplanned_shapes(model: onnx.ModelProto, result: RewriteResult, shapes: SymbolicShapes,
                     sized_at: dict[str, int] | None = None, shared: bool = False) -> tuple[onnx.ModelProto, int]:
    """``model`` with every tensor a node makes (graph outputs aside) declared at its rank,
    each dimension that moves with the symbolic dimensions, or that ckpt cannot size, a
    symbol no other dimension has; and how many dimensions got one (0: the file has no
    symbolic dimension to hide, the model is returned as it is).
    ORT (1.19.2) sizes a tensor before the run only from the graph inputs' symbols: a tensor
    declared by a symbol of its own stays out of the memory pattern, which allocates its
    block again at every run where the arena lays it over the first run's chunks, and its
    allocation planner reuses a buffer only between tensors of equal declared shapes. This
    is the memory pattern and buffer reuse turned off tensor by tensor, from the file,
    where a Module session's options are the user's (``verify/module_choice.py``);
    ``shapes``: the symbolic shapes of ``symbolic_shapes``. With ``sized_at`` (the values the
    symbolic dimensions are sized at), a tensor ckpt's inference no longer sizes once hidden
    keeps its declaration as written (``_sized_again``). With ``shared``, the dimensions
    that move alike (one expression of the symbolic dimensions) share one symbol, fresh.py's
    tensors aside: tensors of one size keep ORT's buffer reuse between them and stay out of
    the pattern (zoo frozen_backbone: under ckpt's settings, where reuse is on, 26.9 MiB
    with a symbol per dimension against 22.9 so, the original 26.8)."""
    g = model.graph
    outputs = {o.name for o in g.output}
    declared = {v.name: v for v in g.value_info}
    made: dict[str, onnx.ValueInfoProto] = {}
    hidden = 0
    alike: dict[str, str] | None = {} if shared else None  # expression -> its symbol
    own = set(result.fresh.fresh) if result.fresh is not None else set()
    for node in result.graph.nodes:
        for t in node.outputs:
            if not t or t in outputs or t in made:
                continue
            typed = _sized_dims(result.after.tensors.get(t), shapes.get(t), declared.get(t))
            if typed is None:
                continue
            dtype, dims = typed
            named: list[int | str] = []
            moving = shapes.get(t) if alike is not None and t not in own else None
            d: int | str | None  # a size, a shared symbol, or none yet
            for k, d in enumerate(dims):
                if d is None and alike is not None and moving is not None and len(moving) == len(dims) \
                        and not isinstance(moving[k], int):
                    d = alike.setdefault(str(moving[k]), f"{UNPLANNED_SYMBOL}alike_{len(alike)}")
                    hidden += 1
                named.append(d if d is not None else f"{UNPLANNED_SYMBOL}{hidden}")
                hidden += d is None
            made[t] = onnx.helper.make_tensor_value_info(t, dtype, named)
    if not hidden:
        return model, 0
    plain = {v.name: _copied(v) for v in g.value_info}
    kept = [v for v in g.value_info if v.name not in made]
    del g.value_info[:]
    g.value_info.extend([*kept, *made.values()])
    if sized_at is not None:
        hidden -= _sized_again(model, made, plain, sized_at)
    return model, max(0, hidden)


def _copied(v: onnx.ValueInfoProto) -> onnx.ValueInfoProto:
    out = onnx.ValueInfoProto()
    out.CopyFrom(v)
    return out


def _sized_again(model: onnx.ModelProto, made: dict[str, onnx.ValueInfoProto],
                 plain: dict[str, onnx.ValueInfoProto], dims: dict[str, int]) -> int:
    """Gives the tensors of ``made`` that ckpt's inference of ``model`` at ``dims`` leaves
    unsized their declaration as written back (``plain``; none where it declared none), a few
    rounds; returns how many hidden dimensions that took back. ckpt check sizes a rewrite from
    its file: a Reshape whose shape is computed from a tensor declared by symbols of its own
    is sized from its own declaration only, and one of unknown size fails its check
    (the zoo denoiser's /Reshape_2_output_0_grad and its recompute copy)."""
    from ..analysis.shapes import infer_shapes
    from ..graph import Graph

    g, back = model.graph, 0
    for _ in range(3):
        tensors = infer_shapes(Graph.from_model(model), dict(dims), strict=False).tensors
        lost = {t for t in made if tensors.get(t) is None or tensors[t].nbytes is None}
        if not lost:
            break
        back += sum(1 for t in lost for d in made.pop(t).type.tensor_type.shape.dim
                    if d.dim_param.startswith(UNPLANNED_SYMBOL))
        kept = [v for v in g.value_info if v.name not in lost]
        del g.value_info[:]
        g.value_info.extend([*kept, *(plain[t] for t in sorted(lost) if t in plain)])
    return back


def _sized_dims(info: TensorInfo | None, symbolic: list[int | str | None] | None,
                declared: onnx.ValueInfoProto | None) -> tuple[int, list[int | None]] | None:
    """(element type, dims) of one tensor, a dimension None where it is not a fixed number:
    ckpt's size where it has one (``symbolic``: its dimensions that move with the symbolic
    ones named), else what the file declared; None where neither gives a rank."""
    if info is not None and info.dtype and info.shape is not None:
        if symbolic is not None and len(symbolic) == len(info.shape):
            return info.dtype, [d if isinstance(d, int) else None for d in symbolic]
        fixed = info.static_shape
        return info.dtype, [d if fixed and isinstance(d, int) else None for d in info.shape]
    if declared is None or not declared.type.HasField("tensor_type"):
        return None
    t = declared.type.tensor_type
    if not t.HasField("shape") or not t.elem_type:
        return None
    return t.elem_type, [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]


def pattern_off_input(name: str) -> onnx.ValueInfoProto:
    """The graph input that turns ORT's memory pattern off (``rewrite/mem_pattern.py``): an
    optional float tensor no node reads; a session run without it gets None."""
    tensor = onnx.helper.make_tensor_type_proto(onnx.TensorProto.FLOAT, None)
    return onnx.helper.make_value_info(name, onnx.helper.make_optional_type_proto(tensor),
                                       doc_string="ckpt: turns ONNX Runtime's memory pattern off; do not feed")


def _static_value_info(result: RewriteResult, shapes: SymbolicShapes) -> list[onnx.ValueInfoProto]:
    """Type and shape of every node output whose shape ORT should know before the run; the
    type alone of the others (viewers label edges with it; a shape would undo fresh.py)."""
    tensors = result.after.tensors
    graph = result.graph
    skip = set(graph.outputs) | set(graph.resident)
    out = []
    for node in graph.nodes:
        for t in node.outputs:
            info = tensors.get(t)
            if not t or t in skip or info is None or not info.dtype:
                continue
            if info.static_shape and info.shape is not None and all(isinstance(d, int) for d in info.shape):
                out.append(onnx.helper.make_tensor_value_info(t, info.dtype, shapes.get(t, list(info.shape))))
            elif info.ort_shape is not None:  # known by its symbols: the file keeps them
                out.append(onnx.helper.make_tensor_value_info(t, info.dtype, list(info.ort_shape)))
            else:
                out.append(onnx.helper.make_tensor_value_info(t, info.dtype, None))
    return out


def _copy_value_info(result: RewriteResult, shapes: SymbolicShapes) -> list[onnx.ValueInfoProto]:
    """Type and shape of every tensor a recompute copy makes (viewers such as Netron
    label edges with them; the originals' value_info does not name the copies)."""
    tensors = result.after.tensors
    out = []
    for node in result.graph.nodes:
        if not is_recompute_copy(node):
            continue
        for t in node.outputs:
            info = tensors.get(t)
            if t and info is not None and info.dtype and info.shape is not None:
                out.append(onnx.helper.make_tensor_value_info(t, info.dtype, shapes.get(t, list(info.shape))))
    return out


def written_by_ckpt(model: onnx.ModelProto) -> bool:
    """Whether ``model`` carries the session record every model ckpt writes has."""
    return any(p.key == SESSION_META for p in model.metadata_props)


def undone_rewrite(model: onnx.ModelProto, path: object) -> str | None:
    """One line when ``model``'s metadata says ckpt rewrote it but its recompute copies,
    guards or memory-pattern input are gone: a tool that ran after ckpt (a simplifier such
    as onnxslim or onnxsim merges copies back into their originals and drops node
    metadata) undid the rewrite. None when nothing is missing or ckpt did not write it."""
    if not written_by_ckpt(model):
        return None
    meta = {p.key: p.value for p in model.metadata_props}
    marks = [p.key for n in model.graph.node for p in n.metadata_props]
    missing = []
    for what, key, mark in (("recompute copies", PROVENANCE_PREFIX + "recompute_nodes", RECOMPUTE_META),
                            ("guard nodes", PIN_META, GUARD_META)):
        want = int(meta[key]) if meta.get(key, "").isdigit() else 0
        have = marks.count(mark)
        if have < want:
            missing.append(f"{want - have} of its {want} {what}")
    if FRESH_META in meta and FRESH_META not in marks:
        missing.append("its fresh-buffer guards")
    pattern = meta.get(MEM_PATTERN_META)
    if pattern is not None and pattern not in {i.name for i in model.graph.input}:
        missing.append(f"its input {pattern!r}")
    if not missing:
        return None
    listed = ", ".join(missing[:-1]) + " and " + missing[-1] if len(missing) > 1 else missing[0]
    return (f"ckpt: warning: {path}: ckpt rewrote this model, but {listed} are gone: a tool run after "
            f"ckpt (a simplifier such as onnxslim or onnxsim) undid the rewrite; run ckpt last")
