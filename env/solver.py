"""Optimal multi-agent path finding on FrozenLake maps (sum of costs, agents stay on their goals).

Rules (the same as the verifier's): lock-step time; each step every agent moves to a 4-neighbour
ice cell or waits; no two agents in one cell at one time (vertex conflict) and no two agents swapping
cells in one step (edge conflict). An agent's cost is the time it last arrives at its goal; after that
it stays there for ever (and blocks that cell). The objective is the sum of the agents' costs
(``objective="soc"``), or the makespan, the latest arrival (``objective="makespan"``, the paper's
"makespan-optimal").

Exact searches, all pure Python:

- `joint` (the default for 2 agents): A* over joint states (positions + a "finished for good" flag per
  agent) with the sum of true single-agent distances as heuristic. The state space is finite
  (<= 4 * cells^2), so the search also proves unsolvability.
- `cbs` (the default for 3+ agents): Conflict-Based Search with a space-time A* low level, a
  conflict-avoidance tie-break and the earliest conflict split first (`env.cbs`).
- for the makespan: breadth-first over joint positions for up to 2 agents; for more, CBS best-first on a
  lower bound of the makespan (`env.cbs.cbs_makespan`), run with two replanning rules in turn.

Both stop after `max_nodes` expansions (joint states, or CBS high-level nodes) and raise
`SolverBudgetExceeded`; an instance proven impossible raises `Unsolvable`.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

from .cbs import cbs, cbs_makespan
from .errors import SolverBudgetExceeded, Unsolvable

Cell = tuple[int, int]

DEFAULT_MAX_NODES = {"joint": 200_000, "cbs": 2_000}




@dataclass(frozen=True)
class Plan:
    """An optimal joint plan: one path per agent, each ending on its goal at its final arrival."""

    paths: list[list[Cell]]
    cost: int  # sum of costs
    makespan: int
    shortest: list[int] = field(default_factory=list)  # each agent's distance ignoring the others


_NEIGHBOURS: dict[int, list[tuple[int, ...]]] = {}


def _neighbours(size: int) -> list[tuple[int, ...]]:
    """Per cell of a size x size map: itself, then its in-bounds 4-neighbours (cached per size)."""
    table = _NEIGHBOURS.get(size)
    if table is None:
        table = []
        for i in range(size * size):
            r, c = divmod(i, size)
            out = [i]
            if r > 0:
                out.append(i - size)
            if r < size - 1:
                out.append(i + size)
            if c > 0:
                out.append(i - 1)
            if c < size - 1:
                out.append(i + 1)
            table.append(tuple(out))
        _NEIGHBOURS[size] = table
    return table


class GridMap:
    """Cells as ints ``r * size + c``; neighbour lists of passable cells (a wait is the cell itself)."""

    __slots__ = ("size", "n", "free", "moves")

    def __init__(self, grid: list[str]):
        self.size = len(grid)
        self.n = self.size * self.size
        free = self.free = [ch != "H" for row in grid for ch in row]
        self.moves = [tuple(j for j in nb if free[j]) if free[i] else () for i, nb in enumerate(_neighbours(self.size))]

    def bfs(self, src: int) -> list[int]:
        """Distances from `src` over ice cells; -1 where unreachable."""
        dist = [-1] * self.n
        dist[src] = 0
        q = deque([src])
        moves = self.moves
        while q:
            u = q.popleft()
            du = dist[u] + 1
            for v in moves[u]:
                if dist[v] < 0:
                    dist[v] = du
                    q.append(v)
        return dist


OBJECTIVES = ("soc", "makespan")


def solve(
    grid: list[str],
    starts: list[Cell],
    goals: list[Cell],
    max_nodes: int | None = None,
    method: str = "auto",
    objective: str = "soc",
) -> Plan:
    """Return an optimal conflict-free plan: minimum sum of costs (``objective="soc"``) or minimum makespan
    (``objective="makespan"``, the latest arrival; the paper's "makespan-optimal").

    `method` is ``auto`` (joint A* for up to 2 agents, CBS otherwise), ``joint`` or ``cbs``; the makespan
    objective uses a breadth-first joint search for up to 2 agents and, for more, CBS best-first on a lower bound
    of the makespan (`env.cbs`), so the first conflict-free plan popped is makespan-optimal.
    Raises `SolverBudgetExceeded` after `max_nodes` expansions, `Unsolvable` when no plan exists,
    `ValueError` on malformed input (a start or goal on a hole or off the map, shared starts or goals).
    """
    return solve_on(GridMap(grid), starts, goals, max_nodes, method, objective)


def solve_on(gm: GridMap, starts: list[Cell], goals: list[Cell], max_nodes: int | None = None,
             method: str = "auto", objective: str = "soc") -> Plan:
    """`solve` on an already built `GridMap` (the generator reuses the one it drew)."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective {objective!r}: allowed: {', '.join(OBJECTIVES)}")
    k = len(starts)
    if k != len(goals) or k == 0:
        raise ValueError(f"need one goal per start and at least one agent; got {k} starts, {len(goals)} goals")
    s = [_index(gm, p, f"start of agent {i}") for i, p in enumerate(starts)]
    g = [_index(gm, p, f"goal of agent {i}") for i, p in enumerate(goals)]
    if len(set(s)) != k or len(set(g)) != k:
        raise ValueError("starts must be distinct and goals must be distinct")
    dists = [gm.bfs(x) for x in g]
    for i in range(k):
        if dists[i][s[i]] < 0:
            raise Unsolvable(f"agent {i}'s goal {goals[i]} is unreachable from its start {starts[i]}")
    if objective == "makespan":
        if method == "joint":
            raise ValueError("method 'joint' minimises the sum of costs only; use 'cbs' or 'auto' for makespan")
        if method == "auto" and k <= 2:  # breadth-first over joint positions: exact, and it proves impossibility
            paths = _joint_makespan(gm, s, g, dists, max_nodes or DEFAULT_MAX_NODES["joint"])
            return _plan(gm, paths, dists, s)
        method = "cbs"
    if method == "auto":
        method = "joint" if k <= 2 else "cbs"
    if max_nodes is None:
        max_nodes = DEFAULT_MAX_NODES.get(method, 2_000)
    if method == "joint":
        if k > 2:
            raise ValueError("method 'joint' supports at most 2 agents; use 'cbs'")
        paths = _joint(gm, s, g, dists, max_nodes)
    elif method == "cbs":
        paths = _cbs_makespan_portfolio(gm, s, g, dists, max_nodes) if objective == "makespan" \
            else cbs(gm, s, g, dists, max_nodes)
    else:
        raise ValueError(f"unknown method {method!r}; use 'auto', 'joint' or 'cbs'")
    return _plan(gm, paths, dists, s)


