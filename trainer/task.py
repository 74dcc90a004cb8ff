"""The task seam: what the trainer (and, through it, the loop) knows of a task family.

A task family is the environment the engineer configures and the policy is trained on. MAPF-FrozenLake
(`env.task.MapfTask`) is the full example; any object with the methods of `Task` is one too. The trainer
reaches the task only through this protocol:

| method | what it gives | used by |
|---|---|---|
| `item_to_json` / `item_from_json` | an item (one question) as one JSON line, and back | stage files, rewards |
| `item_id`, `level` | an item's stable id, and its difficulty level (MAPF: the grid size) | logs, dynamic sampling |
| `prompt(item, style)` | the policy's chat messages | SFT, GRPO, evaluation |
| `gold(item)` | a verified answer | the SFT warm start |
| `warm_start_items(levels, n, seed)` | fresh items that never coincide with an evaluation split | the SFT warm start |
| `verify(item, answer)` | a `Verdict`: valid, optimal, a failure label (None when valid) | rewards, evaluation |
| `reward(tokenizer, reward_state, cfg)` | TRL's reward function for a stage (`TaskReward` or the task's own) | GRPO |

The loop's nodes need more of a family than the trainer: its levels, a config of the engineer's levers, generation
from a config, fixed evaluation splits and a description for the engineer's prompt. They reach it through
`families/base.py` `LoopFamily`: MAPF-FrozenLake's is `families/mapf.py`, and any other task with the members
listed in `families/level_share.py` is served by its `LevelShareFamily`.

`load_task(name)` gives a task by name: `mapf` (the default), `rg:<dataset>` for a reasoning-gym dataset
(`env.rg`), `rlve:<environment>` for an RLVE-Gym environment (`env.rlve`), `pool:<task>,<task>,...` for several
of them as one (`trainer.pool`), or `package.module:Attribute` for a task defined anywhere importable (a class is instantiated with no arguments). The stage's child process gets the same
name, so a task outside the project trains in a child process exactly as MAPF does (docs/tasks.md).
"""

from __future__ import annotations

import functools
import importlib
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

BUILT_IN = {"mapf": "env.task:MapfTask"}
FIRST_TASK = "mapf"  # the task that came first: keys made before there were others (the warm-start cache) omit it


@dataclass(frozen=True)
class Verdict:
    """A task's judgement of one answer. `label` names the failure (one of the task's `failure_labels`), None
    when the answer is valid; `score` is the answer's reward before any shaping, in [0, 1]."""

    valid: bool
    label: str | None
    score: float
    optimal: bool = False


@runtime_checkable
class Task(Protocol):
    """What a task family gives the trainer (see the module docstring's table)."""

    name: str
    failure_labels: tuple[str, ...]

    def item_to_json(self, item: Any) -> str: ...
    def item_from_json(self, text: str) -> Any: ...
    def item_id(self, item: Any) -> str: ...
    def level(self, item: Any) -> int: ...
    def prompt(self, item: Any, style: str) -> list[dict]: ...
    def gold(self, item: Any) -> str: ...
    def warm_start_items(self, levels: list[int], n: int, seed: int) -> list: ...
    def verify(self, item: Any, answer: str) -> Verdict: ...


def load_task(name: str | Task) -> Task:
    """The task named `name` (see the module docstring); a `Task` object is returned as it is."""
    if not isinstance(name, str):
        return name
    return _load_named(name)


@functools.lru_cache(maxsize=16)
def _load_named(name: str) -> Task:
    """The task of a name, built once per process (a family's splits and generators are not rebuilt per node)."""
    if name.startswith("rg:"):  # a reasoning-gym dataset (env/rg.py)
        from env.rg import RgTask

        return RgTask(name)
    if name.startswith("rlve:"):  # an RLVE-Gym environment (env/rlve/)
        from env.rlve import RlveTask

        return RlveTask(name)
    if name.startswith("pool:"):  # several level-share tasks as one (trainer/pool.py)
        from trainer.pool import PoolTask

        return PoolTask(name, load_task)
    target = BUILT_IN.get(name, name)
    allowed = (f"allowed: {', '.join(sorted(BUILT_IN))}, rg:<dataset> (a reasoning-gym dataset), rlve:<environment> "
               "(an RLVE-Gym environment), pool:<task>,<task>,... (a pool of them), or package.module:Attribute "
               "naming a task object or class")
    if ":" not in target:
        raise ValueError(f"task {name!r}: {allowed}")
    module, _, attr = target.partition(":")
    try:
        obj = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"task {name!r}: cannot import {target} ({e}); {allowed}") from e
    task = obj() if isinstance(obj, type) else obj
    missing = [m for m in ("item_to_json", "item_from_json", "item_id", "level", "prompt", "gold",
                           "warm_start_items", "verify") if not callable(getattr(task, m, None))]
    if missing:
        raise ValueError(f"task {name!r}: {target} lacks {', '.join(missing)} (trainer.task.Task)")
    return task


