"""`python -m graph.run`: run the environment-engineer loop end to end, durably.

Examples:
    python -m graph.run                                  # cpu preset, embedded model, self-engineer
    PRESET=smoke ENGINEER=fixed python -m graph.run      # seconds-scale run with the fixed baseline
    ENGINEER=openai OPENAI_API_KEY=... python -m graph.run --stages 3
    python -m graph.run --resume runs/<run-id>           # continue after a crash or Ctrl-C
    python -m graph.run --dry-run                        # validate, build, generate stage 0, ping engineer

Settings come from CLI flags over environment variables over the preset. Every value is checked before
any work starts; a bad one prints one line naming it and what is allowed, and exits with status 2
without leaving a run folder behind. State is checkpointed after every node in `graph.sqlite` inside
the run folder (thread id = run id), so `--resume` never redoes a finished stage.
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

from nodes.context import CONTEXT_VARIANTS, ENV_VARS, RunContext, Settings, SettingsError, build_settings

EXIT_BAD_SETTINGS = 2
EXIT_INTERRUPTED = 130


class RunError(RuntimeError):
    """A one-line, user-facing error of the run command."""


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
    p.epilog = (p.epilog or "") + (
        "\nSettings without a flag (environment variable, or --set):\n" + "\n".join(others)
        + "\nModel serving (environment only):\n"
        "  ENGINEER_SERVING       auto | vllm | transformers: how the self/base engineer is served (auto: vLLM "
        "when installed)\n"
        "  ENV_ENGINEER_CACHE     where the embedded model is converted once (default ~/.cache/env-engineer)"
    )

    def add(flag: str, field: str, **kw: Any) -> None:
        desc = fields[field].description or ""
        p.add_argument(flag, dest=field, default=None, help=f"{desc} [env {env_of[field]}]", **kw)

    add("--preset", "preset", choices=["smoke", "cpu", "paper"])
    add("--engineer", "engineer", metavar="NAME")
    add("--engineer-model", "engineer_model", metavar="MODEL")
    add("--engineer-base-url", "engineer_base_url", metavar="URL")
    add("--policy-model", "policy_model", metavar="MODEL")
    add("--policy-backend", "policy_backend", choices=["transformers", "vllm"])
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
                   help="validate settings, build the graph, generate stage-0 data, ping the engineer; no training")
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


def _check_before_work(settings: Settings) -> None:
    """Checks that need other packages: engineer backend and keys, benchmark splits. One line on failure."""
    from env import list_splits

    splits = list_splits()
    for name, split in (("eval_split", settings.eval_split), ("final_split", settings.final_split)):
        if split not in splits:
            raise SettingsError(f"bad setting {name}={split!r}: allowed: {', '.join(splits)}")
    if not settings.is_classic_engineer:
        from llm.engineers import EngineerConfigError, check_engineer_env

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


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _stage_line(stage: int, metrics: dict[str, Any]) -> str:
    v = metrics.get("eval/valid_rate")
    o = metrics.get("eval/optimal_rate")
    def fmt(x: float | None) -> str:
        return "n/a" if x is None else f"{100 * x:.1f}%"

    return f"[stage {stage}] evaluated: valid {fmt(v)}, optimal {fmt(o)}"


def _describe_update(node: str, update: dict[str, Any], state: dict[str, Any]) -> str | None:
    if not isinstance(update, dict):
        return None
    stage = update.get("stage", state.get("stage", 0))
    if node == "evaluate" and "metrics" in update:
        return _stage_line(stage, update["metrics"])
    if node == "validate_config":
        decision = update.get("decision", "?")
        logged = (update.get("log") or [""])[-1]
        m = re.search(r"\((\d+) size\(s\) changed\)", logged)
        moved = f"({m.group(1)} size(s) changed)" if m else ""
        extra = "; ".join(update.get("feedback") or [])[:200]
        moved = moved if decision in ("accepted", "projected") else ""
        return (f"[stage {stage}] engineer proposal: {decision}" + (f" {moved}" if moved else "")
                + (f" ({extra})" if extra and decision == "retry" else ""))
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


def _ask_approval(graph, cfg: dict[str, Any]) -> None:
    """Interrupted before apply: let a person accept, edit or reject the validated proposal."""
    snap = graph.get_state(cfg)
    values = snap.values
    if not values.get("accepted") or "config" not in values:
        return  # stage 0: nothing proposed yet
    from env import EnvConfig

    accepted = values["accepted"]
    _say(f"\nProposed config for stage {values.get('stage', 0) + 1} (decision: {values.get('decision')}):")
    _say(json.dumps(accepted.get("sizes", accepted), indent=1)[:4000])
    if values.get("rationale"):
        _say(f"rationale: {values['rationale'][:1000]}")
    while True:
        _say("[a]ccept, [k]eep the previous config, or a path to an edited JSON config: ")
        line = sys.stdin.readline()
        if not line:
            raise RunError("--approve needs answers on standard input; none came (end of input)")
        answer = line.strip()
        if answer in ("a", "accept", ""):
            return
        if answer in ("k", "keep"):
            graph.update_state(cfg, {"accepted": values["config"], "decision": "kept_previous (person)"})
            return
        try:
            edited = EnvConfig.model_validate(json.loads(Path(answer).read_text()))
        except Exception as e:  # noqa: BLE001 - any bad file gets a line and another prompt
            _say(f"cannot use {answer!r}: {e}".splitlines()[0])
            continue
        graph.update_state(cfg, {"accepted": edited.model_dump(mode="json"), "decision": "edited (person)"})
        return


def run_graph(run_dir: Path, settings: Settings, resume: bool) -> dict[str, Any]:
    graph, conn = _open_graph(run_dir, settings)
    cfg = {"configurable": {"thread_id": run_dir.name}, "recursion_limit": 50 + 20 * settings.stages}
    ctx = RunContext(settings=settings, run_dir=run_dir)
    try:
        inputs: dict[str, Any] | None = None
        if resume:
            snap = graph.get_state(cfg)
            if not snap.values:
                inputs = {}
                _say(f"[resume] {run_dir}: no checkpoint yet, starting from the beginning")
            elif not snap.next:
                _say(f"[resume] {run_dir}: the run already finished; see {run_dir / 'report.md'}")
                return snap.values
            else:
                _say(f"[resume] {run_dir}: continuing at stage {snap.values.get('stage', 0)}, node {snap.next[0]}")
        else:
            inputs = {}
        state: dict[str, Any] = dict(graph.get_state(cfg).values or {}) if resume else {}
        t_start = t_last = time.monotonic()
        while True:
            for chunk in graph.stream(inputs, cfg, context=ctx, stream_mode="updates", durability="sync"):
                for node, update in chunk.items():
                    if node.startswith("__"):
                        continue
                    if isinstance(update, dict):
                        state.update(update)
                    line = _describe_update(node, update or {}, state)
                    now = time.monotonic()
                    if line:
                        _say(f"{line}  [{node} {now - t_last:.0f}s, run {(now - t_start) / 60:.1f} min]")
                    t_last = now
            inputs = None
            snap = graph.get_state(cfg)
            if not snap.next:
                return snap.values
            if settings.approve and snap.next[0] == "apply":
                _ask_approval(graph, cfg)
                continue
            raise RunError(f"the run stopped before {snap.next}; resume with --resume {run_dir}")
    finally:
        conn.close()


def dry_run(run_dir: Path, settings: Settings) -> None:
    from graph.graph import make_graph
    from nodes.apply import apply_config

    make_graph()
    _say("[dry-run] graph built")
    update = apply_config({}, settings, run_dir)
    _say(f"[dry-run] stage-0 data generated: {update['train_path']}")
    if settings.is_classic_engineer:
        _say(f"[dry-run] engineer {settings.engineer!r} is a classic curriculum: nothing to ping")
        return
    from llm.engineers import open_engineer

    with open_engineer(settings.engineer, checkpoint=None, base_model=settings.policy_model, run_dir=run_dir,
                       model=settings.engineer_model, base_url=settings.engineer_base_url) as eng:
        reply = eng.chat([{"role": "user", "content": "Reply with the single word OK."}], max_tokens=8)
    _say(f"[dry-run] engineer {settings.engineer!r} answered in {reply.latency_s:.1f}s: {reply.text.strip()[:60]!r}")


def _raise_interrupt(signum, frame):  # noqa: ARG001 - signal handler signature
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    created: Path | None = None
    run_dir: Path | None = None
    # SIGTERM takes the same clean path as Ctrl-C: servers are stopped by their context managers.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        if args.resume:
            run_dir = Path(args.resume)
            if not (run_dir / "settings.json").is_file():
                raise SettingsError(f"--resume {str(run_dir)!r}: no settings.json there; is it a run folder?")
            settings = Settings.load(run_dir / "settings.json")
            given = _cli_values(args)
            if given.pop("approve", None):
                settings = settings.model_copy(update={"approve": True})
            if given:
                _say(f"[resume] ignoring {', '.join(sorted(given))}: a resumed run keeps its settings.json "
                     "(only --approve can be added)")
            _check_before_work(settings)
        else:
            env = dict(os.environ)
            if env.get("APPROVE", "").lower() in ("1", "true", "yes"):
                env["APPROVE"] = "true"
            settings = build_settings(_cli_values(args), env)
            _check_before_work(settings)
            run_dir = _new_run_dir(settings, Path(args.runs_root))
            if not run_dir.exists():
                created = run_dir
            try:
                run_dir.mkdir(parents=True, exist_ok=True)
            except OSError as e:  # root passes os.access() on /proc and read-only mounts
                raise SettingsError(
                    f"bad setting run_dir={str(run_dir)!r}: cannot create it ({e.strerror})"
                ) from None
            settings = settings.model_copy(update={"run_dir": run_dir})
            settings.save(run_dir / "settings.json")
            _say(f"[run] {run_dir} (preset {settings.preset}, engineer {settings.engineer}, "
                 f"{settings.stages} stages, context {settings.context})")
        if args.dry_run:
            dry_run(run_dir, settings)
            return 0
        created = None  # from here on the folder holds finished work: never remove it
        run_graph(run_dir, settings, resume=bool(args.resume))
        _say(f"[done] report: {run_dir / 'report.md'}")
        return 0
    except SettingsError as e:
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_SETTINGS
    except KeyboardInterrupt:
        print(f"\ninterrupted; resume with: python -m graph.run --resume {run_dir}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except RunError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
