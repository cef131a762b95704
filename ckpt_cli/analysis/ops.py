"""Properties of ops that several stages need to agree on."""

from __future__ import annotations

from ..graph import Node

# Recomputing these would draw different numbers than the forward pass did.
RANDOM_OPS = frozenset({"Dropout", "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                        "Bernoulli", "Multinomial"})


def is_recomputable(node: Node) -> bool:
    """Deterministic, standard-domain and without subgraphs: safe to run twice."""
    return node.op_type not in RANDOM_OPS and not node.has_subgraph and node.domain in ("", "ai.onnx")
