"""What the engineer is shown, per level, for every family: the tables of the context modules
(`families/evidence.py` `build_context` renders them into the templates of `prompts/`).

A family hands `build_context` an `EvidenceView`: its levels (MAPF-FrozenLake: the grid sizes; a level-share task:
its difficulty levels), the knobs of a config per level, its failure labels, its guideline and the generator's
figures. Everything else is the same for every family:
- rates per level with their 95 % interval (Wilson), and the sampled rate (mean@k, its interval over questions and
  samples) where the evaluation measured one;
- the training signal per level of the stage just trained (its reward, the share of GRPO groups whose answers all
  scored alike, the verified answers a filtered stage kept, the sampled valid rate on its own questions);
- the config being edited, and what the last change did;
- the budget: stages left, questions per evaluation, training per stage.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any, Protocol

from families.metrics import upgrade_metrics

Z95 = 1.959964  # two-sided 95 % normal quantile


def wilson(k: float, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a rate of `k` successes in `n` trials, inside [0, 1]."""
    if n <= 0:
        return (0.0, 1.0)
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (max(0.0, mid - half), min(1.0, mid + half))


def pct(x: Any) -> str:
    return "-" if not isinstance(x, int | float) or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}%"


def rate_ci(rate: Any, n: Any, interval: tuple[Any, Any] = (None, None)) -> str:
    """`37.5% [22-54]`: a rate with its 95 % interval in points (Wilson's over `n`, or the given one: a sampled
    rate's, over questions and samples), or `-`."""
    if not isinstance(rate, int | float) or not isinstance(n, int) or n <= 0:
        return "-"
    given = all(isinstance(x, int | float) for x in interval)
    lo, hi = interval if given else wilson(rate * n, n)
    return f"{100 * rate:.1f}% [{100 * lo:.0f}-{100 * hi:.0f}]"


class EvidenceView(Protocol):
    """What `build_context` asks of a family (MAPF's and the level-share family's are below)."""

    level_word: str  # "size" or the task's own word
    item_word: str  # what an evaluation asks: "puzzles", "questions"
    failure_labels: Sequence[str]
    knobs: Sequence[str]  # the config's columns per level
    guideline: str  # the template of module G
    has_optimal: bool  # whether an answer can be valid but not optimal

    def levels(self) -> list[tuple[str, str]]: ...  # (key in by_level, label shown)
    def config_rows(self, config: dict | None) -> dict[str, dict[str, float]]: ...
    def env_stats(self, stats: dict | None) -> str | None: ...  # module E's table, None: nothing to show


def _by_level(metrics: dict | None) -> dict[str, dict]:
    return upgrade_metrics(metrics or {}).get("by_level") or {}


def rates_table(view: EvidenceView, metrics: dict | None) -> str:
    """F: per level, the answers, the valid (and optimal) rate with its 95 % interval, the sampled valid rate where
    measured, and the count of each failure."""
    by = _by_level(metrics)
    sampled = any("sampled_valid_rate" in (by.get(k) or {}) for k, _ in view.levels())
    head = [view.level_word, "n", "valid [95% CI]"] + (["optimal"] if view.has_optimal else [])
    head += (["sampled valid"] if sampled else []) + list(view.failure_labels)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key, label in view.levels():
        row = by.get(key) or {}
        n = int(row.get("n") or 0)
        cells = [label, str(n), rate_ci(row.get("valid_rate"), n)]
        if view.has_optimal:
            cells.append(pct(row.get("optimal_rate")))
        if sampled:
            cells.append(rate_ci(row.get("sampled_valid_rate"), int(row.get("sampled_n") or 0),
                                 (row.get("sampled_low"), row.get("sampled_high"))))
        cells += [str((row.get("failures") or {}).get(f, 0)) for f in view.failure_labels]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _knob(x: Any) -> str:
    return f"{x:.3f}" if isinstance(x, int | float) else "-"


