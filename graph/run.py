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
- the first SIGINT/SIGTERM stops at the next training step, evaluation batch or node boundary (trainer.stop) with exit 130 and
  the resume command; a second kills the vLLM servers and every child process and exits at once;
- a failing node prints one line (the traceback goes to logs/error.log) with the resume command;
- text from the engineer reaches the terminal without control characters.

This module is the command line only: the checks before any work are in graph/preflight.py, the streamed
loop in graph/loop.py, its progress lines in graph/progress.py, --approve in graph/approve.py, --dry-run
in graph/dryrun.py, signals and child processes in graph/interrupt.py.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from graph.dryrun import dry_run
from graph.interrupt import EXIT_INTERRUPTED, SIGNALS, install_signal_handlers, resume_hint, stop_servers
from graph.loop import run_graph, share_stage0
from graph.preflight import check_before_work, check_model_cache, new_run_dir, resume_settings
from graph.progress import NOW, RunError, error_log, now_running, say
from graph.runfolder import RunFolderError, RunLock
from graph.settings import CONTEXT_VARIANTS, ENV_VARS, PRESETS, Settings, SettingsError, build_settings
from trainer import stop
from trainer.files import RunFileError

EXIT_BAD_SETTINGS = 2


def preset_help() -> str:
    """One paragraph per preset for --help, built from the presets themselves (so it cannot go stale)."""
    from trainer.config import TRAIN_PRESETS, TrainConfig

    def train(name: str, field: str) -> Any:
        return TRAIN_PRESETS[name].get(field, TrainConfig.model_fields[field].default)

    out = []
    for name, run in PRESETS.items():
        optimizer = "filtered fine-tuning" if train(name, "optimizer") == "filtered" else "GRPO"
        budget = (f"{train(name, 'stage_samples')} sampled answers of {optimizer} per stage" if train(name, "stage_samples")
                  else f"{train(name, 'max_steps')} {optimizer} steps per stage (-1: epochs)")
        line = (f"  {name}: {run.get('stages', 3)} stages, {train(name, 'instances_per_stage')} training instances "
                f"and {budget}, answers capped at "
                f"{train(name, 'max_completion_length')} tokens in training and {run.get('eval_max_tokens')} at "
                f"evaluation, validation on {run.get('eval_split')}"
                + (f" (first {run['eval_limit']})" if run.get("eval_limit") else "")
                + (f", beside {run['eval_samples']} answers a question sampled at "
                   f"{run.get('eval_sample_temperature') or train(name, 'temperature')} (mean@{run['eval_samples']})"
                   if run.get("eval_samples") else "") + ".")
        if name == "smoke":
            line += (" Its training cap makes a valid plan impossible (the shortest plan of the validation splits, "
                     "3x3 with two agents, takes about 39 tokens of the embedded model), so every GRPO reward is 0 "
                     "by design, and the evaluation cap fits only the shortest plans. It checks the plumbing (every "
                     "node, resume, the files) in minutes, never learning; use cpu for that. It keeps only the "
                     "last stage's checkpoint (keep_checkpoints=last).")
        elif name == "cpu":
            line += " The embedded 135M model on a CPU, from a cached SFT warm start (the default)."
        elif name == "rg-cpu":
            line += (f" The same model on a reasoning-gym task ({run.get('task')}), a cached "
                     "full fine-tuning warm start, then reward-filtered fine-tuning stages; no stage measured so far gained "
                     "(evals/results/rg_candidates).")
        elif name == "cpu-long":
            line += (" The same model from a 300-step warm start, with 96-step stages of 2 prompts x 8: one such "
                     "stage raised the greedy valid rate by about 4-5 points (evals/results/learning_cpu), where "
                     "cpu's gains about 1. Hours, not minutes.")
        elif name == "paper":
            line += " Qwen3-4B with LoRA and vLLM generation on a GPU, the paper's scale."
        out.append(line)
    import textwrap

    return "\n".join(textwrap.fill(x, 110, subsequent_indent="    ") for x in out)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m graph.run",
        description="LLM-as-Environment-Engineer: train a policy for a stage, evaluate it on a fixed validation "
        "split, show an engineer (a model, or a classic curriculum) what went wrong, let it design the next "
        "stage's training environment, check that design, repeat; then a held-out evaluation and a report. "
        "The task family is --task: MAPF-FrozenLake (multi-agent path finding on frozen-lake grids, the "
        "default; the engineer sets per-size data, hole and wait ratios) or a reasoning-gym dataset "
        "(rg:<dataset>; the engineer sets each difficulty level's share), or your own (docs/tasks.md). Each flag "
        "overrides its environment variable, which overrides the preset.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Secrets: ENGINEER_API_KEY (falls back to OPENAI_API_KEY / GEMINI_API_KEY) is read from the "
        "environment only and never written anywhere.\nTraining hyper-parameters: --set train.NAME=VALUE "
        "or TRAIN__NAME=VALUE (e.g. TRAIN__LEARNING_RATE=1e-5).",
    )
    fields = Settings.model_fields
    env_of = {f: v for v, f in ENV_VARS.items()}
    flagged = {"preset", "task", "engineer", "engineer_model", "engineer_base_url", "policy_model", "policy_backend",
               "policy_dtype", "context", "stages", "seed", "run_dir", "eval_split", "final_split", "eval_limit", "final_limit",
               "eval_max_tokens", "engineer_max_attempts", "engineer_reasoning_effort", "prompts_dir", "approve"}
    others = [f"  {env_of[f]:<22} --set {f}=...  {fields[f].description}" for f in fields
              if f not in flagged and f in env_of]
    from trainer.config import TrainConfig

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

    add("--preset", "preset", choices=list(PRESETS))  # what each one is: "Presets" below
    add("--task", "task", metavar="TASK")
    add("--engineer", "engineer", metavar="NAME")
    add("--engineer-model", "engineer_model", metavar="MODEL")
    add("--engineer-base-url", "engineer_base_url", metavar="URL")
    add("--policy-model", "policy_model", metavar="MODEL")
    add("--policy-backend", "policy_backend", choices=["auto", "transformers", "vllm"])
    add("--policy-dtype", "policy_dtype", choices=["auto", "float32", "bfloat16"])
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
    add("--engineer-reasoning-effort", "engineer_reasoning_effort", choices=["none", "minimal", "low", "medium", "high"])
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


