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


def seed_order(graph: Graph, targets: dict[str, int]) -> list[int] | None:
    """A file order of ``graph`` (indices into its nodes) that gives each index-seeded node
    named in ``targets`` the ORT index there, by moving nodes that neither feed it nor read
    it from one side of it to the other, the nearest first; None where nothing moves or no
    such order exists. Nodes ORT inlines are numbered last: such graphs are left alone."""
    if graph.inlined:
        return None
    order = list(range(len(graph.nodes)))
    where = {n.name: n.index for n in graph.nodes}
    for name, want in targets.items():
        if name not in where:
            continue
        shifted = _shifted(graph, order, where[name], want)
        if shifted is None:
            return None
        order = shifted
    return order if order != list(range(len(graph.nodes))) else None


def _shifted(graph: Graph, order: list[int], r: int, want: int) -> list[int] | None:
    """``order`` with ``r`` at ORT index ``want``, or None."""
    at = order.index(r)
    have = sum(_numbered(graph.nodes[i]) for i in order[:at])
    if have > want:  # nodes written ahead of r go after it
        take = _movable(graph, order[at - 1::-1] if at else [], _reach(graph.preds, r), graph.succs, have - want)
        if take is None:
            return None
        return ([i for i in order[:at] if i not in take] + [r] + [i for i in order[:at] if i in take]
                + order[at + 1:])
    if have < want:  # nodes written after r go ahead of it
        take = _movable(graph, order[at + 1:], _reach(graph.succs, r), graph.preds, want - have)
        if take is None:
            return None
        return order[:at] + [i for i in order[at + 1:] if i in take] + [r] + [i for i in order[at + 1:] if i not in take]
    return order


def _reach(links: list[list[int]], start: int) -> set[int]:
    """The nodes ``links`` lead to from ``start``, transitively."""
    seen: set[int] = set()
    stack = list(links[start])
    while stack:
        i = stack.pop()
        if i not in seen:
            seen.add(i)
            stack.extend(links[i])
    return seen


def _movable(graph: Graph, side: list[int], blocked: set[int], toward: list[list[int]], need: int) -> set[int] | None:
    """``need`` numbered nodes of ``side`` (walked away from the seeded node) that may cross
    it: none of ``blocked``, and each with every node it links ``toward`` the seeded node on
    that side crossing too (the file stays topological)."""
    on_side = set(side)
    take: set[int] = set()
    count = 0
    for i in side:
        if count == need:
            break
        if not _numbered(graph.nodes[i]) or i in blocked or any(j in on_side and j not in take for j in toward[i]):
            continue
        take.add(i)
        count += 1
    return take if count == need else None
