"""Does the cpu preset learn? Valid rate of the embedded model on 2-agent val sizes 3..5 at three points.

    python -m evals.bench.bench_learning                    # cpu preset
    python -m evals.bench.bench_learning --grpo-steps 4 --sft-steps 12 --instances 48
    python -m evals.bench.bench_learning --sft-sizes 3 --sft-steps 30 --grpo-sizes 3

1. the base model (before the warm start), 2. after the SFT warm start, 3. after GRPO from the warm-started
model. Training data: fresh 2-agent instances (hole 0.2, wait 0.5) of `--sft-sizes` for the warm start and
of `--grpo-sizes` for GRPO (default 3..5 for both); evaluation: the fixed `val-mini` split (2 agents, sizes
3, 4, 5; greedy answers, every answer verified by `env.verify`), with the valid rate per size.
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
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="override any TrainConfig field (JSON value), e.g. --set temperature=0.7")
    p.add_argument("--sft-sizes", default="3,4,5", help="grid sizes of the warm-start instances (comma list)")
    p.add_argument("--grpo-sizes", default="3,4,5", help="grid sizes of the GRPO instances (comma list)")
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
    for item in a.set:
        key, sep, value = item.partition("=")
        if not sep or key not in TrainConfig.model_fields:
            p.error(f"--set {item!r}: expected FIELD=VALUE with FIELD one of TrainConfig's fields")
        try:
            raw[key] = json.loads(value)
        except json.JSONDecodeError:
            raw[key] = value
    cfg = TrainConfig.model_validate(raw)
    val = [x for x in load_split("val-mini") if x.size <= 5][: a.limit]
    def only(sizes_arg: str) -> EnvConfig:
        sizes = {int(x) for x in sizes_arg.split(",")}
        return EnvConfig.model_validate({"sizes": {
            s: {"data_ratio": 1 / len(sizes) if s in sizes else 0.0, "hole_ratio": 0.2, "wait_ratio": 0.5}
            for s in SIZES}})

    n_train = a.instances or cfg.instances_per_stage
    sft_train = generate(only(a.sft_sizes), n_train, seed=1000 + a.seed).instances
    train = generate(only(a.grpo_sizes), n_train, seed=2000 + a.seed).instances
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
        sft = warm_start(model, tok, sft_train, cfg=cfg, out_dir=Path(tmp), seed=a.seed, progress=False)
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
        "sft_sizes": a.sft_sizes,
        "grpo_sizes": a.grpo_sizes,
        "valid_rate": {k: v["valid_rate"] for k, v in rates.items()},
        "valid_rate_by_size": {k: v["by_size"] for k, v in rates.items()},
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
