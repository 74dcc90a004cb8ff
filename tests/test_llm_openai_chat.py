"""OpenAIChat against the fault-injecting fake server: retries, budget, errors, schema fallback, batching."""

from __future__ import annotations

import json
import time

import pytest
from fakeopenai import FakeOpenAI, Fault, Reply

from llm.base import ChatError, ChatModel, extract_json
from llm.openai_chat import OpenAIChat

HI = [{"role": "user", "content": "hi"}]
KEY = "sk-test-0123456789abcdef"


def client(srv: FakeOpenAI, **kw) -> OpenAIChat:
    kw.setdefault("timeout_s", 1.0)
    kw.setdefault("total_budget_s", 10.0)
    kw.setdefault("backoff_initial_s", 0.01)
    kw.setdefault("backoff_max_s", 0.05)
    return OpenAIChat(srv.base_url, "fake-model", api_key=KEY, backend="fake", **kw)


def test_plain_reply_records_tokens_latency_and_sends_key(fake_openai):
    fake_openai.script(Reply("hello there", prompt_tokens=7, completion_tokens=2))
    chat = client(fake_openai)
    assert isinstance(chat, ChatModel)
    r = chat.chat(HI, max_tokens=16, temperature=0.0)
    assert (r.text, r.prompt_tokens, r.completion_tokens, r.attempts) == ("hello there", 7, 2, 1)
    assert r.latency_s > 0 and r.model == "fake-model"
    req = fake_openai.chat_requests[0]
    assert req["body"]["messages"] == HI and req["body"]["max_tokens"] == 16
    assert req["headers"]["authorization"] == f"Bearer {KEY}"
    assert chat.stats.calls == 1 and chat.stats.completion_tokens == 2


@pytest.mark.parametrize(
    "fault",
    [
        Fault.rate_limit(retry_after=0.1),
        Fault.server_error(500),
        Fault.server_error(503),
        Fault.slow(2.0),  # past the 1 s attempt timeout
        Fault.drop(),
        Fault.malformed(),
    ],
    ids=["429", "500", "503", "slow", "drop", "malformed"],
)
def test_each_fault_is_retried_within_budget(fake_openai, fault):
    fake_openai.script(fault, fault, "recovered")
    r = client(fake_openai).chat(HI)
    assert r.text == "recovered"
    assert r.attempts == 3
    assert len(fake_openai.chat_requests) == 3


def test_retry_after_is_honoured(fake_openai):
    fake_openai.script(Fault.rate_limit(retry_after=1.0), "ok")
    t0 = time.monotonic()
    r = client(fake_openai).chat(HI)
    # back-off alone would wait ~0.01 s; the server asked for 1 s
    assert time.monotonic() - t0 >= 0.95 and r.attempts == 2


@pytest.mark.parametrize(
    "fault,cause",
    [
        (Fault.rate_limit(retry_after=0.2), "HTTP 429 rate limited"),
        (Fault.server_error(502), "HTTP 502 server error"),
        (Fault.slow(3.0), "timeout"),
        (Fault.drop(), "connection error"),
        (Fault.malformed(), "malformed response"),
    ],
    ids=["429", "502", "slow", "drop", "malformed"],
)
def test_persistent_fault_gives_one_clear_error_within_budget(fault, cause):
    with FakeOpenAI(default=fault) as srv:
        t0 = time.monotonic()
        with pytest.raises(ChatError) as info:
            client(srv, timeout_s=0.5, total_budget_s=2.0).chat(HI)
        elapsed = time.monotonic() - t0
    err = info.value
    assert err.backend == "fake" and cause in err.cause
    assert str(err).startswith("fake: chat failed after ") and cause in str(err)
    assert err.attempts >= 2
    assert elapsed < 2.0 + 1.0  # the budget, plus one attempt's timeout of slack at most
    assert "\n" not in str(err)


def test_retry_after_past_the_budget_fails_at_once_with_the_cause(fake_openai):
    fake_openai.script(Fault.rate_limit(retry_after=30))
    t0 = time.monotonic()
    with pytest.raises(ChatError, match="HTTP 429 rate limited") as info:
        client(fake_openai, total_budget_s=5.0).chat(HI)
    assert time.monotonic() - t0 < 2.0 and info.value.attempts == 1


def test_client_errors_are_not_retried(fake_openai):
    fake_openai.script(Fault.status_code(401, "Incorrect API key provided"))
    with pytest.raises(ChatError, match="HTTP 401: Incorrect API key provided") as info:
        client(fake_openai).chat(HI)
    assert info.value.attempts == 1 and len(fake_openai.chat_requests) == 1


SCHEMA = {
    "title": "Verdict",
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "why": {"type": "string"}},
    "required": ["ok", "why"],
}


def test_json_schema_goes_out_as_response_format(fake_openai):
    fake_openai.script('{"ok": true, "why": "fine"}')
    r = client(fake_openai).chat(HI, json_schema=SCHEMA)
    rf = fake_openai.chat_requests[0]["body"]["response_format"]
    assert rf == {"type": "json_schema", "json_schema": {"name": "Verdict", "schema": SCHEMA}}
    assert r.parsed == {"ok": True, "why": "fine"}


def test_json_schema_falls_back_to_prompt_and_extraction_when_rejected():
    with FakeOpenAI(default='Sure.\n```json\n{"ok": false, "why": "no"}\n```', reject_json_schema=True) as srv:
        chat = client(srv)
        r = chat.chat(HI, json_schema=SCHEMA)
        assert r.parsed == {"ok": False, "why": "no"}
        first, second = srv.chat_requests
        assert "response_format" in first["body"] and "response_format" not in second["body"]
        assert json.dumps(SCHEMA, sort_keys=True) in second["body"]["messages"][-1]["content"]
        # learnt once: the next call goes straight to the prompt form
        chat.chat(HI, json_schema=SCHEMA)
        assert len(srv.chat_requests) == 3 and "response_format" not in srv.chat_requests[2]["body"]
        assert chat.stats.schema_fallbacks == 1


def test_rejected_temperature_and_max_tokens_are_adapted(fake_openai):
    fake_openai.script(
        Fault.status_code(400, "Unsupported value: 'temperature' does not support 0.0 with this model."),
        Fault.status_code(400, "Unsupported parameter: 'max_tokens'. Use 'max_completion_tokens' instead."),
        "ok",
    )
    assert client(fake_openai).chat(HI, max_tokens=9).text == "ok"
    last = fake_openai.chat_requests[-1]["body"]
    assert "temperature" not in last and last["max_completion_tokens"] == 9 and "max_tokens" not in last


def test_chat_batch_keeps_order_and_bounds_concurrency():
    in_flight, peak = 0, 0

    def answer(body):
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        time.sleep(0.3)
        in_flight -= 1
        return "echo " + body["messages"][-1]["content"]

    with FakeOpenAI(default=answer) as srv:
        t0 = time.monotonic()
        out = client(srv, max_concurrency=4).chat_batch([[{"role": "user", "content": str(i)}] for i in range(8)])
        elapsed = time.monotonic() - t0
    assert [r.text for r in out] == [f"echo {i}" for i in range(8)]
    assert peak <= 4 and elapsed < 8 * 0.3 * 0.75  # overlapped, 4 at a time


def test_extract_json_variants():
    assert extract_json('{"a": 1}') == {"a": 1}
    assert extract_json('The config {x} is:\n{"sizes": {"3": {"data_ratio": 0.5}}} ok') == {
        "sizes": {"3": {"data_ratio": 0.5}}
    }
    assert extract_json("[1, 2] and {") == [1, 2]
    assert extract_json("") is None and extract_json("nothing") is None
