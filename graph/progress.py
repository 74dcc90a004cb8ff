"""What `python -m graph.run` prints while the loop runs: one line on stderr when a long node starts and one
when it ends, built from what LangGraph streams (a task's input state, then the update the node returned),
never from log files or the run folder. Every line passes `nodes.inert.for_terminal`: lines quote the
engineer's text."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from families.mapf import KNOB_NAMES
from graph.settings import Settings
from nodes.inert import for_terminal

# what the run is doing, for the one-line error and the interrupt message
NOW: dict[str, Any] = {"node": None, "stage": None}


class RunError(RuntimeError):
    """A one-line, user-facing error of the run command."""


def say(msg: str) -> None:
    """One progress line on stderr, with control characters removed: lines quote the engineer's text."""
    print(for_terminal(msg), file=sys.stderr, flush=True)


def now_running() -> str:
    """The node running now (and its stage), for the one-line error and the interrupt message."""
    node, stage = NOW.get("node"), NOW.get("stage")
    if node is None:
        return ""
    return f"{node}" + (f" of stage {stage}" if isinstance(stage, int) and node != "final_evaluate" else "")


def error_log(run_dir: Path | None, exc: BaseException) -> Path | None:
    """The traceback of an unexpected error, kept in run_dir/logs/error.log (the terminal gets one line)."""
    import traceback

    if run_dir is None:
        return None
    path = Path(run_dir) / "logs" / "error.log"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {NOW}\n")
            f.write("".join(traceback.format_exception(exc)))
    except OSError:
        return None
    return path


def _stage_line(stage: int, metrics: dict[str, Any]) -> str:
    v = metrics.get("eval/valid_rate")
    o = metrics.get("eval/optimal_rate")
    def fmt(x: float | None) -> str:
        return "n/a" if x is None else f"{100 * x:.1f}%"

    return f"[stage {stage}] evaluated: valid {fmt(v)}, optimal {fmt(o)}"


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
            # a level's share, a MAPF grid size's knob, or a family's own group of levers
            where = f"level {size}" if knob == "share" else f"{size}x{size}" if str(size).isdigit() else str(size)
            items.append(f"{where} {KNOB_NAMES.get(knob, knob)} {num(a, digits)}->{num(b, digits)}")
    if not items:
        return "no change"
    more = len(items) - cap
    return ", ".join(items[:cap]) + (f", +{more} more" if more > 0 else "")


def describe_start(node: str, state: dict[str, Any], settings: Settings) -> str | None:
    """The line printed when a long node starts (its end prints the result line)."""
    stage = int(state.get("stage") or 0)
    if node == "apply":
        k = stage + 1 if state.get("train_path") else stage
        return f"[stage {k}] apply: generating {settings.train.instances_per_stage} training instances ..."
    if node == "train_stage":
        t = settings.train
        if t.optimizer == "filtered":  # trainer/filtered.py: its budget is sampled answers, or optimiser steps
            return f"[stage {stage}] train_stage: reward-filtered fine-tuning" + (
                f", {t.stage_samples} sampled answers" if t.stage_samples else
                f", {t.max_steps} steps" if t.max_steps > 0 else "") + " ..."
        return f"[stage {stage}] train_stage" + (f": {t.max_steps} GRPO steps" if t.max_steps > 0 else "") + " ..."
    if node == "evaluate":
        return f"[stage {stage}] evaluate on {settings.eval_split}" + (
            f", and {settings.eval_samples} sampled answers a question" if settings.eval_samples else "") + " ..."
    if node == "summarize_failures":
        return f"[stage {stage}] summarize_failures: context {settings.context} ..."
    if node == "propose_config":
        return f"[stage {stage}] propose_config: asking the {settings.engineer} engineer ..."
    if node == "final_evaluate":
        return f"[final] final_evaluate on {settings.final_split} ..."
    return None


