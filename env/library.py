"""The testbed as a library: dataset rows, a Hugging Face `datasets.Dataset`, reasoning-gym-style entries and a
TRL-signature reward, all built from the env's own pure functions (no torch, no LLM import).

Rows (`row`, `to_dataset`): one per instance, with

- ``prompt``: the policy's prompt as chat messages (TRL's conversational format): ``[{"role": "user",
  "content": render_prompt(instance, style)}]``; the compact style adds an empty system message first (as
  training does, so that chat templates add no default system prompt);
- ``answer``: the instance's solver-optimal plan in the answer format (`plan_text`), which scores 1.0;
- ``instance``: the instance's JSON (what the reward scores against, whatever order a trainer batches rows in);
- ``instance_id`` and ``metadata`` (size, agents, hole ratio, optimal cost, makespan, needs_wait, seed, tags).

reasoning-gym style (`create_dataset`, `score_answer`): entries ``{"question", "answer", "metadata"}`` with the
prompt text as the question; ``metadata["instance"]`` holds the instance JSON. `score_answer(answer, entry)`
is R_acc of `env.verify`: 0.0 unless valid, 1.0 when optimal, 1.0 -> 0.3 with the cost gap.

TRL (`mapf_reward`): ``def mapf_reward(completions, **kwargs) -> list[float]``, reading the ``instance`` column
that TRL passes as a keyword; each completion gets `env.reward.accuracy_reward(env.verify(instance, text))`.
`LengthAwareReward` adds the paper's length term with its adaptive weights (`env.total_reward`, one
`RewardState` update per batch), as the project's own training does.

    >>> from env.library import create_dataset, score_answer
    >>> entries = create_dataset("random", n=2, seed=0)
    >>> score_answer(entries[0]["answer"], entries[0]), score_answer("no idea", entries[0])
    (1.0, 0.0)
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .config import EnvConfig, format_validation_error, random_config
from .generator import generate
from .instance import Instance
from .prompt import PROMPT_STYLES, SMALL_MODEL_STYLES, render_prompt
from .reward import RewardState, accuracy_reward, total_reward
from .verify import instance_optimal_makespan, plan_text, verify

__all__ = [
    "LengthAwareReward",
    "completion_text",
    "create_dataset",
    "entry",
    "instance_of",
    "mapf_reward",
    "metadata",
    "prompt_messages",
    "row",
    "score_answer",
    "score_answers",
    "to_dataset",
]


def _check_style(style: str) -> None:
    if style not in PROMPT_STYLES:
        raise ValueError(f"prompt style {style!r}: allowed: {', '.join(PROMPT_STYLES)}")


def prompt_messages(instance: Instance, style: str = "full") -> list[dict]:
    """The chat messages the policy sees for `instance` (the same messages the project trains on)."""
    _check_style(style)
    user = [{"role": "user", "content": render_prompt(instance, style)}]
    return [{"role": "system", "content": ""}, *user] if style in SMALL_MODEL_STYLES else user


def metadata(instance: Instance) -> dict[str, Any]:
    """Flat facts about an instance, the same keys for every instance (so a Dataset column has one type)."""
    return {
        "id": instance.id,
        "size": instance.size,
        "num_agents": instance.num_agents,
        "hole_ratio": round(instance.hole_ratio, 6),
        "needs_wait": instance.needs_wait,
        "optimal_cost": instance.optimal_cost,
        "makespan": instance.makespan,
        "optimal_makespan": instance_optimal_makespan(instance),
        "seed": instance.seed,
        "tags": json.dumps(instance.tags, sort_keys=True),
    }


def row(instance: Instance, style: str = "full") -> dict[str, Any]:
    """One dataset row: ``prompt`` (chat messages), ``answer``, ``instance`` (JSON), ``instance_id``, ``metadata``."""
    return {
        "prompt": prompt_messages(instance, style),
        "answer": plan_text(instance.plan),
        "instance": instance.to_json(),
        "instance_id": instance.id,
        "metadata": metadata(instance),
    }


def to_dataset(instances: Iterable[Instance], style: str = "full"):
    """A Hugging Face `datasets.Dataset` of `row`s, ready as a TRL `GRPOTrainer` train_dataset with `mapf_reward`.

    `datasets` is imported here only (it is a TRL dependency, not an env one).
    """
    from datasets import Dataset

    _check_style(style)
    rows = [row(i, style) for i in instances]
    if not rows:
        raise ValueError("to_dataset: no instances given; a Dataset needs at least one row")
    return Dataset.from_list(rows)


def _config(config: EnvConfig | Mapping | str, seed: int) -> EnvConfig:
    if isinstance(config, EnvConfig):
        return config
    if isinstance(config, str):
        if config != "random":
            raise ValueError(f"config {config!r}: allowed: an EnvConfig, a dict of its fields, or 'random'")
        return random_config(seed)
    if isinstance(config, Mapping):
        try:
            return EnvConfig.model_validate(dict(config))
        except ValueError as e:
            raise ValueError(f"config: {format_validation_error(e)}") from None
    raise ValueError(f"config of type {type(config).__name__}: allowed: an EnvConfig, a dict of its fields, "
                     "or 'random'")


def entry(instance: Instance, style: str = "full") -> dict[str, Any]:
    """A reasoning-gym entry: ``question`` (prompt text), ``answer`` (optimal plan), ``metadata`` (with the
    instance JSON under ``instance`` and the prompt style under ``prompt_style``)."""
    _check_style(style)
    return {"question": render_prompt(instance, style), "answer": plan_text(instance.plan),
            "metadata": {**metadata(instance), "instance": instance.to_json(), "prompt_style": style}}


def create_dataset(config: EnvConfig | Mapping | str, n: int, seed: int, *, style: str = "full",
                   num_agents: int | None = None, workers: int | None = None) -> list[dict[str, Any]]:
    """reasoning-gym style: `n` entries (`entry`) generated from `config` with `seed`, deterministically.

    `config` is an `EnvConfig`, a dict of its fields (validated strictly) or ``"random"`` (`random_config(seed)`).
    An instance the generator cannot place is dropped, as `env.generate` does, so fewer than `n` may come back
    for configs it cannot fully serve (e.g. a high wait ratio on 3x3 maps with many holes).
    """
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be an integer >= 0, got {n!r}")
    _check_style(style)
    cfg = _config(config, seed)
    return [entry(i, style) for i in generate(cfg, n, seed, num_agents=num_agents, workers=workers).instances]


def instance_of(source: Any) -> Instance:
    """The `Instance` behind an entry, a dataset row, an instance JSON string or dict, or an `Instance`."""
    if isinstance(source, Instance):
        return source
    if isinstance(source, str):
        return Instance.from_json(source)
    if isinstance(source, Mapping):
        if "instance" in source:
            return instance_of(source["instance"])
        meta = source.get("metadata")
        if isinstance(meta, Mapping) and "instance" in meta:
            return instance_of(meta["instance"])
        if "grid" in source:
            return Instance.model_validate(dict(source))
    raise ValueError("cannot find the instance: expected an entry (metadata.instance), a dataset row (instance), "
                     f"an instance JSON string or dict, or an Instance; got {type(source).__name__}")


def score_answer(answer: str | None, entry: Mapping[str, Any], criterion: str = "soc") -> float:
    """reasoning-gym style score of `answer` for `entry`: R_acc of `env.verify` (0.0 for None or an invalid
    plan, 1.0 for an optimal one, 1.0 -> 0.3 with the cost gap). Plans are replayed, never compared as text."""
    if answer is None:
        return 0.0
    return float(accuracy_reward(verify(instance_of(entry), answer, criterion)))


def completion_text(completion: Any) -> str:
    """The answer text of one TRL completion (conversational list of messages, or a plain string)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        return "".join(m.get("content", "") for m in completion if isinstance(m, dict))
    return str(completion)


