"""What every stage does before its optimiser runs (`prepare_stage`), whichever optimiser it is.

`trainer.stage.run_stage` calls it, then hands the `StagePrep` to one of the two stage optimisers, side by side:
GRPO (`trainer.grpo_stage.train_grpo`) or reward-filtered fine-tuning (`trainer.filtered.train_filtered`). Both
write the same files (`checkpoint/` with `trainer_meta.json`, `metrics.json`) from it.

The preparation: check the training set and the starting checkpoint before any work, seed everything, read the
stage's items, find a half-trained attempt of this very stage (`trainer.resume`), run the SFT warm start (the cached
one on the task's own levels, `trainer.sft.build_warm_start`, or one on the stage's own items) and load the weights
the stage trains (`trainer.trl_setup.trainable_model`).
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.config import TrainConfig
from trainer.task import Task, load_task

log = logging.getLogger(__name__)


@dataclass
class StagePrep:
    """A prepared stage: what the optimiser trains, from where, and what the preparation already recorded."""

    train_path: Path
    init: Path  # the checkpoint the stage was asked to start from (a previous stage's, or the base model)
    out_dir: Path
    cfg: TrainConfig
    seed: int
    task: Task
    items: list  # the stage's training items
    model: Any  # the weights the stage trains (after the warm start, or the in-stage checkpoint's base)
    tok: Any
    base_model: str
    is_lora: bool
    reward_state: dict | None  # the reward's running state to continue from (MAPF's adaptive length weights)
    key: str  # the stage's identity for in-stage checkpoints (`trainer.resume.stage_key`)
    resume: tuple[Path, dict] | None  # the in-stage checkpoint to continue from, and its marker
    progress: bool
    started: float  # perf_counter when the stage began
    loop_s: float = 0.0  # seconds spent inside the trainers' own loops so far (the warm start)
    metrics: dict = field(default_factory=dict)  # `sft/...` figures so far
    meta: dict = field(default_factory=dict)  # what trainer_meta.json records of the preparation


def prepare_stage(*, train_path: Path, init_checkpoint: Path | str, out_dir: Path, cfg: TrainConfig, seed: int,
                  reward_state: dict | None, task: str | Task, progress: bool,
                  warm_start: bool | None) -> StagePrep:
    """The shared preparation of `trainer.stage.run_stage` (see the module docstring; the arguments are its own)."""
    from llm_backends.checkpoints import check_checkpoint
    from trainer import resume as stage_resume
    from trainer.trl_setup import check_generation_backend, main_process, trainable_model

    started = time.perf_counter()
    check_generation_backend(cfg)  # before any work: a CPU machine cannot run TRL's vLLM path
    out_dir, train_path, init = Path(out_dir), Path(train_path), Path(init_checkpoint)
    out_dir.mkdir(parents=True, exist_ok=True)
    if not train_path.exists():
        raise FileNotFoundError(f"training set {train_path} does not exist (the apply node writes it)")
    meta_in = check_checkpoint(init)  # raises CheckpointError before any work
    if reward_state is None and meta_in is not None:
        reward_state = meta_in.get("reward_state")
    from transformers import set_seed

    set_seed(seed)
    if not progress:
        logging.getLogger("transformers").setLevel(logging.WARNING)
    task = load_task(task)
    items = [task.item_from_json(line) for line in train_path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not items:
        raise ValueError(f"training set {train_path} holds no items")
    from trainer.trl_cpu import score_labelled_positions_only, tile_head_on_cpu

    score_labelled_positions_only()  # TRL's fused LM head: only answer positions on CPU too (trainer.trl_cpu)
    tile_head_on_cpu()  # and in tiles that stay in cache on CPU
    if cfg.use_vllm:  # LoRA syncs into vLLM merge into copies: the bf16 base never drifts (trainer.lora_sync)
        from trainer.lora_sync import install_exact_lora_sync

        install_exact_lora_sync()
    do_sft = warm_start if warm_start is not None else (cfg.sft_warm_start and meta_in is None)
    key = stage_resume.stage_key(train_path=train_path, init_checkpoint=init, seed=seed, cfg=cfg)
    resume = stage_resume.find_resume(out_dir / "trl", key)  # a half-trained attempt of this very stage
    metrics: dict[str, Any] = {}
    load_from, warm_info, loop_s = init, None, 0.0
    if do_sft and cfg.sft_sizes:
        # the cached warm start (trainer.sft.build_warm_start): built once per (model, warm-start settings, seed)
        from trainer.sft import build_warm_start, warm_start_levels

        t0 = time.perf_counter()
        ws = build_warm_start(init, cfg, seed, warm_start_levels(task, cfg), progress=progress, task=task)
        loop_s += ws["metrics"].get("sft/seconds", 0.0) if not ws["hit"] else 0.0
        warm_info = {"key": ws["key"], "path": ws["path"], "hit": ws["hit"], "built": ws["built"],
                     "weights": ws["weights"]}
        metrics.update(ws["metrics"])
        metrics.update({"sft/cache_key": ws["key"], "sft/cache_path": ws["path"], "sft/cache_hit": ws["hit"],
                        "sft/cache_seconds": time.perf_counter() - t0})
        load_from = Path(ws["path"])
        if main_process() and (load_from / "tb" / "sft").is_dir():  # the warm start's curves, beside the stage's
            shutil.copytree(load_from / "tb" / "sft", out_dir / "tb" / "sft", dirs_exist_ok=True)
    base_model = str((meta_in or {}).get("base_model") or init.resolve())
    named = bool((meta_in or {}).get("base_model"))
    model, tok, base_model, is_lora = trainable_model(load_from, cfg, base_model, named=named)
    if do_sft and not cfg.sft_sizes and resume is None:  # on the stage's own items: not cached (they vary per
        # run); a resumed stage skips it: the in-stage checkpoint holds the weights trained after it
        from trainer.sft import warm_start as sft_warm_start

        sft = sft_warm_start(model, tok, items, cfg=cfg, out_dir=out_dir, seed=seed, progress=progress, task=task)
        loop_s += sft["seconds"]
        metrics.update({f"sft/{k}": v for k, v in sft.items()})
    return StagePrep(train_path=train_path, init=init, out_dir=out_dir, cfg=cfg, seed=seed, task=task, items=items,
                     model=model, tok=tok, base_model=base_model, is_lora=is_lora, reward_state=reward_state, key=key,
                     resume=resume, progress=progress, started=started, loop_s=loop_s, metrics=metrics,
                     meta={"init_checkpoint": str(init), "sft_warm_start": bool(do_sft),
                           "warm_start_cache": warm_info})
