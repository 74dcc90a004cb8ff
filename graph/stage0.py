"""`python -m graph.run --stage0-from DONOR_RUN_DIR`: start a new run from another run's finished stage 0.

Stage 0 (apply the seed's random config -> train_stage -> evaluate) does not depend on the engineer, so
runs that compare engineers over one seed can train it once and share it: cheaper (about 40 % of a
cpu-preset run) and a paired design (every engineer starts from the same checkpoint and the same
evidence).

- `check_donor` (before the new run folder exists) refuses, with one line (`SettingsError`), a donor that
  is not a run folder, whose graph.sqlite holds no checkpoint where stage 0's `evaluate` has finished,
  whose settings.json differs from this run's settings in any field outside `MAY_DIFFER`, or whose stage-0
  weights are gone (a donor that ran with `keep_checkpoints=last` deleted them once stage 1's were saved).
- `seed_from_donor` hard-links (else copies) the donor's stage-0 artefacts (`STAGE0_FILES`) into the new
  run, writes the donor's state at that checkpoint, with its paths moved to the new run, as the new
  thread's first checkpoint (as if this run's own `evaluate` had just finished), and records the donor in
  `stage0_from.json`. The run loop then goes on with `summarize_failures`; `--resume` works as for any run.

The donor's stage-0 `log` lines are kept (so "stage 0 trained once" still reads right in the run's
bookkeeping), each marked `[shared from donor <run>]`. Files inside the linked checkpoint (e.g.
`trainer_meta.json`'s `train_path`) still name the donor: they are the donor's bytes, kept identical.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from graph.prune import WEIGHT_PATTERNS
from graph.runfolder import RunFolderError, relative_to_run, state_paths, thread_id
from graph.settings import RunContext, Settings, SettingsError
from trainer.files import stage_dir, write_json_atomic

# Settings that may differ between a donor and a fork: they act only after stage 0's evaluation (who
# designs the next stages and from what context) or on the run's bookkeeping, never on what stage 0
# generates, trains or evaluates. Every other field (policy model and backend, seed, preset, stages, the
# train.* hyper-parameters, eval/final split, limits, max tokens, batch size) must be equal.
MAY_DIFFER = frozenset({
    # engineer side: who proposes the next config, and how it is checked
    "engineer", "engineer_model", "engineer_base_url", "engineer_max_tokens", "engineer_max_attempts",
    "engineer_api_max_tokens", "engineer_reasoning_effort",
    "engineer_temperature", "engineer_structured", "feasibility_n",
    # the context shown to the engineer (prompts/ holds only engineer templates; the policy prompt is env's)
    "context", "context_details", "evidence_examples", "evidence_chars", "prompts_dir",
    # run side: the folder, the person at the terminal, how the policy server is kept (not what it answers)
    "run_dir", "run_id", "approve", "keep_server",
    # bookkeeping and tracking: where and with what the run started, what it keeps and logs to
    "provenance", "keep_checkpoints", "train.report_to",
})

# What apply, train_stage and evaluate write into stage_0 (the SFT warm start's tb/sft and its evaluation in start/
# included). Engineer files (summary.md, engineer_prompt*.md, engineer_reply*.md, validation.json) are never shared,
# nor server logs (a kept vLLM server goes on writing stage_0/policy-vllm.log in later stages) or leftovers of a
# crash (checkpoint.tmp, sft/).
STAGE0_FILES = ("config.json", "train.jsonl", "env_stats.json", "checkpoint", "eval.jsonl", "metrics.json", "tb",
                "start", "eval_sampled.jsonl", "eval_sampled.key.json")
REQUIRED = ("config.json", "train.jsonl", "env_stats.json", "checkpoint", "eval.jsonl", "metrics.json")
AFTER_EVALUATE = ("summarize_failures",)


@dataclass(frozen=True)
class Donor:
    """A checked donor: its folder, settings, and its state where stage 0's evaluate had finished."""

    run_dir: Path
    settings: Settings
    checkpoint_id: str
    created_at: str | None
    values: dict[str, Any]
    timings: dict[str, Any]


def _flag(donor_dir: Path) -> str:
    return f"--stage0-from {str(donor_dir)!r}"


def compare_settings(mine: Settings, donor: Settings) -> tuple[str, Any, Any] | None:
    """The first field (`train.<name>` inside the training hyper-parameters) whose value differs, outside
    `MAY_DIFFER`, as (name, mine, donor); None when stage 0 can be shared."""
    a, b = mine.model_dump(mode="json"), donor.model_dump(mode="json")
    for field in Settings.model_fields:
        if field in MAY_DIFFER or a.get(field) == b.get(field):
            continue
        if isinstance(a.get(field), dict) and isinstance(b.get(field), dict):
            for sub in sorted(set(a[field]) | set(b[field])):
                if f"{field}.{sub}" in MAY_DIFFER:
                    continue
                if a[field].get(sub) != b[field].get(sub):
                    return f"{field}.{sub}", a[field].get(sub), b[field].get(sub)
            continue
        return field, a.get(field), b.get(field)
    return None


