"""Instance generator: turns an `EnvConfig` into solvable instances that match its knobs.

For a request of `n` instances: per-size quotas come from the data ratios by largest remainder; within
a size, `round(quota * wait_ratio)` instances are asked to need a wait (`needs_wait`), spread evenly
over the size's slots. Each slot is drawn by `make_instance` from its own RNG, seeded from
``(seed, slot index)``, so the result is byte-identical whatever the number of worker processes.

One draw: holes placed uniformly at random (their count rounded stochastically so the mean matches
hole_ratio exactly); starts and goals placed in the largest ice component (so they are connected);
the solver proves the optimum; the draw is kept if its `needs_wait` matches the slot's wish.
When random placement rarely conflicts, half the draws use placement tricks that make paths cross:
agent 1 is put where it reaches a cell on agent 0's shortest path at the same time (crossing), or
walks agent 0's path the other way (head-on). After `max_tries` draws the slot takes the last
solvable draw with the other `needs_wait` value and the miss is counted as a shortfall; if no draw
was solvable the slot is dropped and counted. Nothing is silent: `Generated.stats` says per size what
was asked and what was achieved; a hole ratio above `max_hole_ratio(size, num_agents)` (possible when
`num_agents` overrides the config's) is served at the cap, recorded as `served_hole_ratio` and in `notes`.
"""

from __future__ import annotations

import hashlib
import math
import multiprocessing as mp
import os
import random
from dataclasses import dataclass, field

from .config import EnvConfig, SizeKnobs, max_hole_ratio
from .instance import Instance
from .solver import GridMap, SolverBudgetExceeded, Unsolvable, optimal_makespan, solve_on

DEFAULT_MAX_TRIES = 60
# CBS budget per draw when generating (3+ agents): a draw that needs more is dropped and redrawn. This
# slightly favours instances CBS finds easy; it keeps the held-out suite buildable in minutes.
GEN_CBS_NODES = 200
# Budget of the optimal-makespan search per kept draw (joint states for 2 agents, CBS nodes for more); a draw
# past it is dropped like one past GEN_CBS_NODES. The benchmark passes a far larger one (no redraws there).
GEN_MAKESPAN_NODES = 50_000
_PARALLEL_MIN = 400  # below this many instances, worker start-up costs more than it saves


@dataclass
class Generated:
    """The instances in slot order, and per-size statistics (asked vs achieved)."""

    instances: list[Instance]
    stats: dict = field(default_factory=dict)


def quotas(config: EnvConfig, n: int) -> dict[int, int]:
    """Per-size instance counts from the data ratios by largest remainder (ties go to the smaller size).

    >>> from env.config import uniform_config
    >>> quotas(uniform_config(), 10)
    {3: 2, 4: 2, 5: 1, 6: 1, 7: 1, 8: 1, 9: 1, 10: 1}
    """
    exact = {s: k.data_ratio * n for s, k in config.sizes.items()}
    out = {s: int(math.floor(x + 1e-9)) for s, x in exact.items()}
    rest = n - sum(out.values())
    order = sorted(exact, key=lambda s: (-(exact[s] - out[s]), s))
    for s in order[: max(0, rest)]:
        out[s] += 1
    return out


def slot_seed(seed: int, index: int) -> int:
    """A 63-bit seed for slot `index` of a request seeded `seed` (stable across processes and runs)."""
    h = hashlib.sha256(f"mapf-frozenlake:{seed}:{index}".encode()).digest()
    return int.from_bytes(h[:8], "big") >> 1


