"""reasoning-gym datasets as a task family (`env/rg.py`), for real: generation from a config, prompts, the dataset's
own scorer with the failure labels, strict refusals in one line, the engineer's prompt generated from the dataset's
curriculum, and a smoke loop of `python -m graph.run` with `--task rg:...` end to end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from env.rg import ANSWER_HINT, MAX_LEVELS, SPLIT_SIZES, RgConfig, RgTaskError, parse_name
from env.rg_levels import RgLevels
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
        "rg:basic_arithmetic:num_terms=2-4,num_terms=2-3": "num_terms is given twice; allowed: each attribute once",
        "rg:basic_arithmetic:levels=full": "levels=full; allowed: levels=grid or levels=ladder",
        "rg:polynomial_multiplication:levels=grid": "its grid has 65,536 cells, more than 400; allowed: narrow it",
    }
    for name, msg in cases.items():
        with pytest.raises(RgTaskError, match=msg) as e:
            load_task(name)
        assert "\n" not in str(e.value)
    with pytest.raises(RgTaskError, match=r"level 4: allowed: 0-3") as e:
        task.level_items(4, 2, seed=0)
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
        assert len(rows) == 4 and {r["level"] for r in rows} == {0, 1}  # both levels, the cap spread over them
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


def test_a_large_grid_gets_a_default_ladder_and_the_grid_stays_available():
    chain = load_task("rg:chain_sum")  # 110 cells: a ladder of 8, every attribute stepping up together
    assert chain.kind == "ladder" and len(chain.levels) == 8 and chain._lv.grid_cells == 110
    steps = [[lv for _, lv in level.attr_levels] for level in chain.levels]
    assert steps[0] == [0, 0] and steps[-1] == [len(v) - 1 for v, _ in chain.attributes.values()]
    assert all(a <= b for lo, hi in zip(steps, steps[1:], strict=False) for a, b in zip(lo, hi, strict=True))  # never a step down
    narrowed = load_task("rg:chain_sum:num_terms=2-3,levels=grid")
    assert narrowed.kind == "grid" and len(narrowed.levels) == 2 * len(chain.attributes["num_digits"][0])
    assert len(load_task("rg:basic_arithmetic").levels) == 20 <= MAX_LEVELS  # 20 cells: the full grid
    zebra = RgLevels("rg:zebra_puzzles")  # 36 cells: too many questions to draw for its fixed splits
    assert zebra.grid_cells == 36 > MAX_LEVELS and zebra.kind == "ladder"
    assert RgLevels("rg:zebra_puzzles:levels=grid").kind == "grid"


def test_answers_are_extracted_bare_or_tagged_and_whole_where_they_span_lines(task):
    it = task.split("val")[0]
    gold = task.gold(it)
    assert ANSWER_HINT in task.prompt(it)[-1]["content"] and "<answer>" in ANSWER_HINT
    for text in (gold, f"<answer>{gold}</answer>", f"Let me think.\n<answer>\n{gold}\n</answer>",
                 f"<answer>0</answer> no, <answer>{gold}</answer>"):  # the last block counts
        assert task.verify(it, text).valid, text
    assert not task.verify(it, f"<answer>{gold}</answer> then <answer>{int(gold) + 1}</answer>").valid
    matrix = load_task("rg:rotate_matrix")
    m = matrix.draw(2, 1, seed=0, seen=set()).items[0]
    assert "\n" in matrix.gold(m)  # a matrix: every row is the answer, not the first line alone
    assert matrix.verify(m, matrix.gold(m) + "\nThat is the rotated matrix.").valid
    assert not matrix.verify(m, matrix.gold(m).splitlines()[0]).valid


def test_the_default_reward_is_validity_so_no_constant_answer_earns_reward_where_it_is_never_valid(task):
    from trainer.task import TaskReward

    items = task.split("val")
    raw = [task.item_to_json(i) for i in items]
    golds = {task.gold(i) for i in items}
    reward = TaskReward(task, "compact")
    scorer_credit = {}
    for constant in ("-10", "0", "1", "12", "x = 1", "-1"):
        never_valid = [i for i in items if not task.verify(i, constant).valid]
        got = reward(completions=[constant] * len(never_valid), item=[task.item_to_json(i) for i in never_valid])
        assert got == [0.0] * len(never_valid), constant
        scorer_credit[constant] = sum(task.verify(i, constant).score for i in never_valid)
    assert scorer_credit["-10"] > 0  # the scorer's own partial credit, which the default reward leaves out
    partial = TaskReward(task, "compact", partial_credit=0.5)  # the documented setting asks for it
    got = partial(completions=["-10"] * len(items), item=raw)
    assert max(got) > 0 and all(r == 1.0 or r <= 0.5 for r in got) and "-10" not in golds
    assert reward(completions=[task.gold(i) for i in items], item=raw) == [1.0] * len(items)
    with pytest.raises(ValueError, match="partial_credit 2: allowed: 0 <= partial_credit <= 1"):
        TaskReward(task, "compact", partial_credit=2)


def test_retries_draw_new_questions_and_a_level_short_of_them_says_so(capfd):
    one = load_task("rg:basic_arithmetic:num_terms=2,num_digits=1")  # thousands of questions, many repeats a draw
    items = one.warm_start_items(None, 1500, seed=0)
    assert len(items) == len({i.question for i in items}) == 1500  # retries from seeds hashed apart: all new
    assert not {i.question for i in items} & one.split_questions()
    mixed, figures = load_task(BA).generate(RgConfig(levels={0: 0.5, 1: 0.5}), 64, seed=1)
    assert len({i.question for i in mixed}) == 64 and figures["short"] == {}
    legs = load_task("rg:leg_counting")  # its first rung has about a hundred questions, most in its fixed splits
    got, figures = legs.generate(RgConfig(levels={0: 1.0}), 120, seed=0)
    assert len({i.question for i in got}) == len(got) < 120
    assert figures["short"] == {"0": 120 - len(got)} and figures["generated"] == {"0": len(got)}
    assert f"short of distinct questions: level 0 gave {len(got)} of 120" in capfd.readouterr().err


def test_metadata_survives_the_stored_item_so_arc_agi_scores_as_reasoning_gym_does():
    arc = load_task("rg:arc_agi:rotations_weights=0.3/0.2/0.3/0.2,mirrors_weights=0.3/0.3/0.2/0.1/0.1")
    assert len(arc.levels) == 1  # list-valued levels are named by their values joined with /
    item = arc.draw(0, 1, seed=0, seen=set()).items[0]
    stored = arc.item_from_json(arc.item_to_json(item))
    assert isinstance(stored.metadata["output"], tuple) and stored.metadata == item.metadata
    assert arc.verify(stored, arc.gold(stored)).valid
    flat = json.loads(json.dumps(item.metadata))  # tuples as lists: what a plain JSON round trip keeps
    assert arc.score(stored, arc.gold(stored)) == 1.0
    from dataclasses import replace

    assert arc.score(replace(stored, metadata=flat), arc.gold(stored)) < 1.0  # why the types must survive


def test_the_committed_reasoning_gym_answers_rescore_to_their_recorded_rates_and_labels():
    """evals/results/rg_candidates: the splits are regenerated from each task name (cached or not, the same ids),
    and every stored answer gets its recorded failure label back from the dataset's own scorer."""
    from evals.packed import names, read_text

    archive = ROOT / "evals" / "results" / "rg_candidates" / "answers.tar.xz"
    arms = [m for m in names(archive) if m.endswith(".json")]
    assert len(arms) >= 10
    for arm in arms:
        d = json.loads(read_text(f"{archive}:{arm}"))
        task = load_task(d["task"])
        by_id = {i.id: i for i in task.split("val")}
        for part in [d["start"], *d["seeds"].values()]:
            verdicts = [task.verify(by_id[a["id"]], a["answer"]) for a in part["answers"]]
            assert [v.label for v in verdicts] == [a["failure"] for a in part["answers"]], arm
            assert sum(v.valid for v in verdicts) / len(verdicts) == pytest.approx(part["valid_rate"]), arm


