"""``--activation-budget F``: PyTorch's ``activation_memory_budget`` in ckpt's terms.

PyTorch users size recompute as a share of the activation bytes a partition saves for the
backward, not as a share of the peak. ckpt's reading of that knob:

1. The reference is the plan that recomputes nothing: the bytes of the distinct buffers
   the backward reads (views count once, with their buffer; parameters, inputs and graph
   outputs are held anyway and count as nothing). PyTorch's reference is its default
   min-cut partition (budget 1), which already recomputes cheap fusible ops, less the
   inputs; so PyTorch's F keeps fewer bytes than ckpt's same F.
2. The answer is the tensor-level cut that keeps at most F of those bytes with the fewest
   matmul FLOPs recomputed, then the least recompute cost (``mincut.solve_bytes``: a MILP
   between the corners of the min-cut front), as a plan of regions like every strategy's.
3. F = 1 recomputes nothing (an empty plan: the reordered original); F = 0 recomputes all
   it can, as PyTorch's 0 does. Below the fewest bytes any cut keeps (ops that cannot be
   copied: random ones, subgraphs, ``--keep-ops``) no plan exists and the command says so
   (exit 3, as an unreachable ``--budget``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..analysis import Analysis
from ..errors import BudgetUnreachable
from ..units import human_bytes
from . import mincut
from .plan import Plan, Policy


@dataclass(frozen=True)
class ActivationBudget:
    """The choice ``--activation-budget`` made, as reports give it."""

    share: float  # F, as given
    no_recompute_bytes: int  # the reference: what the backward reads when nothing is recomputed
    limit_bytes: int  # F of the reference
    kept_bytes: int  # what the chosen cut keeps (<= limit_bytes)
    kept_share: float  # kept_bytes of no_recompute_bytes
    recompute_matmul_flops: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def no_recompute_bytes(problem: mincut.Problem) -> int:
    """Activation bytes the backward reads when nothing is recomputed: the cut at price 0,
    where keeping a byte costs nothing."""
    return mincut.solve(problem, 0.0).kept_bytes


def activation_budget_plan(a: Analysis, share: float,
                           policy: Policy = Policy()) -> tuple[Plan, ActivationBudget]:
    """The plan, and the record of its choice, keeping at most ``share`` of the no-recompute plan's activation bytes
    with the fewest matmul FLOPs recomputed (module docstring)."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"activation budget must be in [0, 1], got {share!r}")
    problem = mincut.build(a, policy)
    base = no_recompute_bytes(problem)
    limit = int(share * base)
    if limit >= base and not policy.recompute_ops:
        return _nothing_recomputed(share, base)
    cut = mincut.solve_bytes(problem, limit, matmul_first=True) or _corner(problem, limit, share, base)
    plan = mincut.to_plan(a, cut, "activation-budget")
    plan.notes.append(f"activation budget {share:g}: keeps {human_bytes(cut.kept_bytes)} of the "
                      f"{human_bytes(base)} the backward reads without recompute "
                      f"({_share(cut.kept_bytes, base):.3f}), recomputes {cut.matmul_flops / 1e6:.1f} M "
                      f"matmul FLOPs")
    return plan, ActivationBudget(share, base, limit, cut.kept_bytes, _share(cut.kept_bytes, base),
                                  cut.matmul_flops)


def _corner(problem: mincut.Problem, limit: int, share: float, base: int) -> mincut.Cut:
    """Where the MILP answers nothing: unreachable when the cut keeping the fewest bytes
    keeps more than ``limit``; else (no MILP answer in time) the front's corner under it
    with the fewest matmul FLOPs."""
    floor = mincut.solve(problem, float(problem.cost.sum()) + 1.0)
    if floor.kept_bytes > limit:
        raise BudgetUnreachable(
            f"activation budget {share:g} ({human_bytes(limit)} of {human_bytes(base)}) is unreachable: no plan "
            f"keeps less than {human_bytes(floor.kept_bytes)} ({_share(floor.kept_bytes, base):.3f} of the "
            "activations; random ops, subgraphs and --keep-ops are never recomputed)")
    return min((c for c in mincut.front(problem) if c.kept_bytes <= limit), key=lambda c: (c.matmul_flops, c.cost))


def _nothing_recomputed(share: float, base: int) -> tuple[Plan, ActivationBudget]:
    """The no-recompute plan itself: the cut would copy only views, for nothing."""
    plan = Plan([], "activation-budget")
    plan.notes.append(f"activation budget {share:g}: the {human_bytes(base)} the backward reads without "
                      "recompute fit; nothing is recomputed")
    return plan, ActivationBudget(share, base, base, base, _share(base, base), 0)


def _share(kept: int, base: int) -> float:
    return kept / base if base else 0.0
