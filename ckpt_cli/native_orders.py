"""ORT's node orders and ckpt's memory-aware order compiled with numba, over ``graph.Edges``.

Each kernel is the plain-Python order it replaces (``analysis/schedules.py``,
``rewrite/order.py``), rule for rule, and gives the same list (tests/test_fast_paths.py
runs both). ``fast.native`` decides when a pass takes a kernel, as for ``native.py``.

The ready queues are binary heaps over one int64 per entry: a node's key and its index
packed so that comparing the ints compares (key, index), as the Python heaps compare tuples.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from .graph import Csr, Edges


class Reads(NamedTuple):
    """``order.BufferReads`` as arrays: per node the distinct buffers it reads (rows) and the
    bytes it allocates; per buffer its bytes (0: never freed) and its readers (rows)."""

    read_ptr: np.ndarray
    read_idx: np.ndarray
    allocs: np.ndarray
    size: np.ndarray
    reader_ptr: np.ndarray
    reader_idx: np.ndarray


@njit(cache=True, inline="always")
def _push(heap: np.ndarray, n: int, v: int) -> int:
    """Push ``v`` onto the min-heap ``heap[:n]``; returns the new length."""
    k = n
    while k > 0:
        parent = (k - 1) >> 1
        if heap[parent] <= v:
            break
        heap[k] = heap[parent]
        k = parent
    heap[k] = v
    return n + 1


@njit(cache=True, inline="always")
def _pop(heap: np.ndarray, n: int) -> int:
    """Remove the least entry of ``heap[:n]`` (returned by the caller reading ``heap[0]``
    first); returns the new length."""
    n -= 1
    v = heap[n]
    k = 0
    while True:
        child = 2 * k + 1
        if child >= n:
            break
        if child + 1 < n and heap[child + 1] < heap[child]:
            child += 1
        if heap[child] >= v:
            break
        heap[k] = heap[child]
        k = child
    if n > 0:
        heap[k] = v
    return n


@njit(cache=True)
def _runs_as_written(at: np.ndarray, position: np.ndarray, e: Edges, high: np.ndarray) -> bool:
    """``schedules._runs_as_written``."""
    last_low = -1
    for k in range(at.shape[0]):
        i = at[k]
        last = -1
        for j in range(e.pred_ptr[i], e.pred_ptr[i + 1]):
            last = max(last, position[e.pred_idx[j]])
        if last >= k:
            return False
        if not high[i]:
            last_low = k
        elif last < last_low:
            return False
    return True


@njit(cache=True)
def priority_based(at: np.ndarray, e: Edges, high: np.ndarray) -> np.ndarray:
    """``schedules.priority_based`` over ``at`` (ORT's node index -> node)."""
    n = at.shape[0]
    position = np.empty(n, dtype=np.int64)
    for p in range(n):
        position[at[p]] = p
    if _runs_as_written(at, position, e, high):
        return at.copy()
    indegree = np.diff(e.pred_ptr)
    heap = np.empty(n, dtype=np.int64)
    size = 0
    for i in range(n):
        if indegree[i] == 0:
            size = _push(heap, size, position[i] + (0 if high[i] else n))
    order = np.empty(n, dtype=np.int64)
    done = 0
    while size > 0:
        k = heap[0]
        size = _pop(heap, size)
        i = at[k if k < n else k - n]
        order[done] = i
        done += 1
        for j in range(e.succ_ptr[i], e.succ_ptr[i + 1]):
            s = e.succ_idx[j]
            indegree[s] -= 1
            if indegree[s] == 0:
                size = _push(heap, size, position[s] + (0 if high[s] else n))
    return order[:done]


@njit(cache=True)
def ort_default(e: Edges) -> np.ndarray:
    """``schedules.ort_default``: ORT's reverse depth-first walk, producers visited highest
    index first."""
    n = e.pred_ptr.shape[0] - 1
    has_consumer = np.zeros(n, dtype=np.bool_)
    for j in range(e.pred_idx.shape[0]):
        has_consumer[e.pred_idx[j]] = True
    stack = np.empty(2 * n + e.pred_idx.shape[0] + 1, dtype=np.int64)  # node * 2 + leaving
    top = 0
    for i in range(n):
        if not has_consumer[i]:
            stack[top] = 2 * i
            top += 1
    visited = np.zeros(n, dtype=np.bool_)
    order = np.empty(n, dtype=np.int64)
    producers = np.empty(max(1, int(np.max(np.diff(e.pred_ptr))) if n else 1), dtype=np.int64)
    done = 0
    while top > 0:
        top -= 1
        i, leaving = stack[top] >> 1, stack[top] & 1
        if leaving:
            order[done] = i
            done += 1
            continue
        if visited[i]:
            continue
        visited[i] = True
        stack[top] = 2 * i + 1
        top += 1
        count = _sorted_into(producers, e.pred_idx, e.pred_ptr[i], e.pred_ptr[i + 1])
        for k in range(count):
            if not visited[producers[k]]:
                stack[top] = 2 * producers[k]
                top += 1
    return order[:done]


@njit(cache=True, inline="always")
def _sorted_into(out: np.ndarray, values: np.ndarray, start: int, stop: int) -> int:
    """``values[start:stop]`` sorted into ``out`` (insertion: a node has a few producers)."""
    count = 0
    for j in range(start, stop):
        v = values[j]
        k = count
        while k > 0 and out[k - 1] > v:
            out[k] = out[k - 1]
            k -= 1
        out[k] = v
        count += 1
    return count


@njit(cache=True)
def buffer_reads(rows: Csr, root: np.ndarray, own_bytes: np.ndarray, size: np.ndarray) -> Reads:
    """``order.buffer_reads`` from each tensor id's buffer (``root``) and bytes."""
    n = rows.in_ptr.shape[0] - 1
    seen = np.full(size.shape[0], -1, dtype=np.int64)  # the last node that read each buffer
    read_ptr = np.zeros(n + 1, dtype=np.int64)
    read_idx = np.empty(rows.in_ids.shape[0], dtype=np.int64)
    count = np.zeros(size.shape[0] + 1, dtype=np.int64)
    allocs = np.zeros(n, dtype=np.int64)
    w = 0
    for i in range(n):
        for j in range(rows.in_ptr[i], rows.in_ptr[i + 1]):
            t = rows.in_ids[j]
            if t >= 0 and seen[root[t]] != i:
                seen[root[t]] = i
                read_idx[w] = root[t]
                count[root[t] + 1] += 1
                w += 1
        read_ptr[i + 1] = w
        for j in range(rows.out_ptr[i], rows.out_ptr[i + 1]):
            t = rows.out_ids[j]
            if t >= 0 and root[t] == t:
                allocs[i] += own_bytes[t]
    reader_ptr = np.cumsum(count)
    fill = reader_ptr[:-1].copy()
    reader_idx = np.empty(w, dtype=np.int64)
    for i in range(n):
        for j in range(read_ptr[i], read_ptr[i + 1]):
            b = read_idx[j]
            reader_idx[fill[b]] = i
            fill[b] += 1
    return Reads(read_ptr, read_idx[:w], allocs, size, reader_ptr, reader_idx)


@njit(cache=True, inline="always")
def _klass(r: Reads, remaining: np.ndarray, movable: np.ndarray, lazy: np.ndarray, i: int) -> int:
    if not movable[i]:
        return 1
    gain = -r.allocs[i]
    for j in range(r.read_ptr[i], r.read_ptr[i + 1]):
        if remaining[r.read_idx[j]] == 1:
            gain += r.size[r.read_idx[j]]
    return 0 if gain > 0 or (gain == 0 and not lazy[i]) else 1


@njit(cache=True)
def _lazy_keys(e: Edges, lazy: np.ndarray) -> np.ndarray:
    n = lazy.shape[0]
    key = np.arange(n, dtype=np.int64)
    for i in range(n - 1, -1, -1):
        if lazy[i] and e.succ_ptr[i + 1] > e.succ_ptr[i]:
            key[i] = n
            for j in range(e.succ_ptr[i], e.succ_ptr[i + 1]):
                key[i] = min(key[i], key[e.succ_idx[j]])
    return key


@njit(cache=True)
def memory_aware(e: Edges, r: Reads, movable: np.ndarray, lazy: np.ndarray) -> np.ndarray:
    """``order.memory_aware``; ``lazy`` all False stands for no lazy nodes. An entry packs
    (class, key, node) as ``(class * n + key) * n + node``."""
    n = movable.shape[0]
    key = _lazy_keys(e, lazy)
    remaining = np.diff(r.reader_ptr)
    indegree = np.diff(e.pred_ptr)
    heap = np.empty(n + r.read_idx.shape[0] + e.succ_idx.shape[0] + 1, dtype=np.int64)
    size = 0
    for i in range(n):
        if indegree[i] == 0:
            size = _push(heap, size, (_klass(r, remaining, movable, lazy, i) * n + key[i]) * n + i)
    done = np.zeros(n, dtype=np.bool_)
    mark = np.full(n, -1, dtype=np.int64)  # the step that last touched each node
    touched = np.empty(n, dtype=np.int64)
    order = np.empty(n, dtype=np.int64)
    steps = 0
    while size > 0:
        v = heap[0]
        size = _pop(heap, size)
        i = v % n
        if done[i] or v // (n * n) != _klass(r, remaining, movable, lazy, i):
            continue
        done[i] = True
        order[steps] = i
        count = 0
        for j in range(r.read_ptr[i], r.read_ptr[i + 1]):
            b = r.read_idx[j]
            remaining[b] -= 1
            if remaining[b] == 1:
                for m in range(r.reader_ptr[b], r.reader_ptr[b + 1]):
                    s = r.reader_idx[m]
                    if not done[s] and mark[s] != steps:
                        mark[s] = steps
                        touched[count] = s
                        count += 1
        for j in range(e.succ_ptr[i], e.succ_ptr[i + 1]):
            s = e.succ_idx[j]
            indegree[s] -= 1
            if indegree[s] == 0 and mark[s] != steps:
                mark[s] = steps
                touched[count] = s
                count += 1
        # pushed once the step's counts are all in, as the Python order does
        for m in range(count):
            s = touched[m]
            if indegree[s] == 0 and not done[s]:
                size = _push(heap, size, (_klass(r, remaining, movable, lazy, s) * n + key[s]) * n + s)
        steps += 1
    return order[:steps]
