"""Does one stage learn a reasoning-gym task? The greedy valid rate per level on the task's fixed `val` split, for the
cached SFT warm start and after one stage from it, over seeds.

    python -m evals.bench.bench_rg --task rg:basic_arithmetic:num_terms=2-4,num_digits=1-2
    python -m evals.bench.bench_rg --task rg:count_bits --optimizer filtered --seeds 0,1,2 --json out.json
    python -m evals.bench.bench_rg --task ... --set max_steps=120 --set learning_rate=2e-5 --levels 1,3,5
    python -m evals.bench.bench_rg --preset rg-cpu --shares learnability --eval-per-level 100 --sampled 4 \
        --start-from uniform.json --json learnability.json     # the rg-cpu stage, learnability's shares

1. The warm start: `trainer.sft.build_warm_start` on fresh gold answers over every level (cached, keyed by
   model, settings, task and `--warm-seed`), exactly as a run's stage 0 builds it.
2. It answers `val` greedily (in-process, by `--sampler`: the bf16 rollout copy by default; every answer scored by
   the dataset's own scorer).
3. For each seed: one stage from the warm start on a fresh training set over `--levels` (every level unless
   given) in `--shares` (even, learnability's p(1-p) shares from the start's rates, or given), by `--optimizer`: `grpo` (`trainer.stage.run_stage`, as a run trains) or `filtered`
   (`trainer.filtered.train_filtered`: sample, keep verified answers, fine-tune on them). Then the same
   evaluation.

Printed: the rate per level before and after each seed, the gain per seed, the mean gain with a 95 % interval (a
two-way bootstrap over seeds and the `val` questions they share, `evals.intervals`), seconds per stage and per
step. `--preset` takes a preset's training settings (its warm start and stage, `rg-cpu`'s budget of sampled answers
included) instead of the bench's own; `--eval-per-level N` evaluates on N questions a level (the fixed val split,
then the test split, then fresh questions, none of which a stage trains on) instead of `val` alone. With `--sampled K`, the same for mean@K: K answers a question sampled at the stage's temperature. `--json` keeps every figure and every answer, rewritten after each seed; `--resume` skips finished seeds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

RG_CPU = {
    # the warm start: every level of the grid, gold answers, the top 8 blocks trained
    "sft_steps": 300,
    "sft_instances": 2400,
    "sft_batch_size": 8,
    # a stage: short answers, one prompt x 16 completions a step
    "max_completion_length": 16,
    "max_prompt_length": 256,
    "max_steps": 120,
    "prompt_style": "compact",
}


def evaluate(model_dir: Path, task, items, sampler, version: int, batch_size: int = 24, k: int = 0,
             temperature: float = 0.7) -> dict:
    """Greedy answers of the checkpoint in `model_dir` to `items`, verified, by `sampler` (a
    `trainer.filtered_sampling.FilteredSampler`, kept over the evaluations: a vLLM server reloads the checkpoint's
    weights, `version` telling it they are new). With `k`, also mean@k: `k` answers a question sampled at
    `temperature` (`trainer.greedy.sampled_valid_rate`)."""
    import functools

    from llm_backends.checkpoints import load_checkpoint
    from trainer.greedy import greedy_valid_rate, sampled_valid_rate

    model, tok = load_checkpoint(model_dir, dtype="float32")
    answer = functools.partial(sampler, version=version)
    r = greedy_valid_rate(model, tok, items, max_new_tokens=16, batch_size=batch_size, prompt_style="compact",
                          task=task, sampler=answer)
    if k:
        r["sampled"] = sampled_valid_rate(model, tok, items, sampler=answer, k=k, temperature=temperature,
                                          max_new_tokens=16, batch_size=batch_size, prompt_style="compact", task=task)
    return r


def _sampled_line(r: dict) -> str:
    s = r.get("sampled")
    return "" if not s else (f" | mean@{s['k']} at T {s['temperature']:g}: {100 * s['mean_at_k']:.1f} % | by level "
                             + " ".join(f"{k}:{100 * v:.0f}" for k, v in s["by_level"].items()))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m evals.bench.bench_rg", description=__doc__.split("\n\n")[0])
    p.add_argument("--task", required=True, help="rg:<dataset>[:attr=lo-hi,...]")
    p.add_argument("--preset", default=None,
                   help="the training settings of this preset (trainer.config.TRAIN_PRESETS: its warm start and stage; "
                        "--set still applies on top) instead of the bench's own; e.g. rg-cpu")
    p.add_argument("--optimizer", choices=("grpo", "filtered"), default=None,
                   help="the stage's optimiser (default: the preset's, else grpo)")
    p.add_argument("--seeds", default="0", help="comma list of stage seeds (default 0)")
    p.add_argument("--warm-seed", type=int, default=0)
    p.add_argument("--levels", default=None, help="comma list of levels the stage trains (default: every level)")
    p.add_argument("--shares", default="uniform",
                   help="the stage's level shares over --levels: uniform (default), learnability (p(1-p) of the start's "
                        "rates, mixed 20 %% uniform, as the learnability curriculum), or LEVEL:SHARE,... (e.g. 3:0.5,5:0.5)")
    p.add_argument("--instances", type=int, default=None,
                   help="training questions generated for the stage (default: the preset's instances_per_stage, else 256)")
    p.add_argument("--eval-per-level", type=int, default=None, metavar="N",
                   help="evaluate on N questions a level: the fixed val split, then test, then fresh ones (default: val)")
    p.add_argument("--start-from", type=Path, default=None, metavar="JSON",
                   help="take the start's evaluation from this bench file (same task, settings, questions and sampler) "
                        "instead of answering again")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a TrainConfig setting")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--no-stage", action="store_true", help="measure the warm start only")
    p.add_argument("--sampler", choices=("auto", "rollout", "generate", "vllm"), default="auto",
                   help="what answers the val questions (trainer/filtered_sampling.py): vllm (a server, each checkpoint "
                        "reloaded into it), rollout (the bf16 rollout copy), generate (transformers' generate on the "
                        "float32 model) or auto (default: vllm where its CPU build is installed, else rollout)")
    p.add_argument("--sampled", type=int, default=0, metavar="K",
                   help="also score K answers a val question sampled at --sampled-temperature (mean@K; 0: greedy only)")
    p.add_argument("--sampled-temperature", type=float, default=None,
                   help="temperature of those answers (default: the stage's training temperature)")
    a = p.parse_args(argv)

    from trainer.config import TrainConfig
    from trainer.filtered_sampling import FilteredSampler, resolve_sampler
    from trainer.task import load_task

    try:
        task = load_task(a.task)
    except ValueError as e:
        p.error(str(e))
    if a.preset is not None:
        from trainer.config import TRAIN_PRESETS

        if a.preset not in TRAIN_PRESETS:
            p.error(f"--preset {a.preset!r}: allowed: {', '.join(TRAIN_PRESETS)}")
        overrides = dict(TRAIN_PRESETS[a.preset])
    else:
        overrides = dict(RG_CPU)
    if a.optimizer is not None:
        overrides["optimizer"] = a.optimizer
    if a.instances is None:
        a.instances = overrides.get("instances_per_stage", 256) if a.preset else 256
    if a.eval_per_level is not None and a.eval_per_level < 1:
        p.error(f"--eval-per-level {a.eval_per_level}: allowed: 1 or more")
    for kv in a.set:
        k, eq, v = kv.partition("=")
        if not eq or not k:
            p.error(f"--set {kv!r}: allowed: KEY=VALUE with a TrainConfig field as KEY")
        try:
            overrides[k] = json.loads(v)  # numbers, true/false, lists
        except ValueError:
            overrides[k] = v  # text as it is
    try:
        cfg = TrainConfig(**overrides)
    except ValueError as e:
        from graph.settings import _first_error

        p.error(f"--set: {_first_error(e)}")
    temperature = cfg.temperature if a.sampled_temperature is None else a.sampled_temperature
    if a.sampled < 0 or (a.sampled and temperature <= 0):
        p.error(f"--sampled {a.sampled} at temperature {temperature}: allowed: K >= 0, and a temperature above 0")
    out: dict = json.loads(a.json.read_text()) if (a.resume and a.json and a.json.is_file()) else {}
    how = resolve_sampler(a.sampler)
    if out.get("sampler", "generate") != how and out.get("start"):  # files written before the flag: generate
        p.error(f"--resume with --sampler {a.sampler} ({how}): {a.json} was answered by "
                f"{out.get('sampler', 'generate')}; allowed: the same sampler")
    out["sampler"] = how
    if a.start_from is not None:
        if not a.start_from.is_file():
            p.error(f"--start-from {a.start_from}: no such file; allowed: a bench_rg --json file")
        donor = json.loads(a.start_from.read_text())
        want = {"task": a.task, "settings": cfg.model_dump(mode="json"), "sampler": how}
        differ = [k for k, v in want.items() if donor.get(k) != v] + ([] if donor.get("start") else ["start"])
        if differ:
            p.error(f"--start-from {a.start_from}: its {', '.join(differ)} differ(s) from this run's; allowed: a "
                    "finished start of the same task, settings and sampler")
        out.setdefault("start", donor["start"])
        out.setdefault("eval_ids", donor.get("eval_ids"))
    sampler = FilteredSampler(how)
    try:
        return _run(a, task, cfg, out, sampler, temperature, p)
    finally:
        sampler.close()


def eval_items(task, per_level: int | None) -> list:
    """The questions every checkpoint answers: the fixed `val` split, or with `per_level` N questions a level: the
    level's val questions, then its test ones, then fresh ones drawn avoiding both splits."""
    if per_level is None:
        return task.split("val")
    from env.rg_data import mix

    fixed = task.split("val") + task.split("test")
    seen = {i.question for i in fixed}
    out = []
    for lv in range(len(task.levels)):
        mine = [i for i in fixed if i.level == lv][:per_level]
        if len(mine) < per_level:
            mine += task.level_items(lv, per_level - len(mine), mix(11_000_027, lv), seen)
        out.extend(mine)
    return out


