"""Checkpoints within a stage and resuming a half-trained stage. The fast tests check the
bookkeeping; the slow one kills a real tiny stage after its first in-stage checkpoint and resumes it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from trainer import resume as sr
from trainer.config import TRAIN_PRESETS, TrainConfig
from trainer.trl_setup import grpo_config

ROOT = Path(__file__).resolve().parents[1]


def test_paper_saves_every_50_steps_and_cpu_never(tmp_path):
    from trainer.gpu_plan import mock_cuda

    with mock_cuda():
        paper = grpo_config(TrainConfig.model_validate(TRAIN_PRESETS["paper"]), tmp_path, seed=0)
    assert str(paper.save_strategy.value) == "steps" and paper.save_steps == 50
    cpu = grpo_config(TrainConfig(), tmp_path, seed=0)
    assert str(cpu.save_strategy.value) == "no"


def _ckpt(trl: Path, step: int, key: str | None, state: bool = True) -> Path:
    d = trl / f"checkpoint-{step}"
    d.mkdir(parents=True)
    if state:
        (d / "trainer_state.json").write_text("{}")
    if key is not None:
        (d / sr.MARKER).write_text(json.dumps({"stage_key": key, "global_step": step,
                                               "reward_state": {}, "history": []}))
    return d


def test_find_resume_takes_the_newest_complete_checkpoint_of_the_same_stage(tmp_path):
    trl = tmp_path / "trl"
    _ckpt(trl, 50, "k")
    _ckpt(trl, 100, "k")
    _ckpt(trl, 150, None)  # killed between the trainer's save and our marker: incomplete
    other = _ckpt(trl, 200, "another-config")
    folder, marker = sr.find_resume(trl, "k")
    assert folder.name == "checkpoint-100" and marker["global_step"] == 100
    assert not other.exists()  # a checkpoint of another configuration is never resumed, and removed
    assert sr.find_resume(tmp_path / "none", "k") is None


def test_stage_key_names_the_stage_not_its_bookkeeping(tmp_path):
    cfg = TrainConfig()
    kw = dict(train_path=tmp_path / "t.jsonl", init_checkpoint=tmp_path / "m", seed=3)
    k = sr.stage_key(cfg=cfg, **kw)
    assert k == sr.stage_key(cfg=cfg.model_copy(update={"save_steps": 7, "logging_steps": 3}), **kw)
    assert k != sr.stage_key(cfg=cfg.model_copy(update={"learning_rate": 1e-3}), **kw)
    assert k != sr.stage_key(cfg=cfg, **{**kw, "seed": 4})


def test_on_save_completes_the_new_checkpoint_then_removes_older_ones(tmp_path):
    from env import RewardState

    trl = tmp_path / "trl"
    old = _ckpt(trl, 1, "k")
    new = _ckpt(trl, 2, None)
    reward = SimpleNamespace(state=RewardState(), history=[{"rewards": [0.5], "valid_rate": 1.0}])
    cb = sr.resume_callback(reward, "k")
    cb.on_save(SimpleNamespace(output_dir=str(trl)), SimpleNamespace(global_step=2), SimpleNamespace())
    marker = json.loads((new / sr.MARKER).read_text())
    assert marker["stage_key"] == "k" and marker["global_step"] == 2 and marker["history"] == reward.history
    assert not old.exists()
    fresh = SimpleNamespace(state=RewardState(short_share=0.1), history=[])  # a new stage's reward, fresh
    sr.restore_reward(fresh, marker)
    assert fresh.state == reward.state and fresh.history == reward.history


def test_a_filtered_checkpoint_round_trips_weights_optimiser_rngs_and_the_loop_state(tmp_path):
    """`save_filtered` then `load_filtered` put back what a resumed filtered stage needs; `find_resume` finds it only
    for its own stage key; saving a round that is saved already keeps the complete checkpoint."""
    import random

    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    rng = random.Random(7)
    state = {"rounds": 4, "steps": 3, "sampled": 32, "kept": 9, "pos": 8, "order": [2, 0, 1],
             "pending": [([1, 2, 3], 2)], "losses": [1.5, 1.2, 0.9], "valid_rates": [0.5] * 4}
    snap = sr.filtered_snapshot(state, rng)
    expect = (rng.random(), torch.rand(2))  # what the RNGs give next from the snapshot's states
    folder = sr.save_filtered(tmp_path / "trl", "k", model, opt, *snap)
    assert sr.find_resume(tmp_path / "trl", "k")[0] == folder and sr.find_resume(tmp_path / "trl", "other") is None
    assert not folder.exists()  # another configuration's checkpoint is removed
    folder = sr.save_filtered(tmp_path / "trl", "k", model, opt, *snap)
    stamp = (folder / sr.MARKER).stat().st_mtime_ns
    assert sr.save_filtered(tmp_path / "trl", "k", model, opt, *snap) == folder
    assert (folder / sr.MARKER).stat().st_mtime_ns == stamp  # kept, not rewritten
    fresh, fresh_rng = torch.nn.Linear(3, 2), random.Random(0)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=0.1)
    torch.manual_seed(123)
    back = sr.load_filtered(folder, fresh, fresh_opt, fresh_rng)
    assert back == state
    assert (fresh_rng.random(), torch.rand(2).tolist()) == (expect[0], expect[1].tolist())
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values(), strict=True))
    assert fresh_opt.state_dict()["state"][0]["step"] == opt.state_dict()["state"][0]["step"]


# ------------------------------------------------------------------------------------------------ slow

STEPS = 4


def _stage_cmd(tmp_path: Path, base: Path) -> tuple[list[str], dict]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAIN__")}
    env.update({"PYTHONPATH": str(ROOT), "TRAIN__SAVE_STEPS": "1", "TRAIN__MAX_STEPS": str(STEPS),
                "TRAIN__SFT_WARM_START": "false", "TRAIN__MAX_COMPLETION_LENGTH": "16"})
    cmd = [sys.executable, "-m", "trainer.stage", "--preset", "smoke", "--task", "mapf", "--train-path", str(tmp_path / "train.jsonl"),
           "--init", str(base), "--out", str(tmp_path / "stage_0"), "--seed", "5", "--warm-start", "no"]
    return cmd, env


@pytest.mark.slow
def test_a_stage_killed_after_its_first_in_stage_checkpoint_resumes_from_it(tmp_path, embedded_model_path):
    from env import generate, uniform_config, write_jsonl

    write_jsonl(tmp_path / "train.jsonl", generate(uniform_config(), 8, seed=2).instances)
    cmd, env = _stage_cmd(tmp_path, embedded_model_path)
    trl = tmp_path / "stage_0" / "trl"

    def complete() -> list[int]:
        return [step for step, folder in sr.checkpoints(trl) if (folder / sr.MARKER).exists()]

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
    assert saved < STEPS, "the stage finished before it could be killed"
    assert not (tmp_path / "stage_0" / "checkpoint").exists()

    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout[r.stdout.index("{"):])
    assert out["train/resumed_from_step"] == saved  # it continued from the checkpoint, not from step 0 ...
    assert out["train/steps"] == STEPS  # ... and ended with the uninterrupted stage's number of steps
    assert "resuming stage_0 from its in-stage checkpoint" in r.stderr
    meta = json.loads((tmp_path / "stage_0" / "checkpoint" / "trainer_meta.json").read_text())
    # one reward batch per step (smoke: 4 completions a step), counted once: the batches before the checkpoint came
    # back with the reward state, and only the steps after it were trained again
    assert meta["grpo_steps"] == STEPS and meta["reward_state"]["updates"] == STEPS
    assert out["train/completions"] == STEPS * 4
    assert not trl.exists()  # the in-stage checkpoints go once the stage is done