def plan_slots(config: EnvConfig, n: int) -> list[tuple[int, bool]]:
    """(size, wants_wait) per slot, sizes in increasing order, wait slots spread evenly within a size."""
    slots = []
    for s, q in quotas(config, n).items():
        w = config.sizes[s].wait_ratio
        want = int(math.floor(q * w + 0.5))
        for j in range(q):
            # Bresenham spread: slot j wants a wait when the running target count steps up.
            slots.append((s, (j + 1) * want // q > j * want // q if q else False))
    return slots


# ----------------------------------------------------------------------------------------------------
# One instance


def _draw_map(
    rng: random.Random, size: int, hole_ratio: float, need: int
) -> tuple[list[str], GridMap, list[int]] | None:
    cells = size * size
    x = hole_ratio * cells
    holes = int(x) + (1 if rng.random() < x - int(x) else 0)
    holes = min(holes, cells - need)
    hole_set = set(rng.sample(range(cells), holes)) if holes > 0 else set()
    grid = ["".join("H" if r * size + c in hole_set else "F" for c in range(size)) for r in range(size)]
    # Largest ice component (ties: the one containing the lowest cell index).
    gm = GridMap(grid)
    comp = [-1] * cells
    best: list[int] = []
    for s in range(cells):
        if not gm.free[s] or comp[s] >= 0:
            continue
        comp[s] = s
        members = [s]
        i = 0
        while i < len(members):
            u = members[i]
            i += 1
            for v in gm.moves[u]:
                if comp[v] < 0:
                    comp[v] = s
                    members.append(v)
        if len(members) > len(best):
            best = members
    if len(best) < need:
        return None
    return grid, gm, sorted(best)


def _random_shortest_path(rng: random.Random, gm: GridMap, s: int, dist_to_g: list[int]) -> list[int]:
    path = [s]
    while dist_to_g[path[-1]] > 0:
        u = path[-1]
        nxt = [v for v in gm.moves[u] if dist_to_g[v] == dist_to_g[u] - 1]
        path.append(rng.choice(nxt))
    return path


def _place(
    rng: random.Random, gm: GridMap, comp: list[int], k: int, trick: str | None
) -> tuple[list[int], list[int]] | None:
    """Starts (distinct) and goals (distinct, each != own start) inside the component `comp`."""
    starts = rng.sample(comp, k)
    goals = []
    for i in range(k):
        choices = [c for c in comp if c != starts[i] and c not in goals]
        if not choices:
            return None
        goals.append(rng.choice(choices))
    if trick is None or k < 2:
        return starts, goals
    s0, g0 = starts[0], goals[0]
    d0 = gm.bfs(g0)
    p0 = _random_shortest_path(rng, gm, s0, d0)
    if len(p0) < 3:
        return starts, goals
    others_s = set(starts[2:])
    others_g = set(goals[2:])
    if trick == "headon":
        # Agent 1 walks agent 0's corridor the other way: start near g0, goal near s0.
        cand_s = [c for c in gm.moves[g0] + (p0[-2],) if c != s0 and c not in others_s]
        cand_g = [c for c in gm.moves[s0] + (p0[1],) if c != g0 and c not in others_g]
        if not cand_s or not cand_g:
            return starts, goals
        s1, g1 = rng.choice(cand_s), rng.choice(cand_g)
        if s1 == g1:
            return starts, goals
        starts[1], goals[1] = s1, g1
        return starts, goals
    # Crossing: pick a cell x on agent 0's path at time t; put agent 1 at distance exactly t from x and
    # its goal beyond x, so that one of agent 1's shortest paths passes x at time t too.
    t = rng.randrange(1, len(p0) - 1)
    x = p0[t]
    dx = gm.bfs(x)
    cand_s = [c for c in comp if dx[c] == t and c != s0 and c not in others_s]
    if not cand_s:
        return starts, goals
    s1 = rng.choice(cand_s)
    ds1 = gm.bfs(s1)
    cand_g = [c for c in comp if c != g0 and c != s1 and c not in others_g and dx[c] >= 1 and ds1[c] == t + dx[c]]
    if not cand_g:
        return starts, goals
    starts[1], goals[1] = s1, rng.choice(cand_g)
    return starts, goals


def make_instance(
    size: int,
    hole_ratio: float,
    wants_wait: bool | None,
    num_agents: int,
    seed: int,
    *,
    max_tries: int = DEFAULT_MAX_TRIES,
    max_nodes: int | None = None,
    makespan_nodes: int | None = None,
    id: str | None = None,
    tags: dict | None = None,
) -> tuple[Instance | None, dict]:
    """Draw one instance from `seed` (deterministic). Returns (instance or None, info).

    `wants_wait` None accepts the first solvable draw. `info` has ``tries``, ``budget`` (draws dropped
    because the solver hit its budget), ``unsolvable`` and ``missed`` (True when the instance's
    `needs_wait` differs from the wish).
    """
    rng = random.Random(seed)
    k = num_agents
    hole_ratio = min(hole_ratio, max_hole_ratio(size, k))
    need = k + 2  # distinct starts, distinct goals (a start may be another agent's goal), some slack
    if max_nodes is None and k > 2:
        max_nodes = GEN_CBS_NODES
    info = {"tries": 0, "budget": 0, "unsolvable": 0, "missed": False}
    fallback = None
    for attempt in range(max_tries):
        info["tries"] = attempt + 1
        drawn = _draw_map(rng, size, hole_ratio, need)
        if drawn is None:
            continue
        grid, gm, comp = drawn
        trick = None
        if wants_wait and attempt % 2 == 1:
            trick = "crossing" if rng.random() < 0.6 else "headon"
        placed = _place(rng, gm, comp, k, trick)
        if placed is None:
            continue
        s_idx, g_idx = placed
        starts = [divmod(c, size) for c in s_idx]
        goals = [divmod(c, size) for c in g_idx]
        try:
            plan = solve_on(gm, starts, goals, max_nodes=max_nodes)
        except SolverBudgetExceeded:
            info["budget"] += 1
            continue
        except Unsolvable:
            info["unsolvable"] += 1
            continue
        try:
            span = optimal_makespan(gm, starts, goals, plan.makespan, plan.shortest,
                                    makespan_nodes or GEN_MAKESPAN_NODES)
        except SolverBudgetExceeded:
            info["budget"] += 1
            continue
        shortest = plan.shortest
        needs_wait = plan.cost > sum(shortest)
        inst = dict(
            id=id or f"i{seed}",
            size=size,
            grid=grid,
            starts=starts,
            goals=goals,
            plan=plan.paths,
            optimal_cost=plan.cost,
            makespan=plan.makespan,
            optimal_makespan=span,
            shortest=shortest,
            needs_wait=needs_wait,
            seed=seed,
            tags=tags or {},
        )
        if wants_wait is None or needs_wait == wants_wait:
            return Instance(**inst), info
        if fallback is None:
            fallback = inst
    if fallback is not None:
        info["missed"] = True
        return Instance(**fallback), info
    return None, info


def _work(task: tuple) -> tuple[int, Instance | None, dict]:
    index, size, hole, wants, k, seed, max_tries, id_, *rest = task  # rest: the makespan budget, if any
    inst, info = make_instance(size, hole, wants, k, seed, max_tries=max_tries, id=id_,
                               makespan_nodes=rest[0] if rest else None)
    return index, inst, info


def default_workers() -> int:
    return max(1, min(os.cpu_count() or 1, 8))


def run_tasks(tasks: list[tuple], workers: int | None) -> list[tuple[int, Instance | None, dict]]:
    """Run `_work` over tasks, in order; in a process pool when `workers` > 1."""
    workers = default_workers() if workers is None else max(1, workers)
    if workers == 1 or len(tasks) < 2:
        return [_work(t) for t in tasks]
    # forkserver: safe when the caller has threads (torch, tokenizers) running; workers import only env.
    methods = mp.get_all_start_methods()
    ctx = mp.get_context("forkserver" if "forkserver" in methods else "spawn")
    chunk = max(1, len(tasks) // (workers * 8))
    with ctx.Pool(workers, initializer=_ignore_sigint) as pool:
        return pool.map(_work, tasks, chunksize=chunk)


def _ignore_sigint() -> None:
    """In a pool worker: Ctrl-C is the parent's to handle (it stops the pool); no traceback per worker."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def generate(
    config: EnvConfig,
    n: int | None = None,
    seed: int = 0,
    num_agents: int | None = None,
    workers: int | None = None,
    max_tries: int = DEFAULT_MAX_TRIES,
) -> Generated:
    """Generate `n` (default `config.num_instances`) solvable instances for `config`, deterministically.

    `num_agents` defaults to `config.num_agents`. `workers` None uses one process for small requests
    and up to `os.cpu_count()` (max 8) processes otherwise; the output does not depend on it.
    Instances come in slot order (sizes ascending) with ids ``g<seed>-<index>``; shuffle downstream if
    order matters.
    """
    n = config.num_instances if n is None else n
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    k = config.num_agents if num_agents is None else num_agents
    if not 1 <= k <= 5:
        raise ValueError(f"num_agents must be between 1 and 5, got {k}")
    slots = plan_slots(config, n)
    tasks = [
        (i, s, config.sizes[s].hole_ratio, w, k, slot_seed(seed, i), max_tries, f"g{seed}-{i:05d}")
        for i, (s, w) in enumerate(slots)
    ]
    if workers is None and n < _PARALLEL_MIN:
        workers = 1
    results = run_tasks(tasks, workers)
    instances = [inst for _, inst, _ in results if inst is not None]
    return Generated(instances=instances, stats=_stats(config, slots, results, k))


def _stats(config: EnvConfig, slots: list[tuple[int, bool]], results: list, k: int) -> dict:
    per: dict[int, dict] = {}
    for (s, wants), (_, inst, info) in zip(slots, results, strict=True):
        d = per.setdefault(
            s,
            {"asked": 0, "produced": 0, "asked_wait": 0, "achieved_wait": 0, "holes": 0.0,
             "wait_shortfall": 0, "nowait_shortfall": 0, "dropped": 0, "tries": 0, "budget_hits": 0},
        )
        d["asked"] += 1
        d["asked_wait"] += int(wants)
        d["tries"] += info["tries"]
        d["budget_hits"] += info["budget"]
        if inst is None:
            d["dropped"] += 1
            continue
        d["produced"] += 1
        d["achieved_wait"] += int(inst.needs_wait)
        d["holes"] += inst.hole_ratio
        if info["missed"]:
            d["wait_shortfall" if wants else "nowait_shortfall"] += 1
    sizes = {}
    notes = []
    for s, knobs in config.sizes.items():
        d = per.get(s)
        # `make_instance` serves at most max_hole_ratio(size, k); when `num_agents` overrides the config's
        # agent count that cap can bite, so the stats keep the asked value and say what was served.
        cap = max_hole_ratio(s, k)
        served_hole = min(knobs.hole_ratio, cap)
        if served_hole < knobs.hole_ratio and d is not None:
            notes.append(f"sizes.{s}: asked hole_ratio {knobs.hole_ratio:g}, served {served_hole:g}, the most a "
                         f"{s}x{s} map with {k} agents serves")
        if d is None:
            sizes[str(s)] = {"asked": 0, "produced": 0, "asked_hole_ratio": knobs.hole_ratio,
                             "served_hole_ratio": served_hole, "asked_wait_ratio": knobs.wait_ratio}
            continue
        p = d["produced"]
        sizes[str(s)] = {
            "asked": d["asked"],
            "produced": p,
            "dropped": d["dropped"],
            "asked_hole_ratio": knobs.hole_ratio,
            "served_hole_ratio": served_hole,
            "achieved_hole_ratio": round(d["holes"] / p, 4) if p else None,
            "asked_wait_ratio": knobs.wait_ratio,
            "asked_wait_count": d["asked_wait"],
            "achieved_wait_share": round(d["achieved_wait"] / p, 4) if p else None,
            "wait_shortfall": d["wait_shortfall"],
            "nowait_shortfall": d["nowait_shortfall"],
            "mean_tries": round(d["tries"] / d["asked"], 2),
            "solver_budget_hits": d["budget_hits"],
        }
    total = sum(v["produced"] for v in sizes.values())
    return {
        "num_agents": k,
        "asked": len(slots),
        "produced": total,
        "shortfalls": {
            "dropped": sum(v.get("dropped", 0) for v in sizes.values()),
            "wait": sum(v.get("wait_shortfall", 0) for v in sizes.values()),
            "nowait": sum(v.get("nowait_shortfall", 0) for v in sizes.values()),
        },
        "sizes": sizes,
        "notes": notes,
    }


__all__ = ["Generated", "SizeKnobs", "generate", "make_instance", "plan_slots", "quotas", "slot_seed"]
