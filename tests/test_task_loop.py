"""The loop reaches a task family only through the task seam: a toy task defined in the tests (adding numbers, no
MAPF) runs apply -> train_stage (one tiny step) -> evaluate -> summarize_failures -> a scripted engineer ->
validate_config, and the classic curricula and the engineer's prompt work on its levels."""

from __future__ import annotations

import json
import random

import pytest

from families import family_of
from families import level_share as task_loop
from graph.settings import SettingsError, build_settings
from tests.support.node_helpers import ScriptedChat, runtime
from tests.support.tiny_llama import save_tiny_llama
from tests.support.toy_task import ToyTask

TOY = "tests.support.toy_task:ToyTask"


def toy_settings(**over):
    cli = {"task": TOY, "preset": "smoke", "engineer": "self", "eval_limit": None, "final_limit": None,
           "engineer_max_attempts": 2, **over}
    return build_settings(cli, env={})


def test_a_toy_task_gets_its_own_splits_and_bad_splits_are_refused():
    s = toy_settings()
    assert (s.task, s.eval_split, s.final_split, family_of(s).shape.key) == (TOY, "val", "test", "levels")
    with pytest.raises(SettingsError, match="eval_split='val-mini' is not a split of task .*allowed: val, test"):
        toy_settings(eval_split="val-mini")


def test_the_engineer_prompt_describes_the_task_levels_and_no_mapf():
    task = ToyTask()
    text = task_loop.system_prompt(task)
    assert "1-digit terms" in text and "3-digit terms" in text and "toy-add" in text
    for word in ("agent", "grid", "hole", "wait", "MAPF", "FrozenLake"):
        assert word.lower() not in text.lower()
    schema = task_loop.answer_schema(task)
    assert set(schema["properties"]["levels"]["properties"]) == {"1", "2", "3"}


def test_the_nodes_reach_a_run_s_task_through_one_family_with_every_member():
    from families import LoopFamily
    from families.mapf import MapfFamily

    mapf, toy = family_of(build_settings({"preset": "smoke", "engineer": "fixed"}, env={})), family_of(toy_settings())
    assert isinstance(mapf, MapfFamily) and isinstance(toy, task_loop.LevelShareFamily)
    assert (mapf.task.name, toy.task.name) == ("mapf", "toy-add") and family_of(TOY) is toy
    members = set(LoopFamily.__annotations__) | {m for m in vars(LoopFamily) if not m.startswith("_")}
    assert {"check", "read_reply", "diff", "table", "shape"} <= members
    for family in (mapf, toy):
        assert not [m for m in members if not hasattr(family, m)]
    assert (mapf.shape.key, toy.shape.key) == ("sizes", "levels")
    assert toy.split("val") == ToyTask().split("val") and toy.eval_key_fields() == {"task": TOY}
    assert [lv["index"] for lv in toy.report_levels()] == [1, 2, 3]
    assert [lv["column"] for lv in mapf.report_levels()] == [f"{s}x{s}" for s in range(3, 11)]
    with pytest.raises(ValueError, match="cannot import"):
        family_of("no_such_module:Task")


def test_extraction_and_validation_of_level_shares():
    task = ToyTask()
    family = family_of(TOY)
    got = family.read_reply('Shift up.\n{"levels": {"2": 0.5, "3": 0.5}, "rationale": "harder"}', None, None)
    assert got.config == {"levels": {"2": 0.5, "3": 0.5}} and got.rationale == "harder" and got.error is None
    assert family.read_reply('{"1": 1.0}', None, None).config == {"levels": {"1": 1.0}}
    assert family.read_reply("no json here", None, None).error == "no JSON object in the reply (12 characters)"
    checked = task_loop.check(task, {"levels": {"9": 1.0}}, 8, repair=False)
    assert checked.config is None and "9" in checked.errors[0] and "allowed: 1, 2, 3" in checked.errors[0]
    assert task_loop.check(task, {"levels": {"1": 0.2, "2": 0.2}}, 8, repair=False).config is None
    assert task_loop.check(task, {"levels": {"1": 0.5, "2": 0.5}}, 8).config["levels"] == {"1": 0.5, "2": 0.5}
    # off only by rounding: normalised, whatever the attempt; outside the legal space: projected only when allowed
    rounded = task_loop.check(task, {"levels": {"1": 0.333, "2": 0.333, "3": 0.333}}, 8, repair=False)
    assert rounded.how == "normalised" and rounded.config["levels"] == pytest.approx({"1": 1 / 3, "2": 1 / 3, "3": 1 / 3})
    assert rounded.notes == ["levels: shares summed to 0.999; normalised to sum to 1"]
    pct = task_loop.check(task, {"levels": {"1": 25, "3": 75}}, 8, repair=False)
    assert pct.how == "normalised" and pct.config["levels"] == {"1": 0.25, "3": 0.75}
    projected = task_loop.check(task, {"levels": {"1": 2, "2": 1}}, 8, repair=True)
    assert projected.how == "projected" and projected.config["levels"] == pytest.approx({"1": 2 / 3, "2": 1 / 3})


