"""Step credit from the verifier (`train.step_credit`): GRPO with process supervision, the rewards of its steps
given by the map instead of a learned reward model.

GRPO's outcome reward gives every token of an answer one advantage, so a group of 16 answers teaches about one
bit per answer. DeepSeekMath (Shao et al. 2024, section 4.1.3) also trains GRPO on a reward per reasoning step:
each step's reward is normalized within its group, and the tokens of a step get it on top of their outcome
advantage. Here a step is one cell of one agent's path, and its reward needs no model: the map tells whether the
cell was a sound move and whether it got nearer the agent's goal.

- +1: a sound move to a cell nearer the goal (by the shortest distance over the ice) than any cell the path
  has been on before, so a path earns at most its start's distance in +1 steps however long it runs;
- 0: any other sound move (a wait, on the goal or off it, a step aside, back, or back again). These steps are
  not credited at all: their tokens keep their outcome advantage; or, with `train.step_credit_idle` below 0,
  judged at that value like the others;
- -1: a wrong start, a step off the map, into a hole or a jump; or a cell that collides with the other agent
  (the cell written later of the two, as `env.verify.first_error` places a conflict). A path is judged up to its
  first unsound step: what it writes once off course has no place to be judged from;
- the stop: a path sound to its end is also judged where it ends, on the character after its last cell (the line
  break): +1 on its goal, -1 short of it. Without it, an answer that stops early has fewer steps to be judged
  wrong, and a 24-step stage shortened the answers more than with outcome credit alone (stop 48).

Why 0 is not credited, and +1 is only for a new best (stop 49): in stop 48's first version a wait on the goal
scored +1 and every move nearer the goal did, even back toward a cell already reached, and the neutral steps were
centred with the rest. Every step then had a price, and a step that merely repeats could be worth more than
stopping: a wait on the goal always, any wait in a group whose mean was below 0. The seeds that trained harder
(weight 2, or every block) learned to write the same cell over and over until the 128-token limit cut the second
agent off (trailing waits on the goal in 150 greedy answers: 34 at the start, 203-776 after those stages).

The rewards of a group's credited steps (+1 and -1) are centred on their mean (not divided by their spread, so
one bad step among many sound ones does not get an unbounded weight), and `step_credit` times the centred reward
is added to the advantage of the tokens that wrote the cell's row and column (`" ("`, which opens any next cell,
is left to the outcome alone: pushing it down teaches stopping, stop 44), or the stop. TRL's loss takes
advantages of shape (B, T) as they are (trl 1.16, `GRPOTrainer._compute_loss`).

Not in the paper; off by default, in no preset. Measured in evals/results/learning_cpu (stops 48-49)."""

from __future__ import annotations

from typing import Any

# One judged step: (character offset where the cell's row number starts, where the cell ends, reward).
Step = tuple[int, int, float]


def step_rewards(instance, text: object, idle: float = 0.0) -> list[list[Step]]:
    """The judged steps of each agent's path in `text` (see the module docstring), one list per agent in the
    order `env.parse_plan` returns them; [] when the answer does not parse or names the wrong number of agents.
    `idle`: the reward of a sound step that makes no progress.

    >>> from env import load_split, plan_text
    >>> inst = load_split("val-mini")[0]
    >>> [[r for _, _, r in steps] for steps in step_rewards(inst, plan_text(inst.plan))] == [
    ...     [1.0] * len(p) for p in inst.plan]  # the solver's plan: every step nearer the goal, and it stops there
    True
    """
    from env.prompt import ParseFailure, parse_plan_spans
    from env.solver import GridMap
    from env.verify import conflict_cells, first_unsound_step

    parsed = parse_plan_spans(text, instance.num_agents)
    if isinstance(parsed, ParseFailure) or len(parsed[0]) != instance.num_agents:
        return []
    paths, spans = parsed
    n, grid = instance.size, instance.grid
    gm = GridMap(list(grid))
    judged: list[dict[int, Step]] = []
    for path, at, start, goal in zip(paths, spans, instance.starts, instance.goals, strict=True):
        dist = gm.bfs(goal[0] * n + goal[1])
        bad = first_unsound_step(path, start, n, grid)  # 0: a wrong start
        steps: dict[int, Step] = {}
        best = dist[start[0] * n + start[1]]  # the nearest to the goal the path has been so far
        for t in range(1, len(path) if bad is None else bad):
            d = dist[path[t][0] * n + path[t][1]]
            good = 0 <= d < best
            best = d if good else best
            steps[t] = (at[t][2], at[t][1], 1.0 if good else float(idle))
        if bad is not None:
            steps[bad] = (at[bad][2], at[bad][1], -1.0)
        else:  # sound to its end: where it stops is a step too, right on the goal, wrong short of it
            steps[len(path)] = (at[-1][1], at[-1][1] + 1, 1.0 if path[-1] == goal else -1.0)
        judged.append(steps)
    for a, t in conflict_cells(paths, spans):
        if t in judged[a]:
            judged[a][t] = (*judged[a][t][:2], -1.0)
    return [[steps[t] for t in sorted(steps)] for steps in judged]


