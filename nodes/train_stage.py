"""Train stage: GRPO (TRL `GRPOTrainer`) on one stage's MAPF-FrozenLake instances.

One stage continues the policy from the previous stage's checkpoint (or from the base policy model at
stage 0), optionally after an SFT warm start on solver-optimal plans (`nodes.sft`, first stage only: a
135M model almost never writes a valid plan by itself, so every GRPO group would score zero). The reward
is the testbed's (`env.verify` + `env.total_reward`: the paper's validity gate, gap shaping and adaptive
length weights). The adaptive weights' running state (`env.RewardState`) is updated per batch, saved in
the checkpoint's `trainer_meta.json` and restored by the next stage.

Outputs in the stage folder (`run_dir/stage_<k>/`):
- `checkpoint/`: the full model (safetensors + tokenizer) or, with `lora=True`, the peft adapter (+ tokenizer),
  and `trainer_meta.json` {reward_state, base_model, is_lora, stage facts}. Written to a temporary folder and
  renamed into place, so a crash never leaves a half checkpoint that looks complete.
- `metrics.json`: `train/...` figures (reward mean/std, `train/zero_std_groups` = share of GRPO groups whose
  completions all got the same reward, i.e. no learning signal; valid rate of sampled completions; steps;
  seconds; seconds per step; `train/outside_loop_share` = share of the stage's wall time spent outside TRL's
  own training loops).
- `tb/`: TensorBoard logs: TRL's per-step scalars under `train/...` (`train/reward`, `train/reward_std`,
  `train/loss`, `train/frac_reward_zero_std`, ...) plus ours (`train/valid_rate`, `train/optimal_rate`,
  `train/zero_std_groups`, `train/w_acc`, `train/w_len`, `train/completion_tokens`), and one point per stage
  for every number in `metrics.json` under `stage/<name>` (`stage/train/reward_mean`, `stage/sft/loss`, ...).
  The SFT warm start logs transformers' own names (`train/loss`, `train/learning_rate`, ...) to the
  separate TensorBoard run `tb/sft/`, so its curves never mix with GRPO's.
  With several processes (accelerate), only the main process writes the checkpoint, `metrics.json` and `tb/`;
  the reward statistics in `metrics.json` are then the main process's share of the completions.

Presets (`TRAIN_PRESETS`): `smoke` (CI, seconds), `cpu` (embedded 135M model on a laptop, warm start on),
`paper` (Qwen3-4B, 4,000 instances per stage, 2 epochs, LoRA, vLLM generation, for a GPU).

Generation during training: TRL's transformers path everywhere by default on CPU. On a GPU, `use_vllm=True`
uses TRL's colocated vLLM (`vllm_mode="colocate"`) or a separate `trl vllm-serve` (`vllm_mode="server"`).
TRL's colocated vLLM does not sync weights on vLLM's CPU backend (VLLM-CPU.md); we do not patch it, because
its ~40 s engine start-up per stage outweighs the ~3.5 s/step it saves over a few-minute CPU stage.

`use_vllm=True` without CUDA is refused at stage start (`check_generation_backend`), before any model loads.

The graph's `train_stage` node runs `run_stage` in a child process of its own (`nodes.stage_child`; several GPUs:
`STAGE_LAUNCHER`), so that GPU memory, TRL's RANK/WORLD_SIZE/MASTER_* variables and vLLM's process groups end
with the stage. `save_steps > 0` saves a resumable checkpoint every N steps and a restarted stage continues from
it (`nodes.stage_resume`). With vLLM generation, LoRA weight syncs merge into copies, never into the bf16 base
(`nodes.lora_sync`). `enable_thinking` is the chat template's thinking switch, the same in TRL, prompt counting
and every vLLM request (paper: off).

Multi-GPU / multi-node goes through TRL's own engine (`accelerate`), with the module CLI and the configs in
`configs/accelerate/` (copies of TRL's `trl/accelerate_configs/`, documented there):
    accelerate launch --config_file configs/accelerate/multi_gpu.yaml -m nodes.train_stage --preset paper \
        --train-path runs/R/stage_0/train.jsonl --init Qwen/Qwen3-4B --out runs/R/stage_0
    # full fine-tunes too big for one GPU's memory: configs/accelerate/deepspeed_zero2.yaml (pip install deepspeed)
    # fewer GPUs: add --num_processes N (overrides the config's 8)
    # multi-node: add --num_machines N --machine_rank i --main_process_ip HOST --main_process_port 29500
    # generation in a separate vLLM server: `CUDA_VISIBLE_DEVICES=7 trl vllm-serve --model Qwen/Qwen3-4B`
    # then --num_processes 7 and TRAIN__VLLM_MODE=server (every TrainConfig field reads TRAIN__<NAME>).
    # later stages: --init runs/R/stage_<k-1>/checkpoint (a missing folder is an error, never the base model)
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import statistics
import time
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

# one home for what the policy sees and how a completion's text is read: the env's library (no torch)
from env.library import LengthAwareReward, completion_text, prompt_messages  # noqa: F401 - also imported from here

log = logging.getLogger(__name__)
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

from llm_backends.checkpoints import CheckpointError, check_checkpoint, load_checkpoint, save_checkpoint  # noqa: E402
from nodes.train_config import TRAIN_PRESETS, TrainConfig, wants_lora  # noqa: E402 - after the warning filter

# ----------------------------------------------------------------------------------------------------
# data and reward


def chat_template_kwargs(enable_thinking: bool | None) -> dict:
    """The chat template's extra arguments for a `TrainConfig.enable_thinking` value ({} for None)."""
    return {} if enable_thinking is None else {"enable_thinking": bool(enable_thinking)}


