"""`python -m graph.run`: run the environment-engineer loop end to end, durably.

Examples:
    python -m graph.run                                  # cpu preset, embedded model, self-engineer
    PRESET=smoke ENGINEER=fixed python -m graph.run      # seconds-scale run with the fixed baseline
    ENGINEER=openai OPENAI_API_KEY=... python -m graph.run --stages 3
    python -m graph.run --resume runs/<run-id>           # continue after a crash or Ctrl-C
    python -m graph.run --dry-run                        # validate, build, stage-0 data, one real proposal
    python -m graph.run --stage0-from runs/<donor> --engineer random   # reuse the donor's trained stage 0

Settings come from CLI flags over environment variables over the preset. Every value is checked before
any work starts; a bad one prints one line naming it and what is allowed, and exits with status 2
without leaving a run folder behind. State is checkpointed after every node in `graph.sqlite` inside
the run folder, so `--resume` never redoes a finished stage.

A run never loses finished work (graph/runfolder.py):
- its identity is in the run: the thread id is settings.json's `run_id`, and state paths are relative to
  the folder, so a moved, copied or symlinked run, or `--resume .`, continues where it was;
- a lost, empty or damaged graph.sqlite next to finished stages is refused with one line, never retrained;
- one process per run folder (`run.lock`, an OS lock released on any exit); a second gets the holder's PID;
- the first SIGINT/SIGTERM stops at the next training step or node boundary (nodes.stop) with exit 130 and
  the resume command; a second kills the vLLM servers and every child process and exits at once;
- a failing node prints one line (the traceback goes to logs/error.log) with the resume command;
- text from the engineer reaches the terminal without control characters.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

from graph.runfolder import (
    DB_FILE,
    RunFolderError,
    RunLock,
    database_problem,
    finished_stages,
    resolve_in_run,
    thread_id,
)
from nodes import stop
from nodes.context import CONTEXT_VARIANTS, ENV_VARS, RunContext, Settings, SettingsError, build_settings
from nodes.files import RunFileError, write_json_atomic
from nodes.inert import for_terminal

EXIT_BAD_SETTINGS = 2
EXIT_INTERRUPTED = 130


class RunError(RuntimeError):
    """A one-line, user-facing error of the run command."""


def preset_help() -> str:
    """One paragraph per preset for --help, built from the presets themselves (so it cannot go stale)."""
    from nodes.context import PRESETS
    from nodes.train_config import TRAIN_PRESETS, TrainConfig

    def train(name: str, field: str) -> Any:
        return TRAIN_PRESETS[name].get(field, TrainConfig.model_fields[field].default)

    out = []
    for name, run in PRESETS.items():
        line = (f"  {name}: {run.get('stages', 3)} stages, {train(name, 'instances_per_stage')} training instances "
                f"and {train(name, 'max_steps')} GRPO steps per stage (-1: epochs), answers capped at "
                f"{train(name, 'max_completion_length')} tokens in training and {run.get('eval_max_tokens')} at "
                f"evaluation, validation on {run.get('eval_split')}"
                + (f" (first {run['eval_limit']})" if run.get("eval_limit") else "") + ".")
        if name == "smoke":
            line += (" Its training cap makes a valid plan impossible (the shortest plan of the validation splits, "
                     "3x3 with two agents, takes about 39 tokens of the embedded model), so every GRPO reward is 0 "
                     "by design, and the evaluation cap fits only the shortest plans. It checks the plumbing (every "
                     "node, resume, the files) in minutes, never learning; use cpu for that.")
        elif name == "cpu":
            line += " The embedded 135M model on a CPU, from a cached SFT warm start (the default)."
        elif name == "paper":
            line += " Qwen3-4B with LoRA and vLLM generation on a GPU, the paper's scale."
        out.append(line)
    import textwrap

    return "\n".join(textwrap.fill(x, 110, subsequent_indent="    ") for x in out)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m graph.run",
        description="LLM-as-Environment-Engineer on MAPF-FrozenLake: train a stage, evaluate, let an engineer "
        "design the next stage's environment config, repeat. Each flag overrides its environment variable, "
        "which overrides the preset.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Secrets: ENGINEER_API_KEY (falls back to OPENAI_API_KEY / GEMINI_API_KEY) is read from the "
        "environment only and never written anywhere.\nTraining hyper-parameters: --set train.NAME=VALUE "
        "or TRAIN__NAME=VALUE (e.g. TRAIN__LEARNING_RATE=1e-5).",
    )
    fields = Settings.model_fields
    env_of = {f: v for v, f in ENV_VARS.items()}
    flagged = {"preset", "engineer", "engineer_model", "engineer_base_url", "policy_model", "policy_backend",
               "context", "stages", "seed", "run_dir", "eval_split", "final_split", "eval_limit", "final_limit",
               "eval_max_tokens", "engineer_max_attempts", "prompts_dir", "approve"}
    others = [f"  {env_of[f]:<22} --set {f}=...  {fields[f].description}" for f in fields
              if f not in flagged and f in env_of]
    from nodes.train_config import TrainConfig

    train = [f"  TRAIN__{f.upper():<22} --set train.{f}=...  {TrainConfig.model_fields[f].description}"
             for f in TrainConfig.model_fields]
    p.epilog = (p.epilog or "") + "\n\nPresets:\n" + preset_help() + (
        "\nSettings without a flag (environment variable, or --set):\n" + "\n".join(others)
        + "\nTraining settings (train.*; the preset's values: python -m graph.run --dry-run):\n" + "\n".join(train)
        + "\nModel serving (environment only):\n"
        "  ENGINEER_SERVING       auto | vllm | transformers: how the self/base engineer is served (auto: vLLM "
        "when installed)\n"
        "  ENV_ENGINEER_CACHE     where the embedded model is converted once (default ~/.cache/env-engineer)"
    )

    def add(flag: str, field: str, **kw: Any) -> None:
        desc = fields[field].description or ""
        p.add_argument(flag, dest=field, default=None, help=f"{desc} [env {env_of[field]}]", **kw)

    add("--preset", "preset", choices=["smoke", "cpu", "paper"])  # what each one is: "Presets" below
    add("--engineer", "engineer", metavar="NAME")
    add("--engineer-model", "engineer_model", metavar="MODEL")
    add("--engineer-base-url", "engineer_base_url", metavar="URL")
    add("--policy-model", "policy_model", metavar="MODEL")
    add("--policy-backend", "policy_backend", choices=["auto", "transformers", "vllm"])
    add("--context", "context", choices=list(CONTEXT_VARIANTS))
    add("--stages", "stages", metavar="N")
    add("--seed", "seed", metavar="S")
    add("--run-dir", "run_dir", metavar="DIR")
    add("--eval-split", "eval_split", metavar="SPLIT")
    add("--final-split", "final_split", metavar="SPLIT")
    add("--eval-limit", "eval_limit", metavar="N")
    add("--final-limit", "final_limit", metavar="N")
    add("--eval-max-tokens", "eval_max_tokens", metavar="N")
    add("--engineer-max-attempts", "engineer_max_attempts", metavar="N")
    add("--prompts-dir", "prompts_dir", metavar="DIR")
    p.add_argument("--approve", action="store_true", default=None,
                   help=f"{fields['approve'].description} [env APPROVE]")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override any setting, e.g. --set train.learning_rate=1e-5 (repeatable)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR where it stopped")
    p.add_argument("--dry-run", action="store_true",
                   help="validate settings, build the graph, generate stage-0 data, ask the engineer for one real "
                   "proposal on a dummy context and validate it; no training. Works in a temporary folder, removed "
                   "at the end, unless --run-dir DIR is given")
    p.add_argument("--stage0-from", metavar="DONOR_RUN_DIR",
                   help="start a new run from DONOR_RUN_DIR's finished stage 0 (trained and evaluated once there, "
                   "linked here); its settings must equal this run's except the engineer, context and run-folder "
                   "ones (graph/stage0.py: MAY_DIFFER)")
    p.add_argument("--runs-root", default="runs", help="parent of new run folders (default: runs)")
    return p


def _cli_values(args: argparse.Namespace) -> dict[str, Any]:
    cli = {f: getattr(args, f) for f in Settings.model_fields if hasattr(args, f) and getattr(args, f) is not None}
    for item in args.overrides:
        if "=" not in item:
            raise SettingsError(f"--set {item!r}: expected KEY=VALUE, e.g. --set train.learning_rate=1e-5")
        key, value = item.split("=", 1)
        cli[key.strip()] = value
    return cli


def _check_policy_model(name: str) -> None:
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


def _check_prompts_dir(prompts_dir: Path | None) -> None:
    """An override folder must exist and hold at least one of prompts/' template files (it may override
    only some; the others come from prompts/)."""
    if prompts_dir is None:
        return
    from nodes.summarize_failures import PROMPTS_DIR

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


def _check_report_to(settings: Settings) -> None:
    """W&B only when its package is installed (an optional extra), found before any work."""
    import importlib.util

    if "wandb" in settings.train.report_to.split(",") and importlib.util.find_spec("wandb") is None:
        raise SettingsError(
            f"bad setting train.report_to={settings.train.report_to!r}: the wandb package is not installed "
            "(pip install 'env-engineer[wandb]'); allowed without it: tensorboard, none"
        )


def _check_before_work(settings: Settings) -> None:
    """Checks that need other packages: policy model, prompts folder, engineer backend and keys, benchmark
    splits. One line on failure."""
    from env import list_splits

    _check_policy_model(settings.policy_model)
    _check_prompts_dir(settings.prompts_dir)
    _check_thinking(settings)
    _check_report_to(settings)
    splits = list_splits()
    for name, split in (("eval_split", settings.eval_split), ("final_split", settings.final_split)):
        if split not in splits:
            raise SettingsError(f"bad setting {name}={split!r}: allowed: {', '.join(splits)}")
    if not settings.is_classic_engineer:
        from llm_backends.engineers import EngineerConfigError, check_engineer_env

        try:
            check_engineer_env(settings.engineer, os.environ, model=settings.engineer_model,
                               base_url=settings.engineer_base_url)
        except EngineerConfigError as e:
            raise SettingsError(str(e)) from None


def _new_run_dir(settings: Settings, runs_root: Path) -> Path:
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


def _open_graph(run_dir: Path, settings: Settings):
    from langgraph.checkpoint.sqlite import SqliteSaver

    from graph.graph import make_graph

    conn = sqlite3.connect(str(run_dir / "graph.sqlite"), check_same_thread=False)
    saver = SqliteSaver(conn)
    graph = make_graph(checkpointer=saver, interrupt_before=["apply"] if settings.approve else None)
    return graph, conn


def recursion_limit(settings: Settings) -> int:
    """Supersteps one stream() may take: per stage apply, train_stage, evaluate, summarize_failures and up to
    engineer_max_attempts rounds of propose_config + validate_config; then final_evaluate and report."""
    return settings.stages * (4 + 2 * settings.engineer_max_attempts) + 50


def _say(msg: str) -> None:
    """One progress line on stderr, with control characters removed: lines quote the engineer's text."""
    print(for_terminal(msg), file=sys.stderr, flush=True)


