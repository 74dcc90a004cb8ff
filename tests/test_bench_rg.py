"""The allocation bench's pieces: a stage's level shares (`--shares`), the evaluation set (`--eval-per-level`) and the
arm tables (`evals.bench.bench_rg_report`)."""

from __future__ import annotations

import argparse
import json
import random

import pytest

from evals.bench.bench_rg import eval_items, stage_shares
from evals.bench.bench_rg_report import main as report_main
from families.level_share import classic
from trainer.task import load_task

TASK = "rg:basic_arithmetic:num_terms=2-4,num_digits=1-2"


@pytest.fixture(scope="module")
def task():
    return load_task(TASK)


def test_shares_uniform_learnability_given_and_refused(task, capsys):
    p = argparse.ArgumentParser(prog="bench_rg")
    levels = list(range(6))
    assert stage_shares("uniform", levels, task, {}, p) == pytest.approx({lv: 1 / 6 for lv in levels})
    start = {"by_level": {"0": 0.75, "1": 0.25, "2": 0.1, "3": 0.0, "4": 0.1, "5": 0.0}}
    got = stage_shares("learnability", levels, task, start, p)
    want, _, _ = classic("learnability", task, {"levels": {str(lv): 1 / 6 for lv in levels}},
                         {lv: {"valid_rate": v} for lv, v in enumerate(start["by_level"].values())}, {},
                         random.Random(0))
    assert got == pytest.approx({int(k): v for k, v in want["levels"].items()})
    assert got[0] == got[1] > got[2] > got[3] and sum(got.values()) == pytest.approx(1)  # p(1-p), 20 % uniform
    assert stage_shares("3:1,5:3", levels, task, start, p) == {3: 0.25, 5: 0.75}
    for bad in ("3:x", "9:1", "3:-1", "hardest"):
        with pytest.raises(SystemExit):
            stage_shares(bad, levels, task, start, p)
        assert f"--shares {bad!r}: allowed: uniform, learnability, or LEVEL:SHARE" in capsys.readouterr().err


def test_the_evaluation_set_takes_val_then_test_then_fresh_questions(task):
    val, test = task.split("val"), task.split("test")
    got = eval_items(task, 80)  # 24 val + 48 test + 8 fresh a level
    assert eval_items(task, None) == val
    assert len(got) == 80 * len(task.levels) and len({i.question for i in got}) == len(got)
    for lv in range(len(task.levels)):
        mine = [i for i in got if i.level == lv]
        assert mine[:24] == [i for i in val if i.level == lv]
        assert mine[24:72] == [i for i in test if i.level == lv]
        assert not {i.question for i in mine[72:]} & {i.question for i in val + test}
    assert [i.id for i in eval_items(task, 80)] == [i.id for i in got]  # the same set every time


def _arm(path, start_valid, seeds, k=2):
    def rec(valid):
        return {"valid": valid, "valid_rate": sum(valid) / len(valid), "by_level": {},
                "sampled": {"k": k, "temperature": 0.7, "valid_counts": [k * v for v in valid]}}

    data = {"eval_ids": ["a", "b", "c", "d"], "eval_levels": [0, 0, 1, 1], "start": rec(start_valid),
            "seeds": {str(s): rec(v) for s, v in seeds.items()}}
    path.write_text(json.dumps(data))
    return path


