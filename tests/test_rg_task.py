"""reasoning-gym datasets as a task family (`env/rg.py`), for real: generation from a config, prompts, the dataset's
own scorer with the failure labels, strict refusals in one line, the engineer's prompt generated from the dataset's
curriculum, and a smoke loop of `python -m graph.run` with `--task rg:...` end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from env.rg import MAX_LEVELS, SPLIT_SIZES, RgConfig, RgTaskError, parse_name
from families import level_share
from trainer.task import load_task

BA = "rg:basic_arithmetic:num_terms=2-3,num_digits=1-2"
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def task():
    return load_task(BA)


def test_levels_come_from_the_datasets_curriculum(task):
    assert [lv.label for lv in task.levels] == ["num_terms=2 num_digits=1", "num_terms=2 num_digits=2",
                                               "num_terms=3 num_digits=1", "num_terms=3 num_digits=2"]
    whole = load_task("rg:basic_arithmetic")
    assert len(whole.levels) == 5 * 4  # num_terms 2-6 x num_digits 1-4
    assert parse_name("rg:gcd:num_terms=2,value=100-1000") == ("gcd", {"num_terms": ["2"], "value": ["100", "1000"]})


def test_generate_from_a_config_and_round_trip(task):
    items, stats = task.generate(RgConfig(levels={0: 0.25, 3: 0.75}), 8, seed=5)
    assert sorted(i.level for i in items) == [0, 0, 3, 3, 3, 3, 3, 3]
    assert stats["generated"] == {"0": 2, "3": 6}
    for it in items:
        assert it.metadata["num_terms"] == (2 if it.level == 0 else 3)
        assert task.item_from_json(task.item_to_json(it)) == it
        assert task.prompt(it)[-1]["content"].startswith(it.question)
    again, _ = task.generate(RgConfig(levels={0: 0.25, 3: 0.75}), 8, seed=5)
    assert [i.id for i in again] == [i.id for i in items]  # the same config and seed: the same questions
    held_out = task.split_questions()
    assert not held_out & {i.question for i in items}


def test_fixed_splits_cover_every_level_and_do_not_overlap(task):
    val, test = task.split("val"), task.split("test")
    assert len(val) == SPLIT_SIZES["val"] * len(task.levels) and len(test) == SPLIT_SIZES["test"] * len(task.levels)
    assert {i.level for i in val} == {i.level for i in test} == set(range(len(task.levels)))
    assert not {i.question for i in val} & {i.question for i in test}
    assert [i.id for i in load_task(BA).split("val")] == [i.id for i in val]


def test_the_datasets_own_scorer_judges_answers(task):
    it = task.split("val")[0]
    assert task.verify(it, task.gold(it)) == (True, None, 1.0, True)
    assert task.verify(it, f"  {task.gold(it)}\nbecause ...").valid  # the first non-empty line is the answer
    assert task.verify(it, str(int(task.gold(it)) + 1)).label == "wrong"
    assert task.verify(it, "   ").label == "no_answer"
    partial = task.verify(it, f"x = {task.gold(it)}")  # reasoning-gym's partial credit: the gold inside the answer
    assert partial.label == "partial" and 0 < partial.score < 1 and not partial.valid


def test_bad_names_attributes_levels_and_configs_are_refused_in_one_line(task):
    cases = {
        "rg:no_such_dataset": "unknown reasoning-gym dataset 'no_such_dataset'; allowed: .*basic_arithmetic",
        "rg:basic_arithmetic:depth=2": "has no attribute 'depth'; allowed: num_terms, num_digits",
        "rg:basic_arithmetic:num_terms=9": r"num_terms=9 is not one of its levels; allowed: 2, 3, 4, 5, 6",
        "rg:chain_sum": rf"110 cells, more than {MAX_LEVELS}.*narrow it",
    }
    for name, msg in cases.items():
        with pytest.raises(RgTaskError, match=msg) as e:
            load_task(name)
        assert "\n" not in str(e.value)
    for raw, msg in [({"levels": {"4": 1.0}}, "'4' is not a level; allowed: 0-3"),
                     ({"levels": {"0": 0.5}}, "sum to 0.5"),
                     ({"levels": {"0": 1.5, "1": -0.5}}, r"allowed: a share in \[0, 1\]"),
                     ({"levels": {"0": 1.0}, "hole_ratio": 0.1}, "unknown key.*hole_ratio")]:
        checked = level_share.check(task, raw, 8, repair=False)
        cfg, errors = checked.config, checked.errors
        assert cfg is None and len(errors) == 1 and "\n" not in errors[0]
        assert __import__("re").search(msg, errors[0]), errors[0]
    assert task.project({"levels": {"0": 3, "1": 1, "9": 5}}).levels == {0: 0.75, 1: 0.25}


def test_the_engineer_prompt_names_the_datasets_levels_and_no_mapf_words(task):
    text = level_share.system_prompt(task)
    assert "num_terms" in text and "num_digits" in text and "| 3 | 3 | 2 |" in text
    assert "Number of terms in the expression" in text  # the curriculum's own description
    for word in ("agent", "grid", "hole", "wait", "makespan", "MAPF", "FrozenLake"):
        assert word.lower() not in text.lower(), word


@pytest.mark.slow
def test_a_smoke_loop_on_a_reasoning_gym_task_runs_end_to_end(tmp_path):
    """`python -m graph.run --task rg:... --engineer learnability`: 2 stages on the embedded model, the report."""
    env = {**os.environ, "PRESET": "smoke", "PYTHONPATH": str(ROOT)}
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "graph.run", "--task", "rg:basic_arithmetic:num_terms=2,num_digits=1-2",
           "--engineer", "learnability", "--run-dir", str(run), "--eval-limit", "4", "--final-limit", "4"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    settings = json.loads((run / "settings.json").read_text())
    assert settings["task"].startswith("rg:basic_arithmetic") and settings["eval_split"] == "val"
    for k in (0, 1):
        rows = [json.loads(x) for x in (run / f"stage_{k}" / "eval.jsonl").read_text().splitlines()]
        assert len(rows) == 4 and {r["size"] for r in rows} == {0, 1}  # both levels, the cap spread over them
        assert (run / f"stage_{k}" / "checkpoint" / "trainer_meta.json").is_file()
    assert "## F. Results on the validation set" in (run / "stage_0" / "summary.md").read_text()
    validation = json.loads((run / "stage_0" / "validation.json").read_text())
    assert validation["final"] == "accepted"
    assert json.loads((run / "stage_1" / "config.json").read_text())["levels"] == validation["decisions"][-1][
        "accepted"]["levels"]
    final = json.loads((run / "final" / "metrics.json").read_text())
    assert final["final/n"] > 0 and (run / "report.md").is_file()


def test_every_classic_curriculum_answers_a_config_that_passes_the_strict_check(task):
    import random

    by_level = {str(lv.index): {"valid_rate": v} for lv, v in zip(task.levels, (0.9, 0.5, 0.3, 0.0), strict=True)}
    for name in ("fixed", "random", "learnability", "threshold"):
        raw, why, _ = level_share.classic(name, task, {"levels": {"0": 0.5, "1": 0.5}}, by_level, {}, random.Random(1))
        checked = level_share.check(task, raw, 16)
        assert (checked.how, checked.config) == ("accepted", task.parse_config(raw, 16).model_dump(mode="json")), name
