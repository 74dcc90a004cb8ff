"""The loop's side of the task seam: `LoopFamily`, the one protocol through which the nodes reach a task family, and
`family_of`, the one place that picks it.

The trainer reaches a task through `trainer.task.Task` (items, prompt, gold, verifier with its failure labels,
reward). The nodes need more of it, and ask this object:

| member | what it gives | used by |
|---|---|---|
| `name`, `task` | the family's name; its trainer-side `Task` (item ids, prompts; a level-share family's levels and config) | evaluate, validate_config, `--dry-run` |
| `context(state, settings, eval_rows, env_stats)` | the evidence shown to the engineer (markdown) | summarize_failures |
| `system_prompt(settings)`, `answer_schema()` | the engineer's system prompt and the JSON schema of its answer | propose_config |
| `answer_key` | the key of the engineer's answer that holds the levers: `sizes` or `levels` | propose_config, validate_config |
| `classic(name, config, by_level, memory, rng)` | a classic curriculum's next config, why, its memory | propose_config |
| `first_config(given, seed, n)`, `next_config(accepted, n)` | stage 0's config (given or random); the next stage's, already checked | apply |
| `trained_config(cfg, n, max_train_size)` | the config a stage trains on, and a note of what it moved (or None) | apply |
| `stage_items(cfg, n, seed, path)`, `item_word` | a stage's data written to `path` (how many, the generator's figures) | apply |
| `split(name)` | a fixed evaluation split's items | evaluate, final_evaluate |
| `verdict_row(item, text, completion_tokens, finish_reason, criterion)` | one `eval.jsonl` row | evaluate |
| `metrics(rows, prefix)`, `final(rows)` | a stage's metrics; the final metrics and `final/table.md` | evaluate, final_evaluate |
| `eval_key_fields()` | what else names an evaluation whose answers may be reused | evaluate |
| `report_levels()` | the levels of report.md's per-level tables (None: MAPF's grid sizes) | report |

Two implementations: `nodes/mapf_family.py` `MapfFamily` (MAPF-FrozenLake, env/: per-size knobs, the paper's
context modules, feasibility dry-runs, the held-out benchmark) and `nodes/task_loop.py` `LevelShareFamily` (any
other `Task` with levels and a config of level shares: reasoning-gym, `tests/support/toy_task.py`, your own).

The engineer's reply is read, and its proposal validated, by the functions of `nodes/propose_config.py` and
`nodes/validate_config.py` for the family's `answer_key` (`READERS`, `VALIDATORS`): they share that node's bounded
JSON scan and validation record, which stay in those modules.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from nodes.mapf_family import MapfFamily
from nodes.task_loop import LevelShareFamily
from trainer.task import Task, load_task

if TYPE_CHECKING:
    from graph.settings import Settings


class LoopFamily(Protocol):
    """What the nodes ask of a task family (see the module docstring's table)."""

    name: str
    answer_key: str
    item_word: str

    @property
    def task(self) -> Task: ...
    def context(self, state: dict, settings: Settings, eval_rows: list[dict], env_stats: dict | None) -> str: ...
    def system_prompt(self, settings: Settings) -> str: ...
    def answer_schema(self) -> dict: ...
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
    def report_levels(self) -> list[dict[str, Any]] | None: ...


def family_of(settings: Settings | str = "mapf") -> LoopFamily:
    """The run's task family: from its settings (`settings.task`) or a task name. `mapf` is MAPF-FrozenLake
    (`MapfFamily`); any other name is loaded by `trainer.task.load_task` and works on level shares
    (`LevelShareFamily`). An unknown name raises `ValueError` saying what is allowed."""
    return _family_named(settings if isinstance(settings, str) else settings.task)


@functools.lru_cache(maxsize=16)
def _family_named(name: str) -> LoopFamily:
    if name == "mapf":
        return MapfFamily()
    return LevelShareFamily(load_task(name), name)
