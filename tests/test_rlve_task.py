"""RLVE-Gym environments as a task family (`env/rlve/`), for real on the installed rlve-gym: levels from each
environment's own parameter controller, generation from a config, the environment's prompt, its own scorer with
the failure labels, fixed splits, levels dropped when the generator times out, and refusals in one line."""

from __future__ import annotations

import random
import time

import pytest

import env.rlve as rlve
from env.rg import RgConfig
from env.rlve import SPLIT_SIZES, RlveTask, RlveTaskError
from families import family_of
from graph.settings import SettingsError, build_settings
from trainer.task import load_task

# three lever shapes: one parameter set per step (digits), many sets per step (N fixed, M over a range), and two
# parameters of which one is a float swept within the step; each with a wrong answer made from the reference and
# the label the environment's scorer gives it (a flipped 2-SAT assignment satisfies some clauses: partial credit)
FLIP = str.maketrans("01", "10")
SHAPES = {
    "rlve:multiplication:levels=3": ("digit_num=2", lambda ref: str(int(ref) + 1), "wrong"),
    "rlve:TwoSAT:levels=3": ("N=3 M=3-15", lambda ref: ref.translate(FLIP), "partial"),
    "rlve:Binario:levels=3": ("MAX_N_M=2 sparsity=0.1-0.9", lambda ref: ref.translate(FLIP), "wrong"),
}


@pytest.fixture(scope="module", params=sorted(SHAPES))
def task(request):
    return load_task(request.param)


def test_levels_are_the_controller_s_steps_labelled_with_its_parameters(task):
    first_label, _, _ = SHAPES[task.name]
    assert [lv.index for lv in task.levels] == [0, 1, 2] and task.levels[0].label == first_label
    controller = rlve.registry()[1][task.environment]()  # the package's own controller, stepped here
    for lv in task.levels:
        assert list(lv.params) == controller.get_parameter_list()
        controller.update()


def test_generate_from_a_config_render_the_prompt_and_score_with_the_environment_s_own_scorer(task):
    _, wrong, label = SHAPES[task.name]
    items, figures = task.generate(RgConfig(levels={0: 0.25, 2: 0.75}), 8, seed=3)
    assert sorted(i.level for i in items) == [0, 0, 2, 2, 2, 2, 2, 2] and figures["generated"] == {"0": 2, "2": 6}
    again, _ = task.generate(RgConfig(levels={0: 0.25, 2: 0.75}), 8, seed=3)
    assert [i.id for i in again] == [i.id for i in items]  # the same config and seed: the same problems
    labels = []
    for it in items:
        back = task.item_from_json(task.item_to_json(it))
        assert back == it and back.parameter == it.parameter
        text = task.prompt(back)[0]["content"]
        assert text.startswith(it.prompt) and text.endswith(rlve.ANSWER_HINT)
        env = task.environment_of(back)  # the environment, set to the problem, writes the same prompt
        assert env.prompt_generator() == it.prompt
        assert task.verify(back, task.gold(back)) == (True, None, 1.0, True)
        verdict = task.verify(back, f"<answer>{wrong(task.reference(back))}</answer>")
        labels.append(verdict.label)
        assert verdict == (False, label, 0.0, False) or (verdict.valid and label == "partial")  # another solution
        assert task.verify(back, "I think it is 12").label == "wrong_format"  # no answer markers
    assert labels.count(label) >= 6


def test_an_out_of_range_level_is_refused_in_one_line(task):
    with pytest.raises(ValueError, match=r"^levels: '3' is not a level; allowed: 0, 1, 2$"):
        task.parse_config({"levels": {"3": 1.0}})
    with pytest.raises(RlveTaskError, match=r"level 7: allowed: 0, 1, 2$"):
        task.level_items(7, 2, seed=0)
    assert task.project({"levels": {"1": 2.0, "9": 1.0}}).levels == {1: 1.0}


def test_fixed_splits_cover_every_level_are_seeded_and_disjoint_from_training():
    task = load_task("rlve:multiplication:levels=3")
    val, test = task.split("val"), task.split("test")
    for split, name in ((val, "val"), (test, "test")):
        assert [sum(1 for i in split if i.level == lv) for lv in (0, 1, 2)] == [SPLIT_SIZES[name]] * 3
    assert not {i.prompt for i in val} & {i.prompt for i in test}
    assert [i.id for i in RlveTask("rlve:multiplication:levels=3").split("val")] == [i.id for i in val]
    items, _ = task.generate(RgConfig(levels={0: 1.0}), 64, seed=SPLIT_SIZES["val"])
    assert len(items) == 64 and not {i.prompt for i in items} & task.split_prompts()
    with pytest.raises(RlveTaskError, match="split 'train': allowed for rlve tasks: val, test"):
        task.split("train")


def test_the_environment_s_seeding_leaves_the_process_random_state_alone():
    import numpy as np
    import torch

    random.seed(11), np.random.seed(11), torch.manual_seed(11)
    want = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    random.seed(11), np.random.seed(11), torch.manual_seed(11)
    load_task("rlve:TwoSAT:levels=3").level_items(1, 3, seed=99)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == want


