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


# -- ORT's BFC arena (analysis/arena.py) ------------------------------------------------------


class Requests(NamedTuple):
    """``arena._Replay``'s request sequence: per buffer its size; per step (and one past the
    last) the buffers allocated there and those released after it, in compressed rows; the
    steps that do anything, in order; per step its kernel plan's events (kind, bytes) in
    compressed rows (``PLAN_*`` kinds, none for a step without a plan)."""

    sizes: np.ndarray
    alloc_ptr: np.ndarray
    alloc_ids: np.ndarray
    free_ptr: np.ndarray
    free_ids: np.ndarray
    busy: np.ndarray
    plan_ptr: np.ndarray
    plan_events: np.ndarray


PLAN_OUT, PLAN_TMP, PLAN_FREE_TMP, PLAN_DROP_TMP = 0, 1, 2, 3

# The arena's state is five arrays, passed one by one: a kernel that took them in one tuple
# spent most of its time handing the tuple from call to call (1.2 us an alloc and free).
# ``chunks``, per chunk id: its address, size, previous and next chunk (-1: none) and
# requested bytes (-1: free).
_ADDR, _SIZE, _PREV, _NEXT, _REQ = range(5)
# ``stats``: bytes in use (chunk sizes), requested bytes in use, bytes held, the lowest address
# so far, the next region's size, the counts of chunks and regions; the free set's directory
# length, blocks made and spare blocks, and 1 once a split found no block left (the replay is
# then void: its caller runs it again with more); the minimum allocation, max dead bytes per
# chunk and max power-of-two extend bytes.
(_IN_USE, _REQUESTED, _HELD, _LOW, _CURR, _CHUNKS, _REGIONS, _DIR, _MADE, _SPARE, _OVERFLOW, _UNIT, _MAX_DEAD,
 _MAX_EXTEND) = range(14)
# The free chunks, sorted by (size, address), in blocks of fewer than BLOCK entries
# (``free_keys[block, i]``: size, address, chunk id) and a directory of the blocks in key order:
# inserting or removing one moves at most a block and the directory (one sorted array moved
# ~1,300 entries a call at 100k nodes). ``free_meta``: per block its length; the directory;
# the spare blocks.
BLOCK = 64
_LENGTH, _ORDER, _SPARE_IDS = range(3)


class Arena(NamedTuple):
    """``arena.BFCArena``'s state (the layout above); ``regions``: their sizes in creation order."""

    chunks: np.ndarray
    free_keys: np.ndarray
    free_meta: np.ndarray
    stats: np.ndarray
    regions: np.ndarray


def new_arena(chunks: int, blocks: int, initial: int, top: int, config: tuple[int, int, int]) -> Arena:
    """An empty arena with room for ``chunks`` chunks and regions and ``blocks`` free blocks;
    ``config``: the minimum allocation, max dead bytes per chunk, max power-of-two extend."""
    stats = np.zeros(14, dtype=np.int64)
    stats[_LOW], stats[_CURR] = top, initial
    stats[_UNIT], stats[_MAX_DEAD], stats[_MAX_EXTEND] = config
    return Arena(np.empty((chunks, 5), dtype=np.int64), np.empty((blocks, BLOCK, 3), dtype=np.int64),
                 np.zeros((3, blocks), dtype=np.int64), stats, np.empty(chunks, dtype=np.int64))


def overflowed(a: Arena) -> bool:
    return bool(a.stats[_OVERFLOW])


def region_sizes(a: Arena) -> np.ndarray:
    """The sizes of the regions ``a`` reserved, in creation order."""
    return a.regions[:a.stats[_REGIONS]]


@njit(cache=True)
def _below(keys: np.ndarray, b: int, i: int, size: int, addr: int) -> bool:
    """Whether entry ``i`` of block ``b`` sorts below (size, addr)."""
    return bool(keys[b, i, 0] < size or (keys[b, i, 0] == size and keys[b, i, 1] < addr))


