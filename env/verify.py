"""The verifier: replays an answer in the rules engine and says whether it is valid and optimal.

`verify(instance, text)` parses the answer (`env.prompt.parse_plan`), runs the 8 validity checks and
returns a `Verdict`: `valid`, `optimal` (valid and at the optimum of `criterion`), the first failing check
as `failure`, the plan's `cost` (sum of costs) and `makespan` (latest arrival; both None when the plan
could not be read or has the wrong number of agents), the instance's `optimal_cost` (= `optimal_soc`) and
`optimal_makespan`, the `criterion` and `details` (which agent, which step, what was wrong).

`criterion` is ``soc`` by default (the MAPF standard, and the stored plan's own optimum): optimal means
cost == optimal_cost. ``makespan`` is the paper's "makespan-optimal": makespan == optimal_makespan; the
loop's setting `train.optimality` picks it by default for its rewards, evaluations and tables. An instance
from before env 1.1.0 has no stored optimal makespan; it is then computed once (exact search) and cached.

`FAILURES` lists the 8 checks in the paper's order. They are *evaluated* in an order where every check
is meaningful given the ones before it (`CHECK_ORDER`):

1. ``parse_error``      - the answer has a readable ``<answer>`` block (see env.prompt).
2. ``agent_count``      - exactly one path per agent (otherwise per-agent checks are meaningless).
3. ``wrong_start``      - each path starts on its agent's start.
4. ``out_of_bounds``    - every cell is on the map.
5. ``hole``             - no cell is a hole.
6. ``illegal_move``     - consecutive cells are equal (wait) or 4-neighbours (Manhattan step <= 1).
7. ``goal_not_reached`` - each path ends on its agent's goal.
8. ``conflict``         - no two agents share a cell at a time (vertex) or swap cells in a step (edge);
   a path that has ended waits on its last cell (its goal) for ever.

Each check scans agents in order and steps in order, so `details` names the first offender.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

from pydantic import BaseModel, Field

from .instance import Cell, Instance
from .prompt import ParseFailure, parse_plan, parse_plan_spans

Failure = Literal[
    "parse_error", "illegal_move", "conflict", "goal_not_reached", "wrong_start", "agent_count", "hole", "out_of_bounds"
]

# The paper's order: parsable, legal moves, conflict-free, goal reached, start correct, agent count,
# hole-free, in bounds.
FAILURES: tuple[str, ...] = (
    "parse_error",
    "illegal_move",
    "conflict",
    "goal_not_reached",
    "wrong_start",
    "agent_count",
    "hole",
    "out_of_bounds",
)
CHECK_ORDER: tuple[str, ...] = (
    "parse_error",
    "agent_count",
    "wrong_start",
    "out_of_bounds",
    "hole",
    "illegal_move",
    "goal_not_reached",
    "conflict",
)


Criterion = Literal["makespan", "soc"]
CRITERIA: tuple[str, ...] = ("makespan", "soc")


class Verdict(BaseModel):
    """The verifier's judgement of one answer."""

    valid: bool = Field(description="passes all 8 checks")
    optimal: bool = Field(description="valid and at the optimum of `criterion`")
    failure: Failure | None = Field(default=None, description="first failing check (CHECK_ORDER), None if valid")
    cost: int | None = Field(default=None, description="sum of costs of the answer's plan, when readable")
    optimal_cost: int = Field(description="the instance's optimal sum of costs")
    details: dict = Field(default_factory=dict, description="agent, step, cell, reason of the failure")
    makespan: int | None = Field(default=None, description="latest arrival of the answer's plan, when readable")
    optimal_makespan: int | None = Field(default=None, description="the instance's optimal makespan")
    criterion: Criterion = Field(default="soc", description="what `optimal` means: makespan or soc (sum of costs)")

    @property
    def optimal_soc(self) -> int:
        return self.optimal_cost

    def optimal_by(self, criterion: str) -> bool:
        """Valid and at the optimum of `criterion` (makespan or soc), whichever this verdict was judged by."""
        if criterion == "soc":
            return self.valid and self.cost == self.optimal_cost
        if criterion == "makespan":
            return self.valid and self.makespan is not None and self.makespan == self.optimal_makespan
        raise ValueError(f"criterion {criterion!r}: allowed: {', '.join(CRITERIA)}")


def plan_cost(paths: list[list[Cell]]) -> int:
    """Sum of costs: per agent, the step of its last arrival on its final cell (trailing waits are free).

    >>> plan_cost([[(0, 0), (0, 1), (0, 1)], [(1, 1)]])
    1
    """
    total = 0
    for p in paths:
        t = len(p) - 1
        last = p[-1]
        while t > 0 and p[t - 1] == last:
            t -= 1
        total += t
    return total


