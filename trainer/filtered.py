"""Reward-filtered fine-tuning: a stage optimizer for small CPU runs (`TrainConfig.optimizer = "filtered"`).

Expert iteration (RAFT, ReST): in rounds of `filtered_prompts` prompts, the policy samples `num_generations`
answers to each at `temperature`; the task verifies them; the policy is then fine-tuned (cross-entropy on the
answer tokens only, AdamW at `learning_rate`, full batches of `sft_batch_size`, the rest kept for the next round)
on the verified ones, one copy of each distinct valid answer. It is RL from the same verified reward as GRPO, but needs no reward variance inside a
group: on a 135M policy at temperature 1 most GRPO groups score all 0 or all 1 and move nothing, while every
valid sample here is a training example. The stage stops after `max_steps` optimiser steps (or one pass over its
items when `max_steps` <= 0; with `max_steps`, a stage whose samples are never valid gives up after 50 rounds a
step).

`run_filtered_stage` writes the same files as `trainer.stage.run_stage` (`checkpoint/` with `trainer_meta.json`,
`metrics.json`), so the loop, resume and evaluation read it unchanged.
"""

from __future__ import annotations

import json
import logging
import math
import random
import shutil
import statistics
import time
from pathlib import Path

from trainer.task import Task, load_task

log = logging.getLogger(__name__)


