"""TRL set-up shared by the SFT warm start (`trainer.sft`) and the GRPO stage (`trainer.stage`).

The trainers' arguments (`grpo_config`, `lora_config`, `use_bf16`, `check_generation_backend`), the weights they
train (`freeze_lower_layers`), who writes files under accelerate (`main_process`), and how a trainer reports:
TensorBoard (`tb_callback`, `tb_scalars`), the stop flag (`stop_callbacks`, `raise_if_stopped`, `trainer.stop`)
and a labelled step bar with the trainer's log dicts in the log file only (`quiet_trainer`).

Generation during training: TRL's transformers path everywhere by default on CPU. On a GPU, `use_vllm=True`
uses TRL's colocated vLLM (`vllm_mode="colocate"`) or a separate `trl vllm-serve` (`vllm_mode="server"`).
TRL's colocated vLLM does not sync weights on vLLM's CPU backend (VLLM-CPU.md); we do not patch it, because
its ~40 s engine start-up per stage outweighs the ~3.5 s/step it saves over a few-minute CPU stage.

`use_vllm=True` without CUDA is refused at stage start (`check_generation_backend`), before any model loads.
"""

from __future__ import annotations

import json
import logging
import math
import os
import warnings
from pathlib import Path
from typing import Any

from trainer.config import TrainConfig, wants_lora


# TRL 1.16 warns five times on import that vLLM 0.32 (vllm-cpu) is newer than it was tested with. Training on
# CPU never uses TRL's vLLM path (see above), so the warning is silenced for vllm-cpu only; on a GPU the `gpu`
# extra installs vllm 0.31.0, inside TRL's range, and any other vLLM there keeps TRL's warning.
def _vllm_cpu_installed() -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return bool(version("vllm-cpu"))
    except PackageNotFoundError:
        return False


if _vllm_cpu_installed():
    warnings.filterwarnings("ignore", message=r"TRL currently supports vLLM versions", category=UserWarning)


def use_bf16(cfg: TrainConfig) -> bool:
    """`cfg.bf16`, or when unset: bf16 on a CUDA GPU that supports it (CPU training stays float32)."""
    import torch

    if cfg.bf16 is not None:
        return cfg.bf16
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()


def use_autocast(cfg: TrainConfig) -> bool:
    """bf16 autocast over float32 weights in GRPO's training steps: `cfg.autocast_bf16`, or when unset, on a CPU
    that multiplies bf16 in hardware (AMX or AVX-512 BF16; never with bf16 weights, which need no autocast)."""
    import torch

    if use_bf16(cfg):
        return False
    if cfg.autocast_bf16 is not None:
        return cfg.autocast_bf16
    if torch.cuda.is_available():
        return False
    from llm_backends.vllm_server import cpu_has_bf16

    return cpu_has_bf16()


def sft_bf16(cfg: TrainConfig) -> bool:
    """bf16 in the SFT warm start: `cfg.sft_bf16`, or when unset as GRPO's training steps (bf16 weights on a GPU that
    supports them, bf16 autocast on a CPU that multiplies bf16 in hardware). On an AMD EPYC Zen 4 an SFT step of the
    cpu preset takes 4.8-5.0 s under autocast against 6.8-7.6 s in float32 (learning_cpu/README.md)."""
    if cfg.sft_bf16 is not None:
        return cfg.sft_bf16
    return use_bf16(cfg) or use_autocast(cfg)


def rollout_dtype(cfg, model) -> str | None:
    """The dtype of GRPO's rollout copy (`trainer.grpo_trainer.RolloutCopy`), or None: sample with the model itself.
    `cfg`: a `TrainConfig` or the trainer's `DynamicSamplingGRPOConfig` (their `rollout_dtype` and `use_vllm`).

    A copy only where transformers generates on CPU (no vLLM, no CUDA), for a plain float32 model (not a peft
    adapter, whose merge a copy would not follow). `auto`: bfloat16 on a CPU that multiplies bf16 in hardware (AMX
    or AVX-512 BF16: `llm_backends.vllm_server.cpu_has_bf16`), else float32: the copy's sampler (each prompt prefilled
    once, a growing KV cache, GQA attention, inverse-CDF draws) without bf16, which such a CPU multiplies in software
    (on an AVX2-only AMD EPYC Zen 3, 16 x 96 sampled tokens: 23.3 s against 42.8 s for transformers' generate on the
    model itself and 51.3 s for the bf16 copy, `evals.bench.bench_rollout`).
    """
    import torch

    if cfg.rollout_dtype == "model" or cfg.use_vllm or torch.cuda.is_available():
        return None
    if hasattr(model, "peft_config"):
        return None
    if next(model.parameters()).dtype != torch.float32:
        return None
    if cfg.rollout_dtype == "auto":
        from llm_backends.vllm_server import cpu_has_bf16

        return "bfloat16" if cpu_has_bf16() else "float32"
    return cfg.rollout_dtype


