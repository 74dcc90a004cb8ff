"""Any task family other than MAPF-FrozenLake in the loop: `LevelShareFamily`, its `nodes/family.py` `LoopFamily`,
built from the task's own members (beside the trainer's methods: items, prompt, gold, verify):

| member | what it gives | used by |
|---|---|---|
| `levels` (each with a `label`), `level_word` | the difficulty grid the engineer allocates over | every node |
| `parse_config(raw, num_instances)` / `project(raw)` | the strict config check, and the nearest valid config | validate_config |
| `random_config(seed, num_instances)` | the random stage-0 config | apply (`nodes/apply.py`) |
| `generate(config, n, seed)` | a stage's items and the generator's figures | apply |
| `split_names`, `split(name)` | the fixed evaluation splits | evaluate |
| `describe_levels()`, `describe_attributes()` | the engineer's picture of its levers | propose_config |

A config is `{"levels": {"<level>": share, ...}, "num_instances": n}`. The evidence shown to the engineer comes
from the family: rates and failure labels per level, its history of configs and rates, and verbatim failing
answers, fenced as untrusted, exactly as MAPF's (`nodes/evidence.py`). The classic curricula (fixed, random,
learnability, threshold) work on the level shares. The engineer answers `{"levels": ...}`, read by
`nodes/propose_config.py` `extract_levels` and checked by `nodes/validate_config.py` `validate_task` (through
`check` here). `env/rg.py` (reasoning-gym) and `tests/support/toy_task.py` implement it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nodes.evidence import (
    FENCE_CLOSE,
    FENCE_OPEN,
    evidence_nonce,
    fence_evidence,
    fill,
    load_template,
    pick_failures,
    rationale_module,
)
from nodes.metrics import compute_metrics
from trainer.files import write_text_atomic

if TYPE_CHECKING:
    from graph.settings import Settings

LEARNABILITY_UNIFORM_MIX = 0.2
THRESHOLD_BAR = 0.7
THRESHOLD_SHIFT = 0.5


def _pct(x: Any) -> str:
    return "-" if not isinstance(x, int | float) else f"{100 * x:.1f}%"


# ----------------------------------------------------------------------------- evaluate


def verdict_row(task, item: Any, text: str, completion_tokens: int | None = None,
                finish_reason: str | None = None) -> dict[str, Any]:
    """One `eval.jsonl` row of a non-MAPF task: the item's id and level (in `size`, the column every table
    reads), the answer and its verdict."""
    v = task.verify(item, text)
    return {"id": task.item_id(item), "size": int(task.level(item)), "num_agents": None, "tags": {}, "text": text,
            "completion_tokens": completion_tokens, "finish_reason": finish_reason, "valid": bool(v.valid),
            "optimal": bool(v.optimal), "failure": v.label, "score": float(v.score),
            "gold": task.gold(item)}


def level_table_md(task: Any, final: dict[str, Any]) -> str:
    """The final table of a non-MAPF task: valid % per level, and overall."""
    lines = [f"| {task.level_word} | what | n | valid |", "|---|---|---|---|"]
    for lv in task.levels:
        row = (final.get("by_size") or {}).get(str(lv.index)) or {}
        lines.append(f"| {lv.index} | {lv.label} | {row.get('n', 0)} | {100 * row.get('valid_rate', 0.0):.1f}% |")
    lines.append(f"| all | | {final.get('final/n', 0)} | {100 * final.get('final/valid_rate', 0.0):.1f}% |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- the engineer's context


def levels_table(task, by_level: dict[str, dict]) -> str:
    labels = task.failure_labels
    lines = [f"| {task.level_word} | what | n | valid | " + " | ".join(labels) + " |",
             "|" + "---|" * (4 + len(labels))]
    for lv in task.levels:
        row = by_level.get(str(lv.index)) or {}
        counts = " | ".join(str((row.get("failures") or {}).get(f, 0)) for f in labels)
        lines.append(f"| {lv.index} | {lv.label} | {row.get('n', 0)} | {_pct(row.get('valid_rate'))} | {counts} |")
    return "\n".join(lines)


def shares_of(config: dict | None) -> dict[int, float]:
    return {int(k): float(v) for k, v in ((config or {}).get("levels") or {}).items()}


def history_table(task, entries: list[dict]) -> str:
    blocks = []
    for e in entries:
        m = e.get("metrics") or {}
        by = m.get("by_size") or {}
        shares = shares_of(e.get("config"))
        lines = [f"Stage {e['stage']}: overall valid {_pct(m.get('eval/valid_rate'))}", "",
                 f"| {task.level_word} | share trained | valid after |", "|---|---|---|"]
        for lv in task.levels:
            lines.append(f"| {lv.index} | {shares.get(lv.index, 0.0):.2f} | "
                         f"{_pct((by.get(str(lv.index)) or {}).get('valid_rate'))} |")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) if blocks else "(no earlier stage to show yet)"


def task_context(task, state: dict, settings: Settings, eval_rows: Sequence[dict]) -> str:
    """The family's context for the engineer after stage k's evaluation: F (rates and failures per level), H
    (history), S (its last rationale and what became of it), X (verbatim failing answers, fenced as untrusted)."""
    stage = int(state.get("stage") or 0)
    m = state.get("metrics") or {}
    parts = [f"# Evidence after training stage {stage} ({task.name})",
             f"## F. Results on the validation set (stage {stage})\nOverall: valid rate "
             f"{_pct(m.get('eval/valid_rate'))} over {m.get('eval/n', 0)} questions. Per {task.level_word}, the "
             "valid rate and counts of each failure (no_answer: empty; wrong: no credit; partial: the scorer's "
             "partial credit):\n\n" + levels_table(task, m.get("by_size") or {})]
    entries = [e for e in (state.get("history") or []) if e.get("stage") != stage]
    entries.append({"stage": stage, "config": state.get("config") or {}, "metrics": m})
    parts.append("## H. History\nEach block: the share of a stage's questions from each level, and the valid "
                 "rate after it.\n\n" + history_table(task, entries))
    parts.append(rationale_module(state, settings, load_template("module_S.md", settings.prompts_dir)))
    picked = pick_failures(eval_rows, settings.evidence_examples)
    if picked:
        nonce = evidence_nonce(settings.seed, stage, [r.get("text") or "" for r in picked])
        blocks = fence_evidence(picked, max_chars=settings.evidence_chars, nonce=nonce)
        parts.append(fill(load_template("module_X.md", settings.prompts_dir), open=f"{FENCE_OPEN} {nonce}>>>",
                          close=f"{FENCE_CLOSE} {nonce}>>>", blocks=blocks))
    return "\n\n".join(p.strip() for p in parts) + "\n"


# ----------------------------------------------------------------------------- the engineer's prompt


def answer_schema(task) -> dict:
    keys = {str(lv.index): {"type": "number", "minimum": 0, "maximum": 1} for lv in task.levels}
    return {"type": "object", "additionalProperties": False, "required": ["levels"],
            "properties": {"levels": {"type": "object", "additionalProperties": False, "properties": keys,
                                      "description": "level -> share of the next stage's questions (sum 1)"},
                           "rationale": {"type": "string", "description": "what changed and why, briefly"}}}


def system_prompt(task) -> str:
    """The engineer's system prompt for a non-MAPF task, generated from the family's own description of its
    levels (for reasoning-gym: the dataset's curriculum), never written per dataset."""
    example = {"levels": {str(task.levels[0].index): 0.5, str(task.levels[min(1, len(task.levels) - 1)].index): 0.5},
               "rationale": "..."}
    attrs = task.describe_attributes() if hasattr(task, "describe_attributes") else ""
    return "\n\n".join(p for p in [
        f"You are the environment engineer of a reinforcement-learning run. A small language model (the policy) "
        f"is trained in stages on questions of the task `{task.name}`, scored by the task's own checker. After "
        "each stage you see how the policy did on a fixed validation set, and you choose the next stage's "
        "training data: what share of its questions comes from each difficulty level.",
        "## Levels\n" + (f"Difficulty attributes:\n{attrs}\n\n" if attrs else "") + task.describe_levels(),
        "## What helps\n- The goal is the valid rate on held-out questions of every level, not the training "
        "reward.\n- Questions the policy always fails or always solves teach little; put most of the data "
        "where it sometimes succeeds.\n- Prefer local edits: keep what works, change a few shares at a time.",
        "## Answer contract\nReply with ONE JSON object and nothing else: `levels` maps a level number to its "
        "share of the next stage's questions (shares in [0, 1] that sum to 1; a level left out gets none), and "
        f"`rationale` says briefly why. Example: {json.dumps(example)}",
    ] if p)


# ----------------------------------------------------------------------------- classic curricula


def classic(name: str, task, config: dict, by_level: dict, memory: dict, rng) -> tuple[dict, str, dict]:
    """A classic curriculum's next config over the level shares: fixed (stage 0's forever), random (a fresh random
    config), learnability (shares in proportion to p(1-p), mixed 20 % uniform), threshold (once a trained level's
    valid rate passes 0.7, half its share moves to the next level)."""
    memory = dict(memory or {})
    cur = shares_of(config)
    p = {int(k): float(v.get("valid_rate", 0.0)) for k, v in (by_level or {}).items()}
    levels = [lv.index for lv in task.levels]
    if name == "fixed":
        memory.setdefault("fixed_config", {"levels": {str(k): v for k, v in cur.items()}})
        return memory["fixed_config"], "fixed: keep the stage-0 configuration", memory
    if name == "random":
        seed = rng.randrange(2**31)
        cfg = task.random_config(seed)
        return {"levels": {str(k): v for k, v in cfg.levels.items()}}, f"random: fresh random config (seed {seed})", memory
    if name == "learnability":
        score = {lv: p.get(lv, 0.0) * (1 - p.get(lv, 0.0)) for lv in levels}
        total = sum(score.values())
        new = {lv: (1 - LEARNABILITY_UNIFORM_MIX) * (score[lv] / total if total > 0 else 1 / len(levels))
               + LEARNABILITY_UNIFORM_MIX / len(levels) for lv in levels}
        best = max(levels, key=lambda lv: score[lv])
        why = f"most data to level {best} (p={p.get(best, 0.0):.2f})" if total > 0 else "no level has 0 < p < 1"
        return {"levels": {str(k): v for k, v in new.items()}}, f"learnability p(1-p): {why}", memory
    if name == "threshold":
        new = dict(cur)
        raised = []
        for lv in sorted(cur):
            if p.get(lv, -1.0) >= THRESHOLD_BAR and lv + 1 in levels:
                moved = cur[lv] * THRESHOLD_SHIFT
                new[lv] -= moved
                new[lv + 1] = new.get(lv + 1, 0.0) + moved
                raised.append(lv)
        why = (f"levels {raised} passed p>={THRESHOLD_BAR}: half their share moved up" if raised
               else f"no trained level passed p>={THRESHOLD_BAR}: unchanged")
        return {"levels": {str(k): v for k, v in sorted(new.items()) if v > 0}}, f"threshold: {why}", memory
    raise ValueError(f"classic engineer {name!r}: allowed: fixed, random, learnability, threshold")


# ----------------------------------------------------------------------------- validate


def check(task, proposal: Any, n: int) -> tuple[dict | None, list[str]]:
    """(the config dump, []) when `proposal` is valid for the task, else (None, [the one-line error])."""
    if proposal is None:
        return None, ["no proposal"]
    try:
        return task.parse_config(proposal, n).model_dump(mode="json"), []
    except ValueError as e:
        return None, [str(e).splitlines()[0] if "validation error" not in str(e) else _pydantic_line(e)]


def project(task, proposal: Any, n: int) -> dict:
    """The nearest valid config to `proposal` for the task, as a dump with `n` instances (raises ValueError, or
    TypeError / AttributeError for a proposal that is not a mapping, when there is none)."""
    return task.project(proposal).model_copy(update={"num_instances": n}).model_dump(mode="json")


def _pydantic_line(e: Exception) -> str:
    errs = getattr(e, "errors", None)
    if callable(errs):
        first = errs()[0]
        return f"{'.'.join(map(str, first['loc']))}: {first['msg'].removeprefix('Value error, ')}"
    return str(e).splitlines()[0]


# ----------------------------------------------------------------------------- the family


class LevelShareFamily:
    """A task family with level shares as the engineer's levers, through the loop's protocol (`nodes/family.py`
    `LoopFamily`). `task` is the loaded task, `task_name` the run's `task` setting it was loaded from."""

    answer_key = "levels"
    item_word = "items"

    def __init__(self, task: Any, task_name: str):
        self.task = task
        self.task_name = task_name
        self.name = task.name

    def context(self, state: dict, settings: Settings, eval_rows: Sequence[dict], env_stats: dict | None) -> str:
        return task_context(self.task, state, settings, eval_rows)

    def system_prompt(self, settings: Settings) -> str:
        return system_prompt(self.task)

    def answer_schema(self) -> dict:
        return answer_schema(self.task)

    def classic(self, name: str, config: dict, by_level: dict, memory: dict, rng) -> tuple[dict, str, dict]:
        return classic(name, self.task, config, by_level, memory, rng)

    def first_config(self, given: dict | None, seed: int, n: int) -> Any:
        return self.task.parse_config(given, n) if given else self.task.random_config(seed, n)

    def next_config(self, accepted: dict, n: int) -> Any:
        return self.task.parse_config(accepted, n)

    def trained_config(self, cfg: Any, n: int, max_train_size: int | None) -> tuple[Any, None]:
        return cfg.model_copy(update={"num_instances": n}), None

    def stage_items(self, cfg: Any, n: int, seed: int, path: Path) -> tuple[int, dict[str, Any]]:
        items, figures = self.task.generate(cfg, n, seed)
        write_text_atomic(path, "".join(self.task.item_to_json(i) + "\n" for i in items))
        return len(items), figures

    def split(self, name: str) -> list:
        return self.task.split(name)

    def verdict_row(self, item: Any, text: str, completion_tokens: int | None, finish_reason: str | None,
                    criterion: str) -> dict[str, Any]:
        return verdict_row(self.task, item, text, completion_tokens, finish_reason)

    def metrics(self, rows, prefix: str = "eval") -> dict[str, Any]:
        return compute_metrics(rows, prefix, self.task.failure_labels)

    def final(self, rows) -> tuple[dict[str, Any], str]:
        final = self.metrics(rows, prefix="final")
        return final, level_table_md(self.task, final)

    def eval_key_fields(self) -> dict[str, Any]:
        return {"task": self.task_name}

    def report_levels(self) -> list[dict[str, Any]]:
        return [{"index": lv.index, "label": lv.label} for lv in self.task.levels]
