"""The loop's side of the task seam: `LoopFamily`, the one protocol through which the nodes reach a task family.

The trainer reaches a task through `trainer.task.Task` (items, prompt, gold, verifier with its failure labels,
reward). The nodes need more of it, and ask this object:

| member | what it gives | used by |
|---|---|---|
| `name`, `task` | the family's name; its trainer-side `Task` (item ids, prompts; a level-share family's levels and config) | evaluate, `--dry-run` |
| `context(state, settings, eval_rows, env_stats)` | the evidence shown to the engineer (markdown) | summarize_failures |
| `system_prompt(settings)`, `answer_schema()` | the engineer's system prompt and the JSON schema of its answer | propose_config |
| `shape`, `read_reply(text, finish_reason, parsed)` | what marks a proposal in a reply (`families/reply.py`), and the proposal read from one | propose_config |
| `check(proposal, current, settings, seed=, repair=)` | one pure check: strict, rounding repair, projection (with `repair`), feasibility (`families/policy.py` `Checked`) | validate_config, `--approve`, `--dry-run` |
| `diff(old, new)`, `table(old, new)` | validation.json's `diff` of two configs; the old -> new table a person reads | validate_config, `--approve`, `--dry-run` |
| `classic(name, config, by_level, memory, rng)` | a classic curriculum's next config, why, its memory | propose_config |
| `first_config(given, seed, n)`, `next_config(accepted, n)` | stage 0's config (given or random); the next stage's, already checked | apply |
| `trained_config(cfg, n, max_train_size)` | the config a stage trains on, and a note of what it moved (or None) | apply |
| `stage_items(cfg, n, seed, path)`, `item_word` | a stage's data written to `path` (how many, the generator's figures) | apply |
| `split(name)` | a fixed evaluation split's items | evaluate, final_evaluate |
| `verdict_row(item, text, completion_tokens, finish_reason, criterion)` | one `eval.jsonl` row | evaluate |
| `metrics(rows, prefix)`, `final(rows)` | a stage's metrics; the final metrics and `final/table.md` | evaluate, final_evaluate |
| `eval_key_fields()` | what else names an evaluation whose answers may be reused | evaluate |
| `report_levels()` | the levels of report.md's per-level tables and plots: `index`, `label`, `column` | report |
| `settings_defaults()`, `check_settings(settings)` | settings the family answers unless named (its splits); its check of the settings it reads (ValueError, one line) | graph/settings.py |

What becomes of a checked proposal is decided by one policy for every family (`families/policy.py`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from families.policy import Checked
from families.reply import Extracted, Shape
from trainer.task import Task

# The run's settings (`graph.settings.Settings`): families sit below graph/, so they read its fields but never
# import it, not even for typing (graph/ imports the families).
Settings = Any


class LoopFamily(Protocol):
    """What the nodes ask of a task family (see the module docstring's table)."""

    name: str
    item_word: str
    shape: Shape

    @property
    def task(self) -> Task: ...
    def context(self, state: dict, settings: Settings, eval_rows: list[dict], env_stats: dict | None) -> str: ...
    def system_prompt(self, settings: Settings) -> str: ...
    def answer_schema(self) -> dict: ...
    def read_reply(self, text: str, finish_reason: str | None, parsed: Any) -> Extracted: ...
    def check(self, proposal: Any, current: dict, settings: Settings, *, seed: int, repair: bool) -> Checked: ...
    def diff(self, old: dict | None, new: dict | None) -> dict[str, dict[str, dict[str, Any]]]: ...
    def table(self, old: dict | None, new: dict) -> str: ...
    def classic(self, name: str, config: dict, by_level: dict, memory: dict, rng) -> tuple[dict, str, dict]: ...
    def first_config(self, given: dict | None, seed: int, n: int) -> Any: ...
    def next_config(self, accepted: dict, n: int) -> Any: ...
    def trained_config(self, cfg: Any, n: int, max_train_size: int | None) -> tuple[Any, str | None]: ...
    def stage_items(self, cfg: Any, n: int, seed: int, path: Path) -> tuple[int, dict[str, Any]]: ...
    def split(self, name: str) -> list: ...
    def verdict_row(self, item: Any, text: str, completion_tokens: int | None, finish_reason: str | None,
                    criterion: str) -> dict[str, Any]: ...
    def metrics(self, rows, prefix: str = "eval") -> dict[str, Any]: ...
    def final(self, rows) -> tuple[dict[str, Any], str]: ...
    def eval_key_fields(self) -> dict[str, Any]: ...
    def report_levels(self) -> list[dict[str, Any]]: ...
    def settings_defaults(self) -> dict[str, Any]: ...
    def check_settings(self, settings: Settings) -> None: ...


# ----------------------------------------------------------------------------- the tables' cells


def number(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def table_cell(a: float | None, b: float | None) -> str:
    """`old -> new`, or `old  =` when unchanged; `-` for a missing value."""
    fa = "-" if a is None else f"{a:.3f}"
    fb = "-" if b is None else f"{b:.3f}"
    return f"{fa}  =    " if a is not None and b is not None and abs(a - b) <= 1e-9 else f"{fa} -> {fb}"
