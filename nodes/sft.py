"""SFT warm start: TRL `SFTTrainer` on solver-optimal plans rendered in the answer format.

A 135M policy almost never writes a valid joint plan by itself; every GRPO group then gets the same zero
reward and GRPO learns nothing. A short supervised pass on the stage's own instances, each answered with
the stored optimal plan (`Instance.plan`) in the exact format `env.parse_plan` reads, gives GRPO a
policy that is sometimes right, which is what a group-relative advantage needs. The loss is on the
answer tokens only (prompt-completion data). Runs once, before the first GRPO stage (`nodes.train_stage`).

By default (`TrainConfig.sft_sizes = [3]`) the examples are fresh 3x3 instances (`warm_start_instances`):
on 2 CPU cores, 20 steps on the stage's mixed 3..10 maps or on 3..5 maps taught the 135M model nothing measurable
(0/24 valid on val-mini 3..5, with endless repetition or wrong agent counts), while 30 steps on 3x3 gave
valid plans on 3x3 and errors that name a real cause (hole, illegal move) instead of a parse error
(`python -m evals.bench.bench_learning --sft-sizes 3`; figures in the issue-4 note). The `cpu` preset takes 20
steps (to fit the 30-minute default run); after them the timed default run scored 1 of 8 3x3 and 0 of 16 4x4/5x5
val-mini instances valid (evals/results/default_run_cpu).

TensorBoard: transformers' own scalar names (`train/loss`, `train/learning_rate`, `train/grad_norm`, ...)
in the run `<stage folder>/tb/sft/`, apart from GRPO's `tb/`. Only the main process writes (accelerate).
"""

from __future__ import annotations

import logging
import random
import shutil
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def format_answer(instance) -> str:
    """The optimal plan of `instance` written in the answer format the prompt asks for.

    >>> # plan [[(0,0),(0,1)], [(1,1),(1,0)]] ->
    >>> # "<answer>\\nAgent 0: (0,0) (0,1)\\nAgent 1: (1,1) (1,0)\\n</answer>"
    """
    from env import plan_text

    return plan_text(instance.plan)


def warm_start_instances(sizes: list[int], n: int, seed: int) -> list:
    """`n` fresh solvable 2-agent instances spread evenly over the grid `sizes` (hole 0.2, wait 0.5), drawn
    from a seed of their own, so that they never coincide with the stage's training draw."""
    from env import SIZES, EnvConfig, generate

    knobs = {s: {"data_ratio": 1 / len(sizes) if s in sizes else 0.0, "hole_ratio": 0.2, "wait_ratio": 0.5}
             for s in SIZES}
    return generate(EnvConfig.model_validate({"sizes": knobs}), n, seed=seed + 104_729).instances


def sft_dataset(instances: list, seed: int):
    """Prompt-completion chat rows: the policy prompt and the solver's optimal plan as the answer."""
    from datasets import Dataset

    from nodes.train_stage import prompt_messages

    rows = [
        {
            "prompt": prompt_messages(inst),
            "completion": [{"role": "assistant", "content": format_answer(inst)}],
        }
        for inst in instances
    ]
    random.Random(seed).shuffle(rows)
    return Dataset.from_list(rows)