def test_validation_records_the_level_shares_that_moved_and_the_progress_line_names_them(tmp_path):
    """validation.json's `diff` for a level-share task is old -> new per level that moved (a level a config leaves
    out at share 0), as MAPF's is per size; the terminal's "engineer proposal" line words it."""
    from graph.progress import describe_update
    from nodes.validate_config import validate_config

    settings = toy_settings(engineer="fixed")
    rt = runtime(settings, tmp_path / "run")
    state = {"stage": 0, "config": {"levels": {"1": 0.5, "2": 0.5}, "num_instances": 8}, "attempts": 1,
             "proposal": {"levels": {"2": 0.25, "3": 0.75}}, "rationale": "harder"}
    update = validate_config(state, rt)
    record = json.loads((tmp_path / "run" / "stage_0" / "validation.json").read_text())["decisions"][-1]
    assert update["decision"] == record["decision"] == "accepted"
    assert record["diff"] == {"1": {"share": {"from": 0.5, "to": 0.0}}, "2": {"share": {"from": 0.5, "to": 0.25}},
                              "3": {"share": {"from": 0.0, "to": 0.75}}}
    assert update["log"][0] == "stage 0: validation attempt 1: accepted (3 level(s) changed)"
    line = describe_update("validate_config", update, {**state, **update}, settings)
    assert line == "[stage 0] engineer proposal: accepted (level 1 share .50->.00, level 2 share .50->.25, " \
                   "level 3 share .00->.75)", line
    # the same shares again: nothing moved
    same = {**state, "proposal": {"levels": {"1": 0.5, "2": 0.5}}, "attempts": 2}
    update = validate_config(same, rt)
    assert json.loads((tmp_path / "run" / "stage_0" / "validation.json").read_text())["decisions"][-1]["diff"] == {}
    assert describe_update("validate_config", update, {**same, **update}, settings).endswith("(no change)")


class GappedTask(ToyTask):
    """The toy task with non-consecutive level numbers: 3, 5, 8 (digits 1, 2, 3)."""

    levels = [type(ToyTask.levels[0])(n, f"level {n}") for n in (3, 5, 8)]


def test_threshold_steps_to_the_next_level_in_the_task_s_own_order():
    task = GappedTask()
    by = {"3": {"valid_rate": 0.9}, "5": {"valid_rate": 0.8}, "8": {"valid_rate": 0.9}}
    up, why, _ = task_loop.classic("threshold", task, {"levels": {"3": 0.5, "5": 0.5}}, by, {}, random.Random(0))
    assert up == {"levels": {"3": 0.25, "5": 0.5, "8": 0.25}} and "[3, 5]" in why
    top, why, _ = task_loop.classic("threshold", task, {"levels": {"8": 1.0}}, by, {}, random.Random(0))
    assert top == {"levels": {"8": 1.0}} and "unchanged" in why  # the last level has no next one


def test_a_level_share_task_missing_a_member_is_refused_in_one_line_when_settings_are_built(tmp_path, monkeypatch):
    """The level-share members are a checked protocol: a task without `random_config` is refused when the settings
    are built (before any work), in one line naming the member, not with an AttributeError in apply."""
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "half_task.py").write_text(
        "from tests.support.toy_task import ToyTask\n\n\n"
        "class NoRandom:\n"
        "    def __getattr__(self, name):\n"
        "        if name == 'random_config':\n"
        "            raise AttributeError(name)\n"
        "        return getattr(ToyTask(), name)\n")
    with pytest.raises(SettingsError) as e:
        build_settings({"task": "half_task:NoRandom", "preset": "smoke", "engineer": "fixed"}, env={})
    assert "\n" not in str(e.value) and "has no `random_config`" in str(e.value), str(e.value)


