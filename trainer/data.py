"""What the policy is trained on: the data side of SFT and GRPO alike, for any task (`trainer.task.Task`).

The prompt is the task's (`task.prompt(item, style)`, in the run's `prompt_style`) in both trainers. SFT
(`trainer.sft`) pairs it with the task's gold answer (`sft_dataset`, on fresh items from `task.warm_start_items`);
GRPO (`trainer.stage`) samples answers to it (`build_dataset`) and scores them with the task's reward
(`task.reward(...)`, else `trainer.task.TaskReward`; MAPF's is `env.task.MapfReward`, with the paper's adaptive
length weights carried from stage to stage in `trainer_meta.json`).
"""

from __future__ import annotations

import random
from typing import Any

from trainer.task import load_task


def sft_dataset(items: list, seed: int, prompt_style: str = "full", order: str = "shuffle", *, task: Any):
    """Prompt-completion chat rows: the policy prompt and the task's gold answer (MAPF: the solver's optimal plan).

    `order="shuffle"`: a seeded random order; `order="size"`: a curriculum inside the warm start, easy levels
    first (MAPF: small maps; shuffled within a level). The trainer keeps this order (`_InOrderSFTTrainer`)."""
    from datasets import Dataset

    task = load_task(task)
    rows = [
        {
            "prompt": task.prompt(item, prompt_style),
            "completion": [{"role": "assistant", "content": task.gold(item)}],
            "size": task.level(item),
        }
        for item in items
    ]
    random.Random(seed).shuffle(rows)
    if order == "size":
        rows.sort(key=lambda r: r["size"])  # stable: shuffled within a size
    return Dataset.from_list([{k: v for k, v in r.items() if k != "size"} for r in rows])


def prompt_ids(tokenizer, messages: list[dict], template_kwargs: dict | None = None) -> list[int]:
    """Token ids of the chat-templated prompt (with the generation prompt), as TRL feeds it (TRL passes its
    `chat_template_kwargs` to `apply_chat_template`; pass the same here)."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                         **(template_kwargs or {}))
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def prompt_tokens(tokenizer, messages: list[dict], template_kwargs: dict | None = None) -> int:
    """Token count of `prompt_ids`."""
    return len(prompt_ids(tokenizer, messages, template_kwargs))


def build_dataset(
    items: list, tokenizer, max_prompt_length: int, prompt_style: str = "full",
    template_kwargs: dict | None = None, *, task: Any,
) -> tuple[Any, int]:
    """A `datasets.Dataset` with `prompt` (chat messages) and the reward's columns; and the dropped count.

    `item` holds the item's full JSON (`task.item_to_json`), so the reward scores each completion against
    exactly the item it answered, whatever order TRL batches rows in; `item_id` is for logs and grouping,
    `level` for dynamic sampling's draw (`row_level`).
    """
    from datasets import Dataset

    task = load_task(task)
    rows, dropped = [], 0
    for item in items:
        msgs = task.prompt(item, prompt_style)
        n = prompt_tokens(tokenizer, msgs, template_kwargs)
        if n > max_prompt_length:
            dropped += 1
            continue
        rows.append({"prompt": msgs, "item": task.item_to_json(item), "item_id": task.item_id(item),
                     "level": task.level(item)})
    return Dataset.from_list(rows), dropped


def row_level(row: dict) -> int:
    """The difficulty level of a training row (`build_dataset`'s `level` column; MAPF: the grid size)."""
    return int(row["level"])
