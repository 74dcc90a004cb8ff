"""Prompt screening (`trainer.screen`): which instances a GRPO stage keeps, the saved choice, and a real stage on it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from env import write_jsonl
from tests.support.small_maps import three_by_three
from trainer import screen
from trainer.config import TRAIN_PRESETS, TrainConfig


class LiveOn:
    """A reward as TRL calls one: rewards with variance for the answers to `live` instances (their position in the
    flat batch, alternating 0 / 1), 0 for every other answer; records what it was asked."""

    def __init__(self, live_ids: set[str]):
        self.live, self.calls = live_ids, []

    def __call__(self, completions=None, completion_ids=None, instance=None, **kw):
        self.calls.append((list(completions), list(completion_ids), list(instance)))
        return [float(i % 2) if json.loads(raw)["id"] in self.live else 0.0 for i, raw in enumerate(instance)]


def _gen_config(tok, max_new_tokens: int = 6):
    from transformers import GenerationConfig

    return GenerationConfig(max_new_tokens=max_new_tokens, do_sample=True, temperature=0.7, top_k=0,
                            pad_token_id=tok.pad_token_id, eos_token_id=[tok.eos_token_id])


def test_informative_is_reward_variance():
    assert screen.informative([0.0, 0.5, 0.0])
    assert not screen.informative([0.3, 0.3, 0.3])
    assert not screen.informative([])


def test_screen_keeps_the_instances_whose_answers_scored_apart(embedded_policy):
    from trainer.data import build_dataset

    model, tok = embedded_policy
    insts = three_by_three(6, seed=3)
    dataset, _ = build_dataset(insts, tok, 1024, "compact")
    live = {insts[1].id, insts[4].id, insts[5].id}
    reward = LiveOn(live)
    keep, stats = screen.screen_dataset(dataset, model=model, tokenizer=tok, reward=reward, samples=3,
                                        generation_config=_gen_config(tok), min_keep=2, prompts_per_call=4)
    assert keep == [1, 4, 5]
    assert stats["informative"] == stats["kept"] == 3 and stats["candidates"] == 6 and not stats["fallback"]
    assert stats["informative_by_size"] == {"3": 3} and stats["candidates_by_size"] == {"3": 6}
    # one scoring call over every answer, 3 per instance, each answering its own instance, in dataset order
    (completions, ids, instance), = reward.calls
    assert len(completions) == len(ids) == 18
    assert [json.loads(r)["id"] for r in instance] == [i.id for i in insts for _ in range(3)]
    for text, row in zip(completions, ids, strict=True):
        assert 1 <= len(row) <= 6 and text == tok.decode(row, skip_special_tokens=True)
        assert tok.eos_token_id not in row[:-1]  # cut at the first end of answer, as TRL masks it


def test_screen_keeps_everything_when_too_few_instances_pass(embedded_policy):
    from trainer.data import build_dataset

    model, tok = embedded_policy
    insts = three_by_three(4, seed=5)
    dataset, _ = build_dataset(insts, tok, 1024, "compact")
    keep, stats = screen.screen_dataset(dataset, model=model, tokenizer=tok, reward=LiveOn({insts[2].id}),
                                        samples=2, generation_config=_gen_config(tok, 4), min_keep=2)
    assert keep == [0, 1, 2, 3]
    assert stats["fallback"] and stats["informative"] == 1 and stats["kept"] == 4
    assert screen.screen_metrics(stats)["train/screen_fallback"] is True
    assert screen.screen_metrics(None) == {}


def test_saved_screen_is_read_back_only_for_the_same_stage(tmp_path):
    stats = {"candidates": 5, "informative": 2, "kept": 2}
    screen.save_screen(tmp_path, "key-a", [1, 3], stats)
    assert screen.load_screen(tmp_path, "key-a", 5) == ([1, 3], stats)
    assert screen.load_screen(tmp_path, "key-b", 5) is None  # another stage's (settings, data, seed, start)
    assert screen.load_screen(tmp_path, "key-a", 3) is None  # rows beyond this stage's set
    (tmp_path / screen.SCREEN_FILE).write_text('{"key": "key-a", "keep": [1')  # half-written
    assert screen.load_screen(tmp_path, "key-a", 5) is None
    assert screen.load_screen(tmp_path / "nowhere", "key-a", 5) is None


def test_screen_samples_setting_is_bounded():
    assert TrainConfig().screen_samples == 0
    with pytest.raises(ValueError, match="screen_samples"):
        TrainConfig(screen_samples=-1)


@pytest.mark.slow
def test_stage_trains_only_on_the_screened_rows_and_reads_its_screen_back(tmp_path, monkeypatch):
    """A real smoke stage with screening on: a stage that finds its screen.json (as a resumed stage does) trains
    on exactly those rows, with the trainer's own sampler; without one it screens, saves and reports it."""
    from llm_backends.models import resolve_model
    from trainer import resume as stage_resume
    from trainer.data import MapfReward
    from trainer.stage import run_stage

    base = resolve_model("smollm2-135m")
    train = tmp_path / "train.jsonl"
    insts = three_by_three(6, seed=11)
    write_jsonl(train, insts)
    # partial_credit_kind without partial_credit scores as the gated reward; here it only shows that the screen's
    # reward is built with the stage's settings
    cfg = TrainConfig.model_validate({**TRAIN_PRESETS["smoke"], "max_steps": 2, "screen_samples": 2,
                                      "sft_warm_start": False, "resample_rounds": 0,
                                      "partial_credit_kind": "progress"})
    seen: list[str] = []
    kinds: set[str] = set()
    real_call = MapfReward.__call__

    def spy(self, prompts=None, completions=None, completion_ids=None, instance=None, **kw):
        seen.extend(json.loads(raw)["id"] for raw in instance)
        kinds.add(self.partial_credit_kind)
        return real_call(self, prompts, completions, completion_ids, instance, **kw)

    monkeypatch.setattr(MapfReward, "__call__", spy)

    # 1. no saved screen: the stage screens its 6 instances twice each (the untrained policy is never right, so
    # none passes and all are kept), saves the choice and reports it
    out = tmp_path / "stage_a"
    res = run_stage(train_path=train, init_checkpoint=base, out_dir=out, cfg=cfg, seed=3, reward_state=None,
                    progress=False)
    m = res["metrics"]
    assert m["train/screen_candidates"] == 6 and m["train/screen_fallback"] is True and m["train/screen_kept"] == 6
    assert seen[:12] == [i.id for i in insts for _ in range(2)]  # the screen's own scoring, in dataset order
    assert kinds == {"progress"}  # the screen's reward and the stage's
    saved = json.loads((out / screen.SCREEN_FILE).read_text())
    assert saved["keep"] == list(range(6)) and saved["stats"]["samples"] == 2

    # 2. a saved screen of this very stage (as after a crash): no screening, GRPO draws only its rows
    seen.clear()
    out = tmp_path / "stage_b"
    key = stage_resume.stage_key(train_path=train, init_checkpoint=Path(base), seed=3, cfg=cfg)
    screen.save_screen(out, key, [4], {"candidates": 6, "informative": 1, "samples": 2, "fallback": False,
                                       "informative_by_size": {"3": 1}, "candidates_by_size": {"3": 6},
                                       "sampled_valid_rate": 0.25, "seconds": 1.0, "kept": 1})
    res = run_stage(train_path=train, init_checkpoint=base, out_dir=out, cfg=cfg, seed=3, reward_state=None,
                    progress=False)
    assert res["metrics"]["train/screen_kept"] == 1
    # one kept row, fewer than a batch's prompts: repeated to fill the batch, so every step still trains
    assert res["metrics"]["train/steps"] == cfg.max_steps
    assert seen and set(seen) == {insts[4].id}
    assert len(seen) == cfg.max_steps * cfg.per_device_train_batch_size
