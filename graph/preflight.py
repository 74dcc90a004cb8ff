"""Checks made before any work, each failing with one line: the settings against what this machine has
(policy model, prompts folder, splits, engineer keys, the model cache), a new run folder that can be
created, a resumed run's settings, and the files a resumed run's next node loads."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

from graph.progress import say
from graph.runfolder import DB_FILE, RunFolderError, resolve_in_run
from graph.settings import ENV_VARS, Settings, SettingsError


def check_policy_model(name: str) -> None:
    """The embedded short name, an existing model folder, or something shaped like a hub id (`org/name`):
    the same three forms `llm_backends.models.resolve_model` accepts, checked without loading or downloading."""
    from llm_backends.checkpoints import is_model_dir
    from llm_backends.models import EMBEDDED

    allowed = f"allowed: {', '.join(sorted(EMBEDDED))}, a model folder (config.json), or a Hugging Face id like Qwen/Qwen3-4B"
    path = Path(name).expanduser()
    if name in EMBEDDED:
        return
    if path.exists():
        if not is_model_dir(path):
            raise SettingsError(f"bad setting policy_model={name!r}: not a model folder (no config.json or "
                                f"adapter_config.json); {allowed}")
        return
    if name.startswith((".", "/", "~")) or not re.fullmatch(r"[\w.-]+/[\w.-]+", name):
        raise SettingsError(f"bad setting policy_model={name!r}: no such folder; {allowed}")


def check_prompts_dir(prompts_dir: Path | None) -> None:
    """An override folder must exist and hold at least one of prompts/' template files (it may override
    only some; the others come from prompts/)."""
    if prompts_dir is None:
        return
    from families.evidence import PROMPTS_DIR

    names = sorted(p.name for p in PROMPTS_DIR.glob("*.md"))
    if not Path(prompts_dir).is_dir():
        raise SettingsError(f"bad setting prompts_dir={str(prompts_dir)!r}: not a folder; it overrides files of "
                            f"prompts/ ({', '.join(names)})")
    if not any((Path(prompts_dir) / n).is_file() for n in names):
        raise SettingsError(f"bad setting prompts_dir={str(prompts_dir)!r}: holds none of the template files "
                            f"{', '.join(names)}; it would override nothing")


def _check_thinking(settings: Settings) -> None:
    """Evaluation answers greedily (temperature 0); greedy decoding in Qwen3's thinking mode loops to the token
    cap without an <answer> (Qwen's own advice against it): the two are never combined."""
    if settings.train.enable_thinking:
        raise SettingsError(
            "bad setting train.enable_thinking=True: evaluation answers greedily (temperature 0), and greedy "
            "decoding in thinking mode loops to the token cap without an <answer>; allowed: false, or none (pass "
            "nothing to the chat template)"
        )


def check_report_to(settings: Settings) -> None:
    """W&B only when its package is installed (an optional extra), found before any work."""
    import importlib.util

    if "wandb" in settings.train.report_to.split(",") and importlib.util.find_spec("wandb") is None:
        raise SettingsError(
            f"bad setting train.report_to={settings.train.report_to!r}: the wandb package is not installed "
            "(pip install 'env-engineer[wandb]'); allowed without it: tensorboard, none"
        )


def check_before_work(settings: Settings) -> None:
    """Checks that need other packages: policy model, prompts folder, engineer backend and keys, benchmark
    splits. One line on failure."""
    from env import list_splits

    check_policy_model(settings.policy_model)
    check_prompts_dir(settings.prompts_dir)
    _check_thinking(settings)
    check_report_to(settings)
    splits = list_splits()
    for name, split in (("eval_split", settings.eval_split), ("final_split", settings.final_split),
                        ("final_cpu_split", settings.final_cpu_split)):
        if split is not None and split not in splits:
            raise SettingsError(f"bad setting {name}={split!r}: allowed: {', '.join(splits)}")
    if not settings.is_classic_engineer:
        from llm_backends.engineers import EngineerConfigError, check_engineer_env

        try:
            check_engineer_env(settings.engineer, os.environ, model=settings.engineer_model,
                               base_url=settings.engineer_base_url)
        except EngineerConfigError as e:
            raise SettingsError(str(e)) from None


def new_run_dir(settings: Settings, runs_root: Path) -> Path:
    if settings.run_dir is not None:
        run_dir = Path(settings.run_dir)
        if run_dir.exists() and any(run_dir.iterdir()):
            raise SettingsError(
                f"bad setting run_dir={str(run_dir)!r}: folder exists and is not empty; "
                f"use --resume {run_dir} to continue it, or choose a new folder"
            )
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        run_dir = runs_root / f"{stamp}-{settings.preset}-{settings.engineer}-s{settings.seed}"
    parent = run_dir.parent if not run_dir.exists() else run_dir
    probe = parent
    while not probe.exists():
        probe = probe.parent
    if not os.access(probe, os.W_OK):
        raise SettingsError(f"bad setting run_dir={str(run_dir)!r}: {probe} is not writable")
    return run_dir




def check_model_cache(settings: Settings) -> None:
    """The embedded policy is converted once into the model cache: a cache that cannot be written is found
    now (and by --dry-run), not when stage 0 loads the model."""
    from llm_backends.models import check_cache_writable

    try:
        check_cache_writable(settings.policy_model)
    except OSError as e:
        raise SettingsError(str(e)) from None



def _env_given(settings: Settings, env: dict[str, str]) -> list[str]:
    """Environment variables that would set a value other than the resumed run's (all ignored on resume)."""
    saved = settings.model_dump(mode="json")

    def same(a: Any, b: str) -> bool:
        if a is None:
            return b.strip().lower() in ("", "none", "null")
        try:
            return float(a) == float(b)
        except (TypeError, ValueError):
            return str(a).lower() == b.strip().lower()

    out = []
    for var, field in ENV_VARS.items():
        value = env.get(var, "")
        if value != "" and var not in ("APPROVE", "ENGINEER_BASE_URL") and not same(saved.get(field), value):
            out.append(f"{var} (environment)")
    for var, value in env.items():
        if var.startswith("TRAIN__") and value != "" and not same(saved["train"].get(var[7:].lower()), value):
            out.append(f"{var} (environment)")
    return sorted(out)


def resume_settings(given: dict[str, Any], run_dir: Path) -> Settings:
    """settings.json of the run (+ --approve), with the full engineer URL when settings.json masked its
    credentials; announces every flag (`given`: the command line's values) and environment variable it
    ignores."""
    from llm_backends.redact import has_masked_credentials, mask_url

    settings = Settings.load(run_dir / "settings.json")
    given = dict(given)
    env = dict(os.environ)
    if given.pop("approve", None) or env.get("APPROVE", "").lower() in ("1", "true", "yes"):
        settings = settings.model_copy(update={"approve": True})
    if has_masked_credentials(settings.engineer_base_url):
        full = env.get("ENGINEER_BASE_URL", "")
        if mask_url(full) != settings.engineer_base_url:
            raise SettingsError(
                f"settings.json keeps engineer_base_url={settings.engineer_base_url} with its credentials masked; "
                "set ENGINEER_BASE_URL to the full URL to resume"
            )
        settings = settings.model_copy(update={"engineer_base_url": full})
    elif env.get("ENGINEER_BASE_URL") and env["ENGINEER_BASE_URL"] != (settings.engineer_base_url or ""):
        given["ENGINEER_BASE_URL (environment)"] = True
    ignored = sorted(given) + _env_given(settings, env)
    if ignored:
        say(f"[resume] ignoring {', '.join(ignored)}: a resumed run keeps its settings.json "
            "(only --approve can be added)")
    return settings


LOADS_CHECKPOINT = ("train_stage", "evaluate", "final_evaluate")


def check_state_files(run_dir: Path, values: dict[str, Any], nxt: tuple[str, ...], settings: Settings) -> None:
    """Before streaming a resumed run: the files its next node loads exist and are intact (a deleted or
    damaged checkpoint is one line with a resume hint, not a traceback from deep inside a trainer)."""
    from graph.runfolder import checkpoint_problem

    stage = int(values.get("stage") or 0)
    ckpt = values.get("checkpoint")
    loads = set(LOADS_CHECKPOINT) | ({"propose_config"} if settings.engineer == "self" else set())
    if ckpt and nxt and nxt[0] in loads:
        problem = checkpoint_problem(Path(resolve_in_run(ckpt, run_dir)))
        if problem:
            # train_stage trains stage k from the policy stage k-1 left; the other nodes load stage k's own
            owner = stage - 1 if nxt[0] == "train_stage" else stage
            what = (f"the policy after stage {owner}, which stage {stage} trains from" if owner != stage
                    else f"the policy after stage {stage}, which the run goes on from")
            raise RunFolderError(
                f"{resolve_in_run(ckpt, run_dir)} ({what}) is "
                f"{problem}; put back the folder from a copy of this run, then resume with: "
                f"python -m graph.run --resume {run_dir}"
            )
    train = values.get("train_path")
    if train and nxt and nxt[0] == "train_stage" and not Path(resolve_in_run(train, run_dir)).is_file():
        raise RunFolderError(
            f"{resolve_in_run(train, run_dir)} (stage {stage}'s training set, which train_stage reads next) is "
            f"missing; put it back (or its config.json, env_stats.json and train.jsonl from a copy of the run), "
            f"then resume with: python -m graph.run --resume {run_dir}"
        )


def refuse_lost_state(run_dir: Path, why: str, done: list[str]) -> RunFolderError:
    db = run_dir / DB_FILE
    if done:
        return RunFolderError(
            f"{db} is {why}, but {', '.join(done)} hold finished work that starting over would train again; "
            f"nothing was changed. Put back graph.sqlite from a copy of this run and resume, or start a new run "
            f"in another folder"
        )
    return RunFolderError(
        f"{db} is {why}; no stage has finished yet, so nothing is lost by starting over: move it away "
        f"(mv {db} {db}.bad) and resume with: python -m graph.run --resume {run_dir}"
    )