def plan_makespan(paths: list[list[Cell]]) -> int:
    """Latest arrival: the largest per-agent cost (trailing waits are free).

    >>> plan_makespan([[(0, 0), (0, 1), (0, 1)], [(1, 1), (1, 0), (0, 0)]])
    2
    """
    return max((plan_cost([p]) for p in paths), default=0)


_VERDICT_FIELDS = frozenset(Verdict.model_fields)


def _verdict(valid: bool, optimal: bool, failure: str | None, cost: int | None, optimal_cost: int,
             details: dict, makespan: int | None, optimal_makespan: int | None, criterion: str) -> Verdict:
    """Build a Verdict without re-validating (every field is computed here with its declared type).

    Equivalent to ``Verdict(...)`` (a test checks that) but ~10x cheaper, which matters at 20k answers/s.
    """
    v = object.__new__(Verdict)
    object.__setattr__(v, "__dict__", {"valid": valid, "optimal": optimal, "failure": failure, "cost": cost,
                                       "optimal_cost": optimal_cost, "details": details, "makespan": makespan,
                                       "optimal_makespan": optimal_makespan, "criterion": criterion})
    object.__setattr__(v, "__pydantic_fields_set__", set(_VERDICT_FIELDS))
    object.__setattr__(v, "__pydantic_extra__", None)
    object.__setattr__(v, "__pydantic_private__", None)
    return v


LEGACY_MAKESPAN_NODES = 2_000_000  # search budget for an instance from before env 1.1.0 (no stored optimum)


@lru_cache(maxsize=4096)
def _solved_makespan(grid: tuple[str, ...], starts: tuple, goals: tuple) -> int:
    from .solver import solve

    return solve(list(grid), list(starts), list(goals), objective="makespan", max_nodes=LEGACY_MAKESPAN_NODES).makespan


def instance_optimal_makespan(instance: Instance) -> int:
    """The instance's stored optimal makespan, or (instances from before env 1.1.0) an exact search's, cached. The
    search trusts nothing else the instance stores (`shortest` may be empty in a hand-made instance)."""
    if instance.optimal_makespan is not None:
        return instance.optimal_makespan
    return _solved_makespan(tuple(instance.grid), tuple(map(tuple, instance.starts)), tuple(map(tuple, instance.goals)))


def _check_criterion(criterion: str) -> str:
    if criterion not in CRITERIA:
        raise ValueError(f"criterion {criterion!r}: allowed: {', '.join(CRITERIA)}")
    return criterion


def _fail(instance: Instance, failure: str, cost: int | None = None, *, criterion: str = "soc",
          makespan: int | None = None, **details) -> Verdict:
    return _verdict(False, False, failure, cost, instance.optimal_cost, details, makespan,
                    instance.optimal_makespan, criterion)


def verify(instance: Instance, text: object, criterion: Criterion = "soc") -> Verdict:
    """Judge `text` as an answer to `instance`; `optimal` by `criterion` (makespan or soc). Never raises on any
    answer text (a `criterion` other than makespan or soc raises ValueError naming it)."""
    _check_criterion(criterion)
    paths = parse_plan(text, instance.num_agents)
    if isinstance(paths, ParseFailure):
        return _fail(instance, "parse_error", criterion=criterion, reason=paths.reason)
    return verify_plan(instance, paths, criterion)


def verify_plan(instance: Instance, paths: list[list[Cell]], criterion: Criterion = "soc") -> Verdict:
    """Run checks 2..8 on an already parsed plan (one list of (row, col) per agent)."""
    _check_criterion(criterion)
    k = instance.num_agents
    if len(paths) != k:
        return _fail(instance, "agent_count", criterion=criterion, expected=k, got=len(paths),
                     reason=f"expected {k} agent paths, got {len(paths)}")
    for i, p in enumerate(paths):
        if not p:
            return _fail(instance, "parse_error", criterion=criterion, agent=i, reason=f"agent {i}'s path is empty")
    cost = plan_cost(paths)
    span = plan_makespan(paths)
    starts = instance.starts
    n = instance.size
    grid = instance.grid
    # Fast path: one pass over every cell; only a plan that fails somewhere re-runs the checks one
    # type at a time, in CHECK_ORDER, to name the first failing check.
    if not all(path_sound(p, starts[i], n, grid) for i, p in enumerate(paths)):
        failed = _per_cell_checks(instance, paths, cost, span, criterion)
        if failed is not None:
            return failed
    goals = instance.goals
    for i, p in enumerate(paths):
        if p[-1] != goals[i]:
            return _fail(instance, "goal_not_reached", cost, criterion=criterion, makespan=span, agent=i, step=len(p) - 1, cell=list(p[-1]),
                         expected=list(goals[i]), reason=f"agent {i} ends at {p[-1]}, not its goal {goals[i]}")
    conflict = _first_conflict(paths)
    if conflict is not None:
        return _fail(instance, "conflict", cost, criterion=criterion, makespan=span, **conflict)
    best_span = instance_optimal_makespan(instance)
    below = cost < instance.optimal_cost or span < best_span
    optimal = cost == instance.optimal_cost if criterion == "soc" else span == best_span
    return _verdict(True, optimal, None, cost, instance.optimal_cost, {"below_optimum": True} if below else {},
                    span, best_span, criterion)


