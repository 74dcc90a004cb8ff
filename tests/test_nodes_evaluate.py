"""evaluate / final_evaluate on real benchmark instances with real verdicts (a scripted policy answers with
the solver's plans, nonsense, or a plan for the wrong agents), and the pure metric functions."""

from __future__ import annotations

import json

import pytest

from env import FAILURES, load_split, plan_text
from families.metrics import compute_final_metrics, compute_metrics
from nodes.evaluate import evaluate, final_evaluate, limit_instances, read_rows
from tests.support.node_helpers import make_settings, runtime, scripted_policy


def _answer(i, inst):
    """Optimal, unparsable, or the paths of the agents swapped (wrong start), in turn."""
    if i % 3 == 0:
        return "Let me think.\n" + plan_text(inst.plan)
    if i % 3 == 1:
        return "I am not sure how to do this."
    return plan_text(list(reversed(inst.plan)))


def test_evaluate_on_val_mini_with_real_verdicts(tmp_path):
    settings = make_settings(eval_limit=9)
    instances = limit_instances(load_split(settings.eval_split), 9)
    policy = scripted_policy(instances, _answer)
    out = evaluate({"stage": 1, "checkpoint": None}, runtime(settings, tmp_path), model=policy)
    m = out["metrics"]
    assert m["eval/n"] == 9 and m["eval/valid_rate"] == 3 / 9 and m["eval/optimal_rate"] == 3 / 9
    assert m["eval/failure/parse_error"] == 3
    assert sum(m[f"eval/failure/{f}"] for f in FAILURES) == 6  # every invalid answer has one failure
    assert m["eval/failure/wrong_start"] + m["eval/failure/agent_count"] + m["eval/failure/conflict"] >= 1
    sizes = {str(i.size) for i in instances}
    assert set(m["by_level"]) == sizes and all(f"eval/valid_rate/level_{s}" in m for s in sizes)
    assert sum(r["n"] for r in m["by_level"].values()) == 9
    # the files: every raw answer with its verdict, and metrics that can be recomputed from them
    sdir = tmp_path / "stage_1"
    rows = read_rows(sdir / "eval.jsonl")
    assert [r["id"] for r in rows] == [i.id for i in instances]
    assert rows[1]["text"] == "I am not sure how to do this." and rows[1]["failure"] == "parse_error"
    assert rows[0]["valid"] and rows[0]["optimal"] and rows[0]["cost"] == rows[0]["optimal_cost"]
    assert compute_metrics(rows) == json.loads((sdir / "metrics.json").read_text()) == m
    assert out["log"] and "valid 0.333" in out["log"][0]
    # the 9 prompts went to the policy in batches of eval_batch_size (4), the remainder last
    assert settings.eval_batch_size == 4 and policy.batches == [4, 4, 1]
    assert len(policy.calls) == 9


def test_evaluate_keeps_the_stages_training_and_warm_start_figures(tmp_path):
    """train_stage wrote `train/...` and, at stage 0, the cached warm start's `sft/...` (which start the run used)
    into metrics.json first: the evaluation adds its `eval/...` beside them and drops nothing of theirs."""
    settings = make_settings(eval_limit=3)
    instances = limit_instances(load_split(settings.eval_split), 3)
    sdir = tmp_path / "stage_0"
    sdir.mkdir()
    before = {"train/steps": 8, "sft/cache_key": "a02e6d680f065497", "sft/cache_hit": True, "eval/n": 99}
    (sdir / "metrics.json").write_text(json.dumps(before))
    evaluate({"stage": 0, "checkpoint": None}, runtime(settings, tmp_path), model=scripted_policy(instances, _answer))
    on_disk = json.loads((sdir / "metrics.json").read_text())
    assert on_disk["train/steps"] == 8 and on_disk["sft/cache_key"] == "a02e6d680f065497" and on_disk["sft/cache_hit"]
    assert on_disk["eval/n"] == 3  # a stale evaluation figure is replaced, not kept


