"""One GRPO stage (TRL `GRPOTrainer`) on a stage's instances, from its SFT warm start or the previous checkpoint.

One stage continues the policy from the previous stage's checkpoint (or from the base policy model at
stage 0), optionally after an SFT warm start on solver-optimal plans (`trainer.sft`, first stage only: a
135M model almost never writes a valid plan by itself, so every GRPO group would score zero). The reward
is the testbed's (`env.verify` + `env.total_reward`: the paper's validity gate, gap shaping and adaptive
length weights). The adaptive weights' running state (`env.RewardState`) is updated per batch, saved in
the checkpoint's `trainer_meta.json` and restored by the next stage.

Outputs in the stage folder (`run_dir/stage_<k>/`):
- `checkpoint/`: the full model (safetensors + tokenizer) or, with `lora=True`, the peft adapter (+ tokenizer),
  and `trainer_meta.json` {reward_state, base_model, is_lora, stage facts}. Written to a temporary folder and
  renamed into place, so a crash never leaves a half checkpoint that looks complete.
- `metrics.json`: `train/...` figures (reward mean/std, `train/zero_std_groups` = share of GRPO groups whose
  completions all got the same reward, i.e. no learning signal; valid rate of sampled completions; steps;
  seconds; seconds per step; `train/outside_loop_share` = share of the stage's wall time spent outside TRL's
  own training loops).
- `tb/`: TensorBoard logs: TRL's per-step scalars under `train/...` (`train/reward`, `train/reward_std`,
  `train/loss`, `train/frac_reward_zero_std`, ...) plus ours (`train/valid_rate`, `train/optimal_rate`,
  `train/zero_std_groups`, `train/w_acc`, `train/w_len`, `train/completion_tokens`), and one point per stage
  for every number in `metrics.json` under `stage/<name>` (`stage/train/reward_mean`, `stage/sft/loss`, ...).
  The SFT warm start logs transformers' own names (`train/loss`, `train/learning_rate`, ...) to the
  separate TensorBoard run `tb/sft/`, so its curves never mix with GRPO's.
  With several processes (accelerate), only the main process writes the checkpoint, `metrics.json` and `tb/`;
  the reward statistics in `metrics.json` are then the main process's share of the completions.

The pieces, each in its own module: settings and presets (`trainer.config`), prompts, datasets and the
reward (`trainer.data`), TRL set-up (`trainer.trl_setup`), checkpoints (`llm_backends.checkpoints`). Here: the
stage, then the module CLI.

The graph's `train_stage` node (`nodes.train_stage`) runs `run_stage` in a child process of its own (`trainer.child`; several GPUs:
`STAGE_LAUNCHER`), so that GPU memory, TRL's RANK/WORLD_SIZE/MASTER_* variables and vLLM's process groups end
with the stage. `save_steps > 0` saves a resumable checkpoint every N steps and a restarted stage continues from
it (`trainer.resume`). With vLLM generation, LoRA weight syncs merge into copies, never into the bf16 base
(`trainer.lora_sync`). `enable_thinking` is the chat template's thinking switch, the same in TRL, prompt counting
and every vLLM request (paper: off).

Multi-GPU / multi-node goes through TRL's own engine (`accelerate`), with the module CLI and the configs in
`configs/accelerate/` (copies of TRL's `trl/accelerate_configs/`, documented there):
    accelerate launch --config_file configs/accelerate/multi_gpu.yaml -m trainer.stage --preset paper \
        --train-path runs/R/stage_0/train.jsonl --init Qwen/Qwen3-4B --out runs/R/stage_0
    # full fine-tunes too big for one GPU's memory: configs/accelerate/deepspeed_zero2.yaml (pip install deepspeed)
    # fewer GPUs: add --num_processes N (overrides the config's 8)
    # multi-node: add --num_machines N --machine_rank i --main_process_ip HOST --main_process_port 29500
    # generation in a separate vLLM server: `CUDA_VISIBLE_DEVICES=7 trl vllm-serve --model Qwen/Qwen3-4B`
    # then --num_processes 7 and TRAIN__VLLM_MODE=server (every TrainConfig field reads TRAIN__<NAME>).
    # later stages: --init runs/R/stage_<k-1>/checkpoint (a missing folder is an error, never the base model)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from llm_backends.checkpoints import CheckpointError, check_checkpoint, save_checkpoint
from llm_backends.policy import template_kwargs
from trainer.config import TRAIN_PRESETS, TrainConfig
from trainer.data import build_dataset, row_level
from trainer.task import Task, TaskReward, load_task, reward_summary
from trainer.trl_setup import (
    check_generation_backend,
    grpo_config,
    main_process,
    quiet_trainer,
    raise_if_stopped,
    rollout_dtype,
    rollout_prepack,
    stop_callbacks,
    tb_callback,
    tb_scalars,
    trainable_model,
    use_autocast,
)

log = logging.getLogger(__name__)


def run_stage(
    *,
    train_path: Path,
    init_checkpoint: Path | str,
    out_dir: Path,
    cfg: TrainConfig,
    seed: int,
    reward_state: dict | None,
    progress: bool = True,
    warm_start: bool | None = None,
    task: str | Task = "mapf",
) -> dict:
    """Train one stage and write `out_dir/checkpoint/`, `out_dir/metrics.json`, `out_dir/tb/`.

    Args:
        train_path: the stage's items (`.jsonl`, one `task.item_to_json` a line; MAPF: one `env.Instance`).
        init_checkpoint: a local folder: the previous stage's checkpoint, or the base model's folder
            (`llm_backends.models.resolve_model(...)`) for the first stage. A missing or corrupt folder raises
            `CheckpointError`.
        out_dir: the stage folder.
        cfg: hyper-parameters.
        seed: seed of sampling, shuffling and initialisation.
        reward_state: the task reward's running state to continue from (MAPF: an `env.RewardState` dump); None:
            the checkpoint's saved state, else fresh.
        progress: log progress lines (INFO) while training.
        warm_start: run the SFT warm start; None: when `cfg.sft_warm_start` and `init_checkpoint` is a
            base model (not a checkpoint of this module), i.e. at the first stage.
        task: the task family (`trainer.task.load_task`): a name or a `Task` object.

    Returns:
        {"checkpoint": str, "reward_state": dict | None, "metrics": dict}
    """
    t_start = time.perf_counter()
    loop_s = 0.0
    check_generation_backend(cfg)  # before any work: a CPU machine cannot run TRL's vLLM path
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    train_path = Path(train_path)
    if not train_path.exists():
        raise FileNotFoundError(f"training set {train_path} does not exist (the apply node writes it)")
    init = Path(init_checkpoint)
    meta_in = check_checkpoint(init)  # raises CheckpointError before any work
    if reward_state is None and meta_in is not None:
        reward_state = meta_in.get("reward_state")
    base_model = str((meta_in or {}).get("base_model") or init.resolve())
    import torch
    from transformers import set_seed

    set_seed(seed)
    if not progress:
        logging.getLogger("transformers").setLevel(logging.WARNING)
    from trainer.trl_cpu import score_labelled_positions_only, tile_head_on_cpu

    task = load_task(task)
    instances = [task.item_from_json(line) for line in train_path.read_text(encoding="utf-8").splitlines()
                 if line.strip()]
    if not instances:
        raise ValueError(f"training set {train_path} holds no items")
    score_labelled_positions_only()  # TRL's fused LM head: only answer positions on CPU too (trainer.trl_cpu)
    tile_head_on_cpu()  # and in tiles that stay in cache on CPU
    if cfg.use_vllm:  # LoRA syncs into vLLM merge into copies: the bf16 base never drifts (trainer.lora_sync)
        from trainer.lora_sync import install_exact_lora_sync

        install_exact_lora_sync()
    metrics: dict[str, Any] = {}
    do_sft = warm_start if warm_start is not None else (cfg.sft_warm_start and meta_in is None)
    from trainer import resume as stage_resume

    key = stage_resume.stage_key(train_path=train_path, init_checkpoint=init, seed=seed, cfg=cfg)
    resume = stage_resume.find_resume(out_dir / "trl", key)  # a half-trained attempt of this very stage
    load_from, warm_info = init, None
    if do_sft and cfg.sft_sizes:
        # the cached warm start (trainer.sft.build_warm_start): built once per (model, warm-start settings, seed)
        from trainer.sft import build_warm_start

        t0 = time.perf_counter()
        ws = build_warm_start(init, cfg, seed, progress=progress, task=task)
        loop_s += ws["metrics"].get("sft/seconds", 0.0) if not ws["hit"] else 0.0
        warm_info = {"key": ws["key"], "path": ws["path"], "hit": ws["hit"], "built": ws["built"],
                     "weights": ws["weights"]}
        metrics.update(ws["metrics"])
        metrics.update({"sft/cache_key": ws["key"], "sft/cache_path": ws["path"], "sft/cache_hit": ws["hit"],
                        "sft/cache_seconds": time.perf_counter() - t0})
        load_from = Path(ws["path"])
        if main_process() and (load_from / "tb" / "sft").is_dir():  # the warm start's curves, beside GRPO's
            shutil.copytree(load_from / "tb" / "sft", out_dir / "tb" / "sft", dirs_exist_ok=True)
    if cfg.optimizer == "filtered":  # reward-filtered fine-tuning instead of GRPO (trainer/filtered.py)
        from trainer.filtered import run_filtered_stage

        return run_filtered_stage(train_path=train_path, init_checkpoint=load_from, out_dir=out_dir, cfg=cfg,
                                  seed=seed, task=task, progress=progress, metrics=metrics,
                                  meta={"base_model": base_model, "init_checkpoint": str(init),
                                        "sft_warm_start": bool(do_sft), "warm_start_cache": warm_info},
                                  started=t_start)
    named = bool((meta_in or {}).get("base_model"))
    model, tok, base_model, is_lora = trainable_model(load_from, cfg, base_model, named=named)

    if do_sft and not cfg.sft_sizes and resume is None:  # on the stage's own instances: not cached (they vary
        # per run); a resumed stage skips it: the in-stage checkpoint holds the weights trained after it
        from trainer.sft import warm_start as sft_warm_start

        sft = sft_warm_start(model, tok, instances, cfg=cfg, out_dir=out_dir, seed=seed, progress=progress,
                             task=task)
        loop_s += sft["seconds"]
        metrics.update({f"sft/{k}": v for k, v in sft.items()})

    dataset, dropped = build_dataset(instances, tok, cfg.max_prompt_length, cfg.prompt_style,
                                     template_kwargs(cfg.enable_thinking), task=task)
    if len(dataset) == 0:
        raise ValueError(
            f"all {len(instances)} prompts of {train_path} are longer than max_prompt_length={cfg.max_prompt_length}"
        )
    # the task's own reward (MAPF: the paper's, with adaptive length weights), else its verdicts' validity
    reward = (task.reward(tok, reward_state, cfg) if hasattr(task, "reward")
              else TaskReward(task, cfg.prompt_style, cfg.partial_credit))
    if resume is not None:
        stage_resume.restore_reward(reward, resume[1])
        metrics["train/resumed_from_step"] = int(resume[1]["global_step"])
        if progress:
            log.info("resuming %s from its in-stage checkpoint %s (step %d)", out_dir.name, resume[0],
                     resume[1]["global_step"])
    args = grpo_config(cfg, out_dir, seed, progress=progress)
    main = args.process_index == 0  # = trainer.is_world_process_zero(); only it writes files
    from trainer.grpo_trainer import make_trainer_class, sampling_metrics

    sampler_dtype = rollout_dtype(cfg, model)  # resolved here ("auto" -> this machine's choice) and recorded
    trainer = make_trainer_class()(
        model=model,
        reward_funcs=[reward],
        args=args,
        train_dataset=dataset,
        processing_class=tok,
        # a stop saves the step it waited for (an in-stage checkpoint, completed by the resume callback, which is
        # there whatever save_steps says), so a resume continues after it instead of training it again
        callbacks=[tb_callback(out_dir / "tb", main=main), *stop_callbacks(save=True),
                   stage_resume.resume_callback(reward, key, main)],
        resample_rounds=cfg.resample_rounds,
        resample_seed=seed,
        group_key=row_level,  # replacements lean to the levels where the policy is sometimes right
        rollout_dtype=sampler_dtype,
        rollout_prepack=rollout_prepack(cfg, sampler_dtype),
        share_prompt=cfg.share_prompt,
    )
    quiet_trainer(trainer, progress, label=f"GRPO {out_dir.name}")
    t0 = time.perf_counter()
    result = trainer.train(resume_from_checkpoint=str(resume[0]) if resume is not None else None)
    grpo_s = time.perf_counter() - t0
    loop_s += grpo_s
    raise_if_stopped(f"GRPO of {out_dir.name}", trainer)
    steps = int(trainer.state.global_step)
    metrics.update(sampling_metrics(trainer.stats))
    metrics["train/shared_prompt_batches"] = trainer.shared_prompt_batches

    meta = {
        "reward_state": reward.state.model_dump(mode="json") if reward.state is not None else None,
        "task": task.name,
        "base_model": base_model,
        "is_lora": is_lora,
        "init_checkpoint": str(init),
        "train_path": str(train_path),
        "seed": seed,
        "grpo_steps": steps,
        "sft_warm_start": bool(do_sft),
        "warm_start_cache": warm_info,
        "prompt_style": cfg.prompt_style,
        "rollout_dtype": sampler_dtype or "model",  # what sampled the completions on this machine
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
    wall = time.perf_counter() - t_start
    metrics.update(
        {
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
            "train/is_lora": is_lora,
            "train/device": "cuda" if torch.cuda.is_available() else "cpu",
        }
    )
    if main:
        from trainer.files import write_text_atomic

        write_text_atomic(out_dir / "metrics.json", json.dumps(metrics, indent=2, default=str) + "\n")
        tb_scalars(out_dir / "tb", metrics)
    if progress and main:
        log.info(
            "stage trained: %d steps, %.1f s/step, reward %.3f, valid %.2f, zero-std groups %.2f -> %s",
            steps,
            metrics["train/seconds_per_step"] or 0.0,
            metrics["train/reward_mean"],
            metrics.get("train/valid_rate", float("nan")),
            metrics.get("train/zero_std_groups", float("nan")),
            ckpt,
        )
    del trainer, model
    return {"checkpoint": str(ckpt), "reward_state": meta["reward_state"], "metrics": metrics}


def init_from_arg(text: str) -> Path:
    """The folder named by `--init`: an existing folder, else a model name for `llm_backends.models.resolve_model`.

    Text that looks like a local path (absolute, `./`, `~`, two or more `/`, or `a/b` where `a` is a local
    folder, e.g. `runs/x/stage_0/checkpoint`) but does not exist raises `CheckpointError`, rather than going
    to the Hugging Face hub as an `org/name` id would.
    """
    path = Path(text).expanduser()
    if path.exists():
        return path
    head = text.split("/", 1)[0]
    looks_local = (
        text.startswith((".", "/", "~"))
        or text.count("/") >= 2
        or (os.sep != "/" and os.sep in text)
        or ("/" in text and Path(head).expanduser().is_dir())
    )
    if looks_local:
        raise CheckpointError(
            f"--init {text}: no such checkpoint folder ({path.resolve()}); pass the previous stage's "
            "checkpoint folder (runs/<run>/stage_<k>/checkpoint), a base model folder, or a model name"
        )
    from llm_backends.models import resolve_model

    return resolve_model(text)


def main(argv: list[str] | None = None) -> None:
    """CLI for one stage, e.g. under `accelerate launch -m trainer.stage ...` on GPUs."""
    p = argparse.ArgumentParser(description="Train one GRPO stage on a MAPF-FrozenLake .jsonl")
    p.add_argument("--train-path", required=True, type=Path)
    p.add_argument("--init", required=True, help="previous checkpoint folder or base model name/path")
    p.add_argument("--out", required=True, type=Path, help="stage folder")
    p.add_argument("--preset", default="cpu", choices=sorted(TRAIN_PRESETS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warm-start", choices=["auto", "yes", "no"], default="auto")
    a = p.parse_args(argv)
    raw = dict(TRAIN_PRESETS[a.preset])
    for var, value in os.environ.items():
        if var.startswith("TRAIN__") and value:
            raw[var[7:].lower()] = value
    cfg = TrainConfig.model_validate(raw)
    try:
        check_generation_backend(cfg)
        init = init_from_arg(a.init)
    except (ValueError, CheckpointError) as e:
        p.error(str(e))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("trainer.log").setLevel(logging.WARNING)  # trainer log dicts: not beside the bar
    ws = {"auto": None, "yes": True, "no": False}[a.warm_start]
    res = run_stage(
        train_path=a.train_path,
        init_checkpoint=init,
        out_dir=a.out,
        cfg=cfg,
        seed=a.seed,
        reward_state=None,
        warm_start=ws,
    )
    print(json.dumps({"checkpoint": res["checkpoint"], **res["metrics"]}, indent=2, default=str))


if __name__ == "__main__":
    main()
