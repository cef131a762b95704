"""Maximum flow, and the source side of the minimum cut, in numpy and plain Python.

The min-cut planner solves one network at many capacities (one set per price), so a
``Network`` is prepared once from its arcs and which of them are infinite, then
``Network.source_side`` solves it per capacity vector. Capacities are integers and all
arithmetic on them is exact (int64).

1. A vertex with a path of infinite arcs to the sink is on the sink side of every finite
   cut: it is merged into the sink (its arcs out are dropped, arcs into it lead to the
   sink). The finite cuts are the same, so is the minimum cut with the smallest source
   side. A vertex the source does not reach is dropped: it is never on the source side.
2. Parallel arcs are merged, their capacities summed.
3. A vertex with an arc from the source and one to the sink passes the smaller of the two
   capacities at once (the shortest augmenting paths, all together).
4. Dinic's phases: a breadth-first search of the residual graph, a level at a time in
   numpy, levels the vertices up to the sink; the arcs from one level to the next that lie
   on a shortest path to the sink are kept, and waves in numpy saturate them (a blocking
   flow; a depth-first search in plain Python finishes what ``WAVES`` waves leave, and
   alone is the path with ``CKPT_PURE_PYTHON=1``). Until the sink is out of reach: the
   flow is maximum.
5. The source side: what the source reaches in the residual graph. It is the same set for
   every maximum flow, so it does not depend on the algorithm that found the flow.
"""

from __future__ import annotations

import numpy as np

from ..fast import vectorized

SOURCE, SINK = 0, 1
# Waves of a phase before the depth-first search saturates what they left: most phases
# block in a few; a long tail of small pushes is cheaper one path at a time
WAVES = 12
_BIG = 1 << 62  # the sink's bound: above any sum of capacities