def main(argv: list[str] | None = None) -> int:
    """Check, set up and run (or dry-run, or resume) one run; the exit status (0, 1, 2 or 130)."""
    args = _parser().parse_args(argv)
    created: Path | None = None
    scratch: Path | None = None  # a dry run's temporary folder
    run_dir: Path | None = None
    donor = None
    lock: RunLock | None = None
    install_signal_handlers()
    NOW.update(node=None, stage=None)
    try:
        if args.resume:
            if args.stage0_from:
                raise SettingsError("--stage0-from starts a new run; it cannot be combined with --resume")
            run_dir = Path(args.resume)
            if not (run_dir / "settings.json").is_file():
                raise SettingsError(f"--resume {str(run_dir)!r}: no settings.json there; is it a run folder?")
            lock = RunLock(run_dir).acquire()
            SIGNALS["run_dir"] = run_dir
            settings = resume_settings(_cli_values(args), run_dir)
            check_before_work(settings)
            check_model_cache(settings)
        else:
            env = dict(os.environ)
            if env.get("APPROVE", "").lower() in ("1", "true", "yes"):
                env["APPROVE"] = "true"
            settings = build_settings(_cli_values(args), env)
            check_before_work(settings)
            check_model_cache(settings)
            if args.stage0_from:
                from graph.stage0 import check_donor

                donor = check_donor(Path(args.stage0_from), settings)
            if args.dry_run and settings.run_dir is None:  # a dry run keeps nothing unless --run-dir asks it to
                import tempfile

                run_dir = Path(tempfile.mkdtemp(prefix="env-engineer-dry-run-"))
                scratch = created = run_dir
            else:
                run_dir = new_run_dir(settings, Path(args.runs_root))
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
            SIGNALS["run_dir"] = run_dir
            from trainer.provenance import collect as provenance

            settings = settings.model_copy(update={"run_dir": run_dir, "run_id": run_dir.name,
                                                   "provenance": provenance()})
            settings.save(run_dir / "settings.json")
            if settings.preset == "smoke" and not args.dry_run:
                say("[smoke] this preset checks the plumbing end to end (every node, a few tiny steps); its stages "
                    "are far too short to learn: for learning, see README.md \"The main job\"")
            say(f"[{'dry-run' if args.dry_run else 'run'}] {run_dir} (preset {settings.preset}, engineer "
                f"{settings.engineer}, {settings.stages} stages, context {settings.context})"
                + (": a temporary folder, removed at the end (--run-dir DIR keeps the files)" if scratch else ""))
            if donor is not None and not args.dry_run:
                share_stage0(donor, run_dir, settings)
        if args.dry_run:
            dry_run(run_dir, settings, donor)
            if scratch is not None:
                stop_servers()  # a self/base engineer's server writes its log into the folder
                lock.release()
                lock = None
                shutil.rmtree(scratch, ignore_errors=True)
                say("[dry-run] done; nothing kept (--run-dir DIR keeps the dry run's files)")
            return 0
        created = None  # from here on the folder holds finished work: never remove it
        run_graph(run_dir, settings, resume=bool(args.resume))
        say(f"[done] report: {run_dir / 'report.md'}")
        return 0
    except SettingsError as e:
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        say(f"error: {e}")
        return EXIT_BAD_SETTINGS
    except (KeyboardInterrupt, stop.StageInterrupted) as e:
        how = stop.stop_reason() or "interrupted"
        where = now_running()
        if created is not None:  # interrupted while setting up a new run: nothing finished lives there
            shutil.rmtree(created, ignore_errors=True)
            say(f"\n[stop] {how}: nothing was started")
        else:
            say(f"\n[stop] {how}" + (f" during {where}" if where and isinstance(e, stop.StageInterrupted) else "")
                + f": the finished work is saved; {resume_hint()}")
        return EXIT_INTERRUPTED
    except (RunFolderError, RunFileError) as e:
        say(f"error: {e}")
        if isinstance(e, RunFileError) and run_dir is not None:
            say(f"the state is saved up to the last finished node; resume with: python -m graph.run --resume {run_dir}")
        return 1
    except RunError as e:
        if created is not None:  # a failed dry run or fork set-up: nothing finished lives there yet
            shutil.rmtree(created, ignore_errors=True)
        say(f"error: {e}")
        return 1
    except Exception as e:  # noqa: BLE001 - any other failure of a node: one line, the traceback in a file
        if stop.stop_requested():  # a node that failed because it was being stopped
            say(f"\n[stop] {stop.stop_reason()}: the finished work is saved; {resume_hint()}")
            return EXIT_INTERRUPTED
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
            created = None
        log = error_log(run_dir, e)
        first = (str(e).strip().splitlines() or [""])[0][:400]
        where = now_running()
        say(f"error: {where + ': ' if where else ''}{type(e).__name__}: {first}")
        if run_dir is not None:
            say(f"the state is saved up to the last finished node; fix the cause, then resume with: "
                f"python -m graph.run --resume {run_dir}" + (f" (traceback: {log})" if log else ""))
        return 1
    finally:
        if lock is not None:
            stop_servers()  # before the folder is free for another process
            lock.release()


if __name__ == "__main__":
    sys.exit(main())
