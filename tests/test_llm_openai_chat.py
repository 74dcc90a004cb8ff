"""OpenAIChat against the fault-injecting fake server: retries, budget, errors, schema fallback, batching."""

from __future__ import annotations

import contextlib
import email.utils
import json
import logging
import time

import pytest

from llm_backends.base import ChatError, ChatModel, extract_json
from llm_backends.openai_chat import OpenAIChat
from tests.support.fakeopenai import FakeOpenAI, Fault, Reply

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


def test_retry_after_as_an_http_date_is_honoured(fake_openai):
    # whole seconds only: 3 s ahead, truncated, is 2-3 s from now
    when = email.utils.formatdate(time.time() + 3, usegmt=True)
    fake_openai.script(Fault.rate_limit(headers={"Retry-After": when}), "ok")
    t0 = time.monotonic()
    r = client(fake_openai).chat(HI)
    elapsed = time.monotonic() - t0
    assert r.text == "ok" and r.attempts == 2
    assert 1.5 <= elapsed < 4.0, elapsed  # back-off alone would be ~0.01 s


def test_retry_after_ms_wins_over_retry_after(fake_openai):
    # OpenAI sends both; were Retry-After (30 s, past the 10 s budget) used, the call would fail at once
    fake_openai.script(Fault.rate_limit(headers={"retry-after-ms": "700", "Retry-After": "30"}), "ok")
    t0 = time.monotonic()
    r = client(fake_openai).chat(HI)
    elapsed = time.monotonic() - t0
    assert r.text == "ok" and r.attempts == 2
    assert 0.65 <= elapsed < 3.0, elapsed


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
    fake_openai.script(Fault.status_code(404, "The model `fake-model` does not exist"))
    with pytest.raises(ChatError, match="HTTP 404: The model `fake-model` does not exist") as info:
        client(fake_openai).chat(HI)
    assert info.value.attempts == 1 and len(fake_openai.chat_requests) == 1


@pytest.mark.parametrize("status", [401, 403])
def test_auth_failure_drops_the_body_that_echoes_the_key(fake_openai, caplog, status):
    # OpenAI's 401 body echoes the key, masked by the server but still derived from it
    body = "Incorrect API key provided: sk-abc*********5678. You can find your API key at https://x/keys."
    fake_openai.script(Fault.status_code(status, body))
    caplog.set_level(logging.DEBUG)
    with pytest.raises(ChatError) as info:
        client(fake_openai).chat(HI)
    msg = str(info.value)
    assert f"authentication failed ({status}); check ENGINEER_API_KEY / OPENAI_API_KEY / GEMINI_API_KEY" in msg
    assert info.value.attempts == 1 and len(fake_openai.chat_requests) == 1
    for text in (msg, repr(info.value), caplog.text):
        assert "sk-abc" not in text and "5678" not in text and "Incorrect API key" not in text


@pytest.mark.parametrize(
    "api_key,body,gone",
    [
        # a key-shaped token the server masked, in a non-auth error
        (KEY, "Project of key sk-proj-AbCd****WxYz has no access to fake-model", ["sk-proj", "AbCd", "WxYz"]),
        # a fragment of the key in use (8+ characters of it)
        (KEY, f"key {KEY[3:15]}... was revoked", [KEY[3:15]]),
        # a Google-style key
        (KEY, "API key AIzaSyA1b2C3d4E5f6G7h8I9j0 not valid", ["AIzaSy", "h8I9j0"]),
        # a key too short for substring masking still goes where it stands alone
        ("k1", "bad key k1 for fake-model", ["k1 "]),
    ],
    ids=["masked-sk", "fragment", "google", "short-key"],
)
def test_key_like_tokens_are_masked_in_any_error(api_key, body, gone):
    with FakeOpenAI(default=Fault.status_code(404, body)) as srv:
        chat = OpenAIChat(srv.base_url, "fake-model", api_key=api_key, backend="fake", timeout_s=1.0)
        with pytest.raises(ChatError) as info:
            chat.chat(HI)
    msg = str(info.value)
    assert "HTTP 404" in msg and "***" in msg
    assert body.split()[0] in msg and body.split()[-1] in msg  # the rest of the message survives
    assert [g for g in gone if g in msg] == []


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


def test_json_schema_falls_back_to_json_object_when_rejected():
    with FakeOpenAI(default='{"ok": false, "why": "no"}', reject_json_schema=True) as srv:
        chat = client(srv)
        r = chat.chat(HI, json_schema=SCHEMA)
        assert r.parsed == {"ok": False, "why": "no"}
        first, second = srv.chat_requests
        assert first["body"]["response_format"]["type"] == "json_schema"
        assert second["body"]["response_format"] == {"type": "json_object"}
        assert json.dumps(SCHEMA, sort_keys=True) in second["body"]["messages"][-1]["content"]
        # learnt once: the next call goes straight to JSON mode
        chat.chat(HI, json_schema=SCHEMA)
        assert len(srv.chat_requests) == 3 and srv.chat_requests[2]["body"]["response_format"]["type"] == "json_object"
        assert chat.stats.schema_fallbacks == 1 and not chat.supports_json_schema