def test_final_evaluate_writes_paper_tables(tmp_path):
    settings = make_settings(final_limit=18)
    instances = limit_instances(load_split(settings.final_split), 18)
    # optimal for 3 agents, nonsense otherwise
    policy = scripted_policy(instances, lambda i, inst: plan_text(inst.plan) if inst.num_agents == 3 else "?")
    out = final_evaluate({"checkpoint": None}, runtime(settings, tmp_path), model=policy)
    f = out["final_metrics"]
    agents = {str(i.tags.get("agents", i.num_agents)) for i in instances}
    assert set(f["by_agents"]) == agents
    if "3" in agents:
        assert f["final/valid_rate/agents_3"] == 1.0 and f["by_agents"]["3"]["optimal_rate"] == 1.0
    for a in agents - {"3"}:
        assert f[f"final/valid_rate/agents_{a}"] == 0.0
    waits = {f"{float(i.tags['wait']):.2f}" for i in instances if "wait" in i.tags}
    assert set(f["by_wait"]) == waits
    table = (tmp_path / "final" / "table.md").read_text()
    assert "| agents | n | valid % | optimal % |" in table and "wait" in table
    rows = read_rows(tmp_path / "final" / "eval.jsonl")
    assert compute_final_metrics(rows) == json.loads((tmp_path / "final" / "metrics.json").read_text())


def test_limit_covers_every_group():
    test = load_split("test-mini")
    groups = {(i.num_agents, str(i.tags.get("wait")), i.size) for i in test}
    picked = limit_instances(test, len(groups))
    assert {(i.num_agents, str(i.tags.get("wait")), i.size) for i in picked} == groups
    assert limit_instances(test, None) == list(test)


def test_small_limit_spreads_over_agents_waits_and_sizes():
    """A smoke-sized cap still fills every column of the paper's table: 9 answers = 3 per agent count and
    3 per wait subset, on 8 different sizes; 6 validation answers = 2 per size."""
    from collections import Counter

    picked = limit_instances(load_split("test-mini"), 9)
    assert Counter(i.num_agents for i in picked) == {3: 3, 4: 3, 5: 3}
    assert Counter(i.tags["wait"] for i in picked) == {0.25: 3, 0.5: 3, 0.75: 3}
    assert len({i.size for i in picked}) == 8
    assert Counter(i.size for i in limit_instances(load_split("val-mini"), 6)) == {3: 2, 4: 2, 5: 2}


def test_metrics_of_no_rows_are_zero():
    m = compute_metrics([])
    assert m["eval/n"] == 0 and m["eval/valid_rate"] == 0.0 and m["by_level"] == {}


@pytest.mark.slow
def test_evaluate_with_the_embedded_policy_in_process(tmp_path, embedded_model_path):
    """The real path: open_policy on the embedded model (transformers), a few short answers, verified."""
    settings = make_settings(eval_limit=3, eval_max_tokens=24, eval_batch_size=3, policy_backend="transformers",
                             policy_model=str(embedded_model_path))
    out = evaluate({"stage": 0, "checkpoint": None}, runtime(settings, tmp_path))
    rows = read_rows(tmp_path / "stage_0" / "eval.jsonl")
    assert out["metrics"]["eval/n"] == 3 and len(rows) == 3
    assert all(isinstance(r["text"], str) and (r["valid"] or r["failure"] in FAILURES) for r in rows)


# ----------------------------------------------------------------------------- resuming an interrupted evaluation


class _Dropped(Exception):
    """The connection to the policy's server dropped (what a killed or crashed evaluation looks like to it)."""


def _failing_after(policy, batches: int):
    """`policy`, whose chat_batch raises `_Dropped` once it has answered `batches` batches."""
    inner = policy.chat_batch

    def chat_batch(batch, **kw):
        if len(policy.batches) >= batches:
            raise _Dropped("server gone")
        return inner(batch, **kw)

    policy.chat_batch = chat_batch
    return policy


