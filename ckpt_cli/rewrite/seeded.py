"""Random ops that ORT seeds by their node index: where a written order moves them.

ORT's CPU RandomNormal, RandomNormalLike, RandomUniform, RandomUniformLike and Multinomial
without a ``seed`` attribute seed their engine, when the session makes their kernel, with
ORT's global seed plus the node's index in ORT's graph. ORT numbers a file's nodes in their
order when it loads it, after turning ONNX ``Constant`` nodes into initializers, and the
nodes of the functions it inlines after them (``schedules.ort_numbering``). A written
order that gives such a node another index makes it draw other numbers than the original
does, whatever seed the user sets: the report says so.
"""

from __future__ import annotations

from ..analysis.schedules import ort_numbering
from ..graph import Graph, Node

INDEX_SEEDED_OPS = frozenset({"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
                              "Multinomial"})


def _numbered(n: Node) -> bool:
    """ORT gives the node an index: every node but an ONNX Constant."""
    return not (n.op_type == "Constant" and n.domain in ("", "ai.onnx"))


def _index_seeded(n: Node) -> bool:
    return n.op_type in INDEX_SEEDED_OPS and n.domain in ("", "ai.onnx") and n.attr("seed") is None


def index_seeded(graph: Graph) -> dict[str, int]:
    """The ORT node index of each index-seeded random node of ``graph``, by name."""
    found: dict[str, int] = {}
    index = 0
    for n in map(graph.nodes.__getitem__, ort_numbering(graph)):
        if _index_seeded(n):
            found[n.name] = index
        index += _numbered(n)
    return found


def moved_seeds(original: Graph, written: Graph) -> tuple[str, ...]:
    """One line per index-seeded random node of ``original`` that ``written`` numbers otherwise."""
    before = index_seeded(original)
    if not before:
        return ()
    after = index_seeded(written)
    ops = {n.name: n.op_type for n in original.nodes if n.name in before}
    return tuple(f"ORT seeds {ops[name]} '{name}' by its node index, which the written order moves from "
                 f"{i} to {after[name]}: it draws other numbers than the original's, so outputs and losses "
                 "differ from the original's (a seed attribute on the node makes its draws its own)"
                 for name, i in before.items() if name in after and after[name] != i)
