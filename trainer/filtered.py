"""Reward-filtered fine-tuning: a stage optimizer for small CPU runs (`TrainConfig.optimizer = "filtered"`).

Expert iteration (RAFT, ReST): in rounds of `filtered_prompts` prompts, the policy samples `num_generations`
answers to each at `temperature`; the task verifies them; the policy is then fine-tuned (cross-entropy on the
answer tokens only, AdamW at `learning_rate`, full batches of `sft_batch_size`, the rest kept for the next round)
on the verified ones, one copy of each distinct valid answer. It is RL from the same verified reward as GRPO, but needs
no reward variance inside a group: on a 135M policy at temperature 1 most GRPO groups score all 0 or all 1 and move
nothing, while every valid sample here is a training example.

How long a stage runs:
- `stage_samples > 0`: a budget in compute, the same whatever the stage's levels: the stage ends once it has sampled
  that many answers (its last round takes only the prompts the budget has room for). It trains on what it kept, in
  full batches; a stage that keeps nothing takes no step, says so, and its checkpoint holds the start's weights;
- else `max_steps` optimiser steps (a stage whose samples are never valid gives up after 50 rounds a step), or one
  pass over its items when `max_steps` <= 0.

Stop and resume, as a GRPO stage: with `save_steps = N > 0` an in-stage checkpoint every N rounds
(`stage_<k>/trl/checkpoint-<round>/`: weights, optimiser state, RNG states, the round counter and the verified
examples not yet trained on; `trainer.resume`). A stop request (`trainer.stop`: Ctrl-C, SIGTERM) ends the stage at
the next round boundary, saved as an in-stage checkpoint (a round whose sampling the stop interrupted is given up
and sampled again on resume), and raises `StageInterrupted`; `--resume` continues from there, and after a SIGKILL
from the last in-stage checkpoint, with the same result as a stage never stopped.

`train_filtered` sits beside `trainer.grpo_stage.train_grpo`: `trainer.stage.run_stage` prepares the stage for either
(`trainer.prepare`) and both write the same files (`checkpoint/` with `trainer_meta.json`, `metrics.json`), so the
loop, resume and evaluation read it unchanged.
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

from llm_backends.checkpoints import META_FILE
from trainer.prepare import StagePrep

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
    hardware: the samples are only filtered, never differentiated). A stop request (`trainer.stop`) ends the
    generation at the next token: the round is then given up (`train_filtered`), so a stop never waits on a round."""
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    from trainer.stop import stop_requested

    class StopOnRequest(StoppingCriteria):
        def __call__(self, input_ids, scores, **kw):
            return torch.full((input_ids.shape[0],), stop_requested(), dtype=torch.bool, device=input_ids.device)

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
                                 pad_token_id=tok.pad_token_id,
                                 stopping_criteria=StoppingCriteriaList([StopOnRequest()]))
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


def level_metrics(st: dict) -> dict[str, float]:
    """The stage's training signal per level (`train/level/<level>/...`, as GRPO's rewards record it): answers
    sampled, their valid rate (the reward: 1 for a verified answer), and the verified answers kept."""
    out: dict[str, float] = {}
    for lv, (sampled, valid, kept) in sorted((st.get("levels") or {}).items(), key=lambda kv: int(kv[0])):
        if sampled:
            out[f"train/level/{lv}/completions"] = sampled
            out[f"train/level/{lv}/valid_rate"] = valid / sampled
            out[f"train/level/{lv}/reward_mean"] = valid / sampled
            out[f"train/level/{lv}/kept"] = kept
    return out


