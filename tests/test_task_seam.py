"""The trainer reaches a task only through `trainer.task.Task`: a toy task defined in the tests (adding numbers,
no MAPF) trains a real GRPO step and an SFT warm start through `trainer.stage.run_stage`, and is scored by the
same helpers MAPF is."""

from __future__ import annotations

import json

import pytest

from tests.support.tiny_llama import save_tiny_llama
from tests.support.toy_task import ToyTask
from trainer.config import TRAIN_PRESETS, TrainConfig
from trainer.task import Task, TaskReward, load_task

TOY = "tests.support.toy_task:ToyTask"


def test_tasks_load_by_name_and_a_bad_name_says_what_is_allowed():
    assert load_task("mapf").name == "mapf" and isinstance(load_task("mapf"), Task)
    assert load_task(TOY).name == "toy-add"
    for bad in ("mapff", "tests.support.toy_task:Nope"):
        with pytest.raises(ValueError, match=rf"task {bad!r}: .*allowed: mapf, rg:<dataset> \(a reasoning-gym dataset\), rlve:<environment> \(an RLVE-Gym environment\), pool:<task>,<task>,... \(a pool of them\), or package.module:Attribute"):
            load_task(bad)
    with pytest.raises(ValueError, match=r"lacks .*verify"):
        load_task("tests.support.toy_task:json")


def test_the_generic_reward_scores_each_completion_against_its_own_row():
    task = ToyTask()
    items = task.make([1, 2], 3, seed=0)
    raw = [task.item_to_json(i) for i in items]
    reward = TaskReward(task, "compact")
    got = reward(prompts=[task.prompt(i, "compact") for i in items],
                 completions=[task.gold(items[0]), "I think 5", "no idea"], item=raw)
    assert got[0] == 1.0 and got[2] == 0.0
    assert reward.history[-1]["valid_rate"] == pytest.approx(sum(g == 1.0 for g in got) / 3)
    with pytest.raises(ValueError, match="row 1: its prompt is not the prompt of its item"):
        reward(prompts=[task.prompt(items[0], "compact")] * 3, completions=["1"] * 3, item=raw)


def test_sft_and_greedy_scoring_go_through_the_task(embedded_model_path):
    from transformers import AutoTokenizer

    from trainer.data import build_dataset, sft_dataset
    from trainer.greedy import score_texts

    task = ToyTask()
    items = task.make([1, 2, 3], 6, seed=1)
    tok = AutoTokenizer.from_pretrained(embedded_model_path)
    data, dropped = build_dataset(items, tok, 256, "compact", task=TOY)
    assert dropped == 0 and data.column_names == ["prompt", "item", "item_id", "level"]
    assert data[2]["level"] == 3 and json.loads(data[2]["item"]) == items[2]
    sft = sft_dataset(items, 0, "compact", order="size", task=task)
    golds = [r["completion"][0]["content"] for r in sft]
    assert set(golds[:2]) == {task.gold(i) for i in items if i["digits"] == 1}  # easy levels first
    assert set(golds[4:]) == {task.gold(i) for i in items if i["digits"] == 3}
    r = score_texts(items, [task.gold(items[0]), "nothing", "12"] + [task.gold(i) for i in items[3:]], task)
    assert r["by_level"] == {1: 1.0, 2: 0.5, 3: 0.5} and r["failures"] == {"no_answer": 1, "wrong": 1}


@pytest.mark.slow
def test_a_toy_task_trains_through_run_stage(embedded_model_path, tmp_path):
    """SFT warm start on the toy task's gold answers, then one GRPO step scored by its verifier, in-process."""

    from trainer.stage import run_stage

    base = save_tiny_llama(tmp_path / "base", embedded_model_path)
    task = ToyTask()
    train = tmp_path / "stage_0" / "train.jsonl"
    train.parent.mkdir()
    train.write_text("".join(task.item_to_json(i) + "\n" for i in task.make([1, 2], 8, seed=0)))
    cfg = TrainConfig.model_validate({**TRAIN_PRESETS["smoke"], "max_steps": 1, "max_completion_length": 8,
                                      "sft_sizes": None, "train_layers": 0, "prompt_style": "compact"})
    res = run_stage(train_path=train, init_checkpoint=base, out_dir=tmp_path / "stage_0", cfg=cfg, seed=0,
                    reward_state=None, progress=False, warm_start=True, task=TOY)
    m = res["metrics"]
    assert m["train/steps"] == 1 and m["sft/steps"] == cfg.sft_steps and m["sft/examples"] == 8
    assert m["train/completions"] >= cfg.num_generations and 0.0 <= m["train/valid_rate"] <= 1.0
    assert res["reward_state"] is None and "train/w_acc" not in m  # the toy reward carries no state
    meta = json.loads((tmp_path / "stage_0" / "checkpoint" / "trainer_meta.json").read_text())
    assert meta["task"] == "toy-add"
