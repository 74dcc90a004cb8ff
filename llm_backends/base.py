"""The one chat interface every model sits behind.

Every backend (an OpenAI-compatible HTTP endpoint, a vLLM server we started, the in-process
transformers engine) implements :class:`ChatModel`: ``chat(messages, ...) -> ChatResult``,
``chat_batch(list_of_messages, ...) -> list[ChatResult]`` and ``close()``. Messages are OpenAI-style
``[{"role": "system"|"user"|"assistant", "content": str}, ...]``.

``json_schema`` asks for a JSON answer that follows the schema: servers that support structured output
get it as ``response_format``; otherwise the schema is written into the prompt and the first JSON value
is extracted from the free text (:func:`extract_json`). Either way ``ChatResult.text`` is the answer text
and ``ChatResult.parsed`` the decoded JSON value when one was found (the caller validates it: the model
may still be wrong), read from the text with any reasoning blocks taken out (``<think>...</think>``:
:mod:`llm_backends.replies`), so a draft in a reasoning model's thinking is never taken for its answer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

Messages = list[dict[str, str]]


@dataclass(frozen=True)
class ChatResult:
    """One answer and what it cost."""

    text: str
    latency_s: float  # wall time of the call, retries and back-off included (batch wall time for a local batch)
    prompt_tokens: int | None  # as counted by the backend; None when it does not say
    completion_tokens: int | None
    model: str  # the model name the backend answered as
    parsed: Any = None  # decoded JSON when json_schema was asked for and a JSON value was found
    attempts: int = 1  # HTTP attempts it took (1 = no retry)
    finish_reason: str | None = None  # "stop", "length", ... when the backend says
    # a reasoning model's thinking, when the backend returns it apart from the answer (`reasoning_content`);
    # `text` is the content as returned (llm_backends.replies takes any reasoning blocks out of it)
    reasoning: str = ""


class ChatError(RuntimeError):
    """A chat call that failed for good: names the backend and the cause, never the API key."""

    def __init__(self, backend: str, cause: str, *, attempts: int = 1, elapsed_s: float | None = None):
        self.backend = backend
        self.cause = cause
        self.attempts = attempts
        self.elapsed_s = elapsed_s
        where = f" after {attempts} attempt{'s' if attempts != 1 else ''}"
        if elapsed_s is not None:
            where += f" in {elapsed_s:.1f}s"
        super().__init__(f"{backend}: chat failed{where}: {cause}")


@runtime_checkable
class ChatModel(Protocol):
    """What every engineer, policy and API-model solver is called through.

    A backend that subclasses it (LocalEngine) gets `chat` as a batch of one; OpenAIChat and test fakes define
    the three methods themselves."""

    def chat(
        self,
        messages: Messages,
        *,
        max_tokens: int = 512,
        temperature: float = 0.0,
        json_schema: dict | None = None,
    ) -> ChatResult:
        """One answer: `chat_batch` of one conversation."""
        return self.chat_batch([messages], max_tokens=max_tokens, temperature=temperature, json_schema=json_schema)[0]

    def chat_batch(
        self,
        batch: list[Messages],
        *,
        max_tokens: int = 512,
        temperature: float = 0.0,
        json_schema: dict | None = None,
    ) -> list[ChatResult]: ...

    def close(self) -> None: ...


def schema_instruction(schema: dict) -> str:
    """The text that asks for schema-following JSON when the backend cannot enforce it."""
    return (
        "Answer with a single JSON value that follows this JSON schema, and nothing else "
        "(no prose, no code fence):\n" + json.dumps(schema, indent=None, sort_keys=True)
    )


def with_schema_in_prompt(messages: Messages, schema: dict) -> Messages:
    """A copy of ``messages`` with the schema instruction appended to the last user message."""
    out = [dict(m) for m in messages]
    for m in reversed(out):
        if m.get("role") == "user":
            m["content"] = f"{m.get('content', '')}\n\n{schema_instruction(schema)}"
            return out
    out.append({"role": "user", "content": schema_instruction(schema)})
    return out


_DECODER = json.JSONDecoder()
# bounded work whatever the reply: only this many characters are read, at most this many brackets tried
MAX_JSON_CHARS = 200_000
MAX_JSON_STARTS = 400
# what decoding can raise: malformed JSON, or nesting deeper than the decoder's recursion limit ("[" * 10**5)
_DECODE_ERRORS = (ValueError, RecursionError)


def extract_json(text: str) -> Any:
    """The first JSON object or array in ``text`` (code fences and surrounding prose allowed), or None.

    Bounded and never raises: only the first ``MAX_JSON_CHARS`` characters are read, at most
    ``MAX_JSON_STARTS`` brackets are tried, and JSON nested too deeply to decode counts as none.

    >>> extract_json('Sure! ```json\\n{"a": [1, 2]}\\n``` done')
    {'a': [1, 2]}
    >>> extract_json("no json here") is None
    True
    """
    if not text:
        return None
    text = text[:MAX_JSON_CHARS]
    stripped = text.strip()
    try:
        return json.loads(stripped)
    except _DECODE_ERRORS:
        pass
    # Prefer the longest decodable value starting at an opening bracket: a reply may mention "{x}" in
    # prose before the real object. A value found is skipped whole (what it holds is shorter than it).
    best: Any = None
    best_len = 0
    i, tried = _next_bracket(text, 0), 0
    while i != -1 and tried < MAX_JSON_STARTS:
        tried += 1
        try:
            value, end = _DECODER.raw_decode(text, i)
        except _DECODE_ERRORS:
            i = _next_bracket(text, i + 1)
            continue
        if end - i > best_len:
            best, best_len = value, end - i
        i = _next_bracket(text, end)
    return best


def _next_bracket(text: str, start: int) -> int:
    """Index of the first `{` or `[` at or after `start`, or -1."""
    found = [j for j in (text.find("{", start), text.find("[", start)) if j != -1]
    return min(found) if found else -1


@dataclass
class UsageStats:
    """Running totals a backend keeps so callers can log ``engineer/...`` metrics."""

    calls: int = 0
    failures: int = 0
    retries: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    schema_fallbacks: int = 0
    extra: dict = field(default_factory=dict)

    def add(self, r: ChatResult) -> None:
        self.calls += 1
        self.retries += max(0, r.attempts - 1)
        self.prompt_tokens += r.prompt_tokens or 0
        self.completion_tokens += r.completion_tokens or 0
        self.latency_s += r.latency_s