def test_an_interrupted_evaluation_keeps_its_answers_and_answers_only_the_rest(tmp_path):
    from nodes.evaluate import JOURNAL, KEY_FILE

    settings = make_settings(eval_limit=12)  # batches of 4
    instances = limit_instances(load_split(settings.eval_split), 12)
    whole = tmp_path / "whole"
    evaluate({"stage": 1, "checkpoint": None}, runtime(settings, whole), model=scripted_policy(instances, _answer))

    first = _failing_after(scripted_policy(instances, _answer), batches=2)
    with pytest.raises(_Dropped):
        evaluate({"stage": 1, "checkpoint": None}, runtime(settings, tmp_path), model=first)
    sdir = tmp_path / "stage_1"
    assert not (sdir / "eval.jsonl").exists() and not (sdir / KEY_FILE).exists()
    journal = (sdir / JOURNAL).read_text().splitlines()
    assert len(journal) == 1 + 8 and "key" in json.loads(journal[0])  # the header, then the two batches answered

    second = scripted_policy(instances, _answer)
    out = evaluate({"stage": 1, "checkpoint": None}, runtime(settings, tmp_path), model=second)
    assert second.batches == [4]  # only the 4 unanswered instances were asked
    asked = {c[0][-1]["content"] for c in second.calls}
    assert len(asked) == 4
    assert read_rows(sdir / "eval.jsonl") == read_rows(whole / "stage_1" / "eval.jsonl")  # in order, as if never cut
    assert out["metrics"]["eval/n"] == 12 and not (sdir / JOURNAL).exists() and (sdir / KEY_FILE).is_file()

    third = scripted_policy(instances, _answer)  # a finished evaluation of the same policy is not redone
    assert evaluate({"stage": 1, "checkpoint": None}, runtime(settings, tmp_path), model=third)["metrics"] == out["metrics"]
    assert third.calls == []


def test_answers_of_another_policy_or_a_cut_off_line_are_never_reused(tmp_path):
    from nodes.evaluate import JOURNAL
    from tests.support.node_helpers import ScriptedChat

    settings = make_settings(eval_limit=12)
    instances = limit_instances(load_split(settings.eval_split), 12)
    with pytest.raises(_Dropped):
        evaluate({"stage": 1, "checkpoint": None}, runtime(settings, tmp_path),
                 model=_failing_after(scripted_policy(instances, _answer), batches=2))
    journal = tmp_path / "stage_1" / JOURNAL
    journal.write_text(journal.read_text()[:-40])  # the writer was killed inside the last row
    again = scripted_policy(instances, _answer)
    evaluate({"stage": 1, "checkpoint": None}, runtime(settings, tmp_path), model=again)
    assert again.batches == [4, 1]  # 7 rows kept, the cut one answered again with the 4 never answered

    other = ScriptedChat(lambda m: "nothing", model="another-policy")  # a different policy: everything again
    out = evaluate({"stage": 1, "checkpoint": None}, runtime(settings, tmp_path), model=other)
    assert other.batches == [4, 4, 4] and out["metrics"]["eval/failure/parse_error"] == 12


def test_a_stop_request_ends_the_evaluation_at_the_next_batch_and_keeps_its_answers(tmp_path):
    from nodes.evaluate import JOURNAL
    from trainer import stop

    settings = make_settings(final_limit=12)
    instances = limit_instances(load_split(settings.final_split), 12)
    policy = scripted_policy(instances, _answer)
    inner = policy.chat_batch

    def chat_batch(batch, **kw):  # SIGTERM arrives while the first batch is being answered
        stop.request_stop("SIGTERM")
        return inner(batch, **kw)

    policy.chat_batch = chat_batch
    try:
        with pytest.raises(stop.StageInterrupted, match="after 4 of 12 answers"):
            final_evaluate({"checkpoint": None}, runtime(settings, tmp_path), model=policy)
    finally:
        stop.reset()
    assert policy.batches == [4]
    assert len((tmp_path / "final" / JOURNAL).read_text().splitlines()) == 1 + 4


