"""`python -m graph.run --dry-run`: everything a run checks before its first training step, and no training.
The graph is built, the training set-up of stage 0 is printed (GRPOConfig, LoRA, the vLLM server's command
line; trainer.gpu_plan), stage-0 data is generated, and the engineer is asked for one real proposal on a
dummy context, validated as the run would validate it."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from graph.progress import RunError, diff_summary, say
from graph.settings import Settings
from trainer.files import stage_dir

# one attempt's limit: a reasoning model may think for a minute or more before its config (a server that is down
# still fails at once)
PING_TIMEOUT_S = 120.0


def dummy_metrics(family) -> dict[str, Any]:
    """Validation metrics for a dry run's dummy context: 4 answers per level of the family's report (MAPF's grid
    sizes), fewer valid on harder levels."""
    levels = [lv["index"] for lv in family.report_levels()]
    labels = family.task.failure_labels
    rows = []
    for rank, level in enumerate(levels, start=1):
        for i in range(4):
            valid = i < max(0, 4 - rank)
            rows.append({"level": level, "valid": valid, "optimal": valid and i == 0,
                         "failure": None if valid else labels[(level + i) % len(labels)]})
    return family.metrics(rows)


def _dry_run_model(settings: Settings):
    """An HTTP engineer with one attempt within PING_TIMEOUT_S (a dry run says at once that it does not answer,
    it does not retry for the run's budget); None: `propose` opens the engineer as the run would (self, base)."""
    from llm_backends.engineers import check_engineer_env

    spec = check_engineer_env(settings.engineer, os.environ, model=settings.engineer_model,
                              base_url=settings.engineer_base_url)
    if spec is None or spec.backend != "http":
        return None
    from llm_backends.openai_chat import OpenAIChat

    return OpenAIChat(spec.base_url, spec.model, api_key=spec.api_key, backend=spec.kind,
                      timeout_s=PING_TIMEOUT_S, total_budget_s=PING_TIMEOUT_S, max_attempts=1,
                      reasoning_effort=settings.engineer_reasoning_effort)


def _ask_once(settings: Settings, run_dir: Path, state: dict[str, Any]) -> tuple[dict[str, Any], float]:
    """propose_config's answer to `state` and its seconds; a call that fails is a RunError (one line). Its prompt
    and reply go to `run_dir/dry_run_engineer` (stage_0/ is the run's own, or a donor's)."""
    from langgraph.runtime import Runtime

    from graph.settings import RunContext
    from nodes.propose_config import propose_config

    t0 = time.monotonic()
    model = None if settings.is_classic_engineer else _dry_run_model(settings)
    where = Path(run_dir) / "dry_run_engineer"
    try:
        if model is not None:
            with model:
                out = propose_config(state, Runtime(context=RunContext(settings, where)), model=model)
        else:
            out = propose_config(state, Runtime(context=RunContext(settings, where)))
    except Exception as e:  # noqa: BLE001 - a server that did not start, ...: one line either way
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise RunError(f"[dry-run] engineer {settings.engineer!r} did not answer: {first[:400]}") from None
    return out, time.monotonic() - t0


def _dry_run_proposal(settings: Settings, run_dir: Path, config: dict[str, Any]) -> None:
    """Ask the engineer for one real proposal on a dummy context (stage 0's config and made-up validation
    results), check it as the run would check a first attempt (the family's `check` and the one policy of
    `families.policy`) and say what came out. A call that fails is a RunError (one line); a reply without a usable
    config is reported, not an error."""
    from families import family_of
    from families.policy import decide, may_project
    from nodes.apply import stage_seed

    family, n = family_of(settings), settings.train.instances_per_stage
    try:
        config = family.first_config(config, settings.seed, n).model_dump(mode="json")
    except ValueError:
        say("[dry-run] no readable stage-0 config to show the engineer; not asked for a proposal")
        return
    state: dict[str, Any] = {"stage": 0, "config": config, "metrics": dummy_metrics(family), "history": []}
    try:
        env_stats = json.loads((stage_dir(run_dir, 0) / "env_stats.json").read_text())
    except (OSError, ValueError):
        env_stats = None
    state["context"] = family.context(state, settings, [], env_stats)
    say(f"[dry-run] asking the {settings.engineer} engineer for one proposal on a dummy context "
        f"({len(state['context'])} chars, task {family.name}, context {settings.context}) ...")
    out, took = _ask_once(settings, run_dir, state)
    feedback = "; ".join(out.get("feedback") or [])
    if out.get("proposal") is None:
        if feedback.startswith("the engineer call failed"):
            raise RunError(f"[dry-run] engineer {settings.engineer!r} did not answer: "
                           f"{feedback.split(': ', 1)[-1][:400]}")
        say(f"[dry-run] engineer {settings.engineer!r} answered in {took:.1f}s without a usable config: "
            f"{feedback[:300]} (a run would ask again, up to engineer_max_attempts={settings.engineer_max_attempts}, "
            "then keep the current config)")
        return
    top = settings.engineer_max_attempts
    checked = family.check(out["proposal"], config, settings, seed=stage_seed(settings.seed, 1),
                           repair=may_project(1, top))
    decision = decide(checked, 1, top)
    if checked.config is None:
        then = "a run would ask again" if decision == "retry" else "a run would keep the current config"
        say(f"[dry-run] engineer {settings.engineer!r} answered in {took:.1f}s; its config is refused by "
            f"validation: {'; '.join(checked.errors)[:300]} ({then})")
        return
    new = checked.config
    say(f"[dry-run] engineer {settings.engineer!r} answered in {took:.1f}s: a config, {decision} "
        f"({diff_summary(family.diff(config, new))})")
    if checked.notes:
        say(f"[dry-run] {decision}: {'; '.join(checked.notes)[:300]}")
    say(family.table(config, new))
    if out.get("rationale"):
        say(f"[dry-run] rationale: {str(out['rationale'])[:300]}")


def dry_run(run_dir: Path, settings: Settings, donor=None) -> None:
    from langgraph.runtime import Runtime

    from graph.graph import make_graph
    from graph.settings import RunContext
    from nodes.apply import apply

    make_graph()
    say("[dry-run] graph built")
    plan = _say_training_plan(settings, run_dir)
    if donor is not None:
        say(f"[dry-run] stage 0 would be shared from {donor.run_dir} (checkpoint {donor.checkpoint_id})")
        try:
            config = json.loads((stage_dir(donor.run_dir, 0) / "config.json").read_text())
        except (OSError, ValueError):
            config = None
    else:
        update = apply({}, Runtime(context=RunContext(settings, run_dir)))
        config = update["config"]
        say(f"[dry-run] stage-0 data generated: {update['train_path']}")
    if plan is not None and plan["gpu_mocked"] and settings.engineer in ("self", "base"):
        say(f"[dry-run] engineer {settings.engineer!r} not pinged for a proposal: it is served by the vLLM server "
            "above, on a GPU this machine lacks")
        return
    if config is None:
        say("[dry-run] no readable stage-0 config to show the engineer; not asked for a proposal")
        return
    _dry_run_proposal(settings, run_dir, config)


def _say_training_plan(settings: Settings, run_dir: Path) -> dict | None:
    """Build what stage 0 would run, up to the model load (GRPOConfig, LoRA config, the vLLM server's command
    line; trainer.gpu_plan), as on one GPU when the preset trains on one and this machine has none, and print it."""
    from trainer.gpu_plan import plan_lines, training_plan

    try:
        plan = training_plan(settings, run_dir)
    except Exception as e:  # noqa: BLE001 - a config TRL or vLLM refuses: one line, like any bad setting
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:400]
        raise RunError(f"[dry-run] the training configuration cannot be built: {type(e).__name__}: {first}") from None
    t = settings.train
    for line in plan_lines(plan, settings):
        if t.optimizer == "filtered" and line.startswith(("GRPOConfig", "steps per stage")):
            continue  # not what a filtered stage runs: its own line below
        say(f"[dry-run] {line}")
    if t.optimizer == "filtered":
        say(f"[dry-run] stage optimizer: reward-filtered fine-tuning (trainer/filtered.py): rounds of "
            f"{t.filtered_prompts} prompts x {t.num_generations} samples at temperature {t.temperature}, "
            + (f"until {t.stage_samples} answers are sampled, steps" if t.stage_samples else f"{t.max_steps} steps")
            + f" on full batches of {t.sft_batch_size} verified answers at lr {t.learning_rate}")
    return plan