def _token_ends(tok, tokens: list[int]) -> list[int]:
    """ends[k]: the length of the decoded text of tokens[:k + 1] (token k writes characters ends[k-1]..ends[k])."""
    return [len(tok.decode(tokens[: k + 1], skip_special_tokens=True)) for k in range(len(tokens))]


def step_credit(batch: dict, rows: list[dict], tok, weight: float, group_size: int,
                counts: dict | None = None, idle: float = 0.0) -> dict:
    """`batch` with per-token advantages (B, T): each row's outcome advantage, plus `weight` times the centred
    reward of the credited step (`step_rewards`; a step judged 0 is not credited) whose row and column each token
    wrote. Centred within each group of `group_size` consecutive rows (a GRPO group). `rows`: the batch's dataset
    rows in order (their `instance` column); `counts`: running totals (answers, credited steps, bad steps, credited
    tokens), updated in place; `idle`: as in `step_rewards`. A step no token wrote (the stop of an answer cut off
    at the length limit) is not judged."""
    from env import Instance

    ids, mask, adv = batch["completion_ids"], batch["completion_mask"], batch["advantages"]
    if len(rows) != ids.shape[0] or ids.shape[0] % group_size:
        raise ValueError(f"step_credit: {len(rows)} rows for a batch of {ids.shape[0]} completions "
                         f"in groups of {group_size}")
    if adv.dim() != 1:
        raise ValueError(f"step_credit: advantages of shape {tuple(adv.shape)}; expected one per answer")
    out = adv[:, None].expand(ids.shape).clone()
    instances: dict[str, Any] = {}
    for g0 in range(0, ids.shape[0], group_size):
        placed: list[tuple[int, list[int], float]] = []  # (row, its tokens, reward)
        for b in range(g0, g0 + group_size):
            raw = rows[b]["instance"]
            inst = instances.get(raw) or instances.setdefault(raw, Instance.from_json(raw))
            tokens = ids[b, : int(mask[b].sum())].tolist()
            steps = [s for agent in step_rewards(inst, tok.decode(tokens, skip_special_tokens=True), idle) for s in agent]
            if not steps:
                continue
            ends = _token_ends(tok, tokens)
            for lo, hi, r in steps:
                if not r:  # a neutral step is not credited (module docstring)
                    continue
                ks = [k for k in range(len(tokens)) if ends[k] > lo and (ends[k - 1] if k else 0) < hi]
                if ks:
                    placed.append((b, ks, r))
        if counts is not None:
            counts["answers"] = counts.get("answers", 0) + group_size
            counts["steps"] = counts.get("steps", 0) + len(placed)
            counts["bad_steps"] = counts.get("bad_steps", 0) + sum(r <= -1 for _, _, r in placed)
        if len(placed) < 2:
            continue
        mean = sum(r for _, _, r in placed) / len(placed)
        for b, ks, r in placed:
            out[b, ks] += weight * (r - mean)
            if counts is not None:
                counts["tokens"] = counts.get("tokens", 0) + len(ks)
    return {**batch, "advantages": out}


def step_credit_metrics(counts: dict) -> dict[str, float]:
    """`train/step_credit_*` figures of a stage (`trainer.localize.Credit.step_counts`): credited steps per answer, the share of them
    that went wrong, and the tokens credited per answer."""
    answers, steps = counts.get("answers", 0), counts.get("steps", 0)
    return {
        "train/step_credit_steps_per_answer": steps / answers if answers else float("nan"),
        "train/step_credit_bad_steps": counts.get("bad_steps", 0) / steps if steps else float("nan"),
        "train/step_credit_tokens_per_answer": counts.get("tokens", 0) / answers if answers else float("nan"),
    }
