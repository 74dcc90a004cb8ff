"""A GRPO stage (TRL's `GRPOTrainer` with the project's dynamic sampling, `trainer.grpo_trainer`) on a prepared stage.

`trainer.stage.run_stage` prepares the stage (`trainer.prepare.prepare_stage`: checks, warm start, model load) and
calls `train_grpo` for `cfg.optimizer == "grpo"`; `trainer.filtered.train_filtered` sits beside it for reward-filtered
fine-tuning. Every knob of the trainer is a field of its config (`trainer.trl_setup.grpo_config`, a
`trainer.grpo_config.DynamicSamplingGRPOConfig`). The files written are `trainer.stage`'s module docstring's.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import statistics
import time

from llm_backends.checkpoints import save_checkpoint
from llm_backends.policy import template_kwargs
from trainer.data import build_dataset
from trainer.prepare import StagePrep
from trainer.task import TaskReward, reward_summary
from trainer.trl_setup import (
    grpo_config,
    quiet_trainer,
    raise_if_stopped,
    stop_callbacks,
    tb_callback,
    tb_scalars,
    use_autocast,
)

log = logging.getLogger(__name__)


def train_grpo(prep: StagePrep) -> dict:
    """Train the prepared stage with GRPO; write `checkpoint/`, `metrics.json`, `tb/`. Returns
    {"checkpoint", "reward_state", "metrics"}. A stop request ends it at a step boundary, saved as an in-stage
    checkpoint, and raises `StageInterrupted`; a resumed stage continues from `prep.resume`."""
    import torch

    from trainer import resume as stage_resume
    from trainer.grpo_trainer import make_trainer_class, sampling_metrics

    cfg, task, out_dir, metrics, resume = prep.cfg, prep.task, prep.out_dir, prep.metrics, prep.resume
    dataset, dropped = build_dataset(prep.items, prep.tok, cfg.max_prompt_length, cfg.prompt_style,
                                     template_kwargs(cfg.enable_thinking), task=task)
    if len(dataset) == 0:
        raise ValueError(f"all {len(prep.items)} prompts of {prep.train_path} are longer than "
                         f"max_prompt_length={cfg.max_prompt_length}")
    # the task's own reward (MAPF: the paper's, with adaptive length weights), else its verdicts' scores
    reward = (task.reward(prep.tok, prep.reward_state, cfg) if hasattr(task, "reward")
              else TaskReward(task, cfg.prompt_style, cfg.partial_credit))
    if resume is not None:
        stage_resume.restore_reward(reward, resume[1])
        metrics["train/resumed_from_step"] = int(resume[1]["global_step"])
        if prep.progress:
            log.info("resuming %s from its in-stage checkpoint %s (step %d)", out_dir.name, resume[0],
                     resume[1]["global_step"])
    args = grpo_config(cfg, out_dir, prep.seed, progress=prep.progress)
    args.group_key = "level"  # build_dataset's column: replacements lean to the levels where the policy is sometimes right
    main = args.process_index == 0  # = trainer.is_world_process_zero(); only it writes files
    trainer = make_trainer_class(bool(args.use_vllm))(
        model=prep.model,
        reward_funcs=[reward],
        args=args,
        train_dataset=dataset,
        processing_class=prep.tok,
        # a stop saves the step it waited for (an in-stage checkpoint, completed by the resume callback, which is
        # there whatever save_steps says), so a resume continues after it instead of training it again
        callbacks=[tb_callback(out_dir / "tb", main=main), *stop_callbacks(save=True),
                   stage_resume.resume_callback(reward, prep.key, main)],
    )
    prep.model = None  # the trainer holds it now
    quiet_trainer(trainer, prep.progress, label=f"GRPO {out_dir.name}")
    t0 = time.perf_counter()
    result = trainer.train(resume_from_checkpoint=str(resume[0]) if resume is not None else None)
    grpo_s = time.perf_counter() - t0
    raise_if_stopped(f"GRPO of {out_dir.name}", trainer)
    steps = int(trainer.state.global_step)
    metrics.update(sampling_metrics(trainer.stats))
    metrics["train/shared_prompt_batches"] = trainer.shared_prompt_batches
    meta = {
        "reward_state": reward.state.model_dump(mode="json") if reward.state is not None else None,
        "task": task.name,
        "base_model": prep.base_model,
        "is_lora": prep.is_lora,
        "init_checkpoint": prep.meta["init_checkpoint"],
        "train_path": str(prep.train_path),
        "seed": prep.seed,
        "grpo_steps": steps,
        "sft_warm_start": prep.meta["sft_warm_start"],
        "warm_start_cache": prep.meta["warm_start_cache"],
        "prompt_style": cfg.prompt_style,
        "rollout_dtype": trainer.rollout_dtype or "model",  # what sampled the completions on this machine
        "rollout_prepack": bool(trainer.rollout is not None and trainer.rollout.packed),  # linears on packed weights
        "trl_cpu_patches": os.environ.get("ENV_ENGINEER_TRL_PATCH", "1") != "0",  # trainer.trl_cpu: head, tiles
        "autocast_bf16": use_autocast(cfg),
        "train_config": cfg.model_dump(mode="json"),
    }
    ckpt = save_checkpoint(trainer, out_dir / "checkpoint", meta)
    if main:
        shutil.rmtree(out_dir / "trl", ignore_errors=True)  # TRL's output_dir: nothing we keep
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    trl_zero = [h["frac_reward_zero_std"] for h in trainer.state.log_history if "frac_reward_zero_std" in h]
    metrics.update(reward_summary(reward.history))
    wall = time.perf_counter() - prep.started
    loop_s = prep.loop_s + grpo_s
    metrics.update({
        "train/steps": steps,
        "train/instances": len(dataset),
        "train/prompts_dropped": dropped,
        "train/loss": statistics.fmean(losses) if losses else float(result.training_loss),
        "train/frac_reward_zero_std_trl": statistics.fmean(trl_zero) if trl_zero else None,
        **({"train/w_acc": reward.state.weights()[0], "train/w_len": reward.state.weights()[1]}
           if reward.state is not None else {}),
        "train/grpo_seconds": grpo_s,
        "train/seconds_per_step": grpo_s / steps if steps else None,
        "train/seconds": wall,
        "train/outside_loop_seconds": wall - loop_s,
        "train/outside_loop_share": (wall - loop_s) / wall,
        "train/is_lora": prep.is_lora,
        "train/device": "cuda" if torch.cuda.is_available() else "cpu",
    })
    if main:
        from trainer.files import write_text_atomic

        write_text_atomic(out_dir / "metrics.json", json.dumps(metrics, indent=2, default=str) + "\n")
        tb_scalars(out_dir / "tb", metrics)
    if prep.progress and main:
        log.info("stage trained: %d steps, %.1f s/step, reward %.3f, valid %.2f, zero-std groups %.2f -> %s", steps,
                 metrics["train/seconds_per_step"] or 0.0, metrics["train/reward_mean"],
                 metrics.get("train/valid_rate", float("nan")), metrics.get("train/zero_std_groups", float("nan")),
                 ckpt)
    del trainer
    return {"checkpoint": str(ckpt), "reward_state": meta["reward_state"], "metrics": metrics}
