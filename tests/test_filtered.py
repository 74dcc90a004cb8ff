"""Reward-filtered fine-tuning (trainer/filtered.py) through `run_stage`: it trains on verified samples only, in full
batches, writes the checkpoint and metrics a GRPO stage writes, gives up on a stage whose samples never verify, ends on
its budget of sampled answers, and stops and resumes at round boundaries as a GRPO stage does (a stop request saves
the round it reached; SIGKILL resumes from the last in-stage checkpoint), to the same result as a stage never stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.support.filtered_tasks import AnyAnswer, NoAnswer
from tests.support.tiny_llama import save_tiny_llama
from trainer import resume as sr
from trainer import stop
from trainer.config import TRAIN_PRESETS, TrainConfig

ROOT = Path(__file__).resolve().parents[1]
FILTERED = {**TRAIN_PRESETS["smoke"], "optimizer": "filtered", "filtered_prompts": 2, "num_generations": 2,
            "sft_batch_size": 2, "max_completion_length": 8, "train_layers": 0, "prompt_style": "compact",
            "learning_rate": 1e-3}
SAME = ("train/steps", "train/rounds", "train/completions", "train/kept", "train/valid_rate", "train/loss")


def _train_set(folder: Path, task) -> Path:
    train = folder / "stage_0" / "train.jsonl"
    train.parent.mkdir(parents=True, exist_ok=True)
    train.write_text("".join(task.item_to_json(i) + "\n" for i in task.make([1, 2], 8, seed=0)))
    return train


def _stage(folder, base, task, **settings):
    from trainer.stage import run_stage

    cfg = TrainConfig.model_validate({**FILTERED, **settings})
    return run_stage(train_path=_train_set(folder, task), init_checkpoint=base, out_dir=folder / "stage_0", cfg=cfg,
                     seed=0, reward_state=None, progress=False, warm_start=False, task=task)


@pytest.fixture(scope="module")
def tiny_base(embedded_model_path, tmp_path_factory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("tiny") / "base", embedded_model_path)


def _same_weights(a: Path, b: Path) -> bool:
    x, y = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    return x.keys() == y.keys() and all(x[k].equal(y[k]) for k in x)


@pytest.mark.slow
def test_a_filtered_stage_trains_full_batches_of_verified_samples(tiny_base, tmp_path):
    res = _stage(tmp_path, tiny_base, AnyAnswer(), max_steps=3)
    m = res["metrics"]
    assert m["train/optimizer"] == "filtered" and m["train/steps"] == 3
    assert m["train/kept"] >= 3 * 2 and m["train/valid_rate"] > 0
    ckpt = tmp_path / "stage_0" / "checkpoint"
    meta = json.loads((ckpt / "trainer_meta.json").read_text())
    assert meta["optimizer"] == "filtered" and meta["filtered_steps"] == 3 and meta["task"] == "toy-any"
    assert json.loads((tmp_path / "stage_0" / "metrics.json").read_text())["train/steps"] == 3
    assert not _same_weights(tiny_base, ckpt)  # the weights moved


@pytest.mark.slow
def test_a_filtered_stage_whose_samples_never_verify_gives_up_without_a_step(tiny_base, tmp_path):
    m = _stage(tmp_path, tiny_base, NoAnswer(), max_steps=1)["metrics"]
    assert m["train/steps"] == 0 and m["train/kept"] == 0 and m["train/rounds"] == 50
    assert _same_weights(tiny_base, tmp_path / "stage_0" / "checkpoint")


@pytest.mark.slow
def test_a_stage_on_levels_where_nothing_is_right_ends_on_its_budget_with_kept_0(tiny_base, tmp_path):
    """10 sampled answers: rounds of 2 prompts x 2 samples, then a last round of the 1 prompt the budget has room
    for. Nothing verifies: no step, `kept: 0` in metrics.json, and the checkpoint holds the start's weights."""
    res = _stage(tmp_path, tiny_base, NoAnswer(), stage_samples=10, max_steps=1)
    m = json.loads((tmp_path / "stage_0" / "metrics.json").read_text())
    assert m == json.loads(json.dumps(res["metrics"], default=str))
    assert m["train/completions"] == 10 and m["train/stage_samples"] == 10 and m["train/rounds"] == 3
    assert m["train/kept"] == 0 and m["train/steps"] == 0  # max_steps=1 does not apply under a budget
    assert _same_weights(tiny_base, tmp_path / "stage_0" / "checkpoint")
    # a stage whose samples do verify spends the same budget, whatever it keeps
    easy = _stage(tmp_path / "easy", tiny_base, AnyAnswer(), stage_samples=10)["metrics"]
    assert easy["train/completions"] == 10 and easy["train/kept"] > 0 and easy["train/steps"] >= 1


def test_the_budget_is_checked_and_the_progress_line_says_what_a_filtered_stage_runs():
    from graph.progress import describe_start
    from graph.settings import build_settings

    with pytest.raises(ValueError, match=r"stage_samples=3: allowed: 0 or at least num_generations=8"):
        TrainConfig.model_validate({**TRAIN_PRESETS["rg-cpu"], "stage_samples": 3})
    with pytest.raises(ValueError, match=r"stage_samples=64 applies to optimizer=filtered, not grpo"):
        TrainConfig(stage_samples=64)
    rg = build_settings({"preset": "rg-cpu"}, {})
    assert rg.train.stage_samples == 7680 and rg.train.save_steps > 0
    line = describe_start("train_stage", {"stage": 1}, rg)
    assert line == "[stage 1] train_stage: reward-filtered fine-tuning, 7680 sampled answers ..."
    assert "GRPO" not in line


