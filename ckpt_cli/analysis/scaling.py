"""How a model's memory moves with its symbolic dimensions.

An ORT training artifact leaves the batch symbolic, so its figures hold at one value
(``--dim`` or ckpt's default). The same graph is analysed again with every symbolic
dimension doubled: a stashed activation whose bytes double scales with the dimensions,
parameters stay, and two peaks give the peak as ``A + B * k`` for dimensions ``k`` times
the values reported (exact while the peak stays at the same step of the schedule).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import count
from typing import Any

from ..errors import CkptError
from ..graph import Graph
from ..markers import FRESH_META, GUARD_META, recompute_source
from . import Analysis, analyse
from ..errors import ModelError
from .shapes import _DIM_MAX as DIM_MAX, TensorInfo, infer_tied, symbolic_dims


@dataclass(frozen=True)
class Scaling:
    dims: tuple[tuple[str, int], ...]  # the values the report's figures are at
    peak_bytes: tuple[int, int]  # at those values, and at twice them
    stashed_bytes: tuple[int, int]
    fixed: tuple[str, ...]  # stashed buffers whose bytes grow less than twice
    doubled: Analysis  # the analysis at twice the values, for a second plan
    faster: tuple[str, ...] = ()  # stashed buffers whose bytes grow more than twice (attention scores)

    @property
    def activations_scale(self) -> bool:
        return not self.fixed and not self.faster

    @property
    def linear(self) -> bool:
        """Whether ``A + B * k`` describes the peak: no stashed buffer grows faster than the
        dimensions, and the two peaks do not say otherwise (a negative A would)."""
        return not self.faster and self.intercept >= 0

    @property
    def slope(self) -> int:
        """Peak bytes added per unit of the scale factor k."""
        return self.peak_bytes[1] - self.peak_bytes[0]

    @property
    def intercept(self) -> int:
        return 2 * self.peak_bytes[0] - self.peak_bytes[1]

    def formula(self) -> str:
        names = ", ".join(d for d, _ in self.dims)
        if not self.linear:
            growth = self.peak_bytes[1] / self.peak_bytes[0] if self.peak_bytes[0] else float("inf")
            return (f"not linear in {names}: {self.peak_bytes[0]} bytes at the values used, {self.peak_bytes[1]} "
                    f"at twice them (x{growth:.2f})")
        if len(self.dims) == 1:
            name, value = self.dims[0]
            return f"{self.intercept} + {self.slope / value:g} * {name} bytes"
        return f"{self.intercept} + {self.slope} * k bytes, with {names} all k times the values used"

    def to_json(self) -> dict[str, Any]:
        return {
            "dims": dict(self.dims),
            "doubled_dims": {d: 2 * v for d, v in self.dims},
            "peak_bytes": list(self.peak_bytes),
            "stashed_bytes": list(self.stashed_bytes),
            "peak_bytes_formula": self.formula(),
            "linear": self.linear,
            "activations_scale": self.activations_scale,
            "fixed_activations": list(self.fixed),
            "faster_activations": list(self.faster),
        }


def scaling(a: Analysis) -> Scaling | None:
    """The analysis again at twice every symbolic dimension of the inputs (None for a graph
    without any, or where twice a value is past what ckpt sizes: 2**40 is a valid --dim).
    A dimension only outputs declare is left unbound there: it follows from the inputs, and
    need not double with them (a class count beside the batch)."""
    inputs = symbolic_dims(a.graph, outputs=False)
    dims = tuple((d, v) for d, v in a.dims if d in inputs)
    if not dims or any(2 * v > DIM_MAX for _, v in dims):
        return None
    defaulted = tuple(d for d in a.default_dims if d in inputs)
    try:
        twice = infer_tied(a.graph, {d: 2 * v for d, v in dims}, defaulted)
        doubled = analyse(a.graph, twice.dims, a.loss_given,
                          list(a.grad_outputs_given) if a.grad_outputs_given else None, twice.tensors,
                          default_dims=defaulted)
    except ModelError:  # a tensor past what ckpt sizes at twice the values
        return None
    growth = {s.buffer: (doubled.tensors[s.buffer].nbytes or 0) - 2 * (a.tensors[s.buffer].nbytes or 0)
              for s in a.stashed}
    return Scaling(dims, (a.priority.peak_bytes, doubled.priority.peak_bytes),
                   (a.stashed_bytes, doubled.stashed_bytes), tuple(sorted(b for b, g in growth.items() if g < 0)),
                   doubled, tuple(sorted(b for b, g in growth.items() if g > 0)))


# tensor -> its dimensions: a number, a product of symbols ("batch*seq"), or None (unnamed)
SymbolicShapes = dict[str, list[int | str | None]]


def symbolic_shapes(graph: Graph, tensors: dict[str, TensorInfo], scaled: Scaling,
                    probe: dict[str, TensorInfo] | None) -> SymbolicShapes:
    """Shapes for the value_info of ``graph`` (a rewrite of the analysed one) with the
    symbolic dimensions put back: a dimension that moves with them is written as the product
    it is (``batch``, ``batch*seq``, ``seq*seq*4``), or left unnamed; one that does not is a
    number. A file with the batch baked in would let ORT fold its Shape nodes into constants
    and fail at any other batch; a dimension named after another that only had the same value
    makes ORT reuse buffers of the wrong size once they differ. ``probe``: the original's
    tensors with every dimension a different prime times its value (``probe_tensors``), which
    tells the dimensions apart; the doubled analysis confirms each product. Tensors ckpt made
    (recompute copies, guard views) take the shapes of the tensor they copy or view."""
    source = _sources(graph, scaled.doubled.graph)
    factors = dict(zip((d for d, _ in scaled.dims), _PRIMES))
    out: SymbolicShapes = {}
    for t, info in tensors.items():
        original = source.get(t, t)
        twice = scaled.doubled.tensors.get(original)
        if info.shape is None or twice is None or twice.shape is None or len(twice.shape) != len(info.shape):
            continue
        if twice.shape == info.shape:
            continue
        probed = (probe or {}).get(original)
        apart = probed.shape if probed is not None and probed.shape is not None else (None,) * len(info.shape)
        if len(apart) != len(info.shape):
            apart = (None,) * len(info.shape)
        out[t] = [_symbol(one, two, far, scaled.dims, factors) for one, two, far in zip(info.shape, twice.shape, apart)]
    return out


# More dimensions than these in one model: the others are left unnamed (ORT learns them).
_PRIMES = (3, 5, 7, 11, 13, 17, 19, 23)


def probe_dims(dims: tuple[tuple[str, int], ...]) -> dict[str, int]:
    """Every symbolic dimension at a different prime times its value (the doubled analysis
    has them all at twice theirs): a size's ratio between the two names its dimensions."""
    return {d: v * p for (d, v), p in zip(dims, _PRIMES)}