def _open(path: Path):
    from langgraph.checkpoint.sqlite import SqliteSaver

    from graph.graph import make_graph

    conn = sqlite3.connect(str(path), check_same_thread=False)
    return make_graph(checkpointer=SqliteSaver(conn)), conn


def _seconds(a: str | None, b: str | None) -> float | None:
    try:
        return round((datetime.fromisoformat(b) - datetime.fromisoformat(a)).total_seconds(), 1)
    except (TypeError, ValueError):
        return None


def check_donor(donor_dir: Path, settings: Settings) -> Donor:
    """Check that `donor_dir` can give this run its stage 0; raise `SettingsError` (one line) if not."""
    donor_dir = Path(donor_dir)
    flag = _flag(donor_dir)
    if settings.stages < 2:
        raise SettingsError(f"{flag}: this run has stages={settings.stages}; sharing stage 0 needs stages >= 2")
    if not (donor_dir / "settings.json").is_file():
        raise SettingsError(f"{flag}: no settings.json there; is it a run folder?")
    if not (donor_dir / "graph.sqlite").is_file():
        raise SettingsError(f"{flag}: no graph.sqlite there; the donor run never started its graph")
    donor_settings = Settings.load(donor_dir / "settings.json")
    diff = compare_settings(settings, donor_settings)
    if diff is not None:
        name, mine, theirs = diff
        raise SettingsError(
            f"{flag}: setting {name} differs: this run {mine!r}, donor {theirs!r}; stage 0 is shared only "
            "between runs whose settings are equal outside the engineer/context/run-folder ones"
        )
    try:
        thread = thread_id(donor_dir, donor_settings.run_id)  # the donor's own thread, wherever it lives now
        graph, conn = _open(donor_dir / "graph.sqlite")
        try:
            history = list(graph.get_state_history({"configurable": {"thread_id": thread}}))
        finally:
            conn.close()
    except (sqlite3.Error, RunFolderError) as e:
        raise SettingsError(f"{flag}: cannot read its graph.sqlite ({e})") from None
    # newest first; the last match is the checkpoint evaluate itself wrote
    found = [s for s in history if s.values.get("stage") == 0 and tuple(s.next) == AFTER_EVALUATE]
    if not found:
        where = (f"stage {history[0].values.get('stage', 0)}, next {list(history[0].next)}" if history
                 else "no checkpoint")
        raise SettingsError(f"{flag}: the donor has not finished stage 0's evaluate yet ({where}); "
                            "wait for it or choose another donor")
    snap = found[-1]
    missing = [n for n in REQUIRED if not (stage_dir(donor_dir, 0) / n).exists()]
    if missing:
        raise SettingsError(f"{flag}: its stage_0 lacks {', '.join(missing)}")
    if not stage0_weights_kept(donor_dir):
        why = ("were deleted once a later stage's checkpoint was saved (its stage_0/pruned.json: the donor ran "
               "with keep_checkpoints=last)" if (stage_dir(donor_dir, 0) / "pruned.json").is_file() else "are missing")
        raise SettingsError(f"{flag}: its stage-0 weights {why}; a fork trains stage 1 from them. Choose a donor "
                            "that kept them (a run started with --set keep_checkpoints=all), or run stage 0 in full")

    def at(stage_next: str) -> str | None:
        hits = [s.created_at for s in history if s.values.get("stage") == 0 and tuple(s.next) == (stage_next,)]
        return hits[-1] if hits else None

    first = history[-1].created_at if history else None
    after_apply, after_train = at("train_stage"), at("evaluate")
    metrics = json.loads((stage_dir(donor_dir, 0) / "metrics.json").read_text())
    timings = {  # wall-clock between the donor's checkpoints (a crash and resume in between counts too)
        "apply_s": _seconds(first, after_apply),
        "train_stage_s": _seconds(after_apply, after_train),
        "evaluate_s": _seconds(after_train, snap.created_at),
        "stage0_s": _seconds(first, snap.created_at),
        "train/seconds": metrics.get("train/seconds"),
    }
    return Donor(donor_dir, donor_settings, snap.config["configurable"]["checkpoint_id"], snap.created_at,
                 dict(snap.values), timings)


def stage0_weights_kept(run_dir: Path) -> bool:
    """Whether a run folder's stage-0 checkpoint still holds weight files (keep_checkpoints=last deletes an older
    stage's once a later one is saved): what a donor needs, for `check_donor` and an eval grid's `find_donor`."""
    ckpt = stage_dir(Path(run_dir), 0) / "checkpoint"
    return ckpt.is_dir() and any(f.is_file() for pat in WEIGHT_PATTERNS for f in ckpt.rglob(pat))