def _stage_line(stage: int, metrics: dict[str, Any]) -> str:
    v = metrics.get("eval/valid_rate")
    o = metrics.get("eval/optimal_rate")
    def fmt(x: float | None) -> str:
        return "n/a" if x is None else f"{100 * x:.1f}%"

    return f"[stage {stage}] evaluated: valid {fmt(v)}, optimal {fmt(o)}"


KNOB_NAMES = {"data_ratio": "data", "hole_ratio": "hole", "wait_ratio": "wait"}


def diff_summary(diff: dict[str, dict[str, dict[str, Any]]], cap: int = 6) -> str:
    """validation.json's `diff` in a few words: `5x5 data .12->.18, 7x7 wait .50->.25, +3 more`."""

    def num(x: Any, digits: int) -> str:
        if not isinstance(x, (int, float)):
            return "?"
        text = f"{float(x):.{digits}f}"
        return text[1:] if text.startswith("0.") else text

    def size_key(s: str) -> tuple[int, str]:
        return (int(s), s) if str(s).isdigit() else (1 << 30, str(s))

    items = []
    for size in sorted(diff, key=size_key):
        for knob, change in diff[size].items():
            a, b = change.get("from"), change.get("to")
            digits = 2 if num(a, 2) != num(b, 2) else 3
            items.append(f"{size}x{size} {KNOB_NAMES.get(knob, knob)} {num(a, digits)}->{num(b, digits)}")
    if not items:
        return "no change"
    more = len(items) - cap
    return ", ".join(items[:cap]) + (f", +{more} more" if more > 0 else "")