def test_an_environment_without_a_reference_answer_has_no_gold_and_no_warm_start():
    task = RlveTask("rlve:WIL:levels=2")
    it = task.split("val")[0]
    assert task.gold(it) == "" and task.reference(it) is None
    with pytest.raises(RlveTaskError, match="keeps no reference answer .* allowed: train.sft_warm_start=false"):
        task.warm_start_items(None, 4, seed=0)
    warm = load_task("rlve:multiplication:levels=3").warm_start_items(None, 6, seed=0)
    assert {i.level for i in warm} == {0, 1, 2}


def test_a_level_whose_generator_times_out_is_dropped_with_a_note_and_none_left_is_refused(monkeypatch):
    # The package's generator gives up after its timeout (a thread it cannot stop) and returns False: here levels
    # from 2 up take longer than the timeout, deterministically, whatever the machine's load.
    monkeypatch.setattr(rlve, "GENERATE_TIMEOUT_S", 0.05)
    real = RlveTask.problem

    def slow_from_level_2(self, level, seed):
        index = level if isinstance(level, int) else level.index
        if index >= 2:
            time.sleep(0.06)
            return None
        return real(self, level, seed)

    monkeypatch.setattr(RlveTask, "problem", slow_from_level_2)
    task = RlveTask("rlve:CountdownClose:levels=4")
    assert [lv.index for lv in task.levels] == [0, 1]
    assert task.notes[0].startswith("level 2 (") and "the generator timed out" in task.notes[0]
    assert task.notes[1] == "level 3 dropped: harder than level 2, which timed out"
    assert "Note: level 2" in task.describe_levels()
    monkeypatch.setattr(RlveTask, "problem", lambda self, level, seed: time.sleep(0.06))  # every level times out
    name = "FractionalProgramming_BipartiteGraphMatching"
    with pytest.raises(RlveTaskError, match=rf"^task 'rlve:{name}:levels=2': RLVE environment {name} generates no "
                                            r"problem at any of its first 2 levels \(level 0 \(.*timed out"):
        RlveTask(f"rlve:{name}:levels=2")


@pytest.mark.parametrize(("name", "message"), [
    ("rlve:multiplicaton", "unknown RLVE environment 'multiplicaton'; allowed: one of the 400 environments of "
                           "rlve-gym (python -m env.rlve --list); close: Multiplication"),
    ("rlve:Multiplication:levels=0", "'levels=0': allowed: levels=N with N from 1 to 16"),
    ("rlve:Multiplication:depth=3", "'depth=3': allowed: levels=N with N from 1 to 16"),
    ("rlve:PolyaModel", "RLVE environment PolyaModel cannot be used: its scorer reads the whole output"),
])
def test_bad_names_are_refused_in_one_line_through_the_settings(name, message):
    with pytest.raises(SettingsError) as e:
        build_settings({"task": name, "preset": "smoke", "engineer": "rlve"}, env={})
    assert message in str(e.value) and "\n" not in str(e.value).strip()


def test_a_run_on_an_rlve_task_is_served_by_the_level_share_family():
    s = build_settings({"task": "rlve:Multiplication:levels=3", "preset": "smoke", "engineer": "rlve"}, env={})
    family = family_of(s)
    assert (s.eval_split, s.final_split, family.shape.key) == ("val", "test", "levels")
    assert [lv["label"] for lv in family.report_levels()] == ["digit_num=2", "digit_num=3", "digit_num=4"]
    assert "| 1 | digit_num=3 |" in family.system_prompt(s) and "Multiplication" in family.system_prompt(s)


def test_the_list_command_names_every_environment_and_shows_the_refused_ones(capsys):
    from env.rlve.check import main

    main(["--list"])
    out = capsys.readouterr().out.splitlines()
    assert len(out) == len(rlve.registry()[0]) + 1 == 401
    polya = next(ln for ln in out if ln.startswith("PolyaModel "))
    assert "polya_model" in polya and "refused: its scorer reads the whole output" in polya
    assert next(ln for ln in out if ln.startswith("Multiplication ")).endswith(" ok")
    assert out[-1] == f"400 environments, {len(rlve.REFUSED)} refused"


def test_every_environment_generates_and_its_own_scorer_accepts_the_reference_and_rejects_junk(monkeypatch):
    """The whole installed rlve-gym at its first level (`python -m env.rlve --check`); an environment that fails is
    one of `REFUSED`, and each of those still fails for the reason it is refused for."""
    from env.rlve.check import check_all, check_environment

    results = check_all(levels=2)
    assert len(results) == 400
    failing = {r["environment"]: r["problems"] for r in results if not r["ok"]}
    assert set(failing) == set(rlve.REFUSED), failing
    assert sum(1 for r in results if r["reference"]) >= 300  # most environments keep a reference answer
    monkeypatch.setattr(rlve, "REFUSED", {})
    polya = check_environment("PolyaModel", 1)
    assert polya["problems"][0].startswith("level 0: the reference answer") and "scores wrong_format" in polya["problems"][0]
