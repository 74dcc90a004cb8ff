"""What a stage would run on a GPU, built on any machine (`python -m graph.run --dry-run`, tests).

`mock_cuda()` makes torch report one bf16-capable CUDA device, so that the very functions the stage calls
(`trainer.trl_setup.grpo_config`, `lora_config`, `llm_backends.vllm_server.VLLMServer.command`) build the objects a
GPU run would build; nothing is loaded and no kernel runs. `training_plan(settings, run_dir)` returns those
objects and `plan_lines(plan)` says what would run, one line each.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock


@contextlib.contextmanager
def mock_cuda(bf16: bool = True) -> Iterator[None]:
    """torch (and transformers' TrainingArguments) see one CUDA device; accelerate's process state made inside
    is dropped on exit, so the caller's process is left as it was."""
    import torch
    from accelerate.state import AcceleratorState, GradientState, PartialState

    saved = [(cls, dict(cls._shared_state)) for cls in (PartialState, AcceleratorState, GradientState)]
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(torch.cuda, "is_available", return_value=True))
        stack.enter_context(mock.patch.object(torch.cuda, "is_bf16_supported", return_value=bf16))
        stack.enter_context(mock.patch.object(torch.cuda, "device_count", return_value=1))
        stack.enter_context(mock.patch.object(torch.cuda, "set_device", return_value=None))
        try:
            yield
        finally:
            for cls, state in saved:
                cls._shared_state.clear()
                cls._shared_state.update(state)


def training_plan(settings, run_dir: Path | None = None, *, stage: int = 0) -> dict[str, Any]:
    """The objects stage `stage` of a run with `settings` would build, up to the model load, as on one CUDA GPU
    when the run's training wants one (`train.use_vllm`) and this machine has none (CUDA mocked), else as here.

    Returns {"gpu_mocked", "grpo_config", "lora_config" (None without LoRA or for lora=auto), "server_command",
    "server_env" (the VLLM_* variables), "steps_per_stage", "warnings"}.
    """
    import torch

    from llm_backends.policy import lora_rank
    from llm_backends.vllm_server import VLLMServer, is_cpu_build
    from trainer.files import stage_dir
    from trainer.trl_setup import check_generation_backend, grpo_config, lora_config

    cfg = settings.train
    run_dir = Path(run_dir or settings.run_dir or "runs/<run-id>")
    out_dir = stage_dir(run_dir, stage)
    cuda_here = torch.cuda.is_available()
    mocked = bool(cfg.use_vllm) and not cuda_here
    warnings: list[str] = []
    if mocked:
        try:
            check_generation_backend(cfg)
        except ValueError as e:
            warnings.append(f"this machine has no CUDA GPU, so the real run stops at train_stage: {str(e)[:160]}")
    seed = int(settings.seed) + 1000 * stage
    with mock_cuda() if mocked else contextlib.nullcontext():
        args = grpo_config(cfg, out_dir, seed, progress=True)
        world_size, device = args.world_size, str(args.device)  # read while accelerate's state exists
    lora = cfg.lora is True
    lora_cfg = lora_config(cfg) if lora else None
    # the evaluation and self-engineer server: LoRA checkpoints are served on their base with runtime adapters
    server = VLLMServer(settings.policy_model, log_path=run_dir / "logs" / "policy-vllm.log", resolve=False,
                        cpu_build=is_cpu_build() and not mocked, enable_lora=lora,
                        max_lora_rank=lora_rank({"r": cfg.lora_r}) if lora else 16,
                        served_model_name="kept" if settings.keep_server else "policy", port=8000)
    command = server.command()
    env = {k: v for k, v in server.environment().items() if k.startswith("VLLM_") and k != "VLLM_LAUNCH_PARENT_PID"}
    per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * max(1, world_size)
    prompts_per_step = per_step // cfg.num_generations
    steps = cfg.max_steps if cfg.max_steps > 0 else int(
        -(-cfg.instances_per_stage * cfg.num_generations // per_step) * cfg.epochs)
    return {"gpu_mocked": mocked, "grpo_config": args, "lora_config": lora_cfg, "server_command": command,
            "server_env": env, "steps_per_stage": steps, "device": device, "prompts_per_step": prompts_per_step, "warnings": warnings}


GRPO_FIELDS = ("learning_rate", "num_train_epochs", "max_steps", "per_device_train_batch_size",
               "gradient_accumulation_steps", "num_generations", "generation_batch_size", "steps_per_generation",
               "max_completion_length", "temperature", "beta", "loss_type", "bf16", "gradient_checkpointing",
               "use_vllm", "vllm_mode", "vllm_gpu_memory_utilization", "vllm_max_model_length",
               "chat_template_kwargs", "save_strategy", "save_steps")


def plan_lines(plan: dict[str, Any], settings) -> list[str]:
    """What `training_plan` found, one line each (printed by `python -m graph.run --dry-run`)."""
    import shlex

    args = plan["grpo_config"]
    where = "as on one CUDA GPU (none here: CUDA mocked)" if plan["gpu_mocked"] else f"on this machine ({plan['device']})"
    out = [f"training, {where}: one child process per stage (python -m trainer.child stage_<k>/logs/stage_request.json)"]
    out.append("GRPOConfig: " + " ".join(f"{f}={getattr(args, f, None)}" for f in GRPO_FIELDS))
    lc = plan["lora_config"]
    if lc is not None:
        out.append(f"LoRA: r={lc.r} lora_alpha={lc.lora_alpha} lora_dropout={lc.lora_dropout} "
                   f"target_modules={lc.target_modules}")
    else:
        out.append(f"LoRA: lora={settings.train.lora} (auto: on above 1B parameters, decided at the model load)")
    out.append(f"steps per stage: {plan['steps_per_stage']} ({settings.train.instances_per_stage} instances x "
               f"{settings.train.num_generations} completions x {settings.train.epochs:g} epochs, "
               f"{plan['prompts_per_step']} prompts per optimiser step)")
    cmd = plan["server_command"]
    cmd = ["vllm", *cmd[cmd.index("serve"):]] if "serve" in cmd else cmd
    out.append("vLLM server (evaluation and self/base engineer; stopped before each stage trains on a GPU): "
               + " ".join(f"{k}={v}" for k, v in sorted(plan["server_env"].items())) + " " + shlex.join(cmd))
    import os

    launcher = os.environ.get("STAGE_LAUNCHER", "")
    out.append(f"stage launcher: {launcher}" if launcher else "stage launcher: none (one process, one GPU); several "
               "GPUs: STAGE_LAUNCHER='accelerate launch --config_file configs/accelerate/multi_gpu.yaml "
               "--num_processes 8'")
    out += [f"warning: {w}" for w in plan["warnings"]]
    return out
