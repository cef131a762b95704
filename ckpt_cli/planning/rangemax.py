"""Range add and range max over the steps of a schedule, for the greedy keep-set fill.

Square-root blocks held in numpy arrays: a query or an update touches two partial blocks
and a slice of block maxima, each one vectorised call, where a recursive lazy segment
tree in Python makes many interpreted calls per operation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


class RangeMax:
    """Integer values over positions 0..n-1: ``add(lo, hi, v)`` adds ``v`` to every
    position in [lo, hi]; ``max(lo, hi)`` is the largest value in [lo, hi]. Exact (int64)."""

    def __init__(self, values: Sequence[int]) -> None:
        n = max(1, len(values))
        self.block = b = max(16, int(math.isqrt(n)))
        blocks = -(-n // b)
        self.values = np.full(blocks * b, np.iinfo(np.int64).min // 4, dtype=np.int64)
        self.values[:len(values)] = np.asarray(values, dtype=np.int64)
        self.added = np.zeros(blocks, dtype=np.int64)  # pending add of a whole block
        self.top = self.values.reshape(blocks, b).max(axis=1)  # block max, without ``added``

    def _partial_max(self, k: int, lo: int, hi: int) -> int:
        return int(self.values[lo:hi + 1].max()) + int(self.added[k])

    def _partial_add(self, k: int, lo: int, hi: int, value: int) -> None:
        self.values[lo:hi + 1] += value
        b = self.block
        self.top[k] = self.values[k * b:(k + 1) * b].max()

    def max(self, lo: int, hi: int) -> int:
        b = self.block
        first, last = lo // b, hi // b
        if first == last:
            return self._partial_max(first, lo, hi)
        best = max(self._partial_max(first, lo, (first + 1) * b - 1), self._partial_max(last, last * b, hi))
        if last > first + 1:
            best = max(best, int((self.top[first + 1:last] + self.added[first + 1:last]).max()))
        return best

    def add(self, lo: int, hi: int, value: int) -> None:
        b = self.block
        first, last = lo // b, hi // b
        if first == last:
            self._partial_add(first, lo, hi, value)
            return
        self._partial_add(first, lo, (first + 1) * b - 1, value)
        self._partial_add(last, last * b, hi, value)
        self.added[first + 1:last] += value