def rollout_prepack(cfg, sampler_dtype: str | None) -> bool:
    """Whether the rollout copy (of `sampler_dtype`, None: no copy) runs its linear layers on oneDNN-packed weights
    (`trainer.rollout_linear.prepack_linears`). `train.rollout_prepack` None: for a float32 copy where torch has oneDNN.
    Never without a copy."""
    import torch

    if sampler_dtype is None or cfg.rollout_prepack is False:
        return False
    if cfg.rollout_prepack is None:
        return sampler_dtype == "float32" and torch.backends.mkldnn.is_available()
    if not torch.backends.mkldnn.is_available():
        missing = "this torch build has no oneDNN (torch.backends.mkldnn)"
    elif sampler_dtype not in ("float32", "bfloat16"):
        missing = f"oneDNN packs float32 or bfloat16 weights, not the copy's {sampler_dtype}"
    elif sampler_dtype == "bfloat16" and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        missing = "this CPU has no oneDNN bf16 support (AVX-512 or AVX2-VNNI-2) for the bfloat16 copy"
    else:
        return True
    raise ValueError(f"train.rollout_prepack=true: {missing}; allowed here: rollout_prepack=false or null (auto)")


def lora_config(cfg: TrainConfig):
    """The peft `LoraConfig` of `cfg`'s `lora_*` fields."""
    from peft import LoraConfig

    targets = cfg.lora_target_modules
    return LoraConfig(
        r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=targets if targets == "all-linear" else [t.strip() for t in targets.split(",")],
        task_type="CAUSAL_LM",
    )


def freeze_lower_layers(model, n_top: int) -> int:
    """Leave only the top `n_top` decoder blocks and the final norm trainable; return the trainable count.

    Embeddings (tied to the LM head in SmolLM2) and lower blocks are frozen, so autograd never walks below
    the lowest trainable block: the backward pass shrinks in proportion. Saved checkpoints stay full models.
    """
    blocks = getattr(getattr(model, "model", None), "layers", None)
    if blocks is None:
        raise ValueError(f"train_layers needs a decoder with model.layers; {type(model).__name__} has none")
    for p in model.parameters():
        p.requires_grad_(False)
    for block in list(blocks)[-n_top:]:
        for p in block.parameters():
            p.requires_grad_(True)
    norm = getattr(model.model, "norm", None)
    if norm is not None:
        for p in norm.parameters():
            p.requires_grad_(True)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def trainable_model(load_from: Path, cfg: TrainConfig, base_model: str, *, named: bool):
    """Load the weights a stage trains: `(model, tokenizer, base_model, is_lora)`.

    `base_model` is the checkpoint's base as far as the caller knows (`named`: from its `trainer_meta.json`). A
    bare adapter folder keeps the base it was loaded on; a full model over `cfg.lora`'s size gets a new adapter,
    whose base is the weights it was loaded onto (the base model, the cached warm start, or a previous stage's
    full fine-tune): those are what the next load must put it on. Full fine-tunes train only the top
    `cfg.train_layers` blocks.
    """
    from peft import PeftModel, get_peft_model

    from llm_backends.checkpoints import adapter_base, load_checkpoint

    model, tok = load_checkpoint(load_from, dtype="bfloat16" if use_bf16(cfg) else "float32", trainable=True)
    if isinstance(model, PeftModel) and not named:
        base_model = str(adapter_base(load_from))
    if not isinstance(model, PeftModel) and wants_lora(cfg.lora, sum(p.numel() for p in model.parameters())):
        model = get_peft_model(model, lora_config(cfg))
        base_model = str(load_from.resolve())
        for pc in model.peft_config.values():
            pc.base_model_name_or_path = base_model
    is_lora = isinstance(model, PeftModel)
    if cfg.train_layers and not is_lora:
        freeze_lower_layers(model, cfg.train_layers)
    if cfg.gradient_checkpointing:
        model.config.use_cache = False
    return model, tok, base_model, is_lora


