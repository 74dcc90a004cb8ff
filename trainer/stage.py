"""One training stage on a stage's items, from its SFT warm start or the previous checkpoint: GRPO (TRL's
`GRPOTrainer`, `trainer.grpo_stage`) or reward-filtered fine-tuning (`trainer.filtered`), picked by `cfg.optimizer`.

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
reward (`trainer.data`), the preparation both optimisers share (`trainer.prepare`), the two optimisers side by side
(`trainer.grpo_stage`, `trainer.filtered`), TRL set-up (`trainer.trl_setup`), the GRPO trainer and its config
(`trainer.grpo_trainer`, `trainer.grpo_config`), checkpoints (`llm_backends.checkpoints`). Here: the stage, then the
module CLI.

The graph's `train_stage` node (`nodes.train_stage`) runs `run_stage` in a child process of its own (`trainer.child`; several GPUs:
`STAGE_LAUNCHER`), so that GPU memory, TRL's RANK/WORLD_SIZE/MASTER_* variables and vLLM's process groups end
with the stage. `save_steps > 0` saves a resumable checkpoint every N steps and a restarted stage continues from
it (`trainer.resume`). With vLLM generation, LoRA weight syncs merge into copies, never into the bf16 base
(`trainer.lora_sync`). `enable_thinking` is the chat template's thinking switch, the same in TRL, prompt counting
and every vLLM request (paper: off).

Multi-GPU / multi-node goes through TRL's own engine (`accelerate`), with the module CLI and the configs in
`configs/accelerate/` (copies of TRL's `trl/accelerate_configs/`, documented there):
    accelerate launch --config_file configs/accelerate/multi_gpu.yaml -m trainer.stage --preset paper \
        --task mapf --train-path runs/R/stage_0/train.jsonl --init Qwen/Qwen3-4B --out runs/R/stage_0
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
from pathlib import Path

from llm_backends.checkpoints import CheckpointError
from trainer.config import TRAIN_PRESETS, TrainConfig
from trainer.task import Task

log = logging.getLogger(__name__)


def run_stage(
    *,
    train_path: Path,
    init_checkpoint: Path | str,
    out_dir: Path,
    cfg: TrainConfig,
    seed: int,
    reward_state: dict | None,
    task: str | Task,
    progress: bool = True,
    warm_start: bool | None = None,
) -> dict:
    """Train one stage and write `out_dir/checkpoint/`, `out_dir/metrics.json`, `out_dir/tb/`.

    The stage's optimiser is picked first: GRPO (`trainer.grpo_stage.train_grpo`) or reward-filtered fine-tuning
    (`trainer.filtered.train_filtered`, `cfg.optimizer == "filtered"`). Both start from the same preparation
    (`trainer.prepare.prepare_stage`: checks, the SFT warm start, the weights to train) and write the same files.

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
        task: the task family (`trainer.task.load_task`): a name or a `Task` object.
        progress: log progress lines (INFO) while training.
        warm_start: run the SFT warm start; None: when `cfg.sft_warm_start` and `init_checkpoint` is a
            base model (not a checkpoint of this module), i.e. at the first stage.

    Returns:
        {"checkpoint": str, "reward_state": dict | None, "metrics": dict}
    """
    if cfg.optimizer == "filtered":  # reward-filtered fine-tuning (trainer/filtered.py)
        from trainer.filtered import train_filtered as train
    else:  # GRPO (trainer/grpo_stage.py)
        from trainer.grpo_stage import train_grpo as train
    from trainer.prepare import prepare_stage

    prep = prepare_stage(train_path=train_path, init_checkpoint=init_checkpoint, out_dir=out_dir, cfg=cfg, seed=seed,
                         reward_state=reward_state, task=task, progress=progress, warm_start=warm_start)
    return train(prep)


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
    p = argparse.ArgumentParser(description="Train one stage (GRPO, or the preset's optimizer) on a task's .jsonl")
    p.add_argument("--task", required=True,
                   help="the task of the items: a built-in name, rg:<dataset>, or package.module:Attribute")
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
    from trainer.trl_setup import check_generation_backend

    try:
        check_generation_backend(cfg)
        init = init_from_arg(a.init)
        from trainer.task import load_task

        task = load_task(a.task)
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
        task=task,
    )
    print(json.dumps({"checkpoint": res["checkpoint"], **res["metrics"]}, indent=2, default=str))


if __name__ == "__main__":
    main()
