"""The whole-graph sequential passes compiled to machine code with numba, over the integer
tensor ids the graph already builds (``graph.TensorIds``) laid out as flat arrays.

Each kernel here is the plain-Python pass it replaces, rule for rule, and gives the same
result (tests/test_fast_paths.py runs both). Only ``fast.native`` decides that a pass
takes a kernel: importing numba and loading the kernels costs 0.6-0.7 s, more than a
small graph's passes take in Python. The compiled kernels are cached on disk (``cache=True``), so a
process compiles each one once per install, not once per run.

The kernels take their arrays in named tuples (``graph.Csr`` and those below: numba
compiles a tuple of arrays as one argument).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from .graph import Csr


class Facts(NamedTuple):
    """``planner.TensorFacts``' arrays: per node its op's kind; per tensor its reuse class,
    bytes (-1: unknown) and ``_same_size`` class (-1: it matches none)."""

    kinds: np.ndarray
    reuse: np.ndarray
    sizes: np.ndarray
    same: np.ndarray


class Life(NamedTuple):
    """``lifetimes.Lifetimes``' arrays, by tensor id."""

    last_read: np.ndarray
    uses: np.ndarray
    resident: np.ndarray
    is_output: np.ndarray


VIEW, IN_PLACE = 1, 2


@njit(cache=True)
def reads_and_uses(order: np.ndarray, rows: Csr, count: int) -> tuple[np.ndarray, np.ndarray]:
    """``lifetimes``' walk: per tensor, the step of its last read (-1: none) and its uses."""
    last_read = np.full(count, -1, dtype=np.int64)
    uses = np.zeros(count, dtype=np.int64)
    for k in range(order.shape[0]):
        i = order[k]
        for j in range(rows.in_ptr[i], rows.in_ptr[i + 1]):
            t = rows.in_ids[j]
            if t >= 0:
                last_read[t] = k
                uses[t] += 1
        for j in range(rows.out_ptr[i], rows.out_ptr[i + 1]):
            t = rows.out_ids[j]
            if t >= 0:
                uses[t] += 1
    return last_read, uses


@njit(cache=True)
def planner_walk(order: np.ndarray, rows: Csr, facts: Facts, life: Life, n_classes: int,
                 reuse_buffers: bool) -> tuple[np.ndarray, ...]:
    """``planner._Walk.run``: ORT's planner over ``order``. Returns per buffer its size,
    step born, last read (-1: none) and holder count; the holders in assignment order
    (buffer, step, tensor); the takes (buffer, holder position); the unsized tensors.
    One loop over locals: the same walk split into helpers that read its arrays out of a
    tuple ran 4x slower than this one at 100k nodes."""
    in_ptr, in_ids, out_ptr, out_ids = rows
    kinds, reuse, sizes, same = facts
    last_read, uses, resident, is_output = life
    resident = resident.copy()  # views of resident tensors join them
    (buffer_of, owner_class, left, size, born, dies, held, h_buf, h_step, h_t, take_b, take_pos, unsized, head,
     entry_buf, entry_next) = _walk_arrays(rows, resident.shape[0], n_classes)
    nb = nh = nt = nu = ne = 0  # buffers, holders, takes, unsized tensors, free-list entries
    for k in range(order.shape[0]):
        i = order[k]
        kind = kinds[i]
        src = in_ids[in_ptr[i]] if in_ptr[i + 1] > in_ptr[i] else -1
        for pos in range(out_ptr[i + 1] - out_ptr[i]):
            t = out_ids[out_ptr[i] + pos]
            if t < 0:
                continue
            if is_output[t]:
                b = -1
            elif pos == 0 and kind == VIEW and src >= 0 and (resident[src] or buffer_of[src] >= 0):
                if resident[src]:
                    resident[t] = True
                    continue
                b = buffer_of[src]
            elif (pos == 0 and kind == IN_PLACE and src >= 0 and buffer_of[src] >= 0
                  and left[buffer_of[src]] == 1 and same[src] >= 0 and same[src] == same[t]):
                b = buffer_of[src]
            elif last_read[t] < 0 or not reuse_buffers or reuse[t] < 0 or head[reuse[t]] < 0:
                b = -1
            else:
                e = head[reuse[t]]
                head[reuse[t]] = entry_next[e]
                b = entry_buf[e]
                take_b[nt], take_pos[nt], nt = b, held[b], nt + 1
            if b < 0:  # a new buffer
                b, nb = nb, nb + 1
                size[b], owner_class[b], left[b], born[b], dies[b] = max(sizes[t], 0), reuse[t], 0, k, -1
                take_b[nt], take_pos[nt], nt = b, 0, nt + 1
                if sizes[t] < 0:
                    unsized[nu], nu = t, nu + 1
            buffer_of[t] = b
            left[b] += uses[t]
            h_buf[nh], h_step[nh], h_t[nh] = b, k, t
            nh += 1
            held[b] += 1
            dies[b] = max(dies[b], last_read[t])
        for ptr, ids in ((in_ptr, in_ids), (out_ptr, out_ids)):
            for j in range(ptr[i], ptr[i + 1]):
                t = ids[j]
                if t >= 0 and not resident[t] and buffer_of[t] >= 0:  # (an input no node in the order makes)
                    b = buffer_of[t]
                    left[b] -= 1
                    if left[b] == 0 and owner_class[b] >= 0:
                        entry_buf[ne], entry_next[ne] = b, head[owner_class[b]]
                        head[owner_class[b]] = ne
                        ne += 1
    return (size[:nb], born[:nb], dies[:nb], held[:nb], h_buf[:nh], h_step[:nh], h_t[:nh], take_b[:nt],
            take_pos[:nt], unsized[:nu])


