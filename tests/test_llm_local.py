"""LocalEngine: the embedded model generating in-process, batched, with the chat template."""

from __future__ import annotations

import pytest

from llm_backends.base import ChatModel, extract_json
from llm_backends.local import LocalEngine

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine(embedded_model_path):
    eng = LocalEngine(embedded_model_path, batch_size=4)
    yield eng
    eng.close()


def test_generates_text_with_the_chat_template(engine):
    assert isinstance(engine, ChatModel)
    r = engine.chat([{"role": "user", "content": "What is the capital of France?"}], max_tokens=24)
    assert "Paris" in r.text
    assert 0 < r.completion_tokens <= 24 and r.prompt_tokens > 5 and r.latency_s > 0
    assert r.model == engine.model_path.name


def test_batch_keeps_order_and_left_padding_does_not_change_greedy_answers(engine):
    prompts = [
        [{"role": "user", "content": "Say hi."}],
        [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name three colours of the rainbow, please, in order."}],
        [{"role": "user", "content": "What is 2+2?"}],
    ]
    batch = engine.chat_batch(prompts, max_tokens=16)
    assert len(batch) == 3
    # the longest prompt has no padding in its batch: its answer must equal the answer alone
    alone = engine.chat(prompts[1], max_tokens=16)
    assert batch[1].text == alone.text
    assert all(r.completion_tokens <= 16 for r in batch)


# two worked examples: the 135M model then answers in the same JSON shape, greedy
FEW_SHOT = [
    {"role": "user", "content": "Is fire hot?"},
    {"role": "assistant", "content": '{"answer": true}'},
    {"role": "user", "content": "Is ice hot?"},
    {"role": "assistant", "content": '{"answer": false}'},
    {"role": "user", "content": "Is the sky blue?"},
]
ANSWER_SCHEMA = {"type": "object", "properties": {"answer": {"type": "boolean"}}, "required": ["answer"]}


def test_sampling_and_schema_prompt(engine):
    r = engine.chat([{"role": "user", "content": "Tell me a word."}], max_tokens=8, temperature=1.0)
    assert isinstance(r.text, str) and 0 < r.completion_tokens <= 8

    plain = engine.chat(FEW_SHOT, max_tokens=32)
    assert plain.parsed is None  # parsed only when JSON was asked for
    assert isinstance(extract_json(plain.text), dict) and isinstance(extract_json(plain.text).get("answer"), bool)

    # No constrained decoding in-process: the schema goes into the prompt and the reply's JSON is extracted.
    # The 135M model tends to echo the schema instead of answering, so what is checked is the mechanism:
    # the prompt grew by the schema, and parsed is the JSON object the reply starts with.
    r = engine.chat(FEW_SHOT, max_tokens=32, json_schema=ANSWER_SCHEMA)
    assert r.prompt_tokens > plain.prompt_tokens + 20
    assert r.text.lstrip().startswith("{") and isinstance(r.parsed, dict)
    assert r.parsed == extract_json(r.text)


def test_open_policy_with_transformers(embedded_model_path, tmp_path):
    from llm_backends.policy import open_policy

    with open_policy(None, "transformers", tmp_path) as policy:
        r = policy.chat_batch([[{"role": "user", "content": "Say hello."}]] * 2, max_tokens=6)
    assert len(r) == 2 and all(x.completion_tokens <= 6 for x in r)
    with pytest.raises(ValueError, match="policy backend 'tgi'"):
        with open_policy(None, "tgi", tmp_path):
            pass


def test_a_prompt_sent_again_reuses_its_cache_and_answers_as_without_it(engine, embedded_model_path):
    """An engineer asked again (its reply cut at its limit) sends the same prompt: its forward is not run again,
    and the answer is the one an engine without the cache gives."""
    msgs = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "List the planets of the solar system, in order from the sun."}]
    first = engine.chat(msgs, max_tokens=8)
    kept = engine._cached
    seen: list[int] = []  # new tokens per forward of the model
    hook = engine.model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs["input_ids"].shape[1]), with_kwargs=True)
    try:
        again = engine.chat(msgs, max_tokens=32)
    finally:
        hook.remove()
    assert engine._cached is kept and max(seen) == 1, seen  # one token a forward: the prompt was not run again
    assert first.finish_reason == "length" and again.text.startswith(first.text)  # greedy: it continues the cut one
    with LocalEngine(embedded_model_path, prompt_cache=False) as plain:
        assert plain._cached is None
        assert plain.chat(msgs, max_tokens=32).text == again.text
        assert plain._cached is None
    other = engine.chat([{"role": "user", "content": "Say hi."}], max_tokens=4)
    assert engine._cached is not kept and other.completion_tokens <= 4  # a new prompt replaces the kept one


def test_bench_reask_times_both_sides_and_they_answer_alike(capsys):
    from evals.bench.bench_reask import main

    out = main(["--prompt-tokens", "300", "--first", "4", "--repeats", "1"])
    assert out["prompt_tokens"] >= 300 and out["limits"] == [4, 16] and out["same_replies"] is True
    assert set(out["sides"]) == {"recompute", "reuse"} and all(v["both_s"] > 0 for v in out["sides"].values())
    assert "asked again:" in capsys.readouterr().out