def optimal_makespan(gm: GridMap, starts: list[Cell], goals: list[Cell], plan_makespan: int, shortest: list[int],
                     max_nodes: int) -> int:
    """The least makespan of an instance whose sum-of-costs optimum has makespan `plan_makespan`: the largest
    shortest distance when that plan already meets it (no plan can finish earlier), else an exact makespan
    search with `max_nodes` (raises `SolverBudgetExceeded` past it)."""
    low = max(shortest)
    if plan_makespan == low:
        return low
    return solve_on(gm, starts, goals, max_nodes=max_nodes, objective="makespan").makespan


def _cbs_makespan_portfolio(gm: GridMap, s: list[int], g: list[int], dists: list[list[int]],
                            max_nodes: int) -> list[list[int]]:
    """The makespan CBS with bounded replanning, then (if it passes `max_nodes`) with shortest replanning: both
    are exact, and on the held-out suite each proves optima the other cannot within the budget."""
    try:
        return cbs_makespan(gm, s, g, dists, max_nodes, bounded=True)
    except SolverBudgetExceeded:
        return cbs_makespan(gm, s, g, dists, max_nodes, bounded=False)


def _plan(gm: GridMap, paths: list[list[int]], dists: list[list[int]], s: list[int]) -> Plan:
    size = gm.size
    out = [[divmod(x, size) for x in p] for p in paths]
    return Plan(paths=out, cost=sum(len(p) - 1 for p in paths), makespan=max(len(p) - 1 for p in paths),
                shortest=[dists[i][s[i]] for i in range(len(s))])


def _joint_makespan(gm: GridMap, s: list[int], g: list[int], dists: list[list[int]], max_nodes: int) -> list[list[int]]:
    """Breadth-first over joint positions of 1-2 agents until all stand on their goals at once (then they stay:
    goals are distinct, so staying is conflict-free); each path is then cut after its agent's last arrival."""
    start, goal = tuple(s), tuple(g)
    parent: dict[tuple, tuple | None] = {start: None}
    frontier = [start]
    while frontier and goal not in parent:
        nxt_frontier = []
        for u in frontier:
            for v in _joint_steps(gm, u):
                if v not in parent:
                    parent[v] = u
                    nxt_frontier.append(v)
        if len(parent) > max_nodes:
            raise SolverBudgetExceeded(f"joint makespan search passed {max_nodes} states ({gm.size}x{gm.size} map)")
        frontier = nxt_frontier
    if goal not in parent:
        raise Unsolvable("no conflict-free plan exists (every joint position reachable was searched)")
    states = [goal]
    while parent[states[-1]] is not None:
        states.append(parent[states[-1]])
    states.reverse()
    paths = []
    for i in range(len(s)):
        p = [st[i] for st in states]
        while len(p) > 1 and p[-2] == g[i]:  # cost = last arrival: drop trailing waits on the goal
            p.pop()
        paths.append(p)
    return paths