def _instances_column(completions: Sequence, kwargs: Mapping[str, Any], name: str) -> list:
    column = kwargs.get("instance")
    if column is None:
        raise ValueError(f"reward {name!r} needs the dataset column 'instance' (the instance JSON; "
                         "build the dataset with env.library.to_dataset)")
    if len(column) != len(completions):
        raise ValueError(f"reward {name!r}: {len(completions)} completions but {len(column)} instances")
    return list(column)


def mapf_reward(completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """TRL reward function: R_acc of each completion against the instance in its own row.

    TRL calls it with ``prompts``, ``completions``, ``completion_ids`` and every dataset column as a keyword
    (a list aligned with the completions); this one reads ``instance``. Stateless and pure: the same
    completion and instance always give the same score, ``accuracy_reward(verify(instance, text))``.

    >>> from env import load_split
    >>> inst = load_split("val-mini")[0]
    >>> mapf_reward([plan_text(inst.plan), "no idea"], instance=[inst.to_json()] * 2)
    [1.0, 0.0]
    """
    column = _instances_column(completions, kwargs, "mapf_reward")
    cache: dict[str, Instance] = {}
    out = []
    for raw, comp in zip(column, completions, strict=True):
        inst = cache.get(raw) if isinstance(raw, str) else None
        if inst is None:
            inst = instance_of(raw)
            if isinstance(raw, str):
                cache[raw] = inst
        out.append(float(accuracy_reward(verify(inst, completion_text(comp)))))
    return out


class LengthAwareReward:
    """The training reward with TRL's signature: ``env.total_reward`` (R_acc and the length term with the
    paper's adaptive weights). A batch is scored with the weights in force before it, then its token counts
    update the `RewardState` (one update per call). Token counts come from TRL's ``completion_ids``; without
    them, from `tokenizer` when given, else whitespace-separated words."""

    __name__ = "mapf_total"

    def __init__(self, state: RewardState | None = None, tokenizer: Any = None, criterion: str = "soc"):
        self.state = state if state is not None else RewardState()
        self.tokenizer = tokenizer
        self.criterion = criterion  # what the gap in R_acc is measured on: makespan or soc (env.verify)

    def _n_tokens(self, text: str, ids: Any) -> int:
        if ids is not None:
            return len(ids)
        if self.tokenizer is not None:
            return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return len(text.split())

    def __call__(self, completions: Sequence[Any], **kwargs: Any) -> list[float]:
        column = _instances_column(completions, kwargs, self.__name__)
        ids = kwargs.get("completion_ids")
        rewards, counts = [], []
        for i, (raw, comp) in enumerate(zip(column, completions, strict=True)):
            text = completion_text(comp)
            n = self._n_tokens(text, ids[i] if ids is not None else None)
            rewards.append(float(total_reward(verify(instance_of(raw), text, self.criterion), n, self.state)))
            counts.append(n)
        self.state.update(counts)
        return rewards


def score_answers(instances: Iterable[Instance], answers: Mapping[str, str],
                  criterion: str = "soc") -> dict[str, Any]:
    """Verify `answers` (instance id -> text) against `instances`; unanswered instances are counted, not dropped.

    Returns ``answered``, ``unanswered`` (count), ``unanswered_ids``, ``valid`` / ``optimal`` (counts over the
    answered ones), ``valid_rate`` / ``optimal_rate`` over the answered ones and ``valid_rate_all`` /
    ``optimal_rate_all`` over every instance (an unanswered instance counts as wrong), and ``verdicts``
    (id -> `Verdict`). An answer whose id is not an instance raises `ValueError` naming it.
    """
    by_id = {i.id: i for i in instances}
    unknown = [k for k in answers if k not in by_id]
    if unknown:
        raise ValueError(f"answer id {unknown[0]!r} is not one of the {len(by_id)} instances")
    verdicts = {k: verify(by_id[k], text, criterion) for k, text in answers.items()}
    missing = [k for k in by_id if k not in answers]
    valid = sum(v.valid for v in verdicts.values())
    optimal = sum(v.optimal for v in verdicts.values())
    n, total = len(verdicts), len(by_id)
    return {
        "answered": n, "unanswered": len(missing), "unanswered_ids": missing,
        "valid": valid, "optimal": optimal,
        "valid_rate": valid / n if n else 0.0, "optimal_rate": optimal / n if n else 0.0,
        "valid_rate_all": valid / total if total else 0.0, "optimal_rate_all": optimal / total if total else 0.0,
        "verdicts": verdicts,
    }