def probe_tensors(a: Analysis) -> dict[str, TensorInfo] | None:
    """The sizes of ``a``'s graph at ``probe_dims`` (defaulted dimensions tied to others, as
    the analysis ties them), or None where the graph cannot be sized there."""
    dims = probe_dims(a.dims)
    try:
        return infer_tied(a.graph, dims, a.default_dims).tensors
    except CkptError:
        return None


def _symbol(one: int | str, two: int | str, far: int | str | None, dims: tuple[tuple[str, int], ...],
            factors: dict[str, int]) -> int | str | None:
    """``one`` (at ``dims``) as the product of symbols it is, given its values at twice the
    dimensions (``two``) and at the probe (``far``); None where no product fits both."""
    if one == two or not isinstance(one, int):
        return one
    if not isinstance(two, int) or not isinstance(far, int) or one <= 0 or far % one:
        return None
    ratio = far // one
    powers: dict[str, int] = {}
    for d, _ in dims:
        p = factors.get(d)
        while p is not None and ratio % p == 0:
            ratio //= p
            powers[d] = powers.get(d, 0) + 1
    product = 1
    for d, v in dims:
        product *= v ** powers.get(d, 0)
    if ratio != 1 or not powers or one % product or two != one * 2 ** sum(powers.values()):
        return None
    names = [d for d, _ in dims for _ in range(powers.get(d, 0))]
    return "*".join(names + ([str(one // product)] if one != product else []))


_VIEWS = frozenset({"Reshape", "Identity"})  # ckpt's guards and fresh views: identities on input 0


def _sources(graph: Graph, original: Graph) -> dict[str, str]:
    """Tensor of ``graph`` -> the tensor of ``original`` it copies or views."""
    at = {n.name: n for n in original.nodes}
    source: dict[str, str] = {}
    for node in graph.nodes:
        copied = at.get(recompute_source(node) or "")
        if copied is not None:
            source.update((t, s) for t, s in zip(node.outputs, copied.outputs) if t and s)
        elif node.op_type in _VIEWS and (node.meta(GUARD_META) is not None or node.meta(FRESH_META) is not None):
            if node.inputs and node.outputs:
                source[node.outputs[0]] = source.get(node.inputs[0], node.inputs[0])
    return source


def other_assignment(a: Analysis) -> dict[str, int] | None:
    """Another value of every symbolic dimension of ``a`` (each different from the
    analysed one and from the others'), dimensions tied to others as the analysis ties
    them; None for a graph without any, or where the graph cannot be sized there."""
    if not a.dims:
        return None
    # small values, one each: a file that took one dimension for another fails there
    free = count(3)
    dims = {d: next(v for v in free if v != value) for d, value in a.dims}
    try:
        dims = infer_tied(a.graph, dims, tuple(dims)).dims
    except CkptError:
        return None
    return dims if len(dims) == len(a.dims) else None