def _last_record(run_dir: Path | None, stage: int) -> dict[str, Any] | None:
    if run_dir is None:
        return None
    try:
        doc = json.loads((Path(run_dir) / f"stage_{stage}" / "validation.json").read_text())
    except (OSError, ValueError):
        return None
    decisions = doc.get("decisions") or []
    return decisions[-1] if decisions else None


def _describe_start(node: str, state: dict[str, Any], settings: Settings) -> str | None:
    """The line printed when a long node starts (its end prints the result line)."""
    stage = int(state.get("stage") or 0)
    if node == "apply":
        k = stage + 1 if state.get("train_path") else stage
        return f"[stage {k}] apply: generating {settings.train.instances_per_stage} training instances ..."
    if node == "train_stage":
        steps = settings.train.max_steps
        return f"[stage {stage}] train_stage" + (f": {steps} GRPO steps" if steps > 0 else "") + " ..."
    if node == "evaluate":
        return f"[stage {stage}] evaluate on {settings.eval_split} ..."
    if node == "summarize_failures":
        return f"[stage {stage}] summarize_failures: context {settings.context} ..."
    if node == "propose_config":
        return f"[stage {stage}] propose_config: asking the {settings.engineer} engineer ..."
    if node == "final_evaluate":
        return f"[final] final_evaluate on {settings.final_split} ..."
    return None


def _describe_update(node: str, update: dict[str, Any], state: dict[str, Any],
                     run_dir: Path | None = None) -> str | None:
    if not isinstance(update, dict):
        return None
    stage = update.get("stage", state.get("stage", 0))
    if node == "evaluate" and "metrics" in update:
        return _stage_line(stage, update["metrics"])
    if node == "summarize_failures":
        return f"[stage {stage}] failures summarized for the engineer ({len(update.get('context') or '')} chars)"
    if node == "validate_config":
        decision = update.get("decision", "?")
        if decision in ("accepted", "projected"):
            record = _last_record(run_dir, stage) or {}
            return f"[stage {stage}] engineer proposal: {decision} ({diff_summary(record.get('diff') or {})})"
        extra = "; ".join(update.get("feedback") or [])[:200]
        return f"[stage {stage}] engineer proposal: {decision}" + (f" ({extra})" if extra and decision == "retry" else "")
    if node == "propose_config":
        logged = (update.get("log") or [""])[-1]
        what = logged.split(": ", 1)[-1].split("; ", 1)[0]
        found = "found a config" if update.get("proposal") is not None else "no usable config"
        return f"[stage {stage}] {what}: {found}"
    if node == "apply":
        return f"[stage {stage}] training set ready: {update.get('train_path', '')}"
    if node == "train_stage":
        tm = update.get("train_metrics") or {}
        r = tm.get("train/reward_mean")
        return f"[stage {stage}] trained" + (f": mean reward {r:.3f}" if isinstance(r, (int, float)) else "")
    if node == "final_evaluate":
        fm = update.get("final_metrics") or {}
        v = fm.get("final/valid_rate")
        return "[final] benchmark evaluated" + (f": valid {100 * v:.1f}%" if isinstance(v, (int, float)) else "")
    if node == "report":
        return "[report] written"
    return None


def zero_variance_warning(node: str, update: Any, state: dict[str, Any]) -> str | None:
    """A visible line when a finished stage's GRPO groups all had zero reward variance (no learning signal):
    the share actually trained on after dynamic sampling, else the share sampled."""
    if node != "train_stage" or not isinstance(update, dict):
        return None
    m = update.get("train_metrics") or {}

    def share(key: str) -> float | None:
        v = m.get(key)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v else None

    z = share("train/zero_std_groups_trained")
    z = share("train/zero_std_groups") if z is None else z
    if z is None or z < 1.0:
        return None
    stage = update.get("stage", state.get("stage", 0))
    return (f"[warn] stage {stage}: every GRPO group had zero reward variance (all completions of a prompt scored "
            "the same), so this stage learned nothing from GRPO; see train/zero_std_groups in its metrics.json")


def _record_person(run_dir: Path, stage: int, record: dict[str, Any]) -> None:
    """Append a person's decision to stage_k/validation.json (after the engineer's attempts) and make it final."""
    path = Path(run_dir) / f"stage_{stage}" / "validation.json"
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        doc = {"stage": stage, "decisions": []}
    doc.setdefault("decisions", []).append({"by": "person", **record})
    doc["final"] = record["decision"]
    write_json_atomic(path, doc)


APPROVE_PROMPT = "apply it? [y] yes / [n] no, keep the current config / [e] edit it in $EDITOR: "
KNOBS = ("data_ratio", "hole_ratio", "wait_ratio")


