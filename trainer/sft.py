"""SFT warm start: TRL `SFTTrainer` on solver-optimal plans rendered in the answer format.

A 135M policy almost never writes a valid joint plan by itself; every GRPO group then gets the same zero
reward and GRPO learns nothing. A short supervised pass on the stage's own instances, each answered with
the stored optimal plan (`Instance.plan`) in the exact format `env.parse_plan` reads, gives GRPO a
policy that is sometimes right, which is what a group-relative advantage needs. The loss is on the
answer tokens only (prompt-completion data). Runs once, before the first GRPO stage (`trainer.stage`).

By default (`TrainConfig.sft_sizes = [3]`) the examples are fresh 3x3 instances (the task's `warm_start_items`; MAPF: `env.task.MapfTask.warm_start_items`):
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

import hashlib
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

from trainer.data import sft_dataset
from trainer.greedy import greedy_valid_rate
from trainer.task import FIRST_TASK, Task, load_task, task_levels
from trainer.trl_setup import (
    freeze_lower_layers,
    quiet_trainer,
    raise_if_stopped,
    sft_bf16,
    stop_callbacks,
    tb_callback,
)

log = logging.getLogger(__name__)


def warm_start(
    model,
    tokenizer,
    instances: list,
    *,
    cfg,
    out_dir: Path,
    seed: int,
    task: str | Task,
    progress: bool = True,
    curve_every: int = 0,
    curve_instances: list | None = None,
) -> dict:
    """Fine-tune `model` in place on the gold answers of `instances` (the task's; MAPF: optimal plans); return {seconds, steps, loss, examples}.

    The examples are exactly the instances given (`build_warm_start` passes fresh items of the task's warm-start
    levels, `warm_start_levels`; the stage passes its own training set when `cfg.sft_sizes` is None). `cfg` is a
    `trainer.config.TrainConfig` (its `sft_*` fields and `prompt_style`). Only the answer tokens are scored,
    and TRL's fused LM head projects only them (`trainer.trl_cpu`).

    `curve_every=N` with `curve_instances`: every N steps (and at the end) the model answers those instances
    greedily; the result holds `curve`, a list of {step, examples, seconds, valid_rate, by_level, failures}.
    """
    import torch
    from trl import SFTConfig, SFTTrainer

    from trainer.trl_cpu import score_labelled_positions_only, tile_head_on_cpu

    score_labelled_positions_only()
    tile_head_on_cpu()
    data = sft_dataset(instances, seed, cfg.prompt_style, cfg.sft_order, task=task)
    cuda = torch.cuda.is_available()
    bf16 = sft_bf16(cfg)
    args = SFTConfig(
        output_dir=str(Path(out_dir) / "sft"),
        learning_rate=cfg.sft_lr,
        per_device_train_batch_size=cfg.sft_batch_size,
        gradient_accumulation_steps=1,
        num_train_epochs=cfg.sft_epochs,
        max_steps=cfg.sft_steps if cfg.sft_steps > 0 else -1,
        lr_scheduler_type=cfg.sft_lr_scheduler,
        warmup_steps=cfg.sft_warmup_ratio,  # transformers 5: a float < 1 is a share of the steps
        max_length=cfg.max_prompt_length + cfg.max_completion_length,
        completion_only_loss=True,
        train_sampling_strategy="sequential" if cfg.sft_order == "size" else "random",
        use_cpu=not cuda,
        bf16=bf16,
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
        callbacks=[tb_callback(Path(out_dir) / "tb" / "sft", main=main), *stop_callbacks()],
    )
    curve: list[dict] = []
    if curve_every and curve_instances:
        trainer.add_callback(_curve_callback(tokenizer, curve_instances, curve_every, cfg, curve, task))
    quiet_trainer(trainer, progress, label="SFT warm start")
    t0 = time.perf_counter()
    result = trainer.train()
    seconds = time.perf_counter() - t0
    raise_if_stopped("SFT warm start")
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    out: dict[str, Any] = {
        "seconds": seconds,
        "steps": int(trainer.state.global_step),
        "loss": float(result.training_loss),
        "loss_last": losses[-1] if losses else float(result.training_loss),
        "examples": len(data),
        "examples_per_second": int(trainer.state.global_step) * cfg.sft_batch_size / seconds if seconds else None,
    }
    if curve:
        out["curve"] = curve
        out["seconds_in_curve"] = sum(c["eval_seconds"] for c in curve)
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


def _curve_callback(tokenizer, instances: list, every: int, cfg, curve: list, task):
    """A TrainerCallback that scores greedy answers every `every` steps and at the end, into `curve`."""
    from transformers import TrainerCallback

    t0 = time.perf_counter()

    class Curve(TrainerCallback):
        def _score(self, state, model):
            t = time.perf_counter()
            r = greedy_valid_rate(model, tokenizer, instances, max_new_tokens=cfg.max_completion_length,
                                  batch_size=16, prompt_style=cfg.prompt_style, task=task)
            point = {"step": state.global_step, "examples": state.global_step * cfg.sft_batch_size,
                     "seconds": round(t - t0 - sum(c["eval_seconds"] for c in curve), 1),
                     "valid_rate": r["valid_rate"], "by_level": r["by_level"], "failures": r["failures"],
                     "eval_seconds": round(time.perf_counter() - t, 1)}
            curve.append(point)
            log.info("SFT curve: %s", json.dumps(point))

        def on_step_end(self, args, state, control, model=None, **kw):
            if state.global_step % every == 0:
                self._score(state, model)

        def on_train_end(self, args, state, control, model=None, **kw):
            if not curve or curve[-1]["step"] != state.global_step:
                self._score(state, model)

    return Curve()


# ----------------------------------------------------------------------------------------------------
# the cached warm start


WARM_START_VERSION = 1  # bump when the warm start's recipe changes in a way its settings do not show
WARM_START_FIELDS = (
    "prompt_style",
    "max_prompt_length",
    "max_completion_length",
    "sft_sizes",
    "sft_instances",
    "sft_steps",
    "sft_epochs",
    "sft_lr",
    "sft_lr_scheduler",
    "sft_warmup_ratio",
    "sft_batch_size",
    "sft_order",
    "sft_train_layers",
    "sft_bf16",
    "train_layers",
    "bf16",
    "lora",
    "lora_r",
    "lora_alpha",
    "lora_dropout",
    "lora_target_modules",
    "gradient_checkpointing",
)
MANIFEST = "warm_start.json"


def _file_sha256(path: Path, limit: int | None = None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        left = limit
        while True:
            chunk = f.read(1 << 22 if left is None else min(1 << 22, left))
            if not chunk:
                break
            h.update(chunk)
            if left is not None:
                left -= len(chunk)
                if left <= 0:
                    break
    return h.hexdigest()


def model_identity(model_dir: Path) -> dict:
    """What identifies a base model's weights: its folder name, config.json, and each weight file's size and the
    SHA-256 of its first 16 MiB (cheap for a 4B model, and different for any retrained or reconverted file)."""
    model_dir = Path(model_dir)
    files = sorted(p for p in model_dir.iterdir() if p.suffix in (".safetensors", ".bin", ".json") and p.is_file())
    return {
        "name": model_dir.name,
        "files": {p.name: [p.stat().st_size, _file_sha256(p, 16 << 20)] for p in files},
    }


def sft_layers(cfg) -> int:
    """The top blocks the warm start trains (0: all weights): sft_train_layers, or GRPO's train_layers if None."""
    return cfg.sft_train_layers if cfg.sft_train_layers is not None else cfg.train_layers


def warm_start_levels(task: str | Task, cfg) -> list[int]:
    """The levels the cached warm start covers by default: the task's own choice from the settings where it makes one
    (its `warm_start_levels(cfg)`; MAPF: `sft_sizes`, grid sizes), else every level of the task."""
    task = load_task(task)
    own = getattr(task, "warm_start_levels", None)
    return list(own(cfg)) if callable(own) else task_levels(task)


def check_levels(task: str | Task, levels: list[int]) -> list[int]:
    """`levels` as a list of ints, each one of the task's own levels (`trainer.task.task_levels`); else ValueError
    naming the level and what the task allows."""
    task = load_task(task)
    allowed = task_levels(task)
    if not levels:
        raise ValueError(f"warm-start levels of task {task.name!r}: none given; allowed: a non-empty list of {allowed}")
    bad = [lv for lv in levels if lv not in allowed]
    if bad:
        raise ValueError(f"warm-start level {bad[0]!r} of task {task.name!r}: allowed: {', '.join(map(str, allowed))}")
    return [int(lv) for lv in levels]


def warm_start_spec(model_dir: Path, cfg, seed: int, levels: list[int], *, task: str | Task) -> dict:
    """Everything the cached warm start depends on: the model, the warm-start settings, the seed, the task and its
    levels. Keys stay those of the caches built before the levels were an argument: the task that came first
    (`trainer.task.FIRST_TASK`) is not named, and the levels only where they differ from `warm_start_levels`."""
    from env import ENV_VERSION

    task = load_task(task)
    levels = check_levels(task, levels)

    knobs = cfg.model_dump(mode="json")
    # The blocks the warm start trains, in one form: train_layers = what it trains, sft_train_layers = None (the
    # form of every key built before GRPO's own train_layers could differ from the warm start's), so a GRPO stage
    # that trains more or fewer blocks than its warm start still reuses that start
    layers = {"sft_train_layers": None, "train_layers": sft_layers(cfg)}
    return {
        "version": WARM_START_VERSION,
        "env_version": ENV_VERSION,
        "model": model_identity(model_dir),
        # sft_bf16 as this machine resolves it: an autocast start and a float32 one are different starts
        "settings": {**{k: knobs[k] for k in WARM_START_FIELDS}, **layers, "sft_bf16": sft_bf16(cfg)},
        "seed": int(seed),
        **({} if task.name == FIRST_TASK else {"task": task.name}),
        **({} if levels == warm_start_levels(task, cfg) else {"levels": levels}),
    }


def warm_start_key(spec: dict) -> str:
    """A short name for a spec: the first 16 hex digits of the SHA-256 of its sorted JSON."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def warm_start_root(cache_dir=None) -> Path:
    """`<model cache>/warm_start` (`$ENV_ENGINEER_CACHE` or ~/.cache/env-engineer): outside every run folder."""
    from llm_backends.models import cache_root

    return cache_root(cache_dir) / "warm_start"


def check_cached(entry: Path, spec: dict | None = None) -> str | None:
    """Why the cache `entry` cannot be used (None: it is complete and intact): a missing or unreadable manifest,
    another spec, a missing file, or a file whose size or SHA-256 differs from the manifest's."""
    try:
        manifest = json.loads((entry / MANIFEST).read_text())
        files = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"no readable manifest {MANIFEST} ({type(e).__name__})"
    if spec is not None and manifest.get("spec") != spec:
        return "its spec differs from the one asked for"
    for name, (size, digest) in files.items():
        f = entry / name
        if not f.is_file():
            return f"{name} is missing"
        if f.stat().st_size != size:
            return f"{name} has {f.stat().st_size} bytes, the manifest says {size}"
        if _file_sha256(f) != digest:
            return f"{name} does not match its SHA-256"
    return None


def build_warm_start(
    model_dir: Path,
    cfg,
    seed: int,
    levels: list[int],
    *,
    task: str | Task,
    cache_dir=None,
    progress: bool = True,
    rebuild: bool = False,
    curve_every: int = 0,
    curve_instances: list | None = None,
) -> dict:
    """The cached SFT warm start for (base model, warm-start settings, seed, the task and its `levels`): reuse it, or
    build and cache it. `levels` are the task's own (`warm_start_levels(task, cfg)` gives the default; a level the task
    does not have raises ValueError before any work).

    Returns {"path", "key", "hit", "metrics", "built", "weights"}: the checkpoint folder in the cache
    (`warm_start_root()/<key>`), whether it was reused, the SFT figures (`sft/...`), where and when it was built
    (`built`: `trainer.provenance.collect()` at the build's start: machine, packages, code commit, time) and the
    sha256 of its weight files, all from the manifest so a reuse reports them too. The key does not name the
    machine, and a start's figures do not carry over between CPUs (the seed-0 cpu start built on an AMD EPYC answers
    16.0 % of val-small validly there, greedy and in-process, and 12.7 % on an Intel Xeon with AMX), nor always
    between builds of the same key: hence `built` and the weights.
    An entry whose manifest is missing, names another spec, or whose files do not match their recorded size and
    SHA-256 (a half-written or corrupt entry) is rebuilt, never loaded. Builds are serialised by a file lock, so
    two runs with one key build once; the entry appears by a rename only when complete.
    """
    from filelock import FileLock

    from trainer.provenance import collect

    spec = warm_start_spec(model_dir, cfg, seed, levels, task=task)
    key = warm_start_key(spec)
    root = warm_start_root(cache_dir)
    root.mkdir(parents=True, exist_ok=True)
    entry = root / key
    with FileLock(str(root / f".{key}.lock")):
        why = "asked to rebuild" if rebuild else (check_cached(entry, spec) if entry.exists() else "not built yet")
        if why is None:
            manifest = json.loads((entry / MANIFEST).read_text())
            log.info("SFT warm start: reusing %s", entry)
            return {"path": str(entry), "key": key, "hit": True, "metrics": manifest.get("metrics", {}),
                    "built": manifest.get("built", {}), "weights": _weights(manifest["files"])}
        if entry.exists():
            log.warning("SFT warm start cache %s is unusable (%s): rebuilding it", entry, why)
        started = time.time()
        metrics = _train_warm_start(model_dir, cfg, seed, levels, root / f".{key}.tmp", progress=progress,
                                    curve_every=curve_every, curve_instances=curve_instances, task=task)
        tmp = root / f".{key}.tmp"
        files = {p.name: [p.stat().st_size, _file_sha256(p)] for p in sorted(tmp.iterdir()) if p.is_file()}
        built = collect(started)
        (tmp / MANIFEST).write_text(
            json.dumps({"key": key, "spec": spec, "files": files, "metrics": metrics, "built": built}, indent=2)
            + "\n"
        )
        if entry.exists():
            shutil.rmtree(entry)
        os.replace(tmp, entry)
    return {"path": str(entry), "key": key, "hit": False, "metrics": metrics, "built": built,
            "weights": _weights(files)}


def _weights(files: dict[str, list]) -> dict[str, str]:
    """The sha256 of each weight file of a manifest's `files` ({name: [size, sha256]}), by name."""
    return {name: digest for name, (_size, digest) in sorted(files.items()) if name.endswith(".safetensors")}


def _train_warm_start(
    model_dir: Path, cfg, seed: int, levels: list[int], out: Path, *, task: str | Task, progress: bool,
    curve_every: int = 0, curve_instances=None,
) -> dict:
    """Load the base model, run the SFT warm start on fresh items with gold answers, save it to `out`."""
    from transformers import set_seed

    from llm_backends.checkpoints import META_FILE, load_checkpoint

    if out.exists():
        shutil.rmtree(out)
    set_seed(seed)
    model, tok = load_checkpoint(model_dir, dtype="float32", trainable=True)
    layers = sft_layers(cfg)
    if layers:
        freeze_lower_layers(model, layers)
    data = load_task(task).warm_start_items(levels, cfg.sft_instances, seed)
    work = out.with_name(out.name + "-work")
    result = warm_start(model, tok, data, cfg=cfg, out_dir=work, seed=seed, progress=progress, task=task,
                        curve_every=curve_every, curve_instances=curve_instances)
    for p in model.parameters():
        p.requires_grad_(True)
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    (out / META_FILE).unlink(missing_ok=True)  # a base-model folder for the first GRPO stage, not a stage checkpoint
    if (work / "tb" / "sft").is_dir():  # its TensorBoard run, copied into each stage folder that uses the entry
        shutil.copytree(work / "tb" / "sft", out / "tb" / "sft")
    shutil.rmtree(work, ignore_errors=True)
    return {f"sft/{k}": v for k, v in result.items()}


def main(argv: list[str] | None = None) -> None:
    """`python -m trainer.sft`: build (or find) the cached SFT warm start of a preset, and print where it is."""
    import argparse

    from trainer.config import TRAIN_PRESETS, TrainConfig

    p = argparse.ArgumentParser(
        prog="python -m trainer.sft",
        description="Build the SFT warm start once, from solver-optimal plans, into the cache shared by every run "
        "and eval arm with the same key (model, warm-start settings, seed). A run's stage 0 reuses it.",
    )
    p.add_argument("--preset", default="cpu", choices=sorted(TRAIN_PRESETS), help="training preset (default cpu)")
    p.add_argument("--model", default="smollm2-135m", help="base policy: short name, Hugging Face id or folder")
    p.add_argument("--seed", type=int, default=0, help="the run's seed (stage 0 uses it as is)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a training setting, e.g. --set sft_steps=100 (as --set train.sft_steps=100 in "
                   "graph.run)")
    p.add_argument("--rebuild", action="store_true", help="build again even when a complete entry exists")
    p.add_argument("--eval", type=int, default=0, metavar="N",
                   help="then answer the first N val-small instances of each size 3-5 greedily, print the valid rate")
    p.add_argument("--curve", type=int, default=0, metavar="STEPS",
                   help="while building, score greedy answers every STEPS steps (with --eval N instances per size) "
                   "and print the curve: valid rate against examples seen")
    a = p.parse_args(argv)
    raw = dict(TRAIN_PRESETS[a.preset])
    for item in a.set:
        field, sep, value = item.partition("=")
        field = field.removeprefix("train.")
        if not sep or field not in TrainConfig.model_fields:
            p.error(f"--set {item!r}: expected FIELD=VALUE with FIELD one of {', '.join(sorted(TrainConfig.model_fields))}")
        raw[field] = value
    try:
        cfg = TrainConfig.model_validate(raw)
    except Exception as e:  # noqa: BLE001 - pydantic's message names the field and the bound
        p.error(str(e).splitlines()[0] + ": " + (str(e).splitlines()[1].strip() if len(str(e).splitlines()) > 1 else ""))
    if not cfg.sft_sizes:
        p.error("sft_sizes is none: that warm start trains on a run's own instances and is not cached")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("trainer.log").setLevel(logging.WARNING)  # trainer log dicts: not beside the bar
    from env import load_split
    from env.task import MapfTask
    from llm_backends.models import resolve_model

    val = [i for s in (3, 4, 5) for i in [x for x in load_split("val-small") if x.size == s][: a.eval]]
    if a.curve and not val:
        p.error("--curve needs --eval N (instances per size to score)")
    task = MapfTask()
    res = build_warm_start(resolve_model(a.model), cfg, a.seed, warm_start_levels(task, cfg), task=task,
                           rebuild=a.rebuild, curve_every=a.curve, curve_instances=val)
    figures = {"path": res["path"], "key": res["key"], "reused": res["hit"], "weights": res["weights"],
               "built_on": (res["built"].get("machine") or {}).get("cpu"), "built_at": res["built"].get("started_at"),
               **res["metrics"]}
    if a.eval and not a.curve:
        from llm_backends.checkpoints import load_checkpoint

        model, tok = load_checkpoint(res["path"])
        r = greedy_valid_rate(model, tok, val, max_new_tokens=cfg.max_completion_length, prompt_style=cfg.prompt_style,
                              task=task)
        figures["val-small"] = {k: r[k] for k in ("valid_rate", "by_level", "failures", "n")}
    print(json.dumps(figures, indent=2, default=str))


if __name__ == "__main__":
    main()