@njit(cache=True)
def _find(keys: np.ndarray, meta: np.ndarray, stats: np.ndarray, size: int, addr: int) -> tuple[int, int]:
    """(directory position, index) of the first free chunk not below (size, addr)
    (``bisect_left``); (the directory's length, 0) when there is none."""
    lo, hi = 0, stats[_DIR]
    while lo < hi:  # the first block whose last entry is not below
        mid = (lo + hi) // 2
        b = meta[_ORDER, mid]
        if _below(keys, b, meta[_LENGTH, b] - 1, size, addr):
            lo = mid + 1
        else:
            hi = mid
    if lo == stats[_DIR]:
        return lo, 0
    b = meta[_ORDER, lo]
    i, hi = 0, meta[_LENGTH, b]
    while i < hi:
        mid = (i + hi) // 2
        if _below(keys, b, mid, size, addr):
            i = mid + 1
        else:
            hi = mid
    return lo, i


@njit(cache=True)
def _insert(keys: np.ndarray, meta: np.ndarray, stats: np.ndarray, size: int, addr: int, c: int) -> None:
    if stats[_OVERFLOW]:
        return
    p, i = _find(keys, meta, stats, size, addr)
    if stats[_DIR] == 0:
        p, i = 0, 0
        _new_block(meta, stats, 0)
    elif p == stats[_DIR]:  # above every entry: the end of the last block
        p -= 1
        i = meta[_LENGTH, meta[_ORDER, p]]
    b = meta[_ORDER, p]
    for j in range(meta[_LENGTH, b], i, -1):
        keys[b, j, 0], keys[b, j, 1], keys[b, j, 2] = keys[b, j - 1, 0], keys[b, j - 1, 1], keys[b, j - 1, 2]
    keys[b, i, 0], keys[b, i, 1], keys[b, i, 2] = size, addr, c
    meta[_LENGTH, b] += 1
    if meta[_LENGTH, b] == BLOCK:  # split: the upper half to a new block after it
        half = BLOCK // 2
        n = _new_block(meta, stats, p + 1)
        if n >= 0:
            for j in range(half):
                keys[n, j, 0], keys[n, j, 1], keys[n, j, 2] = keys[b, half + j, 0], keys[b, half + j, 1], keys[b, half + j, 2]
            meta[_LENGTH, n], meta[_LENGTH, b] = half, half


@njit(cache=True)
def _new_block(meta: np.ndarray, stats: np.ndarray, p: int) -> int:
    """A new empty block at directory position ``p`` (-1: none left)."""
    if stats[_SPARE]:
        stats[_SPARE] -= 1
        n = meta[_SPARE_IDS, stats[_SPARE]]
    elif stats[_MADE] < meta.shape[1]:
        n = stats[_MADE]
        stats[_MADE] += 1
    else:
        stats[_OVERFLOW] = 1
        return -1
    for j in range(stats[_DIR], p, -1):
        meta[_ORDER, j] = meta[_ORDER, j - 1]
    meta[_ORDER, p], meta[_LENGTH, n] = n, 0
    stats[_DIR] += 1
    return int(n)


@njit(cache=True)
def _remove(keys: np.ndarray, meta: np.ndarray, stats: np.ndarray, p: int, i: int) -> None:
    b = meta[_ORDER, p]
    for j in range(i, meta[_LENGTH, b] - 1):
        keys[b, j, 0], keys[b, j, 1], keys[b, j, 2] = keys[b, j + 1, 0], keys[b, j + 1, 1], keys[b, j + 1, 2]
    meta[_LENGTH, b] -= 1
    if meta[_LENGTH, b] == 0:
        for j in range(p, stats[_DIR] - 1):
            meta[_ORDER, j] = meta[_ORDER, j + 1]
        stats[_DIR] -= 1
        meta[_SPARE_IDS, stats[_SPARE]] = b
        stats[_SPARE] += 1


@njit(cache=True)
def _chunk(chunks: np.ndarray, stats: np.ndarray, addr: int, size: int, prev: int, nxt: int) -> int:
    c = stats[_CHUNKS]
    stats[_CHUNKS] = c + 1
    chunks[c, _ADDR], chunks[c, _SIZE], chunks[c, _PREV], chunks[c, _NEXT], chunks[c, _REQ] = addr, size, prev, nxt, -1
    return int(c)