def config_table(old: dict[str, Any] | None, new: dict[str, Any]) -> str:
    """The proposal as one row per size, each knob `old -> new` (`=` when unchanged), for the terminal."""

    def knob(cfg: dict[str, Any] | None, size: str, name: str) -> float | None:
        sizes = (cfg or {}).get("sizes") or {}
        v = (sizes.get(size) or sizes.get(int(size)) or {}) if isinstance(sizes, dict) else {}
        v = v.get(name) if isinstance(v, dict) else None
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    def cell(a: float | None, b: float | None) -> str:
        fa = "-" if a is None else f"{a:.3f}"
        fb = "-" if b is None else f"{b:.3f}"
        return f"{fa}  =    " if a is not None and b is not None and abs(a - b) <= 1e-9 else f"{fa} -> {fb}"

    sizes = sorted({str(k) for k in ((new or {}).get("sizes") or {})} | {str(k) for k in ((old or {}).get("sizes") or {})},
                   key=lambda x: (int(x), x) if x.isdigit() else (1 << 30, x))
    head = f"{'size':<6}" + "".join(f"{KNOB_NAMES[k]:<17}" for k in KNOBS)
    rows = [head, "-" * len(head)]
    for n in sizes:
        cells = [cell(knob(old, n, k), knob(new, n, k)) for k in KNOBS]
        moved = any("->" in c for c in cells)
        rows.append(f"{n + 'x' + n:<6}" + "".join(f"{c:<17}" for c in cells) + (" *" if moved else ""))
    return "\n".join(rows)


def _editor_command() -> list[str]:
    import shlex

    editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or ""
    cmd = shlex.split(editor)
    if not cmd:
        raise ValueError("no editor: set EDITOR (e.g. EDITOR=nano) before the run, or answer y or n")
    return cmd


def _edit_in_editor(path: Path, config: dict[str, Any]) -> Any:
    """Write `config` to `path`, open $VISUAL/$EDITOR on it, and return the JSON it holds afterwards (raises
    ValueError with one line when it is not JSON or the editor failed)."""
    import subprocess

    write_json_atomic(path, {"sizes": config.get("sizes", config)})
    cmd = _editor_command()
    try:
        rc = subprocess.run([*cmd, str(path)]).returncode
    except OSError as e:
        raise ValueError(f"cannot start the editor {cmd[0]!r}: {e.strerror or e}") from None
    if rc != 0:
        raise ValueError(f"the editor {cmd[0]!r} exited with status {rc}; nothing was changed")
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path} is not JSON any more: {str(e).splitlines()[0]}") from None


def _ask_approval(graph, cfg: dict[str, Any], settings: Settings, run_dir: Path) -> None:
    """Interrupted before apply: let a person apply, reject or edit the validated proposal.

    The proposal is shown as a table (old -> new per size and knob); the answer is explicit: `y` applies
    it, `n` keeps the current config, `e` opens $VISUAL/$EDITOR on a prefilled file
    (stage_k/approve_edit.json). An edited config goes through validate_config's own checks (strict
    validation, else projection, then the generator's feasibility dry-run on the next stage's data seed);
    an unusable edit is explained and asked about again. Anything else (Enter alone included) is asked
    again. Every answer is recorded in stage_k/validation.json as a decision `by: person`, and the line
    after it says what will be applied."""
    snap = graph.get_state(cfg)
    values = snap.values
    if not values.get("accepted") or "config" not in values:
        return  # stage 0: nothing proposed yet
    from nodes.apply import stage_seed
    from nodes.validate_config import check_proposal, config_diff, feasibility

    accepted = values["accepted"]
    current = values["config"]
    stage = int(values.get("stage", 0))
    _say(f"\nProposed config for stage {stage + 1} (decision: {values.get('decision')}; * = changed):")
    _say(config_table(current, accepted))
    if values.get("rationale"):
        _say(f"rationale: {values['rationale'][:1000]}")
    edit_path = Path(run_dir) / f"stage_{stage}" / "approve_edit.json"
    draft = accepted
    while True:
        _say(APPROVE_PROMPT)
        line = sys.stdin.readline()
        if not line:
            raise RunError("--approve needs answers on standard input; none came (end of input)")
        answer = line.strip().lower()
        if answer in ("y", "yes"):
            _record_person(run_dir, stage, {"decision": "approved (person)", "accepted": accepted,
                                            "reason": f"a person approved the engineer's {values.get('decision')} config",
                                            "diff": config_diff(current, accepted)})
            _say(f"[approve] applying the engineer's config to stage {stage + 1}: "
                 f"{diff_summary(config_diff(current, accepted))}")
            return
        if answer in ("n", "no"):
            graph.update_state(cfg, {"accepted": current, "decision": "kept_previous (person)"})
            _record_person(run_dir, stage, {"decision": "kept_previous (person)", "accepted": current,
                                            "reason": "a person kept the current config", "diff": {}})
            _say(f"[approve] keeping stage {stage}'s config for stage {stage + 1} (no change)")
            return
        if answer not in ("e", "edit"):
            _say(f"please answer y, n or e (got {answer[:40]!r})" if answer else "please answer y, n or e")
            continue
        try:
            raw = _edit_in_editor(edit_path, draft)
        except ValueError as e:
            _say(f"cannot use the edit: {e}"[:500])
            continue
        if isinstance(raw, dict) and isinstance(raw.get("sizes"), dict):
            draft = raw  # a second [e] reopens the person's own last edit
        checked = check_proposal(raw if isinstance(raw, dict) else None, current)
        if checked["config"] is None:
            _say(f"cannot use the edit: {'; '.join(checked['errors'])}".splitlines()[0][:500])
            continue
        feas = feasibility(checked["config"], settings.feasibility_n, stage_seed(settings.seed, stage + 1))
        if not feas["ok"]:
            _say(f"cannot use the edit: infeasible: {'; '.join(feas['problems'])}"[:500])
            continue
        if checked["decision"] == "projected":
            _say(f"the edit was projected onto allowed values: {'; '.join(checked['notes'])}"[:500])
        edited = checked["config"].model_dump(mode="json")
        graph.update_state(cfg, {"accepted": edited, "decision": "edited (person)"})
        _record_person(run_dir, stage, {
            "decision": "edited (person)", "accepted": edited, "source": str(edit_path),
            "reason": f"a person replaced the engineer's config ({checked['decision']} by validation)",
            "errors": checked["errors"], "notes": checked["notes"], "diff": config_diff(current, edited),
            "feasibility": {k: v for k, v in feas.items() if k != "stats"},
        })
        _say(f"[approve] applying the edited config to stage {stage + 1} ({checked['decision']} by validation):")
        _say(config_table(current, edited))
        return