def test_the_eval_key_names_the_weights_not_the_folder(tmp_path):
    """A checkpoint moved or copied elsewhere keeps its answers; other weights in the same folder do not."""
    import shutil

    from nodes.evaluate import eval_key

    settings = make_settings()
    instances = limit_instances(load_split(settings.eval_split), 4)
    ckpt = tmp_path / "run" / "stage_1" / "checkpoint"
    ckpt.mkdir(parents=True)
    (ckpt / "model.safetensors").write_bytes(b"weights one")
    key = eval_key("val-mini", instances, checkpoint=str(ckpt), settings=settings)
    moved = tmp_path / "elsewhere"
    shutil.copytree(ckpt, moved)
    assert eval_key("val-mini", instances, checkpoint=str(moved), settings=settings) == key
    (ckpt / "model.safetensors").write_bytes(b"weights two")
    assert eval_key("val-mini", instances, checkpoint=str(ckpt), settings=settings) != key
    assert eval_key("val-mini", instances[:3], checkpoint=str(moved), settings=settings) != key
    assert eval_key("val-mini", instances, checkpoint=str(moved),
                    settings=make_settings(eval_max_tokens=17)) != key


# ----------------------------------------------------------------------------- the warm start's own evaluation


def _stage0_from_start(run_dir, start_dir):
    """A run folder whose stage 0 began from the cached warm start `start_dir` (what train_stage records)."""
    (run_dir / "stage_0").mkdir(parents=True)
    (run_dir / "stage_0" / "metrics.json").write_text(json.dumps(
        {"train/steps": 1, "sft/cache_path": str(start_dir), "sft/cache_key": "0123456789abcdef"}))