def config_table(view: EvidenceView, config: dict | None) -> str:
    """The config as a table: one row per level, one column per knob."""
    rows = view.config_rows(config)
    lines = ["| " + " | ".join([view.level_word, *view.knobs]) + " |", "|" + "---|" * (1 + len(view.knobs))]
    for key, label in view.levels():
        r = rows.get(key) or {}
        lines.append("| " + " | ".join([label, *(_knob(r.get(k)) for k in view.knobs)]) + " |")
    return "\n".join(lines)


def change_table(view: EvidenceView, before: dict, after: dict) -> str:
    """What the last change did: per level, the knobs before -> after and the valid rate before -> after."""
    old, new = view.config_rows(before.get("config")), view.config_rows(after.get("config"))
    by0, by1 = _by_level(before.get("metrics")), _by_level(after.get("metrics"))
    knob_cols = [f"{k} (stage {before['stage']} -> {after['stage']})" for k in view.knobs]
    head = [view.level_word, *knob_cols, f"valid after stage {before['stage']}", f"valid after stage {after['stage']}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key, label in view.levels():
        a, b = old.get(key) or {}, new.get(key) or {}
        knobs = [_knob(a.get(k)) + " -> " + _knob(b.get(k)) for k in view.knobs]
        r0, r1 = by0.get(key) or {}, by1.get(key) or {}
        lines.append("| " + " | ".join([label, *knobs, pct(r0.get("valid_rate")), pct(r1.get("valid_rate"))]) + " |")
    return "\n".join(lines)


def history_blocks(view: EvidenceView, entries: Sequence[dict]) -> str:
    """H: one block per stage, its config's knobs beside the valid (and optimal) rate it reached per level."""
    blocks = []
    for e in entries:
        m = e.get("metrics") or {}
        by, rows = _by_level(m), view.config_rows(e.get("config"))
        head = f"Stage {e['stage']}: overall valid {pct(m.get('eval/valid_rate'))}"
        if view.has_optimal:
            head += f", optimal {pct(m.get('eval/optimal_rate'))}"
        cols = [view.level_word, *view.knobs, "valid"] + (["optimal"] if view.has_optimal else [])
        lines = [head, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        for key, label in view.levels():
            r, k = by.get(key) or {}, rows.get(key) or {}
            cells = [label, *(_knob(k.get(c)) for c in view.knobs), pct(r.get("valid_rate"))]
            if view.has_optimal:
                cells.append(pct(r.get("optimal_rate")))
            lines.append("| " + " | ".join(cells) + " |")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) if blocks else "(no earlier stage to show yet)"


TRAIN_LEVEL_COLUMNS = (
    ("reward_mean", "training reward", "num"),
    ("valid_rate", "sampled valid on its training set", "pct"),
    ("zero_std_groups", "groups with no reward spread", "pct"),
    ("kept", "verified answers kept", "int"),
    ("completions", "answers sampled", "int"),
)


def train_level_table(view: EvidenceView, train_metrics: dict | None) -> str | None:
    """The training signal of the stage just trained, per level (`train/level/<key>/<what>` in its metrics), or
    None when the stage recorded none."""
    tm = train_metrics or {}
    keys = [k for k, _ in view.levels()]
    cols = [c for c in TRAIN_LEVEL_COLUMNS if any(f"train/level/{k}/{c[0]}" in tm for k in keys)]
    if not cols:
        return None
    lines = ["| " + " | ".join([view.level_word, *(c[1] for c in cols)]) + " |", "|" + "---|" * (1 + len(cols))]
    for key, label in view.levels():
        cells = []
        for name, _, kind in cols:
            x = tm.get(f"train/level/{key}/{name}")
            if not isinstance(x, int | float) or (isinstance(x, float) and math.isnan(x)):
                cells.append("-")
            else:
                cells.append(pct(x) if kind == "pct" else (str(int(x)) if kind == "int" else f"{x:.3f}"))
        lines.append("| " + " | ".join([label, *cells]) + " |")
    return "\n".join(lines)


def budget_lines(state: dict, settings: Any, metrics: dict | None, items: str = "questions",
                 level_word: str = "level") -> list[str]:
    """The budget the engineer plans with: stages left, the evaluation's questions, training per stage."""
    stage, stages, train = int(state.get("stage") or 0), settings.stages, settings.train
    left = max(0, stages - stage - 1)
    lines = [f"- Stage {stage} (0-based) has just finished; you are designing stage {stage + 1} of {stages} "
             f"(stages 0..{stages - 1}; {left} left, this one included)."]
    m = metrics or {}
    by = _by_level(m)
    ns = sorted({int((r or {}).get("n") or 0) for r in by.values()})
    if m.get("eval/n"):
        per = (f"{ns[0]} per {level_word}" if len(ns) == 1 else f"{ns[0]}-{ns[-1]} per {level_word}") if ns else ""
        half = max((wilson(n / 2, n)[1] - 0.5 for n in ns if n), default=0.0)
        lines.append(f"- Each evaluation asks the same {m['eval/n']} held-out {items} ({per}): a rate at one {level_word} "
                     f"is known to within about ±{100 * half:.0f} points (95 %), so small moves are noise.")
    n_items = train.instances_per_stage
    if getattr(train, "optimizer", "grpo") == "filtered":
        budget = getattr(train, "stage_samples", None)
        if budget:
            lines.append(f"- Each stage samples {budget} answers ({train.filtered_prompts} {items} x "
                         f"{train.num_generations} a round) from {n_items} training {items}, and fine-tunes on "
                         "the verified ones: a level where nothing is right gives nothing to learn from.")
        else:
            lines.append(f"- Each stage runs {train.max_steps} fine-tuning steps on verified answers sampled from "
                         f"{n_items} training {items} ({train.filtered_prompts} {items} x "
                         f"{train.num_generations} a round).")
    elif train.max_steps > 0:
        lines.append(f"- Each stage runs {train.max_steps} GRPO steps of {train.num_generations} answers per question "
                     f"on {n_items} training {items}: a group whose answers all score alike teaches nothing.")
    else:
        lines.append(f"- Each stage trains for {train.epochs} epoch(s) of GRPO over {n_items} training {items}.")
    return lines


# ----------------------------------------------------------------------------- the two families' views


# Columns of env.generate's per-size statistics shown to the engineer, in this order (others are left out
# when these are present, to keep the table readable).
ENV_STAT_COLUMNS = (
    "asked",
    "produced",
    "asked_hole_ratio",
    "achieved_hole_ratio",
    "asked_wait_ratio",
    "achieved_wait_share",
    "wait_shortfall",
    "nowait_shortfall",
    "dropped",
)


def env_stats_table(stats: dict | None) -> str:
    """The generator's per-size statistics (asked vs achieved) as a markdown table, plus the totals."""
    if not stats or not isinstance(stats, dict):
        return "(no environment statistics recorded for this stage)"
    per_size = stats.get("sizes") if isinstance(stats.get("sizes"), dict) else {}
    rows = {str(k): v for k, v in per_size.items() if isinstance(v, dict)}
    if not rows:
        return "```\n" + json.dumps(stats, indent=1, sort_keys=True)[:2000] + "\n```"
    present = {c for v in rows.values() for c, x in v.items() if not isinstance(x, dict | list)}
    cols = [c for c in ENV_STAT_COLUMNS if c in present] or sorted(present)
    lines = ["| size | " + " | ".join(cols) + " |", "|" + "---|" * (len(cols) + 1)]
    for size in sorted(rows, key=lambda k: (len(k), k)):
        cells = []
        for c in cols:
            x = rows[size].get(c)
            cells.append(f"{x:.3f}" if isinstance(x, float) else ("-" if x is None else str(x)))
        lines.append(
            f"| {size}x{size} | " + " | ".join(cells) + " |"
            if size.isdigit()
            else f"| {size} | " + " | ".join(cells) + " |"
        )
    totals = {k: v for k, v in stats.items() if k != "sizes" and not isinstance(v, dict | list)}
    for k, v in stats.items():
        if k != "sizes" and isinstance(v, dict):
            totals.update({f"{k}.{kk}": vv for kk, vv in v.items() if not isinstance(vv, dict | list)})
    if totals:
        lines.append("")
        lines.append("Totals: " + ", ".join(f"{k} {v}" for k, v in totals.items()))
    return "\n".join(lines)




class MapfView:
    """MAPF-FrozenLake: the levels are the grid sizes, each with three knobs; answers can be valid but not
    optimal; module E shows the generator's asked-vs-achieved figures; a failing example shows its map."""

    level_word = "size"
    item_word = "puzzles"
    knobs = ("data_ratio", "hole_ratio", "wait_ratio")
    guideline = "guideline.md"
    has_optimal = True

    def __init__(self, items: dict[str, Any] | None = None):
        from env import FAILURES

        self.failure_labels = FAILURES
        self._items = items or {}

    def levels(self) -> list[tuple[str, str]]:
        from env import SIZES

        return [(str(s), f"{s}x{s}") for s in SIZES]

    def config_rows(self, config: dict | None) -> dict[str, dict[str, float]]:
        return {str(k): dict(v) for k, v in ((config or {}).get("sizes") or {}).items() if isinstance(v, dict)}

    def env_stats(self, stats: dict | None) -> str | None:
        return env_stats_table(stats)

    def label(self, row: dict) -> str:
        size = row.get("level", row.get("size"))
        return f"size {size}x{size}, {row.get('num_agents') or '?'} agents"

    def example(self, row: dict) -> tuple[str, str] | None:
        """The failing answer's map (as text, with its legend) and an optimal plan."""
        from env.prompt import GOAL_SYMBOLS, START_SYMBOLS
        from env.show import draw
        from env.verify import plan_text

        inst = self._items.get(str(row.get("id")))
        if inst is None:
            return None
        k = len(inst.starts)
        legend = ", ".join(f"{START_SYMBOLS[i]}/{GOAL_SYMBOLS[i]} = start/goal of agent {i}" for i in range(k))
        return f"{draw(inst)}\n({legend}; H = hole, F = ice)", plan_text(inst.plan)


class LevelShareView:
    """A level-share task: its levels with their labels, one knob (the share); a failing example shows its
    question and the task's gold answer."""

    knobs = ("share",)
    item_word = "questions"
    guideline = "guideline_levels.md"
    has_optimal = False

    def __init__(self, task: Any, items: dict[str, Any] | None = None, prompt_style: str = "compact"):
        self.task = task
        self.level_word = task.level_word
        self.failure_labels = tuple(task.failure_labels)
        self._items = items or {}
        self._style = prompt_style

    def levels(self) -> list[tuple[str, str]]:
        return [(str(lv.index), f"{lv.index} ({lv.label})") for lv in self.task.levels]

    def config_rows(self, config: dict | None) -> dict[str, dict[str, float]]:
        shares = {str(k): float(v) for k, v in ((config or {}).get("levels") or {}).items()}
        if not shares:
            return {}
        return {k: {"share": shares.get(k, 0.0)} for k, _ in self.levels()}

    def env_stats(self, stats: dict | None) -> str | None:
        shown = {k: v for k, v in (stats or {}).items() if isinstance(v, int | float | str) and k != "levels"}
        return ", ".join(f"{k} {v}" for k, v in sorted(shown.items())) if shown else None

    def label(self, row: dict) -> str:
        lv = row.get("level", row.get("size"))
        labels = dict(self.levels())
        return f"{self.level_word} {labels.get(str(lv), lv)}"

    def example(self, row: dict) -> tuple[str, str] | None:
        from trainer.task import last_user_text

        item = self._items.get(str(row.get("id")))
        if item is None:
            return None
        return last_user_text(self.task.prompt(item, self._style)), str(self.task.gold(item))