def warm_start(
    model, tokenizer, instances: list, *, cfg, out_dir: Path, seed: int, progress: bool = True
) -> dict:
    """Fine-tune `model` in place on `instances`' optimal plans; return {seconds, steps, loss, examples}.

    The examples are exactly the instances given (`nodes.train_stage` passes fresh instances of
    `cfg.sft_sizes`, or the stage's own training set when that is None). `cfg` is a `nodes.train_stage.TrainConfig` (its `sft_*` fields).
    """
    import torch
    from trl import SFTConfig, SFTTrainer

    from nodes.train_stage import _tb_callback, _use_bf16

    data = sft_dataset(instances, seed)
    cuda = torch.cuda.is_available()
    args = SFTConfig(
        output_dir=str(Path(out_dir) / "sft"),
        learning_rate=cfg.sft_lr,
        per_device_train_batch_size=cfg.sft_batch_size,
        gradient_accumulation_steps=1,
        num_train_epochs=cfg.sft_epochs,
        max_steps=cfg.sft_steps if cfg.sft_steps > 0 else -1,
        lr_scheduler_type="constant",
        max_length=cfg.max_prompt_length + cfg.max_completion_length,
        completion_only_loss=True,
        use_cpu=not cuda,
        bf16=_use_bf16(cfg),
        gradient_checkpointing=cfg.gradient_checkpointing,
        logging_steps=cfg.logging_steps,
        save_strategy="no",
        report_to="none",
        seed=seed,
        data_seed=seed,
        disable_tqdm=not progress,  # a step bar with ETA on the terminal
        dataset_num_proc=None,
    )
    main = args.process_index == 0  # = trainer.is_world_process_zero(); only it writes files
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=data,
        processing_class=tokenizer,
        # transformers' names (train/loss, ...) in a TensorBoard run of their own, beside GRPO's tb/
        callbacks=[_tb_callback(Path(out_dir) / "tb" / "sft", main=main)],
    )
    if not progress:
        from transformers.trainer_callback import PrinterCallback, ProgressCallback

        trainer.remove_callback(PrinterCallback)
        trainer.remove_callback(ProgressCallback)
    t0 = time.perf_counter()
    result = trainer.train()
    seconds = time.perf_counter() - t0
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    out: dict[str, Any] = {
        "seconds": seconds,
        "steps": int(trainer.state.global_step),
        "loss": float(result.training_loss),
        "loss_last": losses[-1] if losses else float(result.training_loss),
        "examples": len(data),
    }
    if main:
        shutil.rmtree(Path(out_dir) / "sft", ignore_errors=True)  # SFTTrainer's output_dir: nothing we keep
    if progress and main:
        first = losses[0] if losses else out["loss"]
        log.info(
            "SFT warm start: %d steps in %.1f s, loss %.3f -> %.3f",
            out["steps"],
            seconds,
            first,
            out["loss_last"],
        )
    model.train()
    return out


def greedy_valid_rate(
    model, tokenizer, instances: list, *, max_new_tokens: int = 128, batch_size: int = 8
) -> dict:
    """Greedy answers of `model` to `instances`, verified: {valid_rate, optimal_rate, n, failures, by_size,
    sample} (`by_size`: valid rate per grid size; `sample`: the first answer, for a look at what fails).

    A small in-process check for tests and benchmarks (the run's own evaluation is `nodes.evaluate`).
    """
    import torch

    from env import verify
    from nodes.train_stage import prompt_messages

    was_training = model.training
    model.eval()
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    valid = optimal = 0
    failures: dict[str, int] = {}
    per_size: dict[int, list[int]] = {}
    sample = None
    try:
        for i in range(0, len(instances), batch_size):
            chunk = instances[i : i + batch_size]
            texts = [
                tokenizer.apply_chat_template(prompt_messages(x), add_generation_prompt=True, tokenize=False)
                for x in chunk
            ]
            enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
            with torch.no_grad():
                out = model.generate(
                    **enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
                )
            for inst, ids in zip(chunk, out[:, enc["input_ids"].shape[1] :], strict=True):
                text = tokenizer.decode(ids, skip_special_tokens=True)
                sample = text if sample is None else sample
                v = verify(inst, text)
                per_size.setdefault(inst.size, []).append(int(v.valid))
                valid += v.valid
                optimal += v.optimal
                if v.failure:
                    failures[v.failure] = failures.get(v.failure, 0) + 1
    finally:
        tokenizer.padding_side = side
        model.train(was_training)
    n = max(1, len(instances))
    by_size = {s: round(sum(v) / len(v), 4) for s, v in sorted(per_size.items())}
    return {"valid_rate": valid / n, "optimal_rate": optimal / n, "n": len(instances), "failures": failures,
            "by_size": by_size, "sample": sample}
