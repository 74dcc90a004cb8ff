"""Train settings: every GRPO / SFT hyper-parameter of a stage (`TrainConfig`) and the presets (`TRAIN_PRESETS`).

A small module of its own, so that the run settings (which embed a `TrainConfig`) and the CLIs read the training
knobs without importing the trainer. The presets: `smoke` (CI, seconds), `cpu` (embedded 135M model on a laptop,
warm start on), `cpu-long` (the same model, a 4x longer stage, the one measured to gain most on a CPU, hours a run), `paper`
(Qwen3-4B, 4,000 instances per stage, 2 epochs, LoRA, vLLM generation, for a GPU).
Every field can also be set from the environment as `TRAIN__<NAME>` (`trainer.stage`'s CLI).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

LORA_AUTO_PARAMS = 1e9  # `lora="auto"` turns LoRA on above this many parameters


def wants_lora(lora: bool | str, num_params: int) -> bool:
    """The LoRA decision for a model of `num_params` parameters (`lora`: True, False or "auto")."""
    return lora if isinstance(lora, bool) else num_params > LORA_AUTO_PARAMS


# Training levers measured and removed (docs/learning-log.md), at the values that turned them off. A settings file
# written before their removal that holds them off ran what the trainer runs now, and loads without them.
REMOVED_OFF: dict[str, Any] = {
    "rollout_branch": 0.0, "branch_confidence": 0.9, "screen_samples": 0, "localize_credit": False,
    "positive_weight": 1.0, "negative_weight": 1.0, "step_credit": 0.0, "step_credit_idle": 0.0,
    "select_instances": 0, "select_every": 8, "sft_mix": 0.0, "sft_mix_batch": 4,
}


def without_removed_levers(raw: Any) -> Any:
    """`raw` (a train settings mapping) without the removed levers it holds at their off values; one that holds
    one on raises ValueError naming it: this version cannot run, resume or pool what it trained."""
    if not isinstance(raw, dict):
        return raw
    on = {k: v for k, v in raw.items() if k in REMOVED_OFF and v != REMOVED_OFF[k]}
    if on:
        names = ", ".join(f"{k}={v!r}" for k, v in sorted(on.items()))
        offs = ", ".join(f"{k}={REMOVED_OFF[k]!r}" for k in sorted(on))
        raise ValueError(f"{names}: a setting removed from the trainer after it was measured (docs/learning-log.md); "
                         f"a settings file that holds it off ({offs}) still loads, anything else needs the version "
                         "of the project that ran it (the settings' git commit)")
    return {k: v for k, v in raw.items() if k not in REMOVED_OFF}


class TrainConfig(BaseModel):
    """Every GRPO / SFT hyper-parameter of a stage (defaults = the `cpu` preset's values)."""

    # every float finite: `1e400` reads as inf, which no bound refuses, and a run on it dies after one step
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    # --- data
    prompt_style: Literal["full", "compact", "moves"] = Field(
        "compact",
        description="the policy's prompt at training and evaluation: full (the paper's, with the rules text), "
        "compact (map, hole list, agents and answer format only, no default system prompt: 2.3x fewer tokens, "
        "for small models) or moves (compact plus each ice cell's legal moves: 2-3.5x compact's tokens; its "
        "warm start was 2.4x slower per step and no better, 3.3 against 13.3 % greedy after 800 examples: "
        "evals/results/learning_cpu). The same instance and verifier in every style",
    )
    instances_per_stage: int = Field(64, ge=1, description="training instances generated per stage")
    max_train_size: int | None = Field(
        5,
        ge=3,
        le=10,
        description="train only on maps up to this size: a stage's data share on larger sizes moves onto 3..N "
        "before its set is generated (the engineer's proposal is kept as proposed, the stage's config.json holds "
        "what was trained). The cpu preset's 5: the 135M policy is never valid above 5x5, so every GRPO group "
        "there scores 0, teaches nothing and costs 1.5-2x a small map's step. None: all sizes 3..10 (the paper)",
    )
    max_prompt_length: int = Field(
        1024, ge=16, description="prompts longer than this (tokens) are dropped from training, and counted"
    )
    optimizer: Literal["grpo", "filtered"] = Field(
        "grpo",
        description="the stage optimizer: grpo (TRL's GRPOTrainer), or filtered (reward-filtered fine-tuning: sample "
        "num_generations answers a prompt, keep the verified ones, fine-tune on them at learning_rate in full batches of sft_batch_size; trainer/filtered.py)",
    )
    filtered_prompts: int = Field(16, ge=1, description="optimizer=filtered: prompts sampled per round")
    stage_samples: int = Field(
        0,
        ge=0,
        description="optimizer=filtered: the stage's budget in sampled answers, the same whatever its levels: it ends "
        "once it has sampled this many (num_generations a prompt) and trains on what it kept, in full batches; a stage "
        "that keeps nothing takes no step and keeps the start's weights. 0: no budget, the stage runs max_steps "
        "optimiser steps (giving up after 50 rounds a step that keep nothing), or one pass over its items",
    )
    filtered_sampler: Literal["rollout", "vllm", "generate", "auto"] = Field(
        "rollout",
        description="optimizer=filtered: what samples a round's answers (trainer/filtered_sampling.py): rollout (GRPO's "
        "rollout copy of the policy, bf16 on a CPU that multiplies bf16 in hardware, re-synced after every optimiser "
        "step), vllm (a vLLM server started for the stage, the trained weights reloaded into it after every step; "
        "the fastest on 2 cores, evals/bench/bench_filtered_sampling.py), generate (transformers' generate on the "
        "trained float32 model itself) or auto (vllm where vLLM's CPU build is installed, else rollout)",
    )
    # --- GRPO
    learning_rate: float = Field(1e-5, gt=0, description="GRPO optimiser learning rate (AdamW)")
    num_generations: int = Field(16, ge=2, description="completions sampled per prompt (one GRPO group)")
    per_device_train_batch_size: int = Field(
        16, ge=1, description="completions per device per micro-batch (multiple of num_generations)"
    )
    gradient_accumulation_steps: int = Field(1, ge=1, description="micro-batches per optimiser step")
    epochs: float = Field(
        1.0, gt=0, description="passes over the stage's instances (ignored if max_steps > 0)"
    )
    max_steps: int = Field(24, ge=-1, description="GRPO optimiser steps per stage; -1 or 0: use epochs")
    num_iterations: int = Field(
        1,
        ge=1,
        le=8,
        description="optimiser steps on each generated batch (GRPO's mu, TRL's num_iterations; the policy ratio is "
        "clipped from the second on): more updates per sampled completion, where sampling is most of a step's cost. "
        "max_steps counts optimiser steps, so a stage generates max_steps / num_iterations batches",
    )
    max_completion_length: int = Field(128, ge=8, description="token limit of one sampled answer")
    temperature: float = Field(0.7, gt=0, description="sampling temperature of GRPO completions")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling of GRPO completions")
    beta: float = Field(
        0.0, ge=0, description="KL coefficient to the reference model (0: no reference model)"
    )
    loss_type: str = Field("dapo", description="TRL GRPO loss: grpo | dapo | dr_grpo | bnpo | ...")
    scale_rewards: str = Field("group", description="TRL reward scaling: group | batch | none")
    warmup_ratio: float = Field(0.0, ge=0, le=1, description="linear warm-up share of the steps")
    lr_scheduler_type: str = Field("constant", description="learning-rate schedule (transformers name)")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    max_grad_norm: float = Field(1.0, gt=0, description="gradient clipping norm")
    train_layers: int = Field(
        8,
        ge=0,
        description="full fine-tune: train only the top N transformer blocks (+ final norm; 0: all weights). "
        "Backward then stops at block N from the top: about 3x cheaper steps on CPU with N=8 of 30",
    )
    gradient_checkpointing: bool = Field(False, description="trade compute for memory (large models)")
    bf16: bool | None = Field(None, description="bf16 weights/compute; None: on CUDA with bf16 support only")
    autocast_bf16: bool | None = Field(
        None,
        description="GRPO's training forward and backward under bf16 autocast over float32 weights (the optimiser "
        "and its updates stay float32); None: on a CPU that multiplies bf16 in hardware, AMX or AVX-512 BF16 (with "
        "the bf16 rollout copy: 15.5 -> 12.9 s per GRPO step on a Xeon with AMX, 49.4 -> 40.1 and 41.0 -> 34.9 on an AMD Zen 4). Ignored when bf16 weights are on",
    )
    # --- LoRA
    lora: bool | Literal["auto"] = Field(
        "auto",
        description="train a LoRA adapter (peft) instead of all weights; auto: on for models over "
        f"{LORA_AUTO_PARAMS / 1e9:.0f}B parameters (Qwen3-4B), off for the embedded 135M model",
    )
    lora_r: int = Field(16, ge=1, description="LoRA rank")
    lora_alpha: int = Field(32, ge=1, description="LoRA scaling alpha")
    lora_dropout: float = Field(0.05, ge=0, le=1, description="LoRA dropout")
    lora_target_modules: str = Field(
        "all-linear", description="peft target_modules (comma list or all-linear)"
    )
    resample_rounds: int = Field(
        2,
        ge=0,
        le=8,
        description="dynamic sampling (DAPO): extra generations per batch that replace groups whose completions all "
        "scored the same with fresh groups that did not (0: off; trainer.grpo_trainer)",
    )
    partial_credit: float = Field(
        0.0,
        ge=0,
        lt=0.3,
        description="reward an invalid answer with this times the share of agents whose own path is sound alone "
        "(right start, on the map, no hole, legal moves, on its goal; conflicts aside), below the 0.3 of the worst "
        "valid answer. Not in the paper (0: its gated reward). Gives GRPO a gradient where no sample is valid "
        "(env.reward.partial_credit). Any other task (reasoning-gym, your own): an invalid answer earns this times its "
        "scorer's partial score; 0, the default, rewards validity alone, so that no answer that is never valid earns "
        "anything (trainer.task.TaskReward)",
    )
    partial_credit_kind: Literal["goal", "progress"] = Field(
        "goal",
        description="what partial_credit measures of each agent's own path: goal (1 if it is sound and ends on its "
        "goal, else 0) or progress (how far its sound prefix gets toward its goal, 1 - remaining / starting "
        "shortest distance over the map: answers that all fail still rank by how far they read the map right; "
        "env.reward.agents_progress)",
    )
    share_prompt: bool = Field(
        True,
        description="score a GRPO batch whose completions share one prompt (one prompt per step, as the cpu preset "
        "draws) over a single forward of that prompt, its keys and values repeated for every completion: the same "
        "loss and gradient with the prompt run once, not once per completion (CPU, no PEFT, no gradient "
        "checkpointing; elsewhere TRL's own path; trainer.trl_cpu)",
    )
    # --- generation backend
    rollout_dtype: Literal["auto", "model", "bfloat16", "float32"] = Field(
        "auto",
        description="dtype of the copy of the policy that samples GRPO's completions with transformers (no vLLM): "
        "bfloat16 (a bf16 copy, re-synced after every optimiser step; decoding on CPU is bound by reading the "
        "weights, so half the bytes), float32 (a float32 copy: the same sampler's levers, prompts prefilled once, "
        "a growing KV cache, GQA attention, without bf16's rounding), model (the trained model itself, through "
        "transformers' own generate), or auto (bfloat16 on a CPU that multiplies bf16 in hardware, AMX or AVX-512 "
        "BF16; float32 elsewhere, where bf16 is multiplied in software). Training and the scoring of completions "
        "stay in the model's dtype",
    )
    rollout_prepack: bool | None = Field(
        None,
        description="the rollout copy's linear layers through weights packed once for oneDNN (re-packed after every "
        "sync) instead of MKL's matmul, which repacks each weight on every call: on an AVX2-only AMD EPYC Zen 3, 16 "
        "sampled rows, 1.2-1.3x generated tokens/s with the same greedy tokens (evals.bench.bench_rollout). None: on "
        "for a float32 copy where torch has oneDNN; off for a bf16 copy (not measured). Costs a packed copy of the "
        "linear weights",
    )
    use_vllm: bool = Field(
        False, description="generate GRPO completions with vLLM (GPU) instead of transformers"
    )
    vllm_mode: Literal["colocate", "server"] = Field("colocate", description="TRL vLLM mode when use_vllm")
    vllm_gpu_memory_utilization: float = Field(0.3, gt=0, le=1, description="colocated vLLM's GPU share")
    optimality: Literal["makespan", "soc"] = Field(
        "makespan",
        description="what 'optimal' means in the reward's cost gap, the evaluations and the tables: makespan (the "
        "paper's \"makespan-optimal\": the latest arrival equals the instance's optimal makespan) or soc (the sum "
        "of costs equals the optimal sum of costs, the MAPF standard)",
    )
    # --- SFT warm start (first stage only)
    sft_warm_start: bool = Field(True, description="SFT on solver-optimal plans before the first GRPO stage")
    sft_epochs: float = Field(2.0, gt=0, description="SFT passes over the warm-start examples")
    sft_steps: int = Field(
        150,
        ge=-1,
        description="SFT optimiser steps; -1 or 0: use sft_epochs (150 x 8: 16.0 % greedy valid on val-small for the "
        "135M model, as the 300 float32 steps before, in a third of the time; 720 steps, an hour on 2 cores, reach "
        "25 %: evals/results/learning_cpu)",
    )
    sft_lr: float = Field(3e-4, gt=0, description="SFT learning rate")
    sft_batch_size: int = Field(8, ge=1, description="SFT examples per optimiser step")
    sft_lr_scheduler: str = Field("cosine", description="SFT learning-rate schedule (transformers name: cosine, ...)")
    sft_warmup_ratio: float = Field(0.05, ge=0, lt=1, description="SFT linear warm-up share of the steps")
    sft_order: Literal["shuffle", "size"] = Field(
        "shuffle", description="warm-start example order: shuffle, or size (small maps first: a curriculum)"
    )
    sft_train_layers: int | None = Field(
        None, ge=0, description="top blocks trained by the warm start (0: all weights; None: train_layers)"
    )
    sft_bf16: bool | None = Field(
        None,
        description="bf16 in the warm start (None: as GRPO's training: bf16 weights on a GPU that supports them, bf16 "
        "autocast on a CPU that multiplies bf16 in hardware, AMX or AVX-512 BF16; float32 elsewhere)",
    )
    sft_sizes: list[int] | None = Field(
        [3, 4, 5],
        description="warm start on fresh solver-optimal 2-agent instances of these grid sizes (cached: built once "
        "per model, warm-start settings and seed; the 135M model learns small maps in minutes, not 10x10); None: "
        "on the stage's own instances (not cached)",
    )
    sft_instances: int = Field(1200, ge=1, description="fresh warm-start instances generated when sft_sizes is set")
    # --- bookkeeping
    logging_steps: int = Field(1, ge=1, description="log to TensorBoard every this many optimiser steps")
    log_completions: bool = Field(False, description="print sampled completions to the log (TRL)")
    save_steps: int = Field(
        0,
        ge=0,
        description="save a resumable checkpoint of the stage every N GRPO optimiser steps (weights, optimiser, "
        "scheduler, RNG, reward state), or every N rounds of a filtered stage (weights, optimiser, RNG, the round and "
        "the examples not yet trained on), in stage_<k>/trl/, so that a crash or stop loses at most N steps or rounds "
        "and --resume continues the stage from there (trainer.resume); 0: none (a stop request still saves one)",
    )
    # --- chat template
    enable_thinking: bool | None = Field(
        None,
        description="Qwen3-style thinking mode of the chat template (its enable_thinking switch), the same at "
        "training (TRL's chat_template_kwargs), prompt-length counting and every vLLM request; None: pass nothing "
        "(the template's own default; SmolLM2's template has no such switch). True is refused by the loop: its "
        "evaluation is greedy, which Qwen advises against in thinking mode",
    )
    # --- tracking: the loop's own tracker (graph/tracking.py), one run per loop
    report_to: str = Field(
        "tensorboard",
        description="where the loop logs its scalars (train/* per step, eval/* per stage, final/*) on one global "
        "step: tensorboard (run_dir/tb), wandb (needs the wandb package: pip install 'env-engineer[wandb]'), "
        "tensorboard,wandb, or none",
    )

    @field_validator("report_to")
    @classmethod
    def _report_targets(cls, v: str) -> str:
        """`tensorboard`, `wandb`, `tensorboard,wandb` (any order, spaces allowed) or `none`."""
        parts = [p.strip().lower() for p in str(v).split(",") if p.strip()]
        if parts == ["none"]:
            return "none"
        if not parts or any(p not in ("tensorboard", "wandb") for p in parts):
            raise ValueError(f"report_to={v!r}: allowed: tensorboard, wandb, tensorboard,wandb, none")
        return ",".join(p for p in ("tensorboard", "wandb") if p in parts)

    @model_validator(mode="before")
    @classmethod
    def _removed_levers(cls, raw: Any) -> Any:
        return without_removed_levers(raw)

    @model_validator(mode="after")
    def _budget_fits(self) -> TrainConfig:
        if self.stage_samples and self.optimizer != "filtered":
            raise ValueError(f"stage_samples={self.stage_samples} applies to optimizer=filtered, not "
                             f"{self.optimizer}; allowed here: stage_samples=0 (GRPO stages run max_steps steps)")
        if 0 < self.stage_samples < self.num_generations:
            raise ValueError(f"stage_samples={self.stage_samples}: allowed: 0 or at least num_generations="
                             f"{self.num_generations} (one prompt's samples)")
        return self

    @field_validator("sft_sizes", mode="before")
    @classmethod
    def _sizes_from_text(cls, v: Any) -> Any:
        """`3,4` or `[3, 4]` (flags, environment) -> [3, 4]; `none` -> None."""
        if isinstance(v, str):
            text = v.strip().strip("[]").strip()
            if text.lower() in ("none", "null"):
                return None
            try:
                return [int(x) for x in text.split(",") if x.strip()]
            except ValueError:
                raise ValueError(f"sft_sizes={v!r}: allowed: grid sizes as a comma list (3,4) or none") from None
        return v

    @field_validator("sft_sizes")
    @classmethod
    def _known_sizes(cls, v: list[int] | None) -> list[int] | None:
        from env import SIZES

        if v is not None:
            bad = [s for s in v if s not in SIZES]
            if not v or bad:
                raise ValueError(f"sft_sizes={v}: allowed: a non-empty list of grid sizes from {list(SIZES)}")
            v = sorted(set(v))
        return v

    def max_steps_or_none(self) -> int | None:
        return self.max_steps if self.max_steps > 0 else None


TRAIN_PRESETS: dict[str, dict[str, Any]] = {
    # CI: a few steps, tiny completions; a stage takes well under a minute on 2 CPU cores.
    "smoke": {
        "instances_per_stage": 16,
        "max_train_size": None,  # every size, as CI's tests of the loop expect
        "num_generations": 2,
        "per_device_train_batch_size": 4,
        "max_steps": 2,
        "max_completion_length": 24,
        "learning_rate": 1e-4,
        "sft_warm_start": True,  # 2 tiny SFT steps: weights move even when every GRPO group scores the same
        "sft_steps": 2,
        "sft_batch_size": 2,
        "sft_instances": 8,
        "sft_sizes": [3],
        "sft_lr_scheduler": "constant",
        "sft_warmup_ratio": 0.0,
        "max_prompt_length": 768,
        "train_layers": 2,
        "resample_rounds": 0,  # 24-token answers are never valid: every group scores 0, resampling finds nothing
        # float32 throughout, as policy_dtype: the same samples and losses on every CI machine, bf16 hardware or not
        "rollout_dtype": "model",
        "autocast_bf16": False,
    },
    # Laptop default with the embedded SmolLM2-135M (= TrainConfig's defaults): a cached SFT warm start (150 steps x
    # 8 solver-optimal 2-agent plans on 3x3-5x5, compact prompt, bf16 autocast on bf16 CPUs), then per stage 24 GRPO
    # steps of 1 prompt x 16 completions of <= 128 tokens with dynamic sampling, sampled by a bf16 copy on bf16 CPUs
    # (a float32 copy elsewhere), top 8 blocks trained, on 3x3-5x5 maps only (max_train_size 5).
    # One stage's gain over the warm start (evals/results/learning_cpu): 24 steps of 2 prompts x 8 +1.6 points
    # (3 seeds), 96 such steps on 3x3/4x4 +4.4 [-0.8, +9.7] (5 seeds); 24 steps of 1 prompt x 16 (now) in the README
    # there (95 % intervals, two-way over seeds and the instances they share). One group of 16 per step has reward variance far more often than two of 8 (a prompt the policy gets
    # right 1 time in 10 gives a group of 8 no variance 43 % of the time, of 16 only 19 %). 24 steps is what 3
    # stages afford in the 30-minute default run.
    "cpu": {},
    # The stage measured to gain most on 2 cores, for a run that has hours rather than 30 minutes: the
    # embedded 135M model from a 300-step warm start (2,400 solver plans; 14-28 min to build, once, cached), then per
    # stage 96 GRPO steps of 2 prompts x 8 completions, every group trained as sampled (no dynamic sampling).
    # On 3x3/4x4 maps this stage raised the greedy valid rate on val-small's 150 2-agent answers by +4.9 points,
    # 95 % interval [-1.1, +10.9], over 3 pre-registered seeds on a Xeon, +5.2 [-0.4, +10.9] over 6 (every seed
    # above its start, but 150 evaluation instances cannot confirm the gain); 144
    # steps gained no more (+0.4 per paired seed, [-3.7, +4.6]), so the stage stops at 96. About
    # 30 min a stage alone on a 2-core Xeon (18-20 s a step, evals/results/cpu_long_run_xeon), where `cpu`'s
    # 24-step stage (+0.7 to +1.6 points) keeps the default run within 30 minutes.
    # The `cpu` preset's group shape instead (1 prompt x 16 with dynamic sampling) kept zero-variance groups
    # trained at 47 % but gained +1.1 [-4.7, +6.7] over 3 pre-registered seeds: half as many maps a stage.
    # evals/results/learning_cpu/README.md, "The cpu-long preset".
    "cpu-long": {
        "sft_steps": 300,
        "sft_instances": 2400,
        "max_steps": 96,
        "num_generations": 8,
        "resample_rounds": 0,
    },
    # The paper's scale on a GPU: Qwen3-4B, 4,000 instances, 2 epochs, LoRA, vLLM generation.
    "paper": {
        "prompt_style": "full",  # the paper's prompt, rules text included
        "resample_rounds": 0,  # the paper's GRPO: every group is trained on as sampled
        "instances_per_stage": 4000,
        "max_train_size": None,  # the paper trains on every size 3..10
        "epochs": 2.0,
        "max_steps": -1,
        "num_generations": 8,
        "per_device_train_batch_size": 8,
        "gradient_accumulation_steps": 8,
        "max_prompt_length": 2048,
        "max_completion_length": 4096,
        "learning_rate": 1e-5,
        "temperature": 1.0,
        "lora": True,
        "lora_r": 32,
        "lora_alpha": 64,
        "use_vllm": True,
        "vllm_mode": "colocate",
        "gradient_checkpointing": True,
        "sft_warm_start": False,
        "train_layers": 0,
        "logging_steps": 5,
        # Thinking off, deliberately: evaluation is greedy, and greedy decoding in Qwen3's thinking mode loops to
        # the token cap without an <answer> (Qwen's own advice); the prompt still asks for reasoning first.
        "enable_thinking": False,
        # a stage is about 1,000 optimiser steps, roughly a day on one GPU: a crash loses at most 50 of them
        "save_steps": 50,
    },
    # A reasoning-gym task on 2 CPU cores (graph.settings PRESETS["rg-cpu"]: basic_arithmetic, 2-4 terms of 1-2
    # digits): a full fine-tuning warm start on gold answers (150 steps x 16, cached: 19.4 % greedy on val), then per
    # stage reward-filtered fine-tuning (trainer/filtered.py): rounds of 32 prompts x 8 samples at temperature 0.7,
    # steps on full batches of 16 verified answers at lr 2e-5, until the stage's budget of 7,680 sampled answers is
    # spent (30 rounds: what the 16-step stage measured in evals/results/rg_candidates sampled, the least harmful
    # stage there, -1.4 points, one seed; no stage measured gained), the same on easy levels and on levels where
    # nothing is right. An in-stage checkpoint every 5 rounds (a resume redoes at most 5).
    # Its rounds are sampled by a vLLM server where vLLM's CPU build is installed (trainer/filtered_sampling.py),
    # the trained weights reloaded every step.
    "rg-cpu": {
        "prompt_style": "compact",
        "instances_per_stage": 512,
        "max_train_size": None,
        "max_prompt_length": 256,
        "max_completion_length": 16,
        "optimizer": "filtered",
        "filtered_prompts": 32,
        "filtered_sampler": "auto",
        "num_generations": 8,
        "temperature": 0.7,
        "learning_rate": 2e-5,
        "stage_samples": 7680,
        "save_steps": 5,
        "train_layers": 0,
        "sft_train_layers": 0,
        "sft_lr": 5e-5,
        "sft_batch_size": 16,
        "sft_steps": 150,
        "sft_instances": 2400,
    },
}