def main_process() -> bool:
    """True in a single process, and in process zero under accelerate/torchrun (the one that writes files)."""
    return int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")) or 0) == 0


def tb_callback(log_dir: Path, main: bool = True):
    """transformers' TensorBoard callback writing to `log_dir`; `main=False` (not process zero): no writer,
    so no empty event file either (the callback itself logs on process zero only)."""
    from transformers.integrations import TensorBoardCallback

    if not main:
        return TensorBoardCallback()
    from torch.utils.tensorboard import SummaryWriter

    log_dir.mkdir(parents=True, exist_ok=True)
    return TensorBoardCallback(tb_writer=SummaryWriter(log_dir=str(log_dir)))


def check_generation_backend(cfg: TrainConfig) -> None:
    """Raise `ValueError` when `cfg` asks for vLLM generation on a machine without CUDA.

    TRL's vLLM paths cannot push the trained weights into vLLM's CPU backend (VLLM-CPU.md): colocated, the
    CPU backend prepacks each Linear and empties `layer.weight`, so the first weight sync crashes after the
    model and engine have loaded; `trl vllm-serve`'s weight transfer needs CUDA.
    """
    if not cfg.use_vllm:
        return
    import torch

    if not torch.cuda.is_available():
        raise ValueError(
            f"use_vllm=True (vllm_mode={cfg.vllm_mode}) needs a CUDA GPU, and this machine has none: TRL cannot "
            "sync trained weights into vLLM's CPU backend (colocate: it empties each Linear's weight when it "
            "prepacks, so the first sync crashes; server: the weight transfer needs CUDA). Set use_vllm=False "
            "(TRAIN__USE_VLLM=false, or --set train.use_vllm=false) to generate with transformers, or use the "
            "cpu / smoke preset"
        )


def grpo_config(cfg: TrainConfig, out_dir: Path, seed: int, progress: bool = True):
    """The `DynamicSamplingGRPOConfig` (TRL's `GRPOConfig` and the project trainer's knobs, `trainer.grpo_config`) for
    a `TrainConfig` (CPU: `use_cpu=True`, `bf16=False`, see VLLM-CPU.md). `group_key` stays None (a uniform replacement
    draw): the stage sets it to the column its dataset has (`trainer.grpo_stage`)."""
    import torch

    from trainer.grpo_config import DynamicSamplingGRPOConfig

    cuda = torch.cuda.is_available()
    kwargs: dict[str, Any] = dict(
        output_dir=str(out_dir / "trl"),
        learning_rate=cfg.learning_rate,
        num_generations=cfg.num_generations,
        num_iterations=cfg.num_iterations,
        per_device_train_batch_size=cfg.per_device_train_batch_size,
        gradient_accumulation_steps=cfg.gradient_accumulation_steps,
        num_train_epochs=cfg.epochs,
        max_steps=cfg.max_steps if cfg.max_steps > 0 else -1,
        max_completion_length=cfg.max_completion_length,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        beta=cfg.beta,
        loss_type=cfg.loss_type,
        scale_rewards=cfg.scale_rewards,
        warmup_steps=cfg.warmup_ratio,  # transformers 5: a float < 1 is a share of the steps
        lr_scheduler_type=cfg.lr_scheduler_type,
        weight_decay=cfg.weight_decay,
        max_grad_norm=cfg.max_grad_norm,
        gradient_checkpointing=cfg.gradient_checkpointing,
        use_cpu=not cuda,
        bf16=use_bf16(cfg) or use_autocast(cfg),  # float32 weights + bf16=True: accelerate's autocast
        use_vllm=cfg.use_vllm,
        logging_steps=cfg.logging_steps,
        log_completions=cfg.log_completions,
        save_strategy="no",
        report_to="none",  # our TensorBoardCallback writes out_dir/tb; train.report_to: the loop's run (graph/tracking.py)
        seed=seed,
        data_seed=seed,
        disable_tqdm=not progress,  # a step bar with ETA on the terminal
        resample_rounds=cfg.resample_rounds,
        resample_seed=seed,
        rollout_dtype=cfg.rollout_dtype,
        rollout_prepack=cfg.rollout_prepack,
        share_prompt=cfg.share_prompt,
    )
    if cfg.use_vllm:
        kwargs.update(vllm_mode=cfg.vllm_mode, vllm_gpu_memory_utilization=cfg.vllm_gpu_memory_utilization)
        # vLLM's context: the longest prompt kept (build_dataset drops longer ones) plus the longest answer; TRL
        # would otherwise take the model's whole context (Qwen3: 40,960) and size the KV cache for it
        kwargs["vllm_max_model_length"] = cfg.max_prompt_length + cfg.max_completion_length
    if cfg.save_steps > 0:  # in-stage checkpoints, completed by trainer.resume's callback
        kwargs.update(save_strategy="steps", save_steps=cfg.save_steps)
    if cfg.enable_thinking is not None:  # the same switch as prompt counting and the vLLM requests
        from llm_backends.policy import template_kwargs

        kwargs["chat_template_kwargs"] = template_kwargs(cfg.enable_thinking)
    return DynamicSamplingGRPOConfig(**kwargs)


