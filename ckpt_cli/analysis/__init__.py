"""Analysis of a training graph: phases, sizes, costs, stashed activations and memory."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain
from typing import TYPE_CHECKING, Any, Callable, Iterable, TypeVar
from functools import cached_property

from ..errors import UsageError
from ..graph import ABSENT, Graph, gc_paused
from ..markers import SessionPlan, is_recompute_copy
from . import schedules
from .cost import NodeCost, graph_costs
from .floor import Floor, plan_floor
from .memory import MemoryProfile, buffer_roots, simulate, simulate_deferred, scratch_peak, step_scratch
from .phases import Phases, classify
from .scopes import node_scopes
from .shapes import TensorInfo, infer_shapes, symbolic_dims

if TYPE_CHECKING:
    from .arena import ArenaResult


@dataclass(frozen=True)
class Stashed:
    """A forward tensor that the backward pass reads: kept alive across the two."""

    tensor: str
    buffer: str  # the tensor that owns the memory (differs for views)
    producer: int
    consumers: tuple[int, ...]  # backward consumers


_T = TypeVar("_T")


@dataclass(eq=False)
class _Memo:
    """An analysis's results computed on demand, by argument: the simulations and arena
    replays per buffer reuse, and what callers derive from the analysis (``derived``)."""

    profiles: dict[bool, MemoryProfile] = field(default_factory=dict)
    arenas: dict[bool, "ArenaResult"] = field(default_factory=dict)
    without_reuse: Callable[[], MemoryProfile] | None = None  # makes profiles[False] on demand
    derived: dict[Callable[..., Any], Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Analysis:
    """Everything ckpt knows of a graph. Costs, scopes, stashed tensors and the DEFAULT
    order are computed on first use: a plan search analyses many rewritten graphs and
    needs only their peak."""

    graph: Graph
    tensors: dict[str, TensorInfo]
    priority: MemoryProfile  # ORT PRIORITY_BASED order (the file order when sorted)
    reuse_buffers: bool = True  # ORT's enable_mem_reuse the simulations assume
    loss_given: str | None = None  # --loss / --grad-output, which decide the phases
    grad_outputs_given: tuple[str, ...] | None = None
    dims: tuple[tuple[str, int], ...] = ()  # symbolic dimension values the sizes are taken at
    default_dims: tuple[str, ...] = ()  # those of them ckpt chose (no --dim given)
    _memo: _Memo = field(default_factory=_Memo, init=False, repr=False, compare=False)

    @cached_property
    @gc_paused
    def phases(self) -> Phases:
        """Forward and backward nodes (classified on first use: a plan search judges
        rewritten graphs by their peak alone)."""
        return classify(self.graph, self.loss_given, list(self.grad_outputs_given or ()) or None)

    @cached_property
    @gc_paused
    def roots(self) -> dict[str, str]:
        return buffer_roots(self.graph)

    @cached_property
    @gc_paused
    def costs(self) -> list[NodeCost]:
        return graph_costs(self.graph, self.tensors)

    @cached_property
    @gc_paused
    def scopes(self) -> list[str]:
        return node_scopes(self.graph)

    @cached_property
    @gc_paused
    def stashed(self) -> tuple[Stashed, ...]:
        return find_stashed(self.graph, self.phases, self.roots)

    @cached_property
    @gc_paused
    def default(self) -> MemoryProfile:
        """ORT DEFAULT order; simulated on first use (a rewrite never needs it)."""
        return simulate(self.graph, schedules.ort_default(self.graph), self.tensors,
                        reuse_buffers=self.reuse_buffers)

    @cached_property
    def scratch(self) -> dict[int, int]:
        """Per step of the PRIORITY_BASED order: the working memory its kernel holds while it
        runs, outside ORT's buffers (``ort.scratch``); steps without any are absent."""
        return step_scratch(self.priority, self.graph, self.tensors)

    @property
    def working_peak_bytes(self) -> int:
        """The PRIORITY_BASED tensor peak with each kernel's working memory at its step (a
        ConvGrad's im2col buffer can top the tensors): the peak a process running it holds."""
        return scratch_peak(self.priority.peak_bytes, self.scratch, self.priority.timeline)

    def profile(self, reuse_buffers: bool) -> MemoryProfile:
        """The PRIORITY_BASED simulation with ORT's buffer reuse on or off (computed once)."""
        if reuse_buffers == self.reuse_buffers:
            return self.priority
        cache, memo = self._memo.profiles, self._memo
        if reuse_buffers not in cache and not reuse_buffers and memo.without_reuse is not None:
            cache[reuse_buffers], memo.without_reuse = memo.without_reuse(), None
        if reuse_buffers not in cache:
            cache[reuse_buffers] = simulate(self.graph, self.priority.order, self.tensors,
                                            reuse_buffers=reuse_buffers)
        return cache[reuse_buffers]

    def arena(self, reuse_buffers: bool) -> "ArenaResult":
        """ORT's arena replayed for the PRIORITY_BASED order, with ORT's buffer reuse on or
        off (computed once each)."""
        cache = self._memo.arenas
        if reuse_buffers not in cache:
            from .arena import predict_in_use

            cache[reuse_buffers] = predict_in_use(self.graph, self.profile(reuse_buffers), self.tensors)
        return cache[reuse_buffers]

    def knows_arena(self, reuse_buffers: bool) -> bool:
        """Whether ``arena(reuse_buffers)`` is already replayed (free to read)."""
        return reuse_buffers in self._memo.arenas

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
        from .arena import small_initializer_bytes

        return self.priority.resident_bytes - small_initializer_bytes(self.graph, self.tensors)

    def remember_arena(self, reuse_buffers: bool, arena: "ArenaResult") -> None:
        """Record ``arena(reuse_buffers)`` where a caller replayed it already."""
        self._memo.arenas[reuse_buffers] = arena

    def derived(self, make: Callable[["Analysis"], _T]) -> _T:
        """``make(self)``, computed once per analysis: for what a caller builds from an analysis
        again and again and never changes (``make`` must be a module-level function)."""
        memo = self._memo.derived
        if make not in memo:
            memo[make] = make(self)
        made: _T = memo[make]  # the memo holds each function's own result
        return made

    @property
    def output_bytes(self) -> int:
        """The graph's outputs (loss, gradients): ORT holds each until the run ends, so
        all of them are live at its last step, whatever the plan."""
        return buffer_bytes(set(self.graph.outputs) - {ABSENT}, self.tensors)

    @cached_property
    def floor(self) -> Floor:
        """A peak no order or recompute plan goes below, and what sets it (``floor.py``)."""
        return plan_floor(self.graph, self.tensors, self.roots, self.priority.resident_bytes, self.output_bytes)

    @property
    def lower_bound_bytes(self) -> int:
        """A peak no order or recompute plan goes below (``floor``)."""
        return self.floor.bytes

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

    def unsized(self) -> dict[str, tuple[str, ...]]:
        """Tensors produced by nodes whose size is unknown, with the missing dimensions
        (found once: a rewrite refuses them, then reports them)."""
        return self.derived(_unsized)


