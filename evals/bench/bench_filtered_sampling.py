"""The filtered stage's samplers, side by side in one run: samples per second of each, weight syncs included.

    python -m evals.bench.bench_filtered_sampling
    python -m evals.bench.bench_filtered_sampling --samplers generate,rollout --rounds 3 --stage-steps 4 --json out.json

Each sampler of `trainer.filtered_sampling` (`generate`: transformers' generate on the float32 model, the stage's
sampler before; `rollout`: GRPO's bf16 rollout copy; `vllm`: the vLLM server, weights reloaded every round) answers
the same `--rounds` rounds of the preset's shape (`rg-cpu`: 32 prompts x 8 answers of at most 16 tokens at
temperature 0.7) on fresh questions of `--task`, from the same weights (the preset's SFT warm start unless `--checkpoint`: the answers then have the length and
format of a stage's). Every round counts as one after an
optimiser step: the sampler syncs the weights anew (the rollout copy copies them, the vLLM server saves and reloads
them), and that time is part of its samples/s. The vLLM server's start-up, once a stage, is printed apart.

With `--stage-steps N` it then runs a whole filtered stage of N optimiser steps (`trainer.stage.run_stage`,
the preset's settings otherwise) once with each in-process sampler, from the same start and seed, and prints the
seconds of each and their ratio. With `--stage-samples N` the stage is the preset's kind instead, a budget of N
sampled answers (`rg-cpu`: 7,680), run once with every sampler (the vLLM server's start and weight reloads
included): the whole-stage ratio.

    python -m evals.bench.bench_filtered_sampling --samplers generate,vllm --rounds 1 --stage-samples 1024

Printed: per sampler, samples/s over the rounds, seconds per round, weight-sync seconds per round, the share of
samples the task verifies, and each sampler's speed-up over `generate`. Timings on a shared machine move with its
load: compare the ratios of one run, not figures of different runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

TASK = "rg:basic_arithmetic:num_terms=2-4,num_digits=1-2"


def _items(task, n: int, seed: int) -> list:
    from env.rg import RgConfig

    levels = list(range(len(task.levels)))
    items, _ = task.generate(RgConfig(levels={lv: 1 / len(levels) for lv in levels}, num_instances=n), n, seed=seed)
    return items


def _rounds(samplers: list[str], model, tok, task, rounds: list[list], cfg, log_dir: Path) -> list[dict]:
    """Each round answered by every sampler in turn (so that the machine's load moves all of them alike)."""
    from contextlib import ExitStack

    from trainer.filtered_sampling import FilteredSampler

    with ExitStack() as stack:
        made = [stack.enter_context(FilteredSampler(how, log_dir=log_dir)) for how in samplers]
        for sampler in made:
            if sampler.how == "vllm":  # the server's start-up, once a stage, apart from the rounds
                sampler(model, tok, [task.prompt(rounds[0][0], cfg.prompt_style)], n=1, temperature=cfg.temperature,
                        max_new_tokens=2, version=-1)
        seconds = {s.label: [] for s in made}
        valid = {s.label: 0 for s in made}
        total = {s.label: 0 for s in made}
        for r, chunk in enumerate(rounds):
            for sampler in made:
                t0 = time.perf_counter()
                answers = sampler(model, tok, [task.prompt(it, cfg.prompt_style) for it in chunk],
                                  n=cfg.num_generations, temperature=cfg.temperature,
                                  max_new_tokens=cfg.max_completion_length, version=r)
                seconds[sampler.label].append(time.perf_counter() - t0)
                valid[sampler.label] += sum(task.verify(it, a).valid for it, outs in zip(chunk, answers, strict=True)
                                            for a in outs)
                total[sampler.label] += sum(len(outs) for outs in answers)
                print(f"  round {r + 1}/{len(rounds)}, {sampler.label}: {seconds[sampler.label][-1]:.1f} s", flush=True)
        rows = []
        for sampler in made:
            sec, n = seconds[sampler.label], total[sampler.label]
            rows.append({"sampler": sampler.label, "samples": n, "seconds": sum(sec), "round_seconds": sec,
                         "samples_per_s": n / sum(sec), "sync_seconds": sampler.sync_seconds, "syncs": sampler.syncs,
                         "sync_seconds_per_round": sampler.sync_seconds / max(1, sampler.syncs),
                         "start_seconds": sampler.start_seconds,
                         "valid": valid[sampler.label] / max(1, n)})
        return rows


def _stage(how: str, start: Path, task_name: str, items: list, task, cfg, steps: int, tmp: Path,
           samples: int = 0) -> dict:
    from trainer.stage import run_stage  # the stage a run trains (the preset's optimiser: filtered)

    out = tmp / f"stage-{how}"
    out.mkdir()
    train = out / "train.jsonl"
    train.write_text("".join(task.item_to_json(i) + "\n" for i in items))
    stage_cfg = cfg.model_copy(update={"max_steps": steps, "stage_samples": samples, "filtered_sampler": how,
                                       "optimizer": "filtered"})
    t0 = time.perf_counter()
    res = run_stage(train_path=train, init_checkpoint=start, out_dir=out, cfg=stage_cfg, seed=0, reward_state=None,
                    task=task_name, progress=False, warm_start=False)
    m = res["metrics"]
    return {"sampler": m["train/sampler"], "seconds": time.perf_counter() - t0, "steps": m["train/steps"],
            "rounds": m["train/rounds"], "completions": m["train/completions"], "kept": m["train/kept"]}


def main(argv: list[str] | None = None) -> int:
    from trainer.filtered_sampling import SAMPLERS

    p = argparse.ArgumentParser(prog="python -m evals.bench.bench_filtered_sampling",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default=TASK, help=f"the questions (default {TASK})")
    p.add_argument("--preset", default="rg-cpu", help="training preset whose round shape is sampled (default rg-cpu)")
    p.add_argument("--checkpoint", type=Path, default=None,
                   help="the policy (default: the preset's SFT warm start on --task, built and cached as a run builds it)")
    p.add_argument("--warm-steps", type=int, default=None,
                   help="SFT steps of that warm start (default: the preset's sft_steps; fewer for a quicker look: the "
                        "start then answers in the task's format, but less often right)")
    p.add_argument("--samplers", default="generate,rollout,vllm",
                   help=f"comma list of samplers, the first one the reference of the ratios (of {', '.join(SAMPLERS)})")
    p.add_argument("--rounds", type=int, default=3, help="rounds each sampler answers (default 3)")
    p.add_argument("--stage-steps", type=int, default=0,
                   help="also time a whole stage of this many optimiser steps with each in-process sampler (0: no)")
    p.add_argument("--stage-samples", type=int, default=0,
                   help="also time a whole stage of this budget of sampled answers with every sampler (0: no)")
    p.add_argument("--json", type=Path, default=None, help="also write every figure here")
    a = p.parse_args(argv)
    samplers = [s.strip() for s in a.samplers.split(",") if s.strip()]
    for s in samplers:
        if s not in SAMPLERS:
            p.error(f"--samplers {s}: allowed: {', '.join(SAMPLERS)}")
    if a.rounds < 1:
        p.error(f"--rounds {a.rounds}: allowed: 1 or more")
    if a.warm_steps is not None and a.warm_steps < 1:
        p.error(f"--warm-steps {a.warm_steps}: allowed: 1 or more")
    if a.stage_steps < 0:
        p.error(f"--stage-steps {a.stage_steps}: allowed: 0 (no stage) or more")
    if a.stage_samples < 0 or (a.stage_samples and a.stage_steps):
        p.error(f"--stage-samples {a.stage_samples}: allowed: 0 (no stage) or more, and not with --stage-steps")

    import torch

    from llm_backends.checkpoints import load_checkpoint
    from llm_backends.models import resolve_model
    from trainer.config import TRAIN_PRESETS, TrainConfig
    from trainer.task import load_task

    if a.preset not in TRAIN_PRESETS:
        p.error(f"--preset {a.preset}: allowed: {', '.join(TRAIN_PRESETS)}")
    cfg = TrainConfig.model_validate(TRAIN_PRESETS[a.preset])
    task = load_task(a.task)
    if a.checkpoint is not None:
        start = a.checkpoint
    else:
        from trainer.sft import build_warm_start, warm_start_levels

        warm = cfg.model_copy(update={"sft_steps": a.warm_steps}) if a.warm_steps is not None else cfg
        t0 = time.perf_counter()
        ws = build_warm_start(resolve_model(), warm, 0, warm_start_levels(task, warm), task=task, progress=False)
        start = Path(ws["path"])
        print(f"warm start of {warm.sft_steps} SFT steps: {'cached' if ws['hit'] else 'built'} {start} "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
    shape = cfg.filtered_prompts * cfg.num_generations
    pool = _items(task, cfg.filtered_prompts * a.rounds, seed=0)
    rounds = [pool[i * cfg.filtered_prompts:(i + 1) * cfg.filtered_prompts] for i in range(a.rounds)]
    model, tok = load_checkpoint(start, dtype="float32", trainable=True)
    print(f"{a.task}, preset {a.preset}: {a.rounds} rounds of {cfg.filtered_prompts} prompts x {cfg.num_generations} "
          f"answers ({shape} samples) of at most {cfg.max_completion_length} tokens at T {cfg.temperature}; "
          f"{torch.get_num_threads()} threads; weights synced before every round", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-filtered-") as tmp:
        rows = _rounds(samplers, model, tok, task, rounds, cfg, Path(tmp) / "logs")
        ref = rows[0]["samples_per_s"]
        print(f"\n{'sampler':<26}{'samples/s':>10}{'x ' + rows[0]['sampler']:>24}{'s/round':>9}"
              f"{'sync s/round':>14}{'start s':>9}{'valid':>8}")
        for r in rows:
            print(f"{r['sampler']:<26}{r['samples_per_s']:>10.1f}{r['samples_per_s'] / ref:>24.2f}"
                  f"{statistics.fmean(r['round_seconds']):>9.1f}{r['sync_seconds_per_round']:>14.2f}"
                  f"{r['start_seconds']:>9.0f}{r['valid']:>8.1%}")
        stages = []
        if a.stage_steps or a.stage_samples:
            staged = [s for s in samplers if s != "vllm"] if a.stage_steps else samplers
            items = _items(task, cfg.instances_per_stage, seed=1)
            what = f"{a.stage_steps} steps" if a.stage_steps else f"{a.stage_samples} sampled answers"
            for how in staged:
                print(f"  a stage of {what}, {how} ...", flush=True)
                stages.append(_stage(how, Path(start), a.task, items, task, cfg, a.stage_steps, Path(tmp),
                                     a.stage_samples))
            print(f"\n{'stage sampler':<26}{'seconds':>9}{'steps':>7}{'rounds':>8}{'samples':>9}{'kept':>6}"
                  f"{'x first':>9}{'x first, per round':>20}")
            for s in stages:
                per_round = (stages[0]['seconds'] / stages[0]['rounds']) / (s['seconds'] / s['rounds'])
                print(f"{s['sampler']:<26}{s['seconds']:>9.0f}{s['steps']:>7}{s['rounds']:>8}{s['completions']:>9}"
                      f"{s['kept']:>6}{stages[0]['seconds'] / s['seconds']:>9.2f}{per_round:>20.2f}")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps({"task": a.task, "preset": a.preset, "checkpoint": str(start),
                                      "threads": torch.get_num_threads(), "samplers": rows, "stages": stages},
                                     indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
