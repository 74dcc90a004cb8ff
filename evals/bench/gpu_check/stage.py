"""The GPU check's stage section: `trainer.stage.run_stage` in `trainer.child`'s child process with the `paper`
preset's levers, probed from inside, checkpointed at step N/2, stopped there by SIGTERM and resumed to step N."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

from evals.bench.gpu_check.model import cuda_sync, hide_vllm
from evals.bench.gpu_check.report import Report, log


def stage_config(device: str, steps: int):
    """The `paper` preset's training levers at the tiny model's scale: LoRA, gradient checkpointing, bf16 weights
    where CUDA supports them (the preset's default), in-stage checkpoints every steps/2, no vLLM (not carried)."""
    from trainer.config import TRAIN_PRESETS, TrainConfig

    raw = dict(TRAIN_PRESETS["paper"])
    cuda = device == "cuda"
    raw.update(
        use_vllm=False,  # the vllm wheel is far over a device call's 64 MiB: TRL's transformers path instead
        lora=True,  # the tiny model is under lora="auto"'s 1B, the paper's 4B is not: LoRA as the paper trains
        max_steps=steps,
        save_steps=max(1, steps // 2),
        logging_steps=1,
        # the paper's groups of 8 and micro-batches of 8 on CUDA, 2 micro-batches a step (the paper has 8); smaller
        # on CPU, where every completion costs seconds
        num_generations=8 if cuda else 4,
        per_device_train_batch_size=8 if cuda else 4,
        gradient_accumulation_steps=2 if cuda else 1,
        max_completion_length=128 if cuda else 16,
    )
    return TrainConfig.model_validate(raw)


def instrumented_stage(*, facts_path, stop_after_save: int | None = None, **run_stage_kwargs) -> None:
    """`trainer.stage.run_stage`, as `trainer.child` runs it, with a probe on its trainer (facts in `facts_path`):
    the model's device, dtype, adapter and checkpointing as trained; each step's seconds; each generation's seconds
    and tokens; TRL's log dicts; launches of TRL's Triton fused-head kernel; peak GPU memory. With
    `stop_after_save=S`, the child sends itself SIGTERM once the step-S checkpoint is complete (its own signal
    handler: the first signal stops at the step boundary, `trainer.child`), and the stage ends there."""
    hide_vllm()
    import trainer.grpo_stage as stage_mod

    original = stage_mod.quiet_trainer

    def quiet_and_probed(trainer, progress, label):
        original(trainer, progress, label)
        _instrument(trainer, Path(facts_path), stop_after_save)

    stage_mod.quiet_trainer = quiet_and_probed
    try:
        from trainer.stage import run_stage

        run_stage(**run_stage_kwargs)
    finally:
        stage_mod.quiet_trainer = original


class _CountLaunches:
    """A Triton kernel, counting its launches (`kernel[grid](...)`) and passing everything else through."""

    def __init__(self, fn):
        self.fn = fn
        self.launches = 0

    def __getitem__(self, grid):
        self.launches += 1
        return self.fn[grid]

    def __getattr__(self, name):
        return getattr(self.fn, name)


def _instrument(trainer, facts_path: Path, stop_after_save: int | None) -> None:
    import torch
    from transformers import TrainerCallback

    facts: dict[str, Any] = {"steps": [], "generations": [], "logs": [], "pid": os.getpid()}

    def save() -> None:
        tmp = facts_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(facts, default=str))
        os.replace(tmp, facts_path)

    kernels = {}
    try:
        from trl.kernels import chunked_logprob as ck

        for name in ("_forward_kernel", "_backward_kernel"):
            fn = getattr(ck, name)
            if not isinstance(fn, _CountLaunches) and hasattr(fn, "__getitem__"):
                setattr(ck, name, _CountLaunches(fn))
            kernels[name] = getattr(ck, name)
        facts["triton_available"] = bool(getattr(ck, "_TRITON_AVAILABLE", False))
    except ImportError as e:
        facts["triton_error"] = str(e)

    generate = trainer._generate_single_turn

    def timed_generate(*args, **kwargs):
        cuda_sync()
        t0 = time.perf_counter()
        out = generate(*args, **kwargs)
        cuda_sync()
        completions = out[0]
        facts["generations"].append({"step": int(trainer.state.global_step) + 1, "seconds": time.perf_counter() - t0,
                                     "completions": len(completions),
                                     "tokens": int(sum(len(c) for c in completions))})
        return out

    trainer._generate_single_turn = timed_generate
    clock: dict[str, float] = {}

    class Probe(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            model = model or trainer.model
            named = list(model.named_parameters())
            base = [p for n, p in named if "lora_" not in n]
            facts.update(
                device=str(base[0].device),
                base_dtype=str(base[0].dtype).removeprefix("torch."),
                lora_dtype=next((str(p.dtype).removeprefix("torch.") for n, p in named if "lora_" in n), None),
                is_peft=hasattr(model, "peft_config"),
                lora_params=sum(p.numel() for n, p in named if "lora_" in n),
                trainable_params=sum(p.numel() for _, p in named if p.requires_grad),
                gradient_checkpointing=any(getattr(m, "gradient_checkpointing", False) is True
                                           for m in model.modules()),
                use_vllm=bool(getattr(trainer, "use_vllm", None)),
                args_bf16=bool(args.bf16),
                args_gradient_checkpointing=bool(args.gradient_checkpointing),
                start_step=int(state.global_step),
            )
            if torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()
            save()

        def on_step_begin(self, args, state, control, **kwargs):
            cuda_sync()
            clock["step"] = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            cuda_sync()
            facts["steps"].append({"step": int(state.global_step), "seconds": time.perf_counter() - clock["step"]})
            if torch.cuda.is_available():
                facts["peak_gpu_bytes"] = int(torch.cuda.max_memory_allocated())
            facts["triton_launches"] = {k: getattr(v, "launches", None) for k, v in kernels.items()}
            save()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs:
                facts["logs"].append({"step": int(state.global_step), **logs})

        def on_save(self, args, state, control, **kwargs):
            if stop_after_save and state.global_step == stop_after_save:
                facts["sigterm_after_step"] = int(state.global_step)
                save()
                os.kill(os.getpid(), signal.SIGTERM)  # trainer.child's handler: stop at the step boundary
                control.should_training_stop = True  # ... which is this one: no step after the checkpoint
            return control

        def on_train_end(self, args, state, control, **kwargs):
            facts["end_step"] = int(state.global_step)
            if torch.cuda.is_available():
                facts["peak_gpu_bytes"] = int(torch.cuda.max_memory_allocated())
            facts["triton_launches"] = {k: getattr(v, "launches", None) for k, v in kernels.items()}
            save()

    trainer.add_callback(Probe())
    save()


def run_stage_checks(report: Report, device: str, model_dir: Path, work: Path, steps: int) -> dict:
    """The interrupted stage and its resume, each in trainer.child's child process; returns both runs' facts."""
    import torch

    from env import generate, uniform_config, write_jsonl
    from env.task import MapfTask
    from trainer.child import run_in_child
    from trainer.stop import StageInterrupted

    cuda = device == "cuda"
    cfg = stage_config(device, steps)
    half = cfg.save_steps
    prompts_per_step = cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps // cfg.num_generations
    train = work / "train.jsonl"
    write_jsonl(train, generate(uniform_config(), max(8, steps * prompts_per_step), seed=0).instances)
    out = work / "stage_0"
    shutil.rmtree(out, ignore_errors=True)  # a folder left by an earlier check would be resumed from
    kwargs = dict(train_path=train, init_checkpoint=model_dir, out_dir=out, cfg=cfg, seed=0, reward_state=None,
                  progress=False, warm_start=False, task=MapfTask.name)
    report.doc["measurements"]["stage_config"] = {
        k: getattr(cfg, k) for k in ("prompt_style", "num_generations", "per_device_train_batch_size",
                                     "gradient_accumulation_steps", "max_completion_length", "max_prompt_length",
                                     "max_steps", "save_steps", "lora", "lora_r", "lora_alpha",
                                     "gradient_checkpointing", "bf16", "use_vllm", "loss_type", "temperature")}
    target = "evals.bench.gpu_check.stage:instrumented_stage"
    facts_a, facts_b = work / "facts_interrupted.json", work / "facts_resumed.json"

    log(f"stage run 1: {steps} steps planned, checkpoint at step {half}, SIGTERM right after it")
    t0 = time.perf_counter()
    interrupted_error = None
    try:
        run_in_child(out, dict(kwargs, facts_path=facts_a, stop_after_save=half), label="gpu check stage (run 1)",
                     target=target)
    except StageInterrupted as e:
        interrupted_error = str(e)
    run1_s = time.perf_counter() - t0
    a = json.loads(facts_a.read_text()) if facts_a.exists() else {}
    status1 = json.loads((out / "logs" / "stage_status.json").read_text())
    report.check("stage_child_process", status1.get("status") in ("ok", "interrupted") and a.get("pid") not in
                 (None, os.getpid()), f"run 1 in child pid {a.get('pid')} (this process: {os.getpid()}), status "
                 f"{status1.get('status')}, {run1_s:.1f} s with start-up", status_file=status1)

    trl_dir = out / "trl"
    ckpt = trl_dir / f"checkpoint-{half}"
    marker = ckpt / "stage_resume.json"
    found = sorted(p.name for p in trl_dir.iterdir()) if trl_dir.is_dir() else []
    need = ("trainer_state.json", "rng_state.pth", "optimizer.pt", "adapter_model.safetensors")
    missing = [n for n in need if not (ckpt / n).exists()]
    marker_step = json.loads(marker.read_text()).get("global_step") if marker.exists() else None
    report.check("in_stage_checkpoint", not missing and marker_step == half,
                 f"{ckpt.name}: marker at step {marker_step}, missing {missing or 'nothing'}; trl/ holds {found}")
    report.check("interrupted", interrupted_error is not None and a.get("end_step") == half
                 and a.get("sigterm_after_step") == half and not (out / "checkpoint").exists(),
                 f"StageInterrupted: {(interrupted_error or 'not raised')[:160]}; stopped at step {a.get('end_step')}"
                 f", no final checkpoint: {not (out / 'checkpoint').exists()}")
    if cuda:
        try:
            rng = torch.load(ckpt / "rng_state.pth", weights_only=False)
            keys = sorted(rng) if isinstance(rng, dict) else []
            report.check("cuda_rng_state", "cuda" in keys, f"rng_state.pth keys: {keys}")
        except Exception as e:  # noqa: BLE001 - reported as the check's failure
            report.check("cuda_rng_state", False, f"{type(e).__name__}: {e}")
    else:
        report.skip("cuda_rng_state", "CPU run: the CUDA RNG state exists only on CUDA (the CPU's is saved)")
    report.write()

    log(f"stage run 2: resume from step {half} to step {steps}")
    t0 = time.perf_counter()
    run_in_child(out, dict(kwargs, facts_path=facts_b, stop_after_save=None), label="gpu check stage (run 2)",
                 target=target)
    run2_s = time.perf_counter() - t0
    b = json.loads(facts_b.read_text())
    metrics = json.loads((out / "metrics.json").read_text())
    meta = json.loads((out / "checkpoint" / "trainer_meta.json").read_text())
    resumed = metrics.get("train/resumed_from_step")
    report.check("resume", resumed == half and metrics.get("train/steps") == steps and b.get("start_step") == half
                 and meta.get("grpo_steps") == steps and not trl_dir.exists(),
                 f"resumed_from_step {resumed}, trained steps {b.get('start_step')} -> {b.get('end_step')}, "
                 f"train/steps {metrics.get('train/steps')}, final checkpoint {sorted(os.listdir(out / 'checkpoint'))}"
                 f", trl/ removed: {not trl_dir.exists()} ({run2_s:.1f} s with start-up)",
                 resumed_from_step=resumed)

    gens = a.get("generations", []) + b.get("generations", [])
    report.check("transformers_generation", not a.get("use_vllm") and not b.get("use_vllm") and len(gens) > 0
                 and all(g["tokens"] > 0 for g in gens),
                 f"{len(gens)} generations with transformers, {sum(g['tokens'] for g in gens)} tokens; use_vllm "
                 f"{a.get('use_vllm')}")
    report.check("lora", a.get("is_peft") and b.get("is_peft") and meta.get("is_lora") is True
                 and (out / "checkpoint" / "adapter_model.safetensors").is_file(),
                 f"adapter of {a.get('lora_params')} parameters ({a.get('lora_dtype')}), trainable "
                 f"{a.get('trainable_params')}; checkpoint is_lora {meta.get('is_lora')}")
    report.check("gradient_checkpointing", bool(a.get("gradient_checkpointing") and b.get("gradient_checkpointing")),
                 f"on in the model while training: {a.get('gradient_checkpointing')}, {b.get('gradient_checkpointing')}")
    if cuda:
        report.check("cuda_training", a.get("device", "").startswith("cuda") and b.get("device", "").startswith("cuda")
                     and metrics.get("train/device") == "cuda",
                     f"weights on {a.get('device')}, metrics train/device {metrics.get('train/device')}")
        report.check("bf16_weights", a.get("base_dtype") == "bfloat16" and b.get("base_dtype") == "bfloat16",
                     f"base weights {a.get('base_dtype')}, adapter {a.get('lora_dtype')}, GRPOConfig bf16 "
                     f"{a.get('args_bf16')}")
        launches = {k: (a.get("triton_launches") or {}).get(k, 0) or 0 for k in ("_forward_kernel", "_backward_kernel")}
        first = [s["seconds"] for s in a.get("steps", [])][:1]
        report.check("fused_lm_head_triton", launches["_forward_kernel"] > 0 and launches["_backward_kernel"] > 0,
                     f"Triton launches in run 1: {launches}; first step {first[0] if first else '?'} s (compiles)")
    else:
        report.skip("cuda_training", "CPU run (--device cpu)")
        report.skip("bf16_weights", "CPU run: the project trains float32 weights off CUDA (train.bf16 auto)")
        report.skip("fused_lm_head_triton", "CPU run: TRL folds the fused head's tiles in torch where there is no "
                    "Triton device")
    report.write()
    return {"a": a, "b": b, "cfg": cfg, "metrics": metrics}
