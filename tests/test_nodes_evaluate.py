"""evaluate / final_evaluate on real benchmark instances with real verdicts (a scripted policy answers with
the solver's plans, nonsense, or a plan for the wrong agents), and the pure metric functions."""

from __future__ import annotations

import json

import pytest

from env import FAILURES, load_split, plan_text
from nodes.evaluate import (
    compute_final_metrics,
    compute_metrics,
    evaluate,
    final_evaluate,
    limit_instances,
    read_rows,
)
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
    assert set(m["by_size"]) == sizes and all(f"eval/valid_rate/size_{s}" in m for s in sizes)
    assert sum(r["n"] for r in m["by_size"].values()) == 9
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
    assert m["eval/n"] == 0 and m["eval/valid_rate"] == 0.0 and m["by_size"] == {}


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
    from nodes import stop
    from nodes.evaluate import JOURNAL

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
