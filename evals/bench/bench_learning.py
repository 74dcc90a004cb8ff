"""Does the cpu preset learn? Valid rate of the embedded model on 2-agent val sizes 3..5 at three points.

    python -m evals.bench.bench_learning                    # cpu preset
    python -m evals.bench.bench_learning --grpo-steps 4 --sft-steps 12 --instances 48

1. the base model (before the warm start), 2. after the SFT warm start, 3. after GRPO from the warm-started
model. Training data: a fresh training set of sizes 3..5 (uniform knobs); evaluation: the fixed `val-mini`
split (2 agents, sizes 3, 4, 5; greedy answers, every answer verified by `env.verify`).
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
    p.add_argument("--instances", type=int, default=None, help="training instances (default: preset)")
    p.add_argument("--sft-steps", type=int, default=None, help="override the preset's SFT length")
    p.add_argument("--grpo-steps", type=int, default=None, help="override the preset's GRPO steps")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--limit", type=int, default=None, help="evaluate only this many val-mini instances")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)

    from env import SIZES, EnvConfig, generate, load_split, write_jsonl
    from llm.models import resolve_model
    from nodes.sft import greedy_valid_rate, warm_start
    from nodes.train_stage import TRAIN_PRESETS, TrainConfig, freeze_lower_layers, load_checkpoint, run_stage

    raw = dict(TRAIN_PRESETS[a.preset])
    if a.sft_steps is not None:
        raw["sft_steps"] = a.sft_steps
    if a.grpo_steps is not None:
        raw["max_steps"] = a.grpo_steps
    cfg = TrainConfig.model_validate(raw)
    val = [x for x in load_split("val-mini") if x.size <= 5][: a.limit]
    small = EnvConfig.model_validate(
        {
            "sizes": {
                s: {"data_ratio": 1 / 3 if s <= 5 else 0.0, "hole_ratio": 0.2, "wait_ratio": 0.5}
                for s in SIZES
            }
        }
    )
    train = generate(small, a.instances or cfg.instances_per_stage, seed=1000 + a.seed).instances
    rates: dict[str, dict] = {}

    def score(name: str, model, tok) -> None:
        t = time.perf_counter()
        rates[name] = greedy_valid_rate(model, tok, val, max_new_tokens=a.max_new_tokens)
        rates[name]["eval_seconds"] = round(time.perf_counter() - t, 1)
        print(name, json.dumps(rates[name]), flush=True)

    model, tok = load_checkpoint(resolve_model(a.model))
    score("base", model, tok)
    if cfg.train_layers:
        freeze_lower_layers(model, cfg.train_layers)
    with tempfile.TemporaryDirectory() as tmp:
        sft = warm_start(model, tok, train, cfg=cfg, out_dir=Path(tmp), seed=a.seed, progress=False)
        score("after_warm_start", model, tok)
        sft_dir = Path(tmp) / "sft_model"
        model.save_pretrained(sft_dir)
        tok.save_pretrained(sft_dir)
        del model
        write_jsonl(Path(tmp) / "train.jsonl", train)
        res = run_stage(
            train_path=Path(tmp) / "train.jsonl",
            init_checkpoint=sft_dir,
            out_dir=Path(tmp) / "stage_0",
            cfg=cfg,
            seed=a.seed,
            reward_state=None,
            progress=False,
            warm_start=False,
        )
        model, tok = load_checkpoint(res["checkpoint"])
        score("after_grpo", model, tok)
    m = res["metrics"]
    summary = {
        "val_instances": len(val),
        "valid_rate": {k: v["valid_rate"] for k, v in rates.items()},
        "optimal_rate": {k: v["optimal_rate"] for k, v in rates.items()},
        "sft": {"steps": sft["steps"], "seconds": round(sft["seconds"], 1), "loss_last": sft["loss_last"]},
        "grpo": {
            k: m[k]
            for k in (
                "train/steps",
                "train/seconds_per_step",
                "train/reward_mean",
                "train/valid_rate",
                "train/zero_std_groups",
                "train/outside_loop_share",
            )
        },
    }
    print(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
