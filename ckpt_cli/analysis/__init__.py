"""Analysis of a training graph: phases, sizes, costs, stashed activations and memory."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain
from typing import Callable, Iterable

from ..errors import UsageError
from ..graph import ABSENT, Graph, gc_paused
from ..markers import SessionPlan, is_recompute_copy
from . import schedules
from .arena import ArenaResult, predict_in_use, small_initializer_bytes
from .cost import NodeCost, graph_costs
from .floor import Floor, plan_floor
from .memory import MemoryProfile, buffer_roots, simulate, simulate_deferred, scratch_peak, step_scratch
from .phases import Phases, classify
from .scopes import node_scopes
from .shapes import TensorInfo, infer_shapes, symbolic_dims


@dataclass(frozen=True)
class Stashed:
    """A forward tensor that the backward pass reads: kept alive across the two."""

    tensor: str
    buffer: str  # the tensor that owns the memory (differs for views)
    producer: int
    consumers: tuple[int, ...]  # backward consumers


@dataclass(frozen=True)
class PeakModel:
    """What a plan search reads of a rewritten graph: its PRIORITY_BASED simulation (made with
    ORT's buffer reuse as ``reuse_buffers``), each kernel's working memory at its step
    (``scratch``) and ORT's arena replayed for that order (``replayed``; None for a plan
    search's model, which is judged by its tensors). A search analyses many rewritten graphs
    and needs only their peaks; ``Analysis`` is the whole of what ckpt knows of one graph."""

    graph: Graph
    tensors: dict[str, TensorInfo]
    priority: MemoryProfile  # ORT PRIORITY_BASED order (the file order when sorted)
    reuse_buffers: bool  # ORT's enable_mem_reuse the simulations assume
    # Per step of the PRIORITY_BASED order: the working memory its kernel holds while it runs,
    # outside ORT's buffers (``ort.scratch``); steps without any are absent.
    scratch: dict[int, int]
    replayed: ArenaResult | None

    @property
    def working_peak_bytes(self) -> int:
        """The PRIORITY_BASED tensor peak with each kernel's working memory at its step (a
        ConvGrad's im2col buffer can top the tensors): the peak a process running it holds."""
        return scratch_peak(self.priority.peak_bytes, self.scratch, self.priority.timeline)

    def profile(self, reuse_buffers: bool) -> MemoryProfile:
        """The PRIORITY_BASED simulation with ORT's buffer reuse on or off: ``priority``, or
        simulated now (each call: a caller that needs it twice keeps it)."""
        if reuse_buffers == self.reuse_buffers:
            return self.priority
        return simulate(self.graph, self.priority.order, self.tensors, reuse_buffers=reuse_buffers)

    def arena(self, reuse_buffers: bool) -> ArenaResult:
        """ORT's arena replayed for the PRIORITY_BASED order, with ORT's buffer reuse on or
        off: ``replayed``, or replayed now (each call)."""
        if reuse_buffers == self.reuse_buffers and self.replayed is not None:
            return self.replayed
        return predict_in_use(self.graph, self.profile(reuse_buffers), self.tensors)

    def arena_in_use(self, reuse_buffers: bool) -> int:
        """Predicted peak of ORT's arena in use for the PRIORITY_BASED order (``arena``)."""
        return self.arena(reuse_buffers).peak_in_use_bytes

    @property
    def ort_peak_bytes(self) -> int:
        """Predicted peak of what ORT holds for one run: its arena's bytes in use at their
        peak (``arena_in_use``, with the buffer reuse the simulations assume), plus the
        graph's inputs and initializers, which ORT keeps outside the arena (but for
        initializers under 128 bytes, counted in the arena). The arena hands a request a
        whole free chunk when splitting it would leave too little, so this can exceed the
        tensor peak by far more than the inputs (measured figures in docs/MEASUREMENTS.md)."""
        return self.arena_in_use(self.reuse_buffers) + self.outside_arena_bytes

    @property
    def outside_arena_bytes(self) -> int:
        """The inputs and initializers ORT holds outside its arena for the whole run."""
        return self.priority.resident_bytes - small_initializer_bytes(self.graph, self.tensors)


def peak_model(graph: Graph, tensors: dict[str, TensorInfo], priority: MemoryProfile, reuse_buffers: bool,
               replayed: ArenaResult | None = None) -> PeakModel:
    """The peak model of a graph simulated already (``priority``): its kernels' working memory found."""
    return PeakModel(graph, tensors, priority, reuse_buffers, step_scratch(priority, graph, tensors), replayed)


@dataclass(frozen=True, kw_only=True)
class Analysis(PeakModel):
    """Everything ckpt knows of a graph, computed once when it is analysed (``analyse``).
    The facts only some commands read and that cost a simulation or a walk of their own
    are functions of it, computed by the command that reads them: ``default_order`` (ORT's
    DEFAULT order), ``lowest_peak`` (the floor) and ``profile``/``arena`` with the other
    buffer reuse."""

    replayed: ArenaResult  # ORT's arena for the PRIORITY_BASED order, with ``reuse_buffers``
    phases: Phases
    roots: dict[str, str]  # tensor -> the tensor that owns its buffer (views)
    costs: list[NodeCost]
    scopes: list[str]
    stashed: tuple[Stashed, ...]
    unsized: dict[str, tuple[str, ...]]  # tensors made by nodes, of unknown size: the dimensions missing
    loss_given: str | None = None  # --loss / --grad-output, which decide the phases
    grad_outputs_given: tuple[str, ...] | None = None
    dims: tuple[tuple[str, int], ...] = ()  # symbolic dimension values the sizes are taken at
    default_dims: tuple[str, ...] = ()  # those of them ckpt chose (no --dim given)
    # The simulation with reuse off from the one with it on, without walking the graph again
    # (a function of the planner's buffers: each call computes it).
    without_reuse: Callable[[], MemoryProfile] | None = field(default=None, repr=False, compare=False)

    def profile(self, reuse_buffers: bool) -> MemoryProfile:
        if reuse_buffers != self.reuse_buffers and self.without_reuse is not None:
            return self.without_reuse()
        return super().profile(reuse_buffers)

    @property
    def output_bytes(self) -> int:
        """The graph's outputs (loss, gradients): ORT holds each until the run ends, so
        all of them are live at its last step, whatever the plan."""
        return buffer_bytes(set(self.graph.outputs) - {ABSENT}, self.tensors)

    @property
    def stashed_bytes(self) -> int:
        return buffer_bytes({s.buffer for s in self.stashed}, self.tensors)

    @property
    def forward_flops(self) -> int:
        return sum(c.flops for c, f in zip(self.costs, self.phases.is_forward) if f)

    @property
    def backward_flops(self) -> int:
        return sum(c.flops for c, f in zip(self.costs, self.phases.is_forward) if not f)

    @property
    def recompute_flops(self) -> int:
        """FLOPs of ckpt's recompute copies in the graph (0 for a graph ckpt did not write)."""
        return sum(c.flops for c, n in zip(self.costs, self.graph.nodes) if is_recompute_copy(n))

@gc_paused
def default_order(a: Analysis) -> MemoryProfile:
    """ORT's DEFAULT order, simulated (a walk of its own: read by the commands that report it)."""
    return simulate(a.graph, schedules.ort_default(a.graph), a.tensors, reuse_buffers=a.reuse_buffers)


@gc_paused
def lowest_peak(a: Analysis) -> Floor:
    """A peak no order or recompute plan goes below, and what sets it (``floor.py``)."""
    return plan_floor(a.graph, a.tensors, a.roots, a.priority.resident_bytes, a.output_bytes)


def find_unsized(graph: Graph, tensors: dict[str, TensorInfo]) -> dict[str, tuple[str, ...]]:
    """Tensors produced by nodes whose size is unknown, with the missing dimensions."""
    return {t: tensors[t].missing if t in tensors else ("?",) for n in graph.nodes for t in n.outputs
            if t != ABSENT and (t not in tensors or tensors[t].nbytes is None)}


def _refuse_unbound_dims(graph: Graph, tensors: dict[str, TensorInfo], dims: dict[str, int]) -> None:
    """Sizes that depend on a symbolic dimension nobody bound would make every total silently
    partial: refuse, naming the ``--dim`` options that fix it."""
    named = symbolic_dims(graph) - set(dims)
    if not named:
        return
    unbound = sorted({d for t in chain(graph.resident, graph.producer) if t in tensors
                      for d in tensors[t].missing if d in named})
    if unbound:
        raise UsageError("tensor sizes depend on symbolic dimension" + ("s " if len(unbound) > 1 else " ")
                         + ", ".join(unbound) + "; give their values with "
                         + " ".join(f"--dim {d}=N" for d in unbound))


def buffer_bytes(buffers: Iterable[str], tensors: dict[str, TensorInfo]) -> int:
    return sum((tensors[b].nbytes or 0) for b in buffers if b in tensors)


def find_stashed(graph: Graph, phases: Phases, roots: dict[str, str]) -> tuple[Stashed, ...]:
    resident = set(graph.resident)
    out: list[Stashed] = []
    for node in graph.nodes:
        if not phases.is_forward[node.index]:
            continue
        for t in node.outputs:
            if t == ABSENT or roots.get(t, t) in resident:
                continue
            users = tuple(c for c in graph.consumers.get(t, ()) if not phases.is_forward[c])
            if users:
                out.append(Stashed(t, roots.get(t, t), node.index, users))
    return tuple(out)


def recommended_mem_reuse(graph: Graph) -> bool:
    """The ``enable_mem_reuse`` a ckpt-written model asks for (True for any other model)."""
    return SessionPlan.read(graph.model).mem_reuse


def _priority_simulation(graph: Graph, tensors: dict[str, TensorInfo], reuse_buffers: bool
                         ) -> tuple[MemoryProfile, Callable[[], MemoryProfile] | None]:
    """The PRIORITY_BASED simulation and, with reuse on, the one without reuse to make on demand."""
    order = schedules.priority_based(graph)
    if reuse_buffers:
        return simulate_deferred(graph, order, tensors)
    return simulate(graph, order, tensors, reuse_buffers=reuse_buffers), None


@gc_paused
def analyse(graph: Graph, dims: dict[str, int] | None = None, loss: str | None = None,
            grad_outputs: list[str] | None = None, tensors: dict[str, TensorInfo] | None = None, *,
            reuse_buffers: bool | None = None, default_dims: tuple[str, ...] = ()) -> Analysis:
    """Run every analysis on ``graph``. ``tensors`` may be passed to skip shape inference.
    ``reuse_buffers`` (ORT's enable_mem_reuse) defaults to what the model asks for.
    ``default_dims`` names the entries of ``dims`` that the caller chose, not the user.
    A model without a backward is refused here."""
    if tensors is None:
        tensors = infer_shapes(graph, dims).tensors
        _refuse_unbound_dims(graph, tensors, dims or {})
    reuse_buffers = recommended_mem_reuse(graph) if reuse_buffers is None else reuse_buffers
    priority, without_reuse = _priority_simulation(graph, tensors, reuse_buffers)
    model = peak_model(graph, tensors, priority, reuse_buffers)
    return _analysed(model, loss, grad_outputs, dims=tuple(sorted((dims or {}).items())),
                     default_dims=tuple(sorted(default_dims)), without_reuse=without_reuse)


@gc_paused
def analyse_written(model: PeakModel, loss: str | None, grad_outputs: list[str] | None,
                    phases: Phases | None = None) -> Analysis:
    """The analysis of a graph ckpt wrote, from its peak model (its simulation and arena
    replay are taken as they are); ``phases``: its graph's, classified already by the same
    ``loss`` and ``grad_outputs``."""
    return model if isinstance(model, Analysis) else _analysed(model, loss, grad_outputs, phases=phases)


def _analysed(model: PeakModel, loss: str | None, grad_outputs: list[str] | None, *,
              dims: tuple[tuple[str, int], ...] = (), default_dims: tuple[str, ...] = (),
              without_reuse: Callable[[], MemoryProfile] | None = None, phases: Phases | None = None) -> Analysis:
    graph, tensors = model.graph, model.tensors
    if phases is None:  # first: its errors belong to loading
        phases = classify(graph, loss, list(grad_outputs or ()) or None)
    roots = buffer_roots(graph)
    replayed = model.replayed or predict_in_use(graph, model.priority, tensors)
    return Analysis(graph=graph, tensors=tensors, priority=model.priority, reuse_buffers=model.reuse_buffers,
                    scratch=model.scratch, replayed=replayed, phases=phases, roots=roots,
                    costs=graph_costs(graph, tensors), scopes=node_scopes(graph),
                    stashed=find_stashed(graph, phases, roots), unsized=find_unsized(graph, tensors),
                    loss_given=loss, grad_outputs_given=tuple(grad_outputs) if grad_outputs else None,
                    dims=dims, default_dims=default_dims, without_reuse=without_reuse)


__all__ = ["Analysis", "PeakModel", "Stashed", "analyse", "analyse_written", "default_order", "lowest_peak",
           "peak_model", "MemoryProfile", "Phases", "TensorInfo", "symbolic_dims",
           "simulate", "schedules"]
