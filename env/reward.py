"""The policy's reward, exactly as in the paper: R = w_acc * R_acc + w_len * R_len.

- `accuracy_reward`: 0 unless the answer passes all 8 checks; then, with c = cost - optimal and
  c_max = 2 * optimal: 1.0 if c = 0, 1 - 0.7 * c / c_max if 0 < c <= c_max, 0.3 if c > c_max. Cost and
  optimum are those of the verdict's criterion: the sum of costs (the default of `env.verify`) or the
  makespan (the paper's "makespan-optimal", the loop's default `train.optimality`).
- `agents_on_course` / `partial_credit`: optional partial credit for an invalid answer (not in the paper; off
  unless set): `credit` times the share of agents whose own path is sound alone (starts on its start, stays on
  the map, never enters a hole, moves at most one cell a step, ends on its goal). Below `GAP_FLOOR`, so any
  valid answer still outscores any invalid one.
- `length_reward`: 0 up to 1500 tokens, falling linearly to -1 at 4096 tokens, -1 beyond.
- Weights (w_acc, w_len) move linearly from (0.5, 0.5) to (0.8, 0.2) as the running share of answers of
  at most 1500 tokens rises from 0.5 to 0.9. That running share is explicit state (`RewardState`), so
  it can be saved with a checkpoint and restored on resume. The paper does not say how the share is
  averaged; here it is an exponential moving average over batches (`decay`, default 0.9), starting at 0.5.

Usage per batch: score every answer with `total_reward(verdict, n_tokens, state)` (weights from the state
*before* the batch), then call `state.update(batch_token_counts)`.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, Field

from .prompt import ParseFailure, parse_plan
from .verify import first_unsound_step, path_sound

SHORT_TOKENS = 1500  # answers up to this many tokens get no length penalty
MAX_TOKENS = 4096  # at and beyond this, the length reward is -1
GAP_FLOOR = 0.3  # R_acc of a valid answer that costs more than 3x the optimum
W_START = (0.5, 0.5)
W_END = (0.8, 0.2)
SHARE_LOW, SHARE_HIGH = 0.5, 0.9


def accuracy_reward(verdict) -> float:
    """Gated, gap-shaped accuracy reward of a `Verdict` on its own criterion: the sum of costs against the
    optimal sum of costs (``soc``), or the makespan against the optimal makespan (``makespan``).

    >>> from env.verify import Verdict
    >>> accuracy_reward(Verdict(valid=True, optimal=True, cost=10, optimal_cost=10))
    1.0
    >>> accuracy_reward(Verdict(valid=True, optimal=False, cost=15, optimal_cost=10))  # 1 - 0.7 * 5/20
    0.825
    >>> accuracy_reward(Verdict(valid=True, optimal=False, cost=31, optimal_cost=10))  # c = 21 > c_max = 20
    0.3
    >>> accuracy_reward(Verdict(valid=False, optimal=False, failure="conflict", optimal_cost=10))
    0.0
    >>> accuracy_reward(Verdict(valid=True, optimal=False, cost=10, optimal_cost=10, makespan=5,
    ...                         optimal_makespan=4, criterion="makespan"))  # 1 - 0.7 * 1/8
    0.9125
    """
    if not verdict.valid or verdict.cost is None:
        return 0.0
    if getattr(verdict, "criterion", "soc") == "makespan":
        if verdict.makespan is None or verdict.optimal_makespan is None:
            raise ValueError("a makespan verdict needs makespan and optimal_makespan (build it with env.verify)")
        return gap_reward(verdict.makespan, verdict.optimal_makespan)
    return gap_reward(verdict.cost, verdict.optimal_cost)


def gap_reward(cost: int, optimal_cost: int) -> float:
    """R_acc of a valid plan of sum of costs `cost` against the optimum.

    >>> gap_reward(10, 10), gap_reward(30, 10), gap_reward(12, 10)
    (1.0, 0.3, 0.93)
    """
    c = cost - optimal_cost
    if c <= 0:
        return 1.0
    c_max = 2 * optimal_cost
    if c > c_max:
        return GAP_FLOOR
    return round(1.0 - 0.7 * c / c_max, 12)


def agents_on_course(instance, paths) -> float:
    """Share of `instance`'s agents whose own path in `paths` (one list of (row, col) per agent, as
    `env.parse_plan` returns) is sound on its own: it starts on the agent's start, stays on the map, never enters
    a hole, moves at most one cell a step and ends on the agent's goal. Conflicts between agents are not
    counted (that is the joint check). 0.0 when the plan has the wrong number of paths.

    >>> from env import load_split
    >>> inst = load_split("val-mini")[0]
    >>> agents_on_course(inst, inst.plan), agents_on_course(inst, inst.plan[:1])
    (1.0, 0.0)
    """
    k = instance.num_agents
    if len(paths) != k:
        return 0.0
    n, grid = instance.size, instance.grid
    ok = sum(1 for path, start, goal in zip(paths, instance.starts, instance.goals, strict=True)
             if path_sound(path, start, n, grid) and path[-1] == goal)
    return ok / k


def agents_progress(instance, paths) -> float:
    """Mean over `instance`'s agents of how far each agent's own path gets toward its goal before it first goes
    wrong alone: 1.0 for a path that is sound and ends on its goal (as `agents_on_course` counts it), else
    1 - d(last sound cell) / d(start), with d the shortest distance to the agent's goal over ice cells (0 for a
    wrong start, or a last sound cell no nearer than the start). A path that walks into a hole next to its goal
    scores near 1, one that walks into a hole at its first step 0, so answers that all fail still rank by how far
    they read the map right. Conflicts between agents are not counted. 0.0 for the wrong number of paths.

    >>> from env import load_split
    >>> inst = load_split("val-mini")[0]
    >>> agents_progress(inst, inst.plan), agents_progress(inst, inst.plan[:1])
    (1.0, 0.0)
    >>> half = [p[: len(p) // 2 + 1] for p in inst.plan]  # each path stopped halfway: about half the way there
    >>> 0.0 < agents_progress(inst, half) < 1.0
    True
    """
    from .solver import GridMap

    k = instance.num_agents
    if len(paths) != k:
        return 0.0
    n, grid = instance.size, instance.grid
    gm = GridMap(list(grid))
    total = 0.0
    for path, start, goal in zip(paths, instance.starts, instance.goals, strict=True):
        bad = first_unsound_step(path, start, n, grid) if path else 0
        if bad is None and path[-1] == goal:
            total += 1.0
            continue
        if bad == 0:
            continue
        last = path[-1] if bad is None else path[bad - 1]
        dist = gm.bfs(goal[0] * n + goal[1])
        d0, d = dist[start[0] * n + start[1]], dist[last[0] * n + last[1]]
        if d0 > 0 and d >= 0:
            total += max(0.0, 1.0 - d / d0)
    return total / k


PARTIAL_CREDIT_KINDS = ("goal", "progress")


def partial_credit(instance, verdict, text: str, credit: float, kind: str = "goal") -> float:
    """R_acc of an answer under partial credit `credit` (0 <= credit < GAP_FLOOR): `accuracy_reward` for a
    valid answer; for an invalid one whose plan was read with the right number of agents, `credit` times
    `agents_on_course` (`kind` "goal") or `agents_progress` ("progress"); else 0.

    >>> from env import load_split, verify
    >>> inst = load_split("val-mini")[0]
    >>> partial_credit(inst, verify(inst, "no"), "no", 0.2)
    0.0
    """
    if not 0.0 <= credit < GAP_FLOOR:
        raise ValueError(f"partial credit {credit!r}: allowed: 0 <= credit < {GAP_FLOOR} (the reward of the worst "
                         "valid answer), so that any valid answer outscores any invalid one")
    if kind not in PARTIAL_CREDIT_KINDS:
        raise ValueError(f"partial credit kind {kind!r}: allowed: {', '.join(PARTIAL_CREDIT_KINDS)}")
    if verdict.valid:
        return accuracy_reward(verdict)
    if credit == 0.0 or verdict.failure in ("parse_error", "agent_count"):
        return 0.0
    paths = parse_plan(text, instance.num_agents)
    if isinstance(paths, ParseFailure):
        return 0.0
    share = agents_progress(instance, paths) if kind == "progress" else agents_on_course(instance, paths)
    return round(credit * share, 12)


def length_reward(n_tokens: int) -> float:
    """0 up to 1500 tokens, linear down to -1 at 4096, -1 beyond.

    >>> length_reward(1500), length_reward(2798), length_reward(4096), length_reward(9000)
    (0.0, -0.5, -1.0, -1.0)
    """
    if n_tokens <= SHORT_TOKENS:
        return 0.0
    if n_tokens >= MAX_TOKENS:
        return -1.0
    return -(n_tokens - SHORT_TOKENS) / (MAX_TOKENS - SHORT_TOKENS)


def weights_for_share(share: float) -> tuple[float, float]:
    """(w_acc, w_len) for a running short-answer share.

    >>> weights_for_share(0.3), weights_for_share(0.7), weights_for_share(0.95)
    ((0.5, 0.5), (0.65, 0.35), (0.8, 0.2))
    """
    x = min(1.0, max(0.0, (share - SHARE_LOW) / (SHARE_HIGH - SHARE_LOW)))
    w_acc = W_START[0] + x * (W_END[0] - W_START[0])
    w_len = W_START[1] + x * (W_END[1] - W_START[1])
    return round(w_acc, 12), round(w_len, 12)


class RewardState(BaseModel):
    """Running share of short answers (<= 1500 tokens) that sets the adaptive weights."""

    short_share: float = Field(default=0.5, ge=0.0, le=1.0, description="running share of short answers")
    decay: float = Field(default=0.9, ge=0.0, lt=1.0, description="EMA decay per update (batch)")
    updates: int = Field(default=0, ge=0, description="batches seen")

    def weights(self) -> tuple[float, float]:
        """(w_acc, w_len) for the current running share."""
        return weights_for_share(self.short_share)

    def update(self, n_tokens_list: Sequence[int]) -> RewardState:
        """Fold one batch's completion lengths into the running share (in place; returns self).

        >>> s = RewardState()
        >>> s.update([100, 200, 5000, 300]).short_share  # 0.9 * 0.5 + 0.1 * 0.75
        0.525
        """
        if not n_tokens_list:
            return self
        share = sum(1 for n in n_tokens_list if n <= SHORT_TOKENS) / len(n_tokens_list)
        self.short_share = round(self.decay * self.short_share + (1.0 - self.decay) * share, 12)
        self.updates += 1
        return self


def total_reward(verdict, n_tokens: int, state: RewardState, r_acc: float | None = None) -> float:
    """R = w_acc * R_acc + w_len * R_len with the state's current weights. `r_acc`: R_acc when already known
    (`partial_credit`); None: `accuracy_reward(verdict)`.

    >>> from env.verify import Verdict
    >>> v = Verdict(valid=True, optimal=True, cost=8, optimal_cost=8)
    >>> total_reward(v, 100, RewardState()), total_reward(v, 2798, RewardState(short_share=0.9))
    (0.5, 0.7)
    """
    w_acc, w_len = state.weights()
    acc = accuracy_reward(verdict) if r_acc is None else r_acc
    return round(w_acc * acc + w_len * length_reward(n_tokens), 12)