def first_error(instance: Instance, text: object) -> tuple[int, str] | None:
    """Where and how an invalid answer first goes wrong, in the order it was written: (the character offset in
    `text` of the first character that no sound answer could have had there, the failure there: wrong_start,
    out_of_bounds, hole, illegal_move, conflict or goal_not_reached). Everything before it passes every check. For a cell
    that starts wrong, leaves the map, enters a hole, jumps or, being the later-written of two cells, conflicts: its
    row number, or its column number when some sound next cell has that row (a token such as " (" that opens any
    next cell is not the error). For a path that stops short of its goal: what follows its last cell. None for a
    valid answer, and for an error with no place in the text (a parse error, the wrong number of agents). Never
    raises on any answer text.

    >>> from env import load_split
    >>> inst = load_split("val-mini")[0]
    >>> first_error(inst, plan_text(inst.plan)) is None
    True
    >>> short = plan_text([inst.plan[0][:-1], inst.plan[1]])
    >>> at, failure = first_error(inst, short)
    >>> short[at:][:1], failure  # just after agent 0's last cell, short of its goal
    ('\\n', 'goal_not_reached')
    """
    parsed = parse_plan_spans(text, instance.num_agents)
    if isinstance(parsed, ParseFailure):
        return None
    paths, spans = parsed
    if len(paths) != instance.num_agents or not all(paths):
        return None
    n, grid = instance.size, instance.grid

    def sound_moves(path: list[Cell], t: int, start: Cell, taken: Cell | None = None) -> list[Cell]:
        if t == 0:
            return [start]
        r, c = path[t - 1]
        near = [(r, c), (r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)]
        return [(a, b) for a, b in near if 0 <= a < n and 0 <= b < n and grid[a][b] != "H" and (a, b) != taken]

    def decisive(cell: Cell, span, ok: list[Cell]) -> int:
        return span[3] if any(o[0] == cell[0] for o in ok) else span[2]

    errors = []
    for path, at, start, goal in zip(paths, spans, instance.starts, instance.goals, strict=True):
        t = first_unsound_step(path, start, n, grid)
        if t is not None:
            errors.append((decisive(path[t], at[t], sound_moves(path, t, start)), _unsound_kind(path, t, start, n, grid)))
        elif path[-1] != goal:
            errors.append((at[-1][1], "goal_not_reached"))
    for a, t in conflict_cells(paths, spans):
        cell = paths[a][t]  # the other agent's cell at t (vertex) or before it (swap): not a sound move here
        errors.append((decisive(cell, spans[a][t], sound_moves(paths[a], t, instance.starts[a], cell)), "conflict"))
    return min(errors) if errors else None


def conflict_cells(paths: list[list[Cell]], spans: list[list[tuple]]) -> list[tuple[int, int]]:
    """For each pair of agents whose paths collide, where the collision is placed in the text: (agent, step) of the
    cell at the pair's first conflict that was written later (`spans` as `parse_plan_spans` gives them)."""
    cells = []
    for i in range(len(paths)):
        for j in range(i + 1, len(paths)):
            conflict = _first_conflict_2(paths[i], paths[j])
            if conflict is not None:
                t = conflict["step"]
                cells.append((max((x for x in (i, j) if t < len(paths[x])), key=lambda x: spans[x][t][0]), t))
    return cells


def _unsound_kind(path: list[Cell], t: int, start: Cell, n: int, grid) -> str:
    r, c = path[t]
    if t == 0 and path[0] != start:
        return "wrong_start"
    if not (0 <= r < n and 0 <= c < n):
        return "out_of_bounds"
    return "hole" if grid[r][c] == "H" else "illegal_move"


def first_unsound_step(path: list[Cell], start: Cell, n: int, grid) -> int | None:
    """The first step at which `path` alone fails `path_sound` (0 for a wrong start), or None."""
    if path[0] != start:
        return 0
    pr, pc = path[0]
    for t, (r, c) in enumerate(path):
        if not (0 <= r < n and 0 <= c < n) or grid[r][c] == "H" or abs(r - pr) + abs(c - pc) > 1:
            return t
        pr, pc = r, c
    return None


