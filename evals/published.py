"""The paper's published numbers (docs/method.md: "Headline results", the per-size 3-agent valid % of
the V6 and fixed-random runs, and the context ablation's valid % per wait subset), printed beneath our rows,
marked "(published)", where a reader compares.

They are the paper's figures for Qwen3-4B trained on a GPU (paper preset, `test` split: 3,150 instances),
with optimality most likely judged by makespan ("makespan-optimal"). Values are percentages; None: not
published (shown as "–").
"""

from __future__ import annotations

from typing import Any

CAPTION = ("Rows marked (published) are the paper's figures (Chen et al., 2026: Qwen3-4B with GRPO on a GPU, "
           "the full `test` split), not runs of this repository; the paper calls its optimal rate "
           "makespan-optimal; per-size values it did not publish are shown as –.")

SIZES = {3: tuple(range(3, 11)), 4: tuple(range(4, 11)), 5: tuple(range(5, 11))}

# run -> agent count -> (Sum valid %, Sum optimal %)
HEADLINE: dict[str, dict[int, tuple[float, float]]] = {
    "self-engineer V6": {3: (51.67, 31.67), 4: (33.14, 21.33), 5: (18.67, 11.00)},
    "base model as engineer": {3: (45.21, 30.00), 4: (27.62, 19.62), 5: (16.00, 10.89)},
    "fixed random config": {3: (40.42, 26.08), 4: (26.67, 16.10), 5: (15.11, 9.11)},
    "Qwen3-4B, no RL": {3: (14.83, 14.00), 4: (3.43, 3.05), 5: (1.44, 1.22)},
    "Kimi-K2.5": {3: (46.17, 29.25), 4: (26.95, 17.90), 5: (13.47, 8.78)},
    "Grok-4.2": {3: (33.42, 21.00), 4: (23.43, 15.33), 5: (12.89, 8.78)},
    "GPT-5.4": {3: (32.50, 20.58), 4: (17.05, 10.86), 5: (9.11, 6.00)},
    "Gemini-3.1-Pro": {3: (24.50, 15.33), 4: (12.95, 10.10), 5: (4.78, 3.56)},
}

# run -> agent count -> size -> valid % (3 agents, V6 and fixed only)
PER_SIZE_VALID: dict[str, dict[int, dict[int, float]]] = {
    "self-engineer V6": {3: dict(zip(SIZES[3], (68.67, 64.67, 62.67, 52.67, 46.00, 42.67, 44.00, 32.00), strict=True))},
    "fixed random config": {3: dict(zip(SIZES[3], (54.67, 54.00, 50.67, 42.67, 38.67, 30.67, 32.67, 19.33), strict=True))},
}

# context ablation: run -> wait ratio -> valid % (how the paper aggregates over agent counts and sizes here
# is not public)
WAIT_VALID: dict[str, dict[float, float]] = {
    f"context {v}": dict(zip((0.25, 0.5, 0.75), vals, strict=True)) for v, vals in (
        ("V1", (25.2, 18.4, 14.9)), ("V2", (36.6, 26.9, 19.7)), ("V3", (38.8, 31.0, 23.9)),
        ("V4", (41.4, 33.6, 25.2)), ("V5", (32.6, 24.6, 19.7)), ("V6", (45.2, 35.7, 27.3)))
}

# runs shown for each kind of table: loop evals (engineers compared, contexts ablated), direct solvers
RUNS = {
    "engineers": ("self-engineer V6", "base model as engineer", "fixed random config", *WAIT_VALID),
    "solvers": ("Qwen3-4B, no RL", "Kimi-K2.5", "Grok-4.2", "GPT-5.4", "Gemini-3.1-Pro"),
}


def wait_rows(runs: tuple[str, ...]) -> list[dict[str, Any]]:
    """One row per published run with per-wait valid % (the context ablation): {run, waits: {wait: valid %}}."""
    return [{"run": run, "waits": WAIT_VALID[run]} for run in runs if run in WAIT_VALID]


def published_rows(agents: int, runs: tuple[str, ...] = RUNS["engineers"]) -> list[dict[str, Any]]:
    """One row per published run for `agents` agents: {run, sizes: {size: (valid, optimal)}, sum: (valid,
    optimal)}, percentages, None where not published."""
    out = []
    for run in runs:
        if agents not in HEADLINE.get(run, {}):
            continue
        per = PER_SIZE_VALID.get(run, {}).get(agents, {})
        out.append({"run": run, "sizes": {z: (per.get(z), None) for z in SIZES.get(agents, ())},
                    "sum": HEADLINE[run][agents]})
    return out