@njit(cache=True)
def _extend(chunks: np.ndarray, keys: np.ndarray, meta: np.ndarray, stats: np.ndarray, regions: np.ndarray,
            rounded: int) -> None:
    """``BFCArena._extend``: a new region below the others, one free chunk."""
    increased = False
    while rounded > stats[_CURR]:
        stats[_CURR] *= 2
        increased = True
    nbytes = stats[_CURR]
    if not increased:
        cap = stats[_MAX_EXTEND]
        stats[_CURR] = stats[_CURR] * 2 if stats[_CURR] < cap // 2 else cap
    stats[_LOW] -= nbytes
    regions[stats[_REGIONS]] = nbytes
    stats[_REGIONS] += 1
    stats[_HELD] += nbytes
    c = _chunk(chunks, stats, stats[_LOW], nbytes, -1, -1)
    _insert(keys, meta, stats, nbytes, stats[_LOW], c)


@njit(cache=True)
def alloc(chunks: np.ndarray, keys: np.ndarray, meta: np.ndarray, stats: np.ndarray, regions: np.ndarray,
          num_bytes: int) -> int:
    """``BFCArena.alloc``: the chunk id given (-1 for 0 bytes)."""
    if num_bytes <= 0:
        return -1
    unit = stats[_UNIT]
    rounded = unit * ((num_bytes + unit - 1) // unit)
    p, i = _find(keys, meta, stats, rounded, -(1 << 62))
    if p == stats[_DIR]:
        _extend(chunks, keys, meta, stats, regions, rounded)
        p, i = _find(keys, meta, stats, rounded, -(1 << 62))
    c = keys[meta[_ORDER, p], i, 2]
    _remove(keys, meta, stats, p, i)
    csize = chunks[c, _SIZE]
    if csize >= 2 * rounded or csize - rounded >= stats[_MAX_DEAD]:
        nxt = chunks[c, _NEXT]
        rest = _chunk(chunks, stats, chunks[c, _ADDR] + rounded, csize - rounded, c, nxt)
        if nxt >= 0:
            chunks[nxt, _PREV] = rest
        chunks[c, _NEXT] = rest
        chunks[c, _SIZE] = csize = rounded
        _insert(keys, meta, stats, chunks[rest, _SIZE], chunks[rest, _ADDR], rest)
    chunks[c, _REQ] = num_bytes
    stats[_IN_USE] += csize
    stats[_REQUESTED] += num_bytes
    return int(c)


@njit(cache=True)
def free(chunks: np.ndarray, keys: np.ndarray, meta: np.ndarray, stats: np.ndarray, c: int) -> None:
    """``BFCArena.free``: chunk ``c`` released and merged with its free neighbours."""
    if c < 0:
        return
    stats[_REQUESTED] -= chunks[c, _REQ]
    stats[_IN_USE] -= chunks[c, _SIZE]
    chunks[c, _REQ] = -1
    nxt = chunks[c, _NEXT]
    if nxt >= 0 and chunks[nxt, _REQ] < 0:
        p, i = _find(keys, meta, stats, chunks[nxt, _SIZE], chunks[nxt, _ADDR])
        _remove(keys, meta, stats, p, i)
        _merge(chunks, c, nxt)
    prv = chunks[c, _PREV]
    if prv >= 0 and chunks[prv, _REQ] < 0:
        p, i = _find(keys, meta, stats, chunks[prv, _SIZE], chunks[prv, _ADDR])
        _remove(keys, meta, stats, p, i)
        _merge(chunks, prv, c)
        c = prv
    _insert(keys, meta, stats, chunks[c, _SIZE], chunks[c, _ADDR], c)


@njit(cache=True)
def _merge(chunks: np.ndarray, first: int, second: int) -> None:
    after = chunks[second, _NEXT]
    chunks[first, _NEXT] = after
    if after >= 0:
        chunks[after, _PREV] = first
    chunks[first, _SIZE] += chunks[second, _SIZE]


@njit(cache=True)
def replay_twice(r: Requests, a: Arena, base: int, stop: int) -> tuple[np.ndarray, np.ndarray, bool]:
    """``arena.replay(..., runs=2, last_only=True)``: an untraced run, then a traced one that
    stops at the first step whose bytes in use exceed ``stop``. Returns its bytes in use and
    requested per step, and whether it stopped."""
    steps = r.alloc_ptr.shape[0] - 2
    ptr = np.full(r.sizes.shape[0], -1, dtype=np.int64)
    tmps = np.empty(r.plan_events.shape[0] + 1, dtype=np.int64)
    stats = a.stats
    for k in r.busy:
        _step(r, a, ptr, tmps, k)
        _release(r, a, ptr, k)
    _end_run(r, a, ptr, steps)
    in_use = np.empty(steps, dtype=np.int64)
    requested = np.empty(steps, dtype=np.int64)
    done = 0
    for k in np.append(r.busy, steps):
        if k > done:  # steps that allocate and release nothing: the bytes stand as they are
            n = 1 if stats[_IN_USE] > stop else k - done
            in_use[done:done + n] = stats[_IN_USE] + base
            requested[done:done + n] = stats[_REQUESTED] + base
            if stats[_IN_USE] > stop:
                return in_use[:done + n], requested[:done + n], True
        if k == steps:
            break
        _step(r, a, ptr, tmps, k)
        in_use[k], requested[k] = stats[_IN_USE] + base, stats[_REQUESTED] + base
        if stats[_IN_USE] > stop:
            return in_use[:k + 1], requested[:k + 1], True
        _release(r, a, ptr, k)
        done = k + 1
    _end_run(r, a, ptr, steps)
    return in_use, requested, False


@njit(cache=True, inline="always")
def _step(r: Requests, a: Arena, ptr: np.ndarray, tmps: np.ndarray, k: int) -> None:
    """Step ``k``'s allocations: its kernel plan (``_Replay.planned``), else its outputs."""
    chunks, keys, meta, stats, regions = a
    outs_done = False
    first = last = 0  # the temporaries held: tmps[first:last]
    for e in range(r.plan_ptr[k], r.plan_ptr[k + 1]):
        kind, n = r.plan_events[e, 0], r.plan_events[e, 1]
        if kind == PLAN_OUT and not outs_done:
            _allocate(r, a, ptr, k)
            outs_done = True
        elif kind == PLAN_TMP:
            tmps[last] = alloc(chunks, keys, meta, stats, regions, n)
            last += 1
        elif kind == PLAN_FREE_TMP:
            for t in range(first, last):
                free(chunks, keys, meta, stats, tmps[t])
            first = last
        elif kind == PLAN_DROP_TMP:
            free(chunks, keys, meta, stats, tmps[first])
            first += 1
    if not outs_done:
        _allocate(r, a, ptr, k)
    for t in range(first, last):
        free(chunks, keys, meta, stats, tmps[t])


@njit(cache=True, inline="always")
def _allocate(r: Requests, a: Arena, ptr: np.ndarray, k: int) -> None:
    chunks, keys, meta, stats, regions = a
    for j in range(r.alloc_ptr[k], r.alloc_ptr[k + 1]):
        ptr[r.alloc_ids[j]] = alloc(chunks, keys, meta, stats, regions, r.sizes[r.alloc_ids[j]])


@njit(cache=True, inline="always")
def _release(r: Requests, a: Arena, ptr: np.ndarray, k: int) -> None:
    chunks, keys, meta, stats, _ = a
    for j in range(r.free_ptr[k], r.free_ptr[k + 1]):
        free(chunks, keys, meta, stats, ptr[r.free_ids[j]])


@njit(cache=True, inline="always")
def _end_run(r: Requests, a: Arena, ptr: np.ndarray, steps: int) -> None:
    """Past the last node: what is allocated there, then the graph outputs released."""
    _allocate(r, a, ptr, steps)
    _release(r, a, ptr, steps)
