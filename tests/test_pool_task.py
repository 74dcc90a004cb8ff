"""A pool of tasks from two families as one level-share task (`trainer/pool.py`): the engineer's shares over
(task, level) pairs, a stage's data mixing the tasks in those shares, each item judged by its own task, the
classic curricula per task, the final table per task and for the whole, and apply -> train_stage -> evaluate ->
summarize_failures -> a scripted engineer -> validate_config -> apply on it."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from env.rg import RgConfig
from families import family_of
from families.level_share import POOL_REACHED
from graph.settings import SettingsError, build_settings
from tests.support.node_helpers import ScriptedChat, runtime
from tests.support.tiny_llama import save_tiny_llama
from trainer.pool import member_names
from trainer.task import load_task

RG = "rg:basic_arithmetic:num_terms=2,num_digits=1-2"  # its own comma stays in its name
RLVE = "rlve:multiplication:levels=2"
POOL = f"pool:{RG},{RLVE}"


@pytest.fixture(scope="module")
def pool():
    return load_task(POOL)


def test_the_levels_are_every_task_s_levels_labelled_with_the_task(pool):
    assert member_names(POOL) == [RG, RLVE] and pool.level_groups == [[0, 1], [2, 3]]
    assert [lv.label for lv in pool.levels] == [f"{RG} L0: num_terms=2 num_digits=1", f"{RG} L1: num_terms=2 num_digits=2",
                                                f"{RLVE} L0: digit_num=2", f"{RLVE} L1: digit_num=3"]
    assert set(pool.failure_labels) == {"no_answer", "wrong", "partial", "wrong_format"}
    assert "| 3 | rlve:multiplication:levels=2 | 1 | digit_num=3 |" in pool.describe_levels()


def test_a_stage_mixes_the_tasks_in_the_allocated_shares_and_each_task_judges_its_own_items(pool):
    items, figures = pool.generate(RgConfig(levels={1: 0.25, 2: 0.75}), 8, seed=4)
    assert Counter(pool.level(i) for i in items) == {1: 2, 2: 6} and figures["generated"] == {"1": 2, "2": 6}
    assert [i.member for i in items] != sorted(i.member for i in items)  # mixed, not one task after the other
    for it in items:
        back = pool.item_from_json(pool.item_to_json(it))
        member = pool.members[back.member]
        assert pool.level(back) == pool.level(it) and pool.prompt(back) == member.prompt(back.item, "compact")
        assert pool.verify(back, pool.gold(back)).valid and not pool.verify(back, "<answer>-1</answer>\n-1").valid
    val = pool.split("val")
    assert {pool.level(i) for i in val} == {0, 1, 2, 3} and not {i.item.prompt for i in items if i.member == 1} & {
        i.item.prompt for i in val if i.member == 1}


def test_the_classic_curricula_run_per_task(pool):
    family = family_of(POOL)
    every = {str(g): {"n": 16, "valid_rate": 0.95} for g in range(4)}
    raw, why, memory = family.classic("rlve", {"levels": {"0": 0.5, "2": 0.5}}, every, {}, random.Random(0))
    assert raw == {"levels": {"0": 0.25, "1": 0.25, "2": 0.25, "3": 0.25}} and memory[POOL_REACHED] == {RG: 1, RLVE: 3}
    assert why.startswith(f"rlve: {RG}: level 0: accuracy 0.95") and f"{RLVE}: level 2" in why
    again, _, memory = family.classic("rlve", raw, {"1": {"n": 16, "valid_rate": 0.5}}, memory, random.Random(0))
    assert memory[POOL_REACHED] == {RG: 1, RLVE: 3}  # the level reached is kept per task
    # threshold steps within a task, never from one task's last level into the next task's first
    raw, _, _ = family.classic("threshold", {"levels": {"1": 0.5, "2": 0.5}}, every, {}, random.Random(0))
    assert raw == {"levels": {"1": 0.5, "2": 0.25, "3": 0.25}}


def test_the_final_table_reports_each_task_and_the_whole(pool):
    family = family_of(POOL)
    rows = [family.verdict_row(it, pool.gold(it) if k % 2 else "no", None, None, "makespan")
            for k, it in enumerate(pool.split("val"))]
    final, table = family.final(rows)
    lines = table.splitlines()
    per_task = {ln.split("|")[1].strip(): ln for ln in lines if "all its levels" in ln}
    assert set(per_task) == {RG, RLVE} and f"| {len(rows)} | 50.0% |" in lines[-1]
    assert f"| {48} | 50.0% |" in per_task[RG] and f"| {32} | 50.0% |" in per_task[RLVE]


@pytest.mark.parametrize(("name", "message"), [
    ("pool:rg:count_bits", "1 member(s) ['rg:count_bits']; allowed: 2 to 8 different tasks"),
    ("pool:rg:count_bits,rlve:nope", "member task 'rlve:nope': unknown RLVE environment 'nope'"),
    ("pool:rg:count_bits,mapf", "allowed: 2 to 8 different tasks"),  # 'mapf' has no colon: part of the first name
    ("pool:rg:count_bits,env.task:MapfTask", "member 'env.task:MapfTask' has no levels"),
])
def test_a_bad_pool_is_refused_in_one_line(name, message):
    with pytest.raises(SettingsError) as e:
        build_settings({"task": name, "preset": "smoke", "engineer": "rlve"}, env={})
    assert message in str(e.value) and "\n" not in str(e.value).strip()


@pytest.mark.slow
def test_a_pool_runs_apply_train_evaluate_summarize_propose_validate(embedded_model_path, tmp_path, monkeypatch):
    from nodes.apply import apply
    from nodes.evaluate import evaluate
    from nodes.propose_config import propose_config
    from nodes.summarize_failures import summarize_failures
    from nodes.train_stage import train_stage
    from nodes.validate_config import validate_config

    monkeypatch.setenv("ENV_ENGINEER_CACHE", str(tmp_path / "cache"))
    base = save_tiny_llama(tmp_path / "base", embedded_model_path)
    settings = build_settings({"task": POOL, "preset": "smoke", "engineer": "self", "eval_limit": None,
                               "final_limit": None, "engineer_max_attempts": 2, "policy_model": str(base),
                               "policy_backend": "transformers", "eval_max_tokens": 8, "train.max_steps": 1,
                               "train.max_completion_length": 8, "train.train_layers": 0,
                               "train.instances_per_stage": 8}, env={})
    run = tmp_path / "run"
    rt = runtime(settings, run)
    state: dict = {"config": {"levels": {"0": 0.5, "2": 0.5}}}
    state.update(apply(state, rt))
    rows = [json.loads(x) for x in (run / "stage_0" / "train.jsonl").read_text().splitlines()]
    assert Counter(r["member"] for r in rows) == {0: 4, 1: 4}
    state.update(train_stage(state, rt))
    assert state["train_metrics"]["train/steps"] == 1
    state.update(evaluate(state, rt))
    assert set(state["metrics"]["by_level"]) == {"0", "1", "2", "3"}  # every (task, level) pair evaluated
    state.update(summarize_failures(state, rt))
    assert f"{RLVE} L1: digit_num=3" in state["context"] and f"{RG} L0" in state["context"]
    engineer = ScriptedChat(['{"levels": {"9": 1.0}}', '{"levels": {"1": 0.25, "3": 0.75}, "rationale": "mix"}'])
    state.update(propose_config(state, rt, model=engineer))
    state.update(validate_config(state, rt))
    assert state["decision"] == "retry" and "not a level; allowed: 0-3" in state["feedback"][0]
    state.update(propose_config(state, rt, model=engineer))
    state.update(validate_config(state, rt))
    assert state["decision"] == "accepted"
    state.update(apply(state, rt))
    rows = [json.loads(x) for x in (run / "stage_1" / "train.jsonl").read_text().splitlines()]
    assert Counter(r["member"] for r in rows) == {0: 2, 1: 6}