class Network:
    """A flow network from vertex 0 (the source) to vertex 1 (the sink): ``tails[k] ->
    heads[k]``, ``infinite[k]`` when arc k's capacity exceeds every finite cut's."""

    def __init__(self, tails: np.ndarray, heads: np.ndarray, infinite: np.ndarray, size: int) -> None:
        tails, heads = np.asarray(tails, dtype=np.int64), np.asarray(heads, dtype=np.int64)
        infinite = np.asarray(infinite, dtype=bool)
        self.size = size
        self._infinite = np.flatnonzero(infinite)
        self._from_source = np.flatnonzero(tails == SOURCE)
        merged = _reach(size, heads[infinite], tails[infinite], SINK)  # step 1
        heads = np.where(merged[heads], SINK, heads)
        kept = ~merged[tails]
        kept &= _reach(size, tails[kept], heads[kept], SOURCE)[tails]
        take = np.flatnonzero(kept)
        take = take[np.lexsort((heads[take], tails[take]))]  # step 2: parallel arcs side by side
        t, h = tails[take], heads[take]
        self._take = take
        self._first = np.flatnonzero(np.r_[True, (np.diff(t) != 0) | (np.diff(h) != 0)]) if len(t) else take
        t, h = t[self._first], h[self._first]
        m = len(t)
        # Residual arcs: k < m forward, m + k its reverse; stored sorted by tail (CSR).
        frm, to = np.concatenate([t, h]), np.concatenate([h, t])
        order = np.argsort(frm, kind="stable")
        slot = np.empty(2 * m, dtype=np.int64)
        slot[order] = np.arange(2 * m)
        self._forward, self._backward = slot[:m], slot[m:]
        self.mate = np.empty(2 * m, dtype=np.int64)
        self.mate[self._forward], self.mate[self._backward] = self._backward, self._forward
        self.tail, self.head = frm[order], to[order]
        self.start = np.searchsorted(self.tail, np.arange(size + 1))
        self.degree = np.diff(self.start)
        # step 3: per vertex, its merged arc from the source and its merged arc to the sink
        into, out = np.full(size, -1), np.full(size, -1)
        into[h[t == SOURCE]] = np.flatnonzero(t == SOURCE)
        out[t[h == SINK]] = np.flatnonzero(h == SINK)
        both = np.flatnonzero((into >= 0) & (out >= 0))
        self._through = (into[both], out[both])

    def source_side(self, caps: np.ndarray) -> np.ndarray:
        """Per vertex: whether the source reaches it in the residual graph of a maximum
        flow under ``caps`` (non-negative integers, one per arc as given)."""
        caps = np.asarray(caps, dtype=np.int64)
        if len(self._infinite) and caps[self._infinite].min() <= caps[self._from_source].sum():
            raise ValueError("an infinite arc's capacity does not exceed the source's cut")
        c = np.add.reduceat(caps[self._take], self._first) if len(self._take) else np.zeros(0, dtype=np.int64)
        flow = np.zeros(len(c), dtype=np.int64)
        into, out = self._through
        flow[into] = flow[out] = np.minimum(c[into], c[out])
        res = np.empty(2 * len(c), dtype=np.int64)
        res[self._forward], res[self._backward] = c - flow, flow
        while True:
            level = self._levels(res, stop_at_sink=True)
            if level[SINK] < 0:
                break
            arcs = self._shortest_path_arcs(res, level)
            if vectorized():
                res, blocked = self._waves(res, arcs, level)
                if blocked:
                    continue
            res = self._blocking_flow(res, arcs)
        return self._levels(res, stop_at_sink=False) >= 0

    def _levels(self, res: np.ndarray, stop_at_sink: bool) -> np.ndarray:
        """Per vertex: its distance from the source over residual arcs, -1 when out of reach
        (or, with ``stop_at_sink``, farther than the sink)."""
        level = np.full(self.size, -1, dtype=np.int64)
        level[SOURCE] = 0
        frontier = np.array([SOURCE])
        last = np.empty(self.size, dtype=np.int64)  # per vertex: its last place among a level's heads
        depth = 0
        while len(frontier) and not (stop_at_sink and level[SINK] >= 0):
            degree = self.degree[frontier]
            offsets = np.cumsum(degree) - degree
            slots = np.repeat(self.start[frontier] - offsets, degree) + np.arange(int(degree.sum()))
            heads = self.head[slots[res[slots] > 0]]
            depth += 1
            heads = heads[level[heads] < 0]
            level[heads] = depth
            # each new vertex once, without a scan of every vertex per level
            slot = np.arange(len(heads))
            last[heads] = slot
            frontier = heads[last[heads] == slot]
        return level

    def _shortest_path_arcs(self, res: np.ndarray, level: np.ndarray) -> np.ndarray:
        """The residual arcs from one level to the next whose head reaches the sink that way,
        in CSR order (by tail)."""
        step = np.flatnonzero((res > 0) & (level[self.head] == level[self.tail] + 1))
        step = step[level[self.head[step]] <= level[SINK]]
        useful = np.zeros(self.size, dtype=bool)
        useful[SINK] = True
        depth = level[self.tail[step]]
        for d in range(int(level[SINK]) - 1, -1, -1):
            at = step[depth == d]
            useful[self.tail[at[useful[self.head[at]]]]] = True
        on_paths: np.ndarray = step[useful[self.tail[step]] & useful[self.head[step]]]
        return on_paths

    def _blocking_flow(self, res: np.ndarray, arcs: np.ndarray) -> np.ndarray:
        """``res`` after saturating a path of ``arcs`` (level to level) at a time, depth
        first, until no path of them is left from the source to the sink. Those arcs only
        are read, and they and their reverses (one level back, none of them) written."""
        first = np.searchsorted(self.tail[arcs], np.arange(self.size + 1)).tolist()
        head, tail = self.head[arcs].tolist(), self.tail[arcs].tolist()
        left = res[arcs].tolist()  # per arc (its place in ``arcs``): residual capacity
        at = first[:-1]  # per vertex: its next arc to try
        path: list[int] = []
        v = SOURCE
        while True:
            if v == SINK:
                push = min([left[k] for k in path])
                cut = -1
                for i, k in enumerate(path):
                    left[k] -= push
                    if cut < 0 and not left[k]:
                        cut = i
                del path[cut:]  # back to the tail of the first arc saturated
                v = head[path[-1]] if path else SOURCE
                continue
            i, end = at[v], first[v + 1]
            while i < end and not left[i]:
                i += 1
            at[v] = i
            if i < end:
                path.append(i)
                v = head[i]
            elif v == SOURCE:
                break
            else:  # a dead end: never tried again this phase
                v = tail[path.pop()]
                at[v] += 1
        return self._pushed(res, arcs, res[arcs] - np.asarray(left, dtype=np.int64))

    def _pushed(self, res: np.ndarray, arcs: np.ndarray, pushed: np.ndarray) -> np.ndarray:
        """``res`` after ``pushed`` more units along each of ``arcs`` (none the reverse of another)."""
        res = res.copy()
        res[arcs] -= pushed
        res[self.mate[arcs]] += pushed
        return res

    def _waves(self, res: np.ndarray, arcs: np.ndarray, level: np.ndarray) -> tuple[np.ndarray, bool]:
        """``res`` after up to ``WAVES`` waves over ``arcs`` (as ``_blocking_flow`` takes
        them), and whether no path of them is left. A wave bounds what each vertex can
        pass on towards the sink, sends the source's bound forward a level at a time (each
        vertex fills its arcs in order), then returns what a vertex could not pass on to its
        arcs in, a level at a time back: a flow, and more than zero of it reaches the sink."""
        tail, head = self.tail[arcs], self.head[arcs]
        depth = level[tail]
        by_tail = [np.flatnonzero(depth == d) for d in range(int(level[SINK]))]
        by_head = [at[np.argsort(head[at], kind="stable")] for at in by_tail]
        cap = res[arcs]
        left = cap.copy()
        blocked = False
        for _ in range(WAVES):
            bound = self._bounds(left, tail, head, by_tail)
            blocked = not bound[SOURCE]
            if blocked:
                break
            left -= self._wave(left, (tail, head), (by_tail, by_head), bound)
        return self._pushed(res, arcs, cap - left), blocked

    def _bounds(self, left: np.ndarray, tail: np.ndarray, head: np.ndarray, by_tail: list[np.ndarray]) -> np.ndarray:
        """Per vertex: an upper bound on the flow it can pass to the sink over arcs with
        ``left`` capacity (exact where paths do not share arcs; 0: none)."""
        bound = np.zeros(self.size, dtype=np.int64)
        bound[SINK] = _BIG
        for at in reversed(by_tail):
            np.add.at(bound, tail[at], np.minimum(left[at], bound[head[at]]))
        bound[SINK] = 0
        return bound

    def _wave(self, left: np.ndarray, ends: tuple[np.ndarray, np.ndarray],
              levels: tuple[list[np.ndarray], list[np.ndarray]], bound: np.ndarray) -> np.ndarray:
        """One wave's flow per arc: forward from the source, each vertex's inflow spread
        over its arcs in order (none above the head's bound); backward, each vertex's
        excess taken off its arcs in, in order. Conserved at every vertex but the two ends."""
        tail, head = ends
        by_tail, by_head = levels
        send = np.zeros(len(left), dtype=np.int64)
        inflow = np.zeros(self.size, dtype=np.int64)
        inflow[SOURCE] = bound[SOURCE]
        bound[SINK] = _BIG
        for at in by_tail:
            send[at] = _spread(inflow, tail[at], np.minimum(left[at], bound[head[at]]))
            np.add.at(inflow, head[at], send[at])
        out = np.zeros(self.size, dtype=np.int64)
        np.add.at(out, tail, send)
        for at in reversed(by_head):
            excess = inflow - out
            excess[SINK] = 0
            back = _spread(excess, head[at], send[at])
            send[at] -= back
            np.subtract.at(out, tail[at], back)
        return send


def _spread(amount: np.ndarray, keys: np.ndarray, limit: np.ndarray) -> np.ndarray:
    """Per entry (grouped by ``keys``, in order): its share of its key's ``amount``,
    the entries before it in the group filled to their ``limit`` first."""
    if not len(keys):
        return limit
    before = np.cumsum(limit) - limit
    start = np.r_[True, keys[1:] != keys[:-1]]
    before -= np.maximum.accumulate(np.where(start, before, 0))
    share: np.ndarray = np.minimum(np.maximum(amount[keys] - before, 0), limit)
    return share


def _reach(size: int, tails: np.ndarray, heads: np.ndarray, start: int) -> np.ndarray:
    """Per vertex: whether ``start`` reaches it along the arcs (breadth first, plain Python)."""
    order = np.argsort(tails, kind="stable")
    first = np.searchsorted(tails[order], np.arange(size + 1)).tolist()
    out = heads[order].tolist()
    seen = [False] * size
    seen[start] = True
    queue = [start]
    for v in queue:
        for w in out[first[v]:first[v + 1]]:
            if not seen[w]:
                seen[w] = True
                queue.append(w)
    return np.asarray(seen, dtype=bool)