LOADS_CHECKPOINT = ("train_stage", "evaluate", "final_evaluate")


def _check_state_files(run_dir: Path, values: dict[str, Any], nxt: tuple[str, ...], settings: Settings) -> None:
    """Before streaming a resumed run: the files its next node loads exist and are intact (a deleted or
    damaged checkpoint is one line with a resume hint, not a traceback from deep inside a trainer)."""
    from graph.runfolder import checkpoint_problem

    stage = int(values.get("stage") or 0)
    ckpt = values.get("checkpoint")
    loads = set(LOADS_CHECKPOINT) | ({"propose_config"} if settings.engineer == "self" else set())
    if ckpt and nxt and nxt[0] in loads:
        problem = checkpoint_problem(Path(resolve_in_run(ckpt, run_dir)))
        if problem:
            raise RunFolderError(
                f"{resolve_in_run(ckpt, run_dir)} (the policy after stage {stage}, which the run goes on from) is "
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


def _refuse_lost_state(run_dir: Path, why: str, done: list[str]) -> RunFolderError:
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


# what the run is doing, for the one-line error and the interrupt message
_NOW: dict[str, Any] = {"node": None, "stage": None}


def run_graph(run_dir: Path, settings: Settings, resume: bool) -> dict[str, Any]:
    """Stream the graph to its end (or an error) with progress lines. A new run whose thread already holds
    a state (seeded by --stage0-from) continues from it; `resume` continues where a run stopped.

    Raises `RunFolderError` (one line) when graph.sqlite is unreadable, or lost while stages have finished
    (never starting over on top of them), or when the checkpoint the run goes on from is damaged; and
    `nodes.stop.StageInterrupted` when a stop was requested (SIGINT/SIGTERM), after the last finished node's
    state was saved."""
    run_dir = Path(os.path.abspath(run_dir))
    done = finished_stages(run_dir)
    problem = database_problem(run_dir)
    if problem is not None and (done or problem not in ("missing", "empty (0 bytes)")):
        raise _refuse_lost_state(run_dir, problem, done)
    thread = thread_id(run_dir, settings.run_id)
    from llm_backends.policy import set_enable_thinking

    set_enable_thinking(settings.train.enable_thinking)  # every evaluation and engineer request, as in training
    graph, conn = _open_graph(run_dir, settings)
    cfg = {"configurable": {"thread_id": thread}, "recursion_limit": recursion_limit(settings)}
    ctx = RunContext(settings=settings, run_dir=run_dir)
    try:
        inputs: dict[str, Any] | None = None
        asked_for: int | None = None  # the stage whose proposal a person already answered before streaming
        snap = graph.get_state(cfg)
        if resume:
            if not snap.values:
                if done:  # the thread is empty (or another run's), but this folder holds finished stages
                    raise _refuse_lost_state(run_dir, f"without a state for run {thread!r}", done)
                inputs = {}
                _say(f"[resume] {run_dir}: no checkpoint yet, starting from the beginning")
            elif not snap.next:
                _say(f"[resume] {run_dir}: the run already finished; see {run_dir / 'report.md'}")
                return snap.values
            else:
                _check_state_files(run_dir, snap.values, tuple(snap.next), settings)
                _say(f"[resume] {run_dir}: continuing at stage {snap.values.get('stage', 0)}, node {snap.next[0]}")
                decided = str(snap.values.get("decision") or "").endswith("(person)")
                if settings.approve and tuple(snap.next) == ("apply",) and snap.values.get("accepted") and not decided:
                    # died while waiting at the prompt: the interrupt is behind us, streaming would apply unasked
                    _ask_approval(graph, cfg, settings, run_dir)
                    asked_for = int(snap.values.get("stage", 0))
        elif snap.values:
            _say(f"[run] continuing after the shared stage 0 at node {snap.next[0] if snap.next else '-'}")
        else:
            inputs = {}
        state: dict[str, Any] = dict(graph.get_state(cfg).values or {})
        t_start = time.monotonic()
        started: dict[str, float] = {}
        _SIGNALS["interruptible"] = False  # from here a first signal stops at the next step or node
        while True:
            for mode, chunk in graph.stream(inputs, cfg, context=ctx, stream_mode=["tasks", "updates"],
                                            durability="sync"):
                if mode == "tasks":
                    if "input" in chunk:  # a task starts (its end comes as an update)
                        started[chunk["name"]] = time.monotonic()
                        _NOW.update(node=chunk["name"], stage=(chunk["input"] or {}).get("stage"))
                        line = _describe_start(chunk["name"], chunk["input"] or {}, settings)
                        if line:
                            _say(line)
                    continue
                for node, update in chunk.items():
                    if node.startswith("__"):
                        continue
                    if isinstance(update, dict):
                        state.update(update)
                    line = _describe_update(node, update or {}, state, run_dir)
                    now = time.monotonic()
                    if line:
                        took = now - started.get(node, now)
                        _say(f"{line}  [{node} {took:.0f}s, run {(now - t_start) / 60:.1f} min]")
                    warning = zero_variance_warning(node, update, state)
                    if warning:
                        _say(warning)
            inputs = None
            snap = graph.get_state(cfg)
            if not snap.next:
                return snap.values
            if stop.stop_requested():
                raise stop.StageInterrupted(f"stopped before {snap.next[0]}")
            if settings.approve and snap.next[0] == "apply":
                if asked_for != int(snap.values.get("stage", 0)):
                    _ask_approval(graph, cfg, settings, run_dir)
                asked_for = None
                continue
            raise RunError(f"the run stopped before {snap.next}; resume with --resume {run_dir}")
    except sqlite3.DatabaseError as e:
        raise RunFolderError(
            f"{run_dir / DB_FILE} cannot be read ({e}); "
            + ("put it back from a copy of this run" if done else f"move it away (mv {run_dir / DB_FILE} "
               f"{run_dir / DB_FILE}.bad) and resume to start over; no stage had finished")
        ) from None
    finally:
        conn.close()


PING_TIMEOUT_S = 30.0


def dummy_metrics() -> dict[str, Any]:
    """Validation metrics for a dry run's dummy context: 4 answers per size, fewer valid on larger grids."""
    from env.verify import FAILURES
    from nodes.evaluate import compute_metrics

    rows = []
    for size in range(3, 11):
        for i in range(4):
            valid = i < max(0, 4 - (size - 2))
            rows.append({"size": size, "valid": valid, "optimal": valid and i == 0,
                         "failure": None if valid else FAILURES[(size + i) % len(FAILURES)]})
    return compute_metrics(rows)


def _dry_run_model(settings: Settings):
    """An HTTP engineer with one attempt within PING_TIMEOUT_S (a dry run says at once that it does not answer,
    it does not retry for the run's budget); None: `propose` opens the engineer as the run would (self, base)."""
    from llm_backends.engineers import check_engineer_env

    spec = check_engineer_env(settings.engineer, os.environ, model=settings.engineer_model,
                              base_url=settings.engineer_base_url)
    if spec is None or spec.backend != "http":
        return None
    from llm_backends.openai_chat import OpenAIChat

    return OpenAIChat(spec.base_url, spec.model, api_key=spec.api_key, backend=spec.kind,
                      timeout_s=PING_TIMEOUT_S, total_budget_s=PING_TIMEOUT_S, max_attempts=1)


def _dry_run_proposal(settings: Settings, run_dir: Path, config: dict[str, Any]) -> None:
    """Ask the engineer for one real proposal on a dummy context (stage 0's config and made-up validation
    results), validate it as the run would (strict, projection, feasibility) and say what came out. A call
    that fails is a RunError (one line); a reply without a usable config is reported, not an error."""
    from nodes.apply import stage_seed
    from nodes.propose_config import propose
    from nodes.summarize_failures import build_context
    from nodes.validate_config import check_proposal, config_diff, feasibility

    state: dict[str, Any] = {"stage": 0, "config": config, "metrics": dummy_metrics(), "history": []}
    try:
        env_stats = json.loads((Path(run_dir) / "stage_0" / "env_stats.json").read_text())
    except (OSError, ValueError):
        env_stats = None
    state["context"] = build_context(variant=settings.context, state=state, settings=settings, env_stats=env_stats)
    _say(f"[dry-run] asking the {settings.engineer} engineer for one proposal on a dummy context "
         f"({len(state['context'])} chars, context {settings.context}) ...")
    t0 = time.monotonic()
    model = None if settings.is_classic_engineer else _dry_run_model(settings)
    where = Path(run_dir) / "dry_run_engineer"  # its prompt and reply (stage_0/ is the run's own, or a donor's)
    try:
        if model is not None:
            with model:
                out = propose(state, settings, where, model=model)
        else:
            out = propose(state, settings, where)
    except Exception as e:  # noqa: BLE001 - a server that did not start, ...: one line either way
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise RunError(f"[dry-run] engineer {settings.engineer!r} did not answer: {first[:400]}") from None
    took = time.monotonic() - t0
    feedback = "; ".join(out.get("feedback") or [])
    if out.get("proposal") is None:
        if feedback.startswith("the engineer call failed"):
            raise RunError(f"[dry-run] engineer {settings.engineer!r} did not answer: "
                           f"{feedback.split(': ', 1)[-1][:400]}")
        _say(f"[dry-run] engineer {settings.engineer!r} answered in {took:.1f}s without a usable config: "
             f"{feedback[:300]} (a run would ask again, up to engineer_max_attempts={settings.engineer_max_attempts}, "
             "then keep the current config)")
        return
    checked = check_proposal(out["proposal"], config)
    if checked["config"] is None:
        _say(f"[dry-run] engineer {settings.engineer!r} answered in {took:.1f}s; its config is refused by "
             f"validation: {'; '.join(checked['errors'])[:300]} (a run would ask again)")
        return
    feas = feasibility(checked["config"], settings.feasibility_n, stage_seed(settings.seed, 1))
    new = checked["config"].model_dump(mode="json")
    verdict = checked["decision"] + ("" if feas["ok"] else f", but infeasible: {'; '.join(feas['problems'])[:200]}")
    _say(f"[dry-run] engineer {settings.engineer!r} answered in {took:.1f}s: a config, {verdict} "
         f"({diff_summary(config_diff(config, new))})")
    if checked["notes"]:
        _say(f"[dry-run] projection: {'; '.join(checked['notes'])[:300]}")
    _say(config_table(config, new))
    if out.get("rationale"):
        _say(f"[dry-run] rationale: {str(out['rationale'])[:300]}")


def dry_run(run_dir: Path, settings: Settings, donor=None) -> None:
    from graph.graph import make_graph
    from nodes.apply import apply_config

    make_graph()
    _say("[dry-run] graph built")
    plan = _say_training_plan(settings, run_dir)
    if donor is not None:
        _say(f"[dry-run] stage 0 would be shared from {donor.run_dir} (checkpoint {donor.checkpoint_id})")
        try:
            config = json.loads((Path(donor.run_dir) / "stage_0" / "config.json").read_text())
        except (OSError, ValueError):
            config = None
    else:
        update = apply_config({}, settings, run_dir)
        config = update["config"]
        _say(f"[dry-run] stage-0 data generated: {update['train_path']}")
    if plan is not None and plan["gpu_mocked"] and settings.engineer in ("self", "base"):
        _say(f"[dry-run] engineer {settings.engineer!r} not pinged for a proposal: it is served by the vLLM server "
             "above, on a GPU this machine lacks")
        return
    if config is not None:
        from env import EnvConfig

        try:
            config = EnvConfig.model_validate(config).model_dump(mode="json")
        except ValueError:
            config = None
    if config is None:
        _say("[dry-run] no readable stage-0 config to show the engineer; not asked for a proposal")
        return
    _dry_run_proposal(settings, run_dir, config)


def _say_training_plan(settings: Settings, run_dir: Path) -> dict | None:
    """Build what stage 0 would run, up to the model load (GRPOConfig, LoRA config, the vLLM server's command
    line; nodes.gpu_plan), as on one GPU when the preset trains on one and this machine has none, and print it."""
    from nodes.gpu_plan import plan_lines, training_plan

    try:
        plan = training_plan(settings, run_dir)
    except Exception as e:  # noqa: BLE001 - a config TRL or vLLM refuses: one line, like any bad setting
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:400]
        raise RunError(f"[dry-run] the training configuration cannot be built: {type(e).__name__}: {first}") from None
    for line in plan_lines(plan, settings):
        _say(f"[dry-run] {line}")
    return plan