def describe_update(node: str, update: dict[str, Any], state: dict[str, Any],
                    settings: Settings | None = None) -> str | None:
    """The line printed when `node` returned `update`; `state` is the loop's state with `update` merged in;
    `settings` name the run's task (MAPF-FrozenLake when None)."""
    if not isinstance(update, dict):
        return None
    stage = update.get("stage", state.get("stage", 0))
    if node == "evaluate" and "metrics" in update:
        start = update.get("start_metrics")
        line = _stage_line(stage, update["metrics"])
        if isinstance(start, dict) and isinstance(start.get("eval/valid_rate"), (int, float)):
            line += f" (warm start before it: valid {100 * start['eval/valid_rate']:.1f}%)"
        return line
    if node == "summarize_failures":
        return f"[stage {stage}] failures summarized for the engineer ({len(update.get('context') or '')} chars)"
    if node == "validate_config":
        decision = update.get("decision", "?")
        if decision in ("accepted", "normalised", "projected"):
            from families import DEFAULT_TASK, family_of

            # the diff validation.json records: the accepted config against the current one (the family's `diff`)
            family = family_of(settings if settings is not None else DEFAULT_TASK)
            diff = family.diff(state.get("config"), update.get("accepted"))
            return f"[stage {stage}] engineer proposal: {decision} ({diff_summary(diff)})"
        extra = "; ".join(update.get("feedback") or [])[:300]
        return (f"[stage {stage}] engineer proposal: {decision}"
                + (f" ({extra})" if extra and decision in ("retry", "kept_previous") else ""))
    if node == "propose_config":  # the reply's length and notes stay in the node's log (progress.txt)
        found = "found a config" if update.get("proposal") is not None else "no usable config"
        reply = f"; the reply was {update['reply']}"[:300] if update.get("reply") else ""  # empty or cut, named
        return f"[stage {stage}] engineer replied (attempt {update.get('attempts', '?')}): {found}{reply}"
    if node == "apply":
        return f"[stage {stage}] training set ready: {update.get('train_path', '')}"
    if node == "train_stage":
        tm = update.get("train_metrics") or {}
        r = tm.get("train/reward_mean")
        if tm.get("train/optimizer") == "filtered":  # its steps are fine-tuning steps on what its samples kept
            kept = tm.get("train/kept", 0)
            return (f"[stage {stage}] trained: reward-filtered fine-tuning, {tm.get('train/steps', 0)} steps, kept "
                    f"{kept} of {tm.get('train/completions', 0)} sampled answers"
                    + ("" if kept else ": no step taken, the checkpoint is the stage's start, unchanged"))
        return f"[stage {stage}] trained" + (f": mean reward {r:.3f}" if isinstance(r, (int, float)) else "")
    if node == "final_evaluate":
        fm = update.get("final_metrics") or {}
        v = fm.get("final/valid_rate")
        return "[final] benchmark evaluated" + (f": valid {100 * v:.1f}%" if isinstance(v, (int, float)) else "")
    if node == "report":  # a stage file that cannot be read is named, never dropped in silence
        bad = [line for line in update.get("log") or [] if str(line).startswith("WARNING")]
        return "[report] written" + "".join(f"\n[report] {line}" for line in bad)
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


def unheard_warning(node: str, state: dict[str, Any], settings: Settings) -> str | None:
    """At the report, a visible line when a model engineer never produced a usable proposal (every stage it
    proposed for kept the config before), or some stages' proposals were all unusable; report.md says the same."""
    if node != "report" or settings.is_classic_engineer:
        return None
    decided = [(e.get("stage"), e.get("decision")) for e in state.get("history") or [] if e.get("decision")]
    kept = [k for k, d in decided if d == "kept_previous"]
    if not kept:
        return None
    if len(kept) == len(decided):
        return (f"[warn] the {settings.engineer} engineer never produced a usable proposal: every stage kept the config "
                "before it, so this run trained as ENGINEER=fixed would; see validation.json in each stage folder")
    return (f"[warn] the {settings.engineer} engineer's proposals for stage(s) {', '.join(str(k + 1) for k in kept)} were "
            "all unusable: those stages kept the config before them (report.md)")


class Progress:
    """The progress lines of one streamed run, fed with `graph.stream(..., stream_mode=["tasks", "updates"])`
    chunks: a task's input starts a node (its start line), the node's returned update ends it (its result
    line with how long it took, and the zero-variance warning)."""

    def __init__(self, settings: Settings, state: dict[str, Any]) -> None:
        self.settings = settings
        self.state = dict(state)  # the loop's state as the nodes' updates build it
        self.t_start = time.monotonic()
        self.started: dict[str, float] = {}

    def show(self, mode: str, chunk: dict[str, Any]) -> None:
        if mode == "tasks":
            if "input" in chunk:  # a task starts (its end comes as an update)
                self.started[chunk["name"]] = time.monotonic()
                NOW.update(node=chunk["name"], stage=(chunk["input"] or {}).get("stage"))
                line = describe_start(chunk["name"], chunk["input"] or {}, self.settings)
                if line:
                    say(line)
            return
        for node, update in chunk.items():
            if node.startswith("__"):
                continue
            if isinstance(update, dict):
                self.state.update(update)
            line = describe_update(node, update or {}, self.state, self.settings)
            now = time.monotonic()
            if line:
                took = now - self.started.get(node, now)
                say(f"{line}  [{node} {took:.0f}s, run {(now - self.t_start) / 60:.1f} min]")
            warning = zero_variance_warning(node, update, self.state)
            if warning:
                say(warning)
            warning = unheard_warning(node, self.state, self.settings)
            if warning:
                say(warning)
