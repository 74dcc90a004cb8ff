"""Does the cpu preset learn? Valid rate of the embedded model on the 2-agent `val` sizes 3..5 at three points.

    python -m evals.bench.bench_learning                    # cpu preset: its own warm start, then GRPO
    python -m evals.bench.bench_learning --quick            # sanity run of every step (~2 min on 2 cores)
    python -m evals.bench.bench_learning --grpo-steps 4 --sft-steps 12 --instances 48
    python -m evals.bench.bench_learning --sft-sizes 3,4,5 --grpo-sizes 3 --set temperature=0.7

1. the base model (before the warm start), 2. after the SFT warm start, 3. after GRPO from the warm-started
model. The warm start is the preset's own (`nodes.sft.warm_start_instances(cfg.sft_sizes, cfg.sft_instances,
seed)`, as `nodes.train_stage.run_stage` draws it; `--sft-sizes` overrides the sizes). GRPO trains on fresh
2-agent instances (hole 0.2, wait 0.5) of `--grpo-sizes` (default 3..5). Evaluation: every instance of the
fixed `val` split of sizes 3, 4 and 5 (25 each, 75 in all; greedy answers, each verified by `env.verify`).

Printed: the valid rate per size at the three points, seconds per GRPO step, and the share of wall time spent
outside TRL's training loops (`trainer.train()`), for the SFT phase, for the GRPO stage and for both together
as one real stage would run them (load, warm start, GRPO, checkpoint; target <= 5%). Evaluations and the
bench's own hand-over of the warm-started model to `run_stage` (a save, not part of a real stage) are left
out of those shares and printed apart.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

VAL_SIZES = (3, 4, 5)
QUICK = {  # a short sanity run: every step once, tiny lengths (explicit flags still win)
    "sft_steps": 2,
    "sft_instances": 8,
    "max_steps": 1,
    "instances_per_stage": 4,
    "max_completion_length": 32,
}


def main(argv: list[str] | None = None) -> dict:
    from nodes.train_stage import TRAIN_PRESETS

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="cpu", choices=sorted(TRAIN_PRESETS))
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--quick", action="store_true",
                   help="sanity run: 2 SFT steps, 1 GRPO step, 2 val instances per size, short answers")
    p.add_argument("--instances", type=int, default=None, help="GRPO training instances (default: preset)")
    p.add_argument("--sft-steps", type=int, default=None, help="override the preset's SFT length")
    p.add_argument("--grpo-steps", type=int, default=None, help="override the preset's GRPO steps")
    p.add_argument("--max-new-tokens", type=int, default=None, help="greedy answer limit (default 128)")
    p.add_argument("--per-size", type=int, default=None,
                   help="evaluate only the first N val instances of each size (default: all 25)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="override any TrainConfig field (JSON value), e.g. --set temperature=0.7")
    p.add_argument("--sft-sizes", default=None,
                   help="grid sizes of the warm-start instances (comma list; default: the preset's sft_sizes)")
    p.add_argument("--grpo-sizes", default="3,4,5", help="grid sizes of the GRPO instances (comma list)")
    a = p.parse_args(argv)

    from env import SIZES, EnvConfig, generate, load_split, write_jsonl
    from llm.models import resolve_model
    from nodes.sft import greedy_valid_rate, warm_start, warm_start_instances
    from nodes.train_stage import (
        TrainConfig,
        _lora_config,
        freeze_lower_layers,
        load_checkpoint,
        run_stage,
        wants_lora,
    )

    raw = dict(TRAIN_PRESETS[a.preset])
    if a.quick:
        raw.update(QUICK)
    if a.sft_steps is not None:
        raw["sft_steps"] = a.sft_steps
    if a.grpo_steps is not None:
        raw["max_steps"] = a.grpo_steps
    if a.instances is not None:
        raw["instances_per_stage"] = a.instances
    if a.sft_sizes is not None:
        raw["sft_sizes"] = a.sft_sizes
    for item in a.set:
        key, sep, value = item.partition("=")
        if not sep or key not in TrainConfig.model_fields:
            p.error(f"--set {item!r}: expected FIELD=VALUE with FIELD one of TrainConfig's fields")
        try:
            raw[key] = json.loads(value)
        except json.JSONDecodeError:
            raw[key] = value
    cfg = TrainConfig.model_validate(raw)
    per_size = a.per_size if a.per_size is not None else (2 if a.quick else None)
    max_new_tokens = a.max_new_tokens or (48 if a.quick else 128)

    val = []
    for size in VAL_SIZES:
        val += [x for x in load_split("val") if x.size == size][:per_size]

    grpo_sizes = {int(x) for x in a.grpo_sizes.split(",")}
    grpo_cfg = EnvConfig.model_validate({"sizes": {
        s: {"data_ratio": 1 / len(grpo_sizes) if s in grpo_sizes else 0.0, "hole_ratio": 0.2, "wait_ratio": 0.5}
        for s in SIZES}})
    train = generate(grpo_cfg, cfg.instances_per_stage, seed=2000 + a.seed).instances
    rates: dict[str, dict] = {}

    def score(name: str, model, tok) -> None:
        t = time.perf_counter()
        rates[name] = greedy_valid_rate(model, tok, val, max_new_tokens=max_new_tokens)
        rates[name]["eval_seconds"] = round(time.perf_counter() - t, 1)
        print(name, json.dumps({k: rates[name][k] for k in ("valid_rate", "by_size", "failures", "eval_seconds")}),
              flush=True)

    model, tok = load_checkpoint(resolve_model(a.model))
    score("before_warm_start", model, tok)
    with tempfile.TemporaryDirectory() as tmp:
        # The SFT phase as run_stage runs it after loading: LoRA or layer freezing, the warm-start draw, SFT.
        t0 = time.perf_counter()
        if wants_lora(cfg.lora, sum(q.numel() for q in model.parameters())):
            from peft import get_peft_model

            model = get_peft_model(model, _lora_config(cfg))
        elif cfg.train_layers:
            freeze_lower_layers(model, cfg.train_layers)
        sft_data = warm_start_instances(cfg.sft_sizes, cfg.sft_instances, a.seed) if cfg.sft_sizes else train
        sft = warm_start(model, tok, sft_data, cfg=cfg, out_dir=Path(tmp), seed=a.seed, progress=False)
        sft_wall = time.perf_counter() - t0
        score("after_warm_start", model, tok)
        t1 = time.perf_counter()
        sft_dir = Path(tmp) / "sft_model"
        model.save_pretrained(sft_dir)
        tok.save_pretrained(sft_dir)
        handover_s = time.perf_counter() - t1
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
    sft_out = sft_wall - sft["seconds"]
    stage_wall = sft_wall + m["train/seconds"]
    stage_out = sft_out + m["train/outside_loop_seconds"]
    summary = {
        "preset": a.preset,
        "quick": a.quick,
        "val_instances": len(val),
        "val_sizes": list(VAL_SIZES),
        "sft_sizes": cfg.sft_sizes,
        "sft_instances": len(sft_data),
        "grpo_sizes": sorted(grpo_sizes),
        "grpo_instances": len(train),
        "valid_rate": {k: v["valid_rate"] for k, v in rates.items()},
        "valid_rate_by_size": {k: v["by_size"] for k, v in rates.items()},
        "optimal_rate": {k: v["optimal_rate"] for k, v in rates.items()},
        "sft": {
            "steps": sft["steps"],
            "loop_seconds": round(sft["seconds"], 1),
            "wall_seconds": round(sft_wall, 1),
            "outside_loop_seconds": round(sft_out, 1),
            "outside_loop_share": sft_out / sft_wall,
            "loss": sft["loss"],
            "loss_last": sft["loss_last"],
        },
        "grpo": {
            k: m[k]
            for k in (
                "train/steps",
                "train/seconds_per_step",
                "train/grpo_seconds",
                "train/seconds",
                "train/outside_loop_seconds",
                "train/outside_loop_share",
                "train/reward_mean",
                "train/valid_rate",
                "train/zero_std_groups",
            )
        },
        "stage": {
            "wall_seconds": round(stage_wall, 1),
            "outside_loop_seconds": round(stage_out, 1),
            "outside_loop_share": stage_out / stage_wall,
            "bench_handover_seconds": round(handover_s, 1),
            "eval_seconds": {k: v["eval_seconds"] for k, v in rates.items()},
        },
    }
    print(json.dumps(summary, indent=2))
    print(table(summary))
    return summary


def table(s: dict) -> str:
    """The headline figures as a small text table."""
    names = {"before_warm_start": "before warm start", "after_warm_start": "after warm start",
             "after_grpo": "after GRPO"}
    head = f"valid rate on val ({s['val_instances']} instances)"
    w = len(head) + 1
    lines = [head.ljust(w) + "".join(f"{f'{n}x{n}':>8}" for n in s["val_sizes"]) + f"{'all':>8}"]
    for key, label in names.items():
        by = s["valid_rate_by_size"][key]
        lines.append(label.ljust(w) + "".join(f"{by.get(n, float('nan')):8.3f}" for n in s["val_sizes"])
                     + f"{s['valid_rate'][key]:8.3f}")
    g, sft, st = s["grpo"], s["sft"], s["stage"]
    sps = g["train/seconds_per_step"]
    lines += [
        f"GRPO: {g['train/steps']} steps, {sps if sps is None else round(sps, 1)} s/step",
        f"outside TRL's loops: SFT phase {sft['outside_loop_seconds']} of {sft['wall_seconds']} s "
        f"({sft['outside_loop_share']:.1%}); GRPO stage {g['train/outside_loop_seconds']:.1f} of "
        f"{g['train/seconds']:.1f} s ({g['train/outside_loop_share']:.1%}); "
        f"whole stage {st['outside_loop_seconds']} of {st['wall_seconds']} s ({st['outside_loop_share']:.1%}, "
        "target <= 5%)",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