def task_levels(task: Task) -> list[int]:
    """A task's levels, in its own order: its `level_order` where it lists them (MAPF: the grid sizes), else the
    `index` of each of its `levels` (a level-share task's grid: reasoning-gym, tests/support/toy_task.py). A task with
    neither raises `ValueError` naming it."""
    order = getattr(task, "level_order", None)
    if order is not None:
        return [int(lv) for lv in order]
    levels = getattr(task, "levels", None)
    if levels is None:
        raise ValueError(f"task {task.name!r} names no levels: allowed: a `level_order` (level numbers) or `levels` "
                         "(each with an `index`)")
    return [int(lv.index) for lv in levels]


def last_user_text(prompt: Any) -> str:
    """The text of the last user message of chat messages (or the text itself)."""
    if isinstance(prompt, str):
        return prompt
    users = [m.get("content") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
    return str(users[-1]) if users else ""


class TaskReward:
    """TRL reward function of any task: each completion's validity (1 or 0), scored against the item JSON in its
    own row (the dataset's `item` column), never against a position in the batch. With `partial_credit` > 0 (the
    `partial_credit` setting) an invalid answer earns that times its `Verdict.score`; by default it earns 0, so
    that no answer that is never valid earns reward (a scorer's partial credit can favour such answers: for
    reasoning-gym's default scorer, `-10` scores above 0 against golds 0, 1, -1 and 10).

    A row whose prompt is not its item's own prompt raises `ValueError`: its completion answered another item.
    Per-batch statistics go to TRL's `log_metric` (TensorBoard `train/<name>`) and to `self.history`, in the
    shape `reward_summary` reads. `state` is None: a plain verified reward carries nothing between stages.
    """

    def __init__(self, task: Task, prompt_style: str = "compact", partial_credit: float = 0.0):
        if not (isinstance(partial_credit, int | float) and 0.0 <= partial_credit <= 1.0):
            raise ValueError(f"reward {task.name!r}: partial_credit {partial_credit!r}: allowed: 0 <= partial_credit "
                             "<= 1 (0: validity only)")
        self.task = task
        self.prompt_style = prompt_style
        self.partial_credit = float(partial_credit)
        self.__name__ = task.name
        self.state = None
        self.history: list[dict] = []
        self._items: dict[str, Any] = {}

    def item(self, raw: str) -> Any:
        found = self._items.get(raw)
        if found is None:
            found = self._items[raw] = self.task.item_from_json(raw)
        return found

    def check_prompt(self, row: int, item: Any, prompt: Any) -> None:
        want = last_user_text(self.task.prompt(item, self.prompt_style))
        got = last_user_text(prompt)
        if (want not in got) if isinstance(prompt, str) else (got != want):
            raise ValueError(f"reward {self.__name__!r}: row {row}: its prompt is not the prompt of its item "
                             f"{self.task.item_id(item)}; the dataset's 'prompt' and 'item' columns are misaligned. "
                             "Build rows with trainer.data.build_dataset")

    def reward_of(self, verdict: Verdict) -> float:
        """1 for a valid answer; else `partial_credit` times the verdict's score (0 by default)."""
        return 1.0 if verdict.valid else self.partial_credit * min(1.0, max(0.0, float(verdict.score)))

    def __call__(self, prompts=None, completions=None, completion_ids=None, item=None, **kw) -> list[float]:
        from env.library import completion_text

        if item is None:
            raise ValueError(f"reward {self.__name__!r} needs the dataset column 'item' (the item JSON)")
        if len(item) != len(completions):
            raise ValueError(f"reward {self.__name__!r}: {len(completions)} completions but {len(item)} items")
        rewards, valid, optimal, keys, levels = [], [], [], [], []
        for i, (raw, comp) in enumerate(zip(item, completions, strict=True)):
            it = self.item(raw)
            if prompts is not None:
                self.check_prompt(i, it, prompts[i])
            verdict = self.task.verify(it, completion_text(comp))
            rewards.append(self.reward_of(verdict))
            valid.append(bool(verdict.valid))
            optimal.append(bool(verdict.optimal))
            keys.append(self.task.item_id(it))
            levels.append(int(self.task.level(it)))
        # completion_tokens: TRL's token ids where it passes them, else characters (a reward called by hand)
        lengths = ([len(ids) for ids in completion_ids] if completion_ids is not None
                   else [len(completion_text(c)) for c in completions])
        record_batch(self.history, rewards, valid, optimal, keys, lengths, kw.get("log_metric"), levels=levels)
        return rewards


def record_batch(history: list[dict], rewards: list[float], valid: list[bool], optimal: list[bool], keys: list[str],
                 lengths: list[int], log_metric=None, levels: list[int] | None = None, **extra: float) -> None:
    """One batch's statistics appended to `history` (and logged through TRL's `log_metric` when given); `levels`,
    each completion's level, makes `reward_summary` report the training signal per level too."""
    groups: dict[str, list[float]] = defaultdict(list)
    for k, r in zip(keys, rewards, strict=True):
        groups[k].append(r)
    multi = [g for g in groups.values() if len(g) > 1]
    stats = {
        "valid_rate": sum(valid) / len(valid),
        "optimal_rate": sum(optimal) / len(optimal),
        "zero_std_groups": sum(1 for g in multi if max(g) - min(g) < 1e-9) / len(multi) if multi else float("nan"),
        **extra,
        "completion_tokens": sum(lengths) / len(lengths),
    }
    history.append({**stats, "rewards": rewards, "groups": list(groups.values()),
                    **({"levels": list(levels), "valid": list(valid), "keys": list(keys)} if levels is not None else {})})
    if log_metric is not None:
        for name, value in stats.items():
            if not math.isnan(value):
                log_metric(name, value)


def reward_summary(history: list[dict]) -> dict[str, float]:
    """Stage-level `train/...` reward statistics from a reward's `history` (`record_batch`)."""
    rewards = [r for h in history for r in h["rewards"]]
    groups = [g for h in history for g in h["groups"] if len(g) > 1]
    if not rewards:
        return {"train/reward_mean": float("nan"), "train/reward_std": float("nan")}
    q = max(1, len(history) // 4)
    first = [r for h in history[:q] for r in h["rewards"]]
    last = [r for h in history[-q:] for r in h["rewards"]]
    valid = [h["valid_rate"] * len(h["rewards"]) for h in history]
    optimal = [h["optimal_rate"] * len(h["rewards"]) for h in history]
    return {
        "train/reward_mean": statistics.fmean(rewards),
        "train/reward_std": statistics.pstdev(rewards),
        "train/reward_group_std_mean": statistics.fmean(statistics.pstdev(g) for g in groups) if groups else 0.0,
        "train/reward_first_quarter": statistics.fmean(first),
        "train/reward_last_quarter": statistics.fmean(last),
        "train/zero_std_groups": sum(1 for g in groups if max(g) - min(g) < 1e-9) / len(groups) if groups else 1.0,
        "train/groups": len(groups),
        "train/completions": len(rewards),
        "train/valid_rate": sum(valid) / len(rewards),
        "train/optimal_rate": sum(optimal) / len(rewards),
        "train/completion_tokens": statistics.fmean(h["completion_tokens"] for h in history),
        **level_summary(history),
    }


def level_summary(history: list[dict]) -> dict[str, float]:
    """The training signal per level (`train/level/<level>/...`: reward mean, sampled valid rate, share of groups
    whose rewards are all equal, completions) from the batches of `history` that recorded their levels."""
    per: dict[int, dict[str, list]] = defaultdict(lambda: {"rewards": [], "valid": [], "groups": defaultdict(list)})
    for b, h in enumerate(history):
        if "levels" not in h:
            continue
        for r, v, k, lv in zip(h["rewards"], h["valid"], h["keys"], h["levels"], strict=True):
            d = per[int(lv)]
            d["rewards"].append(r)
            d["valid"].append(v)
            d["groups"][(b, k)].append(r)
    out: dict[str, float] = {}
    for lv, d in sorted(per.items()):
        multi = [g for g in d["groups"].values() if len(g) > 1]
        out[f"train/level/{lv}/reward_mean"] = statistics.fmean(d["rewards"])
        out[f"train/level/{lv}/valid_rate"] = sum(d["valid"]) / len(d["valid"])
        out[f"train/level/{lv}/completions"] = len(d["rewards"])
        if multi:
            out[f"train/level/{lv}/zero_std_groups"] = sum(1 for g in multi if max(g) - min(g) < 1e-9) / len(multi)
    return out
