"""Every engineer is heard, reasoning models included: their thinking (`<think>` blocks, a `reasoning_content`
field) is never read as the answer, an empty or cut reply is named and asked again once with a larger limit, the
reasoning effort is a setting, and a run whose engineer never produced a usable proposal says so. Against a local
OpenAI-compatible server (127.0.0.1) that answers as a reasoning model does (tests/support/fakeopenai.py)."""

from __future__ import annotations

import json
import re
import time

import pytest

from env import random_config
from graph.progress import describe_update
from graph.settings import SettingsError, build_settings
from llm_backends.engineers import open_engineer
from llm_backends.openai_chat import OpenAIChat
from tests.support.fakeopenai import FakeOpenAI, Fault, Reply, Thinker
from tests.support.graph_stubs import run_cli, sizes
from tests.support.node_helpers import engineer_round, make_settings

FINAL = {"sizes": sizes({3: 0.5, 4: 0.5}), "rationale": "more small grids while large ones fail"}
# a legal config too, and longer than the final one: a reader that takes the first or the longest JSON takes it
DRAFT = {"sizes": sizes({3: 1.0}, hole=0.2), "rationale": "draft: everything on 3x3 " + "hmm " * 60}


def _state(stage: int = 1) -> dict:
    return {"stage": stage, "config": random_config(11).model_dump(mode="json"),
            "metrics": {"eval/valid_rate": 0.2, "by_level": {}}, "context": "# Evidence\nvalid 20%", "checkpoint": None}


def _engineer(srv: FakeOpenAI, **over):
    """Settings of an API engineer on the fake server (a custom endpoint name, no key)."""
    return make_settings(engineer="mylab", engineer_base_url=srv.base_url, engineer_model="fake-model",
                         engineer_max_attempts=2, **over)


def _validation(run_dir, stage: int = 1) -> dict:
    return json.loads((run_dir / f"stage_{stage}" / "validation.json").read_text())


# ----------------------------------------------------------------------------- reasoning blocks


@pytest.mark.parametrize("text, answer, reasoning", [
    ('<think>draft {"a": 1}</think>\n{"a": 2}', '{"a": 2}', 'draft {"a": 1}'),
    ("<reasoning>why</reasoning> yes <THINKING>more</THINKING> done", "yes  done", "why\n\nmore"),
    ('<think type="x">a</think>b', "b", "a"),
    ("the template opened it</think> {}", "{}", "the template opened it"),  # a closing tag alone
    ("<think>cut while thinking {draft}", "", "cut while thinking {draft}"),  # an opening tag never closed
    ('{"a": 1} <thought>after</thought>', '{"a": 1}', "after"),
    ("no reasoning here <b>bold</b>", "no reasoning here <b>bold</b>", ""),
])
def test_reasoning_blocks_are_taken_out_of_the_reply(text, answer, reasoning):
    from llm_backends.replies import split_reasoning

    assert split_reasoning(text) == (answer, reasoning)


def test_taking_reasoning_out_is_linear_in_the_text():
    from llm_backends.replies import split_reasoning

    t0 = time.monotonic()
    split_reasoning("<think>" * 200_000)  # every opening tag left unclosed
    split_reasoning("</think>" + "<think>x</think>" * 100_000)
    assert time.monotonic() - t0 < 5


@pytest.mark.parametrize("structured", [True, False])
def test_a_draft_in_think_is_not_read_and_the_rationale_is_not_the_thinking(structured, tmp_path):
    """A Qwen3-style reply: a draft config while thinking, then the final one. The final is proposed, and the
    rationale recorded is the final's, with schema-constrained output asked for or not."""
    reply = f"<think>Let me draft {json.dumps(DRAFT)}. No: fewer 3x3.</think>\n{json.dumps(FINAL)}"
    with FakeOpenAI(default=reply) as srv:
        out = engineer_round(_state(), _engineer(srv, engineer_structured=structured), tmp_path)
    assert out["decision"] == "accepted"
    assert out["accepted"]["sizes"] == FINAL["sizes"]
    assert out["rationale"] == FINAL["rationale"]
    record = _validation(tmp_path)["decisions"][-1]
    assert record["rationale"] == FINAL["rationale"] and "draft" not in json.dumps(record)
    saved = (tmp_path / "stage_1" / "engineer_reply.md").read_text()
    assert "Let me draft" in saved  # the reply as received is kept for a person, thinking included


def test_a_draft_without_a_rationale_key_leaves_the_prose_after_the_answer(tmp_path):
    final = {"sizes": FINAL["sizes"]}
    reply = f"<think>first idea {json.dumps(DRAFT)}</think>{json.dumps(final)}\nSmaller grids first."
    with FakeOpenAI(default=reply) as srv:
        out = engineer_round(_state(), _engineer(srv), tmp_path)
    assert out["accepted"]["sizes"] == final["sizes"] and out["rationale"] == "Smaller grids first."