def _encode(tok, messages: list[dict], answer: str, enable_thinking: bool | None) -> tuple[list[int], int]:
    kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kwargs)
    p_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    a_ids = tok(answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    return p_ids + a_ids, len(p_ids)


def sample(model, tok, prompts: list[list[dict]], *, n: int, temperature: float, max_new_tokens: int,
           enable_thinking: bool | None = None, bf16: bool = False) -> list[list[str]]:
    """`n` sampled answers to each chat prompt (`bf16`: under bf16 autocast, on a CPU that multiplies bf16 in
    hardware: the samples are only filtered, never differentiated)."""
    import torch

    kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    texts = [tok.apply_chat_template(m, add_generation_prompt=True, tokenize=False, **kwargs) for m in prompts]
    side = tok.padding_side
    tok.padding_side = "left"
    try:
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        model.eval()
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = model.generate(**enc, do_sample=True, temperature=temperature, top_p=1.0, top_k=0,
                                 max_new_tokens=max_new_tokens, num_return_sequences=n,
                                 pad_token_id=tok.pad_token_id)
    finally:
        tok.padding_side = side
    gen = out[:, enc["input_ids"].shape[1]:]
    flat = [tok.decode(ids, skip_special_tokens=True) for ids in gen]
    return [flat[i * n:(i + 1) * n] for i in range(len(prompts))]


def sft_steps(model, tok, examples: list[tuple[list[int], int]], opt, batch_size: int, rng: random.Random) -> list[float]:
    """One pass of cross-entropy on the answer tokens of `examples` ([(ids, prompt_len)]); the losses."""
    import torch

    model.train()
    order = list(range(len(examples)))
    rng.shuffle(order)
    losses = []
    for i in range(0, len(order), batch_size):
        batch = [examples[j] for j in order[i:i + batch_size]]
        width = max(len(ids) for ids, _ in batch)
        pad = tok.pad_token_id
        input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in batch])
        attn = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in batch])
        labels = torch.tensor([[-100] * p + ids[p:] + [-100] * (width - len(ids)) for ids, p in batch])
        loss = model(input_ids=input_ids, attention_mask=attn, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def run_filtered_stage(*, train_path: Path, init_checkpoint: Path | str, out_dir: Path, cfg, seed: int,
                       task: str | Task = "mapf", progress: bool = True, metrics: dict | None = None,
                       meta: dict | None = None, started: float | None = None) -> dict:
    """Train one stage by reward-filtered fine-tuning (see the module docstring); returns
    {"checkpoint", "reward_state": None, "metrics"} like `trainer.stage.run_stage`, which calls it for
    `cfg.optimizer == "filtered"` after its warm start (`metrics`: the warm start's `sft/...` figures, `meta`: what
    the checkpoint's trainer_meta.json records of it, `started`: when the stage began)."""
    import torch
    from transformers import set_seed

    from llm_backends.checkpoints import META_FILE, check_checkpoint, load_checkpoint
    from trainer.files import write_text_atomic
    from trainer.trl_setup import freeze_lower_layers

    t_start = started if started is not None else time.perf_counter()
    task = load_task(task)
    set_seed(seed)
    rng = random.Random(seed)
    items = [task.item_from_json(line) for line in Path(train_path).read_text(encoding="utf-8").splitlines()
             if line.strip()]
    if not items:
        raise ValueError(f"{train_path}: no training items")
    meta_in = check_checkpoint(Path(init_checkpoint)) or {}
    model, tok = load_checkpoint(init_checkpoint, dtype="float32", trainable=True)
    if cfg.train_layers:
        freeze_lower_layers(model, cfg.train_layers)
    from trainer.trl_setup import use_autocast

    bf16 = use_autocast(cfg) and not torch.cuda.is_available()
    from trainer.filtered_sampling import FilteredSampler

    sampler = FilteredSampler(cfg.filtered_sampler, bf16=bf16, log_dir=Path(out_dir) / "logs")
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.learning_rate, weight_decay=0.0)
    per_round = max(1, cfg.filtered_prompts)
    order = list(range(len(items)))
    rng.shuffle(order)
    steps, rounds, sampled, kept_n, pos = 0, 0, 0, 0, 0
    pending: list[tuple[list[int], int]] = []  # verified examples not yet trained on
    losses: list[float] = []
    valid_rates: list[float] = []
    # max_steps optimiser steps, giving up after 50 rounds a step that find nothing valid; else one pass over the items
    budget = cfg.max_steps if cfg.max_steps > 0 else math.inf
    max_rounds = 50 * cfg.max_steps if cfg.max_steps > 0 else math.ceil(len(items) / per_round)
    while steps < budget and rounds < max_rounds:
        if pos >= len(order):
            rng.shuffle(order)
            pos = 0
        chunk = [items[order[(pos + k) % len(order)]] for k in range(min(per_round, len(order)))]
        pos += len(chunk)
        answers = sampler(model, tok, [task.prompt(it, cfg.prompt_style) for it in chunk], n=cfg.num_generations,
                          temperature=cfg.temperature, max_new_tokens=cfg.max_completion_length,
                          enable_thinking=cfg.enable_thinking, version=steps)
        examples = []
        ok_here = 0
        for it, outs in zip(chunk, answers, strict=True):
            seen = set()
            for text in outs:
                sampled += 1
                if task.verify(it, text).valid:
                    ok_here += 1
                    key = text.strip()
                    if key not in seen:
                        seen.add(key)
                        examples.append(_encode(tok, task.prompt(it, cfg.prompt_style), key, cfg.enable_thinking))
        valid_rates.append(ok_here / max(1, len(chunk) * cfg.num_generations))
        kept_n += len(examples)
        rounds += 1
        pending += examples
        full = len(pending) // cfg.sft_batch_size  # optimiser steps on full batches only: a step on 3 examples is noise
        if full:
            take = int(min(full, budget - steps)) * cfg.sft_batch_size
            got = sft_steps(model, tok, pending[:take], opt, cfg.sft_batch_size, rng)
            pending = pending[take:]
            losses += got
            steps += len(got)
        if progress:
            log.info("filtered round %d: %d/%d samples valid, %d kept, step %d/%s", rounds, ok_here,
                     len(chunk) * cfg.num_generations, len(examples), steps, cfg.max_steps)
    sampler.close()
    out_dir = Path(out_dir)
    ckpt = out_dir / "checkpoint"
    tmp = ckpt.with_name("checkpoint.tmp")
    model.eval()
    for p in model.parameters():
        p.requires_grad_(True)
    model.save_pretrained(str(tmp))
    tok.save_pretrained(str(tmp))
    seconds = time.perf_counter() - t_start
    meta = {"reward_state": None, "task": task.name, "base_model": meta_in.get("base_model") or str(init_checkpoint),
            "is_lora": False, "init_checkpoint": str(init_checkpoint), "train_path": str(train_path), "seed": seed,
            "grpo_steps": 0, "optimizer": "filtered", "filtered_steps": steps, "sft_warm_start": False,
            "prompt_style": cfg.prompt_style, **(meta or {}), "train_config": cfg.model_dump(mode="json")}
    (tmp / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    if ckpt.exists():
        shutil.rmtree(ckpt)
    tmp.replace(ckpt)
    metrics = {
        **(metrics or {}),
        "train/optimizer": "filtered",
        "train/steps": steps,
        "train/rounds": rounds,
        "train/completions": sampled,
        "train/kept": kept_n,
        "train/valid_rate": statistics.fmean(valid_rates) if valid_rates else 0.0,
        "train/reward_mean": statistics.fmean(valid_rates) if valid_rates else 0.0,
        "train/reward_first_quarter": statistics.fmean(valid_rates[:max(1, len(valid_rates) // 4)]),
        "train/reward_last_quarter": statistics.fmean(valid_rates[-max(1, len(valid_rates) // 4):]),
        "train/loss": statistics.fmean(losses) if losses else float("nan"),
        "train/instances": len(items),
        "train/seconds": seconds,
        "train/seconds_per_step": seconds / steps if steps else None,
        "train/device": "cpu",
        "train/sampler": sampler.label,
        "train/sampler_sync_seconds": sampler.sync_seconds,
    }
    write_text_atomic(out_dir / "metrics.json", json.dumps(metrics, indent=2, default=str) + "\n")
    return {"checkpoint": str(ckpt), "reward_state": None, "metrics": metrics}