def tb_scalars(log_dir: Path, metrics: dict) -> None:
    """Stage-level summary scalars under `stage/<name>` (one point per stage)."""
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(log_dir=str(log_dir)) as w:
        for k, v in metrics.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                w.add_scalar(f"stage/{k}", v, 0)


def stop_callbacks(save: bool = False) -> list:
    """The stop-flag callback (`trainer.stop`): the first SIGINT/SIGTERM ends training at a step boundary;
    `save=True`: after saving the step it finished (an in-stage checkpoint, completed by trainer.resume)."""
    from trainer.stop import StopCallback

    return [StopCallback(save=save)]


def raise_if_stopped(what: str, trainer=None) -> None:
    """After `trainer.train()`: raise `StageInterrupted` when the stop flag ended it early (the stage's own
    checkpoint is not written); with `trainer`, say the in-stage checkpoint that `--resume` continues from."""
    from trainer.stop import StageInterrupted, stop_requested

    if stop_requested():
        step = int(trainer.state.global_step) if trainer is not None else 0
        saved = trainer is not None and (Path(trainer.args.output_dir) / f"checkpoint-{step}").is_dir()
        raise StageInterrupted(
            f"{what} stopped on request after step {step}, saved in {Path(trainer.args.output_dir).name}/"
            f"checkpoint-{step}: a resume continues from it" if saved
            else f"{what} stopped at a step boundary on request; nothing of it was saved")


def quiet_trainer(trainer, progress: bool, label: str) -> None:
    """No trainer log dicts on stdout (they go to the log file); a labelled step bar when `progress`."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(_LogDictsToFile())
    if not progress:
        trainer.remove_callback(ProgressCallback)
        return
    trainer.remove_callback(ProgressCallback)
    trainer.add_callback(_LabelledProgress(label))


class _LogDictsToFile:
    """Each trainer log dict as one INFO line of the `trainer.log` logger: in the stage's child process that
    is `stage_<k>/logs/train.log` only (its terminal handler shows warnings and up; trainer.child)."""

    def __new__(cls):
        from transformers.trainer_callback import TrainerCallback

        class LogDicts(TrainerCallback):
            def on_log(self, args, state, control, logs=None, **kwargs):
                if logs and state.is_world_process_zero:
                    logging.getLogger("trainer.log").info("step %d: %s", state.global_step,
                                                            json.dumps(logs, default=str))

        return LogDicts()


class _LabelledProgress:
    """transformers' step bar with a label (`SFT warm start: 40%|... [02:10<03:15, ...]`), made lazily so that
    importing this module needs no transformers."""

    def __new__(cls, label: str):
        from transformers.trainer_callback import ProgressCallback

        class Labelled(ProgressCallback):
            def on_train_begin(self, args, state, control, **kwargs):
                super().on_train_begin(args, state, control, **kwargs)
                if self.training_bar is not None:
                    self.training_bar.set_description(label)

            def on_log(self, args, state, control, logs=None, **kwargs):  # no dicts on stdout
                if self.training_bar is not None and logs and "loss" in logs:
                    self.training_bar.set_postfix(loss=f"{logs['loss']:.3f}")

        return Labelled()