@pytest.mark.slow
def test_a_stop_request_ends_a_filtered_stage_at_a_round_boundary_and_resume_gives_the_same_result(
        tiny_base, tmp_path, monkeypatch):
    """A stop arrives while round 3 samples: the round is given up, rounds 1-2 are saved as an in-stage checkpoint
    (no save_steps needed), StageInterrupted says where; the resume continues from round 2 and ends where a stage
    that was never stopped ends: the same weights and figures."""
    from trainer.filtered_sampling import FilteredSampler

    settings = {"stage_samples": 24, "max_steps": 1}
    ref = _stage(tmp_path / "ref", tiny_base, AnyAnswer(), **settings)["metrics"]
    real, calls = FilteredSampler.__call__, []

    def stop_in_round_3(self, *a, **kw):
        calls.append(1)
        if len(calls) == 3:
            stop.request_stop("SIGTERM")
        return real(self, *a, **kw)

    monkeypatch.setattr(FilteredSampler, "__call__", stop_in_round_3)
    stop.reset()
    try:
        with pytest.raises(stop.StageInterrupted, match=r"after round 2, saved in trl/checkpoint-2: a resume continues"):
            _stage(tmp_path / "run", tiny_base, AnyAnswer(), **settings)
    finally:
        stop.reset()
    assert not (tmp_path / "run" / "stage_0" / "checkpoint").exists()
    monkeypatch.setattr(FilteredSampler, "__call__", real)
    m = _stage(tmp_path / "run", tiny_base, AnyAnswer(), **settings)["metrics"]
    assert m["train/resumed_from_round"] == 2
    assert {k: m[k] for k in SAME} == {k: ref[k] for k in SAME}
    assert _same_weights(tmp_path / "ref" / "stage_0" / "checkpoint", tmp_path / "run" / "stage_0" / "checkpoint")
    assert not (tmp_path / "run" / "stage_0" / "trl").exists()  # the in-stage checkpoints go with the stage


def _cli(folder: Path, base: Path, train: Path) -> tuple[list[str], dict]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAIN__")}
    env.update({"PYTHONPATH": str(ROOT), "TRAIN__OPTIMIZER": "filtered", "TRAIN__FILTERED_PROMPTS": "2",
                "TRAIN__NUM_GENERATIONS": "2", "TRAIN__SFT_BATCH_SIZE": "2", "TRAIN__MAX_COMPLETION_LENGTH": "8",
                "TRAIN__TRAIN_LAYERS": "1", "TRAIN__PROMPT_STYLE": "compact", "TRAIN__LEARNING_RATE": "1e-4",
                "TRAIN__STAGE_SAMPLES": "16", "TRAIN__SAVE_STEPS": "2"})
    return [sys.executable, "-m", "trainer.stage", "--preset", "smoke", "--task", "tests.support.filtered_tasks:AnyAnswer",
            "--train-path", str(train), "--init", str(base), "--out", str(folder / "stage_0"), "--seed", "5",
            "--warm-start", "no"], env


@pytest.mark.slow
def test_a_filtered_stage_killed_mid_stage_resumes_from_its_last_checkpoint_to_the_same_result(
        embedded_model_path, tmp_path):
    """The embedded model at a tiny shape (4 rounds of 2 prompts x 2 samples, a checkpoint every 2 rounds), in its own
    process: SIGKILL after its first in-stage checkpoint, then the same command again. It redoes at most one
    checkpoint interval and ends with the weights and figures of the same stage run without a kill."""
    ref_cmd, env = _cli(tmp_path / "ref", embedded_model_path, _train_set(tmp_path / "ref", AnyAnswer()))
    cmd, _ = _cli(tmp_path / "run", embedded_model_path, _train_set(tmp_path / "run", AnyAnswer()))
    trl = tmp_path / "run" / "stage_0" / "trl"

    def complete() -> list[int]:
        return [r for r, folder in sr.checkpoints(trl) if (folder / sr.MARKER).exists()]

    with open(tmp_path / "first.log", "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 900
        while not complete():
            assert proc.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no in-stage checkpoint after 15 min"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)  # a crash: no clean-up, no final checkpoint
        proc.wait()
    saved = max(complete())
    done = (tmp_path / "first.log").read_text().count("filtered round ")  # rounds sampled before the kill
    assert saved < 4 and not (tmp_path / "run" / "stage_0" / "checkpoint").exists()
    assert done - saved <= 2  # the resume redoes at most one checkpoint interval

    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout[r.stdout.index("{"):])
    assert out["train/resumed_from_round"] == saved
    assert "resuming stage_0 from its in-stage checkpoint" in r.stderr
    assert r.stderr.count("filtered round ") == 4 - saved  # only the rounds after the checkpoint ran again
    ref = subprocess.run(ref_cmd, env=env, capture_output=True, text=True, timeout=1800)
    assert ref.returncode == 0, ref.stderr[-3000:]
    ref_out = json.loads(ref.stdout[ref.stdout.index("{"):])
    assert out["train/completions"] == 16 and out["train/kept"] > 0 and out["train/steps"] > 0
    assert {k: out[k] for k in SAME} == {k: ref_out[k] for k in SAME}
    assert _same_weights(tmp_path / "ref" / "stage_0" / "checkpoint", tmp_path / "run" / "stage_0" / "checkpoint")
    assert not trl.exists()
