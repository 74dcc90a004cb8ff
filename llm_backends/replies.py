"""An engineer's reply, heard whatever kind of model wrote it.

Reasoning models think before they answer, and say so in one of a few ways: `<think>...</think>` blocks (Qwen3,
DeepSeek-R1 served without a reasoning parser; also `<thinking>`, `<thought>`, `<reasoning>`), a closing tag alone
(the chat template opened the block itself), an opening tag never closed (the reply ended while thinking), or a
field of its own beside the content (`reasoning_content` or `reasoning`: vLLM with a reasoning parser, DeepSeek's
API; the backend puts it in `ChatResult.reasoning`). :func:`split_reasoning` takes every such block out of the
text: only the rest, the answer, is read for a proposal and its rationale. The reasoning is kept beside it for a
person to read, never read as the answer (its drafts are not proposals).

A reasoning model also counts its thinking against the reply's token limit: at a limit that fits the answer alone
it thinks until the limit and answers nothing. :func:`ask` names such a reply (`empty`: no answer once the
reasoning is out; `cut`: the backend stopped it at the limit) and asks again ONCE, with a larger limit where the
backend allows one (`larger`); the same limit again could not help. :func:`reply_status` is the one word for a
reply, :meth:`Heard.note` the phrase that validation.json and the progress line show.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from llm_backends.base import ChatError, ChatModel, ChatResult, Messages, extract_json

# tag names of reasoning blocks, longest first where one is a prefix of another
REASONING_TAGS = ("thinking", "think", "thought", "reasoning")
_OPEN = re.compile(r"<(" + "|".join(REASONING_TAGS) + r")(?:\s[^<>]{0,200})?>", re.I)
_CLOSE = re.compile(r"</(" + "|".join(REASONING_TAGS) + r")\s*>", re.I)


def split_reasoning(text: str) -> tuple[str, str]:
    """(answer, reasoning): `text` with its reasoning blocks taken out, and what they held.

    Linear in the text whatever it holds (an unclosed tag ends the scan). Blocks anywhere are taken out; a closing
    tag before any opening one ends a block the chat template opened (everything before it is reasoning); an
    opening tag never closed starts reasoning that runs to the end (the reply stopped while thinking).

    >>> split_reasoning('<think>draft {"a": 1}</think>{"a": 2}')
    ('{"a": 2}', 'draft {"a": 1}')
    >>> split_reasoning("still weighing it</think> final")
    ('final', 'still weighing it')
    >>> split_reasoning("<think>the limit came first")
    ('', 'the limit came first')
    """
    text = text or ""
    answer: list[str] = []
    reasoning: list[str] = []
    pos = 0
    first_open, first_close = _OPEN.search(text), _CLOSE.search(text)
    if first_close is not None and (first_open is None or first_close.start() < first_open.start()):
        reasoning.append(text[: first_close.start()])
        pos = first_close.end()
    while True:
        opened = _OPEN.search(text, pos)
        if opened is None:
            answer.append(text[pos:])
            break
        answer.append(text[pos : opened.start()])
        closed = re.compile(rf"</{opened.group(1)}\s*>", re.I).search(text, opened.end())
        if closed is None:
            reasoning.append(text[opened.end() :])
            break
        reasoning.append(text[opened.end() : closed.start()])
        pos = closed.end()
    return "".join(answer).strip(), "\n\n".join(r.strip() for r in reasoning if r.strip())


def reasoning_field(message: Any) -> str:
    """A reasoning model's thinking returned beside the content of an OpenAI-style message: `reasoning_content`
    (vLLM's reasoning parsers, DeepSeek) or `reasoning` (newer vLLM, OpenRouter); "" when it has neither."""
    extra = getattr(message, "model_extra", None) or {}
    for name in ("reasoning_content", "reasoning"):
        value = extra.get(name, getattr(message, name, None))
        if isinstance(value, str) and value.strip():
            return value
    return ""


_CONTEXT = re.compile(r"maximum context length is (\d+)", re.I)
_PROMPT = re.compile(r"(\d+) (?:tokens )?in the messages|has (\d+) input tokens|(\d+) input tokens", re.I)
_AT_MOST = re.compile(r"at most (\d+) completion tokens", re.I)


def fitting_limit(detail: str, asked: int) -> int | None:
    """The reply limit a server's "too many tokens" error allows, when it is below `asked`: OpenAI's "supports at
    most N completion tokens", vLLM's "maximum context length is N tokens" less the prompt's tokens; else None.

    >>> fitting_limit("This model's maximum context length is 4096 tokens. However, you requested 8300 tokens "
    ...               "(108 in the messages, 8192 in the completion).", 8192)
    3988
    >>> fitting_limit("This model supports at most 4096 completion tokens, whereas you provided 8192.", 8192)
    4096
    """
    most = _AT_MOST.search(detail)
    if most:
        limit = int(most.group(1))
    else:
        context, prompt = _CONTEXT.search(detail), _PROMPT.search(detail)
        if not context or not prompt:
            return None
        limit = int(context.group(1)) - int(next(g for g in prompt.groups() if g))
    return limit if 0 < limit < asked else None


def reply_status(answer: str, finish_reason: str | None) -> str:
    """`empty` (no answer once the reasoning is out), `cut` (stopped at its token limit) or `answered`."""
    if not (answer or "").strip():
        return "empty"
    return "cut" if finish_reason == "length" else "answered"


@dataclass
class Heard:
    """What :func:`ask` heard: the answer of the last call, reasoning out, and every call it took."""

    answer: str  # the last call's text without its reasoning: the only text read for a proposal
    reasoning: str  # the last call's reasoning (blocks and the backend's reasoning field)
    parsed: Any  # JSON decoded from the answer (never from the reasoning), when a json_schema was asked for
    calls: list[ChatResult] = field(default_factory=list)  # as the backend returned them
    limits: list[int] = field(default_factory=list)  # the token limit each call was asked with
    statuses: list[str] = field(default_factory=list)  # reply_status of each call
    thoughts: list[int] = field(default_factory=list)  # characters of reasoning in each call
    retry_error: str | None = None  # the asking again failed (the first reply is kept)

    @property
    def status(self) -> str:
        return self.statuses[-1] if self.statuses else "empty"

    @property
    def last(self) -> ChatResult:
        return self.calls[-1]

    def note(self) -> str | None:
        """How the reply was heard when it was not at once (`None`): e.g. "empty: cut at its limit of 384 tokens
        while reasoning; asked again with 1536 tokens: answered"."""
        if self.statuses == ["answered"]:
            return None
        parts = []
        for i, (res, limit, status, thought) in enumerate(
            zip(self.calls, self.limits, self.statuses, self.thoughts, strict=True)
        ):
            what = _describe(res, limit, status, thought)
            parts.append(what if i == 0 else f"asked again with {limit} tokens: {what}")
        if self.retry_error:
            parts.append(self.retry_error)
        return "; ".join(parts)


def _describe(res: ChatResult, limit: int, status: str, chars: int) -> str:
    thought = f" ({chars} characters of reasoning)" if chars else ""
    if status == "answered":
        return "answered" + thought
    if status == "empty":
        if res.finish_reason == "length":
            return f"empty: cut at its limit of {limit} tokens before any answer{thought}"
        return f"empty: the model stopped without an answer{thought}"
    return f"cut at its limit of {limit} tokens{thought}"


def ask(
    model: ChatModel,
    messages: Messages,
    *,
    max_tokens: int,
    temperature: float,
    json_schema: dict | None,
    larger: int | None = None,
) -> Heard:
    """One reply, heard: reasoning taken out, and an empty or cut reply asked again once with `larger` tokens
    (not when `larger` is None or not above `max_tokens`: the backend allows no more). A failed first call raises
    :class:`~llm_backends.base.ChatError`; a failed second one keeps the first reply and says so."""
    heard = Heard("", "", None)
    limits = [max_tokens] + ([larger] if larger is not None and larger > max_tokens else [])
    for i, limit in enumerate(limits):
        try:
            res = model.chat(messages, max_tokens=limit, temperature=temperature, json_schema=json_schema)
        except ChatError as e:
            if i == 0:
                raise
            heard.retry_error = f"asked again with {limit} tokens: the call failed: {e}"
            break
        answer, thought = split_reasoning(res.text or "")
        reasoning = "\n\n".join(t for t in ((getattr(res, "reasoning", "") or "").strip(), thought) if t)
        status = reply_status(answer, res.finish_reason)
        parsed = res.parsed if json_schema is not None else None
        if json_schema is not None and thought:  # what the backend decoded may have been a draft in the reasoning
            parsed = extract_json(answer)
        heard = Heard(answer, reasoning, parsed, heard.calls + [res], heard.limits + [limit],
                      heard.statuses + [status], heard.thoughts + [len(reasoning)])
        if status == "answered":
            break
    return heard