# First SIGINT/SIGTERM: ask the run to stop at the next training step or node (nodes.stop), raise nothing
# (a KeyboardInterrupt raised from a handler can land in a __del__, where Python ignores it, and training
# goes on). Before the graph streams and at the --approve prompt nothing is in flight: the first signal
# interrupts at once. A second signal kills the vLLM servers and every child process and exits.
_SIGNALS: dict[str, Any] = {"count": 0, "interruptible": True, "run_dir": None}


def _resume_hint() -> str:
    run_dir = _SIGNALS.get("run_dir")
    return f"resume with: python -m graph.run --resume {run_dir}" if run_dir else "nothing to resume"


def _on_signal(signum, frame) -> None:  # noqa: ARG001 - signal handler signature
    name = signal.Signals(signum).name
    _SIGNALS["count"] += 1
    if _SIGNALS["count"] == 1 and _SIGNALS["interruptible"]:
        raise KeyboardInterrupt
    if _SIGNALS["count"] == 1:
        stop.request_stop(name)
        _write_now(f"\n[stop] {name}: stopping at the next training step or node boundary; the finished work is "
                   f"kept ({name} again stops at once)\n")
        return
    _write_now(f"\n[stop] {name} again: stopping now; {_resume_hint()}\n")
    _kill_children()
    os._exit(EXIT_INTERRUPTED)