def _joint_steps(gm: GridMap, pos: tuple) -> list[tuple]:
    if len(pos) == 1:
        return [(v,) for v in gm.moves[pos[0]]]
    a, b = pos
    return [(u, v) for u in gm.moves[a] for v in gm.moves[b] if u != v and not (u == b and v == a)]


def _index(gm: GridMap, p: Cell, what: str) -> int:
    r, c = p
    if not (0 <= r < gm.size and 0 <= c < gm.size):
        raise ValueError(f"{what} {p} is off the {gm.size}x{gm.size} map")
    i = r * gm.size + c
    if not gm.free[i]:
        raise ValueError(f"{what} {p} is on a hole")
    return i


# ----------------------------------------------------------------------------------------------------
# Joint-state A* (1 or 2 agents)


def _joint(gm: GridMap, s: list[int], g: list[int], dists: list[list[int]], max_nodes: int) -> list[list[int]]:
    if len(s) == 1:
        return [_single_path(gm, s[0], g[0], dists[0])]
    n = gm.n
    moves = gm.moves
    ga, gb = g
    da, db = dists
    # State key: ((a * n + b) * 2 + fa) * 2 + fb; fa/fb = agent finished (stays on its goal for ever).
    heap: list[tuple[int, int, int]] = []
    best: dict[int, int] = {}
    parent: dict[int, int] = {}
    a0, b0 = s
    for fa in (0, 1) if a0 == ga else (0,):
        for fb in (0, 1) if b0 == gb else (0,):
            key = ((a0 * n + b0) * 2 + fa) * 2 + fb
            h = (0 if fa else da[a0]) + (0 if fb else db[b0])
            best[key] = 0
            parent[key] = -1
            heapq.heappush(heap, (h, 0, key))
    expanded = 0
    while heap:
        f, negg, key = heapq.heappop(heap)
        gcost = -negg
        if best.get(key, 1 << 60) < gcost:
            continue
        fb = key & 1
        fa = (key >> 1) & 1
        a, b = divmod(key >> 2, n)
        if fa and fb:
            return _joint_paths(key, parent, n)
        expanded += 1
        if expanded > max_nodes:
            raise SolverBudgetExceeded(
                f"joint A* expanded {max_nodes} states without proving an optimum "
                f"({gm.size}x{gm.size} map, 2 agents); raise max_nodes"
            )
        if fa:
            opts_a = ((a, 1, 0),)
        else:
            opts_a = [(x, 0, 1) for x in moves[a]]
            if ga in moves[a]:
                opts_a.append((ga, 1, 1))
        if fb:
            opts_b = ((b, 1, 0),)
        else:
            opts_b = [(y, 0, 1) for y in moves[b]]
            if gb in moves[b]:
                opts_b.append((gb, 1, 1))
        for x, nfa, ca in opts_a:
            ha = 0 if nfa else da[x]
            for y, nfb, cb in opts_b:
                if x == y or (x == b and y == a):
                    continue
                ng = gcost + ca + cb
                nk = ((x * n + y) * 2 + nfa) * 2 + nfb
                if ng < best.get(nk, 1 << 60):
                    best[nk] = ng
                    parent[nk] = key
                    heapq.heappush(heap, (ng + ha + (0 if nfb else db[y]), -ng, nk))
    raise Unsolvable("no conflict-free plan exists (joint search exhausted every state)")


def _joint_paths(key: int, parent: dict[int, int], n: int) -> list[list[int]]:
    chain = []
    while key != -1:
        chain.append(key)
        key = parent[key]
    chain.reverse()
    pa: list[int] = []
    pb: list[int] = []
    done_a = done_b = False
    for k in chain:
        fb = k & 1
        fa = (k >> 1) & 1
        a, b = divmod(k >> 2, n)
        if not done_a:  # record each agent until the step it finishes for good
            pa.append(a)
            done_a = bool(fa)
        if not done_b:
            pb.append(b)
            done_b = bool(fb)
    return [pa, pb]


def _single_path(gm: GridMap, s: int, g: int, dist: list[int]) -> list[int]:
    path = [s]
    while path[-1] != g:
        u = path[-1]
        path.append(next(v for v in gm.moves[u] if dist[v] == dist[u] - 1))
    return path

__all__ = ["GridMap", "Plan", "SolverBudgetExceeded", "Unsolvable", "optimal_makespan", "solve", "solve_on"]
