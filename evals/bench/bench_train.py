"""Speed of one GRPO stage on this machine: seconds per step and the share of wall time outside TRL's loop.

    python -m evals.bench.bench_train                       # cpu preset, 4 GRPO steps, no warm start
    python -m evals.bench.bench_train --preset smoke --steps 2
    python -m evals.bench.bench_train --warm-start --sft-steps 4

Trains the embedded model (or --model) on a fresh uniform-config training set in a temporary folder and
prints the figures from the stage's metrics.json. `train/outside_loop_share` is (stage wall time - time in
TRL's SFT/GRPO `train()` loops) / stage wall time: model loading, dataset building, trainer set-up and the
checkpoint write. Target: <= 5% for a cpu-preset stage.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="cpu")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--steps", type=int, default=4, help="GRPO steps (overrides the preset)")
    p.add_argument("--instances", type=int, default=None, help="training instances (default: preset)")
    p.add_argument("--warm-start", action="store_true", help="include the SFT warm start")
    p.add_argument("--sft-steps", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--keep", type=Path, default=None, help="stage folder to keep (default: a temp folder)")
    a = p.parse_args(argv)

    from env import generate, uniform_config, write_jsonl
    from llm.models import resolve_model
    from nodes.train_stage import TRAIN_PRESETS, TrainConfig, run_stage

    raw = {**TRAIN_PRESETS[a.preset], "max_steps": a.steps}
    if a.sft_steps is not None:
        raw["sft_steps"] = a.sft_steps
    cfg = TrainConfig.model_validate(raw)
    base = resolve_model(a.model)
    with tempfile.TemporaryDirectory() as tmp:
        out = a.keep or Path(tmp) / "stage_0"
        train = Path(tmp) / "train.jsonl"
        write_jsonl(
            train, generate(uniform_config(), a.instances or cfg.instances_per_stage, seed=a.seed).instances
        )
        t0 = time.perf_counter()
        res = run_stage(
            train_path=train,
            init_checkpoint=base,
            out_dir=out,
            cfg=cfg,
            seed=a.seed,
            reward_state=None,
            progress=False,
            warm_start=a.warm_start,
        )
        total = time.perf_counter() - t0
    m = res["metrics"]
    figures = {
        "preset": a.preset,
        "grpo_steps": m["train/steps"],
        "seconds_per_grpo_step": m["train/seconds_per_step"],
        "grpo_seconds": m["train/grpo_seconds"],
        "sft_seconds": m.get("sft/seconds"),
        "stage_seconds": m["train/seconds"],
        "outside_loop_seconds": m["train/outside_loop_seconds"],
        "outside_loop_share": m["train/outside_loop_share"],
        "reward_mean": m["train/reward_mean"],
        "zero_std_groups": m["train/zero_std_groups"],
        "run_stage_call_seconds": total,
    }
    print(json.dumps(figures, indent=2))
    return figures


if __name__ == "__main__":
    main()
