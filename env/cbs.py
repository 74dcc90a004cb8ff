"""Conflict-Based Search for 3+ agents (`env.solver` is the entry point): the sum-of-costs search and the
makespan search, their space-time low levels and the conflict scan they share.

- `cbs`: best-first over constraint nodes by sum of costs, fewer conflicts first on ties; each agent's
  low level is a space-time A* that breaks ties towards fewer conflicts with the others.
- `cbs_makespan`: best-first by a lower bound on the latest arrival (the largest of the agents' shortest
  constrained arrivals), each agent replanned to the fewest conflicts among its paths that meet the bound.
"""

from __future__ import annotations

import heapq
from typing import Protocol

from .errors import SolverBudgetExceeded, Unsolvable


class GridMap(Protocol):
    """What the searches read of a map (`env.solver.GridMap` is one): its side, its cell count, and each
    cell's moves (the cell itself first, then its ice 4-neighbours)."""

    size: int
    n: int
    moves: list[tuple[int, ...]]



def _unwind(key: int, parent: dict[int, int], n: int) -> list[int]:
    """The cells of the path that ends at space-time `key`, start first."""
    path = []
    while key != -1:
        path.append(key % n)
        key = parent[key]
    path.reverse()
    return path


def _goal_blocked_until(vcons: frozenset[int], g: int, n: int) -> int:
    """The last time a vertex constraint forbids the goal `g` (-1: never): an agent may only stop there after it."""
    return max((c // n for c in vcons if c % n == g), default=-1)


def _low_level(
    gm: GridMap,
    s: int,
    g: int,
    dist: list[int],
    vcons: frozenset[int],
    econs: frozenset[int],
    avoid: dict[int, int],
    avoid_goal: dict[int, int],
) -> list[int] | None:
    """Space-time A* for one agent; constraints are ints ``t*n + cell`` and ``(t*n + u)*n + v``.

    `avoid` counts other agents at ``t*n + cell``; `avoid_goal[cell] = T` marks a cell held from T on.
    Ties on f go to fewer such conflicts, then to later time.
    """
    n = gm.n
    moves = gm.moves
    last = _goal_blocked_until(vcons, g, n)
    horizon = max((c // n for c in vcons), default=0)
    horizon = max([horizon, *(c // (n * n) for c in econs)]) + n + 1
    start_key = s
    if start_key in vcons:
        return None
    heap = [(dist[s], 0, 0, s)]  # (f, conflicts, -t, t*n + cell)
    seen = {s: 0}
    parent = {s: -1}
    while heap:
        f, conf, negt, key = heapq.heappop(heap)
        t, u = divmod(key, n)
        if u == g and t > last:
            return _unwind(key, parent, n)
        if t >= horizon:
            continue
        nt = t + 1
        base = nt * n
        for v in moves[u]:
            nk = base + v
            if nk in seen or nk in vcons or (key * n + v) in econs:
                continue
            d = dist[v]
            if d < 0:
                continue
            nc = conf + avoid.get(nk, 0)
            ag = avoid_goal.get(v)
            if ag is not None and nt >= ag:
                nc += 1
            seen[nk] = nc
            parent[nk] = key
            heapq.heappush(heap, (nt + d, nc, -nt, nk))
    return None


def _first_conflict(paths: list[list[int]]) -> tuple[int, tuple | None]:
    """(number of conflicting (pair, time) events, the earliest one) with padding at goals."""
    k = len(paths)
    horizon = max(len(p) for p in paths)
    count = 0
    first = None
    lens = [len(p) - 1 for p in paths]
    prev = [p[0] for p in paths]
    for t in range(horizon):
        cur = [p[t] if t <= lens[i] else p[-1] for i, p in enumerate(paths)]
        seen: dict[int, int] = {}
        for i in range(k):
            c = cur[i]
            j = seen.get(c)
            if j is not None:
                count += 1
                if first is None:
                    first = ("v", j, i, c, t)
            else:
                seen[c] = i
        if t > 0:
            for i in range(k):
                if prev[i] == cur[i]:
                    continue
                for j in range(i + 1, k):
                    if cur[j] == prev[i] and prev[j] == cur[i]:
                        count += 1
                        if first is None:
                            first = ("e", i, j, prev[i], cur[i], t)
        prev = cur
    return count, first


def _avoid_tables(paths: list[list[int] | None], skip: int, n: int) -> tuple[dict[int, int], dict[int, int]]:
    avoid: dict[int, int] = {}
    goal: dict[int, int] = {}
    for j, p in enumerate(paths):
        if j == skip or p is None:
            continue
        for t, c in enumerate(p):
            key = t * n + c
            avoid[key] = avoid.get(key, 0) + 1
        goal[p[-1]] = len(p)
    return avoid, goal


def cbs(gm: GridMap, s: list[int], g: list[int], dists: list[list[int]], max_nodes: int) -> list[list[int]]:
    """Best-first over constraint nodes by sum of costs, fewer conflicts first on ties."""
    k = len(s)
    n = gm.n
    empty: frozenset[int] = frozenset()
    vcons = [empty] * k
    econs = [empty] * k
    paths: list[list[int] | None] = [None] * k
    for i in range(k):
        avoid, ag = _avoid_tables(paths, i, n)
        p = _low_level(gm, s[i], g[i], dists[i], empty, empty, avoid, ag)
        if p is None:
            raise Unsolvable(f"agent {i} cannot reach its goal")
        paths[i] = p
    counter = 0
    nconf, first = _first_conflict(paths)
    cost = sum(len(p) - 1 for p in paths)
    heap = [(cost, nconf, counter, vcons, econs, paths, first)]
    nodes = 0
    while heap:
        _, _, _, vcons, econs, paths, first = heapq.heappop(heap)
        cost = sum(len(p) - 1 for p in paths)
        if first is None:
            return paths
        nodes += 1
        if nodes > max_nodes:
            raise SolverBudgetExceeded(
                f"CBS expanded {max_nodes} high-level nodes without proving an optimum "
                f"({gm.size}x{gm.size} map, {k} agents); raise max_nodes or simplify the instance"
            )
        for a, nv, ne in _branches(first, vcons, econs, n):
            avoid, ag = _avoid_tables(paths, a, n)
            p = _low_level(gm, s[a], g[a], dists[a], nv[a], ne[a], avoid, ag)
            if p is None:
                continue
            np_ = list(paths)
            np_[a] = p
            c2, f2 = _first_conflict(np_)
            counter += 1
            cost2 = cost - (len(paths[a]) - 1) + (len(p) - 1)
            heapq.heappush(heap, (cost2, c2, counter, nv, ne, np_, f2))
    raise Unsolvable("no conflict-free plan exists (CBS ran out of branches)")


def _branches(first: tuple, vcons: list, econs: list, n: int) -> list[tuple[int, list, list]]:
    """CBS's two children of a conflict: (agent, its vertex constraints, its edge constraints) each."""
    if first[0] == "v":
        _, i, j, c, t = first
        cons = [(i, t * n + c, None), (j, t * n + c, None)]
    else:
        _, i, j, u, v, t = first  # i moves u -> v and j moves v -> u, arriving at time t
        cons = [(i, None, ((t - 1) * n + u) * n + v), (j, None, ((t - 1) * n + v) * n + u)]
    out = []
    for a, vc, ec in cons:
        nv, ne = list(vcons), list(econs)
        if vc is not None:
            nv[a] = vcons[a] | {vc}
        else:
            ne[a] = econs[a] | {ec}
        out.append((a, nv, ne))
    return out


def _bounded_low_level(gm: GridMap, s: int, g: int, dist: list[int], vcons: frozenset[int], econs: frozenset[int],
                       avoid: dict[int, int], avoid_goal: dict[int, int], bound: int) -> list[int] | None:
    """A path for one agent that arrives for good by time `bound` with the fewest conflicts with the others
    (`avoid`, `avoid_goal` as in `_low_level`), or None when no path meets the bound under the constraints.
    Uniform-cost search on conflicts over (time, cell), pruned where time + distance exceeds the bound."""
    n = gm.n
    moves = gm.moves
    last = _goal_blocked_until(vcons, g, n)
    if s in vcons or dist[s] > bound:
        return None
    heap = [(0, 0, s)]  # (conflicts, t, t*n + cell)
    best = {s: 0}
    parent = {s: -1}
    while heap:
        conf, t, key = heapq.heappop(heap)
        if best.get(key, conf) < conf:
            continue
        u = key % n
        if u == g and t > last:
            return _unwind(key, parent, n)
        nt = t + 1
        if nt > bound:
            continue
        base = nt * n
        for v in moves[u]:
            d = dist[v]
            if d < 0 or nt + d > bound:
                continue
            nk = base + v
            if nk in vcons or (key * n + v) in econs:
                continue
            nc = conf + avoid.get(nk, 0)
            ag = avoid_goal.get(v)
            if ag is not None and nt >= ag:
                nc += 1
            if nk not in best or nc < best[nk]:
                best[nk] = nc
                parent[nk] = key
                heapq.heappush(heap, (nc, nt, nk))
    return None


def cbs_makespan(gm: GridMap, s: list[int], g: list[int], dists: list[list[int]],
                 max_nodes: int, bounded: bool = True) -> list[list[int]]:
    """CBS on the latest arrival. A node's bound is the largest of the agents' shortest constrained arrivals:
    a lower bound on the makespan of every plan that meets its constraints. Nodes are expanded best-first on
    (bound, conflicts), and each replanned agent takes, among its paths that arrive by the bound, one with the
    fewest conflicts. So the first conflict-free node popped has makespan equal to its bound: optimal.
    With ``bounded=False`` each replanned agent takes a shortest constrained path instead (fewest conflicts
    among those): the same bound and order, but other conflicts to split on. Neither variant dominates: each
    solves instances the other needs far more nodes for, so `env.solver` runs both."""
    k = len(s)
    n = gm.n
    empty: frozenset[int] = frozenset()
    vcons = [empty] * k
    econs = [empty] * k
    lows = [dists[i][s[i]] for i in range(k)]  # shortest constrained arrival per agent
    bound = max(lows)
    paths: list[list[int] | None] = [None] * k
    for i in range(k):
        avoid, ag = _avoid_tables(paths, i, n)
        p = (_bounded_low_level(gm, s[i], g[i], dists[i], empty, empty, avoid, ag, bound) if bounded
             else _low_level(gm, s[i], g[i], dists[i], empty, empty, avoid, ag))
        if p is None:  # agents stay on their goals: reaching a goal by the bound is always possible without others
            raise Unsolvable(f"agent {i} cannot reach its goal")
        paths[i] = p
    counter = 0
    nconf, first = _first_conflict(paths)
    heap = [(bound, nconf, counter, lows, vcons, econs, paths, first)]
    nodes = 0
    while heap:
        bound, _, _, lows, vcons, econs, paths, first = heapq.heappop(heap)
        if first is None:
            return paths
        nodes += 1
        if nodes > max_nodes:
            raise SolverBudgetExceeded(
                f"CBS (makespan) expanded {max_nodes} high-level nodes without proving an optimum "
                f"({gm.size}x{gm.size} map, {k} agents); raise max_nodes or simplify the instance"
            )
        for a, nv, ne in _branches(first, vcons, econs, n):
            shortest = _low_level(gm, s[a], g[a], dists[a], nv[a], ne[a], {}, {})
            if shortest is None:
                continue
            lows2 = list(lows)
            lows2[a] = max(lows[a], len(shortest) - 1)
            bound2 = max(bound, lows2[a])
            avoid, ag = _avoid_tables(paths, a, n)
            if bounded:
                p = _bounded_low_level(gm, s[a], g[a], dists[a], nv[a], ne[a], avoid, ag, bound2)
            else:
                p = _low_level(gm, s[a], g[a], dists[a], nv[a], ne[a], avoid, ag)
            if p is None:  # cannot happen: the shortest path meets the bound; kept as a guard
                p = shortest
            np_ = list(paths)
            np_[a] = p
            c2, f2 = _first_conflict(np_)
            counter += 1
            heapq.heappush(heap, (bound2, c2, counter, lows2, nv, ne, np_, f2))
    raise Unsolvable("no conflict-free plan exists (CBS ran out of branches)")