def test_reasoning_content_is_kept_apart_and_never_read(tmp_path):
    """vLLM with a reasoning parser, DeepSeek: the thinking comes as `reasoning_content` beside the content."""
    thinking = f"I could answer {json.dumps(DRAFT)} but that overfits 3x3"
    with FakeOpenAI() as srv:
        srv.script(Reply(json.dumps(FINAL), reasoning_content=thinking))
        with OpenAIChat(srv.base_url, "fake-model", backend="fake") as chat:
            res = chat.chat([{"role": "user", "content": "go"}], json_schema={"type": "object"})
        assert res.reasoning == thinking and res.parsed == FINAL
        srv.script(Reply(json.dumps(FINAL), reasoning_content=thinking))
        out = engineer_round(_state(), _engineer(srv), tmp_path)
    assert out["accepted"]["sizes"] == FINAL["sizes"] and out["rationale"] == FINAL["rationale"]
    saved = (tmp_path / "stage_1" / "engineer_reply.md").read_text()
    assert "reasoning the backend returned beside the reply (not read)" in saved and "overfits 3x3" in saved


# ----------------------------------------------------------------------------- empty and cut replies


def test_an_empty_reply_cut_at_its_limit_is_named_and_asked_again_once_with_a_larger_limit(tmp_path):
    """Empty content with `finish_reason: length`: the thinking used the whole limit. Asked again with 4x."""
    thinker = Thinker(json.dumps(FINAL), think_tokens=3000)
    with FakeOpenAI(default=thinker) as srv:
        out = engineer_round(_state(), _engineer(srv, engineer_api_max_tokens=1000), tmp_path)
    assert thinker.limits == [1000, 4000]
    assert out["decision"] == "accepted" and out["accepted"]["sizes"] == FINAL["sizes"]
    record = _validation(tmp_path)["decisions"][-1]
    assert record["reply"].startswith("empty: cut at its limit of 1000 tokens before any answer")
    assert "asked again with 4000 tokens: answered" in record["reply"]
    line = describe_update("propose_config", {"stage": 1, "attempts": 1, "proposal": FINAL, "reply": out["reply"]}, {})
    assert "found a config; the reply was empty: cut at its limit of 1000 tokens" in line
    saved = (tmp_path / "stage_1" / "engineer_reply.md").read_text()
    assert "asked again with max_tokens=4000" in saved and saved.count('"status": "empty"') == 1


def test_a_reply_cut_while_thinking_in_tags_is_empty_not_a_draft(tmp_path):
    """A model served without a reasoning parser, cut at its limit inside an unclosed <think>."""
    thinker = Thinker(json.dumps(FINAL), think_tokens=3000, style="tags")
    with FakeOpenAI(default=thinker) as srv:
        out = engineer_round(_state(), _engineer(srv, engineer_api_max_tokens=1000), tmp_path)
    assert thinker.limits == [1000, 4000] and out["decision"] == "accepted"
    assert out["rationale"] == FINAL["rationale"]


def test_a_reply_that_never_answers_is_not_asked_the_same_short_limit_again(tmp_path):
    thinker = Thinker(json.dumps(FINAL), think_tokens=10**6)
    with FakeOpenAI(default=thinker) as srv:
        out = engineer_round(_state(), _engineer(srv, engineer_api_max_tokens=1000), tmp_path)
    # attempt 1: the limit, then 4x; attempt 2 starts at 4x (the run learnt it), and 4x is the most for this run
    assert thinker.limits == [1000, 4000, 4000]
    assert out["decision"] == "kept_previous"
    first, last = _validation(tmp_path)["decisions"]
    assert first["errors"][0].startswith("no answer: the reply was empty: cut at its limit of 1000 tokens")
    assert "think for less of the limit" in first["errors"][0]
    assert re.fullmatch(r"empty: cut at its limit of 4000 tokens before any answer \(\d+ characters of reasoning\)",
                        last["reply"])
    line = describe_update("validate_config", {"stage": 1, "decision": "kept_previous", "feedback": last["errors"]}, {})
    assert "kept_previous (no answer: the reply was empty" in line


def test_api_engineers_get_a_reasoning_models_limit_and_the_self_engineer_its_own():
    from llm_backends.engineers import reply_tokens

    assert reply_tokens("openai", 384) == (16384, 65536)
    assert reply_tokens("gemini", 384) == (16384, 65536)
    assert reply_tokens("mylab", 384) == (8192, 32768)
    assert reply_tokens("self", 384) == reply_tokens("base", 384) == (384, 1536)
    assert reply_tokens("gemini", 384, 60_000) == (60_000, 65_536)  # never past what the API allows one reply