@pytest.mark.slow
def test_the_warm_start_is_evaluated_once_per_machine_and_verified_again_on_reuse(tmp_path, monkeypatch,
                                                                                  embedded_model_path):
    """Stage 0's evaluate first answers the split with the cached start the stage began from (the report's
    "start" row), through the real policy path; a later run of the same start reuses its answers from the cache,
    verified again, without opening the policy; another key, or a start gone from the cache, does not."""
    import llm_backends.policy
    from nodes.evaluate import KEY_FILE, START_DIR, eval_key, evaluate_start, start_cache_file

    monkeypatch.setenv("ENV_ENGINEER_CACHE", str(tmp_path / "cache"))
    settings = make_settings(eval_limit=3, eval_max_tokens=24, eval_batch_size=3, policy_backend="transformers",
                             policy_model=str(embedded_model_path))
    instances = limit_instances(load_split(settings.eval_split), 3)
    run1 = tmp_path / "run1"
    _stage0_from_start(run1, embedded_model_path)  # the embedded model's folder stands as the cached start
    out = evaluate({"stage": 0, "checkpoint": str(embedded_model_path)}, runtime(settings, run1))
    start = out["start_metrics"]
    rows = read_rows(run1 / "stage_0" / START_DIR / "eval.jsonl")
    assert start["eval/n"] == 3 and [r["id"] for r in rows] == [i.id for i in instances]
    assert start["start/answers_reused"] is False and start["start/cache_path"] == str(embedded_model_path)
    assert compute_metrics(rows).items() <= start.items()
    assert out["log"][0].startswith("warm start: eval on val") and out["log"][1].startswith("stage 0: eval")
    # the stage's own evaluation is still stage_0/eval.jsonl, of the stage's checkpoint (here the same weights)
    assert [r["text"] for r in read_rows(run1 / "stage_0" / "eval.jsonl")] == [r["text"] for r in rows]
    key = eval_key(settings.eval_split, instances, checkpoint=str(embedded_model_path), settings=settings)
    assert json.loads((run1 / "stage_0" / START_DIR / KEY_FILE).read_text()) == key
    cache = start_cache_file(key, instances, settings)
    assert cache.is_relative_to(tmp_path / "cache" / "start_evals")
    # what else changes greedy answers names another entry: the batch, the thinking switch
    assert start_cache_file(key, instances, settings.model_copy(update={"eval_batch_size": 2})) != cache
    thinking = settings.model_copy(update={"train": settings.train.model_copy(update={"enable_thinking": True})})
    assert start_cache_file(key, instances, thinking) != cache
    assert [a["text"] for a in json.loads(cache.read_text())["answers"]] == [r["text"] for r in rows]

    def no_policy(*a, **k):
        raise AssertionError("the policy was opened")

    monkeypatch.setattr(llm_backends.policy, "open_policy", no_policy)
    # a resumed run: its own finished start evaluation is returned as it is
    assert evaluate_start(run1, {"sft/cache_path": str(embedded_model_path)}, settings) == start
    # another run of the same start: the kept answers, verified again
    run2 = tmp_path / "run2"
    _stage0_from_start(run2, embedded_model_path)
    again = evaluate_start(run2, {"sft/cache_path": str(embedded_model_path)}, settings)
    assert again["start/answers_reused"] is True
    assert {k: v for k, v in again.items() if k.startswith("eval/")} == {
        k: v for k, v in start.items() if k.startswith("eval/")}
    assert read_rows(run2 / "stage_0" / START_DIR / "eval.jsonl") == rows
    # a finished start whose metrics.json lost a figure is recomputed from its answers, not trusted
    (run2 / "stage_0" / START_DIR / "metrics.json").write_text(json.dumps({"eval/valid_rate": 0.9}))
    assert evaluate_start(run2, {"sft/cache_path": str(embedded_model_path)}, settings)["eval/n"] == 3
    # a kept answer is only text: its verdict is computed again (the solver's plan is valid and optimal)
    doc = json.loads(cache.read_text())
    doc["answers"][0]["text"] = plan_text(instances[0].plan)
    cache.write_text(json.dumps(doc))
    run3 = tmp_path / "run3"
    _stage0_from_start(run3, embedded_model_path)
    third = evaluate_start(run3, {"sft/cache_path": str(embedded_model_path)}, settings)
    row0 = read_rows(run3 / "stage_0" / START_DIR / "eval.jsonl")[0]
    assert row0["valid"] and row0["optimal"] and third["eval/valid_rate"] >= 1 / 3
    # a kept answer of the wrong type is no answer: the entry is not used (so the policy would be opened)
    doc["answers"][1]["completion_tokens"] = "12"
    cache.write_text(json.dumps(doc))
    run3b = tmp_path / "run3b"
    _stage0_from_start(run3b, embedded_model_path)
    with pytest.raises(AssertionError, match="the policy was opened"):
        evaluate_start(run3b, {"sft/cache_path": str(embedded_model_path)}, settings)
    # another answer budget is another key: not reused, so it would open the policy
    run4 = tmp_path / "run4"
    _stage0_from_start(run4, embedded_model_path)
    with pytest.raises(AssertionError, match="the policy was opened"):
        evaluate_start(run4, {"sft/cache_path": str(embedded_model_path)}, make_settings(
            eval_limit=3, eval_max_tokens=16, eval_batch_size=3, policy_backend="transformers",
            policy_model=str(embedded_model_path)))
    # a run without a cached start, or whose start is no longer in the cache: no start row, no error
    assert evaluate_start(tmp_path / "run5", {}, settings) is None
    assert evaluate_start(tmp_path / "run5", {"sft/cache_path": str(tmp_path / "gone")}, settings) is None


def test_the_report_has_a_start_row_and_a_start_line(tmp_path):
    """The warm start's evaluation heads the validation table and is the dashed line of rates.png."""
    from nodes.report import collect, plot, render

    d0 = tmp_path / "stage_0"
    (d0 / "start").mkdir(parents=True)
    (d0 / "metrics.json").write_text(json.dumps({"eval/valid_rate": 0.253, "eval/optimal_rate": 0.1, "eval/n": 150,
                                                 "eval/valid_rate/level_3": 0.32}))
    (d0 / "start" / "metrics.json").write_text(json.dumps(
        {"eval/valid_rate": 0.167, "eval/optimal_rate": 0.08, "eval/n": 150, "eval/valid_rate/level_3": 0.26}))
    data = collect(tmp_path)
    text = render(data, plot(data, tmp_path), "t")
    table = text.split("## Validation per stage")[1]
    assert table.index("| start | 16.7 | 8.0 | 26.0 |") < table.index("| 0 | 25.3 | 10.0 | 32.0 |")
    assert "Start: the cached SFT warm start" in table and (tmp_path / "rates.png").is_file()
    (d0 / "start" / "metrics.json").unlink()  # a run without one: no such row
    assert "| start |" not in render(collect(tmp_path), [], "t")
