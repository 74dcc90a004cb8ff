"""RLVE's adaptive-difficulty rule as a classic curriculum (`ENGINEER=rlve`), over any family's ordered levels.

RLVE (arXiv 2511.07317, section 2) keeps, per environment, the highest difficulty reached `h`, and samples problems
uniformly from the window of the last `d` difficulties `[h - d + 1, h]`. Once at least `tau_num` problems at `h`
have been scored, it checks their accuracy: at `tau_acc` or above, `h` goes up by one; either way the count starts
again. The constants are those of RLVE's released code (github.com/Zhiyuan-Zeng/RLVE,
tinker-cookbook/tinker_cookbook/recipes/rlve/train.py, `CLIConfig`):

| constant | value | RLVE's name |
|---|---|---|
| `ACCURACY` | 0.9 | `min_metric_to_increase_difficulty` |
| `MIN_PROMPTS` | 8 | `min_prompts_before_difficulty_check` (prompts; RLVE counts their rollouts, 8 x `n_samples_per_prompt`) |
| `WINDOW` | 4 | `difficulty_sliding_window_size` |
| the first level | the task's first | `init_difficulty = 0` |

Here a check happens after each stage, on the evaluation's prompts at the level reached (the loop's validation
split; greedy answers, one per prompt), and the stage after trains on the window in equal shares. The level reached
is the engineer's memory (`engineer_memory["rlve_reached"]`), saved with the run's state, so a resumed run goes on
from it. Stage 0 trains on the run's first config, as for every engineer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

ACCURACY = 0.9
MIN_PROMPTS = 8
WINDOW = 4
MEMORY_KEY = "rlve_reached"


def rlve_step(levels: Sequence[int], by_level: Mapping[Any, Mapping[str, Any]],
              memory: Mapping[str, Any]) -> tuple[list[int], str, dict[str, Any]]:
    """One check of RLVE's rule over `levels` (the family's levels, in its own order) with the evaluation's
    per-level rates `by_level` (`{level: {"n", "valid_rate"}}`, int or str keys): (the levels of the next stage's
    window, why, the new memory)."""
    levels = [int(lv) for lv in levels]
    memory = dict(memory or {})
    reached = memory.get(MEMORY_KEY, levels[0])
    if reached not in levels:
        raise ValueError(f"engineer memory {MEMORY_KEY}={reached!r} is not a level of this task; allowed: "
                         f"{', '.join(map(str, levels))}")
    row = by_level.get(reached, by_level.get(str(reached))) or {}
    n, p = int(row.get("n", 0) or 0), float(row.get("valid_rate", 0.0) or 0.0)
    at = levels.index(reached)
    if n < MIN_PROMPTS:
        why = f"level {reached} has {n} evaluated prompts, fewer than {MIN_PROMPTS}: stay"
    elif p < ACCURACY:
        why = f"level {reached}: accuracy {p:.2f} < {ACCURACY} over {n} prompts: stay"
    elif at == len(levels) - 1:
        why = f"level {reached}: accuracy {p:.2f} >= {ACCURACY} over {n} prompts, and it is the last level: stay"
    else:
        at += 1
        why = f"level {reached}: accuracy {p:.2f} >= {ACCURACY} over {n} prompts: step up to level {levels[at]}"
    memory[MEMORY_KEY] = levels[at]
    window = levels[max(0, at - WINDOW + 1): at + 1]
    return window, f"rlve: {why}; train on levels {', '.join(map(str, window))}", memory
