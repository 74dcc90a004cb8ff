"""What the policy is trained on and how its answers are scored: the data side of SFT and GRPO alike.

The prompt is the policy's own (`env.library.prompt_messages`, in the run's `prompt_style`) in both trainers.
SFT (`trainer.sft`) pairs it with the solver's optimal plan as the answer (`sft_dataset`, on fresh instances drawn by
`warm_start_instances`); GRPO (`trainer.stage`) samples answers to it (`build_dataset`) and scores them with
`MapfReward`: `env.verify` + `env.total_reward` with the adaptive length weights, whose running state
(`env.RewardState`) is updated per batch and carried from stage to stage in `trainer_meta.json`.
"""

from __future__ import annotations

import json
import math
import random
import statistics
from collections import defaultdict
from typing import Any

from env.library import LengthAwareReward, completion_text, prompt_messages


def format_answer(instance) -> str:
    """The optimal plan of `instance` written in the answer format the prompt asks for.

    >>> # plan [[(0,0),(0,1)], [(1,1),(1,0)]] ->
    >>> # "<answer>\\nAgent 0: (0,0) (0,1)\\nAgent 1: (1,1) (1,0)\\n</answer>"
    """
    from env import plan_text

    return plan_text(instance.plan)


def warm_start_instances(sizes: list[int], n: int, seed: int) -> list:
    """`n` fresh solvable 2-agent instances spread evenly over the grid `sizes` (hole 0.2, wait 0.5), drawn
    from a seed of their own, so that they never coincide with the stage's training draw. Instances that are
    also in an evaluation split (same map, starts and goals as a `val`, `val-small` or `test` instance: small
    maps have few distinct layouts) are left out and replaced, so the warm start never trains on the answers it
    is scored on."""
    from env import SIZES, EnvConfig, generate

    knobs = {s: {"data_ratio": 1 / len(sizes) if s in sizes else 0.0, "hole_ratio": 0.2, "wait_ratio": 0.5}
             for s in SIZES}
    config = EnvConfig.model_validate({"sizes": knobs})
    held_out = _eval_layouts()
    out: list = []
    for attempt in range(8):
        batch = generate(config, n if attempt == 0 else max(8, n // 4), seed=seed + 104_729 + 7919 * attempt)
        out.extend(i for i in batch.instances if _layout(i) not in held_out)
        if len(out) >= n:
            break
    return out[:n]


def _layout(inst) -> tuple:
    return (tuple(inst.grid), tuple(map(tuple, inst.starts)), tuple(map(tuple, inst.goals)))


def _eval_layouts() -> set[tuple]:
    from env import list_splits, load_split

    return {_layout(i) for name in list_splits() for i in load_split(name) if i.num_agents == 2}


def sft_dataset(instances: list, seed: int, prompt_style: str = "full", order: str = "shuffle"):
    """Prompt-completion chat rows: the policy prompt and the solver's optimal plan as the answer.

    `order="shuffle"`: a seeded random order; `order="size"`: a curriculum inside the warm start, small maps
    first (shuffled within a size). The trainer keeps this order (`_InOrderSFTTrainer`)."""
    from datasets import Dataset

    rows = [
        {
            "prompt": prompt_messages(inst, prompt_style),
            "completion": [{"role": "assistant", "content": format_answer(inst)}],
            "size": inst.size,
        }
        for inst in instances
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
    instances: list, tokenizer, max_prompt_length: int, prompt_style: str = "full",
    template_kwargs: dict | None = None,
) -> tuple[Any, int]:
    """A `datasets.Dataset` with `prompt` (chat messages) and the reward's columns; and the dropped count.

    `instance` holds the full instance JSON, so the reward scores each completion against exactly the
    instance it answered, whatever order TRL batches rows in; `instance_id` is for logs and grouping.
    """
    from datasets import Dataset

    rows, dropped = [], 0
    for inst in instances:
        msgs = prompt_messages(inst, prompt_style)
        n = prompt_tokens(tokenizer, msgs, template_kwargs)
        if n > max_prompt_length:
            dropped += 1
            continue
        rows.append({"prompt": msgs, "instance": inst.to_json(), "instance_id": inst.id})
    return Dataset.from_list(rows), dropped


class MapfReward(LengthAwareReward):
    """TRL reward function: `env.verify` + `env.total_reward` with the adaptive length weights: the library's
    `LengthAwareReward`, plus the prompt check, the instance cache and per-batch statistics.

    TRL calls it with `prompts`, `completions`, `completion_ids` and every dataset column as a list aligned
    with the completions (here `instance`, `instance_id`). Each completion is scored against the instance
    JSON in its own row, never against a position in the batch. When `prompts` are given, each must be the
    instance's own prompt (`env.render_prompt`, as the last user message); a row whose prompt shows another
    map raises `ValueError`, since its completion answered a different instance. The batch is scored with
    the weights in force before it, then `RewardState.update` takes the batch's token counts (one update
    per batch).
    Per-batch statistics go to TRL's `log_metric` (-> TensorBoard `train/<name>`) and to `self.history`.
    """

    __name__ = "mapf"

    def __init__(self, tokenizer=None, reward_state: dict | None = None, prompt_style: str = "full",
                 criterion: str = "soc", partial_credit: float = 0.0, partial_credit_kind: str = "goal"):
        from env import RewardState
        from env.reward import GAP_FLOOR, PARTIAL_CREDIT_KINDS

        if not 0.0 <= partial_credit < GAP_FLOOR:
            raise ValueError(f"reward 'mapf': partial_credit {partial_credit!r}: allowed: 0 <= partial_credit < "
                             f"{GAP_FLOOR} (below the worst valid answer's R_acc)")
        if partial_credit_kind not in PARTIAL_CREDIT_KINDS:
            raise ValueError(f"reward 'mapf': partial_credit_kind {partial_credit_kind!r}: allowed: "
                             f"{', '.join(PARTIAL_CREDIT_KINDS)}")
        self.partial_credit = partial_credit
        self.partial_credit_kind = partial_credit_kind

        # the state, the tokenizer and token counting are the library reward's (env.library.LengthAwareReward)
        super().__init__(RewardState.model_validate(reward_state) if reward_state else None, tokenizer, criterion)
        self.prompt_style = prompt_style
        self.history: list[dict] = []
        self._cache: dict[str, Any] = {}
        self._prompts: dict[str, str] = {}

    def _instance(self, raw):
        from env import Instance

        if not isinstance(raw, str):
            return raw if hasattr(raw, "grid") else Instance.model_validate(raw)
        inst = self._cache.get(raw)
        if inst is None:
            inst = self._cache[raw] = Instance.from_json(raw)
        return inst

    def _check_prompt(self, row: int, raw, inst, prompt) -> None:
        """Raise `ValueError` unless `prompt` (chat messages or text) is `inst`'s rendered prompt."""
        from env import render_prompt

        want = self._prompts.get(raw) if isinstance(raw, str) else None
        if want is None:
            want = render_prompt(inst, self.prompt_style)
            if isinstance(raw, str):
                self._prompts[raw] = want
        if isinstance(prompt, str):
            ok, got = want in prompt, prompt
        else:
            users = [m.get("content") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
            got = users[-1] if users else ""
            ok = got == want
        if not ok:
            got = str(got)
            at = next((i for i, (a, b) in enumerate(zip(want, got, strict=False)) if a != b), len(got))
            raise ValueError(
                f"reward 'mapf': row {row}: its prompt is not the prompt of its instance {inst.id} (they differ "
                f"from character {at}: {got[at:at + 40]!r} vs {want[at:at + 40]!r}); the dataset's 'prompt' "
                "and 'instance' columns are misaligned. Build rows with trainer.data.build_dataset"
            )

    def __call__(
        self, prompts=None, completions=None, completion_ids=None, instance=None, **kw
    ) -> list[float]:
        from env import total_reward, verify
        from env.reward import partial_credit

        if instance is None:
            raise ValueError("reward 'mapf' needs the dataset column 'instance' (the instance JSON)")
        if len(instance) != len(completions):
            raise ValueError(f"reward 'mapf': {len(completions)} completions but {len(instance)} instances")
        if prompts is not None and len(prompts) != len(completions):
            raise ValueError(f"reward 'mapf': {len(completions)} completions but {len(prompts)} prompts")
        weights = tuple(self.state.weights())
        rewards, n_tokens, valid, optimal, keys = [], [], [], [], []
        for i, (raw, comp) in enumerate(zip(instance, completions, strict=True)):
            inst = self._instance(raw)
            if prompts is not None:
                self._check_prompt(i, raw, inst, prompts[i])
            text = completion_text(comp)
            n = self._n_tokens(text, completion_ids[i] if completion_ids is not None else None)
            verdict = verify(inst, text, self.criterion)
            r_acc = (partial_credit(inst, verdict, text, self.partial_credit, self.partial_credit_kind)
                     if self.partial_credit else None)
            rewards.append(float(total_reward(verdict, n, self.state, r_acc)))
            n_tokens.append(n)
            valid.append(bool(verdict.valid))
            optimal.append(bool(verdict.optimal))
            keys.append(inst.id)
        self.state.update(n_tokens)
        groups: dict[str, list[float]] = defaultdict(list)
        for k, r in zip(keys, rewards, strict=True):
            groups[k].append(r)
        multi = [g for g in groups.values() if len(g) > 1]
        zero_std = sum(1 for g in multi if max(g) - min(g) < 1e-9) / len(multi) if multi else float("nan")
        stats = {
            "valid_rate": sum(valid) / len(valid),
            "optimal_rate": sum(optimal) / len(optimal),
            "zero_std_groups": zero_std,
            "w_acc": weights[0],
            "w_len": weights[1],
            "completion_tokens": sum(n_tokens) / len(n_tokens),
        }
        self.history.append({**stats, "rewards": rewards, "groups": list(groups.values())})
        log_metric = kw.get("log_metric")
        if log_metric is not None:
            for name, value in stats.items():
                if not math.isnan(value):
                    log_metric(name, value)
        return rewards


def row_size(row: dict) -> int:
    """The grid size of a training row (`build_dataset`'s `instance` column holds the instance JSON)."""
    return int(json.loads(row["instance"])["size"])


def reward_summary(history: list[dict]) -> dict[str, float]:
    """Stage-level `train/...` reward statistics from `MapfReward.history`."""
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
        "train/reward_group_std_mean": statistics.fmean(statistics.pstdev(g) for g in groups)
        if groups
        else 0.0,
        "train/reward_first_quarter": statistics.fmean(first),
        "train/reward_last_quarter": statistics.fmean(last),
        "train/zero_std_groups": sum(1 for g in groups if max(g) - min(g) < 1e-9) / len(groups)
        if groups
        else 1.0,
        "train/groups": len(groups),
        "train/completions": len(rewards),
        "train/valid_rate": sum(valid) / len(rewards),
        "train/optimal_rate": sum(optimal) / len(rewards),
        "train/completion_tokens": statistics.fmean(h["completion_tokens"] for h in history),
    }
