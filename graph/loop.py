"""Stream the loop of one run folder to its end: graph.sqlite as its checkpointer (a finished node is never
redone), progress lines (graph.progress), the --approve pause before each apply (graph.approve), and a
stop between nodes when a signal asked for it (graph.interrupt)."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

from graph.approve import ask_approval
from graph.interrupt import SIGNALS
from graph.preflight import check_state_files, refuse_lost_state
from graph.progress import Progress, RunError, say
from graph.runfolder import DB_FILE, RunFolderError, database_problem, finished_stages, thread_id
from graph.settings import RunContext, Settings
from trainer import stop


def open_graph(run_dir: Path, settings: Settings):
    """The compiled graph with run_dir/graph.sqlite as its checkpointer, and the connection to close."""
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


def share_stage0(donor, run_dir: Path, settings: Settings) -> None:
    """--stage0-from: seed this new run with the donor's finished stage 0 (graph.stage0), as if trained here."""
    from graph.stage0 import seed_from_donor

    try:
        record = seed_from_donor(donor, run_dir, settings)
    except (OSError, sqlite3.Error, RuntimeError, ValueError) as e:
        raise RunError(f"--stage0-from {str(donor.run_dir)!r}: could not share stage 0: {e}") from None
    track_shared_stage0(run_dir, settings, donor)
    say(f"[run] stage 0 shared from {donor.run_dir} (checkpoint {donor.checkpoint_id}; "
        f"{record['files']['linked']} files linked, {record['files']['copied']} copied): "
        "its apply, train_stage and evaluate are not run here")


def track_shared_stage0(run_dir: Path, settings: Settings, donor) -> None:
    """A fork's loop run (TensorBoard / W&B) starts with the donor's stage 0, as if trained here: its config,
    its per-step train/* (stage_0/tb is linked) and its evaluation (graph.tracking)."""
    from graph.tracking import track

    values = donor.values
    track("apply", {}, {"stage": 0, "config": values.get("config")}, run_dir, settings)
    track("train_stage", {"stage": 0}, {"train_metrics": values.get("train_metrics")}, run_dir, settings)
    track("evaluate", {"stage": 0}, {"metrics": values.get("metrics"), "start_metrics": values.get("start_metrics")},
          run_dir, settings)


def run_graph(run_dir: Path, settings: Settings, resume: bool) -> dict[str, Any]:
    """Stream the graph to its end (or an error) with progress lines. A new run whose thread already holds
    a state (seeded by --stage0-from) continues from it; `resume` continues where a run stopped.

    Raises `RunFolderError` (one line) when graph.sqlite is unreadable, or lost while stages have finished
    (never starting over on top of them), or when the checkpoint the run goes on from is damaged; and
    `trainer.stop.StageInterrupted` when a stop was requested (SIGINT/SIGTERM), after the last finished node's
    state was saved."""
    run_dir = Path(os.path.abspath(run_dir))
    done = finished_stages(run_dir)
    problem = database_problem(run_dir)
    if problem is not None and (done or problem not in ("missing", "empty (0 bytes)")):
        raise refuse_lost_state(run_dir, problem, done)
    thread = thread_id(run_dir, settings.run_id)
    from llm_backends.policy import set_enable_thinking

    set_enable_thinking(settings.train.enable_thinking)  # every evaluation and engineer request, as in training
    graph, conn = open_graph(run_dir, settings)
    cfg = {"configurable": {"thread_id": thread}, "recursion_limit": recursion_limit(settings)}
    ctx = RunContext(settings=settings, run_dir=run_dir)
    try:
        inputs: dict[str, Any] | None = None
        asked_for: int | None = None  # the stage whose proposal a person already answered before streaming
        snap = graph.get_state(cfg)
        if resume:
            if not snap.values:
                if done:  # the thread is empty (or another run's), but this folder holds finished stages
                    raise refuse_lost_state(run_dir, f"without a state for run {thread!r}", done)
                inputs = {}
                say(f"[resume] {run_dir}: no checkpoint yet, starting from the beginning")
            elif not snap.next:
                say(f"[resume] {run_dir}: the run already finished; see {run_dir / 'report.md'}")
                return snap.values
            else:
                check_state_files(run_dir, snap.values, tuple(snap.next), settings)
                say(f"[resume] {run_dir}: continuing at stage {snap.values.get('stage', 0)}, node {snap.next[0]}")
                decided = str(snap.values.get("decision") or "").endswith("(person)")
                if settings.approve and tuple(snap.next) == ("apply",) and snap.values.get("accepted") and not decided:
                    # died while waiting at the prompt: the interrupt is behind us, streaming would apply unasked
                    ask_approval(graph, cfg, settings, run_dir)
                    asked_for = int(snap.values.get("stage", 0))
        elif snap.values:
            say(f"[run] continuing after the shared stage 0 at node {snap.next[0] if snap.next else '-'}")
        else:
            inputs = {}
        progress = Progress(settings, graph.get_state(cfg).values or {})
        SIGNALS["interruptible"] = False  # from here a first signal stops at the next step or node
        while True:
            for mode, chunk in graph.stream(inputs, cfg, context=ctx, stream_mode=["tasks", "updates"],
                                            durability="sync"):
                progress.show(mode, chunk)
            inputs = None
            snap = graph.get_state(cfg)
            if not snap.next:
                return snap.values
            if stop.stop_requested():
                raise stop.StageInterrupted(f"stopped before {snap.next[0]}")
            if settings.approve and snap.next[0] == "apply":
                if asked_for != int(snap.values.get("stage", 0)):
                    SIGNALS["interruptible"] = True  # paused before apply, nothing in flight: a first signal
                    try:  # at the prompt stops at once, as before the graph streams
                        ask_approval(graph, cfg, settings, run_dir)
                    finally:
                        SIGNALS["interruptible"] = False
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


