"""Does a cpu-preset GRPO stage learn? Greedy valid rate on 2-agent maps of sizes 3-5, before and after, over seeds.

    python -m evals.bench.bench_learning                        # cpu preset, seeds 0,1,2, all 150 val-small
    python -m evals.bench.bench_learning --quick                # a sanity run of every step (minutes)
    python -m evals.bench.bench_learning --preset cpu-long      # its 96-step stage on 3x3/4x4 (about 45 min a seed)
    python -m evals.bench.bench_learning --seeds 0,1,2,3,4 --grpo-steps 20 --set learning_rate=1e-4
    python -m evals.bench.bench_learning --pool a.json b.json   # the seeds of two runs of one experiment, pooled
    python -m evals.bench.bench_learning --json a.json --resume # after a stop: keep a.json's finished seeds
    python -m evals.bench.bench_learning --answers a.jsonl      # also every greedy answer, to see what flipped
    python -m evals.bench.bench_learning --plan plans/x.yaml    # a committed plan: its seeds, its commit recorded

With `--json`, the file is rewritten after every seed, so a stopped bench keeps its finished seeds; `--resume`
reads them back (refused if the file's settings, split or warm start differ) and trains only the missing ones.

1. The preset's cached SFT warm start (`trainer.sft.build_warm_start`, keyed by model, settings and
   `--warm-seed`): built once, reused by every later call, as a run's stage 0 reuses it.
2. The warm-started policy answers the evaluation split greedily (in-process, every answer verified).
3. For each GRPO seed: one cpu-preset GRPO stage from the warm start (`trainer.stage.run_stage`, exactly
   as a run's stage 0 trains after its warm start) on fresh 2-agent instances of `--grpo-sizes` and
   `--grpo-holes` (hole ratio 0.2 unless asked; only those of optimal makespan `--grpo-min-makespan` or more if
   asked), then the same evaluation.

Printed: the valid rate per size before and after each seed's stage, the gain per seed, the mean gain with two
95 % intervals (a two-way bootstrap: seeds, and once for all of them the instances they share; and Student's t
over the seeds' gains), the mean gain
within each hole ratio of the evaluation maps, GRPO's
reward-variance figures (share of zero-variance groups generated and trained on, groups replaced by dynamic
sampling), and seconds per step. The gain is measured on answers re-verified by `env.verify`, never on training
rewards.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

from evals.bench import start_answers
from evals.intervals import crossed_interval, t_interval
from families.metrics import upgrade_metrics

GRPO_SIZES = {"cpu-long": "3,4"}  # the bench's default GRPO sizes per preset (--grpo-sizes)
INTERVAL = ("95 % two-way bootstrap: each draw takes the seeds with replacement and, once for all of them, the "
            "instances they share (evals.intervals.crossed_interval)")
QUICK = {"sft_steps": 2, "sft_instances": 8, "max_steps": 1, "instances_per_stage": 8, "max_completion_length": 32}


def training_draw(sizes: set[int], n: int, seed: int, holes: tuple[float, ...] = (0.2,),
                  min_makespan: int = 0) -> list:
    """The `n` fresh 2-agent instances a GRPO seed trains on: spread evenly over `sizes`, wait 0.5, hole ratio 0.2;
    with several `holes`, an even share of `n` per hole ratio (each capped by `env.max_hole_ratio`, as the
    validation splits cap theirs; largest remainders to the first ratios), interleaved. One ratio keeps the draw of
    the first benches on, instance for instance. `min_makespan` > 0 keeps only instances whose optimal makespan is at least
    that, as many of each size as the plain draw holds, in its order of sizes (the generator lists its instances
    by size), drawing further batches (seeds of their own) until each size's share is full."""
    from env import SIZES, EnvConfig, generate, max_hole_ratio

    def draw_all(hole: float, k: int, s_: int) -> list:
        cfg = EnvConfig.model_validate({"sizes": {
            s: {"data_ratio": 1 / len(sizes) if s in sizes else 0.0, "hole_ratio": min(hole, max_hole_ratio(s)),
                "wait_ratio": 0.5} for s in SIZES}})
        return generate(cfg, k, seed=s_).instances

    def draw(hole: float, k: int, s_: int) -> list:
        plain = draw_all(hole, k, s_)
        if min_makespan <= 0:
            return plain
        need = Counter(x.size for x in plain)  # the plain draw's sizes, kept: each size's share filled on its own
        found: dict[int, list] = {size: [] for size in need}
        for extra in range(64):
            for x in draw_all(hole, 4 * k, s_ + 7_919 * (extra + 1)):
                if x.optimal_makespan >= min_makespan and x.size in found:
                    found[x.size].append(x)
            if all(len(found[size]) >= n for size, n in need.items()):
                return [found[x.size].pop(0) for x in plain]  # in the plain draw's order of sizes
        short = {size: f"{len(found[size])} of {n}" for size, n in need.items() if len(found[size]) < n}
        raise ValueError(f"--grpo-min-makespan {min_makespan}: found only {short} instances (by size) with an "
                         f"optimal makespan that long at hole ratio {hole}; allowed: a smaller value")

    if len(holes) == 1:
        return draw(holes[0], n, 2000 + seed)
    shares = [n // len(holes) + (j < n % len(holes)) for j in range(len(holes))]
    parts = [draw(h, k, 2000 + seed + 100_000 * (j + 1)) for j, (h, k) in enumerate(zip(holes, shares, strict=True))
             if k]
    return [x for group in itertools.zip_longest(*parts) for x in group if x is not None]


def evaluation_set(split: str, per_size: int | None = None) -> list:
    """The bench's evaluation instances: the split's sizes 3, 4, 5 in that order, the first `per_size` of each."""
    from env import load_split

    every = load_split(split)
    return [x for s in (3, 4, 5) for x in [i for i in every if i.size == s][:per_size]]


def eval_holes(val: list) -> list[float] | None:
    """The evaluation maps' hole ratios in answer order (the by-hole line of `table`), None unless all are tagged."""
    return [x.tags["hole"] for x in val] if all("hole" in (x.tags or {}) for x in val) else None


def parse_holes(text: str) -> tuple[float, ...]:
    """`0.1,0.3` -> (0.1, 0.3); ValueError naming the value unless each is a hole ratio in [0, 0.5]."""
    try:
        holes = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        holes = ()
    if not holes or any(not 0 <= h <= 0.5 for h in holes):
        raise ValueError(f"--grpo-holes {text!r}: allowed: hole ratios in [0, 0.5] as a comma list, e.g. 0.2 or "
                         "0.1,0.2,0.3,0.4,0.5 (val-small's cycle)")
    return holes


def main(argv: list[str] | None = None) -> dict:
    from trainer.config import TRAIN_PRESETS

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="cpu", choices=sorted(TRAIN_PRESETS))
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--quick", action="store_true", help="sanity run: 2 SFT steps, 1 GRPO step, 2 answers per size")
    p.add_argument("--seeds", default=None, help="GRPO seeds (comma list; default 0,1,2, or the plan's)")
    p.add_argument("--plan", type=Path, default=None, metavar="FILE",
                   help="a committed plan (YAML or JSON: arm, seeds, success; evals/plan.py): refused unless git has "
                   "it committed without changes; its seeds are run and its commit is recorded in --json")
    p.add_argument("--warm-seed", type=int, default=0, help="seed of the (cached) warm start shared by every seed")
    p.add_argument("--split", default="val-small", help="evaluation split (2-agent; sizes 3-5 are used)")
    p.add_argument("--per-size", type=int, default=None, help="evaluate only the first N instances of each size")
    p.add_argument("--grpo-steps", type=int, default=None, help="override the preset's GRPO steps")
    p.add_argument("--grpo-sizes", default=None, help="grid sizes of the GRPO instances (comma list; default 3,4 for "
                   "cpu-long, where its figures were measured, else 3,4,5)")
    p.add_argument("--grpo-holes", default="0.2", help="hole ratios of the GRPO instances (comma list, an even share "
                   "each; 0.1,0.2,0.3,0.4,0.5 is val-small's cycle)")
    p.add_argument("--grpo-min-makespan", type=int, default=0, metavar="K",
                   help="train only on instances whose optimal makespan is at least K (0: every instance; the "
                   "start is valid on 50 %% of val-small's makespan-1 maps and on none of makespan 5 or more)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="greedy answer limit (default: the preset's)")
    p.add_argument("--sampler", choices=("auto", "rollout", "generate", "vllm"), default="rollout", help="what answers "
                   "greedily (trainer/filtered_sampling.py; default: the bf16 rollout copy; auto: vllm where installed)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="override any TrainConfig field (JSON value), e.g. --set learning_rate=1e-4")
    p.add_argument("--json", type=Path, default=None,
                   help="also write the figures to this file, rewritten after every seed")
    p.add_argument("--resume", action="store_true",
                   help="keep the seeds already in --json (same settings, split and warm start) and train only the "
                   "missing ones")
    p.add_argument("--answers", type=Path, default=None, metavar="JSONL",
                   help="also append every greedy answer to this file, one line each: {who: 'warm start' or the "
                   "GRPO seed, id, answer, failure} (appended: a --resume adds the start's answers again, then its "
                   "new seeds')")
    p.add_argument("--no-start-cache", action="store_true", help="answer with the warm start again even if this "
                   "machine kept its answers (evals/bench/start_answers.py: kept per weights, split, CPU; re-verified)")
    p.add_argument("--keep-checkpoints", type=Path, default=None, metavar="DIR",
                   help="also keep each seed's trained checkpoint as DIR/seed_N (to answer with it again later)")
    p.add_argument("--pool", type=Path, nargs="+", default=None, metavar="JSON",
                   help="no training: pool the seeds of earlier --json files (same warm start, split and settings) "
                   "into one summary with intervals over all their seeds")
    a = p.parse_args(argv)
    plan = None
    if a.plan is not None:
        from evals.plan import PlanError, check_seeds, confirm

        try:
            if a.pool:
                raise PlanError(f"--plan {a.plan} with --pool: a plan is confirmed before a run starts; allowed: "
                                "--plan with a training run")
            plan = confirm(a.plan)
            if a.seeds is not None:
                check_seeds(plan, [int(s) for s in a.seeds.split(",")])
        except PlanError as e:
            p.error(str(e))
        a.seeds = ",".join(str(s) for s in plan["seeds"])
    a.seeds = a.seeds or "0,1,2"
    if a.resume and (a.pool or a.json is None):
        p.error("--resume: needs --json FILE (the file whose finished seeds are kept) and no --pool")
    if a.pool:
        try:
            summary = pool(a.pool)
        except (OSError, ValueError, KeyError) as e:
            p.error(f"--pool: {e}")
        print(json.dumps({k: v for k, v in summary.items() if k != "seeds"}, indent=2))
        print(table(summary))
        if a.json:
            a.json.write_text(json.dumps(summary, indent=2) + "\n")
        return summary

    from pydantic import ValidationError

    from env import write_jsonl
    from env.task import MapfTask
    from llm_backends.checkpoints import load_checkpoint
    from llm_backends.models import resolve_model
    from trainer.config import TrainConfig
    from trainer.filtered_sampling import FilteredSampler, resolve_sampler
    from trainer.greedy import greedy_valid_rate
    from trainer.sft import build_warm_start, warm_start_levels
    from trainer.stage import run_stage

    task, raw = MapfTask(), dict(TRAIN_PRESETS[a.preset])
    if a.quick:
        raw.update(QUICK)
    if a.grpo_steps is not None:
        raw["max_steps"] = a.grpo_steps
    for item in a.set:
        key, sep, value = item.partition("=")
        if not sep or key not in TrainConfig.model_fields:
            p.error(f"--set {item!r}: expected FIELD=VALUE with FIELD one of {', '.join(sorted(TrainConfig.model_fields))}")
        try:
            raw[key] = json.loads(value)
        except json.JSONDecodeError:
            raw[key] = value
    try:
        cfg = TrainConfig.model_validate(raw)
    except ValidationError as e:  # one line: the first bad field, its value and the rule (or settings that clash)
        err = e.errors()[0]
        p.error(f"--set {err['loc'][0]}={err['input']!r}: {err['msg']}" if err["loc"] else f"--set: {err['msg']}")
    seeds = [int(s) for s in a.seeds.split(",")]
    per_size = a.per_size if a.per_size is not None else (2 if a.quick else None)
    max_new = a.max_new_tokens or (48 if a.quick else cfg.max_completion_length)
    val = evaluation_set(a.split, per_size)
    if not val or any(i.num_agents != 2 for i in val):
        p.error(f"--split {a.split}: needs 2-agent instances of sizes 3-5")
    sizes_text = a.grpo_sizes or GRPO_SIZES.get(a.preset, "3,4,5")
    try:
        sizes = {int(x) for x in sizes_text.split(",") if x.strip()}
    except ValueError:
        sizes = set()
    from env import SIZES
    if not sizes or not sizes <= set(SIZES):
        p.error(f"--grpo-sizes {sizes_text!r}: allowed: grid sizes in {min(SIZES)}-{max(SIZES)} as a comma list, "
                "e.g. 3,4")
    try:
        holes = parse_holes(a.grpo_holes)
    except ValueError as e:
        p.error(str(e))
    if a.grpo_min_makespan < 0:
        p.error(f"--grpo-min-makespan {a.grpo_min_makespan}: allowed: 0 (off) or a makespan of at least 1")
    head = {"preset": a.preset, "split": a.split, "instances": len(val), "grpo_sizes": sorted(sizes),
            "grpo_holes": list(holes), "grpo_min_makespan": a.grpo_min_makespan, "sampler": resolve_sampler(a.sampler),
            "train_config": cfg.model_dump(mode="json")}
    if (holes_of_val := eval_holes(val)) is not None:
        head["eval_holes"] = holes_of_val
    if plan is not None:
        head["plan"] = plan
    done = None
    if a.resume and a.json.exists():
        try:
            done = upgrade_metrics(json.loads(a.json.read_text()))  # files of either age
            same_setup(a.json, done, Path("this run"), head)
            finished_seeds(a.json, done)
        except (ValueError, KeyError) as e:  # JSONDecodeError is a ValueError
            p.error(f"--resume: {e}")

    def score(model, tok) -> dict:
        t = time.perf_counter()
        with FilteredSampler(a.sampler) as sampler:
            r = greedy_valid_rate(model, tok, val, max_new_tokens=max_new, batch_size=16,
                                  prompt_style=cfg.prompt_style, task=task, sampler=sampler)
        r["eval_seconds"] = round(time.perf_counter() - t, 1)
        return r

    def keep_answers(who: str | int, r: dict) -> None:
        if a.answers:
            with a.answers.open("a") as f:
                f.writelines(json.dumps({"who": who, **x}) + "\n" for x in r["answers"])

    try:  # every seed's GRPO instances,
        # drawn before the warm start so that a draw that cannot be made fails at once
        draws = {seed: training_draw(sizes, cfg.instances_per_stage, seed, holes,
                                     a.grpo_min_makespan) for seed in seeds}
    except ValueError as e:
        p.error(str(e))
    base = resolve_model(a.model)
    t0 = time.perf_counter()
    ws = build_warm_start(base, cfg, a.warm_seed, warm_start_levels(task, cfg), task=task)
    built = ws.get("built") or {}
    where = f", built on {built['machine'].get('cpu')} at {built.get('started_at')}" if built.get("machine") else ""
    print(f"warm start: {'reused' if ws['hit'] else 'built'} {ws['path']} ({time.perf_counter() - t0:.0f} s{where})",
          flush=True)
    spec = start_answers.spec(ws["weights"], a.split, val, max_new, cfg.prompt_style, resolve_sampler(a.sampler))
    if (before := None if a.no_start_cache else start_answers.cached(spec, val)) is not None:
        print(f"warm start: greedy answers reused from {start_answers.path(spec)}, re-verified", flush=True)
    else:
        model, tok = load_checkpoint(ws["path"])
        before = score(model, tok)
        del model
        start_answers.keep(spec, before)
    keep_answers("warm start", before)
    print("after warm start", json.dumps({k: before[k] for k in ("valid_rate", "by_level", "failures", "eval_seconds")}),
          flush=True)

    head["warm_start"] = {"key": ws["key"], "reused": ws["hit"], "weights": ws["weights"],
                          "built_on": (ws["built"].get("machine") or {}).get("cpu"), "valid_rate": before["valid_rate"],
                          "by_level": before["by_level"], "failures": before["failures"]}
    head = json.loads(json.dumps(head))  # as the file holds it: JSON keys are strings
    runs = []
    if done is not None:
        try:
            same_start(a.json, done, Path("this run"), head)
        except ValueError as e:
            p.error(f"--resume: {e}")
        runs = finished_seeds(a.json, done)  # every finished seed stays, listed in --seeds or not
        seeds += [r["seed"] for r in runs if r["seed"] not in seeds]
        print(f"resumed from {a.json}: seeds {[r['seed'] for r in runs]} kept, "
              f"{[s for s in seeds if s not in {r['seed'] for r in runs}]} to train", flush=True)
    for seed in seeds:
        if any(r["seed"] == seed for r in runs):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            train = Path(tmp) / "train.jsonl"
            write_jsonl(train, draws[seed])
            res = run_stage(train_path=train, init_checkpoint=Path(ws["path"]), out_dir=Path(tmp) / "stage_0", cfg=cfg,
                            seed=seed, reward_state=None, progress=False, warm_start=False, task=task)
            if a.keep_checkpoints:
                kept = a.keep_checkpoints / f"seed_{seed}"
                shutil.rmtree(kept, ignore_errors=True)
                shutil.copytree(res["checkpoint"], kept)
            model, tok = load_checkpoint(res["checkpoint"])
            after = score(model, tok)
            keep_answers(seed, after)
            del model
        m = res["metrics"]
        run = {
            "seed": seed,
            "valid_rate": after["valid_rate"],
            "by_level": after["by_level"],
            "failures": after["failures"],
            "gain": after["valid_rate"] - before["valid_rate"],
            "diffs": [int(x) - int(y) for x, y in zip(after["valid"], before["valid"], strict=True)],
            **{k: m.get(k) for k in ("train/steps", "train/seconds_per_step", "train/reward_mean", "train/valid_rate",
                                     "train/zero_std_groups", "train/zero_std_groups_trained",
                                     "train/resample_zero_std_generated", "train/resample_replaced")},
        }
        runs.append(run)
        runs.sort(key=lambda r: seeds.index(r["seed"]))
        print(f"seed {seed}", json.dumps({k: v for k, v in run.items() if k != "diffs"}),
              flush=True)
        if a.json:  # a stopped bench keeps every finished seed (--resume)
            write_json(a.json, summarize(head, runs))

    summary = summarize(head, runs)
    print(json.dumps({k: v for k, v in summary.items() if k != "seeds"}, indent=2))
    print(table(summary))
    if a.json:
        write_json(a.json, summary)
    return summary


def write_json(path: Path, data: dict) -> None:
    """Write `data` to `path` whole or not at all (a temporary file, then a rename)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def summarize(head: dict, runs: list[dict]) -> dict:
    """`head` plus the seeds' runs (each with its per-instance `diffs`, kept so that files can be pooled later),
    the mean gain and its two 95 % intervals."""
    gains = [r["gain"] for r in runs]
    zero = [r["train/zero_std_groups_trained"] for r in runs if r.get("train/zero_std_groups_trained") is not None]
    return {
        **head,
        "seeds": runs,
        "mean_gain": statistics.fmean(gains),
        "gain_interval_bootstrap_95": list(crossed_interval([r["diffs"] for r in runs])),
        "interval": INTERVAL,
        "gain_interval_t_95": list(t_interval(gains)),
        "zero_std_groups_trained_mean": statistics.fmean(zero) if zero else None,
    }


# Not the preset's name: the whole train_config is compared, so `--preset cpu-long` pools with `--preset cpu` and the
# same values set by hand (`--set sft_steps=300 ...`), which is how the preset's own figures were measured.
POOL_SAME = ("split", "instances", "grpo_sizes", "grpo_holes", "grpo_min_makespan", "train_config", "sampler")
POOL_DEFAULTS = {"grpo_holes": [0.2], "grpo_min_makespan": 0, "sampler": "generate"}  # what a file from before the field existed ran with


def _short(weights: dict[str, str]) -> str:
    return ", ".join(f"{name} {digest[:12]}" for name, digest in weights.items())


def same_setup(path: Path, f: dict, ref_path: Path, ref: dict) -> None:
    """ValueError unless the figures in `f` (read from `path`) come from the settings, split and sizes of `ref`."""
    f, ref = {**POOL_DEFAULTS, **f}, {**POOL_DEFAULTS, **ref}
    for k in POOL_SAME:
        if k not in f:
            raise ValueError(f"{path}: no {k!r} (written by an older bench_learning?); pool only files that record it")
        if k == "train_config":
            a, b = _with_defaults(f[k]), _with_defaults(ref[k])
            if a != b:
                diff = ", ".join(f"{n}: {a.get(n)!r} vs {b.get(n)!r}" for n in sorted(set(a) | set(b))
                                 if a.get(n) != b.get(n))
                raise ValueError(f"{path}: train_config differs from {ref_path}'s ({diff}); pool or resume only runs "
                                 "of the same experiment")
        elif f[k] != ref[k]:
            raise ValueError(f"{path}: {k} differs from {ref_path}'s ({f[k]} vs {ref[k]}); pool or resume only runs of "
                             "the same experiment")


def _with_defaults(cfg: dict) -> dict:
    """A recorded train_config with the settings added since it was written at their defaults (a file from before
    a setting existed ran without it, which is what its default means), and removed levers that were off left out."""
    from trainer.config import REMOVED_OFF, TrainConfig

    kept = {k: v for k, v in cfg.items() if not (k in REMOVED_OFF and v == REMOVED_OFF[k])}
    return {**TrainConfig().model_dump(mode="json"), **kept}


def same_start(path: Path, f: dict, ref_path: Path, ref: dict, key_only: bool = False) -> None:
    """ValueError unless `f` and `ref` trained from one warm start: the same cache key and, since one key may be
    built into other weights elsewhere and one start answers differently on another CPU, the same weights where
    recorded and the same greedy answers before training."""
    a, b = f["warm_start"], ref["warm_start"]
    if a["key"] != b["key"]:
        raise ValueError(f"{path}: warm start {a['key']} differs from {b['key']} ({ref_path}); only runs from the "
                         "same warm start can be pooled or resumed")
    if key_only:
        return
    if a.get("weights") and b.get("weights") and a["weights"] != b["weights"]:
        raise ValueError(f"{path}: warm start {a['key']} has other weights than in {ref_path} "
                         f"({_short(a['weights'])} built on {a.get('built_on')}, against {_short(b['weights'])} "
                         f"built on {b.get('built_on')}); only runs from the same weights can be pooled or resumed")
    if (a["valid_rate"], a["by_level"]) != (b["valid_rate"], b["by_level"]):
        raise ValueError(f"{path}: the warm start scored {100 * a['valid_rate']:.1f} % {a['by_level']} before "
                         f"training, against {100 * b['valid_rate']:.1f} % {b['by_level']} in {ref_path}: another "
                         "start, the same start scored on another CPU, or another evaluation; only runs from "
                         "the same start can be pooled or resumed")


def finished_seeds(path: Path, f: dict) -> list[dict]:
    """The seeds' runs in `f` (read from `path`); ValueError if any lacks its per-instance answers ('diffs')."""
    if "seeds" not in f:
        raise ValueError(f"{path}: no 'seeds'; not a file written by bench_learning --json")
    missing = [r["seed"] for r in f["seeds"] if "diffs" not in r]
    if missing:
        raise ValueError(f"{path}: seeds {missing} have no per-instance answers ('diffs'); they cannot be pooled or "
                         "resumed")
    return list(f["seeds"])


def pool(paths: list[Path]) -> dict:
    """One summary over the seeds of several `--json` files of the same experiment (ValueError otherwise)."""
    from evals.packed import read_text
    files = [upgrade_metrics(json.loads(read_text(p))) for p in paths]  # files of either age
    first = files[0]
    for path, f in zip(paths, files, strict=True):
        same_start(path, f, paths[0], first, key_only=True)
        same_setup(path, f, paths[0], first)
        same_start(path, f, paths[0], first)
    runs = [r for path, f in zip(paths, files, strict=True) for r in finished_seeds(path, f)]
    seeds = [r["seed"] for r in runs]
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds {seeds}: a seed appears twice; pool runs of different seeds")
    head = {k: first[k] for k in first if k not in ("seeds", "mean_gain", "gain_interval_bootstrap_95",
                                                    "gain_interval_t_95", "zero_std_groups_trained_mean", "interval")}
    if "eval_holes" not in head:  # a file from before eval_holes was recorded: its answers are the split's sizes 3-5 in order
        val = evaluation_set(head["split"])
        if len(val) == head["instances"] and (holes_of_val := eval_holes(val)) is not None:
            head["eval_holes"] = holes_of_val
    return {**summarize(head, runs), "pooled_from": [str(p) for p in paths]}


def by_hole(s: dict) -> str:
    """The seeds' mean gain within each hole ratio of the evaluation maps (`eval_holes`), in points of that group:
    where a stage trained on some hole ratios wins or loses on the others."""
    groups: dict[float, list[int]] = {}
    for j, h in enumerate(s["eval_holes"]):
        groups.setdefault(h, []).append(j)
    return ", ".join(f"{h:g}: {100 * statistics.fmean(r['diffs'][j] for r in s['seeds'] for j in ix):+.1f} "
                     f"({len(ix)})" for h, ix in sorted(groups.items()))


def table(s: dict) -> str:
    """The headline figures as a small text table."""
    lines = [f"greedy valid rate on {s['split']} sizes 3-5 ({s['instances']} answers each)",
             f"{'':22}{'3x3':>8}{'4x4':>8}{'5x5':>8}{'all':>8}"]

    def row(label, by, all_):
        return label.ljust(22) + "".join(f"{by.get(str(n), by.get(n, float('nan'))):8.3f}" for n in (3, 4, 5)) \
            + f"{all_:8.3f}"

    lines.append(row("warm start", s["warm_start"]["by_level"], s["warm_start"]["valid_rate"]))
    for r in s["seeds"]:
        lines.append(row(f"GRPO seed {r['seed']}", r["by_level"], r["valid_rate"]))
    lo, hi = s["gain_interval_bootstrap_95"]
    tlo, thi = s["gain_interval_t_95"]
    lines.append(f"mean gain {100 * s['mean_gain']:+.1f} points; 95% interval (two-way bootstrap over seeds and instances) "
                 f"[{100 * lo:+.1f}, {100 * hi:+.1f}]; Student's t over seeds [{100 * tlo:+.1f}, {100 * thi:+.1f}]")
    if s.get("eval_holes") and s["seeds"]:
        lines.append("mean gain by the evaluation maps' hole ratio: " + by_hole(s))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