def stage_shares(spec: str, levels: list[int], task, start: dict, p) -> dict[int, float]:
    """`--shares` as level -> share over `levels`."""
    if spec == "uniform":
        return {lv: 1 / len(levels) for lv in levels}
    if spec == "learnability":
        import random

        from families.level_share import classic

        rates = {int(k): {"valid_rate": v} for k, v in start["by_level"].items() if int(k) in levels}
        cfg, _, _ = classic("learnability", task, {"levels": {str(lv): 1 / len(levels) for lv in levels}}, rates,
                            {}, random.Random(0))
        return {int(k): v for k, v in cfg["levels"].items() if int(k) in levels and v > 0}
    try:
        shares = {int(k): float(v) for k, v in (kv.split(":") for kv in spec.split(","))}
    except ValueError:
        shares = {}
    if not shares or any(lv not in range(len(task.levels)) or v < 0 for lv, v in shares.items()) \
            or sum(shares.values()) <= 0:
        p.error(f"--shares {spec!r}: allowed: uniform, learnability, or LEVEL:SHARE,... with levels 0-"
                f"{len(task.levels) - 1} and shares >= 0 adding to more than 0")
    total = sum(shares.values())
    return {lv: v / total for lv, v in shares.items() if v > 0}


def _run(a, task, cfg, out: dict, sampler, temperature: float, p) -> int:
    from env.rg import RgConfig
    from evals.intervals import crossed_interval
    from llm_backends.models import resolve_model
    from trainer.sft import build_warm_start, warm_start_levels

    val = eval_items(task, a.eval_per_level)
    ids = [task.item_id(i) for i in val]
    if out.get("eval_ids") not in (None, ids):
        p.error("--resume / --start-from: the file was answered on other questions; allowed: the same "
                "--eval-per-level")
    eval_qs = {i.question for i in val}
    base = resolve_model("smollm2-135m")
    out.update({"task": a.task, "optimizer": cfg.optimizer, "settings": cfg.model_dump(mode="json"),
                "levels": [lv.label for lv in task.levels], "eval_ids": ids, "eval_levels": [i.level for i in val]})
    out.setdefault("seeds", {})

    t0 = time.perf_counter()
    ws = build_warm_start(base, cfg, a.warm_seed, warm_start_levels(task, cfg), task=task)
    print(f"warm start: {ws['path']} ({'cached' if ws['hit'] else f'built in {time.perf_counter() - t0:.0f} s'})",
          flush=True)
    if "start" not in out:
        t0 = time.perf_counter()
        start = evaluate(Path(ws["path"]), task, val, sampler, -1, k=a.sampled, temperature=temperature)
        out["start"] = {"valid_rate": start["valid_rate"], "by_level": start["by_level"], "valid": start["valid"],
                        "failures": start["failures"], "answers": start.get("answers"),
                        "seconds": time.perf_counter() - t0, "sampled": start.get("sampled")}
        _save(a.json, out)
    start = out["start"]
    print(f"warm start on val ({len(val)}): {100 * start['valid_rate']:.1f} % | by level "
          + " ".join(f"{k}:{100 * v:.0f}" for k, v in start["by_level"].items()) + _sampled_line(start), flush=True)
    if a.no_stage:
        return 0

    levels = [int(x) for x in a.levels.split(",")] if a.levels else list(range(len(task.levels)))
    shares = stage_shares(a.shares, levels, task, start, p)
    if out.get("shares") not in (None, {str(k): v for k, v in shares.items()}):
        p.error(f"--resume with --shares {a.shares}: the file's stages trained other shares ({out['shares']}); "
                "allowed: the same --shares")
    out["shares"] = {str(k): v for k, v in shares.items()}
    print("stage shares: " + " ".join(f"{k}:{v:.3f}" for k, v in shares.items()), flush=True)
    for seed in [int(s) for s in a.seeds.split(",")]:
        if str(seed) in out["seeds"]:
            continue
        with tempfile.TemporaryDirectory(prefix="bench_rg_") as tmp:
            tmp = Path(tmp)
            items, _ = task.generate(RgConfig(levels=shares), a.instances, seed=1000 + seed)
            items = [i for i in items if i.question not in eval_qs]  # a fresh question may repeat an extra eval one
            train = tmp / "train.jsonl"
            train.write_text("".join(task.item_to_json(i) + "\n" for i in items))
            t0 = time.perf_counter()
            from trainer.stage import run_stage  # GRPO or filtered fine-tuning, as cfg.optimizer says

            res = run_stage(train_path=train, init_checkpoint=Path(ws["path"]), out_dir=tmp / "stage", cfg=cfg,
                            seed=seed, reward_state=None, warm_start=False, progress=False, task=task)
            secs = time.perf_counter() - t0
            after = evaluate(Path(res["checkpoint"]), task, val, sampler, seed, k=a.sampled, temperature=temperature)
        m = res["metrics"]
        steps = m.get("train/steps") or 1
        out["seeds"][str(seed)] = {"valid_rate": after["valid_rate"], "by_level": after["by_level"],
                                   "trained_on": len(items),
                                   "valid": after["valid"], "failures": after["failures"],
                                   "answers": after.get("answers"), "seconds": secs, "steps": steps,
                                   "metrics": {k: v for k, v in m.items() if isinstance(v, int | float)},
                                   "sampled": after.get("sampled")}
        _save(a.json, out)
        print(f"seed {seed}: {100 * after['valid_rate']:.1f} % ({100 * (after['valid_rate'] - start['valid_rate']):+.1f})"
              f" in {secs:.0f} s ({secs / steps:.1f} s/step) | by level "
              + " ".join(f"{k}:{100 * v:.0f}" for k, v in after["by_level"].items()) + _sampled_line(after), flush=True)
    seeds = sorted(out["seeds"], key=int)
    gains = [out["seeds"][s]["valid_rate"] - start["valid_rate"] for s in seeds]
    if gains:
        lo, hi = crossed_interval([[int(x) - int(y) for x, y in zip(out["seeds"][s]["valid"], start["valid"],
                                                                     strict=True)] for s in seeds])
        print(f"mean gain over {len(gains)} seed(s): {100 * statistics.fmean(gains):+.1f} points, 95 % interval "
              f"[{100 * lo:+.1f}, {100 * hi:+.1f}] (two-way bootstrap: seeds and the val questions)", flush=True)
    sampled = [s for s in seeds if out["seeds"][s].get("sampled")]
    if sampled and start.get("sampled"):
        k0, before = start["sampled"]["k"], start["sampled"]["valid_counts"]
        rows = [[(x - y) / k0 for x, y in zip(out["seeds"][s]["sampled"]["valid_counts"], before, strict=True)]
                for s in sampled]
        lo, hi = crossed_interval(rows)
        gain = statistics.fmean(statistics.fmean(r) for r in rows)
        print(f"mean@{k0} gain over {len(rows)} seed(s): {100 * gain:+.1f} points, 95 % interval [{100 * lo:+.1f}, "
              f"{100 * hi:+.1f}] (two-way bootstrap: seeds and the val questions; {k0} samples a question)", flush=True)
    return 0


def _save(path: Path | None, obj: dict) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(obj, indent=1) + "\n")
        tmp.replace(path)


if __name__ == "__main__":
    sys.exit(main())