def link_tree(src: Path, dst: Path, counts: dict[str, int]) -> None:
    """Hard-link every file below `src` to the same place below `dst` (copy where linking fails)."""
    if src.is_dir():
        dst.mkdir(parents=True, exist_ok=True)
        for child in sorted(src.iterdir()):
            link_tree(child, dst / child.name, counts)
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
        counts["linked"] += 1
    except OSError:  # another file system, or links not allowed: a copy keeps the bytes too
        shutil.copy2(src, dst)
        counts["copied"] += 1


def _rebase(obj: Any, old: list[str], new: str) -> Any:
    """`obj` with every string that starts with one of the `old` folder paths moved under `new`."""
    if isinstance(obj, str):
        for p in old:
            if obj == p or obj.startswith(p + os.sep):
                return new + obj[len(p):]
        return obj
    if isinstance(obj, dict):
        return {k: _rebase(v, old, new) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_rebase(v, old, new) for v in obj]
    return obj


def forked_values(donor: Donor, run_dir: Path) -> dict[str, Any]:
    """The donor's state at its stage-0 evaluate, with paths moved to `run_dir` and its log lines marked."""
    old = {str(donor.run_dir), str(donor.run_dir.resolve())}
    if donor.settings.run_dir is not None:
        old.add(str(donor.settings.run_dir))  # the folder as the donor's nodes named it (maybe relative)
    values = {k: v for k, v in donor.values.items() if k != "log"}
    values = _rebase(values, sorted(old, key=len, reverse=True), str(run_dir))
    values = state_paths(values, run_dir, relative_to_run)  # stored relative to the fork's folder
    tag = f"[shared from donor {donor.run_dir.resolve().name}]"
    values["log"] = [f"stage 0: shared from donor {donor.run_dir} (checkpoint {donor.checkpoint_id}); "
                     "not trained or evaluated in this run"]
    values["log"] += [f"{line} {tag}" for line in donor.values.get("log") or []]
    return values


def update_as_evaluate(graph, cfg: dict[str, Any], values: dict[str, Any], ctx: RunContext):
    """`graph.update_state(cfg, values, as_node="evaluate")`, with the run context reachable.

    Why: writing "as evaluate" makes LangGraph run the routing after evaluate (route_after_evaluate), which
    reads `runtime.context`; update_state does not pass the context and fails with "Missing required config
    key 'N/A' for 'route'" (langgraph 1.2). The Runtime under the config key that stream() itself uses
    makes the routing see it. The key is private to LangGraph: tests/test_graph_stage0.py pins it.
    """
    from langgraph._internal._constants import CONFIG_KEY_RUNTIME
    from langgraph.runtime import Runtime

    cfg = {**cfg, "configurable": {**cfg["configurable"], CONFIG_KEY_RUNTIME: Runtime(context=ctx)}}
    return graph.update_state(cfg, values, as_node="evaluate")


def seed_from_donor(donor: Donor, run_dir: Path, settings: Settings) -> dict[str, Any]:
    """Link the donor's stage 0 into `run_dir` and write its state as this run's first checkpoint.

    Returns what `stage0_from.json` records. The thread id is `settings.run_id`, as in `graph.loop.run_graph`.
    """
    src, dst = stage_dir(donor.run_dir, 0), stage_dir(run_dir, 0)
    counts = {"linked": 0, "copied": 0}
    for name in STAGE0_FILES:
        if (src / name).exists():
            link_tree(src / name, dst / name, counts)
    values = forked_values(donor, Path(run_dir))
    graph, conn = _open(Path(run_dir) / "graph.sqlite")
    try:
        cfg = {"configurable": {"thread_id": settings.run_id or Path(run_dir).name}}
        update_as_evaluate(graph, cfg, values, RunContext(settings=settings, run_dir=Path(run_dir)))
        snap = graph.get_state(cfg)
    finally:
        conn.close()
    if tuple(snap.next) != AFTER_EVALUATE:  # the routing after evaluate must lead to the engineer
        raise RuntimeError(f"seeded state goes to {list(snap.next)}, expected {list(AFTER_EVALUATE)}")
    record = {
        "donor": str(donor.run_dir.resolve()),
        "donor_run_id": donor.run_dir.resolve().name,
        "donor_checkpoint_id": donor.checkpoint_id,
        "donor_checkpoint_created_at": donor.created_at,
        "donor_engineer": donor.settings.engineer,
        "donor_stage0_timings": donor.timings,
        "files": {**counts, "shared": [n for n in STAGE0_FILES if (dst / n).exists()]},
        "forked_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    write_json_atomic(Path(run_dir) / "stage0_from.json", record)
    return record