def path_sound(path: list[Cell], start: Cell, n: int, grid) -> bool:
    """One agent's path on its own passes checks 3-6: it is non-empty, starts on `start`, stays on the n x n
    map, never enters a hole ('H' in `grid`) and moves at most one cell a step. Its goal is not checked.

    >>> path_sound([(0, 0), (0, 1), (0, 1)], (0, 0), 2, ["FF", "FH"]), path_sound([(0, 0), (1, 1)], (0, 0), 2, ["FF", "FF"])
    (True, False)
    """
    return bool(path) and first_unsound_step(path, start, n, grid) is None


def _per_cell_checks(instance: Instance, paths: list[list[Cell]], cost: int, span: int,
                     criterion: str) -> Verdict | None:
    starts = instance.starts
    for i, p in enumerate(paths):
        if p[0] != starts[i]:
            return _fail(instance, "wrong_start", cost, criterion=criterion, makespan=span, agent=i, step=0, cell=list(p[0]),
                         expected=list(starts[i]), reason=f"agent {i} starts at {p[0]}, not {starts[i]}")
    n = instance.size
    for i, p in enumerate(paths):
        for t, (r, c) in enumerate(p):
            if not (0 <= r < n and 0 <= c < n):
                return _fail(instance, "out_of_bounds", cost, criterion=criterion, makespan=span, agent=i, step=t, cell=[r, c],
                             reason=f"agent {i} leaves the {n}x{n} map at step {t}")
    grid = instance.grid
    for i, p in enumerate(paths):
        for t, (r, c) in enumerate(p):
            if grid[r][c] == "H":
                return _fail(instance, "hole", cost, criterion=criterion, makespan=span, agent=i, step=t, cell=[r, c],
                             reason=f"agent {i} steps on the hole ({r}, {c}) at step {t}")
    for i, p in enumerate(paths):
        pr, pc = p[0]
        for t in range(1, len(p)):
            r, c = p[t]
            if abs(r - pr) + abs(c - pc) > 1:
                return _fail(instance, "illegal_move", cost, criterion=criterion, makespan=span, agent=i, step=t, cell=[r, c],
                             reason=f"agent {i} jumps from ({pr}, {pc}) to ({r}, {c}) at step {t}")
            pr, pc = r, c
    return None


def _first_conflict(paths: list[list[Cell]]) -> dict | None:
    if len(paths) == 2:
        return _first_conflict_2(*paths)
    return _first_conflict_k(paths)


def _first_conflict_2(a: list[Cell], b: list[Cell]) -> dict | None:
    la, lb = len(a) - 1, len(b) - 1
    pa, pb = a[0], b[0]
    for t in range(max(la, lb) + 1):
        ca = a[t] if t <= la else a[la]
        cb = b[t] if t <= lb else b[lb]
        if ca == cb:
            return {"kind": "vertex", "agent": 0, "other": 1, "step": t, "cell": list(ca),
                    "reason": f"agents 0 and 1 are both at {ca} at step {t}"}
        if ca == pb and cb == pa and ca != pa:
            return {"kind": "swap", "agent": 0, "other": 1, "step": t, "cell": list(ca),
                    "reason": f"agents 0 and 1 swap {pa} and {ca} at step {t}"}
        pa, pb = ca, cb
    return None


def _first_conflict_k(paths: list[list[Cell]]) -> dict | None:
    k = len(paths)
    horizon = max(len(p) for p in paths)
    last = [len(p) - 1 for p in paths]
    prev = None
    for t in range(horizon):
        cur = [p[t] if t <= last[i] else p[-1] for i, p in enumerate(paths)]
        if len(set(cur)) < k:
            seen: dict[Cell, int] = {}
            for i, c in enumerate(cur):
                if c in seen:
                    j = seen[c]
                    return {"kind": "vertex", "agent": j, "other": i, "step": t, "cell": list(c),
                            "reason": f"agents {j} and {i} are both at {c} at step {t}"}
                seen[c] = i
        if prev is not None:
            for i in range(k):
                if prev[i] == cur[i]:
                    continue
                for j in range(i + 1, k):
                    if cur[j] == prev[i] and prev[j] == cur[i]:
                        return {"kind": "swap", "agent": i, "other": j, "step": t, "cell": list(cur[i]),
                                "reason": f"agents {i} and {j} swap {prev[i]} and {cur[i]} at step {t}"}
        prev = cur
    return None


def plan_text(paths: list[list[Cell]], reasoning: str = "") -> str:
    """Format a plan in the answer format (used for references, tests and scripted policies).

    >>> print(plan_text([[(0, 0), (0, 1)], [(1, 1)]]))
    <answer>
    Agent 0: (0,0) (0,1)
    Agent 1: (1,1)
    </answer>
    """
    lines = [f"Agent {i}: " + " ".join(f"({r},{c})" for r, c in p) for i, p in enumerate(paths)]
    head = f"{reasoning}\n" if reasoning else ""
    return head + "<answer>\n" + "\n".join(lines) + "\n</answer>"