def _write_now(text: str) -> None:
    try:  # os.write, not print: a handler may run while the main thread is inside a print to stderr
        os.write(2, text.encode("utf-8", "replace"))
    except OSError:
        pass


def _kill_children() -> None:
    """SIGKILL the vLLM servers (their groups and engine cores) and every other process below this one."""
    from llm_backends.server_cleanup import descendants, kill_all

    try:
        kill_all()
    except Exception:  # noqa: BLE001 - exiting anyway: kill what can be killed
        pass
    for pid in descendants(os.getpid()):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _install_signal_handlers() -> None:
    from llm_backends.server_cleanup import defer_signal_cleanup

    _SIGNALS.update(count=0, interruptible=True, run_dir=None)
    stop.reset()
    defer_signal_cleanup()  # the servers' own handlers (chained on first start) leave the first signal to us
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _on_signal)


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


def _resume_settings(args: argparse.Namespace, run_dir: Path) -> Settings:
    """settings.json of the run (+ --approve), with the full engineer URL when settings.json masked its
    credentials; announces every flag and environment variable it ignores."""
    from llm_backends.redact import has_masked_credentials, mask_url

    settings = Settings.load(run_dir / "settings.json")
    given = _cli_values(args)
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
        _say(f"[resume] ignoring {', '.join(ignored)}: a resumed run keeps its settings.json "
             "(only --approve can be added)")
    return settings


def _track_shared_stage0(run_dir: Path, settings: Settings, donor) -> None:
    """A fork's loop run (TensorBoard / W&B) starts with the donor's stage 0, as if trained here: its config,
    its per-step train/* (stage_0/tb is linked) and its evaluation (graph.tracking)."""
    from graph.tracking import track

    values = donor.values
    track("apply", {}, {"stage": 0, "config": values.get("config")}, run_dir, settings)
    track("train_stage", {"stage": 0}, {"train_metrics": values.get("train_metrics")}, run_dir, settings)
    track("evaluate", {"stage": 0}, {"metrics": values.get("metrics")}, run_dir, settings)


def _check_model_cache(settings: Settings) -> None:
    """The embedded policy is converted once into the model cache: a cache that cannot be written is found
    now (and by --dry-run), not when stage 0 loads the model."""
    from llm_backends.models import check_cache_writable

    try:
        check_cache_writable(settings.policy_model)
    except OSError as e:
        raise SettingsError(str(e)) from None


def _error_log(run_dir: Path | None, exc: BaseException) -> Path | None:
    """The traceback of an unexpected error, kept in run_dir/logs/error.log (the terminal gets one line)."""
    import traceback

    if run_dir is None:
        return None
    path = Path(run_dir) / "logs" / "error.log"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {_NOW}\n")
            f.write("".join(traceback.format_exception(exc)))
    except OSError:
        return None
    return path


