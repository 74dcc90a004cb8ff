"""MAPF-FrozenLake as a task family: the full implementation of the trainer's task seam (`trainer.task.Task`).

Items are `env.Instance`s; an item's level is its grid size (3-10); a gold answer is the solver's optimal plan
(`env.plan_text`); a verdict is `env.verify`'s, with its failure labels (`env.FAILURES`); the reward is the
paper's (`MapfReward`: the validity gate, gap shaping and adaptive length weights, `env.total_reward`), whose
running state travels from stage to stage in each checkpoint's `trainer_meta.json`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, NamedTuple

from .benchmark import list_splits, load_split
from .config import SIZES, EnvConfig
from .generator import generate
from .instance import Instance
from .library import LengthAwareReward, completion_text, prompt_messages
from .reward import accuracy_reward
from .verify import FAILURES, plan_text, verify


class TaskVerdict(NamedTuple):
    """`trainer.task.Verdict`'s fields: valid, the failure label (None when valid), R_acc, optimal."""

    valid: bool
    label: str | None
    score: float
    optimal: bool


class MapfTask:
    """MAPF-FrozenLake (see the module docstring)."""

    name = "mapf"
    failure_labels = tuple(FAILURES)
    criterion = "makespan"  # the loop's rewards, evaluations and tables use the makespan
    level_order = tuple(SIZES)  # its levels, easiest first: the grid sizes

    def warm_start_levels(self, cfg) -> list[int]:
        """The grid sizes of the cached SFT warm start: the training settings' `sft_sizes`."""
        return list(cfg.sft_sizes)

    def item_to_json(self, item: Instance) -> str:
        return item.to_json()

    def item_from_json(self, text: str) -> Instance:
        return Instance.from_json(text)

    def item_id(self, item: Instance) -> str:
        return item.id

    def level(self, item: Instance) -> int:
        return int(item.size)

    def prompt(self, item: Instance, style: str) -> list[dict]:
        return prompt_messages(item, style)

    def gold(self, item: Instance) -> str:
        return plan_text(item.plan)

    def verify(self, item: Instance, answer: str) -> TaskVerdict:
        v = verify(item, answer, self.criterion)
        return TaskVerdict(bool(v.valid), v.failure, accuracy_reward(v), bool(v.optimal))

    def warm_start_items(self, levels: list[int], n: int, seed: int) -> list[Instance]:
        """`n` fresh solvable 2-agent instances spread evenly over the grid sizes `levels` (hole 0.2, wait 0.5),
        drawn from a seed of their own, so that they never coincide with the stage's training draw. Instances
        that are also in an evaluation split (same map, starts and goals: small maps have few distinct layouts)
        are left out and replaced, so the warm start never trains on the answers it is scored on."""
        knobs = {s: {"data_ratio": 1 / len(levels) if s in levels else 0.0, "hole_ratio": 0.2, "wait_ratio": 0.5}
                 for s in SIZES}
        config = EnvConfig.model_validate({"sizes": knobs})
        held_out = eval_layouts()
        out: list = []
        for attempt in range(8):
            batch = generate(config, n if attempt == 0 else max(8, n // 4), seed=seed + 104_729 + 7919 * attempt)
            out.extend(i for i in batch.instances if layout(i) not in held_out)
            if len(out) >= n:
                break
        return out[:n]

    def reward(self, tokenizer, reward_state: dict | None, cfg) -> MapfReward:
        return MapfReward(tokenizer, reward_state, cfg.prompt_style, cfg.optimality, cfg.partial_credit,
                          cfg.partial_credit_kind)


def layout(inst: Instance) -> tuple:
    """What makes two instances the same question: the map, the starts and the goals."""
    return (tuple(inst.grid), tuple(map(tuple, inst.starts)), tuple(map(tuple, inst.goals)))


def eval_layouts() -> set[tuple]:
    """The layouts of every 2-agent instance of every evaluation split."""
    return {layout(i) for name in list_splits() for i in load_split(name) if i.num_agents == 2}


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
        self, prompts=None, completions=None, completion_ids=None, instance=None, item=None, **kw
    ) -> list[float]:
        from env import total_reward, verify
        from env.reward import partial_credit

        instance = instance if instance is not None else item  # trainer.data.build_dataset names the column 'item'
        if instance is None:
            raise ValueError("reward 'mapf' needs the dataset column 'instance' (the instance JSON)")
        if len(instance) != len(completions):
            raise ValueError(f"reward 'mapf': {len(completions)} completions but {len(instance)} instances")
        if prompts is not None and len(prompts) != len(completions):
            raise ValueError(f"reward 'mapf': {len(completions)} completions but {len(prompts)} prompts")
        weights = tuple(self.state.weights())
        rewards, n_tokens, valid, optimal, keys, sizes = [], [], [], [], [], []
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
            sizes.append(inst.size)
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
        self.history.append({**stats, "rewards": rewards, "groups": list(groups.values()), "levels": sizes,
                             "valid": valid, "keys": keys})
        log_metric = kw.get("log_metric")
        if log_metric is not None:
            for name, value in stats.items():
                if not math.isnan(value):
                    log_metric(name, value)
        return rewards