def prompt_tokens(tokenizer, messages: list[dict], template_kwargs: dict | None = None) -> int:
    """Token count of the chat-templated prompt (with the generation prompt), as TRL feeds it (TRL passes its
    `chat_template_kwargs` to `apply_chat_template`; pass the same here)."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                         **(template_kwargs or {}))
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def build_dataset(
    instances: list, tokenizer, max_prompt_length: int, prompt_style: str = "full",
    template_kwargs: dict | None = None,
) -> tuple[Any, int]:
    """A `datasets.Dataset` with `prompt` (chat messages) and the reward's columns; and the dropped count.

    `instance` holds the full instance JSON, so the reward scores each completion against exactly the
    instance it answered, whatever order TRL batches rows in; `instance_id` is for logs and grouping.
    """
    from datasets import Dataset

    rows, dropped = [], 0
    for inst in instances:
        msgs = prompt_messages(inst, prompt_style)
        n = prompt_tokens(tokenizer, msgs, template_kwargs)
        if n > max_prompt_length:
            dropped += 1
            continue
        rows.append({"prompt": msgs, "instance": inst.to_json(), "instance_id": inst.id})
    return Dataset.from_list(rows), dropped


class MapfReward(LengthAwareReward):
    """TRL reward function: `env.verify` + `env.total_reward` with the adaptive length weights: the library's
    `LengthAwareReward`, plus the prompt check, the instance cache and per-batch statistics.

    TRL calls it with `prompts`, `completions`, `completion_ids` and every dataset column as a list aligned
    with the completions (here `instance`, `instance_id`). Each completion is scored against the instance
    JSON in its own row, never against a position in the batch. When `prompts` are given, each must be the
    instance's own prompt (`env.render_prompt`, as the last user message); a row whose prompt shows another
    map raises `ValueError`, since its completion answered a different instance. The batch is scored with
    the weights in force before it, then `RewardState.update` takes the batch's token counts (one update
    per batch).
    Per-batch statistics go to TRL's `log_metric` (-> TensorBoard `train/<name>`) and to `self.history`.
    """

    __name__ = "mapf"

    def __init__(self, tokenizer=None, reward_state: dict | None = None, prompt_style: str = "full"):
        from env import RewardState

        # the state, the tokenizer and token counting are the library reward's (env.library.LengthAwareReward)
        super().__init__(RewardState.model_validate(reward_state) if reward_state else None, tokenizer)
        self.prompt_style = prompt_style
        self.history: list[dict] = []
        self._cache: dict[str, Any] = {}
        self._prompts: dict[str, str] = {}

    def _instance(self, raw):
        from env import Instance

        if not isinstance(raw, str):
            return raw if hasattr(raw, "grid") else Instance.model_validate(raw)
        inst = self._cache.get(raw)
        if inst is None:
            inst = self._cache[raw] = Instance.from_json(raw)
        return inst

    def _check_prompt(self, row: int, raw, inst, prompt) -> None:
        """Raise `ValueError` unless `prompt` (chat messages or text) is `inst`'s rendered prompt."""
        from env import render_prompt

        want = self._prompts.get(raw) if isinstance(raw, str) else None
        if want is None:
            want = render_prompt(inst, self.prompt_style)
            if isinstance(raw, str):
                self._prompts[raw] = want
        if isinstance(prompt, str):
            ok, got = want in prompt, prompt
        else:
            users = [m.get("content") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
            got = users[-1] if users else ""
            ok = got == want
        if not ok:
            got = str(got)
            at = next((i for i, (a, b) in enumerate(zip(want, got, strict=False)) if a != b), len(got))
            raise ValueError(
                f"reward 'mapf': row {row}: its prompt is not the prompt of its instance {inst.id} (they differ "
                f"from character {at}: {got[at:at + 40]!r} vs {want[at:at + 40]!r}); the dataset's 'prompt' "
                "and 'instance' columns are misaligned. Build rows with nodes.train_stage.build_dataset"
            )

    def __call__(
        self, prompts=None, completions=None, completion_ids=None, instance=None, **kw
    ) -> list[float]:
        from env import total_reward, verify

        if instance is None:
            raise ValueError("reward 'mapf' needs the dataset column 'instance' (the instance JSON)")
        if len(instance) != len(completions):
            raise ValueError(f"reward 'mapf': {len(completions)} completions but {len(instance)} instances")
        if prompts is not None and len(prompts) != len(completions):
            raise ValueError(f"reward 'mapf': {len(completions)} completions but {len(prompts)} prompts")
        weights = tuple(self.state.weights())
        rewards, n_tokens, valid, optimal, keys = [], [], [], [], []
        for i, (raw, comp) in enumerate(zip(instance, completions, strict=True)):
            inst = self._instance(raw)
            if prompts is not None:
                self._check_prompt(i, raw, inst, prompts[i])
            text = completion_text(comp)
            n = self._n_tokens(text, completion_ids[i] if completion_ids is not None else None)
            verdict = verify(inst, text)
            rewards.append(float(total_reward(verdict, n, self.state)))
            n_tokens.append(n)
            valid.append(bool(verdict.valid))
            optimal.append(bool(verdict.optimal))
            keys.append(inst.id)
        self.state.update(n_tokens)
        groups: dict[str, list[float]] = defaultdict(list)
        for k, r in zip(keys, rewards, strict=True):
            groups[k].append(r)
        multi = [g for g in groups.values() if len(g) > 1]
        zero_std = sum(1 for g in multi if max(g) - min(g) < 1e-9) / len(multi) if multi else float("nan")
        stats = {
            "valid_rate": sum(valid) / len(valid),
            "optimal_rate": sum(optimal) / len(optimal),
            "zero_std_groups": zero_std,
            "w_acc": weights[0],
            "w_len": weights[1],
            "completion_tokens": sum(n_tokens) / len(n_tokens),
        }
        self.history.append({**stats, "rewards": rewards, "groups": list(groups.values())})
        log_metric = kw.get("log_metric")
        if log_metric is not None:
            for name, value in stats.items():
                if not math.isnan(value):
                    log_metric(name, value)
        return rewards


def _row_size(row: dict) -> int:
    """The grid size of a training row (`build_dataset`'s `instance` column holds the instance JSON)."""
    return int(json.loads(row["instance"])["size"])


def reward_summary(history: list[dict]) -> dict[str, float]:
    """Stage-level `train/...` reward statistics from `MapfReward.history`."""
    rewards = [r for h in history for r in h["rewards"]]
    groups = [g for h in history for g in h["groups"] if len(g) > 1]
    if not rewards:
        return {"train/reward_mean": float("nan"), "train/reward_std": float("nan")}
    q = max(1, len(history) // 4)
    first = [r for h in history[:q] for r in h["rewards"]]
    last = [r for h in history[-q:] for r in h["rewards"]]
    valid = [h["valid_rate"] * len(h["rewards"]) for h in history]
    optimal = [h["optimal_rate"] * len(h["rewards"]) for h in history]
    return {
        "train/reward_mean": statistics.fmean(rewards),
        "train/reward_std": statistics.pstdev(rewards),
        "train/reward_group_std_mean": statistics.fmean(statistics.pstdev(g) for g in groups)
        if groups
        else 0.0,
        "train/reward_first_quarter": statistics.fmean(first),
        "train/reward_last_quarter": statistics.fmean(last),
        "train/zero_std_groups": sum(1 for g in groups if max(g) - min(g) < 1e-9) / len(groups)
        if groups
        else 1.0,
        "train/groups": len(groups),
        "train/completions": len(rewards),
        "train/valid_rate": sum(valid) / len(rewards),
        "train/optimal_rate": sum(optimal) / len(rewards),
        "train/completion_tokens": statistics.fmean(h["completion_tokens"] for h in history),
    }


# ----------------------------------------------------------------------------------------------------
# the stage


def _use_bf16(cfg: TrainConfig) -> bool:
    import torch

    if cfg.bf16 is not None:
        return cfg.bf16
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()


def _lora_config(cfg: TrainConfig):
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


def main_process() -> bool:
    """True in a single process, and in process zero under accelerate/torchrun (the one that writes files)."""
    return int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")) or 0) == 0


def _tb_callback(log_dir: Path, main: bool = True):
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
    """The TRL `GRPOConfig` for a `TrainConfig` (CPU: `use_cpu=True`, `bf16=False`, see VLLM-CPU.md)."""
    import torch
    from trl import GRPOConfig

    cuda = torch.cuda.is_available()
    kwargs: dict[str, Any] = dict(
        output_dir=str(out_dir / "trl"),
        learning_rate=cfg.learning_rate,
        num_generations=cfg.num_generations,
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
        bf16=_use_bf16(cfg),
        use_vllm=cfg.use_vllm,
        logging_steps=cfg.logging_steps,
        log_completions=cfg.log_completions,
        save_strategy="no",
        report_to="none",  # our TensorBoardCallback writes out_dir/tb; train.report_to: the loop's run (graph/tracking.py)
        seed=seed,
        data_seed=seed,
        disable_tqdm=not progress,  # a step bar with ETA on the terminal
    )
    if cfg.use_vllm:
        kwargs.update(vllm_mode=cfg.vllm_mode, vllm_gpu_memory_utilization=cfg.vllm_gpu_memory_utilization)
        # vLLM's context: the longest prompt kept (build_dataset drops longer ones) plus the longest answer; TRL
        # would otherwise take the model's whole context (Qwen3: 40,960) and size the KV cache for it
        kwargs["vllm_max_model_length"] = cfg.max_prompt_length + cfg.max_completion_length
    if cfg.save_steps > 0:  # in-stage checkpoints, completed by nodes.stage_resume's callback
        kwargs.update(save_strategy="steps", save_steps=cfg.save_steps)
    if cfg.enable_thinking is not None:  # the same switch as prompt counting and the vLLM requests
        kwargs["chat_template_kwargs"] = chat_template_kwargs(cfg.enable_thinking)
    return GRPOConfig(**kwargs)


def run_stage(
    *,
    train_path: Path,
    init_checkpoint: Path | str,
    out_dir: Path,
    cfg: TrainConfig,
    seed: int,
    reward_state: dict | None,
    progress: bool = True,
    warm_start: bool | None = None,
) -> dict:
    """Train one stage and write `out_dir/checkpoint/`, `out_dir/metrics.json`, `out_dir/tb/`.

    Args:
        train_path: the stage's instances (`.jsonl`, one `env.Instance` a line).
        init_checkpoint: a local folder: the previous stage's checkpoint, or the base model's folder
            (`llm_backends.models.resolve_model(...)`) for the first stage. A missing or corrupt folder raises
            `CheckpointError`.
        out_dir: the stage folder.
        cfg: hyper-parameters.
        seed: seed of sampling, shuffling and initialisation.
        reward_state: `env.RewardState` dump to continue from; None: the checkpoint's saved state, else fresh.
        progress: log progress lines (INFO) while training.
        warm_start: run the SFT warm start; None: when `cfg.sft_warm_start` and `init_checkpoint` is a
            base model (not a checkpoint of this module), i.e. at the first stage.

    Returns:
        {"checkpoint": str, "reward_state": dict, "metrics": dict}
    """
    t_start = time.perf_counter()
    loop_s = 0.0
    check_generation_backend(cfg)  # before any work: a CPU machine cannot run TRL's vLLM path
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    train_path = Path(train_path)
    if not train_path.exists():
        raise FileNotFoundError(f"training set {train_path} does not exist (the apply node writes it)")
    init = Path(init_checkpoint)
    meta_in = check_checkpoint(init)  # raises CheckpointError before any work
    if reward_state is None and meta_in is not None:
        reward_state = meta_in.get("reward_state")
    base_model = str((meta_in or {}).get("base_model") or init.resolve())
    import torch
    from transformers import set_seed
    from env import read_jsonl

    set_seed(seed)
    if not progress:
        logging.getLogger("transformers").setLevel(logging.WARNING)
    from nodes.trl_cpu import score_labelled_positions_only

    instances = read_jsonl(train_path)
    if not instances:
        raise ValueError(f"training set {train_path} holds no instances")
    score_labelled_positions_only()  # TRL's fused LM head: only answer positions on CPU too (nodes.trl_cpu)
    if cfg.use_vllm:  # LoRA syncs into vLLM merge into copies: the bf16 base never drifts (nodes.lora_sync)
        from nodes.lora_sync import install_exact_lora_sync

        install_exact_lora_sync()
    metrics: dict[str, Any] = {}
    do_sft = warm_start if warm_start is not None else (cfg.sft_warm_start and meta_in is None)
    from nodes import stage_resume

    key = stage_resume.stage_key(train_path=train_path, init_checkpoint=init, seed=seed, cfg=cfg)
    resume = stage_resume.find_resume(out_dir / "trl", key)  # a half-trained attempt of this very stage
    load_from, warm_info = init, None
    if do_sft and cfg.sft_sizes:
        # the cached warm start (nodes.sft.build_warm_start): built once per (model, warm-start settings, seed)
        from nodes.sft import build_warm_start

        t0 = time.perf_counter()
        ws = build_warm_start(init, cfg, seed, progress=progress)
        loop_s += ws["metrics"].get("sft/seconds", 0.0) if not ws["hit"] else 0.0
        warm_info = {"key": ws["key"], "path": ws["path"], "hit": ws["hit"]}
        metrics.update(ws["metrics"])
        metrics.update({"sft/cache_key": ws["key"], "sft/cache_path": ws["path"], "sft/cache_hit": ws["hit"],
                        "sft/cache_seconds": time.perf_counter() - t0})
        load_from = Path(ws["path"])
        if main_process() and (load_from / "tb" / "sft").is_dir():  # the warm start's curves, beside GRPO's
            shutil.copytree(load_from / "tb" / "sft", out_dir / "tb" / "sft", dirs_exist_ok=True)
    dtype = "bfloat16" if _use_bf16(cfg) else "float32"
    model, tok = load_checkpoint(load_from, dtype=dtype, trainable=True)
    from peft import PeftModel

    if isinstance(model, PeftModel) and not (meta_in or {}).get("base_model"):
        # a bare adapter folder (no trainer_meta.json): its base is the one load_checkpoint used
        base_model = str(Path(model.peft_config[model.active_adapter].base_model_name_or_path).resolve())
    if not isinstance(model, PeftModel) and wants_lora(cfg.lora, sum(p.numel() for p in model.parameters())):
        from peft import get_peft_model

        model = get_peft_model(model, _lora_config(cfg))
        # The new adapter sits on the weights it was loaded onto (the base model, the cached warm start, or a
        # previous stage's full fine-tune): those are what the next load must put it on.
        base_model = str(load_from.resolve())
        for pc in model.peft_config.values():
            pc.base_model_name_or_path = base_model
    is_lora = isinstance(model, PeftModel)
    if cfg.train_layers and not is_lora:
        freeze_lower_layers(model, cfg.train_layers)
    if cfg.gradient_checkpointing:
        model.config.use_cache = False

    if do_sft and not cfg.sft_sizes and resume is None:  # on the stage's own instances: not cached (they vary
        # per run); a resumed stage skips it: the in-stage checkpoint holds the weights trained after it
        from nodes.sft import warm_start as sft_warm_start

        sft = sft_warm_start(model, tok, instances, cfg=cfg, out_dir=out_dir, seed=seed, progress=progress)
        loop_s += sft["seconds"]
        metrics.update({f"sft/{k}": v for k, v in sft.items()})

    dataset, dropped = build_dataset(instances, tok, cfg.max_prompt_length, cfg.prompt_style,
                                     chat_template_kwargs(cfg.enable_thinking))
    if len(dataset) == 0:
        raise ValueError(
            f"all {len(instances)} prompts of {train_path} are longer than max_prompt_length={cfg.max_prompt_length}"
        )
    reward = MapfReward(tok, reward_state, cfg.prompt_style)
    if resume is not None:
        stage_resume.restore_reward(reward, resume[1])
        metrics["train/resumed_from_step"] = int(resume[1]["global_step"])
        if progress:
            log.info("resuming %s from its in-stage checkpoint %s (step %d)", out_dir.name, resume[0],
                     resume[1]["global_step"])
    args = grpo_config(cfg, out_dir, seed, progress=progress)
    main = args.process_index == 0  # = trainer.is_world_process_zero(); only it writes files
    from nodes.grpo_sampling import make_trainer_class, sampling_metrics
    from nodes.sft import _extra_callbacks, _quiet_trainer, _raise_if_stopped

    trainer = make_trainer_class()(
        model=model,
        reward_funcs=[reward],
        args=args,
        train_dataset=dataset,
        processing_class=tok,
        callbacks=[_tb_callback(out_dir / "tb", main=main), *_extra_callbacks(),
                   *([stage_resume.resume_callback(reward, key, main)] if cfg.save_steps > 0 else [])],
        resample_rounds=cfg.resample_rounds,
        resample_seed=seed,
        group_key=_row_size,  # replacements lean to the sizes where the policy is sometimes right
    )
    _quiet_trainer(trainer, progress, label=f"GRPO {out_dir.name}")
    t0 = time.perf_counter()
    result = trainer.train(resume_from_checkpoint=str(resume[0]) if resume is not None else None)
    grpo_s = time.perf_counter() - t0
    loop_s += grpo_s
    _raise_if_stopped(f"GRPO of {out_dir.name}")
    steps = int(trainer.state.global_step)
    metrics.update(sampling_metrics(trainer.stats))

    meta = {
        "reward_state": reward.state.model_dump(mode="json"),
        "base_model": base_model,
        "is_lora": is_lora,
        "init_checkpoint": str(init),
        "train_path": str(train_path),
        "seed": seed,
        "grpo_steps": steps,
        "sft_warm_start": bool(do_sft),
        "warm_start_cache": warm_info,
        "prompt_style": cfg.prompt_style,
        "train_config": cfg.model_dump(mode="json"),
    }
    ckpt = save_checkpoint(trainer, out_dir / "checkpoint", meta)
    if main:
        shutil.rmtree(out_dir / "trl", ignore_errors=True)  # TRL's output_dir: nothing we keep

    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    trl_zero = [h["frac_reward_zero_std"] for h in trainer.state.log_history if "frac_reward_zero_std" in h]
    metrics.update(reward_summary(reward.history))
    wall = time.perf_counter() - t_start
    metrics.update(
        {
            "train/steps": steps,
            "train/instances": len(dataset),
            "train/prompts_dropped": dropped,
            "train/loss": statistics.fmean(losses) if losses else float(result.training_loss),
            "train/frac_reward_zero_std_trl": statistics.fmean(trl_zero) if trl_zero else None,
            "train/w_acc": reward.state.weights()[0],
            "train/w_len": reward.state.weights()[1],
            "train/grpo_seconds": grpo_s,
            "train/seconds_per_step": grpo_s / steps if steps else None,
            "train/seconds": wall,
            "train/outside_loop_seconds": wall - loop_s,
            "train/outside_loop_share": (wall - loop_s) / wall,
            "train/is_lora": is_lora,
            "train/device": "cuda" if torch.cuda.is_available() else "cpu",
        }
    )
    if main:
        from nodes.files import write_text_atomic

        write_text_atomic(out_dir / "metrics.json", json.dumps(metrics, indent=2, default=str) + "\n")
        _tb_scalars(out_dir / "tb", metrics)
    if progress and main:
        log.info(
            "stage trained: %d steps, %.1f s/step, reward %.3f, valid %.2f, zero-std groups %.2f -> %s",
            steps,
            metrics["train/seconds_per_step"] or 0.0,
            metrics["train/reward_mean"],
            metrics.get("train/valid_rate", float("nan")),
            metrics.get("train/zero_std_groups", float("nan")),
            ckpt,
        )
    del trainer, model
    return {"checkpoint": str(ckpt), "reward_state": meta["reward_state"], "metrics": metrics}


def _tb_scalars(log_dir: Path, metrics: dict) -> None:
    """Stage-level summary scalars under `stage/<name>` (one point per stage)."""
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(log_dir=str(log_dir)) as w:
        for k, v in metrics.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                w.add_scalar(f"stage/{k}", v, 0)


def train_stage(state: dict, runtime) -> dict:
    """Graph node: GRPO on `state["train_path"]` from `state["checkpoint"]` (stage 0 only: None = the base
    policy model; a later stage without a checkpoint raises `CheckpointError`, never restarts from the base).

    Returns {"checkpoint", "reward_state", "train_metrics"}. Stage folder: `run_dir / f"stage_{k}"`.
    """
    from llm_backends.models import resolve_model

    settings = runtime.context.settings
    stage = int(state["stage"])
    out_dir = Path(runtime.context.run_dir) / f"stage_{stage}"
    prev = state.get("checkpoint")
    if not prev and stage > 0:
        raise CheckpointError(
            f"stage {stage}: the state holds no checkpoint (checkpoint={prev!r}), so stage {stage - 1}'s training "
            "is lost; only stage 0 starts from the base model. Resume the run from a state saved after stage "
            f"{stage - 1} trained, or start a new run"
        )
    init = Path(prev) if prev else resolve_model(settings.policy_model)
    from nodes.stage_child import run_stage_in_child

    # in a child process of its own (nodes.stage_child): GPU memory, TRL's RANK/WORLD_SIZE/MASTER_* variables
    # and vLLM's process groups end with it, so no stage inherits them from the one before
    result = run_stage_in_child(
        label=f"stage {stage} training",
        train_path=Path(state["train_path"]),
        init_checkpoint=init,
        out_dir=out_dir,
        cfg=settings.train,
        seed=int(settings.seed) + 1000 * stage,
        reward_state=state.get("reward_state") or None,
        warm_start=settings.train.sft_warm_start and prev is None,
    )
    m = result["metrics"]
    line = (
        f"stage {stage}: trained {m['train/steps']} GRPO steps in {m['train/seconds']:.0f} s, "
        f"reward {m['train/reward_mean']:.3f} -> {result['checkpoint']}"
    )
    lines = [line]
    dead = m.get("train/zero_std_groups_trained")
    if dead is None or not math.isfinite(dead):
        dead = m.get("train/zero_std_groups")
    if isinstance(dead, float) and dead >= 1.0:
        lines.append(
            f"stage {stage}: WARNING every GRPO group scored the same (zero reward variance): no weight moved. "
            "The stage's maps may all be out of the policy's reach; see stage metrics and report.md"
        )
    return {
        "checkpoint": result["checkpoint"],
        "reward_state": result["reward_state"],
        "train_metrics": m,
        "log": lines,
    }


def init_from_arg(text: str) -> Path:
    """The folder named by `--init`: an existing folder, else a model name for `llm_backends.models.resolve_model`.

    Text that looks like a local path (absolute, `./`, `~`, two or more `/`, or `a/b` where `a` is a local
    folder, e.g. `runs/x/stage_0/checkpoint`) but does not exist raises `CheckpointError`, rather than going
    to the Hugging Face hub as an `org/name` id would.
    """
    path = Path(text).expanduser()
    if path.exists():
        return path
    head = text.split("/", 1)[0]
    looks_local = (
        text.startswith((".", "/", "~"))
        or text.count("/") >= 2
        or (os.sep != "/" and os.sep in text)
        or ("/" in text and Path(head).expanduser().is_dir())
    )
    if looks_local:
        raise CheckpointError(
            f"--init {text}: no such checkpoint folder ({path.resolve()}); pass the previous stage's "
            "checkpoint folder (runs/<run>/stage_<k>/checkpoint), a base model folder, or a model name"
        )
    from llm_backends.models import resolve_model

    return resolve_model(text)


def main(argv: list[str] | None = None) -> None:
    """CLI for one stage, e.g. under `accelerate launch -m nodes.train_stage ...` on GPUs."""
    p = argparse.ArgumentParser(description="Train one GRPO stage on a MAPF-FrozenLake .jsonl")
    p.add_argument("--train-path", required=True, type=Path)
    p.add_argument("--init", required=True, help="previous checkpoint folder or base model name/path")
    p.add_argument("--out", required=True, type=Path, help="stage folder")
    p.add_argument("--preset", default="cpu", choices=sorted(TRAIN_PRESETS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warm-start", choices=["auto", "yes", "no"], default="auto")
    a = p.parse_args(argv)
    raw = dict(TRAIN_PRESETS[a.preset])
    for var, value in os.environ.items():
        if var.startswith("TRAIN__") and value:
            raw[var[7:].lower()] = value
    cfg = TrainConfig.model_validate(raw)
    try:
        check_generation_backend(cfg)
        init = init_from_arg(a.init)
    except (ValueError, CheckpointError) as e:
        p.error(str(e))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("nodes.trainer").setLevel(logging.WARNING)  # trainer log dicts: not beside the bar
    ws = {"auto": None, "yes": True, "no": False}[a.warm_start]
    res = run_stage(
        train_path=a.train_path,
        init_checkpoint=init,
        out_dir=a.out,
        cfg=cfg,
        seed=a.seed,
        reward_state=None,
        warm_start=ws,
    )
    print(json.dumps({"checkpoint": res["checkpoint"], **res["metrics"]}, indent=2, default=str))


if __name__ == "__main__":
    main()
