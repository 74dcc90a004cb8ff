"""`python -m graph.run` end to end in a subprocess, with the real embedded model: a crash (SIGKILL) and a
Ctrl-C (SIGINT, with the vLLM policy server up) in the middle of stage 1, each resumed, and --approve.

The SIGKILL and approve runs take their stage 0 from the session's smoke grid (conftest ``smoke_grid``,
`--stage0-from`): what they test happens after stage 0. SIGINT is sent to the cpu-preset run, which trains its
own stage 0 and answers on vLLM. SIGKILL and approve use the grid's shrink overrides
(tests/support/smoke_grid.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.support.run_folder import snapshot, train_stage_runs
from tests.support.smoke_grid import set_args

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def start_run(args: list[str], env_extra: dict[str, str], log: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env.update({"PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", **env_extra})
    return subprocess.Popen([sys.executable, "-m", "graph.run", *args], cwd=ROOT, env=env,
                            stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)


def wait_for(pred, proc: subprocess.Popen, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        if proc.poll() is not None:
            raise AssertionError(f"run exited ({proc.returncode}) before {what}")
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def check_finished_run(run_dir: Path, stages: int) -> None:
    for k in range(stages):
        d = run_dir / f"stage_{k}"
        for name in ("config.json", "train.jsonl", "env_stats.json", "eval.jsonl", "metrics.json"):
            assert (d / name).is_file(), f"{d / name} missing"
        assert any((d / "checkpoint").iterdir())
        if k < stages - 1:  # the engineer designed stage k+1 from stage k's evidence
            for name in ("summary.md", "engineer_prompt.md", "engineer_reply.md", "validation.json"):
                assert (d / name).is_file(), f"{d / name} missing"
    assert (run_dir / "final" / "metrics.json").is_file()
    report = (run_dir / "report.md").read_text()
    # The report matches the per-stage metrics it was written from.
    for k in range(stages):
        m = json.loads((run_dir / f"stage_{k}" / "metrics.json").read_text())
        assert "train/reward_mean" in m and "train/zero_std_groups" in m, sorted(m)  # train and eval figures
        assert f"| {k} | {100 * m['eval/valid_rate']:.1f} | {100 * m['eval/optimal_rate']:.1f} |" in report
        assert f"| {k} | {m['train/steps']} | {m['train/seconds_per_step']:.1f} | {m['train/reward_mean']:.3f} |" in report
    final = json.loads((run_dir / "final" / "metrics.json").read_text())
    assert f"{final['final/n']} instances" in report
    assert (run_dir / "rates.png").is_file() and (run_dir / "allocation.png").is_file()


def stat_snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Size and modification time of every file below `folder`: a write (through a hard link too) changes them."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_sigkill_in_stage_1_then_resume(tmp_path, smoke_grid):
    """The random engineer designs stage 1 from the grid's shared stage 0 (seed 1); a SIGKILL while stage 1
    trains, then --resume: stage 1 is redone, stage 0 (linked) is never written. (The self engineer on vLLM through
    a stop and a resume: the cpu-preset test below.)"""
    run_dir, donor = tmp_path / "run", smoke_grid[0] / "runs" / "fixed-s1"
    env = {"PRESET": "smoke", "ENGINEER": "random", "SEED": "1"}
    args = ["--run-dir", str(run_dir), "--stage0-from", str(donor), *set_args()]
    donor_before = stat_snapshot(donor / "stage_0")
    proc = start_run(args, env, tmp_path / "first.log")
    try:
        # stage_1/train.jsonl appears when apply has built stage 1: training of stage 1 is next.
        wait_for(lambda: (run_dir / "stage_1" / "train.jsonl").is_file(), proc, 900, "stage 1 to start")
        time.sleep(1)  # stage 1 loads, builds its trainer and trains one step: several seconds at least
        before = snapshot(run_dir / "stage_0")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert not (run_dir / "report.md").exists()
    resumed = start_run(["--resume", str(run_dir)], {}, tmp_path / "resume.log")
    assert resumed.wait(900) == 0, (tmp_path / "resume.log").read_text()[-3000:]
    log = (tmp_path / "resume.log").read_text()
    assert "[resume]" in log
    assert "[stage 1] trained" in log and "[stage 0] trained" not in log, log[-2000:]
    check_finished_run(run_dir, stages=2)
    after = snapshot(run_dir / "stage_0")
    changed = [f for f in before if before[f] != after.get(f)]
    # the smoke preset keeps only the last checkpoint: once stage 1's is saved, the fork's links to stage 0's
    # weights are deleted (pruned.json names them); nothing of stage 0 is written
    pruned = json.loads((run_dir / "stage_0" / "pruned.json").read_text())["deleted"]
    assert pruned and sorted(changed) == sorted(f"checkpoint/{f}" for f in pruned), (changed, pruned)
    assert not [f for f in changed if f in after], f"stage 0 files changed on resume: {changed}"
    assert train_stage_runs(run_dir) == [0, 1]  # the donor's stage 0 (marked shared) and stage 1, once each
    first = (tmp_path / "first.log").read_text()
    assert "stage 0 shared from" in first
    assert 0 <= first.find("[smoke] this preset checks the plumbing") < first.find("[run]"), first[:600]
    assert stat_snapshot(donor / "stage_0") == donor_before  # nothing wrote through the links into the donor


def test_approve_lets_a_person_replace_the_proposal(tmp_path, smoke_grid):
    """--approve pauses before apply; an edited config given on stdin is what stage 1 trains on. Stage 0 is
    the grid's (seed 0), so the one question is the stage 0 -> 1 proposal."""
    from env import SIZES

    edited = {"sizes": {str(n): {"data_ratio": 1.0 if n == 3 else 0.0, "hole_ratio": 0.1, "wait_ratio": 0.5}
                        for n in SIZES}}
    (tmp_path / "edited.json").write_text(json.dumps(edited))
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env.update({"PYTHONPATH": str(ROOT), "PRESET": "smoke", "ENGINEER": "fixed"})
    args = ["--run-dir", str(run_dir), "--approve", "--stage0-from", str(smoke_grid[0] / "runs" / "fixed-s0"),
            *set_args()]
    editor = tmp_path / "editor.sh"  # the person's edit: the prefilled file replaced by edited.json
    editor.write_text(f"#!/bin/sh\ncp {tmp_path / 'edited.json'} \"$1\"\n")
    editor.chmod(0o755)
    env.update({"EDITOR": str(editor)})
    env.pop("VISUAL", None)
    proc = subprocess.run([sys.executable, "-m", "graph.run", *args], cwd=ROOT, env=env, timeout=900,
                          input="e\n", capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("[e] edit it in $EDITOR") == 1  # asked once, for the one proposal (stage 0 -> 1)
    stage1 = json.loads((run_dir / "stage_1" / "config.json").read_text())
    assert {n: stage1["sizes"][str(n)]["data_ratio"] for n in SIZES} == {n: float(n == 3) for n in SIZES}
    rows = [json.loads(line) for line in (run_dir / "stage_1" / "train.jsonl").read_text().splitlines()]
    assert rows and {r["size"] for r in rows} == {3}


def test_cpu_preset_end_to_end_through_the_stage_child_with_a_ctrl_c_in_stage_1(tmp_path, embedded_model_path):
    """The cpu preset (compact prompt, cached SFT warm start, dynamic sampling, vLLM evaluation and
    self-engineer) runs end to end with every stage trained in its own child process, shrunk in
    size only: 2 stages, 1 GRPO step each of one group of 4 completions of at most 48 tokens with one round of
    dynamic sampling (the preset: 16, two rounds), a 2-step warm start of 2 plans a step in a cache of its own, 6
    answers of at most 32 tokens per evaluation, one engineer reply of at most 16 tokens (asked again once at 64
    when it is cut).

    On the way, a Ctrl-C in the middle of stage 1, while the kept vLLM policy server (started by stage 0's
    evaluation) is up: the process exits with 130, the server is gone, and --resume finishes without touching
    stage 0 (one loop run serves both checks)."""
    run_dir = tmp_path / "cpu-run"
    args = ["--preset", "cpu", "--run-dir", str(run_dir), "--set", "stages=2", "--set", "eval_limit=6",
            "--set", "final_limit=6", "--set", "eval_max_tokens=32", "--set", "train.max_steps=1",
            "--set", "train.max_completion_length=48", "--set", "train.num_generations=4",
            "--set", "train.per_device_train_batch_size=4", "--set", "train.resample_rounds=1",
            "--set", "train.sft_steps=2", "--set", "train.sft_batch_size=2", "--set", "train.sft_instances=4",
            "--set", "engineer_max_attempts=1", "--set", "engineer_max_tokens=16"]
    log = tmp_path / "run.log"
    (tmp_path / "cache").mkdir()  # a cache of its own, but the converted model linked in: no 50 s conversion again
    (tmp_path / "cache" / embedded_model_path.name).symlink_to(embedded_model_path)
    cache_env = {"ENV_ENGINEER_CACHE": str(tmp_path / "cache")}
    proc = start_run(args, cache_env, log)
    try:
        def vllm_children() -> list[psutil.Process]:
            try:
                kids = psutil.Process(proc.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                return []
            return [k for k in kids if "vllm" in " ".join(k.cmdline())]

        # stage_1/train.jsonl appears when apply has built stage 1: training of stage 1 is next.
        wait_for(lambda: (run_dir / "stage_1" / "train.jsonl").is_file() and bool(vllm_children()), proc, 1800,
                 "stage 1 to start with a vLLM server up")
        time.sleep(3)
        servers = vllm_children()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(120) == 130, log.read_text()[-3000:]
        gone, alive = psutil.wait_procs(servers, timeout=30)
        assert not alive, f"vLLM server still running: {[p.pid for p in alive]}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert "--resume" in log.read_text()
    assert not (run_dir / "report.md").exists()
    before = snapshot(run_dir / "stage_0")  # after the exit: a stopping server may still log into stage_0
    resumed = start_run(["--resume", str(run_dir)], cache_env, tmp_path / "resume.log")
    try:
        rc = resumed.wait(timeout=1800)
    finally:
        if resumed.poll() is None:
            os.killpg(resumed.pid, signal.SIGKILL)
    assert rc == 0, (tmp_path / "resume.log").read_text()[-3000:]
    resume_log = (tmp_path / "resume.log").read_text()
    assert "[stage 1] trained" in resume_log and "[stage 0] trained" not in resume_log, resume_log[-2000:]
    after = snapshot(run_dir / "stage_0")
    changed = [f for f in before if before[f] != after.get(f)]
    assert not changed, f"stage 0 files changed on resume: {changed}"
    assert train_stage_runs(run_dir) == [0, 1]  # stage 0 trained exactly once
    check_finished_run(run_dir, 2)
    settings = json.loads((run_dir / "settings.json").read_text())
    assert settings["preset"] == "cpu" and settings["train"]["prompt_style"] == "compact"
    for k in range(2):  # each stage was trained by a child process, from its request file
        assert (run_dir / f"stage_{k}" / "logs" / "stage_request.json").is_file()
    m0 = json.loads((run_dir / "stage_0" / "metrics.json").read_text())
    assert m0["sft/cache_hit"] is False and str(tmp_path / "cache") in m0["sft/cache_path"]
    assert m0["eval/n"] == 6
    # the cached warm start answered the same 6 first, through the run's vLLM server: the report's "start" row
    start = json.loads((run_dir / "stage_0" / "start" / "metrics.json").read_text())
    assert start["eval/n"] == 6 and start["start/cache_path"] == m0["sft/cache_path"]
    assert start["start/answers_reused"] is False and len(list((tmp_path / "cache" / "start_evals").glob("*.json"))) == 1
    assert f"| start | {100 * start['eval/valid_rate']:.1f} | " in (run_dir / "report.md").read_text()
    assert "(warm start before it: valid " in log.read_text()  # on the terminal, beside stage 0's line
    from llm_backends.vllm_server import cpu_has_bf16

    meta = json.loads((run_dir / "stage_0" / "checkpoint" / "trainer_meta.json").read_text())
    bf16_cpu = cpu_has_bf16()  # the cpu preset's auto: GRPO samples from a bf16 copy and trains under autocast on a
    # bf16 CPU; elsewhere from a float32 copy, in float32
    assert meta["rollout_dtype"] == ("bfloat16" if bf16_cpu else "float32") and meta["autocast_bf16"] is bf16_cpu
    # a float32 copy runs its linears on oneDNN-packed weights
    import torch

    assert meta["rollout_prepack"] is (not bf16_cpu and torch.backends.mkldnn.is_available())
    assert meta["trl_cpu_patches"] is True
