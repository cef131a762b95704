"""Turn ONNX Runtime's memory pattern off from inside the written file, where it costs memory.

A plain ``InferenceSession(path)`` runs with ``enable_mem_pattern`` on: from the second run
on, every intermediate buffer lives in one block the arena serves from a power-of-two
region, and ORT's fusions change that block beyond what the written order decides. On
training graphs this is where a rewrite's saving goes under ORT's defaults (ORT's own
training front-end, ORTModule, turns the pattern off too). A session option cannot travel
with a file, but ORT turns the pattern off for any graph with an input that is not a
tensor, so ckpt adds one: an optional tensor that no node reads, which nobody needs to
feed. The choice is made here, by the prediction, and recorded on the result;
``written.py`` adds the input.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..analysis.pattern import pattern_allowed, predict_with_and_without_pattern
from ..analysis import schedules
from ..analysis.shapes import TensorInfo
from ..graph import Graph, unique_name
from ..markers import PATTERN_OFF_INPUT

# The pattern is turned off only where that predicts a clearly lower plain-session peak:
# ckpt's model of that session leaves ORT_ENABLE_ALL's fusions out.
MARGIN = 0.02
# Optional types need IR version 8 (ONNX 1.10).
MIN_IR_VERSION = 8


@dataclass(frozen=True)
class PatternOff:
    """The decision to write ``input``: predicted plain-session peaks with and without the pattern."""

    input: str
    with_pattern_bytes: int
    without_pattern_bytes: int

    def to_json(self) -> dict[str, str | int]:
        return {"input": self.input, "predicted_plain_with_pattern_bytes": self.with_pattern_bytes,
                "predicted_plain_without_pattern_bytes": self.without_pattern_bytes}


def is_ort_artifact(graph: Graph) -> bool:
    """ORT training artifacts are run by the Module API, which counts every graph input
    it does not know as a user input: an extra one would change its call signature."""
    return any(t == "lazy_reset_grad" or t.endswith(".accumulation.buffer") for t in graph.inputs)


def pattern_off(graph: Graph, tensors: dict[str, TensorInfo]) -> PatternOff | None:
    """Whether ``graph`` (the written graph, before the input is added) should turn the
    memory pattern off, and the predictions that say so; None to leave it as it is."""
    if not pattern_allowed(graph) or is_ort_artifact(graph) or graph.model.ir_version < MIN_IR_VERSION:
        return None
    patterned, unpatterned = predict_with_and_without_pattern(graph, tensors, schedules.ort_default(graph))
    with_pattern, without = patterned.peak_in_use_bytes, unpatterned.peak_in_use_bytes
    if without > with_pattern * (1 - MARGIN):
        return None
    taken = set(tensors) | set(graph.inputs) | set(graph.initializers) | {n.name for n in graph.nodes}
    return PatternOff(unique_name(PATTERN_OFF_INPUT, taken), with_pattern, without)


__all__ = ["PatternOff", "pattern_off", "is_ort_artifact"]