def test_a_dry_run_against_a_reasoning_model_gets_its_config(tmp_path):
    """`--dry-run` on the smoke preset against a model that thinks 5,000 tokens before answering."""
    thinker = Thinker(json.dumps(FINAL), think_tokens=5000)
    with FakeOpenAI(default=thinker) as srv:
        r = run_cli(["--dry-run"], {"PRESET": "smoke", "ENGINEER": "mylab", "ENGINEER_BASE_URL": srv.base_url,
                                    "ENGINEER_MODEL": "fake-model"}, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert thinker.limits == [8192] and "a config, accepted" in r.stderr


# ----------------------------------------------------------------------------- reasoning effort


def test_reasoning_effort_is_a_setting_sent_only_when_set(tmp_path):
    assert build_settings({}, {"ENGINEER_REASONING_EFFORT": "low"}).engineer_reasoning_effort == "low"
    assert build_settings({}, {}).engineer_reasoning_effort is None
    with pytest.raises(SettingsError) as e:
        build_settings({}, {"ENGINEER_REASONING_EFFORT": "extreme"})
    assert "\n" not in str(e.value) and "engineer_reasoning_effort" in str(e.value) and "'extreme'" in str(e.value)
    with FakeOpenAI(default=json.dumps(FINAL)) as srv:
        env = {"ENGINEER_BASE_URL": srv.base_url, "ENGINEER_MODEL": "fake-model"}
        for effort in ("high", None):
            with open_engineer("mylab", env=env, reasoning_effort=effort) as chat:
                chat.chat([{"role": "user", "content": "go"}])
        # a server that does not take it (a model that does not reason): asked again without it
        srv.script(Fault.status_code(400, "Unrecognized request argument supplied: reasoning_effort"))
        with open_engineer("mylab", env=env, reasoning_effort="low") as chat:
            assert chat.chat([{"role": "user", "content": "go"}]).text == json.dumps(FINAL)
        sent = [req["body"].get("reasoning_effort") for req in srv.chat_requests]
        assert sent == ["high", None, "low", None]
        # the run's setting reaches the engineer the node opens
        srv.requests.clear()
        engineer_round(_state(), _engineer(srv, engineer_reasoning_effort="medium"), tmp_path)
        assert [req["body"].get("reasoning_effort") for req in srv.chat_requests] == ["medium"]


def test_help_lists_the_reasoning_settings(tmp_path):
    flat = " ".join(run_cli(["--help"], {}, cwd=tmp_path).stdout.split())
    assert "--engineer-reasoning-effort {none,minimal,low,medium,high}" in flat
    assert "ENGINEER_REASONING_EFFORT" in flat and "ENGINEER_API_MAX_TOKENS" in flat
    assert "--set engineer_api_max_tokens=..." in flat


# ----------------------------------------------------------------------------- a run never heard


def test_a_run_whose_engineer_never_answered_warns_in_the_report_and_on_the_terminal(
        tmp_path, monkeypatch, stub_nodes, capsys):  # noqa: F811
    import graph.graph as gg
    from graph import loop
    from nodes.propose_config import propose_config
    from nodes.report import collect, render
    from tests.support.graph_stubs import settings_for

    monkeypatch.setattr(gg, "propose_config", propose_config)  # the real node, asking the fake server
    thinker = Thinker(json.dumps(FINAL), think_tokens=10**6)
    with FakeOpenAI(default=thinker) as srv:
        settings, run_dir = settings_for(tmp_path, stages=2, engineer="mylab", engineer_base_url=srv.base_url,
                                         engineer_model="fake-model", engineer_max_attempts=2,
                                         engineer_api_max_tokens=1000, feasibility_n=4,
                                         **{"train.instances_per_stage": 8})
        loop.run_graph(run_dir, settings, resume=False)
    assert thinker.limits == [1000, 4000, 4000]
    err = capsys.readouterr().err
    assert "[warn] the mylab engineer never produced a usable proposal" in err
    assert "engineer replied (attempt 1): no usable config; the reply was empty: cut at its limit of 1000" in err
    settings.save(run_dir / "settings.json")  # graph.run writes it before the loop
    report = render(collect(run_dir), [], "r")
    assert "**Warning: the mylab engineer never produced a usable proposal." in report
    assert "trained as ENGINEER=fixed would" in report and "empty: cut at its limit of 4000 tokens" in report


@pytest.mark.parametrize("message, fits", [
    ("This model's maximum context length is 4096 tokens. However, you requested 8300 tokens (108 in the messages, "
     "8192 in the completion). Please reduce the length of the messages or completion.", 3988),
    ("'max_tokens' or 'max_completion_tokens' is too large: 8192. This model's maximum context length is 4096 tokens "
     "and your request has 96 input tokens (8192 > 4096 - 96).", 4000),
    ("max_tokens is too large: 8192. This model supports at most 4096 completion tokens, whereas you provided 8192.",
     4096),
])
def test_a_limit_past_the_models_context_is_asked_again_with_what_it_allows(message, fits):
    """A local server with a short context refuses a reasoning model's limit (vLLM, OpenAI wordings): the client
    asks again at once with the limit the server allows, and keeps it."""
    with FakeOpenAI(default=json.dumps(FINAL)) as srv:
        srv.script(Fault.status_code(400, message))
        with OpenAIChat(srv.base_url, "fake-model", backend="fake") as chat:
            assert chat.chat([{"role": "user", "content": "go"}], max_tokens=8192).text == json.dumps(FINAL)
            chat.chat([{"role": "user", "content": "again"}], max_tokens=8192)
        assert [r["body"]["max_tokens"] for r in srv.chat_requests] == [8192, fits, fits]
