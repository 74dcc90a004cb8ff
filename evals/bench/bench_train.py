"""Training speed on this machine: SFT examples/s and GRPO seconds per optimiser step, before and after.

    python -m evals.bench.bench_train --compare            # today's path and the old path, side by side
    python -m evals.bench.bench_train                      # the cpu preset alone
    python -m evals.bench.bench_train --preset smoke --sft-steps 2 --grpo-steps 1

`--compare` runs each side in a child process of its own, one after the other, on the same instances and seed:

- `before`: the path as it was before the CPU speed work: the full paper prompt (with SmolLM2's default system prompt), TRL's
  fused LM head scoring every position on CPU in TRL's own tiles (`ENV_ENGINEER_TRL_PATCH=0`), the old cpu preset's SFT and GRPO shapes
  (SFT batch 8 on 3x3/4x4, top 8 blocks; GRPO 2 groups x 4 completions of <= 128 tokens);
- `after`: the cpu preset as it stands (compact prompt, labelled positions only, its own SFT recipe; on a CPU with
  bf16 hardware (AMX or AVX-512 BF16) GRPO samples from a bf16 copy of the policy and trains under bf16 autocast over float32 weights,
  elsewhere from a float32 copy on oneDNN-packed weights; the fused head in CPU-sized tiles), with GRPO
  at the *same* 8 completions per step in the same 2 groups of 4 and dynamic sampling off, so the two GRPO figures
  count the same work;
- `after_one_prompt` (GRPO only): the same 8 completions per step as 1 prompt x 8, the cpu preset's shape (one
  prompt per step, all its completions in one group), where every row shares one prefill.

`--share-prompt` (GRPO only) asks the same of `train.share_prompt`: the preset's GRPO step with every completion
scored over its own copy of the prompt (TRL's path), and over one forward of the prompt shared by all 16.

`--head-tiles` (GRPO only) asks the same of the fused LM head's CPU tiles (`trainer.trl_cpu.tile_head_on_cpu`;
`ENV_ENGINEER_HEAD_TILES=0` in the child keeps TRL's own).

`--dtypes` (GRPO only) asks whether the bf16 levers pay on this CPU: the cpu preset's GRPO step (1 prompt x 16,
dynamic sampling off) sampled by the float32 model itself (transformers' generate), by a float32 rollout copy (the
copy's sampler without bf16) on MKL's matmul and on oneDNN-packed weights (`train.rollout_prepack`), by the bf16
rollout copy, and by the bf16 copy with training under bf16 autocast, each
in its own child process, `--rounds` interleaved rounds, the median kept; `--arms` picks some of them. This is what
`auto` decides by the CPU's flags (`llm_backends.vllm_server.cpu_has_bf16`).

Figures: SFT examples per second (`--sft-steps` timed steps after one untimed step), GRPO seconds per optimiser
step (`--grpo-steps` steps, no warm start, the base model), and the ratios. The cpu preset's own GRPO shape
(more completions per step, dynamic sampling) is printed apart as `after_preset`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BEFORE = {  # the cpu preset before the CPU speed work, as far as speed is concerned
    "prompt_style": "full",
    "sft_batch_size": 8,
    "sft_train_layers": 8,
    "sft_bf16": False,
    "train_layers": 8,
    "num_generations": 4,
    "per_device_train_batch_size": 8,
    "max_completion_length": 128,
    "resample_rounds": 0,
    "rollout_dtype": "model",  # completions sampled by the trained float32 model itself
    "autocast_bf16": False,  # float32 training steps
    "share_prompt": False,  # every completion scored over its own copy of the prompt (TRL's path)
}
SAME_WORK = {"num_generations": 4, "per_device_train_batch_size": 8, "max_completion_length": 128,
             "resample_rounds": 0}
ONE_PROMPT = {**SAME_WORK, "num_generations": 8}  # the same 8 completions, in the cpu preset's shape: 1 prompt x 8
SHARE_ARMS = {  # --share-prompt: the cpu preset's GRPO step with each row scored over its own prompt, or one shared
    "per_row_prompt": {"share_prompt": False},
    "shared_prompt": {"share_prompt": True},
}
HEAD_ARMS = {  # --head-tiles: the environment of each arm's child (the settings are the preset's)
    "trl_tiles": {"ENV_ENGINEER_HEAD_TILES": "0"},  # TRL's 4096 x 32,768 tiles
    "cpu_tiles": {},  # trainer.trl_cpu's 512 x 2048
}
DTYPE_ARMS = {  # --dtypes: the cpu preset's GRPO step with each bf16 lever off or on
    "fp32": {"rollout_dtype": "model", "autocast_bf16": False},
    "fp32_copy": {"rollout_dtype": "float32", "rollout_prepack": False, "autocast_bf16": False},
    "fp32_copy_packed": {"rollout_dtype": "float32", "rollout_prepack": True, "autocast_bf16": False},
    "bf16_copy": {"rollout_dtype": "bfloat16", "rollout_prepack": False, "autocast_bf16": False},
    "bf16_copy_autocast": {"rollout_dtype": "bfloat16", "rollout_prepack": False, "autocast_bf16": True},
}


def measure(raw: dict, sft_steps: int, grpo_steps: int, sft_sizes: list[int], seed: int, model: str) -> dict:
    """SFT examples/s and GRPO s/step for one TrainConfig in this process."""
    from env import generate, uniform_config, write_jsonl
    from env.task import MapfTask
    from llm_backends.checkpoints import load_checkpoint
    from llm_backends.models import resolve_model
    from trainer.config import TrainConfig
    from trainer.sft import sft_layers, warm_start
    from trainer.stage import run_stage
    from trainer.trl_setup import freeze_lower_layers

    base = resolve_model(model)
    out: dict = {}
    if sft_steps:
        cfg = TrainConfig.model_validate({**raw, "sft_steps": sft_steps + 1, "sft_order": "shuffle"})
        m, tok = load_checkpoint(base, trainable=True)
        layers = sft_layers(cfg)
        if layers:
            freeze_lower_layers(m, layers)
        data = MapfTask().warm_start_items(sft_sizes, cfg.sft_batch_size * (sft_steps + 1), seed)
        from transformers import TrainerCallback

        marks: list[float] = []

        class Clock(TrainerCallback):
            def on_step_end(self, args, state, control, **kw):
                marks.append(time.perf_counter())

        import trl

        orig = trl.SFTTrainer.__init__

        def init(self, *a, **kw):
            kw["callbacks"] = [*kw.get("callbacks", []), Clock()]
            orig(self, *a, **kw)

        trl.SFTTrainer.__init__ = init
        with tempfile.TemporaryDirectory() as tmp:
            warm_start(m, tok, data, cfg=cfg, out_dir=Path(tmp), seed=seed, progress=False, task=MapfTask())
        trl.SFTTrainer.__init__ = orig
        timed = marks[-1] - marks[0]  # the first step (set-up, first allocations) is not timed
        out.update({"sft_batch": cfg.sft_batch_size, "sft_timed_steps": sft_steps,
                    "sft_seconds_per_step": timed / sft_steps,
                    "sft_examples_per_second": sft_steps * cfg.sft_batch_size / timed})
        del m
    if grpo_steps:
        cfg = TrainConfig.model_validate({**raw, "max_steps": grpo_steps, "sft_warm_start": False})
        with tempfile.TemporaryDirectory() as tmp:
            train = Path(tmp) / "train.jsonl"
            write_jsonl(train, generate(uniform_config(), cfg.instances_per_stage, seed=seed).instances)
            res = run_stage(train_path=train, init_checkpoint=base, out_dir=Path(tmp) / "stage_0", cfg=cfg,
                            seed=seed, reward_state=None, progress=False, warm_start=False, task=MapfTask())
        mm = res["metrics"]
        per_step = cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps
        out.update({"grpo_completions_per_step": per_step, "grpo_steps": mm["train/steps"],
                    "grpo_seconds_per_step": mm["train/seconds_per_step"],
                    "grpo_completion_tokens": mm["train/completion_tokens"],
                    "grpo_seconds_per_completion": mm["train/seconds_per_step"] / per_step,
                    "grpo_resample_replaced": mm.get("train/resample_replaced")})
    return out


def _child(side: str, raw: dict, a, sft_steps: int | None = None, extra_env: dict | None = None) -> dict:
    env = {**os.environ, **(extra_env or {})}
    if side == "before":
        env["ENV_ENGINEER_TRL_PATCH"] = "0"
    cmd = [sys.executable, "-m", "evals.bench.bench_train", "--child", json.dumps(raw), "--sft-steps",
           str(a.sft_steps if sft_steps is None else sft_steps), "--grpo-steps", str(a.grpo_steps), "--seed", str(a.seed), "--model", a.model,
           "--sft-sizes", a.sft_sizes]
    print(f"[{side}] running ...", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-3000:])
        raise SystemExit(f"bench_train: the {side} side failed (exit {proc.returncode})")
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    figures["wall_seconds"] = round(time.perf_counter() - t0, 1)
    print(f"[{side}] {json.dumps(figures)}", file=sys.stderr, flush=True)
    return figures


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="cpu")
    p.add_argument("--model", default="smollm2-135m")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--compare", action="store_true", help="before (old path) and after (this preset), side by side")
    mode.add_argument("--dtypes", action="store_true",
                      help="GRPO s/step with the float32 model, a float32 and a bf16 rollout copy, and the bf16 copy "
                      "+ bf16 autocast")
    mode.add_argument("--share-prompt", action="store_true",
                      help="GRPO s/step with each completion scored over its own copy of the prompt, and over one "
                      "shared forward of it (train.share_prompt)")
    mode.add_argument("--head-tiles", action="store_true",
                      help="GRPO s/step with TRL's fused LM head in TRL's own tiles and in CPU-sized ones "
                      "(trainer.trl_cpu.tile_head_on_cpu)")
    p.add_argument("--arms", default=None,
                   help=f"--dtypes: a comma list of arms to run, the first the base (default: all, "
                   f"{','.join(DTYPE_ARMS)})")
    p.add_argument("--rounds", type=int, default=2,
                   help="--dtypes, --share-prompt, --head-tiles: interleaved rounds, at least 1 (the median is kept)")
    p.add_argument("--sft-steps", type=int, default=4, help="timed SFT steps (after one untimed step); 0: none")
    p.add_argument("--grpo-steps", type=int, default=3, help="GRPO optimiser steps; 0: none")
    p.add_argument("--sft-sizes", default="3,4", help="grid sizes of the timed SFT examples")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.rounds < 1:
        p.error(f"--rounds {a.rounds}: allowed: 1 or more")
    a.arm_names = list(DTYPE_ARMS)
    if a.arms is not None:
        a.arm_names = [x.strip() for x in a.arms.split(",") if x.strip()]
        bad = [x for x in a.arm_names if x not in DTYPE_ARMS]
        if not a.dtypes or bad or not a.arm_names:
            p.error(f"--arms {a.arms!r}: " + (f"allowed: a comma list among {', '.join(DTYPE_ARMS)}" if a.dtypes
                                               else "goes with --dtypes"))
    sizes = [int(x) for x in a.sft_sizes.split(",")]
    if a.child is not None:
        print(json.dumps(measure(json.loads(a.child), a.sft_steps, a.grpo_steps, sizes, a.seed, a.model)))
        return {}

    from trainer.config import TRAIN_PRESETS

    preset = dict(TRAIN_PRESETS[a.preset])
    if a.dtypes:
        figures = dtype_arms(preset, a)
    elif a.share_prompt:
        figures = run_arms(preset, a, SHARE_ARMS, "per_row_prompt")
    elif a.head_tiles:
        figures = run_arms(preset, a, {k: {} for k in HEAD_ARMS}, "trl_tiles", envs=HEAD_ARMS)
    elif not a.compare:
        figures = {"after_preset": _child("after_preset", preset, a)}
    else:
        figures = {
            "before": _child("before", {**preset, **BEFORE}, a),
            "after": _child("after", {**preset, **SAME_WORK}, a),
        }
        if a.grpo_steps:
            figures["after_one_prompt"] = _child("after_one_prompt", {**preset, **ONE_PROMPT}, a, sft_steps=0)
        b, f = figures["before"], figures["after"]
        if a.sft_steps:
            figures["sft_examples_per_second_ratio"] = f["sft_examples_per_second"] / b["sft_examples_per_second"]
        if a.grpo_steps:
            figures["grpo_step_speedup"] = b["grpo_seconds_per_step"] / f["grpo_seconds_per_step"]
            figures["grpo_step_speedup_one_prompt"] = (
                b["grpo_seconds_per_step"] / figures["after_one_prompt"]["grpo_seconds_per_step"])
    figures["machine"] = {"cores": os.cpu_count(), "torch_threads": _threads()}
    print(json.dumps(figures, indent=2))
    if a.json:
        a.json.write_text(json.dumps(figures, indent=2) + "\n")
    return figures


def dtype_arms(preset: dict, a) -> dict:
    """`--dtypes`: GRPO s/step of each `DTYPE_ARMS` arm, `a.rounds` interleaved rounds, each in its own child."""
    from llm_backends.vllm_server import cpu_has_bf16

    arms = {k: DTYPE_ARMS[k] for k in a.arm_names}
    return {**run_arms(preset, a, arms, a.arm_names[0], f"bf16 hardware here: {cpu_has_bf16()}"),
            "bf16_hardware": cpu_has_bf16()}


def run_arms(preset: dict, a, arms: dict, base: str, note: str = "", envs: dict | None = None) -> dict:
    """GRPO s/step of each arm (settings over the preset, dynamic sampling off), `a.rounds` interleaved rounds,
    each in its own child process; the medians and each arm's speed-up over the `base` arm."""
    import statistics

    from trainer.config import TrainConfig

    cfg = TrainConfig.model_validate(preset)
    seconds: dict[str, list[float]] = {k: [] for k in arms}
    for r in range(a.rounds):
        for name, arm in arms.items():
            f = _child(f"{name} round {r + 1}", {**preset, "resample_rounds": 0, **arm}, a, sft_steps=0,
                       extra_env=(envs or {}).get(name))
            seconds[name].append(f["grpo_seconds_per_step"])
    med = {k: statistics.median(v) for k, v in seconds.items()}
    print(f"GRPO s/step, {cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps} completions, median of "
          f"{a.rounds} rounds{f' ({note})' if note else ''}:")
    for k, v in med.items():
        print(f"  {k:20s} {v:6.1f} s   {med[base] / v:4.2f}x {base}   rounds: "
              f"{', '.join(f'{x:.1f}' for x in seconds[k])}")
    return {"grpo_seconds_per_step": seconds, "median": med,
            f"speedup_over_{base}": {k: med[base] / v for k, v in med.items()}}


def _threads() -> int:
    import torch

    return torch.get_num_threads()


if __name__ == "__main__":
    main()