def test_a_narrowed_task_describes_only_its_own_range_to_the_engineer():
    narrowed = load_task("rg:basic_arithmetic:num_terms=2-4,num_digits=1-2")
    text = narrowed.describe_attributes()
    assert "(levels 2, 3, 4)" in text and "(levels 1, 2)" in text
    assert "5" not in text and "6" not in text  # the dataset's curriculum goes on to 6 terms: not this task's


def test_the_warm_start_draws_from_the_levels_it_is_given():
    task = load_task(BA)
    every = task.warm_start_items(None, 40, 3)
    assert [i.id for i in every] == [i.id for i in task.warm_start_items(list(range(len(task.levels))), 40, 3)]
    assert {i.level for i in task.warm_start_items([0, 2], 20, 3)} == {0, 2}


def test_a_level_check_that_runs_over_its_time_ends_even_where_sigterm_is_a_stop_request():
    """A stage's child process handles SIGTERM itself (a stop request). A forked level check that runs over its
    time is still ended there (the pool stops it with SIGTERM), instead of the task's load waiting for it."""
    script = ("import signal, time\n"
              "signal.signal(signal.SIGTERM, lambda *a: None)  # as trainer.child does: a stop request\n"
              "import env.rg_probe as rg\n"
              "def searching(dataset, cell):\n"
              "    time.sleep(60)\n"
              "rg.probe_cell, rg.PROBE_TIMEOUT_S = searching, 0.5\n"
              "t0 = time.monotonic()\n"
              "(cell, why), = rg.probe_cells('any', ['a cell'])\n"
              "print(f'{time.monotonic() - t0:.1f}', why)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=45)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # with its forked check: its SIGTERM is a stop request
        proc.communicate()
        pytest.fail("the load waited for a level check that ran over its time")
    seconds, why = out.split(" ", 1)
    assert proc.returncode == 0 and float(seconds) < 20 and "took over 0.5 s" in why, (out, err[-2000:])


def test_a_cell_whose_generator_is_slow_is_dropped_by_its_cpu_time_without_waiting_for_the_hard_stop(tmp_path,
                                                                                                     monkeypatch):
    """puzzle24 searches for a way to make 24: quick with numbers up to 6, over a second of CPU a question from 7 on.
    Those cells are dropped once their check has used its CPU budget, far sooner than the check's hard stop."""
    import time

    from env.rg_probe import PROBE_QUESTIONS, PROBE_TIMEOUT_S, QUESTION_CPU_S

    monkeypatch.setenv("ENV_ENGINEER_CACHE", str(tmp_path))  # no cached check
    t0 = time.monotonic()
    task = load_task("rg:puzzle24:value=5-8")
    assert [lv.label for lv in task.levels] == ["value=5-6"]
    note = (f"its generator took over {PROBE_QUESTIONS * QUESTION_CPU_S:g} s of CPU for {PROBE_QUESTIONS} questions; "
            f"allowed: {QUESTION_CPU_S:g} s a question")
    assert task.dropped == [f"value={v}: {note}" for v in ("6-7", "7-8", "8-9")]
    assert time.monotonic() - t0 < 3 * PROBE_TIMEOUT_S  # three checks stopped by their CPU budget, not the hard stop
    with pytest.raises(RgTaskError, match=r"every level of puzzle24 is dropped \(value=8-9: its generator took over ")\
            as e:
        load_task("rg:puzzle24:value=6-8")
    assert "\n" not in str(e.value)


def test_drawing_ahead_gives_the_plain_draw_and_the_parent_generates_only_what_the_workers_could_not_know():
    """`env.rg_data.Ahead`: each job drawn in a forked worker as if nothing were avoided, then the plain draw run
    over the recordings. Seeds 11 and 12 share 29 of their first 30 questions (reasoning-gym's item i of seed s is
    seeded s + i), so the second job draws past what its worker drew: only that is generated here."""
    from env.rg_data import Ahead

    task = load_task(BA)
    jobs = [(0, 30, 11), (0, 30, 12), (3, 30, 11)]
    seen: set[str] = set()
    plain = [task.draw(lv, n, s, seen) for lv, n, s in jobs]
    made = []

    def make(level, size, seed):  # what is made in this process (a worker's appends stay in the worker)
        made.append((level, size, seed))
        return task._rg_dataset(level, size, seed)

    ahead_seen: set[str] = set()
    with Ahead(make, task.dataset, jobs, workers=2) as ahead:
        got = [ahead.draw(lv, n, s, ahead_seen) for lv, n, s in jobs]
    assert [[i.id for i in d.items] for d in got] == [[i.id for i in d.items] for d in plain]
    assert [len(d.items) for d in got] == [30, 30, 30] and ahead_seen == seen
    assert made and all(lv == 0 and s != 11 for lv, _, s in made), made  # for the second job only: past its worker
    with Ahead(make, task.dataset, jobs, workers=2) as ahead, pytest.raises(RuntimeError, match="out of order"):
        ahead.draw(3, 30, 11, set())


def test_the_fixed_splits_drawn_on_every_core_are_those_drawn_level_after_level(tmp_path, monkeypatch):
    """Committed results name questions by their ids in the fixed splits, so drawing them on every core must not
    change them: they equal the plain draw, val then test, level after level, each avoiding every question taken
    before it. leg_counting's rungs share questions (and a level's test split meets its val split), so some of its
    levels draw past what their worker drew ahead."""
    from env.rg import SPLIT_SEEDS
    from env.rg_data import mix

    monkeypatch.setenv("ENV_ENGINEER_CACHE", str(tmp_path))  # drawn now, not read from a cache
    for name in ("rg:leg_counting", BA):
        task = load_task(name)
        taken: set[str] = set()
        plain = {s: [i.id for lv in range(len(task.levels)) for i in task.draw(lv, per, mix(SPLIT_SEEDS[s], lv),
                                                                                taken).items]
                 for s, per in SPLIT_SIZES.items()}
        assert {s: [i.id for i in task.split(s)] for s in SPLIT_SIZES} == plain, name


@pytest.mark.timeout(120)  # without the limit, the draw would run for hours
def test_a_question_whose_generator_runs_away_is_skipped_at_its_cpu_limit_and_counted(tmp_path, monkeypatch):
    """number_sequence squares its terms again and again on a few seeds: one question of its 12-16-term level takes
    minutes, then hours, of big-integer arithmetic. The third question of this seed is one. A draw skips it after
    `ITEM_CPU_S` of CPU and counts it among its errors, and the level still gives the questions asked."""
    from env.rg_data import OVER_ITEM, mix

    monkeypatch.setenv("ENV_ENGINEER_CACHE", str(tmp_path))
    task = load_task("rg:number_sequence")
    assert task.levels[2].label == "terms=12-16 min_value=-1000 max_value=1000 max_complexity=4"
    got = task.draw(2, 3, mix(9_000_011, 2), set())
    assert len(got.items) == 3 and got.errors == [OVER_ITEM]


def test_a_task_whose_fixed_splits_would_overrun_its_load_budget_drops_its_later_levels(tmp_path, monkeypatch):
    """A task's fixed splits must be quick to draw (`env.rg.LOAD_CPU_S`, estimated level after level from the CPU
    its val questions took): from the first level over it on, the levels are dropped with a note, the first level
    always kept; the kept levels' questions are those drawn without a budget, and the outcome is cached, so that
    the task keeps its levels without drawing again."""
    import env.rg as rg

    monkeypatch.setenv("ENV_ENGINEER_CACHE", str(tmp_path / "free"))
    free = rg.RgTask(BA)
    monkeypatch.setenv("ENV_ENGINEER_CACHE", str(tmp_path / "tight"))
    monkeypatch.setattr(rg, "LOAD_CPU_S", 0.0)
    tight = rg.RgTask(BA)
    assert len(free.levels) > 2 and [lv.label for lv in tight.levels] == [free.levels[0].label]
    first, *later = tight.dropped[-(len(free.levels) - 1):]
    assert first.startswith(f"{free.levels[1].label}: with it the task's fixed splits would take about ")
    assert "s a question, timed on its 24 val questions); allowed: 0 s a task" in first
    assert later and all(n.endswith(f"a level after {free.levels[1].label}, the first one over the task's load "
                                    "budget") for n in later)
    assert [i.id for i in tight.split("val")] == [i.id for i in free.split("val") if i.level == 0]

    def no_draw(*a, **k):
        raise AssertionError("drawn again instead of read from the cache")

    monkeypatch.setattr(rg, "Ahead", no_draw)
    again = rg.RgTask(BA)
    assert [lv.label for lv in again.levels] == [lv.label for lv in tight.levels] and again.dropped == tight.dropped
