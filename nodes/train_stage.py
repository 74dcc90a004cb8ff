"""The `train_stage` node: one stage of GRPO on the stage's training set, in a child process of its own.

The training itself is `trainer.stage.run_stage` (the trainer package); this node only picks where it starts
from (stage 0: the base policy model, later stages: the previous checkpoint), runs it in a child process
(`trainer.child`: GPU memory, TRL's RANK/WORLD_SIZE/MASTER_* variables and vLLM's process groups end with it)
and turns its metrics into the lines the run prints.
"""

from __future__ import annotations

import math
from pathlib import Path

from families import DEFAULT_TASK
from llm_backends.checkpoints import CheckpointError
from llm_backends.models import resolve_model
from trainer.child import run_stage_in_child
from trainer.files import stage_dir


def train_stage(state: dict, runtime) -> dict:
    """Graph node: GRPO on `state["train_path"]` from `state["checkpoint"]` (stage 0 only: None = the base
    policy model; a later stage without a checkpoint raises `CheckpointError`, never restarts from the base).

    Returns {"checkpoint", "reward_state", "train_metrics"}. Stage folder: `trainer.files.stage_dir(run_dir, k)`.
    """
    settings = runtime.context.settings
    stage = int(state["stage"])
    out_dir = stage_dir(runtime.context.run_dir, stage)
    prev = state.get("checkpoint")
    if not prev and stage > 0:
        raise CheckpointError(
            f"stage {stage}: the state holds no checkpoint (checkpoint={prev!r}), so stage {stage - 1}'s training "
            "is lost; only stage 0 starts from the base model. Resume the run from a state saved after stage "
            f"{stage - 1} trained, or start a new run"
        )
    init = Path(prev) if prev else resolve_model(settings.policy_model)
    
    # in a child process of its own (trainer.child): GPU memory, TRL's RANK/WORLD_SIZE/MASTER_* variables
    # and vLLM's process groups end with it, so no stage inherits them from the one before
    result = run_stage_in_child(
        label=f"stage {stage} training",
        train_path=Path(state["train_path"]),
        init_checkpoint=init,
        out_dir=out_dir,
        cfg=settings.train,
        seed=int(settings.seed) + 1000 * stage,
        reward_state=state.get("reward_state") or None,
        warm_start=settings.train.sft_warm_start and prev is None,
        task=getattr(settings, "task", DEFAULT_TASK),  # a test's stand-in settings may have no task
    )
    m = result["metrics"]
    line = (
        f"stage {stage}: trained {m['train/steps']} {'filtered fine-tuning' if m.get('train/optimizer') == 'filtered' else 'GRPO'} steps in {m['train/seconds']:.0f} s, "
        f"reward {m['train/reward_mean']:.3f} -> {result['checkpoint']}"
    )
    lines = [line]
    if m.get("train/optimizer") == "filtered":  # what its samples gave: a stage that kept nothing took no step
        lines[0] += f" (kept {m.get('train/kept', 0)} of {m.get('train/completions', 0)} sampled answers)"
        if not m.get("train/kept"):
            lines.append(f"stage {stage}: kept 0: no sampled answer verified, no step taken; the checkpoint holds "
                         "the stage's starting weights, unchanged")
    dead = m.get("train/zero_std_groups_trained")
    if dead is None or not math.isfinite(dead):
        dead = m.get("train/zero_std_groups")
    if isinstance(dead, float) and dead >= 1.0:
        lines.append(
            f"stage {stage}: WARNING every GRPO group scored the same (zero reward variance): no weight moved. "
            "The stage's maps may all be out of the policy's reach; see stage metrics and report.md"
        )
    return {
        "checkpoint": result["checkpoint"],
        "reward_state": result["reward_state"],
        "train_metrics": m,
        "log": lines,
    }