def _unsized(a: Analysis) -> dict[str, tuple[str, ...]]:
    tensors = a.tensors
    return {t: tensors[t].missing if t in tensors else ("?",) for n in a.graph.nodes for t in n.outputs
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


@dataclass(frozen=True)
class Written:
    """What ckpt knows of a graph it wrote itself: its PRIORITY_BASED simulation
    (``priority``, made with ORT's buffer reuse as ``reuse_buffers``). Its phases cannot
    fail to classify: they are left to their first use."""

    priority: MemoryProfile
    reuse_buffers: bool


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
            reuse_buffers: bool | None = None, default_dims: tuple[str, ...] = (),
            written: Written | None = None) -> Analysis:
    """Run every analysis on ``graph``. ``tensors`` may be passed to skip shape inference.
    ``reuse_buffers`` (ORT's enable_mem_reuse) defaults to what the model asks for.
    ``default_dims`` names the entries of ``dims`` that the caller chose, not the user.
    ``written``: the graph is one ckpt wrote, simulated already (with ``tensors``): its
    simulation is taken as it is and its phases are classified on first use; any other
    graph's phases are classified now, so a model without a backward is refused here."""
    if tensors is None:
        tensors = infer_shapes(graph, dims).tensors
        _refuse_unbound_dims(graph, tensors, dims or {})
    if written is not None:
        priority, reuse_buffers, without_reuse = written.priority, written.reuse_buffers, None
    else:
        reuse_buffers = recommended_mem_reuse(graph) if reuse_buffers is None else reuse_buffers
        priority, without_reuse = _priority_simulation(graph, tensors, reuse_buffers)
    a = Analysis(graph=graph, tensors=tensors, priority=priority, reuse_buffers=reuse_buffers, loss_given=loss,
                 grad_outputs_given=tuple(grad_outputs) if grad_outputs else None,
                 dims=tuple(sorted((dims or {}).items())), default_dims=tuple(sorted(default_dims)))
    if written is None:
        a.phases  # noqa: B018 - classified now: its errors belong to loading
    if without_reuse is not None:
        a._memo.without_reuse = without_reuse  # profile(False) without walking the graph again
    return a


__all__ = ["Analysis", "Stashed", "Written", "analyse", "MemoryProfile", "Phases", "TensorInfo", "symbolic_dims",
           "simulate", "schedules"]
