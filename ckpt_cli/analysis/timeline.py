"""Bytes in use after each step of an order, from the planner's buffers."""

from __future__ import annotations

import numpy as np

from .planner import Buffers


def bytes_in_use(buffers: Buffers, steps: int, base: int) -> list[int]:
    """After each node: ``base`` plus every buffer allocated so far and not yet released
    (a buffer released after step k still counts at step k)."""
    size = np.asarray(buffers.size, dtype=np.int64)
    alloc = np.zeros(steps + 1, dtype=np.int64)
    free = np.zeros(steps + 1, dtype=np.int64)
    np.add.at(alloc, np.asarray(buffers.born, dtype=np.int64), size)
    np.add.at(free, np.asarray(buffers.dies, dtype=np.int64), size)
    # after step k: all allocated up to k, less all released before k
    released_before = np.cumsum(free[:steps]) - free[:steps]
    in_use: list[int] = (base + np.cumsum(alloc[:steps]) - released_before).tolist()
    return in_use


def peak_of(timeline: list[int], base: int) -> tuple[int, int]:
    """(peak bytes, first step where it is reached); ``base`` at step 0 for an empty order."""
    if not timeline:
        return base, 0
    values = np.asarray(timeline, dtype=np.int64)
    step = int(np.argmax(values))
    return (int(values[step]), step) if values[step] > base else (base, 0)


def live_at(buffers: Buffers, step: int, names: list[str]) -> tuple[str, ...]:
    """The tensors holding the buffers live at ``step``, largest buffer first."""
    born, dies = np.asarray(buffers.born, dtype=np.int64), np.asarray(buffers.dies, dtype=np.int64)
    at = np.flatnonzero((born <= step) & (step <= dies))
    live: list[int] = at[np.argsort(-np.asarray(buffers.size, dtype=np.int64)[at], kind="stable")].tolist()
    return tuple(names[next(t for k, t in reversed(buffers.holders[b]) if k <= step)] for b in live)