@njit(cache=True)
def _walk_arrays(rows: Csr, count: int, n_classes: int) -> tuple[np.ndarray, ...]:
    """``planner_walk``'s arrays: per tensor its buffer; per buffer its class, uses left,
    size, step born, last read and holder count; the holders (buffer, step, tensor) and
    takes (buffer, position) in order; the unsized tensors; each class's free list, a stack
    of entries (a buffer may stand in it more than once): its head, entries' buffer and next."""
    slots = rows.out_ids.shape[0] + 1  # a buffer, holder, take or unsized tensor per output at most
    entries = rows.in_ids.shape[0] + slots  # an entry per use counted down at most

    def ints(n: int) -> np.ndarray:
        return np.empty(n, dtype=np.int64)

    return (np.full(count, -1, dtype=np.int64), ints(slots), ints(slots), ints(slots), ints(slots), ints(slots),
            np.zeros(slots, dtype=np.int64), ints(slots), ints(slots), ints(slots), ints(slots), ints(slots),
            ints(slots), np.full(max(n_classes, 1), -1, dtype=np.int64), ints(entries), ints(entries))


class Taken(NamedTuple):
    """A walk's buffers as ``takes_apart`` reads them: per buffer its size and last read,
    its holders' runs (``start``) and holders' tensors; the takes (buffer, position)."""

    size: np.ndarray
    dies: np.ndarray
    start: np.ndarray
    h_step: np.ndarray
    h_t: np.ndarray
    take_b: np.ndarray
    take_pos: np.ndarray


@njit(cache=True)
def takes_apart(walked: Taken, last_read: np.ndarray, steps: int) -> tuple[np.ndarray, ...]:
    """``planner.without_reuse``: each take of a buffer made a buffer of its own, holding
    its holders up to the next take. Returns per new buffer its size, step born and last
    read, its holders' runs (``start``) and which old holders they are, in order."""
    start, nt = walked.start, walked.take_b.shape[0]
    end = _take_ends(walked)
    new_size = np.empty(nt, dtype=np.int64)
    new_born = np.empty(nt, dtype=np.int64)
    new_dies = np.empty(nt, dtype=np.int64)
    new_start = np.empty(nt + 1, dtype=np.int64)
    taken = np.empty(walked.h_step.shape[0], dtype=np.int64)
    n = 0
    for e in range(nt):
        b, pos = walked.take_b[e], walked.take_pos[e]
        first, stop = start[b] + pos, start[b] + end[e]
        new_start[e] = n
        d = -1
        for j in range(first, stop):
            taken[n] = j
            n += 1
            d = max(d, last_read[walked.h_t[j]])
        if pos == 0 and end[e] == start[b + 1] - start[b]:  # never reused: the buffer as it is
            new_dies[e] = walked.dies[b]
        else:
            new_dies[e] = steps if d < 0 else min(d, steps)
        new_size[e] = walked.size[b]
        new_born[e] = walked.h_step[first]
    new_start[nt] = n
    return new_size, new_born, new_dies, new_start, taken[:n]


@njit(cache=True)
def _take_ends(walked: Taken) -> np.ndarray:
    """Per take, the holder position where its holders end: the next take of its buffer."""
    nt = walked.take_b.shape[0]
    end = np.empty(nt, dtype=np.int64)
    nxt = np.full(walked.size.shape[0], -1, dtype=np.int64)
    for e in range(nt - 1, -1, -1):
        b = walked.take_b[e]
        end[e] = walked.start[b + 1] - walked.start[b] if nxt[b] < 0 else nxt[b]
        nxt[b] = walked.take_pos[e]
    return end