def train_filtered(prep: StagePrep) -> dict:
    """Train the prepared stage by reward-filtered fine-tuning (see the module docstring); returns
    {"checkpoint", "reward_state": None, "metrics"} like `trainer.grpo_stage.train_grpo`."""
    import torch
    from transformers import set_seed

    from trainer import resume as stage_resume
    from trainer.files import write_text_atomic
    from trainer.stop import StageInterrupted, stop_requested
    from trainer.trl_setup import use_autocast

    cfg, task, model, tok, items, out_dir = prep.cfg, prep.task, prep.model, prep.tok, prep.items, prep.out_dir
    set_seed(prep.seed)
    rng = random.Random(prep.seed)
    bf16 = use_autocast(cfg) and not torch.cuda.is_available()
    from trainer.filtered_sampling import FilteredSampler

    sampler = FilteredSampler(cfg.filtered_sampler, bf16=bf16, log_dir=Path(out_dir) / "logs")
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.learning_rate, weight_decay=0.0)
    per_round = max(1, cfg.filtered_prompts)
    order = list(range(len(items)))
    rng.shuffle(order)
    # the loop's state: everything a resumed stage needs besides the weights, the optimiser and the RNGs
    st = {"rounds": 0, "steps": 0, "sampled": 0, "kept": 0, "pos": 0, "order": order,
          "pending": [],  # verified examples not yet trained on: [(ids, prompt_len)]
          "losses": [], "valid_rates": [],
          "levels": {}}  # per level: [answers sampled, valid, verified examples kept]
    metrics = prep.metrics
    if prep.resume is not None:
        st = stage_resume.load_filtered(prep.resume[0], model, opt, rng)
        metrics["train/resumed_from_round"] = st["rounds"]
        if prep.progress:
            log.info("resuming %s from its in-stage checkpoint %s (round %d)", out_dir.name, prep.resume[0], st["rounds"])
    budget = cfg.stage_samples
    # max_steps optimiser steps, giving up after 50 rounds a step that find nothing valid; else one pass over the items
    max_steps = math.inf if budget or cfg.max_steps <= 0 else cfg.max_steps
    max_rounds = (math.inf if budget else 50 * cfg.max_steps if cfg.max_steps > 0
                  else math.ceil(len(items) / per_round))

    def save(state: dict, rng_state) -> Path:
        return stage_resume.save_filtered(out_dir / "trl", prep.key, model, opt, state, rng_state)

    def stopped(state: dict, rng_state) -> StageInterrupted:
        folder = save(state, rng_state)
        return StageInterrupted(f"filtered fine-tuning of {out_dir.name} stopped on request after round "
                                f"{state['rounds']}, saved in {folder.parent.name}/{folder.name}: a resume continues "
                                "from it")

    try:
        while st["steps"] < max_steps and st["rounds"] < max_rounds:
            room = len(order) if not budget else (budget - st["sampled"]) // cfg.num_generations
            if room <= 0:
                break
            at_start = stage_resume.filtered_snapshot(st, rng)  # the round's start: what a stop during it saves
            if stop_requested():
                raise stopped(*at_start)
            order = st["order"]
            if st["pos"] >= len(order):
                rng.shuffle(order)
                st["pos"] = 0
            chunk = [items[order[(st["pos"] + k) % len(order)]] for k in range(min(per_round, len(order), room))]
            st["pos"] += len(chunk)
            answers = sampler(model, tok, [task.prompt(it, cfg.prompt_style) for it in chunk], n=cfg.num_generations,
                              temperature=cfg.temperature, max_new_tokens=cfg.max_completion_length,
                              enable_thinking=cfg.enable_thinking, version=st["steps"])
            if stop_requested():  # the round is given up: its samples are drawn again on resume
                raise stopped(*at_start)
            examples = []
            ok_here = 0
            for it, outs in zip(chunk, answers, strict=True):
                seen = set()
                per = st.setdefault("levels", {}).setdefault(str(task.level(it)), [0, 0, 0])
                for text in outs:
                    st["sampled"] += 1
                    per[0] += 1
                    if task.verify(it, text).valid:
                        ok_here += 1
                        per[1] += 1
                        key = text.strip()
                        if key not in seen:
                            seen.add(key)
                            per[2] += 1
                            examples.append(_encode(tok, task.prompt(it, cfg.prompt_style), key, cfg.enable_thinking))
            st["valid_rates"].append(ok_here / max(1, len(chunk) * cfg.num_generations))
            st["kept"] += len(examples)
            st["rounds"] += 1
            st["pending"] += examples
            full = len(st["pending"]) // cfg.sft_batch_size  # optimiser steps on full batches only: a step on 3 examples is noise
            if full:
                take = int(min(full, max_steps - st["steps"])) * cfg.sft_batch_size
                got = sft_steps(model, tok, st["pending"][:take], opt, cfg.sft_batch_size, rng)
                st["pending"] = st["pending"][take:]
                st["losses"] += got
                st["steps"] += len(got)
            if prep.progress:
                log.info("filtered round %d: %d/%d samples valid, %d kept, step %d%s, samples %d%s", st["rounds"], ok_here,
                         len(chunk) * cfg.num_generations, len(examples), st["steps"],
                         "" if budget else f"/{cfg.max_steps}", st["sampled"], f"/{budget}" if budget else "")
            if cfg.save_steps and st["rounds"] % cfg.save_steps == 0:
                save(*stage_resume.filtered_snapshot(st, rng))
    finally:
        sampler.close()  # a vLLM sampler's server stops with the stage, stopped or not
    steps, rounds, sampled, kept_n = st["steps"], st["rounds"], st["sampled"], st["kept"]
    losses, valid_rates = st["losses"], st["valid_rates"]
    if prep.progress and kept_n == 0:
        log.info("filtered stage %s: kept 0 of %d sampled answers: no step taken, the checkpoint holds the start's "
                 "weights", out_dir.name, sampled)
    ckpt = out_dir / "checkpoint"
    tmp = ckpt.with_name("checkpoint.tmp")
    model.eval()
    for p in model.parameters():
        p.requires_grad_(True)
    model.save_pretrained(str(tmp))
    tok.save_pretrained(str(tmp))
    seconds = time.perf_counter() - prep.started
    meta = {"reward_state": None, "task": task.name, "base_model": prep.base_model, "is_lora": prep.is_lora,
            "init_checkpoint": prep.meta["init_checkpoint"], "train_path": str(prep.train_path), "seed": prep.seed,
            "grpo_steps": 0, "optimizer": "filtered", "filtered_steps": steps,
            "sft_warm_start": prep.meta["sft_warm_start"], "warm_start_cache": prep.meta["warm_start_cache"],
            "prompt_style": cfg.prompt_style, "train_config": cfg.model_dump(mode="json")}
    (tmp / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    if ckpt.exists():
        shutil.rmtree(ckpt)
    tmp.replace(ckpt)
    stage_resume.remove(out_dir / "trl")  # the in-stage checkpoints: the stage's own is written
    metrics.update({
        "train/optimizer": "filtered",
        "train/steps": steps,
        "train/rounds": rounds,
        "train/completions": sampled,
        **({"train/stage_samples": budget} if budget else {}),
        "train/kept": kept_n,
        "train/valid_rate": statistics.fmean(valid_rates) if valid_rates else 0.0,
        "train/reward_mean": statistics.fmean(valid_rates) if valid_rates else 0.0,
        "train/reward_first_quarter": statistics.fmean(valid_rates[:max(1, len(valid_rates) // 4)]) if valid_rates else 0.0,
        "train/reward_last_quarter": statistics.fmean(valid_rates[-max(1, len(valid_rates) // 4):]) if valid_rates else 0.0,
        "train/loss": statistics.fmean(losses) if losses else float("nan"),
        "train/instances": len(items),
        "train/seconds": seconds,
        "train/seconds_per_step": seconds / steps if steps else None,
        "train/device": "cpu",
        "train/sampler": sampler.label,
        "train/sampler_sync_seconds": sampler.sync_seconds,
        **level_metrics(st),
    })
    write_text_atomic(out_dir / "metrics.json", json.dumps(metrics, indent=2, default=str) + "\n")
    return {"checkpoint": str(ckpt), "reward_state": None, "metrics": metrics}
