"""Reward-filtered fine-tuning (trainer/filtered.py) through `run_stage`: it trains on verified samples only, in full
batches, writes the checkpoint and metrics a GRPO stage writes, and gives up on a stage whose samples never verify."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file

from tests.support.tiny_llama import save_tiny_llama
from tests.support.toy_task import ToyTask
from trainer.config import TRAIN_PRESETS, TrainConfig


class AnyAnswer(ToyTask):
    """The toy task, with every non-empty answer verified: a random model's samples are then kept."""

    name = "toy-any"

    def verify(self, item, answer):
        from trainer.task import Verdict

        ok = bool(answer.strip())
        return Verdict(valid=ok, label=None if ok else "no_answer", score=float(ok), optimal=ok)


class NoAnswer(ToyTask):
    name = "toy-none"

    def verify(self, item, answer):
        from trainer.task import Verdict

        return Verdict(valid=False, label="wrong", score=0.0)


def _stage(tmp_path, embedded_model_path, task, max_steps):
    from trainer.stage import run_stage

    base = save_tiny_llama(tmp_path / "base", embedded_model_path)
    train = tmp_path / "stage_0" / "train.jsonl"
    train.parent.mkdir()
    train.write_text("".join(task.item_to_json(i) + "\n" for i in task.make([1, 2], 8, seed=0)))
    cfg = TrainConfig.model_validate({**TRAIN_PRESETS["smoke"], "optimizer": "filtered", "max_steps": max_steps,
                                      "filtered_prompts": 2, "num_generations": 2, "sft_batch_size": 2,
                                      "max_completion_length": 8, "train_layers": 0, "prompt_style": "compact",
                                      "learning_rate": 1e-3})
    res = run_stage(train_path=train, init_checkpoint=base, out_dir=tmp_path / "stage_0", cfg=cfg, seed=0,
                    reward_state=None, progress=False, warm_start=False, task=task)
    return base, res


@pytest.mark.slow
def test_a_filtered_stage_trains_full_batches_of_verified_samples(embedded_model_path, tmp_path):
    base, res = _stage(tmp_path, embedded_model_path, AnyAnswer(), max_steps=3)
    m = res["metrics"]
    assert m["train/optimizer"] == "filtered" and m["train/steps"] == 3
    assert m["train/kept"] >= 3 * 2 and m["train/valid_rate"] > 0
    ckpt = tmp_path / "stage_0" / "checkpoint"
    meta = json.loads((ckpt / "trainer_meta.json").read_text())
    assert meta["optimizer"] == "filtered" and meta["filtered_steps"] == 3 and meta["task"] == "toy-any"
    assert json.loads((tmp_path / "stage_0" / "metrics.json").read_text())["train/steps"] == 3
    before, after = load_file(base / "model.safetensors"), load_file(ckpt / "model.safetensors")
    assert any(not before[k].equal(after[k]) for k in before)  # the weights moved


@pytest.mark.slow
def test_a_filtered_stage_whose_samples_never_verify_gives_up_without_a_step(embedded_model_path, tmp_path):
    base, res = _stage(tmp_path, embedded_model_path, NoAnswer(), max_steps=1)
    m = res["metrics"]
    assert m["train/steps"] == 0 and m["train/kept"] == 0 and m["train/rounds"] == 50
    before = load_file(base / "model.safetensors")
    after = load_file(tmp_path / "stage_0" / "checkpoint" / "model.safetensors")
    assert all(before[k].equal(after[k]) for k in before)
