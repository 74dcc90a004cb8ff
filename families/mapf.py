"""MAPF-FrozenLake's side of the loop: `MapfFamily`, its `nodes/family.py` `LoopFamily`.

Every member wraps what MAPF-FrozenLake's nodes have always run: the paper's context modules
(`nodes/evidence.py`), its engineer prompt (`prompts/engineer_system.md`) and per-size config schema
(`env.EnvConfig`), the classic curricula over per-size knobs (`nodes/curricula.py`), a stage's data from
`env.generate` (sizes above `train.max_train_size` moved onto smaller ones, `env.restrict_sizes`), the fixed
benchmark splits (`env.load_split`), one verdict row per answer (`env.verify`) and the paper's final tables
(`nodes/metrics.py`). Its engineer answers `{"sizes": ...}`, read and validated by `nodes/propose_config.py`
`extract_proposal` and `nodes/validate_config.py` `validate_sizes` (strict check, projection, feasibility).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from env import EnvConfig, SizeKnobs, generate, load_split, random_config, restrict_sizes, verify
from env.instance import write_jsonl
from nodes.curricula import CLASSIC
from nodes.evidence import build_context, fill, load_template
from nodes.metrics import compute_final_metrics, compute_metrics, final_table_md
from trainer.task import Task, load_task

if TYPE_CHECKING:
    from graph.settings import Settings


# ----------------------------------------------------------------------------- the engineer's prompt


def answer_schema() -> dict:
    """JSON schema of the whole answer: the engineer-editable config plus an optional `rationale`."""
    schema = EnvConfig.engineer_schema()
    schema = json.loads(json.dumps(schema))
    schema["properties"]["rationale"] = {"type": "string", "description": "what changed and why, briefly"}
    return schema


OPTIMAL_MEANS = {
    "makespan": "its makespan (the number of steps until the last agent is at its goal)",
    "soc": "its sum of costs (the steps of all agents, summed)",
}


def system_prompt(prompts_dir: Path | str | None = None, optimality: str = "makespan") -> str:
    """The engineer's system prompt: the task, the knobs, the answer contract and schema, and what "optimal"
    means in this run (`train.optimality`: makespan, the paper's criterion, or sum of costs)."""
    if optimality not in OPTIMAL_MEANS:
        raise ValueError(f"optimality {optimality!r}: allowed: {', '.join(OPTIMAL_MEANS)}")
    schema = json.dumps(EnvConfig.engineer_schema(), indent=1)
    return fill(load_template("engineer_system.md", prompts_dir), schema=schema,
                optimal_means=OPTIMAL_MEANS[optimality]).strip()


# ----------------------------------------------------------------------------- stage data and verdicts


def checked_config(dump: dict[str, Any]) -> EnvConfig:
    """The EnvConfig of a dump validate_config already checked (`state["accepted"]`), rebuilt without
    checking it again."""
    sizes = {int(s): SizeKnobs.model_construct(**knobs) for s, knobs in dump["sizes"].items()}
    return EnvConfig.model_construct(sizes=sizes, num_agents=dump["num_agents"], num_instances=dump["num_instances"])


def instance_tags(inst: Any) -> dict[str, Any]:
    """The subset tags of an instance (`{"agents": 3, "wait": 0.25}` on test splits, else {})."""
    tags = getattr(inst, "tags", None)
    return dict(tags) if isinstance(tags, dict) else {}


def verdict_row(inst: Any, text: str, completion_tokens: int | None = None, finish_reason: str | None = None,
                criterion: str = "makespan"):
    """One `eval.jsonl` row: the instance's identity, the answer and its verdict (optimal by `criterion`)."""
    verdict = verify(inst, text, criterion)
    return {
        "id": inst.id,
        "size": inst.size,
        "num_agents": inst.num_agents,
        "tags": instance_tags(inst),
        "text": text,
        "completion_tokens": completion_tokens,
        "finish_reason": finish_reason,
        **verdict.model_dump(mode="json"),
        "optimal_soc": verdict.optimal_cost,
    }


# ----------------------------------------------------------------------------- the family


class MapfFamily:
    """MAPF-FrozenLake through the loop's protocol (`nodes/family.py` `LoopFamily`)."""

    name = "mapf"
    answer_key = "sizes"
    item_word = "instances"

    @property
    def task(self) -> Task:
        return load_task("mapf")

    def context(self, state: dict, settings: Settings, eval_rows: list[dict], env_stats: dict | None) -> str:
        return build_context(variant=settings.context, state=state, settings=settings, eval_rows=eval_rows,
                             env_stats=env_stats)

    def system_prompt(self, settings: Settings) -> str:
        return system_prompt(settings.prompts_dir, settings.train.optimality)

    def answer_schema(self) -> dict:
        return answer_schema()

    def classic(self, name: str, config: dict, by_level: dict, memory: dict, rng) -> tuple[dict, str, dict]:
        return CLASSIC[name](config, by_level, memory, rng)

    def first_config(self, given: dict | None, seed: int, n: int) -> EnvConfig:
        return EnvConfig.model_validate(given) if given else random_config(seed)

    def next_config(self, accepted: dict, n: int) -> EnvConfig:
        return checked_config(accepted)

    def trained_config(self, cfg: EnvConfig, n: int, max_train_size: int | None) -> tuple[EnvConfig, str | None]:
        return restrict_sizes(cfg.model_copy(update={"num_instances": n}), max_train_size)

    def stage_items(self, cfg: EnvConfig, n: int, seed: int, path: Path) -> tuple[int, dict[str, Any]]:
        gen = generate(cfg, n, seed, num_agents=cfg.num_agents)
        write_jsonl(path, gen.instances)
        return len(gen.instances), gen.stats

    def split(self, name: str) -> list:
        return load_split(name)

    def verdict_row(self, item: Any, text: str, completion_tokens: int | None, finish_reason: str | None,
                    criterion: str) -> dict[str, Any]:
        return verdict_row(item, text, completion_tokens, finish_reason, criterion)

    def metrics(self, rows, prefix: str = "eval") -> dict[str, Any]:
        return compute_metrics(rows, prefix)

    def final(self, rows) -> tuple[dict[str, Any], str]:
        final = compute_final_metrics(rows)
        return final, final_table_md(final)

    def eval_key_fields(self) -> dict[str, Any]:
        return {}

    def report_levels(self) -> None:
        return None