def test_the_report_gives_each_arms_change_and_its_difference_from_the_first(tmp_path, capsys):
    start = [1, 0, 0, 0]
    a = _arm(tmp_path / "uniform.json", start, {0: [1, 1, 0, 0], 1: [1, 1, 0, 0]})  # +25 points, all on level 0
    b = _arm(tmp_path / "hardest.json", start, {0: [0, 0, 1, 1], 1: [0, 0, 1, 1]})  # +25 on level 1, -50 on level 0
    assert report_main([str(a), str(b), "--markdown", str(tmp_path / "t.md")]) == 0
    text = capsys.readouterr().out
    assert "| start | 25.0 | 50.0 | 0.0 |" in text
    row = next(line for line in text.splitlines() if line.startswith("| uniform (2 seeds) |"))
    cells = [c.strip() for c in row.strip("|").split("|")][1:]  # all, level 0, level 1: "rate after: change [lo, hi]"
    assert [c.split(" [")[0] for c in cells] == ["50.0: +25.0", "100.0: +50.0", "0.0: +0.0"]
    assert cells[2].endswith("[+0.0, +0.0]")  # level 1: no question changed, in any seed
    diff = next(line for line in text.splitlines() if line.startswith("| hardest - uniform |"))
    assert [c.strip().split(" [")[0] for c in diff.strip("|").split("|")][1:] == ["+0.0", "-100.0", "+100.0"]
    assert "### mean@2 (T 0.7)" in text and (tmp_path / "t.md").read_text().strip() == text.strip()
    other = _arm(tmp_path / "other.json", [0, 0, 0, 0], {0: [1, 1, 1, 1]})
    with pytest.raises(SystemExit, match="other: answered other questions or from another start than uniform"):
        report_main([str(a), str(other)])


def test_an_arm_starts_from_another_arms_start_answered_by_the_same_sampler(tmp_path, monkeypatch):
    """`--start-from` a finished arm answered by the vLLM sampler: the new arm takes that start and records the
    sampler (it used to be refused as a resume by another sampler); a `--resume` of a file answered by another
    sampler is still refused in one line."""
    import evals.bench.bench_rg as bench

    got: dict = {}
    monkeypatch.setattr(bench, "_run", lambda a, task, cfg, out, *rest: got.update(cfg=cfg, out=dict(out)) or 0)
    args = ["--task", TASK, "--preset", "rg-cpu", "--sampler", "vllm"]
    assert bench.main(args) == 0
    donor = tmp_path / "uniform.json"
    start = {"valid_rate": 0.5, "valid": [1, 0]}
    donor.write_text(json.dumps({"task": TASK, "settings": got["cfg"].model_dump(mode="json"), "sampler": "vllm",
                                 "start": start, "eval_ids": ["a", "b"]}))
    arm = tmp_path / "learnability.json"
    assert bench.main([*args, "--start-from", str(donor), "--json", str(arm)]) == 0
    assert got["out"]["start"] == start and got["out"]["sampler"] == "vllm" and got["out"]["eval_ids"] == ["a", "b"]
    arm.write_text(json.dumps({"sampler": "generate", "start": start}))
    with pytest.raises(SystemExit):
        bench.main([*args, "--json", str(arm), "--resume"])


def test_the_committed_allocation_answers_rescore_to_their_recorded_rates_and_labels(task):
    """evals/results/rg_allocation: the evaluation questions are drawn again from the task name (`eval_items`: each
    level's val, then test, then fresh questions), in the recorded order, and every stored greedy answer of the
    start and of every seed of every arm gets its recorded failure label back from the dataset's own scorer."""
    from pathlib import Path

    from evals.packed import names, read_text

    archive = Path(__file__).resolve().parent.parent / "evals" / "results" / "rg_allocation" / "answers.tar.xz"
    arms = sorted(m for m in names(archive) if m.endswith(".json"))
    assert arms == ["hardest.json", "learnability.json", "uniform.json"]
    items = eval_items(task, 100)
    by_id = {i.id: i for i in items}
    for arm in arms:
        d = json.loads(read_text(f"{archive}:{arm}"))
        assert d["task"] == TASK and d["eval_ids"] == [i.id for i in items], arm
        for part in [d["start"], *d["seeds"].values()]:
            assert [a["id"] for a in part["answers"]] == d["eval_ids"], arm
            verdicts = [task.verify(by_id[a["id"]], a["answer"]) for a in part["answers"]]
            assert [v.label for v in verdicts] == [a["failure"] for a in part["answers"]], arm
            assert sum(v.valid for v in verdicts) / len(verdicts) == pytest.approx(part["valid_rate"]), arm
