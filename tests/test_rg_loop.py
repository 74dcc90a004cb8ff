"""Resume, `--approve` and TensorBoard on a reasoning-gym task (`--task rg:...`), through the real CLI.

One loop run on the embedded model (the smoke preset, 2 stages, 2 levels of basic_arithmetic, the learnability
curriculum as engineer), shared by the tests below: it is killed (SIGKILL) while it waits at the `--approve`
prompt after stage 0, then `--resume` continues it; at the prompt asked again, a person edits the rg proposal
(its level shares) in $EDITOR, and stage 1 trains on the edit. The loop's TensorBoard run (run_dir/tb), written
by both processes, holds the per-level rates of every evaluation."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from graph.approve import APPROVE_PROMPT
from tests.support.run_folder import snapshot, train_stage_runs

ROOT = Path(__file__).resolve().parent.parent
TASK = "rg:basic_arithmetic:num_terms=2,num_digits=1-2"  # 2 levels: "num_terms=2 num_digits=1" and "... =2"
EDITED = {"levels": {"0": 0.25, "1": 0.75}}  # the person's config for stage 1

pytestmark = pytest.mark.slow


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k not in ("VISUAL", "APPROVE")}
    editor = tmp / "editor.sh"  # the person: keeps the prefilled file, then writes EDITED over it
    editor.write_text(f"#!/bin/sh\ncp \"$1\" {tmp / 'prefilled.json'}\ncp {tmp / 'edited.json'} \"$1\"\n")
    editor.chmod(0o755)
    (tmp / "edited.json").write_text(json.dumps(EDITED))
    env.update({"PRESET": "smoke", "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "EDITOR": str(editor)})
    return env


@pytest.fixture(scope="module")
def rg_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rg_loop")
    run, env = tmp / "run", _env(tmp)
    cmd = [sys.executable, "-m", "graph.run", "--task", TASK, "--engineer", "learnability", "--run-dir", str(run),
           "--eval-limit", "4", "--final-limit", "4", "--approve"]
    first = tmp / "first.log"
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=first.open("w"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        end = time.monotonic() + 900
        while APPROVE_PROMPT not in first.read_text():  # stage 0 is done; the run waits for a person
            assert proc.poll() is None, f"the run exited ({proc.returncode}) before the prompt:\n{first.read_text()[-3000:]}"
            assert time.monotonic() < end, "timed out waiting for the --approve prompt"
            time.sleep(0.5)
        stage0 = snapshot(run / "stage_0")
        stage1_before = (run / "stage_1").exists()
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    resumed = subprocess.run([sys.executable, "-m", "graph.run", "--resume", str(run)], cwd=ROOT, env=env,
                             input="e\n", capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return SimpleNamespace(tmp=tmp, run=run, first=first.read_text(), err=resumed.stderr, stage0=stage0,
                           stage1_before=stage1_before)


def test_a_run_killed_after_stage_0_resumes_without_training_stage_0_again(rg_run):
    run = rg_run.run
    assert "[stage 0] trained" in rg_run.first and not rg_run.stage1_before  # killed between the stages
    assert f"[resume] {run}: continuing at stage 0, node apply" in rg_run.err
    assert "[stage 0] trained" not in rg_run.err and "[stage 1] trained" in rg_run.err, rg_run.err[-2000:]
    assert train_stage_runs(run) == [0, 1]  # stage 0's train_stage finished once, in the first process
    # stage 0's files are as the first process left them (bytes and mtimes), but for the person's decision
    # appended to validation.json and, the smoke preset keeping only the last checkpoint, stage 0's weights
    after = snapshot(run / "stage_0")
    changed = {f for f in rg_run.stage0 if rg_run.stage0[f] != after.get(f)}
    pruned = json.loads((run / "stage_0" / "pruned.json").read_text())["deleted"]
    assert pruned and changed == {"validation.json"} | {f"checkpoint/{f}" for f in pruned}, (changed, pruned)
    assert all(f"checkpoint/{f}" not in after for f in pruned)
    assert (run / "stage_1" / "checkpoint" / "model.safetensors").is_file()  # the last one is kept
    assert json.loads((run / "final" / "metrics.json").read_text())["final/n"] > 0 and (run / "report.md").is_file()


def test_approve_shows_the_rg_levels_and_stage_1_trains_on_the_persons_edit(rg_run):
    run, err = rg_run.run, rg_run.err
    validation = json.loads((run / "stage_0" / "validation.json").read_text())
    engineer, person = validation["decisions"][0], validation["decisions"][-1]
    proposed = {str(k): v for k, v in engineer["accepted"]["levels"].items()}
    current = json.loads((run / "stage_0" / "config.json").read_text())["levels"]
    # the prompt shows the proposal level by level, stage 0's share -> the proposed one
    assert err.count(APPROVE_PROMPT) == 1 and "Proposed config for stage 1" in err
    table = err.split("Proposed config for stage 1", 1)[1].split(APPROVE_PROMPT, 1)[0]
    assert table.splitlines()[1].split() == ["level", "share", "what"]
    for lv, label in (("0", "num_terms=2 num_digits=1"), ("1", "num_terms=2 num_digits=2")):
        row = next(ln for ln in table.splitlines() if ln.split()[:1] == [lv])
        a, b = current.get(lv, 0.0), proposed.get(lv, 0.0)  # a level a config leaves out has share 0
        assert (f"{a:.3f}  =" if abs(a - b) <= 1e-9 else f"{a:.3f} -> {b:.3f}") in row and row.endswith(
            label + (" *" if abs(a - b) > 1e-9 else "")), row
    assert "rationale: learnability" in err
    # $EDITOR opened on the rg proposal; the person's levels went through the task's own check
    assert json.loads((rg_run.tmp / "prefilled.json").read_text()) == {"levels": proposed}
    assert "[approve] applying the edited config to stage 1 (accepted by validation)" in err
    assert person["by"] == "person" and person["decision"] == "edited (person)" == validation["final"]
    assert person["accepted"]["levels"] == EDITED["levels"]
    assert person["diff"] == {lv: {"share": {"from": current.get(lv, 0.0), "to": to}}  # against stage 0's config
                              for lv, to in EDITED["levels"].items() if abs(current.get(lv, 0.0) - to) > 1e-9}
    stage1 = json.loads((run / "stage_1" / "config.json").read_text())
    assert stage1["levels"] == EDITED["levels"]
    rows = [json.loads(x) for x in (run / "stage_1" / "train.jsonl").read_text().splitlines()]
    assert Counter(r["level"] for r in rows) == {0: len(rows) // 4, 1: 3 * len(rows) // 4}, Counter(r["level"] for r in rows)


def scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return {t: [(e.step, round(e.value, 6)) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


def test_tensorboard_holds_per_level_rg_metrics_from_both_processes(rg_run):
    from graph.tracking import stage_offset

    run = rg_run.run
    tags = scalars(run / "tb")
    ends = [stage_offset(run, k + 1) for k in (0, 1)]  # each stage's last global step
    assert ends[0] >= 1 and ends[1] > ends[0]
    for k in (0, 1):
        m = json.loads((run / f"stage_{k}" / "metrics.json").read_text())
        for lv in ("0", "1"):  # the level is in `size`, the column every table reads
            tag = f"eval/valid_rate/level_{lv}"
            assert tags[tag][k] == (ends[k], round(m[tag], 6)), (tag, tags[tag])
    start = json.loads((run / "stage_0" / "start" / "metrics.json").read_text())  # the warm start's evaluation
    for lv in ("0", "1"):  # one point per stage: the resumed process did not log stage 0 again
        assert [s for s, _ in tags[f"eval/valid_rate/level_{lv}"]] == ends
        assert tags[f"start/eval/valid_rate/level_{lv}"] == [(ends[0], round(start[f"eval/valid_rate/level_{lv}"], 6))]
        assert [s for s, _ in tags[f"by_stage/eval/valid_rate/level_{lv}"]] == [-1, 0, 1]  # -1: the warm start
        assert f"final/valid_rate/level_{lv}" in tags
    assert {"eval/failure/wrong", "eval/failure/no_answer", "eval/failure/partial"} <= set(tags)  # rg's labels
    assert [s for s, _ in tags["eval/valid_rate"]] == ends and tags["final/valid_rate"][0][0] == ends[1]
    assert any(t.startswith("train/") for t in tags)
    # one events file per process (the first one killed), and each event logged once
    assert len(list((run / "tb").glob("events.out.tfevents.*"))) == 2
    assert json.loads((run / "tb" / "logged.json").read_text())["logged"] == [
        "config:0", "config:1", "eval:0", "eval:1", "final", "train:0", "train:1"]
