"""Bytes in use after each step of an order, from the planner's buffers."""

from __future__ import annotations

from .planner import Buffers


def bytes_in_use(buffers: Buffers, steps: int, base: int) -> list[int]:
    """After each node: ``base`` plus every buffer allocated so far and not yet released
    (a buffer released after step k still counts at step k)."""
    alloc = [0] * (steps + 1)
    free = [0] * (steps + 1)
    for size, born, dies in zip(buffers.size, buffers.born, buffers.dies):
        alloc[born] += size
        free[dies] += size
    live = base
    out: list[int] = []
    for k in range(steps):
        live += alloc[k]
        out.append(live)
        live -= free[k]
    return out


def peak_of(timeline: list[int], base: int) -> tuple[int, int]:
    """(peak bytes, first step where it is reached); ``base`` at step 0 for an empty order."""
    peak, step = base, 0
    for k, v in enumerate(timeline):
        if v > peak:
            peak, step = v, k
    return peak, step


def live_at(buffers: Buffers, step: int, names: list[str]) -> tuple[str, ...]:
    """The tensors holding the buffers live at ``step``, largest buffer first."""
    live = sorted((b for b, (born, dies) in enumerate(zip(buffers.born, buffers.dies)) if born <= step <= dies),
                  key=lambda b: -buffers.size[b])
    return tuple(names[next(t for k, t in reversed(buffers.holders[b]) if k <= step)] for b in live)
