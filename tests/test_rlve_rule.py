"""RLVE's rule as a classic curriculum (`ENGINEER=rlve`, families/rlve_rule.py): with scripted rates it steps one
level at a valid rate of 0.9 over 8 prompts and not below, trains on the last 4 levels reached, works over level
shares and over MAPF's grid sizes, and a run killed at the `--approve` prompt resumes at the level it reached."""

from __future__ import annotations

import io
import json
import random
import sys

import pytest

import graph.graph as gg
from env import EnvConfig
from families import family_of
from families.rlve_rule import ACCURACY, MEMORY_KEY, MIN_PROMPTS, WINDOW, rlve_step
from graph import loop, progress
from graph.settings import build_settings
from llm_backends.engineers import CLASSIC_ENGINEERS
from trainer.files import stage_dir

LEVELS = [0, 1, 2, 3, 4, 5, 6]


def rates(level, p, n=16):
    return {str(level): {"n": n, "valid_rate": p}}


def test_the_constants_are_rlve_s_and_the_name_is_a_classic_engineer():
    assert (ACCURACY, MIN_PROMPTS, WINDOW) == (0.9, 8, 4) and "rlve" in CLASSIC_ENGINEERS


@pytest.mark.parametrize(("p", "n", "reached"), [
    (0.9, 8, 1),  # at the bar over exactly the fewest prompts: up one level
    (1.0, 16, 1),
    (0.89, 16, 0),  # below the bar: stay
    (1.0, 7, 0),  # too few prompts: stay
])
def test_it_steps_at_0_9_over_8_prompts_and_not_below(p, n, reached):
    window, why, memory = rlve_step(LEVELS, rates(0, p, n), {})
    assert memory == {MEMORY_KEY: reached} and window == LEVELS[: reached + 1]
    assert ("step up to level 1" in why) == (reached == 1)


def test_only_the_level_reached_counts_and_the_window_is_the_last_4_levels_reached():
    memory, windows = {}, []
    for _ in range(6):  # every level passes: one step a check, never two
        by_level = {str(lv): {"n": 16, "valid_rate": 1.0} for lv in LEVELS}
        window, _, memory = rlve_step(LEVELS, by_level, memory)
        windows.append(window)
    assert windows == [[0, 1], [0, 1, 2], [0, 1, 2, 3], [1, 2, 3, 4], [2, 3, 4, 5], [3, 4, 5, 6]]
    window, why, memory = rlve_step(LEVELS, rates(6, 1.0), memory)  # the last level: stay there
    assert memory[MEMORY_KEY] == 6 and window == [3, 4, 5, 6] and "last level" in why
    # a lower level's rate never moves it: the level reached is 3, and it fails
    by_level = {"0": {"n": 16, "valid_rate": 1.0}, "3": {"n": 16, "valid_rate": 0.5}}
    assert rlve_step(LEVELS, by_level, {MEMORY_KEY: 3})[2] == {MEMORY_KEY: 3}


def test_it_resumes_at_the_level_reached_and_follows_the_task_s_own_level_order():
    window, _, memory = rlve_step([0, 1, 3, 8], rates(3, 0.95), {MEMORY_KEY: 3, "other": "kept"})
    assert memory == {MEMORY_KEY: 8, "other": "kept"} and window == [0, 1, 3, 8]
    with pytest.raises(ValueError, match=r"engineer memory rlve_reached=5 is not a level of this task; allowed: 0, 1"):
        rlve_step([0, 1], {}, {MEMORY_KEY: 5})


def test_the_level_share_family_trains_the_window_in_equal_shares():
    family = family_of("rlve:Multiplication:levels=6")
    raw, why, memory = family.classic("rlve", {"levels": {"0": 1.0}}, rates(2, 0.9), {MEMORY_KEY: 2}, random.Random(0))
    assert raw == {"levels": {"0": 0.25, "1": 0.25, "2": 0.25, "3": 0.25}} and memory == {MEMORY_KEY: 3}
    assert family.check(raw, {}, build_settings({"preset": "smoke", "engineer": "rlve",
                                                 "task": "rlve:Multiplication:levels=6"}, env={}),
                        seed=0, repair=False).how == "accepted"
    assert why.startswith("rlve: level 2: accuracy 0.90 >= 0.9 over 16 prompts: step up to level 3")


def test_over_mapf_grid_sizes_it_moves_the_data_and_keeps_holes_and_waits():
    family = family_of("mapf")
    config = EnvConfig.model_validate(
        {"sizes": {str(s): {"data_ratio": 0.125, "hole_ratio": 0.2, "wait_ratio": 0.3} for s in range(3, 11)}})
    raw, _, memory = family.classic("rlve", config.model_dump(), rates(3, 0.95), {}, random.Random(0))
    checked = EnvConfig.model_validate(raw)  # the strict check: no projection needed
    assert {s: k.data_ratio for s, k in checked.sizes.items() if k.data_ratio} == {3: 0.5, 4: 0.5}
    assert {k.hole_ratio for k in checked.sizes.values()} == {0.2} and memory == {MEMORY_KEY: 4}


# ----------------------------------------------------------------------------- a run resumed at the level reached

TASK = "rlve:Multiplication:levels=5"


def test_a_run_killed_at_the_approve_prompt_resumes_at_the_level_it_reached(tmp_path, monkeypatch):
    """The real apply, propose_config (the rlve engineer) and validate_config on the RLVE task; training and
    evaluation scripted: every level scores 0.95 over 16 prompts, so each check steps up one level. The process
    dies at the --approve prompt after stage 0 (end of input); the resumed run goes on from the level reached."""

    def train_stage(state, runtime):
        return {"checkpoint": str(stage_dir(runtime.context.run_dir, state["stage"]) / "checkpoint"),
                "train_metrics": {"train/reward_mean": 0.1}, "log": ["trained"]}

    def evaluate(state, runtime):
        by_level = {str(lv): {"n": 16, "valid_rate": 0.95} for lv in range(5)}
        return {"metrics": {"eval/valid_rate": 0.95, "by_level": by_level}}

    for name, fn in dict(train_stage=train_stage, evaluate=evaluate,
                         summarize_failures=lambda s, r: {"context": "evidence"},
                         final_evaluate=lambda s, r: {"final_metrics": {"final/valid_rate": 0.95}},
                         report=lambda s, r: {"log": ["report"]}).items():
        monkeypatch.setattr(gg, name, fn)
    settings = build_settings({"task": TASK, "engineer": "rlve", "stages": "4", "approve": "true",
                               "start_config": json.dumps({"levels": {"0": 1.0}})}, {"PRESET": "smoke"})
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    settings = settings.model_copy(update={"run_dir": run_dir})
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    with pytest.raises(progress.RunError, match="standard input"):
        loop.run_graph(run_dir, settings, resume=False)
    assert not (run_dir / "stage_1").exists()
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n" * 3))
    loop.run_graph(run_dir, settings, resume=True)

    def levels(k):
        return sorted(int(lv) for lv in json.loads((stage_dir(run_dir, k) / "config.json").read_text())["levels"])

    assert [levels(k) for k in range(4)] == [[0], [0, 1], [0, 1, 2], [0, 1, 2, 3]]
    first = (stage_dir(run_dir, 1) / "engineer_reply.md").read_text()
    assert "step up to level 2" in first  # the stage after the resume went on from level 1
