"""Run settings and the run context every node receives.

One pydantic object, `Settings`, holds every fixed setting of a run. It is built from, in order of
precedence, CLI flags, environment variables and a named preset (`smoke`, `cpu`, `cpu-long`, `paper`). Nodes read it
through LangGraph's runtime context (`runtime.context.settings`); it is never part of the graph state,
so a resumed run reads the very settings it was started with (`settings.json` in the run folder).

Secrets are not settings: API keys are read from the environment by `llm_backends.engineers` at the moment of
use and never stored here, logged or written to the run folder.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from families import DEFAULT_TASK
from families.context_variants import CONTEXT_VARIANTS
from llm_backends.engineers import CLASSIC_ENGINEERS, MODEL_ENGINEERS
from trainer.config import TRAIN_PRESETS, TrainConfig

# The cpu presets' run: the embedded model, answered through vLLM where it is installed
_CPU_RUN: dict[str, Any] = {
    "stages": 3,
    # vLLM answers the evaluations about 3.3x faster than in-process generation here (bench_llm), and the
    # self-engineer's kept server is the same one; in-process where vLLM is not installed
    "policy_backend": "auto",
    # 150 2-agent answers on sizes 3-5, where the warm-started 135M policy learns: a 5-point change is visible
    "eval_split": "val-small",
    "eval_batch_size": 64,  # answers in flight on the vLLM server at once
    "final_split": "test-mini",
    "eval_max_tokens": 160,
    "eval_limit": None,
    "final_limit": 36,  # 12 per agent count and per wait subset, every size; all 72 of env 1.0.0's took 414 s
    "engineer_max_tokens": 512,
}

# Run-level values per preset; the training hyper-parameters come from trainer.config.TRAIN_PRESETS.
PRESETS: dict[str, dict[str, Any]] = {
    "smoke": {
        "stages": 2,
        "eval_split": "val-mini",
        "final_split": "test-mini",
        # CI: a handful of answers per evaluation (spread over sizes), each too short to matter
        "eval_max_tokens": 48,
        "eval_limit": 6,
        "final_limit": 9,
        "engineer_max_tokens": 384,  # the self-engineer's schema-constrained JSON needs about 275 tokens
        "policy_dtype": "float32",  # CI: the same greedy answers on every CPU, bf16 hardware or not
        # only the last stage's weights (about 517 MB a stage of the embedded model); with stage 0 shared, an
        # eval starts every run that trains its own stage 0 (a donor) with keep_checkpoints=all (evals.grid)
        "keep_checkpoints": "last",
    },
    "cpu": _CPU_RUN,
    # `cpu`'s run, around a 4x longer stage (the one measured to gain most on a CPU) (trainer.config.TRAIN_PRESETS["cpu-long"])
    "cpu-long": _CPU_RUN,
    # A reasoning-gym task on 2 CPU cores: 6 levels of basic_arithmetic (2-4 terms
    # of 1-2 digits), 144 fixed val questions (24 a level), 288 test questions; training values in
    # trainer.config.TRAIN_PRESETS["rg-cpu"] (its warm start has a ladder: 75 % on the easiest level, 0 % on the hardest;
    # each stage samples a budget of 7,680 answers, train.stage_samples, whatever its levels)
    "rg-cpu": {
        **_CPU_RUN,
        "task": "rg:basic_arithmetic:num_terms=2-4,num_digits=1-2",
        "eval_split": "val",
        "final_split": "test",
        "eval_max_tokens": 16,
        # beside the greedy answer, 4 answers per question sampled at the training temperature (mean@4): 576
        # answers of at most 16 tokens a stage, under a tenth of the stage's 7,680 sampled training answers
        "eval_samples": 4,
        "final_limit": None,
        "engineer_max_tokens": 384,
    },
    "paper": {
        "stages": 3,
        "policy_model": "Qwen/Qwen3-4B",
        "policy_backend": "vllm",
        "eval_split": "val",
        "final_split": "test",
        # 128 answers in flight on the GPU server (continuous batching): 3,150 benchmark answers of up to 4,096
        # tokens take minutes, not the hours of batches of 8
        "eval_batch_size": 128,
        "eval_max_tokens": 4096,
        "eval_limit": None,
        "final_limit": None,
        "engineer_max_tokens": 2048,
    },
}


class SettingsError(ValueError):
    """A bad setting: the message is one line naming the setting, the value and what is allowed."""


class Settings(BaseModel):
    """Every fixed setting of a run (see `--help` of `python -m graph.run`)."""

    # every float finite (inf and NaN refused, `1e400` included); TrainConfig does the same
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    preset: Literal[tuple(PRESETS)] = Field("cpu", description="named bundle of defaults")  # type: ignore[valid-type]
    task: str = Field(
        DEFAULT_TASK,
        description="the task family the engineer configures: mapf (MAPF-FrozenLake, the paper's testbed) or "
        "rg:<dataset>[:attr=lo-hi,...] (a reasoning-gym dataset, its levels from the dataset's curriculum; "
        "docs/tasks.md)",
    )
    start_config: dict[str, Any] | None = Field(
        None,
        description="stage 0's config as JSON (MAPF: {\"sizes\": ...}; other tasks: {\"levels\": {\"<level>\": share}}); "
        "none: a random config from the seed (the paper's stage 0)",
    )
    engineer: str = Field(
        "self",
        description="who designs the next stage: self | base | openai | gemini | fixed | random | "
        "learnability | threshold | rlve | the name of any OpenAI-compatible endpoint (with ENGINEER_BASE_URL)",
    )
    engineer_model: str | None = Field(None, description="model id for an API engineer (default per backend)")
    engineer_base_url: str | None = Field(None, description="base URL of a custom OpenAI-compatible engineer")
    engineer_max_tokens: int = Field(
        512, ge=16, description="token limit of one reply of the self or base engineer (the policy's own model)"
    )
    engineer_api_max_tokens: int | None = Field(
        None,
        ge=16,
        description="token limit of one reply of an API engineer (openai, gemini, an endpoint), its reasoning "
        "included; none: the backend's (openai and gemini 16384, other endpoints 8192). An empty or cut reply is "
        "asked again once with 4x the limit, up to the API's most",
    )
    engineer_reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = Field(
        None,
        description="reasoning effort of an API engineer, sent as reasoning_effort (none | minimal | low | medium | "
        "high); unset: not sent, the API's default",
    )
    engineer_max_attempts: int = Field(
        3, ge=1, le=10, description="proposals tried before keeping the config"
    )
    policy_model: str = Field("smollm2-135m", description="policy: short name, Hugging Face id or local path")
    policy_backend: Literal["auto", "transformers", "vllm"] = Field(
        "transformers",
        description="how the policy answers the evaluation set: in-process transformers, a vLLM server, or auto "
        "(vLLM when installed, else transformers; settings.json records the choice made)",
    )
    policy_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="weights dtype of the policy's vLLM server (evaluations and the self/base engineer): auto = "
        "bfloat16 on a CPU that multiplies bf16 in hardware, AMX or AVX-512 BF16 (answers/s over float32: 2.8x on "
        "a Xeon with AMX, 1.43x on an AMD Zen 4), float32 on other CPUs, vLLM's own on a GPU; settings.json records "
        "the choice made",
    )
    context: Literal[CONTEXT_VARIANTS] = Field("V6", description="engineer context variant")  # type: ignore[valid-type]
    stages: int = Field(3, ge=1, le=100, description="number of training stages (stage 0 is random)")
    seed: int = Field(0, ge=0, description="seed of the stage-0 config, the data and training")
    run_dir: Path | None = Field(None, description="run folder (default: runs/<run-id>)")
    run_id: str | None = Field(
        None,
        description="the run's identity, its thread id in graph.sqlite: set when the run starts, kept when the "
        "folder is moved, copied or renamed (not a setting to choose)",
    )
    eval_split: str = Field("val-mini", description="benchmark split evaluated after every stage")
    final_split: str = Field("test-mini", description="benchmark split evaluated at the end of the run")
    eval_limit: int | None = Field(None, ge=1, description="cap on evaluated instances per split (None: all)")
    final_limit: int | None = Field(None, ge=1, description="cap on final-benchmark instances (None: all)")
    final_cpu_split: str | None = Field(
        None,
        description="a second held-out split answered at the end, beside final_split and never instead of it: "
        "test-cpu (2 and 3 agents on 3x3-5x5, 150 per column), where a 135M policy is not at 0; written to "
        "final_cpu/ and tabulated by the evals as the CPU-scale table; none: skip it",
    )
    eval_max_tokens: int = Field(160, ge=8, description="token limit of one policy answer at evaluation")
    eval_batch_size: int = Field(8, ge=1, description="policy answers generated per batch")
    eval_samples: int = Field(
        0, ge=0, le=64,
        description="answers sampled per validation question beside the greedy one, each verified: the mean@k "
        "(eval/sampled_valid_rate, with an interval over questions and samples); 0 or none: off",
    )
    eval_sample_temperature: float | None = Field(
        None, gt=0, le=2,
        description="temperature of those sampled answers; none: the training temperature (train.temperature)",
    )
    evidence_examples: int = Field(
        3, ge=0, le=20, description="verbatim failing answers shown to the engineer"
    )
    evidence_chars: int = Field(600, ge=50, description="characters kept of each failing answer")
    context_details: Literal["bookkeeping", "full"] = Field(
        "bookkeeping", description="module T of the context: stage bookkeeping, or the full training details"
    )
    engineer_temperature: float = Field(0.0, ge=0, le=2, description="sampling temperature of the engineer")
    engineer_structured: bool = Field(
        True, description="ask the engineer for schema-constrained JSON where its server supports it"
    )
    feasibility_n: int = Field(
        16, ge=1, le=4000, description="instances the generator must build in the feasibility dry-run of a proposal"
    )
    prompts_dir: Path | None = Field(None, description="folder overriding the templates in prompts/")
    keep_server: bool = Field(
        True,
        description="keep one vLLM server up across stages and load each new checkpoint into it "
        "(instead of a 40-200 s start per engineer call)",
    )
    approve: bool = Field(False, description="pause before each apply for a person to accept or edit")
    keep_checkpoints: Literal["all", "last"] = Field(
        "all",
        description="all: keep every stage's checkpoint; last: delete an older stage's weights once the next "
        "stage's checkpoint is saved and the run has moved past it (never one a resume, the next stage or the "
        "final evaluation needs; a run that donates its stage 0 to --stage0-from forks must keep all)",
    )
    provenance: dict[str, Any] | None = Field(
        None,
        description="where and with what the run was started (git commit, package versions, machine, start "
        "time): written by the run itself, bookkeeping, not a setting to choose",
    )
    train: TrainConfig = Field(default_factory=TrainConfig, description="training hyper-parameters")

    @field_validator("final_cpu_split", mode="before")
    @classmethod
    def _no_cpu_split(cls, v: Any) -> Any:
        return None if isinstance(v, str) and v.strip().lower() in ("", "none", "null") else v

    @field_validator("eval_samples", "eval_sample_temperature", mode="before")
    @classmethod
    def _sampling_off(cls, v: Any, info: Any) -> Any:
        if isinstance(v, bool):
            raise ValueError(f"{info.field_name}={v!r}: allowed: a number, or none")
        off = v is None or (isinstance(v, str) and v.strip().lower() in ("", "none", "null", "off"))
        return (0 if info.field_name == "eval_samples" else None) if off else v

    @property
    def sample_temperature(self) -> float:
        """The temperature of the evaluation's sampled answers (`eval_sample_temperature`, else the training one)."""
        return self.eval_sample_temperature or self.train.temperature

    @field_validator("start_config", mode="before")
    @classmethod
    def _start_config_text(cls, v: Any) -> Any:
        if isinstance(v, str):
            text = v.strip()
            if text.lower() in ("", "none", "null"):
                return None
            try:
                return json.loads(text)
            except ValueError:
                raise ValueError(f"start_config={v!r}: allowed: a JSON object, or none") from None
        return v

    @field_validator("task")
    @classmethod
    def _known_task(cls, v: str) -> str:
        from families import family_of

        v = v.strip()
        # an unknown task, dataset, attribute or level, or a task that lacks a member its family needs: one line
        # naming what is allowed
        family_of(v)
        return v

    @model_validator(mode="after")
    def _family_settings(self) -> Settings:
        """The run's family checks the settings it reads (its splits, stage 0's config), now, not after minutes of
        set-up (`LoopFamily.check_settings`: one line naming the setting and what is allowed)."""
        from families import family_of

        family_of(self.task).check_settings(self)
        return self

    @field_validator("engineer")
    @classmethod
    def _engineer_name(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", v):
            raise ValueError(
                f"must be one of {', '.join(MODEL_ENGINEERS + CLASSIC_ENGINEERS)} or a custom endpoint name "
                "(letters, digits, '_', '-', '.')"
            )
        return v

    @property
    def is_classic_engineer(self) -> bool:
        return self.engineer in CLASSIC_ENGINEERS

    def save(self, path: Path) -> None:
        """settings.json, written atomically, with credentials in engineer_base_url masked (a resume takes
        the full URL from ENGINEER_BASE_URL again)."""
        from llm_backends.redact import mask_url
        from trainer.files import write_text_atomic

        safe = self.model_copy(update={"engineer_base_url": mask_url(self.engineer_base_url)})
        write_text_atomic(path, safe.model_dump_json(indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> Settings:
        """A run's settings.json; refused in one line when it is not one (a run writes every setting, so a
        file without the run's own keys, `{}` say, would silently start over on the defaults)."""
        try:
            raw = json.loads(Path(path).read_text())
            if not isinstance(raw, dict):
                raise SettingsError(f"cannot read settings from {path}: a JSON object of settings is expected, "
                                    f"not {type(raw).__name__}")
            missing = [k for k in SAVED_KEYS if k not in raw]
            if missing:
                raise SettingsError(f"cannot read settings from {path}: it lacks {', '.join(missing)}, which every "
                                    "run's settings.json holds; put back the run's own settings.json")
            return cls.model_validate(raw)
        except (OSError, ValueError) as e:  # ValidationError and JSONDecodeError are ValueErrors
            if isinstance(e, SettingsError):
                raise
            raise SettingsError(f"cannot read settings from {path}: {_first_error(e)}") from None


@dataclass(frozen=True)
class RunContext:
    """What every node gets as `runtime.context`: the fixed settings and the run folder."""

    settings: Settings
    run_dir: Path


# Fields the run writes itself: never from a flag or an environment variable, never a settings change.
BOOKKEEPING = ("run_id", "provenance")
# Keys every settings.json a run ever wrote holds (`Settings.load` refuses a file without them)
SAVED_KEYS = ("preset", "engineer", "stages", "seed", "train")

# Environment variable -> settings field. Training values: TRAIN__<FIELD> (e.g. TRAIN__LEARNING_RATE).
ENV_VARS = {f.upper(): f for f in Settings.model_fields if f not in BOOKKEEPING + ("train",)}


def _first_error(e: Exception) -> str:
    if isinstance(e, ValidationError):
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        return f"{loc}={err.get('input')!r}: {err['msg']}"
    return str(e)


def build_settings(cli: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None,
                   given_as: str = "flag") -> Settings:
    """Merge preset < environment < CLI into validated `Settings`; raise `SettingsError` (one line).
    `given_as="context"`: the values came as a LangGraph run's context dict (graph.studio), and an error
    names the context key instead of a flag."""
    cli = {k: v for k, v in (cli or {}).items() if v is not None}
    env = os.environ if env is None else env
    preset = cli.get("preset") or env.get("PRESET") or "cpu"
    if preset not in PRESETS:
        raise SettingsError(f"PRESET={preset!r} is not a preset; allowed: {', '.join(PRESETS)}")
    merged: dict[str, Any] = {**PRESETS[preset], "preset": preset}
    train: dict[str, Any] = dict(TRAIN_PRESETS[preset])
    source: dict[str, str] = {}
    for var, field in ENV_VARS.items():
        if var in env and env[var] != "":
            merged[field] = env[var]
            source[field] = f"{var} (environment)"
    for var, value in env.items():
        if var.startswith("TRAIN__") and value != "":
            train[var[7:].lower()] = value
            source[f"train.{var[7:].lower()}"] = f"{var} (environment)"
    for key, value in cli.items():
        if key in BOOKKEEPING:
            raise SettingsError(f"{key} is set by the run itself when it starts; it cannot be chosen")
        if key.startswith("train."):
            train[key[6:]] = value
            source[key] = f"--set {key}" if given_as == "flag" else f"the run's context key {key!r}"
        else:
            merged[key] = value
            source[key] = f"--{key.replace('_', '-')}" if given_as == "flag" else f"the run's context key {key!r}"
    merged["train"] = train
    try:  # the family's own defaults (a level-share task: its val and test splits) unless they were named
        from families import family_of

        defaults = family_of(str(merged.get("task") or DEFAULT_TASK).strip()).settings_defaults()
    except ValueError:  # an unknown task: Settings' validation says so, naming where it came from
        defaults = {}
    merged.update({field: value for field, value in defaults.items() if field not in source})
    try:
        settings = Settings.model_validate(merged)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        if not loc:  # a check across settings (Settings' model validators): its message names the settings
            raise SettingsError(f"bad settings: {err['msg'].removeprefix('Value error, ')}") from None
        where = source.get(loc, loc)
        allowed = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            allowed = f"unknown setting; known: {', '.join(sorted(TrainConfig.model_fields if loc.startswith('train.') else Settings.model_fields))}"
        raise SettingsError(f"bad setting {loc} from {where}: {err.get('input')!r}: {allowed}") from None
    if settings.policy_backend == "auto":  # resolved here, so that settings.json says what the run used
        from llm_backends.vllm_server import resolve_backend

        settings.policy_backend = resolve_backend("auto")
    if settings.policy_dtype == "auto":  # the self/base engineer is served by vLLM whatever the policy backend
        from llm_backends.vllm_server import resolve_serving_dtype, vllm_available

        if vllm_available():
            settings.policy_dtype = resolve_serving_dtype("auto")  # stays "auto" on a GPU build: vLLM decides
    return settings


def settings_json(settings: Settings) -> str:
    return json.dumps(settings.model_dump(mode="json"), indent=2)