def test_classic_curricula_move_level_shares():
    task = ToyTask()
    cfg = {"levels": {"1": 1.0}}
    by = {"1": {"valid_rate": 0.9}, "2": {"valid_rate": 0.5}, "3": {"valid_rate": 0.0}}
    rng = random.Random(0)
    fixed, _, mem = task_loop.classic("fixed", task, cfg, by, {}, rng)
    assert fixed == {"levels": {"1": 1.0}} and mem["fixed_config"] == fixed
    up, why, _ = task_loop.classic("threshold", task, cfg, by, {}, rng)
    assert up == {"levels": {"1": 0.5, "2": 0.5}} and "passed" in why
    learn, _, _ = task_loop.classic("learnability", task, cfg, by, {}, rng)
    assert max(learn["levels"], key=learn["levels"].get) == "2"
    assert task.parse_config(learn, 8) and task.parse_config(up, 8)
    assert task.parse_config(task_loop.classic("random", task, cfg, by, {}, rng)[0], 8)


@pytest.mark.slow
def test_a_toy_task_runs_apply_train_evaluate_summarize_propose_validate(embedded_model_path, tmp_path, monkeypatch):

    from nodes.apply import apply
    from nodes.evaluate import evaluate
    from nodes.propose_config import propose_config
    from nodes.summarize_failures import summarize_failures
    from nodes.train_stage import train_stage
    from nodes.validate_config import validate_config

    monkeypatch.setenv("ENV_ENGINEER_CACHE", str(tmp_path / "cache"))  # the tiny model's warm start stays here
    base = save_tiny_llama(tmp_path / "base", embedded_model_path)
    settings = toy_settings(policy_model=str(base), policy_backend="transformers", eval_max_tokens=8,
                            **{"train.max_steps": 1, "train.max_completion_length": 8, "train.train_layers": 0,
                               "train.instances_per_stage": 8, "train.prompt_style": "compact"})
    run = tmp_path / "run"
    rt = runtime(settings, run)
    state: dict = {"config": {"levels": {"1": 0.5, "2": 0.5}}}

    state.update(apply(state, rt))
    items = [json.loads(x) for x in (run / "stage_0" / "train.jsonl").read_text().splitlines()]
    assert len(items) == 8 and sorted({i["digits"] for i in items}) == [1, 2]

    state.update(train_stage(state, rt))
    meta = json.loads((run / "stage_0" / "checkpoint" / "trainer_meta.json").read_text())
    assert meta["task"] == "toy-add" and state["train_metrics"]["train/steps"] == 1

    state.update(evaluate(state, rt))
    rows = [json.loads(x) for x in (run / "stage_0" / "eval.jsonl").read_text().splitlines()]
    assert len(rows) == len(ToyTask().split("val")) == state["metrics"]["eval/n"]
    assert {r["level"] for r in rows} <= {1, 2, 3} and set(state["metrics"]["by_level"]) == {str(r["level"]) for r in rows}
    assert set(state["metrics"]["by_level"]["1"]["failures"]) == {"no_answer", "wrong"}  # the task's own labels

    state.update(summarize_failures(state, rt))
    assert "| digits |" in state["context"] and "1-digit terms" in state["context"]
    assert "agent" not in state["context"].lower()

    engineer = ScriptedChat(['{"levels": {"7": 1.0}}', '{"levels": {"2": 0.25, "3": 0.75}, "rationale": "harder"}'])
    state.update(propose_config(state, rt, model=engineer))
    state.update(validate_config(state, rt))
    assert state["decision"] == "retry" and "not a level" in state["feedback"][0]
    state.update(propose_config(state, rt, model=engineer))
    assert "not a level" in engineer.calls[-1][0][1]["content"]  # the error went back to the engineer
    state.update(validate_config(state, rt))
    assert state["decision"] == "accepted" and state["accepted"]["levels"] == {"2": 0.25, "3": 0.75}

    state.update(apply(state, rt))
    items = [json.loads(x) for x in (run / "stage_1" / "train.jsonl").read_text().splitlines()]
    assert state["stage"] == 1 and sorted(i["digits"] for i in items) == [2, 2, 3, 3, 3, 3, 3, 3]
    assert state["history"][0]["metrics"]["eval/n"] == len(rows)