def _where() -> str:
    node, stage = _NOW.get("node"), _NOW.get("stage")
    if node is None:
        return ""
    return f"{node}" + (f" of stage {stage}" if isinstance(stage, int) and node != "final_evaluate" else "")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    created: Path | None = None
    scratch: Path | None = None  # a dry run's temporary folder
    run_dir: Path | None = None
    donor = None
    lock: RunLock | None = None
    _install_signal_handlers()
    _NOW.update(node=None, stage=None)
    try:
        if args.resume:
            if args.stage0_from:
                raise SettingsError("--stage0-from starts a new run; it cannot be combined with --resume")
            run_dir = Path(args.resume)
            if not (run_dir / "settings.json").is_file():
                raise SettingsError(f"--resume {str(run_dir)!r}: no settings.json there; is it a run folder?")
            lock = RunLock(run_dir).acquire()
            _SIGNALS["run_dir"] = run_dir
            settings = _resume_settings(args, run_dir)
            _check_before_work(settings)
            _check_model_cache(settings)
        else:
            env = dict(os.environ)
            if env.get("APPROVE", "").lower() in ("1", "true", "yes"):
                env["APPROVE"] = "true"
            settings = build_settings(_cli_values(args), env)
            _check_before_work(settings)
            _check_model_cache(settings)
            if args.stage0_from:
                from graph.stage0 import check_donor

                donor = check_donor(Path(args.stage0_from), settings)
            if args.dry_run and settings.run_dir is None:  # a dry run keeps nothing unless --run-dir asks it to
                import tempfile

                run_dir = Path(tempfile.mkdtemp(prefix="env-engineer-dry-run-"))
                scratch = created = run_dir
            else:
                run_dir = _new_run_dir(settings, Path(args.runs_root))
            if not run_dir.exists():
                created = run_dir
            try:
                run_dir.mkdir(parents=True, exist_ok=True)
            except OSError as e:  # root passes os.access() on /proc and read-only mounts
                raise SettingsError(
                    f"bad setting run_dir={str(run_dir)!r}: cannot create it ({e.strerror})"
                ) from None
            try:
                lock = RunLock(run_dir).acquire()
            except RunFolderError:
                created = None  # another process is starting a run in this folder: its folder, not ours
                raise
            _SIGNALS["run_dir"] = run_dir
            from graph.provenance import collect as provenance

            settings = settings.model_copy(update={"run_dir": run_dir, "run_id": run_dir.name,
                                                   "provenance": provenance()})
            settings.save(run_dir / "settings.json")
            _say(f"[{'dry-run' if args.dry_run else 'run'}] {run_dir} (preset {settings.preset}, engineer "
                 f"{settings.engineer}, {settings.stages} stages, context {settings.context})"
                 + (": a temporary folder, removed at the end (--run-dir DIR keeps the files)" if scratch else ""))
            if donor is not None and not args.dry_run:
                from graph.stage0 import seed_from_donor

                try:
                    record = seed_from_donor(donor, run_dir, settings)
                except (OSError, sqlite3.Error, RuntimeError, ValueError) as e:
                    raise RunError(f"--stage0-from {str(donor.run_dir)!r}: could not share stage 0: {e}") from None
                _track_shared_stage0(run_dir, settings, donor)
                _say(f"[run] stage 0 shared from {donor.run_dir} (checkpoint {donor.checkpoint_id}; "
                     f"{record['files']['linked']} files linked, {record['files']['copied']} copied): "
                     "its apply, train_stage and evaluate are not run here")
        if args.dry_run:
            dry_run(run_dir, settings, donor)
            if scratch is not None:
                _stop_servers()  # a self/base engineer's server writes its log into the folder
                lock.release()
                lock = None
                shutil.rmtree(scratch, ignore_errors=True)
                _say("[dry-run] done; nothing kept (--run-dir DIR keeps the dry run's files)")
            return 0
        created = None  # from here on the folder holds finished work: never remove it
        run_graph(run_dir, settings, resume=bool(args.resume))
        _say(f"[done] report: {run_dir / 'report.md'}")
        return 0
    except SettingsError as e:
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        _say(f"error: {e}")
        return EXIT_BAD_SETTINGS
    except (KeyboardInterrupt, stop.StageInterrupted) as e:
        how = stop.stop_reason() or "interrupted"
        where = _where()
        if created is not None:  # interrupted while setting up a new run: nothing finished lives there
            shutil.rmtree(created, ignore_errors=True)
            _say(f"\n[stop] {how}: nothing was started")
        else:
            _say(f"\n[stop] {how}" + (f" during {where}" if where and isinstance(e, stop.StageInterrupted) else "")
                 + f": the finished work is saved; {_resume_hint()}")
        return EXIT_INTERRUPTED
    except (RunFolderError, RunFileError) as e:
        _say(f"error: {e}")
        if isinstance(e, RunFileError) and run_dir is not None:
            _say(f"the state is saved up to the last finished node; resume with: python -m graph.run --resume {run_dir}")
        return 1
    except RunError as e:
        if created is not None:  # a failed dry run or fork set-up: nothing finished lives there yet
            shutil.rmtree(created, ignore_errors=True)
        _say(f"error: {e}")
        return 1
    except Exception as e:  # noqa: BLE001 - any other failure of a node: one line, the traceback in a file
        if stop.stop_requested():  # a node that failed because it was being stopped
            _say(f"\n[stop] {stop.stop_reason()}: the finished work is saved; {_resume_hint()}")
            return EXIT_INTERRUPTED
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
            created = None
        log = _error_log(run_dir, e)
        first = (str(e).strip().splitlines() or [""])[0][:400]
        where = _where()
        _say(f"error: {where + ': ' if where else ''}{type(e).__name__}: {first}")
        if run_dir is not None:
            _say(f"the state is saved up to the last finished node; fix the cause, then resume with: "
                 f"python -m graph.run --resume {run_dir}" + (f" (traceback: {log})" if log else ""))
        return 1
    finally:
        if lock is not None:
            _stop_servers()  # before the folder is free for another process
            lock.release()


def _stop_servers() -> None:
    if "llm_backends.vllm_server" not in sys.modules:
        return
    from llm_backends.policy import stop_kept_server
    from llm_backends.server_cleanup import stop_all

    try:
        stop_kept_server()
        stop_all()
    except Exception as e:  # noqa: BLE001 - exiting: atexit and the launcher's watchdog still stop them
        _say(f"[warn] could not stop a vLLM server: {e}")


if __name__ == "__main__":
    sys.exit(main())