@pytest.mark.parametrize(
    "status,message",
    [
        (422, "Unprocessable Entity: response_format of type {type} is not supported by this model"),
        (400, "Invalid JSON payload received. Unknown name \"response_schema\" at 'generation_config'"),
        (422, "structured outputs are not supported"),
        (400, "Unsupported value for {type}"),
    ],
    ids=["422-response_format", "400-gemini-generation_config", "422-not-supported", "400-unsupported"],
)
def test_rejected_schema_and_json_mode_fall_back_to_the_prompt_and_extraction(status, message):
    reply = 'Sure.\n```json\n{"ok": false, "why": "no"}\n```'
    with FakeOpenAI(default=reply, reject_json_schema=True, reject_json_object=True, reject_status=status,
                    reject_message=message) as srv:
        chat = client(srv)
        r = chat.chat(HI, json_schema=SCHEMA)
        assert r.parsed == {"ok": False, "why": "no"} and r.attempts == 1
        kinds = [(q["body"].get("response_format") or {}).get("type") for q in srv.chat_requests]
        assert kinds == ["json_schema", "json_object", None]
        assert json.dumps(SCHEMA, sort_keys=True) in srv.chat_requests[2]["body"]["messages"][-1]["content"]
        assert chat.stats.schema_fallbacks == 2 and chat.schema_mode == "prompt"


def test_an_unrelated_422_is_not_taken_for_a_schema_rejection(fake_openai):
    fake_openai.script(Fault.status_code(422, "messages.0.content: field required"))
    chat = client(fake_openai)
    with pytest.raises(ChatError, match="HTTP 422: messages.0.content: field required"):
        chat.chat(HI, json_schema=SCHEMA)
    assert chat.supports_json_schema and len(fake_openai.chat_requests) == 1


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


@contextlib.contextmanager
def batch_with_bad_key(answer_s: float):
    """A server refusing the first request (401, a bad key) while every other takes `answer_s` seconds."""

    def slow(body):
        time.sleep(answer_s)
        return "late"

    with FakeOpenAI(default=slow) as srv:
        srv.script(Fault.status_code(401, "Incorrect API key provided: sk-abc*********5678"))
        yield srv, client(srv, max_concurrency=2, timeout_s=5.0)


def test_chat_batch_fails_fast_and_sends_nothing_more():
    """A fatal error on one request ends the batch at once; requests not yet started are never sent."""
    with batch_with_bad_key(1.5) as (srv, chat):
        batch = [[{"role": "user", "content": str(i)}] for i in range(8)]
        t0 = time.monotonic()
        with pytest.raises(ChatError, match=r"authentication failed \(401\)"):
            chat.chat_batch(batch)
        assert time.monotonic() - t0 < 1.0  # not after the in-flight request's 1.5 s
        time.sleep(2.0)  # the request in flight ends on its own; nothing follows it
        # the 401 and, unless the abort beat its thread to the wire (a loaded machine), the one beside it
        assert 1 <= len(srv.chat_requests) <= 2, [r["body"]["messages"] for r in srv.chat_requests]
    assert chat.stats.failures == 1


def test_chat_batch_names_the_failure_not_the_requests_it_cancelled(monkeypatch):
    """Futures that finish together leave as_completed in any order (a loaded machine makes that common):
    the batch's error is still the request that failed, never 'cancelled: another request of the batch failed'."""
    import concurrent.futures as cf

    import llm_backends.openai_chat as oc

    def cancelled_first(fs, timeout=None):
        cf.wait(fs, timeout=timeout)
        yield from sorted(fs, key=lambda f: "cancelled" not in str(f.exception() or ""))

    monkeypatch.setattr(oc, "as_completed", cancelled_first)
    with batch_with_bad_key(0.3) as (_, chat):
        with pytest.raises(ChatError, match=r"authentication failed \(401\)"):
            chat.chat_batch([[{"role": "user", "content": str(i)}] for i in range(6)])


def test_chat_batch_deadline_bounds_the_whole_batch():
    def answer(body):
        if body["messages"][-1]["content"].startswith("slow"):
            time.sleep(3.0)
        return "done"

    with FakeOpenAI(default=answer) as srv:
        chat = client(srv, max_concurrency=4, timeout_s=10.0, total_budget_s=30.0)
        batch = [[{"role": "user", "content": c}] for c in ("fast", "fast", "slow", "slow")]
        t0 = time.monotonic()
        with pytest.raises(ChatError, match="batch deadline of 1s reached with 2 of 4 answers"):
            chat.chat_batch(batch, deadline_s=1.0)
        assert time.monotonic() - t0 < 1.8
        # the constructor's default, on the one-at-a-time path too
        chat = client(srv, max_concurrency=1, timeout_s=10.0, total_budget_s=30.0, batch_deadline_s=0.5)
        t0 = time.monotonic()
        with pytest.raises(ChatError, match="batch deadline of 0.5s reached with 1 of 3 answers"):
            chat.chat_batch([[{"role": "user", "content": c}] for c in ("fast", "slow", "fast")])
        assert time.monotonic() - t0 < 1.3
        # a batch that fits answers normally
        assert [r.text for r in chat.chat_batch([[{"role": "user", "content": "fast"}]] * 2)] == ["done"] * 2


def test_extract_json_variants():
    assert extract_json('{"a": 1}') == {"a": 1}
    assert extract_json('The config {x} is:\n{"sizes": {"3": {"data_ratio": 0.5}}} ok') == {
        "sizes": {"3": {"data_ratio": 0.5}}
    }
    assert extract_json("[1, 2] and {") == [1, 2]
    assert extract_json("") is None and extract_json("nothing") is None
