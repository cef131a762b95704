"""The marks ckpt writes into the models it rewrites, and the one test for a copy.

Node metadata marks what ckpt added; model metadata records how to run the model and
where it came from. Names are never a mark: the copies are named ``<node>_recompute``,
but a name already taken gets ``_recompute_2`` and a user's node may end in
``_recompute`` too.
"""

from __future__ import annotations

import json
from typing import Any, cast
from dataclasses import dataclass

import onnx

from .errors import ModelError
from .graph import Node

# Node metadata: every recompute copy names the node it copies and its region.
RECOMPUTE_META = "ckpt.recompute_of"
REGION_META = "ckpt.region"
# Node metadata: on a second copy (``rewrite/twice.py``), the label of its block, which
# pin guards as a block of its own.
BLOCK_META = "ckpt.block"
# Node metadata: ckpt marks backward nodes it writes among forward ones, so that
# re-analysis keeps them backward.
PHASE_META = "ckpt.phase"
# Node metadata: on every node pin adds, the region whose block it gates.
GUARD_META = "ckpt.guard"

# Model metadata: whether ORT's buffer reuse should be off for the written model.
MEM_REUSE_META = "ckpt.enable_mem_reuse"
# Model metadata, written only as "0": ORT's CPU arena off in the settings a written model
# records (the Module choice measured that setting lower, ``verify/module_choice.py``).
MEM_ARENA_META = "ckpt.enable_cpu_mem_arena"
# Model metadata: the session a written model is for: "ckpt" (its recorded settings) or
# "ort_default" (ckpt changed nothing that needs settings).
SESSION_META = "ckpt.session"
# Model metadata: how many guard nodes pin added.
PIN_META = "ckpt.pinned"
# On every node rewrite/fresh.py adds, and in model metadata: how many tensors it hid from
# ORT's buffer reuse.
FRESH_META = "ckpt.fresh"
# Model metadata: a graph ORT optimized offline after the rewrite (--ort-optimize): its
# provider, level and ORT version, as JSON.
ORT_OPTIMIZE_META = "ckpt.ort_optimize"
# A graph input ckpt adds to turn ONNX Runtime's memory pattern off in every session: an
# optional tensor that no node reads and nobody feeds (ORT runs it as None). ORT disables
# the pattern when any graph input is not a tensor (SessionState::ResolveMemoryPatternFlag).
PATTERN_OFF_INPUT = "ckpt_mem_pattern_off"
# Model metadata: the name of that input, when the written model has it.
MEM_PATTERN_META = "ckpt.mem_pattern_off"
# Model metadata: provenance keys (version, options, plan summary) start with this.
PROVENANCE_PREFIX = "ckpt."
# Model metadata: the producer of the model ckpt read ("pytorch 2.5.1"): a written model's
# producer_name and producer_version are ckpt's own.
SOURCE_PRODUCER_META = "ckpt.source_producer"

# An attribute ONNX's checker ignores (leading "__"); it makes a copy that reads only
# original tensors differ from its original for ORT's common-subexpression elimination,
# which would merge them back (and then every copy downstream of it).
CSE_GUARD_ATTR = "__ckpt_recompute"

# How copies and their outputs are named (a taken name gets a number after it).
SUFFIX = "_recompute"


def recompute_source(node: Node | onnx.NodeProto) -> str | None:
    """The name of the node this recompute copy copies, or None for any other node."""
    props = node.proto.metadata_props if isinstance(node, Node) else node.metadata_props
    if props:  # most nodes have none, and a rewrite asks several times per node
        for p in props:
            if p.key == RECOMPUTE_META:
                return cast(str, p.value)
    return None


def is_recompute_copy(node: Node | onnx.NodeProto) -> bool:
    """Whether ckpt's rewrite made this node as a recompute copy (by its metadata)."""
    return recompute_source(node) is not None


_ORT_LEVELS = ("ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED", "ORT_ENABLE_ALL")


@dataclass(frozen=True)
class SessionPlan:
    """How a written model is meant to run, as its model metadata records it: written by
    ``to_metadata`` alone and read back by ``read`` alone.

    ``mem_reuse``: ORT's buffer reuse; ``session``: "ckpt" (its recorded settings) or
    "ort_default" (ckpt changed nothing that needs settings); ``mem_pattern_off_input``:
    the input that turns ORT's memory pattern off, when the file has one; ``ort_optimize``:
    the provider, level and ORT version of an offline optimization (--ort-optimize);
    ``mem_arena``: ORT's CPU arena (recorded only when off)."""

    mem_reuse: bool = True
    session: str = "ckpt"
    mem_pattern_off_input: str | None = None
    ort_optimize: dict[str, Any] | None = None
    mem_arena: bool = True

    def to_metadata(self) -> dict[str, str]:
        meta = {MEM_REUSE_META: "1" if self.mem_reuse else "0", SESSION_META: self.session}
        if self.mem_pattern_off_input is not None:
            meta[MEM_PATTERN_META] = self.mem_pattern_off_input
        if self.ort_optimize is not None:
            meta[ORT_OPTIMIZE_META] = json.dumps(self.ort_optimize, sort_keys=True)
        if not self.mem_arena:
            meta[MEM_ARENA_META] = "0"
        return meta

    @classmethod
    def read(cls, model: onnx.ModelProto, path: object = "model") -> "SessionPlan":
        """The plan ``model`` records; a model ckpt did not write gets the defaults."""
        meta = {p.key: p.value for p in model.metadata_props}
        return cls(meta.get(MEM_REUSE_META, "1") != "0", meta.get(SESSION_META, "ckpt"),
                   meta.get(MEM_PATTERN_META), _ort_optimize(meta, path), meta.get(MEM_ARENA_META, "1") != "0")


def _ort_optimize(meta: dict[str, str], path: object) -> dict[str, Any] | None:
    if ORT_OPTIMIZE_META not in meta:
        return None
    try:
        value: dict[str, Any] = json.loads(meta[ORT_OPTIMIZE_META])
        if value["provider"] in ("cpu", "cuda") and value["level"] in _ORT_LEVELS:
            return value
    except (ValueError, TypeError, KeyError):
        pass
    raise ModelError(f"{path}: metadata {ORT_OPTIMIZE_META} is not what ckpt writes ({meta[ORT_OPTIMIZE_META][:80]!r})")
