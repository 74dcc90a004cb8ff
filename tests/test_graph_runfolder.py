"""A run never loses finished work, fast: `python -m graph.run`'s main() in-process with the
slow nodes stubbed (train_stage writes a small real checkpoint folder, evaluate writes eval.jsonl and
metrics.json); apply, propose_config (the fixed engineer), validate_config and summarize_failures are real.

- identity: a copied, a symlinked and a `.` run folder resume where they stopped, reading their own files and
  deleting only their own older weights (keep_checkpoints=last), also after such a deletion;
- lost state: a missing, empty or garbage graph.sqlite with finished stages is refused in one line, never
  retrained; garbage with nothing finished says how to start over;
- one process per folder: a second process is refused with the PID of the first; the lock goes with it;
- signals: the first SIGTERM stops at the next step (the stop flag), the state stays resumable; a node does
  not start after it;
- one line, not a traceback: deleted or damaged checkpoint (with the resume command), non-UTF-8 eval.jsonl,
  read-only model cache (also in --dry-run), ignored environment variables announced on resume.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

import graph.graph as gg
from graph import run as gr
from graph.runfolder import RunLock, checkpoint_problem, relative_to_run, resolve_in_run
from tests.support.graph_stubs import SET, Stubs
from tests.support.run_folder import files
from trainer import stop

ROOT = Path(__file__).resolve().parents[1]


def new_run(run_dir: Path, *extra: str) -> int:
    return gr.main(["--run-dir", str(run_dir), "--stages", "2", *SET, *extra])


def crashed_run(tmp_path: Path, stubs: Stubs) -> Path:
    """A run whose stage 0 finished and whose stage-1 training crashed."""
    run_dir = tmp_path / "run"
    stubs.crash_train_at = 1
    assert new_run(run_dir) == 1
    stubs.crash_train_at = None
    assert stubs.trained() == [0, 1]
    stubs.calls.clear()
    return run_dir


# ----------------------------------------------------------------------------- identity


def resume_moved(run_dir: Path, tmp_path: Path, how: str, monkeypatch, capsys) -> tuple[Path, str]:
    """Copy `run_dir` elsewhere under another name, reach it as `how` (copy, symlink to the copy, or `.` from
    inside it), resume it with graph.run; (the folder as passed, graph.run's stderr)."""
    moved = tmp_path / "elsewhere" / "renamed"
    moved.parent.mkdir()
    shutil.copytree(run_dir, moved, symlinks=True)
    if how == "symlink":
        target, moved = moved, tmp_path / "link"
        moved.symlink_to(target)
    arg = str(moved)
    if how == "dot":
        monkeypatch.chdir(moved)
        arg = "."
    capsys.readouterr()
    assert gr.main(["--resume", arg]) == 0, capsys.readouterr().err
    return moved, capsys.readouterr().err


@pytest.mark.parametrize("how", ["copy", "symlink", "dot"])
def test_copied_symlinked_and_dot_run_folders_resume_where_they_stopped(tmp_path, stubs, monkeypatch, capsys, how):
    """The thread id is settings.json's run_id and the state's paths are relative: each form of the folder
    continues at stage 1's training, from its own stage_1/train.jsonl, and stage 0 is not redone."""
    run_dir = crashed_run(tmp_path, stubs)
    settings = json.loads((run_dir / "settings.json").read_text())
    assert settings["run_id"] == "run"
    before = files(run_dir / "stage_0")
    moved, err = resume_moved(run_dir, tmp_path, how, monkeypatch, capsys)
    assert "no checkpoint yet" not in err and "continuing at stage 1, node train_stage" in err, err
    assert stubs.trained() == [1]  # stage 0 not retrained
    train = [c for c in stubs.calls if c[0] == "train_stage"][0]
    assert Path(train[3]).resolve() == (moved / "stage_1" / "train.jsonl").resolve()  # its own file, not the original's
    # stage 0 is not rewritten; the smoke preset keeps only the last checkpoint, so once stage 1's is saved the
    # resumed folder deletes its own stage-0 weights (pruned.json names them), never the original's
    after = files(moved / "stage_0")
    pruned = json.loads(after.pop("pruned.json"))["deleted"]
    assert pruned == ["model.safetensors"]
    assert after == {f: b for f, b in before.items() if f not in {f"checkpoint/{w}" for w in pruned}}
    assert files(run_dir / "stage_0") == before
    assert (moved / "report.md").is_file() and not (run_dir / "report.md").exists()  # the original is untouched


@pytest.mark.parametrize("how", ["copy", "symlink", "dot"])
def test_a_copied_folder_whose_older_weights_were_pruned_resumes_from_its_own_last_checkpoint(
        tmp_path, stubs, monkeypatch, capsys, how):
    """keep_checkpoints=last (the smoke preset's): stage 0's weights were deleted when stage 1 was evaluated, then
    stage 2's training crashed. The copy resumes at stage 2 from its own stage-1 checkpoint (the resume check
    finds it intact), and prunes its own stage 1 once stage 2's is saved; the original keeps its files."""
    run_dir = tmp_path / "run"
    stubs.crash_train_at = 2
    assert gr.main(["--run-dir", str(run_dir), "--stages", "3", *SET]) == 1
    stubs.crash_train_at = None
    assert stubs.trained() == [0, 1, 2]
    stubs.calls.clear()
    assert (run_dir / "stage_0" / "pruned.json").is_file()
    assert not (run_dir / "stage_0" / "checkpoint" / "model.safetensors").exists()
    original = {k: files(run_dir / f"stage_{k}") for k in range(3)}
    moved, err = resume_moved(run_dir, tmp_path, how, monkeypatch, capsys)
    assert "continuing at stage 2, node train_stage" in err
    assert stubs.trained() == [2]
    evaluated = [c for c in stubs.calls if c[0] == "evaluate"]
    assert [Path(c[3]).resolve() for c in evaluated] == [(moved / "stage_2" / "checkpoint").resolve()]
    assert files(moved / "stage_0") == original[0]  # pruned before the copy: nothing more to delete
    assert json.loads((moved / "stage_1" / "pruned.json").read_text())["deleted"] == ["model.safetensors"]
    assert (moved / "stage_2" / "checkpoint" / "model.safetensors").is_file()
    assert {k: files(run_dir / f"stage_{k}") for k in range(3)} == original
    assert (run_dir / "stage_1" / "checkpoint" / "model.safetensors").is_file()


def test_state_paths_are_stored_relative_and_old_absolute_paths_move_with_the_folder(tmp_path):
    run = tmp_path / "run"
    (run / "stage_0" / "checkpoint").mkdir(parents=True)
    assert relative_to_run(str(run / "stage_0" / "checkpoint"), run) == "stage_0/checkpoint"
    assert relative_to_run("/elsewhere/model", run) == "/elsewhere/model"
    assert resolve_in_run("stage_0/checkpoint", run) == str(run / "stage_0" / "checkpoint")
    # an old state (absolute paths) in a copied folder reads the copy's files, not the original's
    assert resolve_in_run("/old/place/run/stage_0/checkpoint", run) == str(run / "stage_0" / "checkpoint")
    assert resolve_in_run("/old/place/run/stage_7/checkpoint", run) == "/old/place/run/stage_7/checkpoint"


# ----------------------------------------------------------------------------- lost state


@pytest.mark.parametrize("damage", ["missing", "empty", "garbage", "truncated"])
def test_lost_or_damaged_graph_sqlite_with_finished_stages_is_refused_not_retrained(tmp_path, stubs, capsys, damage):
    run_dir = crashed_run(tmp_path, stubs)
    db = run_dir / "graph.sqlite"
    if damage == "missing":
        db.unlink()
    elif damage == "empty":
        db.write_bytes(b"")
    elif damage == "garbage":
        db.write_bytes(os.urandom(8192))
    else:
        data = db.read_bytes()
        db.write_bytes(data[: len(data) // 3])
    before = files(run_dir / "stage_0")
    capsys.readouterr()
    assert gr.main(["--resume", str(run_dir)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().count("\n") == 0, err
    assert "graph.sqlite" in err and "stage_0" in err and "finished work" in err, err
    assert stubs.calls == [] and files(run_dir / "stage_0") == before


def test_garbage_graph_sqlite_before_any_finished_stage_says_how_to_start_over(tmp_path, stubs, capsys):
    run_dir = tmp_path / "run"
    assert new_run(run_dir, "--dry-run") == 0
    (run_dir / "graph.sqlite").write_bytes(b"not a database at all" * 100)
    capsys.readouterr()
    assert gr.main(["--resume", str(run_dir)]) == 1
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and "\n" not in err
    assert "mv " in err and "--resume" in err, err


def test_a_renamed_folder_of_an_old_run_without_run_id_finds_its_thread(tmp_path, stubs, capsys):
    """Runs from before run_id: the one thread in graph.sqlite is the run's, whatever the folder is called."""
    run_dir = crashed_run(tmp_path, stubs)
    settings = json.loads((run_dir / "settings.json").read_text())
    del settings["run_id"]
    (run_dir / "settings.json").write_text(json.dumps(settings))
    renamed = run_dir.rename(tmp_path / "renamed")
    assert gr.main(["--resume", str(renamed)]) == 0, capsys.readouterr().err
    assert stubs.trained() == [1]


# ----------------------------------------------------------------------------- one process per folder


def test_a_second_process_is_refused_while_the_first_holds_the_folder(tmp_path, stubs, capsys):
    run_dir = crashed_run(tmp_path, stubs)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from graph.runfolder import RunLock; "
         "RunLock(Path(sys.argv[1])).acquire(); print('locked', flush=True); time.sleep(120)", str(run_dir)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        capsys.readouterr()
        assert gr.main(["--resume", str(run_dir)]) == 1
        err = capsys.readouterr().err.strip()
        assert f"process {holder.pid}" in err and "\n" not in err and "Traceback" not in err, err
        assert stubs.calls == []
    finally:
        holder.kill()
        holder.wait()
    assert gr.main(["--resume", str(run_dir)]) == 0  # the kernel released the lock of the killed holder
    assert stubs.trained() == [1]


def test_run_lock_names_the_holder(tmp_path):
    lock = RunLock(tmp_path).acquire()
    try:
        with pytest.raises(gr.RunFolderError, match=f"process {os.getpid()}"):
            RunLock(tmp_path).acquire()
    finally:
        lock.release()
    RunLock(tmp_path).acquire().release()


# ----------------------------------------------------------------------------- signals


def test_first_sigterm_stops_at_the_step_boundary_and_the_run_resumes(tmp_path, stubs, capsys):
    """A SIGTERM inside train_stage sets the stop flag (no KeyboardInterrupt); the stubbed trainer stops at
    its next step and raises StageInterrupted, as the real trainers do through StopCallback; exit 130 with
    the resume command; stage 1 is trained again on resume, stage 0 never."""
    steps: list[int] = []

    def train_with_steps(k):
        if k != 1:
            return
        for step in range(1000):
            if stop.stop_requested():
                raise stop.StageInterrupted(f"stopped at step {step}")
            steps.append(step)
            if step == 2:
                os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.001)

    stubs.on_train = train_with_steps
    run_dir = tmp_path / "run"
    assert new_run(run_dir) == gr.EXIT_INTERRUPTED
    err = capsys.readouterr().err
    assert max(steps) <= 3, steps  # within one step of the signal
    assert "SIGTERM" in err and f"--resume {run_dir}" in err and "Traceback" not in err, err
    assert not (run_dir / "report.md").exists()
    stubs.on_train = None
    stubs.calls.clear()
    assert gr.main(["--resume", str(run_dir)]) == 0
    assert stubs.trained() == [1]


def test_no_node_starts_after_a_stop_was_requested(tmp_path, stubs, capsys):
    def ask_stop(k):
        if k == 0:
            stop.request_stop("SIGINT")

    stubs.on_train = ask_stop
    run_dir = tmp_path / "run"
    assert new_run(run_dir) == gr.EXIT_INTERRUPTED
    assert [c[0] for c in stubs.calls] == ["train_stage"]  # train_stage finished; evaluate never started
    stubs.on_train = None
    stubs.calls.clear()
    assert gr.main(["--resume", str(run_dir)]) == 0
    assert [c[0] for c in stubs.calls][:1] == ["evaluate"] and stubs.trained() == [1]


def test_stop_callback_stops_a_real_trainer_within_one_step(tmp_path):
    """StopCallback in a transformers Trainer: a stop requested during step 3 ends training after it."""
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Linear(2, 1)

        def forward(self, x, labels=None):
            loss = ((self.w(x).squeeze(-1) - labels) ** 2).mean()
            return {"loss": loss}

    class AskStop(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            if state.global_step == 3:
                stop.request_stop("SIGTERM")

    data = [{"x": torch.ones(2), "labels": torch.tensor(1.0)} for _ in range(64)]
    args = TrainingArguments(str(tmp_path / "out"), max_steps=50, per_device_train_batch_size=1, report_to=[],
                             save_strategy="no", logging_strategy="no", use_cpu=True, disable_tqdm=True)
    trainer = Trainer(model=Tiny(), args=args, train_dataset=data, callbacks=[AskStop(), stop.StopCallback()])
    stop.reset()
    try:
        trainer.train()
    finally:
        stop.reset()
    assert trainer.state.global_step == 4


# ----------------------------------------------------------------------------- one line, not a traceback


@pytest.mark.parametrize("damage", ["deleted", "truncated"])
def test_deleted_or_damaged_checkpoint_is_one_line_with_the_resume_command(tmp_path, stubs, capsys, damage):
    run_dir = tmp_path / "run"
    stubs.on_train = lambda k: stop.request_stop("SIGINT") if k == 0 else None
    assert new_run(run_dir) == gr.EXIT_INTERRUPTED  # stopped after stage 0's training: evaluate loads it next
    stubs.on_train = None
    stubs.calls.clear()
    ckpt = run_dir / "stage_0" / "checkpoint"
    if damage == "deleted":
        shutil.rmtree(ckpt)
    else:
        w = ckpt / "model.safetensors"
        w.write_bytes(w.read_bytes()[:20])
    assert checkpoint_problem(ckpt)
    capsys.readouterr()
    assert gr.main(["--resume", str(run_dir)]) == 1
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and "\n" not in err, err
    assert "stage_0/checkpoint" in err and f"--resume {run_dir}" in err, err
    assert stubs.calls == []


def test_binary_eval_jsonl_is_one_line(tmp_path, stubs, capsys):
    run_dir = tmp_path / "run"

    def stop_after_evaluate(state, runtime):
        out = Stubs.evaluate(stubs, state, runtime)
        stop.request_stop("SIGINT")
        return out

    gg_evaluate = gg.evaluate
    gg.evaluate = stop_after_evaluate
    try:
        assert new_run(run_dir) == gr.EXIT_INTERRUPTED
    finally:
        gg.evaluate = gg_evaluate
    (run_dir / "stage_0" / "eval.jsonl").write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe" * 50)
    capsys.readouterr()
    assert gr.main(["--resume", str(run_dir)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "eval.jsonl" in err and "--resume" in err, err


def test_unexpected_node_error_is_one_line_with_the_traceback_in_a_file(tmp_path, stubs, capsys):
    run_dir = tmp_path / "run"
    stubs.crash_train_at = 0
    assert new_run(run_dir) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "error: train_stage of stage 0: RuntimeError: simulated crash while training" in err, err
    assert f"--resume {run_dir}" in err
    assert "Traceback" in (run_dir / "logs" / "error.log").read_text()


def test_unwritable_model_cache_is_found_by_dry_run_and_at_start(tmp_path, stubs, monkeypatch, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("ENV_ENGINEER_CACHE", str(blocker / "cache"))  # cannot be created: its parent is a file
    for extra in (["--dry-run"], []):
        run_dir = tmp_path / f"run{len(extra)}"
        assert new_run(run_dir, *extra) == gr.EXIT_BAD_SETTINGS
        err = capsys.readouterr().err.strip()
        assert "model cache" in err and "ENV_ENGINEER_CACHE" in err and "\n" not in err, err
        assert not run_dir.exists() and stubs.calls == []


def test_resume_announces_ignored_environment_variables(tmp_path, stubs, monkeypatch, capsys):
    run_dir = tmp_path / "run"
    assert new_run(run_dir, "--dry-run") == 0
    monkeypatch.setenv("STAGES", "9")
    monkeypatch.setenv("TRAIN__LEARNING_RATE", "0.5")
    monkeypatch.setenv("PRESET", "smoke")  # the run's own value: nothing to announce
    capsys.readouterr()
    assert gr.main(["--resume", str(run_dir), "--seed", "3", "--dry-run"]) == 0
    line = next(ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("[resume] ignoring"))
    assert "seed" in line and "STAGES (environment)" in line and "TRAIN__LEARNING_RATE (environment)" in line
    assert "PRESET" not in line


def test_new_runs_record_their_identity_and_refuse_choosing_it(tmp_path, stubs, capsys):
    run_dir = tmp_path / "run"
    assert new_run(run_dir, "--dry-run") == 0
    assert json.loads((run_dir / "settings.json").read_text())["run_id"] == "run"
    assert new_run(tmp_path / "other", "--dry-run", "--set", "run_id=x") == gr.EXIT_BAD_SETTINGS
    assert "run_id is set by the run itself" in capsys.readouterr().err


def test_threads_of_a_run_are_read_without_creating_the_database(tmp_path):
    from graph.runfolder import database_problem, threads

    assert threads(tmp_path) == [] and database_problem(tmp_path) == "missing"
    assert not (tmp_path / "graph.sqlite").exists()
    sqlite3.connect(tmp_path / "graph.sqlite").close()
    assert database_problem(tmp_path) == "empty (0 bytes)"
