"""`DynamicSamplingGRPOConfig`: TRL's `GRPOConfig` plus the knobs of the project's GRPO trainer (`trainer.grpo_trainer`).

TRL keeps every knob of a trainer in its config (`grpo_config.py` beside `grpo_trainer.py`); so does this project:
`trainer.trl_setup.grpo_config` fills one from a stage's `TrainConfig`, and `DynamicSamplingGRPOTrainer` reads its
dynamic sampling, rollout copy and shared-prompt scoring from `args`, as TRL's trainer reads its own.

Importing this module imports TRL: the trainer modules import it on first use.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import GRPOConfig


@dataclass
class DynamicSamplingGRPOConfig(GRPOConfig):
    """`GRPOConfig` with the fields below (see `trainer.grpo_trainer`'s module docstring and `trainer.config.TrainConfig`,
    whose fields of the same names they copy)."""

    resample_rounds: int = field(
        default=0,
        metadata={"help": "at most this many extra generations per batch to replace groups without reward variance "
                  "(dynamic sampling); 0: off"},
    )
    resample_seed: int | None = field(
        default=None, metadata={"help": "seed of the replacement draw; None: `seed`"},
    )
    group_key: str | None = field(
        default=None,
        metadata={"help": "a dataset column (e.g. `level`): the replacement draw leans to the values of it where the "
                  "policy is sometimes right; None: a uniform draw"},
    )
    rollout_dtype: str = field(
        default="model",
        metadata={"help": "the dtype of the rollout copy that samples on CPU: auto, bfloat16, float32, or model (no "
                  "copy); resolved against the trained model by `trainer.trl_setup.rollout_dtype`"},
    )
    rollout_prepack: bool | None = field(
        default=None,
        metadata={"help": "the rollout copy's linear layers on oneDNN-packed weights; None: auto "
                  "(`trainer.trl_setup.rollout_prepack`)"},
    )
    share_prompt: bool = field(
        default=False,
        metadata={"help": "score a batch whose rows share one prompt with that prompt run once (`trainer.trl_cpu`)"},
    )

    def __post_init__(self):
        super().__post_init__()
        allowed = ("auto", "model", "bfloat16", "float32")
        if self.rollout_dtype not in allowed:
            raise ValueError(f"rollout_dtype={self.rollout_dtype!r}: allowed: {', '.join(allowed)}")
        if self.resample_rounds < 0:
            raise ValueError(f"resample_rounds={self.resample_rounds}: allowed: 0 or more")
