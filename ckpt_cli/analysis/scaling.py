"""How a model's memory moves with its symbolic dimensions.

An ORT training artifact leaves the batch symbolic, so its figures hold at one value
(``--dim`` or ckpt's default). The same graph is analysed again with every symbolic
dimension doubled: a stashed activation whose bytes double scales with the dimensions,
parameters stay, and two peaks give the peak as ``A + B * k`` for dimensions ``k`` times
the values reported (exact while the peak stays at the same step of the schedule).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import Analysis, analyse


@dataclass(frozen=True)
class Scaling:
    dims: tuple[tuple[str, int], ...]  # the values the report's figures are at
    peak_bytes: tuple[int, int]  # at those values, and at twice them
    stashed_bytes: tuple[int, int]
    fixed: tuple[str, ...]  # stashed buffers whose bytes do not double
    doubled: Analysis  # the analysis at twice the values, for a second plan

    @property
    def activations_scale(self) -> bool:
        return not self.fixed

    @property
    def slope(self) -> int:
        """Peak bytes added per unit of the scale factor k."""
        return self.peak_bytes[1] - self.peak_bytes[0]

    @property
    def intercept(self) -> int:
        return 2 * self.peak_bytes[0] - self.peak_bytes[1]

    def formula(self) -> str:
        if len(self.dims) == 1:
            name, value = self.dims[0]
            return f"{self.intercept} + {self.slope / value:g} * {name} bytes"
        names = ", ".join(d for d, _ in self.dims)
        return f"{self.intercept} + {self.slope} * k bytes, with {names} all k times the values used"

    def to_json(self) -> dict:
        return {
            "dims": dict(self.dims),
            "doubled_dims": {d: 2 * v for d, v in self.dims},
            "peak_bytes": list(self.peak_bytes),
            "stashed_bytes": list(self.stashed_bytes),
            "peak_bytes_formula": self.formula(),
            "activations_scale": self.activations_scale,
            "fixed_activations": list(self.fixed),
        }


def scaling(a: Analysis) -> Scaling | None:
    """The analysis again at twice every symbolic dimension (None for a graph without any)."""
    if not a.dims:
        return None
    doubled = analyse(a.graph, {d: 2 * v for d, v in a.dims}, a.loss_given,
                      list(a.grad_outputs_given) if a.grad_outputs_given else None, default_dims=a.default_dims)
    fixed = tuple(sorted({s.buffer for s in a.stashed
                          if (doubled.tensors[s.buffer].nbytes or 0) != 2 * (a.tensors[s.buffer].nbytes or 0)}))
    return Scaling(a.dims, (a.priority.peak_bytes, doubled.priority.peak_bytes),
                   (a.stashed_bytes, doubled.stashed_bytes), fixed, doubled)
