"""Name scopes of nodes: which module (layer) a node belongs to.

Graphs carry this evidence in different places: TorchScript exports name nodes
``/blocks.0/attn/MatMul``; dynamo exports name them ``node_view_95`` but record the
module path in node metadata, and their parameter inputs keep module paths such as
``blocks.3.attn.qkv.weight``. A node with no evidence of its own takes the scope of
the producer of its first input that has one.
"""

from __future__ import annotations

import re

from ..graph import Graph

_SCOPE_META_KEYS = ("pkg.torch.onnx.name_scopes", "namespace")
_PARAM_SUFFIX = re.compile(r"\.(weight|bias|running_mean|running_var|num_batches_tracked|[A-Za-z_]+)$")
_LAYER = re.compile(r"^(.*?[A-Za-z_]+[./_]?\d+)(?=$|[./])")
UNSCOPED = ""


def _scope_from_name(name: str) -> str:
    # "/blocks.0/attn/MatMul_1" -> "blocks.0/attn"
    if name.startswith("/") and name.count("/") >= 2:
        return name[1:name.rindex("/")]
    return UNSCOPED


def _scope_from_meta(key: str, value: str) -> str:
    # Dynamo exports record the module path; the last entry is the op itself:
    #   name_scopes: "['', 'blocks.2', 'blocks.2.attn', 'where_2']"
    #   namespace:   ": __main__.GPT/blocks.2: __main__.Block/where_2: aten.where.self"
    if key == "namespace":
        parts = [p.split(":")[0].strip() for p in value.split("/")][:-1]
    else:
        parts = (re.findall(r"'([^']*)'", value) or [value])[:-1]
    parts = [p for p in parts if p]
    return parts[-1].replace(".", "/") if parts else UNSCOPED


def _param_scope(tensor: str) -> str:
    module = _PARAM_SUFFIX.sub("", tensor)
    return module.replace(".", "/") if module != tensor else UNSCOPED


def node_scopes(graph: Graph) -> list[str]:
    """A '/'-separated module path per node (``UNSCOPED`` when nothing tells)."""
    params = set(graph.initializers) | set(graph.inputs)
    scopes = [UNSCOPED] * len(graph.nodes)
    for i in graph.topological_order():
        node = graph.nodes[i]
        scope = _scope_from_name(node.name)
        if not scope:
            for key in _SCOPE_META_KEYS:
                value = node.meta(key)
                if value:
                    scope = _scope_from_meta(key, value)
                    if scope:
                        break
        if not scope:
            scope = next((s for t in node.inputs if t in params and "." in t
                          for s in [_param_scope(t)] if s), UNSCOPED)
        if not scope:
            scope = next((scopes[graph.producer[t]] for t in node.inputs
                          if t in graph.producer and scopes[graph.producer[t]]), UNSCOPED)
        scopes[i] = scope
    return scopes


def layer_of(scope: str) -> str:
    """The repeated-layer part of a scope: 'blocks/3/attn' -> 'blocks/3', or '' if none."""
    parts = scope.split("/")
    for k, part in enumerate(parts):
        if part.isdigit() and k > 0:
            return "/".join(parts[:k + 1])
        if re.search(r"[A-Za-z_][._]?\d+$", part) and re.search(r"\d", part):
            return "/".join(parts[:k + 1])
    return UNSCOPED


def top_scope(scope: str) -> str:
    """The scope to group report rows by: the layer if there is one, else the first part."""
    return layer_of(scope) or scope.split("/")[0]
