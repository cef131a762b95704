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
   on a shortest path to the sink are kept, and a depth-first search in plain Python
   saturates them (a blocking flow). Until the sink is out of reach: the flow is maximum.
5. The source side: what the source reaches in the residual graph. It is the same set for
   every maximum flow, so it does not depend on the algorithm that found the flow.
"""

from __future__ import annotations

import numpy as np

SOURCE, SINK = 0, 1


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
            res = self._blocking_flow(res, self._shortest_path_arcs(res, level))
        return self._levels(res, stop_at_sink=False) >= 0

    def _levels(self, res: np.ndarray, stop_at_sink: bool) -> np.ndarray:
        """Per vertex: its distance from the source over residual arcs, -1 when out of reach
        (or, with ``stop_at_sink``, farther than the sink)."""
        level = np.full(self.size, -1, dtype=np.int64)
        level[SOURCE] = 0
        frontier = np.array([SOURCE])
        depth = 0
        while len(frontier) and not (stop_at_sink and level[SINK] >= 0):
            degree = self.degree[frontier]
            offsets = np.cumsum(degree) - degree
            slots = np.repeat(self.start[frontier] - offsets, degree) + np.arange(int(degree.sum()))
            heads = self.head[slots[res[slots] > 0]]
            depth += 1
            level[heads[level[heads] < 0]] = depth
            frontier = np.flatnonzero(level == depth)
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
        pushed = res[arcs] - np.asarray(left, dtype=np.int64)
        res = res.copy()
        res[arcs] -= pushed
        res[self.mate[arcs]] += pushed
        return res


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
